"""fedshift on Flower: the wire format, the ServerApp/ClientApp against the native engine
in-process, lost SuperNodes, and submitting to a SuperLink. On Flower's Ray simulation engine:
tests/flower/test_ray_signals.py (a FedBN run stopped and resumed on Ray ends with the native
numbers); a real local deployment (SuperLink and SuperNode processes, TLS and SuperNode
authentication): tests/flower/test_flower_deploy.py."""

from __future__ import annotations

import pytest
import torch
from conftest import ledger, metric_rows, toy_cfg
from flwr.app import ArrayRecord
from support.same_run import assert_runs_equal

from fedshift.cli import main
from fedshift.core.errors import ConfigError, FedshiftError
from fedshift.core.payload import Payload
from fedshift.flower.inprocess import InProcessGrid
from fedshift.flower.node import build_client_app, node_settings
from fedshift.flower.server import FlowerOptions, FlowerServer
from fedshift.flower.wire import pack, payload_to_records, records_to_payload, unpack
from fedshift.runtime.simulation import Simulation, run_experiment

pytestmark = pytest.mark.usefixtures("one_thread")  # bit-for-bit comparisons
rows = metric_rows


# ---------------------------------------------------------------------------- wire
def test_payload_round_trip_is_exact():
    p = Payload(
        {
            "weights": {"a.weight": torch.randn(3, 4), "bn.num_batches_tracked": torch.tensor(7)},
            "fedrdn_stats": {"mean": torch.rand(3, dtype=torch.float64), "m": torch.ones(2) > 0},
            "empty": {},
        },
        num_examples=41,
        metrics={"train_loss": 0.25, "steps": 3},
        config={"a_norm": 2.5, "mode": "nn"},
    )
    q = records_to_payload(payload_to_records(p))
    assert list(q.records) == list(p.records)
    for name, rec in p.records.items():
        assert list(q.records[name]) == list(rec)
        for k, t in rec.items():
            assert q.records[name][k].dtype == t.dtype and torch.equal(q.records[name][k], t)
    assert (q.num_examples, q.metrics, q.config) == (41, p.metrics, p.config)
    assert q.nbytes() == p.nbytes()


def test_reserved_record_names_and_bad_metrics_are_refused():
    with pytest.raises(FedshiftError, match="reserved"):
        payload_to_records(Payload({"fedshift.x": {"a": torch.zeros(1)}}))
    with pytest.raises(FedshiftError, match="metrics must be numbers"):
        payload_to_records(Payload({}, metrics={"note": "text"}))  # type: ignore[dict-item]


def test_pack_keeps_nested_state():
    state = {"local": {"w": torch.randn(2, 2)}, "cid": "a", "n": 3, "opt": None, "l": [1.5]}
    back = unpack(pack(state))
    assert torch.equal(back["local"]["w"], state["local"]["w"])
    assert {k: back[k] for k in ("cid", "n", "opt", "l")} == {
        "cid": "a", "n": 3, "opt": None, "l": [1.5]}  # fmt: skip
    assert isinstance(pack(state), ArrayRecord)


def test_node_config_is_checked():
    s = node_settings({"client": "site1", "dataset.root": "/data", "state-dir": "/tmp/s"})
    assert (s.client, s.overrides, str(s.state_dir)) == (
        "site1",
        {"dataset.root": "/data"},
        "/tmp/s",
    )
    with pytest.raises(ConfigError, match="unknown key"):
        node_settings({"clinet": "site1"})


# ---------------------------------------------------------------------------- in-process
# Flower in-process equals the native run (the same metric rows, results, ledger and server
# state; client state persists in the nodes' contexts), uninterrupted and stopped and resumed
# from the nodes' snapshots: tests/runtime/test_same_run.py (its Flower cases)


def test_server_view_gives_the_personal_model(tmp_path):
    """personal_weights(server_view(server, cid), state) == personal_weights(server, state)
    for every algorithm with a personal model (what Flower's evaluation relies on)."""
    for algo in ("fedbn", "distrans", "pfedhn", "pfedme", "pfedavg", "partialfed", "fraug"):
        sim = Simulation(toy_cfg(f"algorithm.name={algo}", rounds=1), tmp_path / algo,
                         progress=False)  # fmt: skip
        sim.run_round(1)
        for cid, state in sim.states.items():
            full = sim.algo.personal_weights(sim.server, state)
            view = sim.algo.personal_weights(sim.algo.server_view(sim.server, cid), state)
            assert list(full) == list(view), algo
            assert all(torch.equal(full[k], view[k]) for k in full), algo


class KillingGrid(InProcessGrid):
    """Kills a node when the first ``train`` message of round ``at`` is pushed."""

    def __init__(self, *args, victim: int, at: int, **kw) -> None:
        super().__init__(*args, **kw)
        self.victim, self.at = victim, at

    def push_messages(self, messages):
        messages = list(messages)
        for m in messages:
            if m.metadata.message_type == "train" and m.metadata.group_id == str(self.at):
                self.kill(self.victim)
        return super().push_messages(messages)


def test_lost_node_round_completes_when_the_minimum_allows(tmp_path):
    cfg = toy_cfg("algorithm.name=fedavg", rounds=3)
    grid = KillingGrid(build_client_app(), 3, victim=1002, at=2)
    opts = FlowerOptions(nodes=3, min_clients=2, mode="test")
    result = FlowerServer(cfg, tmp_path / "r", opts, progress=False).run(grid)
    assert result.summary["runtime"]["lost"] == {"client2": 2}
    last = [r for r in rows(result.run_dir) if r["round"] == 3]
    assert [r.get("lost", False) for r in last] == [False, False, True]
    # round 2 aggregated the two replies: two uploads, three downloads (one to the dead node)
    by_round = ledger(result.run_dir)["by_round"]
    assert by_round["2"]["up"] * 3 == by_round["1"]["up"] * 2


