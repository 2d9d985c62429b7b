"""Secure aggregation on Flower (``federation.secure_aggregation``,
:mod:`fedshift.flower.secagg`): fedshift's records summed by Flower's own SecAgg+ (its
``secaggplus_mod`` on the ClientApp, its ``SecAggPlusWorkflow`` stages in the ServerApp),
in-process, against the plain and the native masked runs."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import toy_cfg
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, Key
from support.same_run import assert_runs_equal

from fedshift.core.errors import ConfigError, FedshiftError
from fedshift.core.payload import Payload
from fedshift.flower.inprocess import InProcessGrid
from fedshift.flower.node import build_client_app
from fedshift.flower.secagg import KEYS, decode, encode, mean_error, workflow_params
from fedshift.flower.server import FlowerOptions, FlowerServer
from fedshift.flower.simulate import simulate
from fedshift.runtime.disclosure import check_ledger, sites_of
from fedshift.runtime.loop import LoopOptions
from fedshift.runtime.native import InProcessTransport
from fedshift.runtime.secagg import META, FixedPoint, secure_disclosures
from fedshift.runtime.simulation import Simulation
from fedshift.runtime.stopping import RunInterrupted

pytestmark = pytest.mark.usefixtures("one_thread")  # bit-for-bit comparisons

SECURE = "federation.secure_aggregation=true"
FP = FixedPoint()  # the defaults: 2**-16 steps, modulus 2**62


#: three sites of 95, 54 and 31 training examples: the weighted mean is not the plain one
UNEQUAL = ("partition.name=dirichlet", "partition.clients=3")


def _runs(tmp_path, algorithm: str, *over: str):
    """One round of ``algorithm``: plain (native), masked (native), and on Flower in-process
    with its SecAgg+; the three servers' states and the Flower run's loop."""
    plain = Simulation(toy_cfg(f"algorithm.name={algorithm}", *over, rounds=1),
                       tmp_path / "plain", progress=False)  # fmt: skip
    plain.run()
    cfg = toy_cfg(f"algorithm.name={algorithm}", SECURE, *over, rounds=1)
    native = Simulation(cfg, tmp_path / "native", progress=False)
    native.run()
    server = FlowerServer(cfg, tmp_path / "flower", FlowerOptions(nodes=3, mode="test"),
                          progress=False)  # fmt: skip
    server.run(InProcessGrid(build_client_app(), 3))
    assert server.loop is not None
    for run in (native, server.loop):  # the ledger counted the declared records only
        declared = secure_disclosures(cfg, run.algo.disclosures(run.model))
        problems, _ = check_ledger(declared, run.ledger.rows, sites_of(native.exp), 1)
        assert not problems, problems
    return plain, native, server.loop


def test_fedavg_on_flower_secagg_equals_the_native_masked_run(tmp_path):
    plain, native, flower = _runs(tmp_path, "fedavg", *UNEQUAL)
    n = len(native.train_clients)
    sizes = [len(d.train) for d in native.train_clients.values()]
    assert len(set(sizes)) == 3  # weights w / W of 1 and less
    weighted_mean = float(np.mean(sizes)) / max(sizes)  # the mean of w / W
    worst = 0.0
    for k, p in plain.server["weights"].items():
        if not p.is_floating_point():
            assert torch.equal(flower.server["weights"][k], p)  # BN counters: rounded means
            continue
        f, m, p = (s["weights"][k].double() for s in (flower.server, native.server, plain.server))
        bound = mean_error(FP, weighted_mean, 0.0) * (1 + p.abs())  # per element
        assert bool(((f - p).abs() <= bound).all()), k
        # the native masked run: within both stated quantisations
        assert bool(((f - m).abs() <= bound + FP.mean_error(n)).all()), k
        worst = max(worst, float((f - p).abs().max()))
    assert worst > 0  # the sum did go through the quantisation
    # the server received masked integers: the same bytes as the native masked run's, and
    # the key exchange; each client's training metrics still reach it
    up, native_up = flower.ledger.by_record()["up"], native.ledger.by_record()["up"]
    assert up["weights"] == native_up["weights"] and up[META] == native_up[META] == n * 24
    assert up[KEYS] > 0
    assert [r["train_loss"] for r in flower.records if "train_loss" in r] == [
        r["train_loss"] for r in native.records if "train_loss" in r]  # fmt: skip
    info = flower.transport.info()
    assert info["secure_aggregation"]["protocol"] == "flower SecAgg+"
    assert info["secure_aggregation"]["key_bytes_down"] > 0


def test_harmofl_amplitude_on_flower_secagg_is_the_plain_mean_within_one_step(tmp_path):
    """HarmoFL's amplitude (its server takes the plain mean over sites) and its weights
    (the weighted mean) go through one SecAgg+ vector."""
    plain, native, flower = _runs(tmp_path, "harmofl")
    key = next(k for k in plain.server if k.startswith("aug/"))
    a, m, f = (s[key]["amplitude"].double() for s in (plain.server, native.server, flower.server))
    err = float((f - a).abs().max())
    assert 0 < err <= mean_error(FP)  # a plain mean: within 2**-16
    assert float((f - m).abs().max()) <= mean_error(FP) + FP.mean_error(len(native.train_clients))


def test_flowers_quantisation_matches_the_native_step():
    params = workflow_params(FixedPoint(frac_bits=16, modulus_bits=62))
    step = 2 * params["clipping_range"] / params["quantization_range"]
    assert step == 2.0**-16 and params["modulus_range"] == 2**62
    with pytest.raises(ConfigError, match="secagg_frac_bits' = 30: on Flower at most 29"):
        workflow_params(FixedPoint(frac_bits=30))
    with pytest.raises(ConfigError, match="secagg_frac_bits"):  # before any node starts
        FlowerServer(toy_cfg(SECURE, "federation.secagg_frac_bits=35"), "unused")


def test_a_value_flower_would_clip_is_refused_not_clipped():
    fp = FixedPoint(frac_bits=29)  # clipping range 1
    up = Payload({"weights": {"a": torch.tensor([0.5, -2.0])}}, num_examples=10)
    with pytest.raises(FedshiftError, match=r"would clip tensor weights/a.*-2.*lower"):
        encode(fp, 1, "c0", up, 10.0, frozenset(), 10.0, 10.0)


def test_the_vector_is_weighted_inside_and_decoded_to_the_weighted_mean():
    """Two clients' vectors, their mean as SecAgg+ returns it (here exact), decoded: the
    weighted mean of a weighted record, the plain mean of a uniform one, the example sum."""
    ups = [Payload({"weights": {"w": torch.tensor([1.0, 3.0])}, "amp": {"a": torch.tensor([2.0])}},
                   num_examples=n) for n in (10, 30)]  # fmt: skip
    vectors = []
    for up in ups:
        v, layout = encode(FP, 1, "c", up, float(up.num_examples), frozenset({"amp"}), 30.0, 30.0)
        vectors.append(v)
    import json

    scales = {"weight_scale": 30.0, "examples_scale": 30.0}
    got = decode(np.mean(vectors, axis=0), json.loads(layout), 2, scales, frozenset({"amp"}))
    assert torch.allclose(got.records["weights"]["w"], torch.tensor([1.0, 3.0]))
    assert torch.allclose(got.records["amp"]["a"], torch.tensor([2.0]))
    assert got.num_examples == 40


def test_a_record_secure_aggregation_cannot_hide_is_refused_on_flower(tmp_path):
    cfg = toy_cfg("algorithm.name=fedrdn", SECURE, rounds=1)
    grid = InProcessGrid(build_client_app(), 3)
    server = FlowerServer(cfg, tmp_path / "r", FlowerOptions(nodes=3), progress=False)
    with pytest.raises(ConfigError, match="'fedrdn_stats'.*other clients receive it as sent"):
        server.run(grid)
    assert not any(kind.startswith("train") for _, kind in grid.delivered)  # before any round


class _Killing(InProcessGrid):
    """Kills node 1002 (client2) when SecAgg+'s ``stage`` message of round 1 is pushed."""

    def __init__(self, stage: str) -> None:
        super().__init__(build_client_app(), 3)
        self.stage = stage

    def push_messages(self, messages):
        messages = list(messages)
        for m in messages:
            rec = m.content.config_records.get(RECORD_KEY_CONFIGS)
            if m.metadata.group_id == "1" and rec is not None and rec.get(Key.STAGE) == self.stage:
                self.kill(1002)
        return super().push_messages(messages)


