"""The pool transport (``run.workers``): clients in long-lived worker processes give the
sequential run's numbers bit for bit (for every algorithm and augment: the pool cases of
tests/runtime/test_same_run.py); runs killed, interrupted or failing in a worker behave as
sequential ones; no worker outlives its run."""

from __future__ import annotations

import dataclasses
import json
import multiprocessing as mp
import os
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import toy_cfg
from support.same_run import TINY, assert_runs_equal

from fedshift.bench import config_digest, plan, run_suite
from fedshift.core.errors import FedshiftError, TrainingError
from fedshift.core.federation import Split
from fedshift.data import load_dataset
from fedshift.runtime.pool import transport as pool_mod
from fedshift.runtime.pool import worker as pool_worker
from fedshift.runtime.pool.transport import PoolTransport, assign
from fedshift.runtime.rundir.checkpoint_io import read_checkpoint
from fedshift.runtime.rundir.results import run_dir_name
from fedshift.runtime.simulation import Simulation, resume_experiment, run_experiment
from fedshift.runtime.stopping import RunSignal

pytestmark = pytest.mark.usefixtures("one_thread")  # bit-for-bit comparisons


@pytest.fixture(scope="module")
def pool(worker_pool):
    """Two workers shared by the module's runs (conftest's ``worker_pool``)."""
    return worker_pool


def _children() -> set[int]:
    return {p.pid for p in mp.active_children()}


