"""FedHEAL (Chen, Huang, Ye, CVPR 2024): the consistency mask over rounds of update signs,
the diversity distance, the momentum weights, the element-wise aggregation with a client
that masked an element out, the client/server wiring and an end-to-end run."""

from __future__ import annotations

import pytest
import torch
from conftest import toy_cfg
from support.replies import reply

from fedshift.algorithms import ALGORITHMS
from fedshift.algorithms.fedheal import (
    DISTANCE,
    consistency_mask,
    distance,
    masked_aggregate,
    momentum_weights,
)
from fedshift.core.config import FederationConfig, TrainConfig
from fedshift.models.digits import SmallCNN
from fedshift.runtime.simulation import Simulation

T = torch.tensor


# ----------------------------------------------------------------------------- step 2
def test_mask_over_three_rounds_by_hand():
    # round 1 (t = 0): every element kept, h = 1[u >= 0] = (1, 0, 1, 0)
    mask, h = consistency_mask({"w": T([1.0, -1.0, 2.0, -3.0])}, {}, 0, 0.3)
    assert mask["w"].tolist() == [True] * 4 and h["w"].tolist() == [1.0, 0.0, 1.0, 0.0]
    # round 2 (t = 1): u = (1, 1, -1, -1): c = (h, h, 1-h, 1-h) = (1, 0, 0, 1) > 0.3;
    # h = (h + (1, 1, 0, 0)) / 2 = (1, 0.5, 0.5, 0)
    mask, h = consistency_mask({"w": T([1.0, 1.0, -1.0, -1.0])}, h, 1, 0.3)
    assert mask["w"].tolist() == [True, False, False, True]
    assert h["w"].tolist() == [1.0, 0.5, 0.5, 0.0]
    # round 3 (t = 2): u = (-1, 1, 1, 0) (0 counts as >= 0): c = (1-1, 0.5, 0.5, 0);
    # h = (2h + (0, 1, 1, 1)) / 3 = (2/3, 2/3, 2/3, 1/3)
    u3 = {"w": T([-1.0, 1.0, 1.0, 0.0])}
    mask, h3 = consistency_mask(u3, h, 2, 0.3)
    assert mask["w"].tolist() == [False, True, True, False]
    assert torch.allclose(h3["w"], T([2.0, 2.0, 2.0, 1.0]) / 3, atol=1e-7)
    # the threshold is strict: c = 0.5 is not > 0.5
    assert consistency_mask(u3, h, 2, 0.5)[0]["w"].tolist() == [False] * 4


# ----------------------------------------------------------------------------- step 3
def test_distance_is_a_sum_of_per_tensor_norms():
    masked = {"a": T([3.0, 4.0]), "b": T([[1.0, 0.0], [0.0, 0.0]]), "buf": T([100.0])}
    assert distance(masked, ["a", "b"]) == pytest.approx(6.0, abs=1e-6)  # 5 + 1, not sqrt(26)


# ----------------------------------------------------------------------------- step 4
def test_momentum_weights_over_two_rounds_by_hand():
    heal = {"p": {}, "delta": {}}
    # round 1, D = (1, 3), beta 0.4: delta = 0.4 * (1/4, 3/4) = (0.1, 0.3);
    # p = 1/2 + delta = (0.6, 0.8); normalised (3/7, 4/7)
    w = momentum_weights(heal, {"a": 1.0, "b": 3.0}, ["a", "b"], 0.4)
    assert w["a"] == pytest.approx(3 / 7, abs=1e-12) and w["b"] == pytest.approx(4 / 7, abs=1e-12)
    # round 2, D = (2, 2): delta = 0.6 * (0.1, 0.3) + 0.4 * 0.5 = (0.26, 0.38);
    # p = (0.86, 1.18) (unnormalised p carried over); normalised by 2.04
    w = momentum_weights(heal, {"a": 2.0, "b": 2.0}, ["a", "b"], 0.4)
    assert heal["p"]["a"] == pytest.approx(0.86, abs=1e-12)
    assert heal["p"]["b"] == pytest.approx(1.18, abs=1e-12)
    assert w["a"] == pytest.approx(0.86 / 2.04, abs=1e-12)
    # sample-size start (federation.weighting=samples): p = (0.25, 0.75) + (0.1, 0.3)
    # = (0.35, 1.05), normalised by 1.4: (0.25, 0.75)
    heal = {"p": {}, "delta": {}}
    w = momentum_weights(heal, {"a": 1.0, "b": 3.0}, ["a", "b"], 0.4, {"a": 0.25, "b": 0.75})
    assert w["a"] == pytest.approx(0.25, abs=1e-12) and w["b"] == pytest.approx(0.75, abs=1e-12)


