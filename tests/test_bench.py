"""`fedshift bench`: cells cached by config digest, a killed suite resumes, no cell runs twice."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from support.same_run import assert_runs_equal

from fedshift.bench import cell_status, config_digest, plan, run_suite
from fedshift.catalog import resolve
from fedshift.cli import main
from fedshift.core.errors import FedshiftError
from fedshift.runtime.simulation import RunInterrupted, Simulation

SUITE = {
    "name": "suite",
    "dataset": {"name": "toyshift"},
    "model": {"name": "lenet5"},
    "train": {"rounds": 3, "batch_size": 16},
    "checkpoint": {"every": 1},
    "sweep": {"algorithm.name": ["fedavg", "fedbn"], "seed": [0, 1]},
}


def write_suite(tmp_path: Path, **extra) -> Path:
    path = tmp_path / "suite.yaml"
    path.write_text(yaml.safe_dump({**SUITE, **extra, "out": str(tmp_path / "runs")}))
    return path


def test_plan_digest_and_duplicates(tmp_path):
    cells = plan(write_suite(tmp_path))
    assert len(cells) == 4 and len({c.digest for c in cells}) == 4
    # name, out and checkpoint frequency do not change the digest; a training key does
    cfg = cells[0].cfg
    same = resolve({**cfg.to_dict(), "name": "other", "out": "elsewhere"})
    assert config_digest(same) == cells[0].digest
    changed = resolve({**cfg.to_dict(), "train": {**cfg.to_dict()["train"], "lr": 0.02}})
    assert config_digest(changed) != cells[0].digest
    dup = write_suite(tmp_path, sweep={"seed": [0, 0]})
    with pytest.raises(FedshiftError, match="same config"):
        plan(dup)


def test_killed_suite_continues_without_rerunning(tmp_path):
    suite = write_suite(tmp_path)
    cells = plan(suite)
    # emulate a suite killed midway: two cells finished, one stopped after round 1
    run_suite(suite, workers=1, progress=False, overrides=["sweep.seed=[0]"])
    first = {str(c.run_dir) for c in plan(suite, ["sweep.seed=[0]"])}
    partial = next(c for c in cells if str(c.run_dir) not in first and c.cfg.seed == 1)
    partial.run_dir.mkdir(parents=True)
    (partial.run_dir / "cell.json").write_text(json.dumps({"digest": partial.digest}))
    with pytest.raises(RunInterrupted):
        Simulation(partial.cfg, partial.run_dir, progress=False).run(stop_after=1)
    assert cell_status(partial) == "partial"
    mtimes = {
        c.run_dir: (c.run_dir / "summary.json").stat().st_mtime_ns
        for c in cells
        if str(c.run_dir) in first
    }

    summaries = run_suite(suite, workers=1, progress=False)
    status = {
        r["run_dir"]: r["status"]
        for r in json.loads((tmp_path / "runs/suite/bench.json").read_text())
    }
    assert sorted(status.values()) == ["cached", "cached", "ran", "resumed"]
    assert status[str(partial.run_dir)] == "resumed"
    for d, t in mtimes.items():  # finished cells untouched
        assert (d / "summary.json").stat().st_mtime_ns == t
    # the resumed cell ends exactly like an uninterrupted run of the same config
    fresh = Simulation(partial.cfg, tmp_path / "fresh", progress=False).run()
    assert str(partial.run_dir) in {s["run_dir"] for s in summaries}
    assert_runs_equal(partial.run_dir, fresh.run_dir)
    # a third call runs nothing
    run_suite(suite, workers=1, progress=False)
    again = json.loads((tmp_path / "runs/suite/bench.json").read_text())
    assert {r["status"] for r in again} == {"cached"}


def test_changed_config_reruns_cell(tmp_path):
    suite = write_suite(tmp_path)
    run_suite(suite, workers=1, progress=False, overrides=["sweep.seed=[0]"])
    run_suite(suite, workers=1, progress=False, overrides=["sweep.seed=[0]", "train.lr=0.02"])
    rows = json.loads((tmp_path / "runs/suite/bench.json").read_text())
    assert {r["status"] for r in rows} == {"ran"}  # new digests -> new cells


@pytest.mark.slow
def test_parallel_workers_match_sequential(tmp_path):
    suite = write_suite(tmp_path)
    seq = run_suite(suite, workers=1, progress=False, overrides=["sweep.seed=[0]"])
    par = run_suite(
        suite, workers=2, progress=False, out=str(tmp_path / "par"), overrides=["sweep.seed=[0]"]
    )
    key = lambda s: s["label"]  # noqa: E731
    for a, b in zip(sorted(seq, key=key), sorted(par, key=key), strict=True):
        assert_runs_equal(Path(b["run_dir"]), Path(a["run_dir"]))


def test_cli_bench(tmp_path, capsys):
    suite = write_suite(tmp_path)
    assert main(["bench", str(suite), "sweep.seed=[0]", "--workers", "1", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "fedavg" in out and "fedbn" in out and "suite folder" in out


def test_in_process_suite_leaves_the_callers_torch_threads(tmp_path):
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        run_suite(write_suite(tmp_path), workers=1, threads=2, progress=False,
                  overrides=["sweep.seed=[0]", "train.rounds=1"])  # fmt: skip
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_committed_cells_are_taken_not_run(tmp_path, monkeypatch):
    """A cell whose result is committed in results/ (same suite, directory, digest) is
    copied, not run, unless --fresh; it has no model, which a protocol says."""
    from fedshift.eval.collect import collect_suite
    from fedshift.protocols.common import load_run

    monkeypatch.chdir(tmp_path)
    suite = write_suite(
        tmp_path, sweep={"algorithm.name": ["fedavg"], "seed": [0, 1]}, train={"rounds": 1}
    )
    first = run_suite(suite, workers=1, progress=False)
    collect_suite(tmp_path / "runs" / "suite", tmp_path / "results", "fedshift bench suite.yaml")
    assert (tmp_path / "results" / "suite" / "source.json").is_file()
    assert not list((tmp_path / "results").rglob("*.pt"))  # numbers only, no models
    again = run_suite(suite, out=str(tmp_path / "b"), workers=1, progress=False)
    manifest = json.loads((tmp_path / "b" / "suite" / "bench.json").read_text())
    assert [row["status"] for row in manifest] == ["committed", "committed"]
    keys = ("test_mean", "val_mean", "best_round", "test_per_client")
    assert [{k: s[k] for k in keys} for s in again] == [{k: s[k] for k in keys} for s in first]
    assert all(Path(s["run_dir"]).parent == tmp_path / "b" / "suite" for s in again)
    with pytest.raises(FedshiftError, match="taken from the committed results.*--fresh"):
        load_run(again[0]["run_dir"])
    # --fresh runs them, to the same numbers
    fresh = run_suite(suite, out=str(tmp_path / "c"), workers=1, progress=False, reuse=False)
    manifest = json.loads((tmp_path / "c" / "suite" / "bench.json").read_text())
    assert [row["status"] for row in manifest] == ["ran", "ran"]
    assert [{k: s[k] for k in keys} for s in fresh] == [{k: s[k] for k in keys} for s in first]
    # another config (a changed key) is another digest: nothing is taken
    other = run_suite(suite, ["train.lr=0.02"], out=str(tmp_path / "d"), workers=1,
                      progress=False)
    assert all((Path(s["run_dir"]) / "checkpoint.pt").is_file() for s in other)