def _gone(pid: int) -> bool:
    """No such process (or only its zombie, waiting for a parent that no longer reaps)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


# ---------------------------------------------------------------------------- equality
# the pool gives the sequential run's metric rows, results, ledger and final state for every
# algorithm and augment: tests/runtime/test_same_run.py (its pool-* cases)


def test_assignment_balances_training_examples():
    """Largest training split first to the least-loaded worker; non-training clients after."""
    got = assign({"a": 10, "b": 50, "c": 30, "d": 20}, ["a", "b", "c", "d", "h"], 2)
    assert got == {"b": 0, "c": 1, "d": 1, "a": 0, "h": 0}


# ---------------------------------------------------------------------------- errors
def _federation(cfg, broken: dict[int, str]):
    """toyshift with some clients' training data broken: ``empty`` or ``label`` (out of
    range)."""
    fed = load_dataset(cfg.dataset, cfg.partition)
    clients = []
    for k, c in enumerate(fed.clients):
        if broken.get(k) == "empty":
            c = dataclasses.replace(c, train=Split(c.train.x[:0], c.train.y[:0]))
        elif broken.get(k) == "label":
            y = c.train.y.clone()
            y[-1] = 99
            c = dataclasses.replace(c, train=Split(c.train.x, y))
        clients.append(c)
    return dataclasses.replace(fed, clients=clients)


def _error(cfg, run_dir: Path, fed, **kw) -> BaseException:
    with pytest.raises(Exception) as info:  # noqa: PT011 - compared with the sequential one
        run_experiment(cfg, run_dir=run_dir, federation=fed, progress=False, **kw)
    return info.value


def test_worker_error_surfaces_as_the_sequential_error(tmp_path, pool):
    """An exception in a worker is raised in the run's process with the type and message a
    sequential run gives, for the first failing client in the sampled order (client1 on
    worker 1 before client2 on worker 0); the non-finite reply check too."""
    cfg = toy_cfg("algorithm.name=fedavg", rounds=2)
    fed = _federation(cfg, {1: "label", 2: "label"})
    seq = _error(cfg, tmp_path / "s1", fed, workers=1)
    par = _error(cfg, tmp_path / "p1", fed, pool=pool)
    assert (type(par), str(par)) == (type(seq), str(seq)) == (IndexError, str(seq))
    assert "pool worker 1" in par.__notes__[0] and "client 'client1'" in par.__notes__[0]
    cfg = toy_cfg("algorithm.name=fedproto", "algorithm.prototypes=released", rounds=2)
    fed = _federation(cfg, {2: "empty"})
    seq = _error(cfg, tmp_path / "s2", fed, workers=1)
    par = _error(cfg, tmp_path / "p2", fed, pool=pool)
    assert isinstance(par, TrainingError) and str(par) == str(seq)
    cfg = toy_cfg("algorithm.name=fedavg", "train.lr=1e30", rounds=2)
    seq = _error(cfg, tmp_path / "s3", None, workers=1)
    par = _error(cfg, tmp_path / "p3", None, pool=pool)
    assert isinstance(par, TrainingError) and str(par) == str(seq)
    # the pool still serves runs after its workers raised
    ok = run_experiment(toy_cfg(rounds=1), run_dir=tmp_path / "ok", progress=False, pool=pool)
    assert ok.summary["runtime"]["executor"] == "pool"


def test_workers_are_gone_after_a_run_and_after_a_dead_worker(tmp_path, monkeypatch):
    """A run's own pool stops with the run; a worker killed mid-run is a FedshiftError naming
    it (not a hang), and the other workers are stopped too."""
    before = _children()
    cfg = toy_cfg(rounds=2)
    run_experiment(cfg, run_dir=tmp_path / "ok", progress=False, workers=2)
    assert _children() == before
    pids: list[int] = []
    train = PoolTransport.train

    def kill_one(self, rnd, cids, down):
        if rnd == 2:
            pids.extend(self.pool.pids)
            os.kill(pids[1], signal.SIGKILL)
        return train(self, rnd, cids, down)

    monkeypatch.setattr(PoolTransport, "train", kill_one)
    err = _error(cfg, tmp_path / "dead", None, workers=2)
    assert isinstance(err, FedshiftError)
    assert f"pool worker 1 (pid {pids[1]}) died (killed by SIGKILL)" in str(err)
    assert "--resume" in str(err)
    assert _children() == before and all(_gone(p) for p in pids)


# ---------------------------------------------------------------------------- signals
SIGNALLED = (
    "algorithm.name=scaffold",
    "federation.sample_fraction=0.67",
    "train.optimizer_state=persist",
    "train.momentum=0.5",
    "checkpoint.every=0",
    "checkpoint.minutes=0",
)


def test_sigint_cancels_and_rolls_back_the_round_in_the_workers(tmp_path, pool, monkeypatch):
    """Ctrl-C while the workers train round 3: the workers stop it and restore the clients'
    state from the round's start, the run saves round 2, and the resumed run ends with the
    uninterrupted numbers."""
    cfg = toy_cfg(*TINY, *SIGNALLED, "train.local_steps=300", rounds=3)
    full = run_experiment(cfg, run_dir=tmp_path / "full", progress=False, pool=pool)
    wait, sent = pool_mod._wait, []

    def wait_then_sigint(job):
        _, op, args = pool_worker.loads(job.data)
        if op == "train" and args[0] == 3 and not sent:
            sent.append(job)
            time.sleep(0.05)  # the workers are in the round's local steps
            os.kill(os.getpid(), signal.SIGINT)
        return wait(job)

    monkeypatch.setattr(pool_mod, "_wait", wait_then_sigint)
    cancelled = pool.cancelled
    run_dir = tmp_path / "stopped"
    transport = PoolTransport(pool=pool)
    try:
        with pytest.raises(RunSignal) as info:
            Simulation(cfg, run_dir, progress=False, transport=transport).run()
    finally:
        transport.close()
        monkeypatch.undo()
    assert info.value.saved_round == 2 and info.value.exit_code == 130
    assert pool.cancelled > cancelled  # the workers stopped mid-round
    ck = read_checkpoint(run_dir / "checkpoint.pt")
    assert ck["round"] == 2 and {r[0] for r in ck["ledger"]["rows"]} == {1, 2}
    resume_experiment(run_dir, progress=False, pool=pool)
    assert_runs_equal(run_dir, full.run_dir)


def _worker_pids(pid: int) -> list[int]:
    """The pool workers among ``pid``'s children (not multiprocessing's resource tracker)."""
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            kids = [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
        for kid in kids:
            try:
                cmd = Path(f"/proc/{kid}/cmdline").read_bytes()
            except OSError:
                continue
            if b"spawn_main" in cmd:
                out.append(kid)
    return out


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux /proc")
def test_killed_pool_run_resumes_to_the_uninterrupted_numbers(tmp_path, pool):
    """`fedshift run --workers 2` killed (SIGKILL) after round 2: its workers die with it,
    and `--resume` with a pool ends with the numbers of an uninterrupted sequential run."""
    over = (*SIGNALLED[:-2], "checkpoint.every=1", "name=test")
    cfg = toy_cfg(*over, rounds=8)
    full = run_experiment(cfg, run_dir=tmp_path / "full", progress=False, workers=1)
    args = [
        "dataset.name=toyshift",
        "model.name=lenet5",
        "train.rounds=8",
        "train.batch_size=16",
        *over,
    ]  # fmt: skip  (conftest's toy_cfg on the CLI)
    cmd = [sys.executable, "-m", "fedshift", "run", *args, "--workers", "2", "--quiet"]
    proc = subprocess.Popen([*cmd, "--out", str(tmp_path / "runs")], stderr=subprocess.PIPE)
    run_dir = tmp_path / "runs/test" / run_dir_name(cfg)
    deadline = time.monotonic() + 120
    saved = -1
    while saved < 2 and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
        if (run_dir / "checkpoint.pt").is_file():
            saved = int(read_checkpoint(run_dir / "checkpoint.pt")["round"])
    workers = _worker_pids(proc.pid)
    proc.kill()
    _, err = proc.communicate(timeout=60)
    if saved >= 8:
        pytest.skip("the run finished before it was killed")
    assert 2 <= saved < 8 and len(workers) == 2, err.decode()
    deadline = time.monotonic() + 10
    while not all(_gone(p) for p in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert all(_gone(p) for p in workers), "pool workers outlived their killed parent"
    resume_experiment(run_dir, progress=False, pool=pool)
    assert_runs_equal(run_dir, full.run_dir)


# ---------------------------------------------------------------------------- config, bench
def test_run_workers_is_not_part_of_a_cell_digest_and_bench_shares_the_cores(tmp_path):
    """run.workers changes no number: not in a suite cell's digest (run.threads is, when not
    1); an explicit --workers that would oversubscribe the cores with cells' own workers is
    refused, the default shrinks to fit."""
    suite = tmp_path / "suite.yaml"
    suite.write_text(
        "name: suite\nout: " + str(tmp_path / "runs") + "\ndataset: {name: toyshift}\n"
        "model: {name: lenet5}\ntrain: {rounds: 1, batch_size: 16}\n"
        "sweep: {seed: [0, 1]}\n"
    )
    base = plan(suite)[0]
    pooled = plan(suite, ["run.workers=2"])[0]
    threaded = plan(suite, ["run.threads=2"])[0]
    assert base.digest == pooled.digest == config_digest(base.cfg, 1)
    assert threaded.digest == config_digest(base.cfg, 2) != base.digest
    cores = os.cpu_count() or 1
    with pytest.raises(FedshiftError, match=r"--workers 2 x \d+ cores per cell .*--oversubscribe"):
        run_suite(suite, ["run.workers=2", f"run.threads={cores}"], workers=2, progress=False)
    (summary,) = run_suite(suite, ["run.workers=2", "sweep.seed=[0]"], progress=False)
    assert summary["runtime"]["workers"] == 2
    rows = json.loads((tmp_path / "runs/suite/bench.json").read_text())
    assert [r["status"] for r in rows] == ["ran"]


def test_messages_carry_tensors_out_of_band_bit_exact():
    """A pool message through a real pipe: tensors bit-exact, views of one storage share it
    again (sent once), empty and non-float tensors and plain objects intact."""
    base = torch.randn(6, 5)
    obj = {"w": base, "view": base[2:4, 1:], "t": base.t(), "empty": torch.zeros(0),
           "i": torch.arange(7), "n": 3, "s": "x"}  # fmt: skip
    frames = pool_worker.dumps(obj)
    assert len(frames) == 1 + 3  # one buffer per storage: base, empty, arange
    a, b = mp.Pipe()
    pool_worker.send(a, frames)
    got = pool_worker.recv(b)
    for k in ("w", "view", "t", "empty", "i"):
        assert torch.equal(got[k], obj[k]) and got[k].stride() == obj[k].stride(), k
    assert got["view"].untyped_storage().data_ptr() == got["w"].untyped_storage().data_ptr()
    got["w"][2, 1] = 99.0  # writable, and the view sees it
    assert got["view"][0, 0] == 99.0
    assert (got["n"], got["s"]) == (3, "x")
    assert pool_worker.loads(frames)["i"].tolist() == list(range(7))


@pytest.mark.parametrize("raw", [True, False], ids=["raw", "connection"])
def test_large_messages_arrive_whole_both_ways(monkeypatch, raw):
    """Buffers larger than the socket's (raw reads on POSIX, one Connection message each
    elsewhere): a reader in another thread gets every byte, in order, over a fresh
    uninitialised buffer, and a peer closing mid-message is an EOFError, not a hang."""
    import threading

    if raw and not pool_worker.RAW:
        pytest.skip("raw descriptor reads are POSIX-only")
    monkeypatch.setattr(pool_worker, "RAW", raw)
    obj = {"big": torch.randn(3, 1 << 20), "small": torch.arange(5), "half": torch.randn(9).half()}
    a, b = mp.Pipe()
    got = {}
    reader = threading.Thread(target=lambda: got.update(v=pool_worker.recv(b)))
    reader.start()
    pool_worker.send(a, pool_worker.dumps(obj))
    reader.join(30)
    assert all(torch.equal(got["v"][k], obj[k]) for k in obj)
    if raw:  # the writer dies after the header: the reader must not wait forever
        frames = pool_worker.dumps({"x": torch.randn(1 << 16)})
        head = struct.pack("<IQ", 1, frames[1].raw().nbytes)
        a.send_bytes(head + frames[0])
        a.close()
        with pytest.raises(EOFError):
            pool_worker.recv(b)


def test_a_stopped_pool_begins_no_cell_it_had_already_handed_to_a_worker(tmp_path):
    """The executor hands a worker one cell beyond those running, which ``cancel`` cannot
    take back. A signal stops the pool: the running cells end, the one handed over and the
    rest never begin and are not reported (they stay pending), and the stop is prompt."""
    import threading

    from support.pool_tasks import sleepy

    from fedshift.runtime.parallel import Stopped, run_cells

    keys = [f"cell{i}" for i in range(5)]
    args = {k: (str(tmp_path), k, 2.0) for k in keys}
    ended: dict[str, str] = {}

    def done(key: str, res: dict) -> None:
        ended[key] = res["status"]

    def stop_soon() -> None:  # once both workers have begun a cell
        deadline = time.monotonic() + 60
        while len(list(tmp_path.glob("*.began"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=stop_soon, daemon=True).start()
    started = time.monotonic()
    with pytest.raises(Stopped):
        run_cells(keys, sleepy, args, 2, done)
    began = sorted(p.stem for p in tmp_path.glob("*.began"))
    assert began == keys[:2], began  # the handed-over third cell never began
    assert ended == {"cell0": "ran", "cell1": "ran"}
    assert time.monotonic() - started < 30  # not the five cells' 10 s after the stop
