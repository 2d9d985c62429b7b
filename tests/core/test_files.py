"""Issue 15, item 5 beyond bench: every result file is written atomically and an unreadable
one is a clear error naming it (reports, protocols), never a bare JSONDecodeError."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedshift.cli import main
from fedshift.core.errors import FedshiftError
from fedshift.core.files import atomic_output, read_json, write_text_atomic
from fedshift.runtime.simulation import run_experiment


def test_atomic_output_keeps_the_old_file_when_writing_fails(tmp_path: Path):
    """A writer that fails halfway leaves the previous content and no temporary file."""
    target = tmp_path / "report.csv"
    write_text_atomic(target, "old\n")
    with pytest.raises(OSError), atomic_output(target) as tmp:
        tmp.write_text("new, half")
        raise OSError(28, "No space left on device")
    assert target.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.csv"]


def test_config_and_figure_are_written_atomically(tmp_path: Path, make_cfg, monkeypatch):
    """config.yaml and convergence.png go through a temporary file and a rename."""
    import os

    renamed: list[str] = []
    real = os.replace

    def spy(src, dst):
        renamed.append(Path(dst).name)
        return real(src, dst)

    monkeypatch.setattr(os, "replace", spy)
    run_experiment(make_cfg(rounds=1), run_dir=tmp_path / "r", progress=False)
    assert {"config.yaml", "convergence.png", "summary.json", "ledger.json"} <= set(renamed)
    assert not list((tmp_path / "r").glob("*.tmp"))


def test_report_names_an_empty_summary(tmp_path: Path, make_cfg, capsys):
    """`fedshift report` over a run whose summary.json is empty: one error line naming it."""
    run = run_experiment(make_cfg(rounds=1), run_dir=tmp_path / "runs" / "r", progress=False)
    (run.run_dir / "summary.json").write_text("")
    code = main(["report", str(tmp_path / "runs"), "--out", str(tmp_path / "rep")])
    err = capsys.readouterr().err
    assert code == 2
    assert "fedshift: error:" in err and "summary.json" in err and "JSONDecodeError" not in err


def test_read_json_reads_what_it_should(tmp_path: Path):
    """read_json returns the value of a good file and raises FedshiftError on a bad one."""
    good, bad = tmp_path / "a.json", tmp_path / "b.json"
    good.write_text(json.dumps({"x": 1}))
    bad.write_text('{"x": ')
    assert read_json(good) == {"x": 1}
    with pytest.raises(FedshiftError, match="b.json"):
        read_json(bad)


def test_files_a_resume_rebuilds_are_written_atomically_without_fsync(tmp_path, monkeypatch):
    """metrics.jsonl and metrics.csv are rebuilt from checkpoint.pt's rows whenever a run
    resumes and appended to without fsync: their atomic rewrites (three a run) each waited
    for an fsync nothing relied on. Every other atomic write still makes its file durable."""
    import os

    from fedshift.runtime.rundir.results import write_metrics
    from fedshift.runtime.tracking.trackers import CsvTracker

    synced: list[int] = []
    renamed: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd))[1])
    monkeypatch.setattr(
        os, "replace", lambda a, b: (renamed.append(Path(b).name), real_replace(a, b))[1]
    )
    row = {"round": 1, "client": "a", "global": {"val_acc": 0.5}}
    write_metrics(tmp_path, [row])
    CsvTracker(tmp_path).open(1, [row], resumed=True)
    assert synced == [] and renamed == ["metrics.jsonl", "metrics.csv"]  # atomic, not synced
    assert json.loads((tmp_path / "metrics.jsonl").read_text()) == row
    assert (tmp_path / "metrics.csv").read_text().splitlines()[1] == "1,a,0.5"
    write_text_atomic(tmp_path / "summary.json", "{}\n")
    assert len(synced) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "metrics.csv", "metrics.jsonl", "summary.json"
    ]  # fmt: skip
