"""Issue 17, "Long runs" and "Discoverability": progress inside cells, parallel sweeps, a run
directory that exists, every config key listed, the resolved config, one seed's std."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest
import yaml
from conftest import results_of, toy_dir
from support.same_run import assert_runs_equal

from fedshift.bench import run_suite
from fedshift.cli import main

TOY = ["dataset.name=toyshift", "model.name=lenet5", "train.batch_size=16", "name=t"]


def _suite(tmp_path: Path, **extra) -> Path:
    raw = {
        "name": "suite",
        "out": str(tmp_path / "runs"),
        "dataset": {"name": "toyshift"},
        "model": {"name": "lenet5"},
        "train": {"rounds": 3, "batch_size": 16},
        "sweep": {"seed": [0, 1]},
        **extra,
    }
    path = tmp_path / "suite.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


# ---------------------------------------------------------------------- long runs
@pytest.mark.parametrize("workers", [1, 2])
def test_long_runs_bench_shows_rounds_and_eta_inside_cells(tmp_path, capsys, workers):
    """`fedshift bench` showed progress per finished cell only, never inside a running one."""
    suite = _suite(tmp_path)
    run_suite(suite, workers=workers, progress=True, progress_every_s=0)
    err = capsys.readouterr().err
    assert "\r" not in err  # not a terminal: status lines, no bars
    for cell in (1, 2):  # every round of every cell, reported from the workers too
        for rnd in (1, 2, 3):
            line = rf"suite suite: cell {cell}/2 \(fedavg s{cell - 1}\): round {rnd}/3, ETA [^,]+, "
            assert re.search(line + "suite ETA", err), err
    assert re.search(r"cell 1/2 \(fedavg s0\): round 3/3, ETA 0 s, suite ETA", err)
    assert "2/2 cells done" in err
    assert "suite suite: cell 1/2 (fedavg s0): started" in err  # before its first round


def test_long_runs_head_finetune_shows_progress_after_its_suite(tmp_path, capsys):
    """`fedshift protocol head-finetune` printed nothing while it trained the heads (minutes
    on Digits): each run of step 2 now says when it starts and ends, with an ETA."""
    over = [*TOY, "train.rounds=1", "federation.data_fraction=0.5", "sweep.seed=[0,1]"]
    out = ["--out", str(tmp_path / "p"), "--runs", str(tmp_path / "r"), "--epochs", "1"]
    assert main(["protocol", "head-finetune", *over, *out]) == 0
    text = capsys.readouterr()
    head = "fedshift: head-finetune: "
    lines = [ln[len(head) :] for ln in text.out.splitlines() if ln.startswith(head)]
    assert lines[0].startswith("step 1, 2 run(s)")
    assert re.match(r"step 2, run 1/2 \(.+\): training the heads of 3 clients", lines[1])
    assert re.match(r"run 1/2 done, mean gain [-+]\d+\.\d\d points; ETA", lines[2])
    assert lines[-1].startswith("run 2/2 done")
    assert "started" in text.err  # the suite's cells, from bench's progress


def test_long_runs_progress_bars_on_a_terminal():
    """On a terminal a running cell had no bar of its own (rounds, ETA), only the suite's."""
    from fedshift.runtime.progress import CellProgress

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    out = Terminal()
    shown = CellProgress("suite s", [("a", "fedbn", 50), ("b", "fedavg", 50)], stream=out)
    for rnd in (1, 2, 3):
        shown.handle(("round", "a", rnd, 50))
    shown.finish("b", "ran")
    shown.close()
    text = out.getvalue()
    assert "cell 1/2 (fedbn): 3/50 rounds" in text and "ETA" in text
    assert "suite s: 1/2 cells" in text and "suite ETA" in text


