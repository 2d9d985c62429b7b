"""`fedshift bench`: cells cached by config digest, a killed suite resumes, no cell runs twice;
and under faults: results that do not depend on --workers, a failing cell that stops no
other, a signal, an empty summary.json, workers that die with a killed suite."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, fedshift_env, results_of, write_suite
from support.same_run import assert_runs_equal

from fedshift.bench import cell_status, config_digest, plan, run_suite
from fedshift.catalog import resolve
from fedshift.claims.collect import collect_suite
from fedshift.cli import main
from fedshift.core.errors import FedshiftError
from fedshift.runtime.rundir.results import write_text_atomic
from fedshift.runtime.simulation import Simulation
from fedshift.runtime.stopping import RunInterrupted, RunSignal


def two_methods(tmp_path: Path, **extra) -> Path:
    """FedAvg and FedBN, seeds 0 and 1, 3 rounds (conftest's write_suite otherwise)."""
    sweep = {"algorithm.name": ["fedavg", "fedbn"], "seed": [0, 1]}
    return write_suite(tmp_path, **{"train": {"rounds": 3, "batch_size": 16}, "sweep": sweep,
                                    **extra})  # fmt: skip


def test_plan_digest_and_duplicates(tmp_path):
    cells = plan(two_methods(tmp_path))
    assert len(cells) == 4 and len({c.digest for c in cells}) == 4
    # name, out and checkpoint frequency do not change the digest; a training key does
    cfg = cells[0].cfg
    same = resolve({**cfg.to_dict(), "name": "other", "out": "elsewhere"})
    assert config_digest(same) == cells[0].digest
    changed = resolve({**cfg.to_dict(), "train": {**cfg.to_dict()["train"], "lr": 0.02}})
    assert config_digest(changed) != cells[0].digest
    dup = two_methods(tmp_path, sweep={"seed": [0, 0]})
    with pytest.raises(FedshiftError, match="same config"):
        plan(dup)


def test_killed_suite_continues_without_rerunning(tmp_path):
    suite = two_methods(tmp_path)
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
    suite = two_methods(tmp_path)
    run_suite(suite, workers=1, progress=False, overrides=["sweep.seed=[0]"])
    run_suite(suite, workers=1, progress=False, overrides=["sweep.seed=[0]", "train.lr=0.02"])
    rows = json.loads((tmp_path / "runs/suite/bench.json").read_text())
    assert {r["status"] for r in rows} == {"ran"}  # new digests -> new cells


def test_cli_bench(tmp_path, capsys):
    suite = two_methods(tmp_path)
    assert main(["bench", str(suite), "sweep.seed=[0]", "--workers", "1", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "fedavg" in out and "fedbn" in out and "suite folder" in out


def test_in_process_suite_leaves_the_callers_torch_threads(tmp_path):
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        run_suite(two_methods(tmp_path), workers=1, threads=2, progress=False,
                  overrides=["sweep.seed=[0]", "train.rounds=1", "dataset.train_size=12",
                             "dataset.val_size=4", "dataset.test_size=4"])  # fmt: skip
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_committed_cells_are_taken_not_run(tmp_path, monkeypatch):
    """A cell whose result is committed in results/ (same suite, directory, digest) is
    copied, not run, unless --fresh; it has no model, which a protocol says."""
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
    other = run_suite(suite, ["train.lr=0.02"], out=str(tmp_path / "d"), workers=1, progress=False)
    assert all((Path(s["run_dir"]) / "checkpoint.pt").is_file() for s in other)


def test_a_running_suites_finished_cells_are_collected_apart_and_taken(tmp_path, monkeypatch):
    """A suite longer than one machine's session: `claims collect` refuses a suite folder
    with an unfinished cell (naming it and --partial); --partial copies the finished cells
    into results/_incomplete/<suite>, adds to what an earlier collection put there, says in
    source.json how many of the planned cells it holds, and a bench taking its cells from
    there runs none of them again."""
    import shutil

    monkeypatch.chdir(tmp_path)
    suite = write_suite(
        tmp_path, sweep={"algorithm.name": ["fedavg"], "seed": [0, 1]}, train={"rounds": 1}
    )
    first = run_suite(suite, workers=1, progress=False)
    folder, results = tmp_path / "runs" / "suite", tmp_path / "results"
    a, b = (Path(s["run_dir"]).name for s in first)
    # the state of a stopped bench: cell b started (a checkpoint, no summary yet)
    shutil.move(folder / b, tmp_path / "b-done")
    (folder / b).mkdir()
    (folder / b / "checkpoint.pt").write_bytes(b"")
    with pytest.raises(FedshiftError, match=rf"cells without summary.json \({b}\).*--partial"):
        collect_suite(folder, results, "x")
    cmd = "fedshift bench suite.yaml"
    assert main(["claims", "collect", str(folder), "--partial", "--command", cmd,
                 "--results", str(results)]) == 0  # fmt: skip
    dest = results / "_incomplete" / "suite"
    assert sorted(p.name for p in dest.iterdir()) == sorted([a, "source.json"])
    source = json.loads((dest / "source.json").read_text())
    assert source["partial"] == {"finished": 1, "planned": 2} and source["command"] == cmd
    assert not (results / "suite").exists()
    # the next session: b finished, a no longer in that folder (taken, or on another machine)
    shutil.rmtree(folder / b)
    shutil.move(tmp_path / "b-done", folder / b)
    shutil.rmtree(folder / a)
    collect_suite(folder, results, cmd, partial=True)
    assert sorted(p.name for p in dest.iterdir()) == sorted([a, b, "source.json"])
    assert json.loads((dest / "source.json").read_text())["partial"]["finished"] == 2
    again = run_suite(suite, out=str(tmp_path / "c"), workers=1, progress=False,
                      results=results / "_incomplete")  # fmt: skip
    manifest = json.loads((tmp_path / "c" / "suite" / "bench.json").read_text())
    assert [row["status"] for row in manifest] == ["committed", "committed"]
    assert [s["test_mean"] for s in again] == [s["test_mean"] for s in first]
    # that bench's folder (cells it took) is collected again as it is: the same numbers
    collect_suite(tmp_path / "c" / "suite", results, cmd, partial=True)
    assert json.loads((dest / "source.json").read_text())["partial"]["finished"] == 2
    kept = [json.loads((dest / n / "summary.json").read_text()) for n in (a, b)]
    assert [results_of(k) for k in kept] == [results_of(s) for s in first]
    # a protocol's output is collected whole
    assert main(["claims", "collect", str(folder), "--partial", "--protocol", "p",
                 "--command", cmd]) == 2  # fmt: skip


def test_a_protocol_chooses_which_committed_cells_to_take_and_hooks_the_trained(
    tmp_path, monkeypatch
):
    """``reuse`` as a callable takes only the committed cells it accepts (the others run);
    ``after`` is called with each cell this call trains, once, after its summary exists,
    and never for a cell it took or found done."""

    monkeypatch.chdir(tmp_path)
    suite = write_suite(
        tmp_path, sweep={"algorithm.name": ["fedavg"], "seed": [0, 1]}, train={"rounds": 1}
    )
    first = run_suite(suite, workers=1, progress=False)
    collect_suite(tmp_path / "runs" / "suite", tmp_path / "results", "fedshift bench suite.yaml")
    wanted = Path(first[1]["run_dir"]).name
    asked: list[str] = []
    hooked: list[tuple[str, bool]] = []

    def accept(cell, src: Path) -> bool:
        asked.append(src.name)
        return src.name == wanted

    def after(run_dir: str) -> None:
        hooked.append((Path(run_dir).name, (Path(run_dir) / "summary.json").is_file()))

    out = str(tmp_path / "b")
    again = run_suite(suite, out=out, workers=1, progress=False, reuse=accept, after=after)
    manifest = json.loads((tmp_path / "b" / "suite" / "bench.json").read_text())
    assert [row["status"] for row in manifest] == ["ran", "committed"]
    assert sorted(asked) == sorted(Path(s["run_dir"]).name for s in first)
    assert hooked == [(Path(first[0]["run_dir"]).name, True)]
    assert again[0]["test_mean"] == first[0]["test_mean"]
    hooked.clear()
    run_suite(suite, out=out, workers=1, progress=False, reuse=accept, after=after)
    assert hooked == []  # both cells done in that folder now


# ---------------------------------------------------------------------------- under faults
def _manifest(path: Path) -> dict[str, dict]:
    return {r["digest"]: r for r in json.loads(path.read_text())}


@pytest.mark.slow
def test_bench_results_do_not_depend_on_workers(tmp_path):
    """Two worker processes give every cell the sequential suite's run, bit for bit (FedAvg
    and FedBN). Threads per cell were cores // workers, so --workers changed results and
    digests."""
    suite = two_methods(tmp_path, sweep={"algorithm.name": ["fedavg", "fedbn"], "seed": [0]})
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


@pytest.fixture(scope="module")
def failing_suite(tmp_path_factory):
    """A suite of two good cells and two that fail while building, with 1 and 2 workers."""
    tmp = tmp_path_factory.mktemp("failing")
    suite = write_suite(tmp, sweep={"seed": [0, 1], "federation.holdout": [[], ["nope"]]})
    out = {}
    for n in (1, 2):
        with pytest.raises(FedshiftError) as err:
            run_suite(suite, workers=n, progress=False, out=str(tmp / f"w{n}"))
        out[n] = (str(err.value), _manifest(tmp / f"w{n}/suite/bench.json"))
    return out


def test_failing_cell_does_not_stop_the_others(failing_suite):
    """With one worker the first failing cell aborted the suite (no bench.json, no cell named)."""
    for n in (1, 2):
        message, rows = failing_suite[n]
        failed = [r for r in rows.values() if r["status"] == "failed"]
        assert len(failed) == 2 and sum(r["status"] == "ran" for r in rows.values()) == 2
        for r in failed:
            assert "nope" in r["label"] and "federation.holdout" in r["reason"]
            assert f"{r['label']} ({r['run_dir']}): config key 'federation.holdout'" in message
        assert message.startswith("2 of 4 cells failed")


def test_signal_stops_the_suite_and_is_not_a_failure(tmp_path, monkeypatch):
    """A signal in a cell must stop the suite at once, recorded, not as a failed cell."""
    suite = write_suite(tmp_path, sweep={"seed": [0, 1, 2]})
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


def test_empty_summary_is_recovered(tmp_path, monkeypatch):
    """A 0-byte summary.json (disk full) was `done` and every rerun died on JSONDecodeError."""
    suite = write_suite(tmp_path, sweep={"seed": [0]})
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
def test_killed_bench_leaves_no_worker(tmp_path):
    """kill -9 of `fedshift bench --workers 2` left both workers and the resource tracker."""
    suite = write_suite(tmp_path, train={"rounds": 5000, "batch_size": 16}, eval={"every": 5000})
    proc = subprocess.Popen(
        [sys.executable, "-m", "fedshift", "bench", str(suite), "--workers", "2", "--quiet"],
        env=fedshift_env(),
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


# ------------------------------------------------------------- a cell's files, its content
# issue 48: a committed cell whose cell.json digest was rewritten (another suite's cell,
# renamed) was taken as this suite's cell, and a cached cell's summary.json with scores out
# of range was taken as done; now the digest is recomputed from the cell's config.yaml (and
# its summary's config), and the summary's scores are range-checked
def _one_cell(tmp_path: Path, *over: str) -> tuple[Path, list]:
    suite = write_suite(tmp_path, sweep={"seed": [0]}, train={"rounds": 1, "batch_size": 16})
    return suite, plan(suite, list(over))


def test_a_committed_cell_with_a_rewritten_digest_is_not_taken(tmp_path, monkeypatch, caplog):

    monkeypatch.chdir(tmp_path)
    suite, [cell] = _one_cell(tmp_path)
    run_suite(suite, workers=1, progress=False)
    results = tmp_path / "results"
    collect_suite(tmp_path / "runs" / "suite", results, "fedshift bench suite.yaml")
    # the cell of another config (train.lr=0.02) forged from it: renamed, cell.json rewritten
    [other] = plan(suite, ["train.lr=0.02"])
    forged = results / "suite" / other.run_dir.name
    (results / "suite" / cell.run_dir.name).rename(forged)
    meta = json.loads((forged / "cell.json").read_text())
    (forged / "cell.json").write_text(json.dumps({**meta, "digest": other.digest}))
    with caplog.at_level("WARNING", logger="fedshift.bench"):
        run_suite(suite, ["train.lr=0.02"], out=str(tmp_path / "b"), workers=1, progress=False)
    manifest = json.loads((tmp_path / "b" / "suite" / "bench.json").read_text())
    assert [row["status"] for row in manifest] == ["ran"]  # run, not taken
    assert any(forged.name in r.getMessage() and "config.yaml gives" in r.getMessage()
               for r in caplog.records)  # fmt: skip
    # and collecting a suite folder holding such a cell is refused, naming it
    local = tmp_path / "b" / "suite" / other.run_dir.name
    meta = json.loads((local / "cell.json").read_text())
    (local / "cell.json").write_text(json.dumps({**meta, "digest": cell.digest}))
    with pytest.raises(FedshiftError, match=rf"{local.name}.*does not end with"):
        collect_suite(tmp_path / "b" / "suite", results, "x", name="again")
    assert not (results / "again").exists()


def test_a_cell_with_another_configs_summary_is_not_taken(tmp_path, monkeypatch):

    monkeypatch.chdir(tmp_path)
    suite, [cell] = _one_cell(tmp_path)
    run_suite(suite, workers=1, progress=False)
    path = cell.run_dir / "summary.json"
    s = json.loads(path.read_text())
    s["config"]["train"]["lr"] = 0.5  # a summary of another run pasted in
    path.write_text(json.dumps(s))
    with pytest.raises(FedshiftError, match=rf"{cell.run_dir.name}: its summary.json was written"):
        collect_suite(tmp_path / "runs" / "suite", tmp_path / "results", "x")
    assert cell_status(cell) == "new"  # run again, from the start


@pytest.mark.parametrize("value", [1e308, -5.0, 5.0], ids=["1e308", "negative", "500%"])
def test_a_cached_cell_with_scores_out_of_range_runs_again(tmp_path, caplog, value):

    suite, [cell] = _one_cell(tmp_path)
    [first] = run_suite(suite, workers=1, progress=False)
    path = cell.run_dir / "summary.json"
    s = json.loads(path.read_text())
    client = next(iter(s["test_per_client"]))
    s["test_per_client"][client] = value
    path.write_text(json.dumps(s))
    with caplog.at_level("WARNING", logger="fedshift.bench"):
        [again] = run_suite(suite, workers=1, progress=False)
    assert again["test_per_client"] == first["test_per_client"]  # the run's own numbers
    assert any(f"field 'test_per_client.{client}' must be a finite number in [0, 1]"
               in r.getMessage() and cell.run_dir.name in r.getMessage()
               for r in caplog.records)  # fmt: skip
    path.write_text(json.dumps(s))  # and such a cell is not collected into results/
    with pytest.raises(FedshiftError, match=rf"{path}: field 'test_per_client.{client}'"):
        collect_suite(tmp_path / "runs" / "suite", tmp_path / "results", "x")


def test_a_full_disk_at_the_last_result_file_leaves_no_cached_cell(tmp_path, monkeypatch):
    """Issue 48: a suite whose disk filled while a cell wrote its last result files (the
    ledger, the figure) was taken as cached on the next `fedshift bench` though those files
    were never written. summary.json is now written last, so the cell is not `done`; the
    next bench finishes it and every result file is there."""
    import fedshift.runtime.rundir.results as results

    suite = write_suite(tmp_path, train={"rounds": 1, "batch_size": 16}, sweep={"seed": [0]})
    (cell,) = plan(suite)

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(results, "plot_convergence", full)
    with pytest.raises(FedshiftError, match="1 of 1 cells failed"):
        run_suite(suite, progress=False)
    assert not (cell.run_dir / "summary.json").exists()
    assert cell_status(cell) != "done"
    monkeypatch.undo()
    run_suite(suite, progress=False)
    assert cell_status(cell) == "done"
    names = {p.name for p in cell.run_dir.iterdir()}
    assert {"summary.json", "ledger.json", "convergence.png", "metrics.jsonl"} <= names


def _grid_task(name: str) -> str:
    if name == "bad":
        raise FedshiftError(f"cell {name} cannot run")
    return "ran"


def test_one_grid_runner_reports_each_cell_and_the_failed(capsys):
    """`fedshift bench`, the studies' grids and `fedshift run --jobs` run their cells through
    parallel.run_grid: every cell of args runs (a failed one stops none), on_done sees each
    outcome, the failures come back by key, and a row without args is shown, not run."""
    from fedshift.runtime.parallel import run_grid

    seen = []
    rows = [("a", "A", 3), ("bad", "B", 3), ("c", "C", 3), ("kept", "K", 3)]
    args = {"a": ("a",), "bad": ("bad",), "c": ("c",)}
    failed = run_grid("grid", rows, _grid_task, args, 1, progress=False,
                      on_done=lambda key, res: seen.append((key, res["status"])))  # fmt: skip
    assert failed == {"bad": "cell bad cannot run"}
    assert seen == [("a", "ran"), ("bad", "failed"), ("c", "ran")]