def test_lost_node_stops_the_run_with_a_clear_error(tmp_path):
    cfg = toy_cfg("algorithm.name=fedavg", rounds=3)
    grid = KillingGrid(build_client_app(), 3, victim=1001, at=2)
    server = FlowerServer(cfg, tmp_path / "r", FlowerOptions(nodes=3), progress=False)
    with pytest.raises(FedshiftError, match=r"round 2: aggregation needs 3 .* lost .*client1"):
        server.run(grid)


def test_nodes_loading_only_their_own_domain(tmp_path):
    """Each node loads only its own domain (dataset.domains=[own]) as a site would: the run
    works, clients are ordered by name, and every node sees one client."""
    cfg = toy_cfg("dataset.name=digits", "dataset.train_size=40", "dataset.val_size=20",
                  "dataset.test_size=20", f"dataset.cache_dir={tmp_path / 'cache'}",
                  "model.name=cnn", "algorithm.name=fedbn", rounds=1)  # fmt: skip
    names = ["mnist", "optdigits"]  # built from packages, no download
    confs = [{"client": n, "dataset.domains": [n]} for n in reversed(names)]
    grid = InProcessGrid(build_client_app(), 2, node_configs=confs)
    result = FlowerServer(cfg, tmp_path / "r", FlowerOptions(nodes=2), progress=False).run(grid)
    assert result.summary["clients"] == sorted(names)


def test_fedshift_version_mismatch_is_refused(tmp_path, monkeypatch):
    import types

    import fedshift.flower.transport as server_mod

    monkeypatch.setattr(server_mod, "fedshift", types.SimpleNamespace(__version__="9.9.9"))
    grid = InProcessGrid(build_client_app(), 3)
    with pytest.raises(FedshiftError, match="runs fedshift .* but the ServerApp runs 9.9.9"):
        FlowerServer(toy_cfg(rounds=1), tmp_path / "v", FlowerOptions(nodes=3)).run(grid)


def test_client_errors_and_bad_nodes_are_reported(tmp_path):
    cfg = toy_cfg("algorithm.name=fedavg", rounds=1)
    grid = InProcessGrid(build_client_app(), 2, node_configs=[{"client": "client0"},
                                                               {"client": "nobody"}])  # fmt: skip
    with pytest.raises(FedshiftError, match="client='nobody'.*has clients"):
        FlowerServer(cfg, tmp_path / "a", FlowerOptions(nodes=2)).run(grid)
    twins = InProcessGrid(build_client_app(), 2, node_configs=[{"client": "client0"}] * 2)
    with pytest.raises(FedshiftError, match="several SuperNodes claim"):
        FlowerServer(cfg, tmp_path / "b", FlowerOptions(nodes=2)).run(twins)
    with pytest.raises(FedshiftError, match="only 2 of 4 SuperNodes"):
        FlowerServer(cfg, tmp_path / "c", FlowerOptions(nodes=4, node_wait=0.5)).run(twins)
    with pytest.raises(ConfigError, match="exchanges nothing"):
        FlowerServer(toy_cfg("algorithm.name=local"), tmp_path / "d")
    nan = toy_cfg("algorithm.name=fedavg", "train.lr=1.0e+30", rounds=1)
    with pytest.raises(FedshiftError, match="non-finite update"):
        FlowerServer(nan, tmp_path / "e", FlowerOptions(nodes=3), progress=False).run(
            InProcessGrid(build_client_app(), 3)
        )


def test_node_state_can_live_on_disk(tmp_path):
    """With state-dir the client state survives a SuperNode restart (a fresh context)."""
    cfg = toy_cfg("algorithm.name=fedbn", rounds=2)
    confs = [{"partition-id": i, "state-dir": str(tmp_path / "state")} for i in range(3)]

    class Restarting(InProcessGrid):
        def push_messages(self, messages):
            messages = list(messages)
            if any(m.metadata.group_id == "2" for m in messages):
                for ctx in self.contexts.values():  # every node restarted: contexts are new
                    ctx.state = type(ctx.state)()
            return super().push_messages(messages)

    native = run_experiment(cfg, run_dir=tmp_path / "native", progress=False)
    flower = FlowerServer(cfg, tmp_path / "f", FlowerOptions(nodes=3), progress=False).run(
        Restarting(build_client_app(), 3, node_configs=confs)
    )
    assert_runs_equal(flower.run_dir, native.run_dir)
    assert len(list((tmp_path / "state").glob("*/client*/r*.pt"))) >= 3


# ---------------------------------------------------------------------------- submit
def test_insecure_submit_warns(monkeypatch, capsys, tmp_path):
    """`fedshift flower submit --insecure` printed no warning."""
    from fedshift.flower import deploy

    calls = []

    def fake_submit(app, home, stream=True, timeout=None, log=None):
        calls.append((home / "config.toml").read_text())
        return "7", "submitted", ""

    monkeypatch.setattr(deploy, "submit_app", fake_submit)
    toy = ["dataset.name=toyshift", "model.name=lenet5", "train.rounds=1"]
    base = ["flower", "submit", *toy, "--superlink", "10.0.0.5:9093", "--nodes", "3"]
    assert main([*base, "--insecure", "--no-stream"]) == 0
    err = capsys.readouterr().err
    assert "fedshift: warning: --insecure" in err and "10.0.0.5:9093" in err
    assert "unencrypted" in err and "not authenticated" in err and "trusted local network" in err
    assert "insecure = true" in calls[0]
    ca = tmp_path / "ca.crt"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    assert main([*base, "--root-cert", str(ca), "--no-stream"]) == 0
    assert "warning" not in capsys.readouterr().err
