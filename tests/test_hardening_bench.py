"""Issue 15, items 2 and 4-7: run-directory ownership and the bench runner under faults."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml
from conftest import results_of, toy_cfg
from support.same_run import assert_runs_equal

from fedshift.bench import cell_status, config_digest, plan, run_suite
from fedshift.core.errors import FedshiftError
from fedshift.runtime.results import new_run_dir, write_text_atomic
from fedshift.runtime.simulation import RunInterrupted, RunSignal, Simulation

SRC = Path(__file__).resolve().parents[1] / "src"
ROOT = SRC.parent


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": str(SRC)}


def _suite(tmp_path: Path, name: str = "suite", **extra) -> Path:
    raw = {
        "name": name,
        "out": str(tmp_path / "runs"),
        "dataset": {"name": "toyshift"},
        "model": {"name": "lenet5"},
        "train": {"rounds": 2, "batch_size": 16},
        "checkpoint": {"every": 1},
        "sweep": {"seed": [0, 1]},
        **extra,
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _manifest(path: Path) -> dict[str, dict]:
    return {r["digest"]: r for r in json.loads(path.read_text())}


# ---------------------------------------------------------------------- item 2
def test_item2_new_run_dirs_are_claimed_atomically(tmp_path):
    """Two runs of one config started together got the same run directory."""
    cfg = toy_cfg()
    got: list[Path] = []
    barrier = threading.Barrier(6)

    def claim() -> None:
        barrier.wait()
        got.append(new_run_dir(cfg, tmp_path))

    threads = [threading.Thread(target=claim) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(got)) == 6 and all(p.is_dir() for p in got)
    assert new_run_dir(cfg, tmp_path) not in got  # a claimed (still empty) one is taken


def test_item2_second_process_is_refused(tmp_path):
    """A second `fedshift run --resume` / `fedshift bench` wrote into a run already going."""
    from fedshift.runtime.rundir import LOCK_FILE, hold_lock, hold_run

    run_dir = tmp_path / "run"
    with pytest.raises(RunInterrupted):
        Simulation(toy_cfg(), run_dir, progress=False).run(stop_after=1)
    rows = (run_dir / "metrics.jsonl").read_text()
    suite = _suite(tmp_path, sweep={"seed": [0]})
    with (
        hold_run(run_dir),
        hold_run(run_dir),
        hold_lock(tmp_path / "runs/suite/bench.lock", "s", ""),
    ):
        # reentrant within this process; another process is told who holds it
        cmds = (["run", "--resume", str(run_dir)], ["bench", str(suite), "--workers", "1"])
        procs = [
            subprocess.Popen(
                [sys.executable, "-m", "fedshift", *c, "--quiet"],
                env=_env(),
                stderr=subprocess.PIPE,
                text=True,
            )
            for c in cmds
        ]
        errs = [p.communicate(timeout=120)[1] for p in procs]
    assert [p.returncode for p in procs] == [2, 2], errs
    for err in errs:
        assert f"is in use by process {os.getpid()}" in err and "fedshift: error:" in err
    assert "run directory" in errs[0] and "suite folder" in errs[1]
    assert (run_dir / "metrics.jsonl").read_text() == rows  # nothing written by the second
    assert not list((tmp_path / "runs/suite").glob("*-seed0-*"))  # the suite ran no cell
    assert (run_dir / LOCK_FILE).is_file()


def test_item2_lock_dies_with_its_process(tmp_path):
    """A lock must never outlive its process (kill -9), and must not look like run output."""
    from fedshift.runtime.rundir import hold_run

    run_dir = tmp_path / "run"
    code = (
        "import sys, time; from fedshift.runtime.rundir import hold_run\n"
        f"with hold_run({str(run_dir)!r}):\n    print('held', flush=True); time.sleep(60)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], env=_env(), stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout.readline().strip() == "held"
        match = f"process {proc.pid}.*fedshift run --resume"
        with pytest.raises(FedshiftError, match=match), hold_run(run_dir):
            pass
    finally:
        proc.kill()
        proc.wait()
    with hold_run(run_dir):  # the OS freed it: nothing stale
        pass
    # a cell directory holding only a lock file is a new cell
    (cell,) = plan(_suite(tmp_path, sweep={"seed": [0]}))
    cell.run_dir.mkdir(parents=True)
    with hold_run(cell.run_dir):
        assert cell_status(cell) == "new"


# ---------------------------------------------------------------------- item 4
def test_item4_bench_results_do_not_depend_on_workers(tmp_path):
    """Threads per cell were cores // workers, so --workers changed results and digests."""
    suite = _suite(tmp_path)
    rows = {}
    for n in (1, 2):
        run_suite(suite, workers=n, progress=False, out=str(tmp_path / f"w{n}"))
        rows[n] = _manifest(tmp_path / f"w{n}/suite/bench.json")
    assert rows[1].keys() == rows[2].keys() and len(rows[1]) == 2
    for n in (1, 2):
        for row in rows[n].values():
            summary = json.loads((Path(row["run_dir"]) / "summary.json").read_text())
            cell = json.loads((Path(row["run_dir"]) / "cell.json").read_text())
            assert summary["threads"] == cell["threads"] == row["threads"] == 1
    for digest, row in rows[2].items():
        assert_runs_equal(Path(row["run_dir"]), Path(rows[1][digest]["run_dir"]))
    # threads=1 leaves every cached digest as it was; another count is a different cell
    cfg = plan(suite)[0].cfg
    assert config_digest(cfg) == config_digest(cfg, 1) != config_digest(cfg, 2)
    # (fedrdn_table1's first cell: its digest since 199aa57, committed in results/)
    cells = plan(ROOT / "configs/suites/fedrdn_table1.yaml")
    assert cells[0].run_dir.name == "fedavg-digits-seed0-4fe1b2d40c"


