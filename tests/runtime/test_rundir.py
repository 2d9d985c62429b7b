"""Run directories: one belongs to one process at a time (claimed atomically, a second
process refused, the lock gone with its process), and nothing outside a run is deleted:
``--overwrite``, ``fedshift bench`` and ``fedshift flower simulate --overwrite`` empty a
directory only when fedshift made it (its lock file and a config that parses, a checkpoint
header or ``cell.json``), never through a symbolic link; each case has a real victim file
that must survive."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml
from conftest import fedshift_env, toy_cfg, write_suite

from fedshift.bench import cell_status, plan, run_suite
from fedshift.cli import main
from fedshift.core.errors import FedshiftError
from fedshift.runtime.rundir.ownership import LOCK_FILE, clear_run_dir
from fedshift.runtime.rundir.results import new_run_dir
from fedshift.runtime.simulation import Simulation
from fedshift.runtime.stopping import RunInterrupted

TOY = ["dataset.name=toyshift", "model.name=lenet5", "train.batch_size=16", "train.rounds=1"]
#: what a victim folder holds: a file of the user's and a config.yaml that looks like a run's
RUN_LIKE = {"name": "X", "seed": 0, "dataset": {"name": "toyshift"}, "model": {"name": "cnn"},
            "algorithm": {"name": "fedavg"}, "train": {"rounds": 1}}  # fmt: skip


def _run_name() -> str:
    """The directory ``fedshift run`` gives :data:`TOY` (``name=X``)."""
    from fedshift.catalog import resolve
    from fedshift.core.config import load_config
    from fedshift.runtime.rundir.results import run_dir_name

    return run_dir_name(resolve(load_config(None, [*TOY, "name=X"])))


def _victim(tmp_path: Path, lock: bool = False) -> Path:
    """A folder of the user's, outside any --out: thesis.tex and a config.yaml (and, with
    ``lock``, even a run.lock: a link to it is still refused)."""
    victim = tmp_path / "home" / "thesis"
    victim.mkdir(parents=True)
    (victim / "thesis.tex").write_text("\\documentclass{article} years of work")
    (victim / "config.yaml").write_text(yaml.safe_dump(RUN_LIKE))
    if lock:
        (victim / LOCK_FILE).write_text("")
    return victim


def _intact(victim: Path, lock: bool = False) -> None:
    assert (victim / "thesis.tex").read_text().endswith("years of work")
    assert sorted(p.name for p in victim.iterdir()) == sorted(
        ["config.yaml", "thesis.tex", *([LOCK_FILE] if lock else [])]
    )


@pytest.mark.parametrize("lock", [False, True], ids=["plain", "with-run.lock"])
def test_overwrite_never_deletes_through_a_symlinked_run_dir(tmp_path, capsys, lock):
    """`fedshift run name=X --overwrite` with the run's directory runs/X/... a link to a folder
    holding thesis.tex: exit 0 and thesis.tex deleted before; now one error naming the link."""
    victim = _victim(tmp_path, lock)
    link = tmp_path / "runs" / "X" / _run_name()
    link.parent.mkdir(parents=True)
    link.symlink_to(victim, target_is_directory=True)
    code = main(["run", *TOY, "name=X", "--out", str(tmp_path / "runs"), "--overwrite", "--quiet"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"{link} is a symbolic link" in err and "nothing was deleted" in err
    _intact(victim, lock)
    # without --overwrite a link is not written through either
    assert main(["run", *TOY, "name=X", "--out", str(tmp_path / "runs"), "--quiet"]) == 2
    _intact(victim, lock)


def test_overwrite_refuses_a_folder_without_fedshift_marks(tmp_path, capsys):
    """A real folder at the run's path holding a config.yaml but no lock file or checkpoint
    (a user's folder that happens to have a config.yaml) is not a run: it is left alone."""
    run_dir = tmp_path / "runs" / "X" / _run_name()
    run_dir.mkdir(parents=True)
    (run_dir / "thesis.tex").write_text("mine")
    (run_dir / "config.yaml").write_text(yaml.safe_dump(RUN_LIKE))
    code = main(["run", *TOY, "name=X", "--out", str(tmp_path / "runs"), "--overwrite", "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and "not a fedshift run directory" in err and str(run_dir) in err
    assert (run_dir / "thesis.tex").read_text() == "mine"


def test_overwrite_of_a_real_run_removes_a_link_inside_not_its_target(tmp_path, capsys):
    """A run directory fedshift made is overwritten; a symbolic link someone put inside it is
    removed as a link, the folder it points to keeps its files."""
    over = [*TOY, "name=X", "--out", str(tmp_path / "runs"), "--quiet"]
    assert main(["run", *over]) == 0
    run_dir = tmp_path / "runs" / "X" / _run_name()
    victim = _victim(tmp_path)
    (run_dir / "data").symlink_to(victim, target_is_directory=True)
    (run_dir / "notes.tex").symlink_to(victim / "thesis.tex")
    assert main(["run", *over, "--overwrite"]) == 0
    assert not (run_dir / "data").exists() and not (run_dir / "notes.tex").exists()
    assert (run_dir / "summary.json").is_file()
    _intact(victim)


def test_marks_decide_what_may_be_cleared(tmp_path):
    """check_clearable: an empty claim, a run (lock + config), a checkpoint header and a
    cell.json may be cleared; a link, a stray config.yaml or a config.yaml that does not
    parse as a run's may not (clear_run_dir checks first, deleting nothing)."""
    from fedshift.runtime.rundir.ownership import check_clearable

    ok = tmp_path / "ok"
    ok.mkdir()
    (ok / LOCK_FILE).write_text("")
    check_clearable(ok)  # empty but for its lock
    (ok / "config.yaml").write_text(yaml.safe_dump(toy_cfg().to_dict()))
    check_clearable(ok)
    (ok / "config.yaml").write_text(yaml.safe_dump(RUN_LIKE))  # a hand-written one: no mark
    (ok / "x.txt").write_text("x")
    with pytest.raises(FedshiftError, match="not a fedshift run directory"):
        check_clearable(ok)
    (ok / "x.txt").unlink()
    cell = tmp_path / "cell"
    cell.mkdir()
    (cell / "cell.json").write_text(json.dumps({"digest": "abc", "label": "x"}))
    check_clearable(cell)
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / LOCK_FILE).write_text("")
    (bad / "config.yaml").write_text("just: [a, list]\n")  # YAML, but not a run's config
    (bad / "keep.txt").write_text("keep")
    with pytest.raises(FedshiftError, match="not a fedshift run directory"):
        clear_run_dir(bad)
    (bad / "checkpoint.pt").write_bytes(b"PK\x03\x04 a zip, not fedshift's header")
    with pytest.raises(FedshiftError, match="not a fedshift run directory"):
        clear_run_dir(bad)
    assert (bad / "keep.txt").read_text() == "keep"
    link = tmp_path / "link"
    link.symlink_to(ok, target_is_directory=True)
    with pytest.raises(FedshiftError, match="symbolic link"):
        clear_run_dir(link)
    assert (ok / "config.yaml").is_file()


def _suite(tmp_path: Path) -> Path:
    """One cell, one round."""
    return write_suite(tmp_path, name="s", train={"rounds": 1, "batch_size": 16},
                       checkpoint=None, sweep=None)  # fmt: skip


@pytest.mark.parametrize("how", ["link", "foreign"])
def test_bench_never_clears_a_linked_or_foreign_cell_path(tmp_path, how):
    """`fedshift bench` cleared a "new" cell's path through a symbolic link (bench.py's
    clear_run_dir without a check), deleting the files of the folder it pointed to; now the
    suite (a link) or the cell (a foreign folder) fails naming the path and the folder keeps
    its files (and gets no lock file)."""
    suite = _suite(tmp_path)
    (cell,) = plan(suite)
    victim = _victim(tmp_path)
    cell.run_dir.parent.mkdir(parents=True)
    if how == "link":
        cell.run_dir.symlink_to(victim, target_is_directory=True)
        want = "is a symbolic link"
    else:
        victim.rename(cell.run_dir)
        victim = cell.run_dir
        want = "not a fedshift run directory"
    # a linked cell is refused with the whole suite folder, before any cell runs
    # (core.files.check_folder); a foreign folder fails its cell
    match = "in a suite folder" if how == "link" else "1 of 1 cells failed"
    with pytest.raises(FedshiftError, match=match) as e:
        run_suite(suite, progress=False)
    assert want in str(e.value) and str(cell.run_dir) in str(e.value)
    _intact(victim)


def test_flower_simulate_overwrite_never_deletes_through_a_link(tmp_path, capsys):
    """`fedshift flower simulate --overwrite` claims its directory as `fedshift run` does."""
    victim = _victim(tmp_path)
    link = tmp_path / "runs" / "X" / _run_name()
    link.parent.mkdir(parents=True)
    link.symlink_to(victim, target_is_directory=True)
    argv = ["flower", "simulate", *TOY, "name=X", "--out", str(tmp_path / "runs"),
            "--engine", "in-process", "--overwrite", "--quiet"]  # fmt: skip
    assert main(argv) == 2
    assert "is a symbolic link" in capsys.readouterr().err
    _intact(victim)


# ---------------------------------------------------------------------------- ownership
# one run directory (one suite folder) belongs to one process at a time
def test_new_run_dirs_are_claimed_atomically(tmp_path):
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


def test_second_process_is_refused(tmp_path):
    """A second `fedshift run --resume` / `fedshift bench` wrote into a run already going."""
    from fedshift.runtime.rundir.ownership import LOCK_FILE, hold_lock, hold_run

    run_dir = tmp_path / "run"
    with pytest.raises(RunInterrupted):
        Simulation(toy_cfg(), run_dir, progress=False).run(stop_after=1)
    rows = (run_dir / "metrics.jsonl").read_text()
    suite = write_suite(tmp_path, sweep={"seed": [0]})
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
                env=fedshift_env(),
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


def test_lock_dies_with_its_process(tmp_path):
    """A lock must never outlive its process (kill -9), and must not look like run output."""
    from fedshift.runtime.rundir.ownership import hold_run

    run_dir = tmp_path / "run"
    code = (
        "import sys, time; from fedshift.runtime.rundir.ownership import hold_run\n"
        f"with hold_run({str(run_dir)!r}):\n    print('held', flush=True); time.sleep(60)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], env=fedshift_env(), stdout=subprocess.PIPE, text=True
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
    (cell,) = plan(write_suite(tmp_path, sweep={"seed": [0]}))
    cell.run_dir.mkdir(parents=True)
    with hold_run(cell.run_dir):
        assert cell_status(cell) == "new"
