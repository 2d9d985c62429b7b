"""Runs that survive: signals, extension to more rounds, the selected round's state, and
Flower runs that resume (their clients' state restored from the nodes' snapshots)."""

from __future__ import annotations

import contextlib
import json
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml
from conftest import toy_cfg, toy_dir
from support.same_run import assert_runs_equal

from fedshift.core.errors import ConfigError, FedshiftError
from fedshift.runtime.rundir.checkpoint_io import SELECTED, read_checkpoint
from fedshift.runtime.simulation import load_finished, resume_experiment, run_experiment
from fedshift.runtime.stopping import RunInterrupted

pytestmark = pytest.mark.usefixtures("one_thread")  # bit-for-bit comparisons


# ---------------------------------------------------------------------------- signals
RUNNER = textwrap.dedent(
    """
    import sys, torch, yaml
    torch.set_num_threads(1)
    from fedshift.catalog import resolve
    from fedshift.runtime.stopping import RunSignal
    from fedshift.runtime.simulation import Simulation
    cfg = resolve(yaml.safe_load(open(sys.argv[1])))
    sim = Simulation(cfg, sys.argv[2], progress=False)  # data and model ready: now it runs
    print("started", flush=True)
    try:
        sim.run()
    except RunSignal as s:
        print(s, flush=True)
        sys.exit(s.exit_code)
    """
)


def _rounds_written(run_dir: Path, rnd: int) -> bool:
    """Whether ``metrics.jsonl`` has a row of round ``rnd`` (or later)."""
    try:
        text = (run_dir / "metrics.jsonl").read_text()
    except FileNotFoundError:
        return False
    rounds = []
    for line in text.splitlines():
        with contextlib.suppress(ValueError):  # the line being written
            rounds.append(json.loads(line)["round"])
    return max(rounds, default=-1) >= rnd


