"""Example-level DP-SGD (``privacy.updates=example``, issue 53 item 2): the noise multiplier
against Opacus's accountant, one example's clipped contribution against a hand computation,
refusals, determinism and resume, and a tiny protected run with statistics."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch
from conftest import toy_cfg
from support.same_run import assert_runs_equal

from fedshift.core.config import TrainConfig
from fedshift.core.context import ClientContext, InputPipeline, round_steps
from fedshift.core.errors import ConfigError, FedshiftError
from fedshift.core.federation import ClientData, Split
from fedshift.core.tasks import Classification

pytestmark = [
    pytest.mark.usefixtures("one_thread"),
    pytest.mark.skipif(importlib.util.find_spec("opacus") is None, reason="needs Opacus"),
]

EX = ("model.norm=none", "privacy.updates=example")


def _summary(run_dir) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


# ----------------------------------------------------------------------------- the budget
def test_the_noise_multiplier_is_opacus_for_the_budget_rate_and_steps():
    from opacus.accountants.utils import get_noise_multiplier

    from fedshift.core.dpsgd import DPSGD_ALPHAS, DPSGD_TOLERANCE
    from fedshift.runtime.privacy import plan_privacy

    cfg = toy_cfg(*EX, "privacy.epsilon=3", "privacy.update_clip=0.5", rounds=2)
    plan = plan_privacy(cfg, [], (3, 28, 28), {"a": 60, "b": 45})
    assert plan is not None and plan.example is not None and plan.updates is None
    for site, n in (("a", 60), ("b", 45)):
        s = plan.example.site(site)
        q, steps = 16 / n, round_steps(n, cfg.train)
        assert (s.examples, s.sample_rate, s.steps) == (n, q, steps)
        want = get_noise_multiplier(
            target_epsilon=3, target_delta=1e-5, sample_rate=q, steps=steps * 2,
            accountant="rdp", epsilon_tolerance=DPSGD_TOLERANCE * 3, alphas=list(DPSGD_ALPHAS),
        )  # fmt: skip
        assert s.noise_multiplier == want
        m = plan.example.mechanism(site, seed=0)
        assert (m.clip, m.noise_multiplier, m.expected_batch) == (0.5, want, pytest.approx(16))
    spent = plan.summary(2)
    assert 3 * (1 - DPSGD_TOLERANCE) <= spent["epsilon_spent"] <= 3
    assert spent["records"]["weights"]["sites"]["b"]["releases"] == 2 * round_steps(45, cfg.train)
    with pytest.raises(ConfigError, match=r"'weights' would be released again"):
        plan.check_rounds(3)


def test_statistics_and_dpsgd_compose_in_one_history_within_the_budget(tmp_path):
    """FedRDN's statistics at privacy.stats_share of epsilon, DP-SGD's steps calibrated to
    the rest: one Opacus history per site spends the budget; a tiny end-to-end run."""
    from fedshift.core.dpsgd import DPSGD_ALPHAS, DPSGD_TOLERANCE
    from fedshift.core.privacy import epsilon_composed, noise_multiplier
    from fedshift.runtime.simulation import run_experiment

    cfg = toy_cfg(*EX, "augment=[fedrdn]", "privacy.epsilon=4", "privacy.stats_share=0.25",
                  rounds=2)  # fmt: skip
    run_experiment(cfg, run_dir=tmp_path / "r", progress=False)
    p = _summary(tmp_path / "r")["privacy"]
    assert set(p["records"]) == {"fedrdn_stats", "weights"} and p["stats_share"] == 0.25
    assert p["noise_multiplier"] == noise_multiplier(1.0, 1e-5, 1)  # a quarter of 4, once
    w = p["records"]["weights"]
    assert w["unit"] == "example" and w["clip"] == 1.0
    for site in w["sites"].values():
        dpsgd = (site["noise_multiplier"], site["sample_rate"], site["releases"])
        both = epsilon_composed([(p["noise_multiplier"], 1.0, 1), dpsgd], 1e-5, DPSGD_ALPHAS)
        assert site["epsilon_spent_with_statistics"] == pytest.approx(both)
        assert 4 * (1 - DPSGD_TOLERANCE) <= both <= 4
        assert site["epsilon_spent"] < both  # DP-SGD alone spends less than both
    assert p["epsilon_spent"] == max(s["epsilon_spent_with_statistics"]
                                     for s in w["sites"].values())  # fmt: skip
    assert p["releases"] == 1 + w["releases"]


# ----------------------------------------------------------------------------- one step
class _Plain:
    """The two hooks of an algorithm the DP-SGD step reads, for a hand-made context."""

    def __init__(self, train: TrainConfig) -> None:
        self.train = train

    def make_optimizer(self, ctx, state):
        return torch.optim.SGD(ctx.model.parameters(), lr=self.train.lr)

    def penalty(self, ctx):
        return None


def _step_once(x, y, clip: float, z: float = 0.0, seed: int = 0):
    """One DP-SGD step at sampling rate 1 (every example drawn) on a linear model; returns
    the model before and after and the context."""
    from fedshift.algorithms.dp_sgd import dp_sgd_steps
    from fedshift.core.dpsgd import ExampleMechanism

    torch.manual_seed(3)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 3))
    before = [p.detach().clone() for p in model.parameters()]
    n = x.shape[0]
    train = TrainConfig(batch_size=n, local_steps=1, lr=1.0)
    ctx = ClientContext(
        cid="a", round=1, data=ClientData("a", Split(x, y), Split(x, y), Split(x, y)),
        model=model, train=train, pipeline=InputPipeline([], lambda t: t),  # type: ignore[arg-type]
        generator=torch.Generator().manual_seed(seed), device=torch.device("cpu"),
        task=Classification(),
        dpsgd=ExampleMechanism(clip=clip, noise_multiplier=z, sample_rate=1.0, steps=1,
                               examples=n, seed=seed),
    )  # fmt: skip
    steps, _ = dp_sgd_steps(_Plain(train), ctx, {})  # type: ignore[arg-type]
    assert steps == 1
    return model, before


def _hand_gradient(model, before, x, y) -> torch.Tensor:
    """One example's gradient of its cross-entropy at the weights ``before`` (autograd on
    a copy, one example at a time): flattened over weight and bias."""
    w, b = (t.clone().requires_grad_(True) for t in before)
    loss = torch.nn.functional.cross_entropy(x.flatten(1) @ w.T + b, y)
    gw, gb = torch.autograd.grad(loss, [w, b])
    return torch.cat([gw.flatten(), gb.flatten()])


def test_one_examples_gradient_contribution_is_clipped_to_the_bound():
    """A single example (sampling rate 1, no noise, lr 1): the weights move by exactly its
    gradient scaled to the clip bound, computed here by hand."""
    x = torch.full((1, 1, 2, 2), 3.0)
    y = torch.tensor([2])
    model, before = _step_once(x, y, clip=0.05)
    g = _hand_gradient(model, before, x, y)
    assert float(g.norm()) > 0.05 * 10  # well above the bound: clipping acts
    moved = torch.cat([(b - p.detach()).flatten() for p, b in zip(model.parameters(), before,
                                                                  strict=True)])  # fmt: skip
    want = g * (0.05 / (float(g.norm()) + 1e-6))  # Opacus's clip factor C / (|g| + 1e-6)
    assert torch.allclose(moved, want, atol=1e-7)
    assert float(moved.norm()) == pytest.approx(0.05, rel=1e-4)


def test_a_batch_moves_by_the_mean_of_its_clipped_gradients():
    """Three examples, one under the bound and two above: the step is the sum of each
    example's own clipped gradient over the expected batch (q n = 3)."""
    g = torch.Generator().manual_seed(0)
    x = torch.rand(3, 1, 2, 2, generator=g) * torch.tensor([0.01, 4.0, 8.0]).view(3, 1, 1, 1)
    y = torch.tensor([0, 1, 0])
    clip = 1.5  # above a near-zero image's (bias-only) gradient, |softmax - onehot| <= 2 ** 0.5
    model, before = _step_once(x, y, clip=clip)
    grads = [_hand_gradient(model, before, x[i : i + 1], y[i : i + 1]) for i in range(3)]
    norms = [float(v.norm()) for v in grads]
    assert norms[0] < clip < min(norms[1:])  # one example within the bound, two beyond
    want = sum(v * min(1.0, clip / (nv + 1e-6)) for v, nv in zip(grads, norms, strict=True)) / 3
    moved = torch.cat([(b - p.detach()).flatten() for p, b in zip(model.parameters(), before,
                                                                  strict=True)])  # fmt: skip
    assert torch.allclose(moved, want, atol=1e-6)