@pytest.mark.parametrize("stage", ["setup", "collect_masked_vectors"])
def test_a_client_lost_in_the_protocol_leaves_the_survivors_mean(tmp_path, stage):
    """SecAgg+ recovers a client lost before it masked (setup) or after (its pairwise
    masks removed with the others' shares of its key): the sum is the survivors'."""

    class Losing(InProcessTransport):  # the plain reference: client2's reply never comes
        def train(self, rnd, cids, down):
            replies, _ = super().train(rnd, cids, down)
            del replies["client2"]
            return replies, ["client2"]

    opts = LoopOptions(min_clients=2)
    plain = Simulation(toy_cfg(rounds=1), tmp_path / "p", progress=False, options=opts,
                       transport=Losing())  # fmt: skip
    plain.run()
    cfg = toy_cfg(SECURE, rounds=1)
    server = FlowerServer(cfg, tmp_path / "f", FlowerOptions(nodes=3, min_clients=2),
                          progress=False)  # fmt: skip
    result = server.run(_Killing(stage))
    assert result.summary["runtime"]["lost"] == {"client2": 1}
    assert server.loop is not None
    sizes = [len(plain.train_clients[c].train) for c in ("client0", "client1")]
    bound = mean_error(FP, float(np.mean(sizes)) / max(sizes))
    for k, p in plain.server["weights"].items():
        if p.is_floating_point():
            f = server.loop.server["weights"][k].double()
            assert bool(((f - p.double()).abs() <= bound * (1 + p.double().abs())).all()), k


