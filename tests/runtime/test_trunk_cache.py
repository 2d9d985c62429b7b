"""The cached frozen trunk (:mod:`fedshift.runtime.trunk_cache`): with ``train.trainable=head``
every algorithm that can trains its head on each client's embeddings computed once, and ends
where recomputing them every step ends, up to float32 rounding; those that cannot say why."""

from __future__ import annotations

import pytest
import torch
from conftest import toy_cfg
from support.same_run import TINY, seg_overrides

from fedshift.algorithms import ALGORITHMS
from fedshift.runtime.simulation import Simulation, run_experiment
from fedshift.runtime.trunk_cache import trunk_cache_refusal

pytestmark = pytest.mark.usefixtures("one_thread")

ROUNDS = 2
#: algorithm -> a phrase of why its head trains on recomputed embeddings
NOT_CACHED = {
    "distrans": "tensors other than the classifier's train",  # its offset
    "elcfs": "augment",
    "fedclip": "tensors other than the classifier's train",  # its adapter
    "fedsr": "scores its inputs its own way",
    "fedfa": "augment",
    "fedrdn": "augment",
    "harmofl": "augment",
    "advprop": "adversarial",
    "fedrobust": "perturbs the images",
    "feddg_ga": "validation images",
}
#: refused with train.trainable=head altogether (tests/algorithms/test_trainable.py)
NO_HEAD = {"fedbn", "fraug", "pfedhn"}
CASES = [a for a in ALGORITHMS.names() if a not in NO_HEAD]


def _sim(algorithm: str, cache: bool, tmp_path) -> Simulation:
    over = (f"algorithm.name={algorithm}", *seg_overrides(algorithm),
            *ALGORITHMS.get(algorithm).requires)  # fmt: skip
    cfg = toy_cfg(*TINY, *over, "train.trainable=head", f"train.trunk_cache={str(cache).lower()}",
                  rounds=ROUNDS)  # fmt: skip
    sim = Simulation(cfg, tmp_path, progress=False)
    if sim.algo.needs_setup:
        sim.setup_exchange()
    for rnd in range(1, ROUNDS + 1):
        sim.run_round(rnd)
    return sim


def _head(sim: Simulation) -> dict[str, torch.Tensor]:
    algo = sim.algo.algorithm
    weights = algo.global_weights(sim.server)
    if weights is None:
        cid = next(iter(sim.exp.train_clients))
        weights = algo.personal_weights(sim.server, sim.states[cid])
    return {k: v.clone() for k, v in weights.items() if k.startswith("classifier.")}


@pytest.mark.parametrize("algorithm", CASES)
def test_the_head_trained_on_cached_embeddings_is_the_recomputed_one(tmp_path, algorithm):
    cached = _sim(algorithm, True, tmp_path / "cached")
    why = trunk_cache_refusal(cached.exp)
    if algorithm in NOT_CACHED:
        assert cached.exp.trunk_cache is None and NOT_CACHED[algorithm] in why
        return
    assert why is None and cached.exp.trunk_cache is not None
    assert set(cached.exp.trunk_cache.features) == set(cached.exp.train_clients)
    recomputed = _sim(algorithm, False, tmp_path / "recomputed")
    assert recomputed.exp.trunk_cache is None
    got, want = _head(cached), _head(recomputed)
    assert got.keys() == want.keys() and got
    for k in want:
        # the embeddings differ at most by the rounding of batched float32 convolutions;
        # two rounds of a few SGD steps carry that to the head at a few ulps (64 allowed)
        tol = 64 * torch.finfo(torch.float32).eps * max(1.0, float(want[k].abs().max()))
        gap = float((got[k] - want[k]).abs().max())
        assert gap <= tol, (k, gap, tol)


def test_the_trunk_runs_once_per_client(tmp_path):
    sim = _sim("fedavg", True, tmp_path)
    cache = sim.exp.trunk_cache
    first = {cid: z for cid, z in cache.features.items()}
    calls = []
    handle = sim.model.stages.register_forward_hook(lambda *a: calls.append(1))
    sim.run_round(ROUNDS + 1)
    handle.remove()
    assert calls == []  # no trunk forward pass while training
    assert all(cache.features[cid] is z for cid, z in first.items())
    assert "features" not in vars(sim.model)  # the working model's own features are back


def test_the_summary_says_whether_the_trunk_was_cached(tmp_path):
    def trainable(*over: str) -> dict:
        cfg = toy_cfg(*TINY, "train.trainable=head", *over, rounds=1)
        return run_experiment(cfg, run_dir=tmp_path / str(len(over)), progress=False).summary[
            "trainable"
        ]

    assert trainable()["trunk_cache"] == {"cached": True}
    off = trainable("train.trunk_cache=false")["trunk_cache"]
    assert off == {"cached": False, "why": "train.trunk_cache=false"}


def test_a_model_with_its_own_features_and_head_is_cached():
    """forward = head(features(x)) is all the cache needs: EfficientNet-Lite0 normalises its
    input inside ``features`` and applies dropout inside ``head`` (which stays live)."""
    from types import SimpleNamespace

    from fedshift.algorithms.trainable import Frozen
    from fedshift.core.config import TrainConfig
    from fedshift.models.efficientnet import EfficientNetLite0

    model = EfficientNetLite0(num_classes=3)
    algo = SimpleNamespace(frozen=Frozen(model, "head"), trunk_cache_refusal=None, name="fedavg")
    exp = SimpleNamespace(train=TrainConfig(trainable="head"), model=model, augments=[],
                          algo=SimpleNamespace(algorithm=algo))  # fmt: skip
    assert trunk_cache_refusal(exp) is None