def test_the_noise_is_z_times_the_clip_and_drawn_again_from_the_seed():
    """Examples whose clipped gradients are tiny against the noise: the move over the
    stated std z C / (q n) is N(0, 1) (its mean square over the 15 values within chi-square's
    wide band: 0.2 to 1.8), and the same seed draws the same noise."""
    x = torch.zeros(2, 1, 2, 2)
    y = torch.tensor([0, 1])
    z, clip = 1000.0, 0.5
    model, before = _step_once(x, y, clip=clip, z=z)
    again, _ = _step_once(x, y, clip=clip, z=z)
    moved = torch.cat([(b - p.detach()).flatten() for p, b in zip(model.parameters(), before,
                                                                  strict=True)])  # fmt: skip
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), again.parameters(),
                                                 strict=True))  # fmt: skip
    std = z * clip / 2
    assert float((moved / std).pow(2).mean()) == pytest.approx(1.0, abs=0.8)
    other, _ = _step_once(x, y, clip=clip, z=z, seed=1)
    assert not torch.equal(next(other.parameters()), next(model.parameters()))


# ----------------------------------------------------------------------------- refusals
def _build(cfg):
    from fedshift.data import load_dataset
    from fedshift.runtime.experiment import build_experiment

    return build_experiment(cfg, load_dataset(cfg.dataset, cfg.partition))