# ----------------------------------------------------------------------------- step 5
def test_elementwise_aggregation_with_a_masked_element():
    w = {"w": T([1.0, 1.0, 1.0])}
    a = (0.25, {"w": T([0.4, 0.8, 0.0])}, {"w": T([True, True, False])})
    b = (0.75, {"w": T([0.0, 0.4, 0.0])}, {"w": T([False, True, False])})
    out = masked_aggregate(w, [a, b])
    # element 0: only a kept it -> alpha_a = 1: 1 - 0.4; element 1: both, 1 - (0.25 * 0.8 +
    # 0.75 * 0.4) = 0.5; element 2: nobody -> weights p, updates 0: unchanged
    assert torch.allclose(out["w"], T([0.6, 0.5, 1.0]), atol=1e-6)


def _make(**params):
    entry = ALGORITHMS.entry("fedheal")
    model = SmallCNN(width=4)
    algo = entry.obj(entry.params(**params), TrainConfig(lr=0.1), FederationConfig(), model, 2)
    return algo, model


def test_server_uses_masks_weights_and_counters():
    algo, model = _make(beta=0.4)
    server = algo.init_server(model)
    w = server["weights"]
    k = "stages.conv1.conv.weight"
    counter = algo.count_keys[0]
    assert k in algo.masked_keys and counter.endswith("num_batches_tracked")
    upd_a = {key: torch.zeros_like(w[key]) for key in algo.masked_keys}
    upd_b = {key: torch.zeros_like(w[key]) for key in algo.masked_keys}
    mask_a = {key: torch.ones_like(w[key], dtype=torch.bool) for key in algo.masked_keys}
    mask_b = {key: torch.ones_like(w[key], dtype=torch.bool) for key in algo.masked_keys}
    upd_a[k] = torch.full_like(w[k], 0.4)
    upd_b[k] = torch.full_like(w[k], 0.8)
    mask_b[k] = torch.zeros_like(w[k], dtype=torch.bool)  # b masked this tensor out
    before = w[k].clone()
    algo.aggregate(server, 1, [
        reply("a", 10, update=upd_a, mask=mask_a, counters={counter: T(4)},
              metrics={DISTANCE: 1.0}),
        reply("b", 10, update=upd_b, mask=mask_b, counters={counter: T(8)},
              metrics={DISTANCE: 3.0}),
    ])  # fmt: skip
    # only a kept the tensor: w - 0.4; weights p normalised = (3/7, 4/7) (test above)
    assert torch.allclose(server["weights"][k], before - 0.4, atol=1e-6)
    assert int(server["weights"][counter]) == round(4 * 3 / 7 + 8 * 4 / 7)  # 6.29 -> 6
    assert server["heal"]["distance"] == {"a": 1.0, "b": 3.0}


def test_end_to_end_histories_and_records(tmp_path):
    cfg = toy_cfg("algorithm.name=fedheal", rounds=3)
    sim = Simulation(cfg, tmp_path / "heal", None, False)
    res = sim.run()
    for state in sim.states.values():
        heal = state["heal"]
        assert heal["rounds"] == 3
        # after 3 rounds each history value is a count of non-negative updates over 3
        for h in heal["history"].values():
            assert torch.allclose(h * 3, (h * 3).round(), atol=1e-5)
    p = sim.server["heal"]["p"]
    assert len(p) == 3 and all(v > 0 for v in p.values())
    up = res.summary["bytes_by_record"]["up"]
    assert up["mask"] * 4 == up["update"]  # one bool per float32 element
    assert "weights" not in up
