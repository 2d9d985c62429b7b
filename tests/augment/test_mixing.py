"""mixup, Manifold Mixup, MixStyle and MoEx: hand-computed mixing on tiny tensors, hook
placement and composition, training-only behaviour, config checks and end-to-end runs."""

from __future__ import annotations

import json
import math
from collections import OrderedDict

import numpy as np
import pytest
import torch
from torch import nn

from fedshift.augment.mixing import (
    INPUT,
    ManifoldMixup,
    ManifoldMixupParams,
    MixStyle,
    MixStyleParams,
    Mixup,
    MixupParams,
    MoEx,
    MoExParams,
    mixstyle,
    moment_exchange,
    sample_beta,
)
from fedshift.core.errors import ConfigError
from fedshift.models.base import FedModel
from fedshift.runtime.simulation import Simulation, run_experiment


class Tiny(FedModel):
    """Two identity stages (so hidden features equal the input) and a linear head."""

    def __init__(self, features: int = 4, classes: int = 3) -> None:
        super().__init__()
        self.stages = nn.ModuleDict(OrderedDict(s1=nn.Identity(), s2=nn.Identity()))
        self.embed = nn.Identity()
        self.classifier = nn.Linear(features, classes)


def g(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ----------------------------------------------------------------------------- mixup
def test_mixup_images_and_soft_labels():
    # images equal to the one-hot of their label: the mixed image must equal the soft label
    y = torch.tensor([0, 1, 2, 3])
    x = torch.eye(4).view(4, 1, 1, 4)
    aug = Mixup(MixupParams(alpha=0.2), 0, 4)
    xm, ym = aug.train_batch(x, y, {}, g(3))
    assert ym.shape == (4, 4)
    assert torch.allclose(xm.view(4, 4), ym)
    # replay the draws: lam ~ Beta(0.2, 0.2) from a NumPy generator seeded by the torch one,
    # then the permutation, both from the batch generator
    g2 = g(3)
    seed = int(torch.randint(0, 2**62, (1,), generator=g2))
    lam = float(np.random.default_rng(seed).beta(0.2, 0.2))
    perm = torch.randperm(4, generator=g2)
    expected = lam * torch.eye(4) + (1 - lam) * torch.eye(4)[perm]
    assert torch.allclose(ym, expected)
    assert torch.allclose(ym.sum(1), torch.ones(4))
    # deterministic for a generator state, different for another
    assert torch.equal(aug.train_batch(x, y, {}, g(3))[0], xm)
    assert not torch.equal(aug.train_batch(x, y, {}, g(4))[0], xm)
    # evaluation: identity
    assert torch.equal(aug.eval_batch(x, {}), x)


def test_mixup_soft_labels_compose():
    y = torch.tensor([[0.5, 0.5, 0.0], [0.0, 0.0, 1.0]])
    aug = Mixup(MixupParams(alpha=1.0), 0, 3)
    _, ym = aug.train_batch(torch.zeros(2, 1, 1, 1), y, {}, g(0))
    assert torch.allclose(ym.sum(1), torch.ones(2))
    assert ym[:, 0].equal(ym[:, 1])  # columns 0 and 1 move together: the input was soft


def test_beta_draws_have_beta_moments():
    lam = sample_beta(0.2, 20000, g(0))
    assert abs(lam.mean() - 0.5) < 0.01
    assert abs(lam.var() - 1 / (4 * (2 * 0.2 + 1))) < 0.01  # Var Beta(a, a) = 1/(4(2a+1))
    assert (sample_beta(0.0, 5, g(0)) == 1).all()  # alpha = 0: no mixing


# ----------------------------------------------------------------------------- manifold mixup
def test_manifold_mixup_mixes_exactly_at_the_drawn_stage_and_composes():
    model = Tiny()
    seen: dict[str, torch.Tensor] = {}

    def existing(h):  # a hook already on s2 (e.g. an FFA layer): runs first
        seen["s2_in"] = h.clone()
        return 2 * h

    model.stage_hooks["s2"] = existing
    aug = ManifoldMixup(ManifoldMixupParams(stages=["s1", "s2"], include_input=True), 0, 3)
    aug.attach(model)
    assert aug.eligible == [INPUT, "s1", "s2"]
    x = (torch.eye(3, 4) + 1).view(3, 1, 1, 4)  # rows: one-hot of the label (+1), 4th = 1
    y = torch.tensor([0, 1, 2])
    stages = set()
    model.train()
    for seed in range(30):
        xm, ym = aug.train_batch(x, y, {}, g(seed))
        z = model.features(xm)
        p = aug.pending
        if p is None:  # mixed at the input: images mixed like the labels
            stages.add(INPUT)
            assert torch.allclose(xm.flatten(1)[:, :3] - 1, ym)
            assert torch.allclose(seen["s2_in"].flatten(1), xm.flatten(1))
            assert torch.allclose(z, 2 * xm.flatten(1))
            continue
        stages.add(p.stage)
        lam, perm = p.lam, p.perm
        assert torch.equal(xm, x)  # the input itself is untouched
        assert torch.allclose(ym, lam * torch.eye(3)[y] + (1 - lam) * torch.eye(3)[y[perm]])
        flat = x.flatten(1)
        if p.stage == "s1":  # s2 sees the mixed s1 output; the old hook still doubles it
            mixed = lam * flat + (1 - lam) * flat[perm]
            assert torch.allclose(seen["s2_in"].flatten(1), mixed)
            assert torch.allclose(z, 2 * mixed)
        else:  # s2: the existing hook ran first, then the mix
            assert torch.allclose(seen["s2_in"].flatten(1), flat)
            assert torch.allclose(z, lam * 2 * flat + (1 - lam) * 2 * flat[perm])
    assert stages == {INPUT, "s1", "s2"}
    # evaluation mode: no mixing even with draws pending
    aug.train_batch(x, y, {}, g(1))
    model.eval()
    assert torch.allclose(model.features(x), 2 * x.flatten(1))


def test_manifold_mixup_unknown_stage_is_a_config_error():
    with pytest.raises(ConfigError, match="unknown stage"):
        ManifoldMixup(ManifoldMixupParams(stages=["conv9"]), 0, 3).attach(Tiny())


# ----------------------------------------------------------------------------- MixStyle
def test_mixstyle_formula_by_hand():
    # image 0: [[1,2],[3,4]]: mu 2.5, unbiased var 5/3; image 1: [[0,0],[0,4]]: mu 1, var 4
    h = torch.tensor([[[[1.0, 2.0], [3.0, 4.0]]], [[[0.0, 0.0], [0.0, 4.0]]]])
    perm = torch.tensor([1, 0])
    lam = torch.tensor([0.5, 0.25])
    out = mixstyle(h, perm, lam, eps=0.0)
    s0, s1 = math.sqrt(5 / 3), 2.0
    mu_mix0, sig_mix0 = 0.5 * 2.5 + 0.5 * 1.0, 0.5 * s0 + 0.5 * s1
    mu_mix1, sig_mix1 = 0.25 * 1.0 + 0.75 * 2.5, 0.25 * s1 + 0.75 * s0
    exp0 = (h[0] - 2.5) / s0 * sig_mix0 + mu_mix0
    exp1 = (h[1] - 1.0) / s1 * sig_mix1 + mu_mix1
    assert torch.allclose(out[0], exp0) and torch.allclose(out[1], exp1)
    assert out.shape == h.shape
    # the re-styled instances carry the mixed statistics
    assert torch.allclose(out.mean((2, 3)).flatten(), torch.tensor([mu_mix0, mu_mix1]))
    assert torch.allclose(out.std((2, 3)).flatten(), torch.tensor([sig_mix0, sig_mix1]))


def test_mixstyle_statistics_are_detached():
    h = torch.tensor([[[[1.0, 2.0], [3.0, 4.0]]], [[[0.0, 0.0], [0.0, 4.0]]]], requires_grad=True)
    perm, lam = torch.tensor([1, 0]), torch.tensor([0.5, 0.25])
    mixstyle(h, perm, lam, eps=0.0, detach=True).sum().backward()
    s0, s1 = math.sqrt(5 / 3), 2.0
    expected = torch.tensor([(0.5 * s0 + 0.5 * s1) / s0, (0.25 * s1 + 0.75 * s0) / s1])
    assert torch.allclose(h.grad.mean((1, 2, 3)), expected)  # d/dh of (h - mu) * c / sig


def test_mixstyle_augment_training_only_and_p():
    model = Tiny(features=8)
    aug = MixStyle(MixStyleParams(p=1.0, stages=["s1"]), 0, 3)
    aug.attach(model)
    x = torch.randn(4, 2, 2, 2, generator=g(0))
    y = torch.arange(4) % 3
    model.train()
    xb, yb = aug.train_batch(x, y, {}, g(5))
    assert torch.equal(xb, x) and torch.equal(yb, y)  # labels unchanged
    p = aug.pending["s1"]
    out = model.features(x)
    assert out.shape == (4, 8)
    assert torch.allclose(out, mixstyle(x, p.perm, p.lam, 1e-6).flatten(1))
    assert not torch.allclose(out, x.flatten(1))
    model.eval()
    assert torch.equal(model.features(x), x.flatten(1))  # eval: identity
    # the p-draw off: identity while training
    off = MixStyle(MixStyleParams(p=0.0, stages=["s2"]), 0, 3)
    off.attach(model)
    model.train()
    off.train_batch(x, y, {}, g(5))
    assert off.pending == {}
    aug.pending = {}
    assert torch.equal(model.features(x), x.flatten(1))
    # p = 0.5 fires about half the time (one draw per stage per batch)
    half = MixStyle(MixStyleParams(p=0.5, stages=["s1"]), 0, 3)
    half.attach(Tiny())
    fired = 0
    for seed in range(400):
        half.train_batch(x, y, {}, g(seed))
        fired += "s1" in half.pending
    assert 160 < fired < 240


def test_mixstyle_default_stage_is_the_first_half():
    aug = MixStyle(MixStyleParams(), 0, 3)
    aug.attach(Tiny())
    assert aug.stages == ["s1"]


# ----------------------------------------------------------------------------- MoEx
def test_moex_pono_exchanges_moments_by_hand():
    # one position, two channels: h0 = (1, 3): mu 2, unbiased var 2; h1 = (1, 9): mu 5, var 32
    h = torch.tensor([[1.0, 3.0], [1.0, 9.0]]).view(2, 2, 1, 1)
    out = moment_exchange(h, torch.tensor([1, 0]), "pono", eps=0.0)
    # (h0 - 2) / sqrt 2 * sqrt 32 + 5 = 4 (h0 - 2) + 5;  (h1 - 5) / sqrt 32 * sqrt 2 + 2
    assert torch.allclose(out.view(2, 2), torch.tensor([[1.0, 9.0], [1.0, 3.0]]))
    # positional: each spatial position uses its own moments over the channels
    h2 = torch.stack([h, 10 * h], dim=3).view(2, 2, 1, 2)
    out2 = moment_exchange(h2, torch.tensor([1, 0]), "pono", eps=0.0)
    assert torch.allclose(out2[..., 0], out.view(2, 2, 1)) and torch.allclose(
        out2[..., 1], 10 * out.view(2, 2, 1)
    )
    # instance moments: over H x W per channel
    hi = torch.tensor([[[[0.0, 2.0]]], [[[10.0, 30.0]]]])  # mu 1, var 2 | mu 20, var 200
    outi = moment_exchange(hi, torch.tensor([1, 0]), "in", eps=0.0)
    assert torch.allclose(outi.flatten(1), torch.tensor([[10.0, 30.0], [0.0, 2.0]]), atol=1e-5)


def test_moex_augment_labels_and_probability():
    model = Tiny(features=2)
    aug = MoEx(MoExParams(lam=0.9, p=1.0), 0, 3)
    aug.attach(model)
    assert aug.stage == "s1"
    x = torch.tensor([[1.0, 3.0], [1.0, 9.0], [2.0, 0.0]]).view(3, 2, 1, 1)
    y = torch.tensor([0, 1, 2])
    model.train()
    _, ym = aug.train_batch(x, y, {}, g(0))
    perm = aug.pending.perm
    assert torch.allclose(ym, 0.9 * torch.eye(3)[y] + 0.1 * torch.eye(3)[y[perm]])
    z = model.features(x)
    assert torch.allclose(z, moment_exchange(x, perm, "pono").flatten(1))
    model.eval()
    assert torch.equal(model.features(x), x.flatten(1))
    never = MoEx(MoExParams(p=0.0), 0, 3)
    xb, yb = never.train_batch(x, y, {}, g(0))
    assert never.pending is None and torch.equal(yb, y) and torch.equal(xb, x)


def test_hooks_of_several_augments_compose_on_one_stage():
    model = Tiny(features=8)
    moex = MoEx(MoExParams(stage="s1"), 0, 3)
    ms = MixStyle(MixStyleParams(p=1.0, stages=["s1"]), 0, 3)
    moex.attach(model)
    ms.attach(model)  # installed second: runs after MoEx on the same stage
    x = torch.randn(3, 2, 2, 2, generator=g(2))
    model.train()
    moex.train_batch(x, torch.arange(3), {}, g(0))
    ms.train_batch(x, torch.arange(3), {}, g(1))
    p = ms.pending["s1"]
    first = moment_exchange(x, moex.pending.perm, "pono")
    expected = mixstyle(first, p.perm, p.lam, 1e-6)
    assert torch.allclose(model.features(x), expected.flatten(1))
    assert not torch.allclose(model.features(x), first.flatten(1))


# ----------------------------------------------------------------------------- config checks
@pytest.mark.parametrize(
    ("over", "match"),
    [
        (["algorithm.name=fedproto", "augment=[mixup]"], "integer class"),
        (["algorithm.name=fedproto", "augment=[moex]"], "integer class"),
        (["augment=[{name: moex, p: 1.5}]"], "augment.moex.p"),
        (["augment=[{name: mixstyle, p: -0.1}]"], "augment.mixstyle.p"),
        (["augment=[{name: mixup, alpha: -1}]"], "augment.mixup.alpha"),
    ],
)
def test_config_checks(make_cfg, over, match):
    with pytest.raises(ConfigError, match=match):
        make_cfg(*over)


def test_label_preserving_mixstyle_is_fine_with_fedproto(make_cfg):
    make_cfg("algorithm.name=fedproto", "augment=[mixstyle]")


def test_unknown_stage_fails_when_the_run_is_built(make_cfg, tmp_path):
    cfg = make_cfg("model.name=cnn", "augment=[{name: mixstyle, stages: [conv7]}]")
    with pytest.raises(ConfigError, match="conv7"):
        Simulation(cfg, tmp_path / "x", progress=False)


# ----------------------------------------------------------------------------- end to end
@pytest.mark.parametrize(
    ("algo", "augment"),
    [
        ("fedavg", "mixup"),
        ("fedavg", "manifold_mixup"),
        ("fedavg", "mixstyle"),
        ("fedavg", "moex"),
        ("fedsam", "[manifold_mixup, mixstyle, moex]"),
        ("local", "mixup"),
    ],
)
def test_end_to_end(make_cfg, tmp_path, algo, augment):
    aug = augment if augment.startswith("[") else f"[{augment}]"
    cfg = make_cfg(f"algorithm.name={algo}", "model.name=cnn", f"augment={aug}", rounds=2)
    s = run_experiment(cfg, run_dir=tmp_path / "a", progress=False).summary
    assert 0.0 <= s["test_mean"] <= 1.0
    rows = [json.loads(r) for r in (tmp_path / "a/metrics.jsonl").read_text().splitlines()]
    assert all(math.isfinite(r["train_loss"]) for r in rows if r["round"] == 2)
    if algo == "fedavg":  # nothing but weights travels
        assert set(s["bytes_by_record"]["up"]) == {"weights"}


def test_end_to_end_is_deterministic_and_augments_change_training(make_cfg, tmp_path):
    def run(name, *over):
        cfg = make_cfg("algorithm.name=fedavg", "model.name=cnn", *over, rounds=2)
        run_experiment(cfg, run_dir=tmp_path / name, progress=False)
        return (tmp_path / name / "metrics.jsonl").read_text()

    a = run("a", "augment=[manifold_mixup, moex]")
    assert a == run("b", "augment=[manifold_mixup, moex]")
    assert a != run("plain")