def test_long_runs_eta_of_cells_that_may_stop_early_is_an_upper_bound():
    """A cell with early stopping counted its maximum rounds in its ETA and the suite's and
    said so nowhere: such ETAs now read "at most"; once the last such cell is done the
    suite's ETA is an estimate again."""
    from fedshift.runtime.progress import CellProgress

    out = io.StringIO()
    cells = [("a", "fedbn", 50), ("b", "fedavg", 50)]
    shown = CellProgress("suite s", cells, stream=out, every_s=0, stops_early={"a"})
    for rnd in (1, 2, 3):
        shown.handle(("round", "a", rnd, 50))
    shown.finish("a", "ran")
    for rnd in (1, 2, 3):
        shown.handle(("round", "b", rnd, 50))
    shown.close()
    lines = out.getvalue().splitlines()
    a_line = next(ln for ln in lines if "(fedbn): round 3/50" in ln)
    assert re.search(r"ETA at most \d+ s, suite ETA at most \d+ (s|min)$", a_line), a_line
    assert re.search(r"\(fedbn\): ran; 1/2 cells done, suite ETA \d", out.getvalue())
    b_line = next(ln for ln in lines if "(fedavg): round 3/50" in ln)
    assert "at most" not in b_line and re.search(r"ETA \d+ s, suite ETA \d", b_line), b_line


def test_long_runs_run_jobs_equal_sequential(tmp_path, monkeypatch, capsys):
    """`fedshift run` ran a sweep's runs one after another only (no --jobs)."""
    monkeypatch.setattr("fedshift.runtime.cores.usable_cores", lambda: 2)
    over = [*TOY, "train.rounds=2", "sweep.seed=[0,1]"]
    assert main(["run", *over, "--out", str(tmp_path / "seq"), "--quiet"]) == 0
    assert main(["run", *over, "--out", str(tmp_path / "par"), "--quiet", "--jobs", "2"]) == 0
    names = sorted(p.name for p in (tmp_path / "par/t").iterdir())
    assert names == [toy_dir("seed=0"), toy_dir("seed=1")]
    for name in names:
        assert_runs_equal(tmp_path / "par/t" / name, tmp_path / "seq/t" / name)
    assert main(["run", *over, "run.threads=2", "--out", str(tmp_path / "y"), "--jobs", "2"]) == 2
    err = capsys.readouterr().err
    assert "--jobs 2 x 2 cores per run" in err and "use --jobs 1" in err


def test_long_runs_existing_run_dir_says_so_and_offers_three_ways(tmp_path, capsys):
    """Re-running a config silently made `-2` instead of naming the run that exists."""
    over = [*TOY, "train.rounds=1", "--out", str(tmp_path), "--quiet"]
    run_dir = tmp_path / "t" / toy_dir()
    assert main(["run", *over]) == 0
    first = json.loads((run_dir / "summary.json").read_text())
    capsys.readouterr()
    assert main(["run", *over]) == 2
    err = capsys.readouterr().err
    assert f"{run_dir} holds a finished run" in err
    assert f"fedshift run --resume {run_dir}" in err and "--overwrite" in err and "--new" in err
    assert sorted(p.name for p in (tmp_path / "t").iterdir()) == [run_dir.name]
    assert main(["run", *over, "--new"]) == 0  # the old behaviour, asked for
    assert (tmp_path / "t" / f"{run_dir.name}-2" / "summary.json").is_file()
    (run_dir / "stale.txt").write_text("from the old run")
    assert main(["run", *over, "--overwrite"]) == 0
    again = json.loads((run_dir / "summary.json").read_text())
    assert not (run_dir / "stale.txt").exists() and results_of(again) == results_of(first)
    assert sorted(p.name for p in (tmp_path / "t").iterdir()) == [run_dir.name, f"{run_dir.name}-2"]
    other = tmp_path / "o/t" / toy_dir()  # not a run: --overwrite leaves it alone
    other.mkdir(parents=True)
    (other / "notes.txt").write_text("mine")
    assert main(["run", *TOY, "train.rounds=1", "--out", str(tmp_path / "o"), "--overwrite"]) == 2
    assert "not a fedshift run directory" in capsys.readouterr().err
    assert (other / "notes.txt").read_text() == "mine"