# ---------------------------------------------------------------------- item 6
@pytest.fixture(scope="module")
def failing_suite(tmp_path_factory):
    """A suite of two good cells and two that fail while building, with 1 and 2 workers."""
    tmp = tmp_path_factory.mktemp("failing")
    suite = _suite(tmp, sweep={"seed": [0, 1], "federation.holdout": [[], ["nope"]]})
    out = {}
    for n in (1, 2):
        with pytest.raises(FedshiftError) as err:
            run_suite(suite, workers=n, progress=False, out=str(tmp / f"w{n}"))
        out[n] = (str(err.value), _manifest(tmp / f"w{n}/suite/bench.json"))
    return out


def test_item6_failing_cell_does_not_stop_the_others(failing_suite):
    """With one worker the first failing cell aborted the suite (no bench.json, no cell named)."""
    for n in (1, 2):
        message, rows = failing_suite[n]
        failed = [r for r in rows.values() if r["status"] == "failed"]
        assert len(failed) == 2 and sum(r["status"] == "ran" for r in rows.values()) == 2
        for r in failed:
            assert "nope" in r["label"] and "federation.holdout" in r["reason"]
            assert f"{r['label']} ({r['run_dir']}): config key 'federation.holdout'" in message
        assert message.startswith("2 of 4 cells failed")


def test_item6_signal_stops_the_suite_and_is_not_a_failure(tmp_path, monkeypatch):
    """A signal in a cell must stop the suite at once, recorded, not as a failed cell."""
    suite = _suite(tmp_path, sweep={"seed": [0, 1, 2]})
    real = Simulation.run
    seen: list[dict] = []

    def run(self, *a, **k):
        seen.append(_manifest(tmp_path / "runs/suite/bench.json"))  # written as cells end
        if self.cfg.seed == 1:
            raise RunSignal(signal.SIGTERM, self.run_dir, None)
        return real(self, *a, **k)

    monkeypatch.setattr(Simulation, "run", run)
    with pytest.raises(RunSignal) as err:
        run_suite(suite, workers=1, progress=False)
    assert err.value.exit_code == 143 and "fedshift bench" in str(err.value)
    assert [r["status"] for r in seen[1].values()] == ["ran", "pending", "pending"]
    rows = json.loads((tmp_path / "runs/suite/bench.json").read_text())
    assert [r["status"] for r in rows] == ["ran", "interrupted", "pending"]


# ---------------------------------------------------------------------- item 5
def test_item5_empty_summary_is_recovered(tmp_path, monkeypatch):
    """A 0-byte summary.json (disk full) was `done` and every rerun died on JSONDecodeError."""
    suite = _suite(tmp_path, sweep={"seed": [0]})
    (before,) = run_suite(suite, workers=1, progress=False)
    (cell,) = plan(suite)
    (cell.run_dir / "summary.json").write_text("")
    assert cell_status(cell) == "partial"
    (after,) = run_suite(suite, workers=1, progress=False)
    assert results_of(after) == results_of(before)
    assert _manifest(tmp_path / "runs/suite/bench.json")[cell.digest]["status"] == "resumed"
    # a failed write leaves the old file whole and no temporary file behind
    target = tmp_path / "x.json"
    target.write_text("old")

    def full(*a):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", full)
    with pytest.raises(OSError):
        write_text_atomic(target, "new")
    assert target.read_text() == "old" and sorted(os.listdir(tmp_path)).count("x.json.tmp") == 0


# ---------------------------------------------------------------------- item 7
def _children(pid: int) -> set[int]:
    out: set[int] = set()
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            out |= {int(x) for x in (task / "children").read_text().split()}
    return out


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has exited


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux /proc")
def test_item7_killed_bench_leaves_no_worker(tmp_path):
    """kill -9 of `fedshift bench --workers 2` left both workers and the resource tracker."""
    suite = _suite(tmp_path, train={"rounds": 5000, "batch_size": 16}, eval={"every": 5000})
    proc = subprocess.Popen(
        [sys.executable, "-m", "fedshift", "bench", str(suite), "--workers", "2", "--quiet"],
        env=_env(),
        stderr=subprocess.DEVNULL,
    )
    kids: set[int] = set()
    try:
        deadline = time.monotonic() + 120
        # both cells past their first round (a cell killed in round 1 has nothing to save)
        while len(list((tmp_path / "runs/suite").glob("*/checkpoint.pt"))) < 2:
            assert time.monotonic() < deadline and proc.poll() is None, "cells did not start"
            time.sleep(0.1)
        kids = _children(proc.pid)
        cmds = [Path(f"/proc/{k}/cmdline").read_bytes() for k in kids]
        assert sum(b"spawn_main" in c for c in cmds) == 2  # the two workers
        assert sum(b"resource_tracker" in c for c in cmds) == 1
        proc.kill()
        proc.wait()
        deadline = time.monotonic() + 10
        while any(_alive(k) for k in kids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [k for k in kids if _alive(k)]
        # each running cell kept a checkpoint: the suite resumes them
        assert {cell_status(c) for c in plan(suite)} == {"partial"}
    finally:
        for k in kids:
            if _alive(k):
                os.kill(k, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
