"""Issue 49, item 2: a warning a method logs during a run (between progress bars, where it
scrolls away) is repeated under the final table and in `fedshift report`, once per message
with the runs that logged it."""

from __future__ import annotations

from conftest import toy_cfg

from fedshift.cli import main
from fedshift.core.logs import logged_warnings
from fedshift.eval.tables import print_tables
from fedshift.runtime.simulation import run_experiment


def test_a_logged_warning_is_shown_under_the_table_and_in_the_report(tmp_path, capsys):
    """HarmoFL's zero start of Eq. 3 at one round-1 batch logs a warning (ampnorm); it comes
    back under the table and in report.md; a run without warnings adds no section."""
    cfg = toy_cfg("algorithm.name=harmofl", rounds=1)
    run = run_experiment(cfg, run_dir=tmp_path / "runs" / "h", progress=False)
    plain = run_experiment(toy_cfg(rounds=1), run_dir=tmp_path / "runs" / "f", progress=False)
    logged = logged_warnings(run.run_dir)
    assert logged and any("zero start" in m for m in logged), logged
    assert logged_warnings(plain.run_dir) == []
    capsys.readouterr()
    print_tables([run.summary, plain.summary])
    out = capsys.readouterr().out
    assert "warnings the runs logged" in out
    assert out.count("zero start of Eq. 3") == 1 and "[harmofl seed 0]" in out
    assert main(["report", str(tmp_path / "runs"), "--out", str(tmp_path / "rep")]) == 0
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "## Warnings the runs logged" in md and "zero start of Eq. 3" in md
    print_tables([plain.summary])
    assert "warnings the runs logged" not in capsys.readouterr().out