def test_long_runs_flower_simulate_existing_run_dir_says_so_too(tmp_path, capsys):
    """`fedshift flower simulate` silently made `-2` on an existing run directory; it claims
    one as `fedshift run` does (stop and name it; --new; --overwrite), its advice naming
    itself."""
    pytest.importorskip("flwr")
    over = [*TOY, "train.rounds=1", "--out", str(tmp_path), "--quiet", "--engine", "in-process"]
    run_dir = tmp_path / "t" / toy_dir()
    assert main(["flower", "simulate", *over]) == 0
    first = json.loads((run_dir / "summary.json").read_text())
    capsys.readouterr()
    assert main(["flower", "simulate", *over]) == 2
    err = capsys.readouterr().err
    assert f"{run_dir} holds a finished run" in err
    assert f"`fedshift flower simulate --resume {run_dir}`" in err and "--new" in err
    assert sorted(p.name for p in (tmp_path / "t").iterdir()) == [run_dir.name]
    assert main(["flower", "simulate", *over, "--new"]) == 0
    assert (tmp_path / "t" / f"{run_dir.name}-2" / "summary.json").is_file()
    (run_dir / "stale.txt").write_text("from the old run")
    assert main(["flower", "simulate", *over, "--overwrite"]) == 0
    again = json.loads((run_dir / "summary.json").read_text())
    assert not (run_dir / "stale.txt").exists() and results_of(again) == results_of(first)
    assert main(["flower", "simulate", "--resume", str(run_dir), "--new"]) == 2
    assert "drop --new" in capsys.readouterr().err


# ---------------------------------------------------------------------- discoverability
def test_discoverability_list_shows_every_section_key_with_help(capsys):
    """`fedshift list` showed components only, descriptions cut at the docstring's line end."""
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for section in ("train", "federation", "input", "eval", "checkpoint", "run"):
        assert f"\n  {section}:" in out
    lines = {line.split()[0]: line for line in out.splitlines() if " = " in line}
    assert lines["train.rounds"].split()[1:3] == ["=", "50"] and "[>= 1]" in lines["train.rounds"]
    assert "[sgd | adam]" in lines["train.optimizer"]
    # a comment's first sentence, whole, even where it spans lines
    assert lines["train.loss"].endswith(
        'the local loss: "auto" = cross-entropy for classification, (CE + soft Dice) / 2 for '
        'segmentation (HarmoFL/FedFA); "ce", "dice" or "ce+dice" set it explicitly '
        "[auto | ce | dice | ce+dice]"
    )
    assert "evaluate every k rounds (the last round is always evaluated)" in lines["eval.every"]
    assert "0: no round trigger" in lines["checkpoint.every"]
    # a docstring entry (section run), to the end of its sentence, markup dropped
    assert lines["run.threads"].endswith(
        "torch intra-op threads of every process computing for the run (the run's own "
        "process and each worker), so it is the thread count of every client's work. [>= 1]"
    )
    assert "seed = 0" in out and "device = cpu" in out
    # components: the first sentence of the docstring, not its first line
    for line in out.split("config keys")[0].splitlines():
        if line.startswith("  ") and not line.startswith("   "):
            text = line.split("[")[0].strip()
            assert not re.search(r"\b(the|a|of|and|with|to|for|in)$", text), line


def test_discoverability_config_show_prints_the_resolved_config(tmp_path, capsys):
    """There was no way to see the config a run would use, component defaults filled in."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"algorithm": {"name": "fedprox"}, "train": {"rounds": 7}}))
    assert main(["config", "show", "-c", str(cfg), "train.lr=0.05", "dataset.name=toyshift"]) == 0
    shown = yaml.safe_load(capsys.readouterr().out)
    assert shown["algorithm"]["name"] == "fedprox" and "mu" in shown["algorithm"]
    assert shown["train"]["rounds"] == 7 and shown["train"]["lr"] == 0.05
    assert shown["dataset"]["name"] == "toyshift" and len(shown["dataset"]) > 1
    assert shown["checkpoint"] == {"every": 10, "minutes": 10.0}
    assert main(["config", "show", "sweep.seed=[0,1]"]) == 0
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    assert [d["seed"] for d in docs] == [0, 1]
    assert main(["config", "show", "train.lrr=1"]) == 2


def test_discoverability_one_seed_prints_na_not_zero_std():
    """With one seed the tables printed `± 0.00`, a spread nobody measured."""
    from fedshift.eval.tables import flows_table, seeds_table

    def summary(algo: str, seed: int, acc: float) -> dict:
        return {
            "algorithm": algo,
            "seed": seed,
            "clients": ["a"],
            "test_mean": acc,
            "test_per_client": {"a": acc},
            "augment": [],
            "implied": [],
        }

    runs = [summary("fedavg", 0, 0.5), summary("fedavg", 1, 0.7), summary("fedbn", 0, 0.6)]
    table = seeds_table(runs)
    assert "60.00 ± 14.14" in table and "60.00 ± n/a" in table and "± 0.00" not in table
    flows = flows_table(runs)
    assert "60.00 ± n/a" in flows and "± 0.00" not in flows