ROUNDS = 12


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_signal_at_a_random_moment_saves_and_resumes_to_the_same_summary(tmp_path, signum):
    """A run killed by Ctrl-C or SIGTERM at a random moment saves the last whole round (the
    round in progress is rolled back) and, resumed, ends with the uninterrupted numbers."""
    over = (
        "algorithm.name=scaffold",
        "augment=[fedrdn]",
        "federation.sample_fraction=0.67",
        "train.optimizer_state=persist",
        "train.momentum=0.5",
        "checkpoint.every=0",
        "checkpoint.minutes=0",
    )  # fmt: skip  (no periodic checkpoint: only the signal's)
    cfg = toy_cfg(*over, rounds=ROUNDS)
    t0 = time.perf_counter()
    full = run_experiment(cfg, run_dir=tmp_path / "full", progress=False)
    duration = time.perf_counter() - t0
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg.to_dict()))
    script = tmp_path / "runner.py"
    script.write_text(RUNNER)
    run_dir = tmp_path / "killed"
    proc = subprocess.Popen(
        [sys.executable, str(script), str(path), str(run_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "started"
    # a seeded random moment inside the training rounds: a random part of a round's time
    # after round 2 to 6 of 12 was written (waiting for the round, not for a share of the
    # uninterrupted run's time, keeps it inside the run when the CPU is shared unevenly
    # between the two runs, as with parallel tests)
    rng = random.Random(int(signum))
    after = rng.randint(2, 6)
    deadline = time.monotonic() + 120
    while not _rounds_written(run_dir, after):
        assert proc.poll() is None and time.monotonic() < deadline, "the run did not start"
        time.sleep(0.005)
    time.sleep(duration / ROUNDS * rng.random())
    proc.send_signal(signum)
    out = proc.stdout.read()
    code = proc.wait(timeout=120)
    if code == 0:
        pytest.skip(f"the run finished before the signal arrived: {out}")
    assert code == 128 + int(signum), out
    assert signal.Signals(signum).name in out and "--resume" in out
    ck = read_checkpoint(run_dir / "checkpoint.pt")
    assert 0 <= ck["round"] < ROUNDS
    # the saved ledger holds whole rounds only: the interrupted round was rolled back
    assert {r[0] for r in ck["ledger"]["rows"]} == set(range(ck["round"] + 1))
    resume_experiment(run_dir, progress=False)
    assert_runs_equal(run_dir, full.run_dir)


def test_signal_during_a_checkpoint_write_waits_for_it(tmp_path, monkeypatch):
    """A signal that arrives while the checkpoint is written acts once it is complete: the
    file on disk is whole and the run stops right after."""
    from fedshift.runtime import checkpointing
    from fedshift.runtime.simulation import Simulation
    from fedshift.runtime.stopping import RunSignal

    cfg = toy_cfg("algorithm.name=fedavg", "checkpoint.every=1", rounds=4)
    sim = Simulation(cfg, tmp_path / "s", progress=False)
    real_save = checkpointing.write_checkpoint
    sent = []

    def save_then_signal(obj, path):
        real_save(obj, path)
        if obj.get("round") == 2 and "ledger" in obj and not sent:
            sent.append(1)
            sim.gate.handle(signal.SIGTERM, None)  # arrives mid-write

    monkeypatch.setattr(checkpointing, "write_checkpoint", save_then_signal)
    with pytest.raises(RunSignal) as info:
        sim.run()
    assert info.value.saved_round == 2 and info.value.exit_code == 143
    assert read_checkpoint(tmp_path / "s/checkpoint.pt")["round"] == 2


def test_signal_during_the_setup_exchange_saves_nothing(tmp_path):
    """Interrupted between sending the setup statistics and receiving the federation's back,
    a run has no whole state to save: no checkpoint, and --resume starts it again."""
    from fedshift.runtime.simulation import Simulation
    from fedshift.runtime.stopping import RunSignal

    cfg = toy_cfg("algorithm.name=fedavg", "augment=[fedrdn]", rounds=2)
    sim = Simulation(cfg, tmp_path / "s", progress=False)
    receive = sim.transport.setup_receive

    def interrupted(downs):
        sim.gate.handle(signal.SIGINT, None)
        return receive(downs)

    sim.transport.setup_receive = interrupted
    with pytest.raises(RunSignal) as info:
        sim.run()
    assert info.value.saved_round is None and info.value.exit_code == 130
    assert not (tmp_path / "s/checkpoint.pt").exists()
    full = run_experiment(cfg, run_dir=tmp_path / "full", progress=False)
    resume_experiment(tmp_path / "s", progress=False)
    assert_runs_equal(tmp_path / "s", full.run_dir)


# ---------------------------------------------------------------------------- extension
@pytest.mark.parametrize(
    "over",
    [("algorithm.name=fedbn",), ("algorithm.name=fedavg", "augment=[fedrdn]", "eval.every=3")],
    ids=["fedbn", "fedrdn-every3"],
)
def test_extending_a_finished_run_equals_the_longer_run(tmp_path, over):
    """A finished 10-round run extended to 20 rounds ends exactly as a 20-round run: same
    rows (the 10-round run's extra last-round evaluation is dropped when 10 is not a
    scheduled evaluation round), same selection, same ledger."""
    short = run_experiment(toy_cfg(*over, rounds=10), run_dir=tmp_path / "ext", progress=False)
    assert short.summary["rounds"] == 10
    long = run_experiment(toy_cfg(*over, rounds=20), run_dir=tmp_path / "long", progress=False)
    resume_experiment(tmp_path / "ext", progress=False, rounds=20)
    assert_runs_equal(tmp_path / "ext", long.run_dir)
    saved = yaml.safe_load((tmp_path / "ext/config.yaml").read_text())
    assert saved["train"]["rounds"] == 20


def test_extension_refuses_what_it_cannot_do(tmp_path):
    run_experiment(toy_cfg("algorithm.name=fedavg", rounds=3), run_dir=tmp_path / "a",
                   progress=False)  # fmt: skip
    with pytest.raises(ConfigError, match="extended, not shortened"):
        resume_experiment(tmp_path / "a", progress=False, rounds=2)
    # FRAug's ramp-up runs over train.rounds: a longer run is a different run
    run_experiment(toy_cfg("algorithm.name=fraug", rounds=2), run_dir=tmp_path / "f",
                   progress=False)  # fmt: skip
    with pytest.raises(ConfigError, match="ramp-up"):
        resume_experiment(tmp_path / "f", progress=False, rounds=4)


# ---------------------------------------------------------------------------- selected state
def test_the_selected_round_is_saved_and_loaded_by_default(tmp_path):
    """``selected.pt`` holds the state of the round model selection picked; load_finished
    rebuilds that model by default, and the last one on request."""
    cfg = toy_cfg("algorithm.name=fedbn", "eval.every=1", rounds=6)
    res = run_experiment(cfg, run_dir=tmp_path / "r", progress=False)
    best = res.summary["best_round"]
    selected = load_finished(res.run_dir)
    last = load_finished(res.run_dir, weights="last")
    assert last.round == 6 and selected.round == best
    assert (last.weights, selected.weights) == ("last", "selected")
    if best != 6:
        assert read_checkpoint(res.run_dir / SELECTED)["round"] == best
    # the selected model scores what the summary reports at the selected round
    from fedshift.runtime.client import evaluate_client

    for cid in res.summary["clients"]:
        s = evaluate_client(selected.exp, selected.fed.client(cid), selected.states[cid], 500,
                            view=selected.algo.server_view(selected.server, cid))  # fmt: skip
        assert s["personal"]["test_acc"] == pytest.approx(res.summary["test_per_client"][cid])
    with pytest.raises(ConfigError, match="weights must be one of"):
        load_finished(res.run_dir, weights="best")


def test_an_unfinished_run_has_no_selected_model_yet(tmp_path):
    cfg = toy_cfg("algorithm.name=fedavg", "checkpoint.every=1", rounds=4)
    with pytest.raises(RunInterrupted):
        run_experiment(cfg, run_dir=tmp_path / "u", progress=False, stop_after=2)
    with pytest.raises(FedshiftError, match="has not finished"):
        load_finished(tmp_path / "u")
    assert load_finished(tmp_path / "u", weights="last").round == 2


# ---------------------------------------------------------------------------- Flower
# a Flower run stopped after a round resumes (its clients restored from the nodes'
# snapshots) to the uninterrupted native run: tests/runtime/test_same_run.py (its Flower cases)


def test_flower_resume_without_snapshots_fails_loudly(tmp_path):
    """A node that kept no state snapshot cannot resume a client that trained: it says so
    instead of silently restarting the client from its initial state."""
    from fedshift.flower.inprocess import InProcessGrid
    from fedshift.flower.node import build_client_app
    from fedshift.flower.server import FlowerOptions, FlowerServer

    cfg = toy_cfg("algorithm.name=fedbn", "checkpoint.every=1", rounds=3)
    opts = FlowerOptions(nodes=3)  # no snapshot_dir and no node state-dir
    with pytest.raises(RunInterrupted):
        FlowerServer(cfg, tmp_path / "r", opts, progress=False).run(
            InProcessGrid(build_client_app(), 3), stop_after=1
        )
    with pytest.raises(FedshiftError, match="no snapshot of the client's state"):
        FlowerServer(cfg, tmp_path / "r", opts, progress=False).run(
            InProcessGrid(build_client_app(), 3), resume=True
        )


def test_flower_run_stopped_by_a_signal_continues_on_flower_only(tmp_path, monkeypatch):
    """A simulation stopped by SIGINT says to continue with `fedshift flower simulate
    --resume` (it said `fedshift run --resume`), and its checkpoint, which holds no client
    state (that stays on the nodes), is refused by the native resume (a KeyError before; a
    silent restart of every client from its initial state would be another run)."""
    from fedshift.flower.inprocess import InProcessGrid
    from fedshift.flower.node import build_client_app
    from fedshift.flower.server import FlowerOptions, FlowerServer
    from fedshift.flower.transport import GridTransport
    from fedshift.runtime.stopping import RunSignal

    cfg = toy_cfg("algorithm.name=fedbn", "checkpoint.every=1", rounds=4)
    opts = FlowerOptions(nodes=3, snapshot_dir=tmp_path / "snap", mode="simulation (in-process)")
    server = FlowerServer(cfg, tmp_path / "f", opts, progress=False)
    real = GridTransport.train

    def train(self, rnd, cids, down):
        if rnd == 3:  # Ctrl-C during round 3: round 2 is saved
            server.loop.gate.handle(signal.SIGINT, None)
        return real(self, rnd, cids, down)

    monkeypatch.setattr(GridTransport, "train", train)
    with pytest.raises(RunSignal) as stop:
        server.run(InProcessGrid(build_client_app(), 3))
    assert stop.value.saved_round == 2
    assert f"continue with: fedshift flower simulate --resume {tmp_path / 'f'}" in str(stop.value)
    with pytest.raises(FedshiftError, match="holds no client state.*fedshift flower simulate"):
        resume_experiment(tmp_path / "f", progress=False)


# ---------------------------------------------------------------------------- command line
def test_cli_resume_extends_and_refuses_other_overrides(tmp_path, capsys):
    from fedshift.cli import main

    over = ["dataset.name=toyshift", "model.name=lenet5", "train.batch_size=16", "name=t",
            "algorithm.name=fedavg", f"out={tmp_path}"]  # fmt: skip
    assert main(["run", *over, "train.rounds=2", "--quiet"]) == 0
    run_dir = tmp_path / "t" / toy_dir()
    assert main(["run", "--resume", str(run_dir), "train.lr=0.5"]) == 2
    assert "only override it takes is train.rounds=N" in capsys.readouterr().err
    assert main(["run", "--resume", str(run_dir), "train.rounds=4", "--quiet"]) == 0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["rounds"] == 4
    longer = run_experiment(toy_cfg("algorithm.name=fedavg", "name=t", rounds=4),
                            run_dir=tmp_path / "long", progress=False)  # fmt: skip
    assert_runs_equal(run_dir, longer.run_dir)


# Flower's Ray engine: test_sigint_and_sigterm_stop_a_ray_simulation_cleanly
# (tests/flower/test_ray_signals.py) stops a FedBN run on Ray with SIGINT, resumes it on a fresh
# Ray simulation, stops that with SIGTERM, finishes it and compares every round with the
# uninterrupted native run (one test for both: each Ray start costs ~15 s on 2 cores).
