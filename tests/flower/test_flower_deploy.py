"""A real Flower deployment on 127.0.0.1: one SuperLink and two SuperNode processes, TLS and
SuperNode authentication on, runs submitted with `flwr run` (what `fedshift flower submit`
does). Two rounds of FedBN with FedFA's FFA layers (BN kept on each node's disk, FFA
statistics up and variances down) must end with the native engine's numbers; a SuperNode
killed mid-run must neither hang nor crash the server: the round completes with the other
node when min-clients allows, otherwise the run stops with a clear error.

Every Flower message starts a fresh ClientApp process that imports torch, Flower and
fedshift (about 5 s of CPU each, four messages a node for two rounds: hello, train, train,
evaluate), so this module is the suite's most expensive: two nodes rather than three (what a
third would add, sampling among several live clients and aggregation over more than two,
is covered in-process by tests/flower/test_flower.py and tests/runtime/test_same_run.py,
whose Flower cases send every kind of record through the same serialisation), one
deployment for the three tests (conftest.py GROUPS), and each killed-SuperNode test waits
out one 45 s round timeout (two rounds, the node killed after the first;
tests/flower/test_flower.py follows a lost node over more rounds in-process). Neither wait can
be shortened: the round timeout bounds the hello exchange too (each node's first ClientApp
process starts and imports torch within it; at 15 s, on a loaded machine, the run stopped at
the hello), and Flower 1.41's SuperNodes send a heartbeat every 30 s, a fixed constant, the
SuperLink calling a node offline after two missed ones: later than the round timeout."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import metric_rows, toy_cfg
from support.same_run import assert_runs_equal

from fedshift.flower.deploy import LocalDeployment
from fedshift.flower.server import FlowerOptions
from fedshift.runtime.simulation import run_experiment

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.slow]  # one_thread: exact
rows = metric_rows


#: SuperNodes, one per client of the runs' toyshift (``dataset.clients``)
NODES = 2
#: the runs: toyshift with one client per SuperNode, two rounds, evaluated in the second
TOY = (f"dataset.clients={NODES}", "eval.every=2")

#: largest |difference| of any loss or metric against the native run (0: bit-identical)
TOLERANCE = 0.0


def max_abs_diff(a: list[dict], b: list[dict]) -> float:
    assert [(r["round"], r["client"]) for r in a] == [(r["round"], r["client"]) for r in b]
    worst = 0.0
    for x, y in zip(a, b, strict=True):
        assert sorted(x) == sorted(y)
        for kind in ("personal", "global"):
            for k, v in x.get(kind, {}).items():
                worst = max(worst, abs(v - y[kind][k]))
        if "train_loss" in x:
            worst = max(worst, abs(x["train_loss"] - y["train_loss"]))
    return worst


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    base = tmp_path_factory.mktemp("sites")
    nodes = [
        {"client": f"client{i}", "state-dir": str(base / f"state{i}"), "threads": 1}
        for i in range(NODES)
    ]
    dep = LocalDeployment(base, nodes).start()
    yield dep
    dep.close()


@pytest.fixture
def sites(deployment):
    """The deployment with its SuperNodes running: a SuperNode an earlier test killed comes
    back first, so no test depends on the order the tests run in."""
    dead = [i for i in range(NODES) if deployment.procs[f"node{i}"].poll() is not None]
    for i in dead:
        deployment.start_node(i)
    if dead:
        deployment.wait_online(NODES, 120)
    return deployment


def run_dir_of(log: str) -> Path:
    line = next(x for x in log.splitlines() if "fedshift: run directory" in x)
    return Path(line.split("run directory", 1)[1].strip())


def test_supernodes_match_native(sites, tmp_path):
    """FedBN (BN layers kept on each node's disk between rounds) with FedFA's FFA layers
    (statistics sent up, variances sent down): the native engine's numbers, exactly."""
    cfg = toy_cfg("algorithm.name=fedbn", "augment=[ffa]", *TOY, rounds=2)
    run_id, status, log = sites.submit(cfg, FlowerOptions(round_timeout=300), tmp_path, 400)
    assert status == "finished:completed", log + sites.log("superlink")
    flower_dir = run_dir_of(log)
    native = run_experiment(cfg, run_dir=tmp_path / "native", progress=False)
    # the SuperNodes use one torch thread like the tests (node config threads=1): exact
    assert max_abs_diff(rows(flower_dir), rows(native.run_dir)) <= TOLERANCE
    assert_runs_equal(flower_dir, native.run_dir)
    summary = json.loads((flower_dir / "summary.json").read_text())
    assert summary["runtime"]["mode"] == "deployment"
    assert sorted(summary["runtime"]["nodes"]) == ["client0", "client1"]
    assert f"fedshift: round 2/2: {NODES} replies" in log
    # the FFA records crossed the wire both ways, every round
    by_record = summary["bytes_by_record"]
    assert by_record["up"]["ffa_stats"] > 0 and by_record["down"]["ffa_variance"] > 0, by_record
    # the client state was kept on each node's disk too
    assert all(list((sites.base / f"state{i}").glob("*/client*/r*.pt")) for i in range(NODES))


def _kill_after_round_one(sites, victim: int):
    def on_line(line: str) -> None:
        if "fedshift: round 1/2" in line:
            sites.kill(victim)

    return on_line


def test_killed_supernode_round_completes_with_the_others(sites, tmp_path):
    cfg = toy_cfg("algorithm.name=fedavg", *TOY, rounds=2)
    opts = FlowerOptions(round_timeout=45, min_clients=1)
    _, status, log = sites.submit(cfg, opts, tmp_path, 400, _kill_after_round_one(sites, 1))
    assert status == "finished:completed", log
    summary = json.loads((run_dir_of(log) / "summary.json").read_text())
    assert summary["runtime"]["lost"] == {"client1": 2}  # first lost in round 2
    assert "round 2/2: 1 replies" in log
    last = [r for r in rows(run_dir_of(log)) if r["round"] == 2]
    assert [r["client"] for r in last if r.get("lost")] == ["client1"]


def test_killed_supernode_below_the_minimum_stops_with_a_clear_error(sites, tmp_path):
    cfg = toy_cfg("algorithm.name=fedavg", *TOY, rounds=2)
    opts = FlowerOptions(round_timeout=45)  # every sampled client must reply
    _, status, log = sites.submit(cfg, opts, tmp_path, 400, _kill_after_round_one(sites, 1))
    assert status == "finished:failed", log
    # 1 replied; on a loaded machine the live node may miss the 45 s window too (then 0)
    want = r"round 2: aggregation needs 2 of the 2 sampled clients but only [01] replied"
    assert re.search(want, log), log[-4000:]
    assert "client1" in log and "--min-clients" in log