def test_a_resumed_secure_flower_run_is_the_uninterrupted_one(tmp_path):
    """Flower's stochastic quantisation is seeded per (run seed, round, client): a secure
    simulation stopped after round 1 and resumed repeats the uninterrupted one exactly."""
    cfg = toy_cfg(SECURE, "checkpoint.every=1", rounds=2)
    full = simulate(cfg, run_dir=tmp_path / "full", engine="in-process", progress=False)
    with pytest.raises(RunInterrupted):
        simulate(cfg, run_dir=tmp_path / "cut", engine="in-process", progress=False,
                 stop_after=1)  # fmt: skip
    simulate(cfg, run_dir=tmp_path / "cut", engine="in-process", progress=False, resume=True)
    assert_runs_equal(tmp_path / "cut", full.run_dir)


def test_a_client_that_fails_inside_secagg_plus_stops_the_run(tmp_path):
    """A client's error under ``secaggplus_mod`` stops the run with its reason (SecAgg+
    alone would count the client as dropped and sum the others): here a BN step counter
    beyond Flower's clipping range of 1 (frac_bits 29)."""
    cfg = toy_cfg(SECURE, "federation.secagg_frac_bits=29", rounds=1)
    server = FlowerServer(cfg, tmp_path / "r", FlowerOptions(nodes=3), progress=False)
    with pytest.raises(FedshiftError, match=r"round 1: client 'client0' .*failed in Flower's "
                       r"SecAgg\+: .*would clip tensor weights/.*num_batches_tracked"):  # fmt: skip
        server.run(InProcessGrid(build_client_app(), 3))