def test_a_batchnorm_model_is_refused_naming_the_key_and_the_fix(tmp_path):
    from fedshift.runtime.simulation import run_experiment

    cfg = toy_cfg("privacy.updates=example", "privacy.epsilon=2", rounds=1)  # lenet5: BN
    with pytest.raises(ConfigError) as e:
        run_experiment(cfg, run_dir=tmp_path / "r", progress=False)
    msg = str(e.value)
    assert "'privacy.updates'" in msg and "model.norm=none" in msg and "BatchNorm" in msg
    assert "\n" not in msg
    assert not (tmp_path / "r" / "checkpoint.pt").exists()


@pytest.mark.parametrize(
    ("overrides", "key", "why"),
    [
        (["algorithm.name=scaffold"], "privacy.updates", "before_step"),
        (["algorithm.name=moon"], "privacy.updates", "'loss'"),
        (["algorithm.name=fedsam"], "privacy.updates", "sharpness-aware"),
        (["algorithm.name=pfedme"], "privacy.updates", "local update"),
        (["augment=[mixup]"], "privacy.updates", "mixup"),
        (["augment=[{name: norm, stats: client}]"], "privacy.updates", "own statistics"),
        (["run.executor=vmap"], "run.executor", "vmap"),
        (["federation.secure_aggregation=true"], "privacy.updates", "secure_aggregation"),
    ],
)
def test_what_dpsgd_cannot_wrap_is_refused_in_one_line(overrides, key, why):
    cfg = toy_cfg(*EX, "privacy.epsilon=2", *overrides, rounds=1)
    with pytest.raises(ConfigError) as e:
        _build(cfg)
    msg = str(e.value)
    assert f"'{key}'" in msg and why in msg and "\n" not in msg, msg


@pytest.mark.parametrize("name", ["fedavg", "fedprox", "fedrdn", "fedadam"])
def test_methods_on_the_default_local_step_are_planned(name):
    exp = _build(toy_cfg(*EX, f"algorithm.name={name}", "privacy.epsilon=2", rounds=1))
    assert exp.privacy is not None and exp.privacy.example is not None


def test_a_stat_budget_leaving_nothing_for_dpsgd_is_refused():
    from fedshift.core.dpsgd import dpsgd_noise_multiplier
    from fedshift.core.privacy import epsilon_spent

    assert epsilon_spent(0.5, 3, 1e-5) > 1  # the statistics' releases alone exceed it
    with pytest.raises(ConfigError, match=r"'privacy.epsilon'.*statistics' releases alone"):
        dpsgd_noise_multiplier(1.0, 1e-5, 0.25, 8, ((0.5, 1.0, 3),))


def test_training_outside_dpsgd_stops_the_round():
    from fedshift.core.dpsgd import ExampleMechanism
    from fedshift.runtime.dpsgd import check_steps

    x, y = torch.zeros(2, 1, 2, 2), torch.tensor([0, 1])
    ctx = ClientContext(
        cid="a", round=3, data=ClientData("a", Split(x, y), Split(x, y), Split(x, y)),
        model=None, train=TrainConfig(batch_size=2, local_steps=2),  # type: ignore[arg-type]
        pipeline=InputPipeline([], lambda t: t), generator=torch.Generator(),  # type: ignore[arg-type]
        device=torch.device("cpu"), dpsgd=ExampleMechanism(1.0, 1.0, 1.0, 2, 2, 0),
    )  # fmt: skip
    with pytest.raises(FedshiftError, match=r"round 3: client 'a' trained outside DP-SGD"):
        check_steps(ctx)


# ----------------------------------------------------------------------------- runs
def test_same_seed_same_numbers_and_a_resumed_run_spends_the_same(tmp_path):
    from fedshift.runtime.simulation import resume_experiment, run_experiment
    from fedshift.runtime.stopping import RunInterrupted

    cfg = toy_cfg(*EX, "algorithm.name=fedprox", "privacy.epsilon=4", "checkpoint.every=1",
                  rounds=3)  # fmt: skip
    full = run_experiment(cfg, run_dir=tmp_path / "full", progress=False)
    run_experiment(cfg, run_dir=tmp_path / "again", progress=False)
    assert_runs_equal(tmp_path / "again", full.run_dir)
    with pytest.raises(RunInterrupted):
        run_experiment(cfg, run_dir=tmp_path / "cut", progress=False, stop_after=1)
    resume_experiment(tmp_path / "cut", progress=False)
    assert_runs_equal(tmp_path / "cut", full.run_dir)
    assert _summary(tmp_path / "cut")["privacy"] == _summary(full.run_dir)["privacy"]
    with pytest.raises(ConfigError, match=r"stops before round 4"):
        resume_experiment(tmp_path / "cut", progress=False, rounds=4)


def test_the_key_at_its_default_keeps_every_digest():
    from fedshift.core.identity import number_config

    plain = number_config(toy_cfg("privacy.epsilon=1", rounds=1).to_dict())
    off = number_config(toy_cfg("privacy.epsilon=1", "privacy.stats_share=0.5",
                                rounds=1).to_dict())  # fmt: skip
    assert off == plain and "stats_share" not in plain.get("privacy", {})
    client = number_config(toy_cfg("privacy.epsilon=1", "privacy.updates=client",
                                   rounds=1).to_dict())  # fmt: skip
    assert "stats_share" not in client["privacy"]
    on = number_config(toy_cfg(*EX, "privacy.epsilon=1", "privacy.stats_share=0.3",
                               rounds=1).to_dict())  # fmt: skip
    assert on["privacy"]["updates"] == "example" and on["privacy"]["stats_share"] == 0.3


def test_privacy_show_says_the_weights_are_protected_by_dpsgd():
    from fedshift.runtime.disclosure import disclose, render

    report = disclose(toy_cfg(*EX, "privacy.epsilon=2", "privacy.update_clip=0.5", rounds=1))
    text = render(report)
    assert "weights: yes: privacy.updates=example" in text
    # secure aggregation is refused together with privacy.updates: show must not offer it
    secagg = text.split("can secure aggregation")[1].split("does differential privacy")[0]
    assert "yes" not in secagg and "weights: not with privacy.updates=example" in secagg
    z = report["privacy"]["records"]["weights"]["sites"]["client0"]["noise_multiplier"]
    assert "example clip 0.5" in text and f"client0 noise multiplier {z:.4g}" in text


#: methods on the default local step: planned (the brief's three and a server optimiser)
PLANNED = {"fedavg", "fedprox", "fedrdn", "fedadam"}
#: methods with their own loop, loss, correction or records: refused
REFUSED = {"scaffold", "fedfa", "fedproto", "moon", "fedsam", "harmofl", "pfedme", "distrans"}


@pytest.mark.parametrize("name", __import__("fedshift.algorithms").algorithms.ALGORITHMS.names())
def test_every_algorithm_is_planned_or_refused_in_one_line(name):
    """Built (not trained) with DP-SGD on: a plan for every site, or one line naming a key."""
    from fedshift.algorithms import ALGORITHMS
    from fedshift.testing import tiny_cfg

    seg = "classification" not in ALGORITHMS.get(name).tasks
    over = ["dataset.name=toyseg", "model.name=unet", "model.width=2"] if seg else []
    try:
        exp = _build(tiny_cfg(name, *over, *EX, "privacy.epsilon=50", "train.rounds=1"))
    except ConfigError as e:
        msg = str(e)  # methods that need BatchNorm (FedBN, AdvProp) refuse the norm-free model
        assert "\n" not in msg and ("config key '" in msg or "batch-norm" in msg), msg
        assert name not in PLANNED, msg
        return
    assert name not in REFUSED
    assert exp.privacy is not None and exp.privacy.example is not None
    assert {s.site for s in exp.privacy.example.sites} == set(exp.train_clients)


def test_a_protected_run_in_worker_processes_is_the_sequential_one(tmp_path, worker_pool):
    """Each site's Poisson batches and noise come from its own streams, wherever it trains."""
    from fedshift.runtime.simulation import run_experiment

    cfg = toy_cfg(*EX, "privacy.epsilon=4", rounds=2)
    one = run_experiment(cfg, run_dir=tmp_path / "one", progress=False)
    run_experiment(cfg, run_dir=tmp_path / "two", progress=False, pool=worker_pool)
    assert_runs_equal(tmp_path / "two", one.run_dir)
