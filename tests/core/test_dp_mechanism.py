"""Differential privacy for shared statistics (``privacy.epsilon``, issue 53 item 1): the
Gaussian mechanism of :mod:`fedshift.core.privacy` against its definition, the accountant's
calibration, and the config's bad inputs."""

from __future__ import annotations

import importlib.util
import math

import pytest
import torch
from conftest import toy_cfg

from fedshift.augment.fedrdn import channel_statistics, clipped_statistics
from fedshift.core.errors import ConfigError
from fedshift.core.identity import number_config
from fedshift.core.privacy import (
    ALPHAS,
    Mechanism,
    clip_rows,
    epsilon_spent,
    noise_multiplier,
)

#: the accountant's tests need Opacus (pip install 'fedshift[privacy]'); the mechanism's do not
needs_opacus = pytest.mark.skipif(
    importlib.util.find_spec("opacus") is None, reason="Opacus is not installed"
)

# a chi-square bound: |z| > 6 has two-sided probability 2e-9 per test; the statistics below
# are sums of many standardised draws, tested at a false-failure probability below 1e-6


@needs_opacus
@pytest.mark.parametrize(("epsilon", "delta", "releases"), [(1.0, 1e-5, 1), (0.5, 1e-6, 20),
                                                            (8.0, 1e-5, 100)])  # fmt: skip
def test_the_noise_multiplier_is_the_accountants_for_the_budget(epsilon, delta, releases):
    from opacus.accountants import RDPAccountant

    sigma = noise_multiplier(epsilon, delta, releases)
    acc = RDPAccountant()  # composed independently here, with Opacus's own class
    acc.history = [(sigma, 1.0, releases)]
    spent = acc.get_epsilon(delta=delta, alphas=list(ALPHAS))
    assert spent <= epsilon  # the budget is met ...
    assert spent >= epsilon * (1 - 2e-3)  # ... and not by more noise than it needs
    acc.history = [(sigma * 0.99, 1.0, releases)]
    assert acc.get_epsilon(delta=delta, alphas=list(ALPHAS)) > epsilon
    assert epsilon_spent(sigma, releases, delta) == pytest.approx(spent)
    # more releases at the same noise spend more
    assert epsilon_spent(sigma, releases + 1, delta) > spent


@needs_opacus
def test_a_gaussian_mechanisms_epsilon_matches_the_closed_form_rdp():
    """One release at sigma: RDP(a) = a / (2 sigma^2) (Mironov 2017, Prop. 7), converted with
    the accountant's rule; checked at sigma where the best order is inside the grid."""
    sigma, delta = 3.0, 1e-5
    rdp = [a / (2 * sigma**2) for a in ALPHAS]
    # Opacus's conversion (Balle et al. 2020, Thm. 21), evaluated here by hand
    eps = min(
        r + math.log1p(-1 / a) - (math.log(delta) + math.log(a)) / (a - 1)
        for a, r in zip(ALPHAS, rdp, strict=True)
    )
    assert epsilon_spent(sigma, 1, delta) == pytest.approx(eps, rel=1e-9)


@needs_opacus
def test_a_budget_no_noise_can_meet_is_an_error_naming_the_key():
    with pytest.raises(ConfigError, match=r"privacy\.epsilon"):
        noise_multiplier(1e-4, 1e-12, 1000)


def test_one_examples_contribution_is_clipped_to_the_bound():
    z = torch.tensor([[3.0, 4.0], [0.3, 0.4], [0.0, 0.0]])
    out = clip_rows(z, 1.0)
    assert out[0].norm().item() == pytest.approx(1.0)  # scaled down to the bound
    assert torch.allclose(out[0], torch.tensor([0.6, 0.8]))  # direction kept
    assert torch.equal(out[1], z[1]) and torch.equal(out[2], z[2])  # within: unchanged
    # FedRDN's statistic of one image is that image's clipped (means, stds) vector
    img = torch.rand(1, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    mean, std = clipped_statistics(img, 0.1)
    assert torch.cat([mean, std]).norm().item() == pytest.approx(0.1)
    # with a bound no image in [0, 1] reaches, clipping changes nothing
    many = torch.rand(20, 3, 8, 8, generator=torch.Generator().manual_seed(1))
    mean, std = clipped_statistics(many, (1.25 * 3) ** 0.5)
    plain = channel_statistics(many)
    assert torch.allclose(mean.float(), plain[0]) and torch.allclose(std.float(), plain[1])


def test_the_release_adds_noise_of_the_stated_scale():
    """Standardised by the stated std (sigma * 2 C * max weight), the noise of many values
    has mean 0 and variance 1 (tests at a false-failure probability below 1e-6)."""
    mech = Mechanism("r", clip=1.5, sigma=2.0, seed=3)
    n = 40_000
    parts = {"a": torch.zeros(n // 2, dtype=torch.float64), "b": torch.ones(n // 2)}
    out = mech.release(parts, max_weight=1 / 50, rnd=0, site="s")
    std = mech.std(1 / 50)
    assert std == pytest.approx(2.0 * 2 * 1.5 / 50)
    z = torch.cat([out["a"].double(), out["b"].double() - 1]) / std
    assert abs(z.mean().item()) * math.sqrt(n) < 5.5  # N(0, 1) after sqrt(n): P < 4e-8
    # the sample variance: sd of s^2 is sqrt(2 / n); 5.5 sd is P < 4e-8
    assert abs(z.var().item() - 1) < 5.5 * math.sqrt(2 / n)
    assert out["b"].dtype == torch.float32  # each tensor keeps its dtype
    # the noise depends on (seed, record, round, site) only: a re-run draws it again
    again = mech.release(parts, 1 / 50, 0, "s")
    assert torch.equal(again["a"], out["a"])
    assert not torch.equal(mech.release(parts, 1 / 50, 0, "t")["a"], out["a"])


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("privacy.epsilon=0", "privacy.epsilon"),
        ("privacy.epsilon=-1", "privacy.epsilon"),
        ("privacy.delta=1", "privacy.delta"),
        ("privacy.delta=0", "privacy.delta"),
        ("privacy.delta=2", "privacy.delta"),
        ("privacy.clip.fedrdn_stats=0", "privacy.clip.fedrdn_stats"),
        ("privacy.clip.fedrdn_stats=-2", "privacy.clip.fedrdn_stats"),
        ("privacy.clip.fedrdn_stats=true", "privacy.clip.fedrdn_stats"),
    ],
)
def test_bad_privacy_values_are_one_line_errors_naming_the_key(override, key):
    with pytest.raises(ConfigError) as e:
        toy_cfg("augment=[fedrdn]", "privacy.epsilon=1", override)
    assert f"'{key}'" in str(e.value) and "\n" not in str(e.value)


def test_privacy_off_keeps_every_digest():
    """An all-default privacy section is left out of the numbers' config (old digests hold);
    a budget enters it."""
    plain = toy_cfg("augment=[fedrdn]")
    assert "privacy" not in number_config(plain.to_dict())
    assert number_config(plain.to_dict()) == number_config(
        toy_cfg("augment=[fedrdn]", "privacy.delta=1e-6").to_dict()
    )  # delta alone acts on nothing
    on = number_config(toy_cfg("augment=[fedrdn]", "privacy.epsilon=1").to_dict())
    assert on["privacy"]["epsilon"] == 1.0


def _epochs_schedule(n: int, bs: int, steps: int, seed: int) -> list[torch.Tensor]:
    """The batches' example indices, drawn as ClientContext.batches draws them (a fresh
    permutation an epoch, a trailing batch of one skipped)."""
    g = torch.Generator().manual_seed(seed)
    out: list[torch.Tensor] = []
    while len(out) < steps:
        perm = torch.randperm(n, generator=g)
        for s in range(0, n, bs):
            idx = perm[s : s + bs]
            if idx.numel() < 2 and n > 1 and bs > 1:
                continue
            out.append(idx)
            if len(out) == steps:
                break
    return out


@pytest.mark.parametrize(
    ("n", "bs", "steps", "init"),
    [(40, 16, 3, "zero"), (41, 8, 12, "zero"), (30, 7, 9, "first"), (9, 4, 5, "zero")],
)
def test_the_amplitude_bound_on_an_images_weight_holds_for_every_image(n, bs, steps, init):
    """Eq. 3's running mean gives image i the weight sum over its batches of c_k / |b_k|;
    the bound the release is calibrated with is at least the largest, and equals it within
    one epoch."""
    from fedshift.augment.ampnorm import max_example_weight, running_weights

    sched = _epochs_schedule(n, bs, steps, seed=n + steps)
    c = running_weights(0.1, init, len(sched))
    assert sum(c) <= 1 + 1e-12
    exact = torch.zeros(n, dtype=torch.float64)
    for ck, idx in zip(c, sched, strict=True):
        exact[idx] += ck / idx.numel()
    bound = max_example_weight([int(i.numel()) for i in sched], c, n)
    assert bound >= float(exact.max()) - 1e-15
    if sum(int(i.numel()) for i in sched) <= n:  # one epoch: the bound is attained
        assert bound == pytest.approx(float(exact.max()))


def test_the_released_amplitude_differs_from_the_plain_one_by_noise_of_the_stated_scale():
    """HarmoFL's running amplitude released under a mechanism minus the same client's plain
    one (same batches; the default bound clips no image), standardised by sigma * 2 C w_max,
    is N(0, 1) per value: chi-square test at a false-failure probability below 1e-6 on the
    values far from 0 (the release is clamped at 0)."""
    from types import SimpleNamespace

    from scipy.stats import chi2

    from fedshift.augment.ampnorm import AmpNorm, AmpNormParams, amplitude_bound

    n, shape = 40, (3, 8, 8)
    x = torch.rand(n, *shape, generator=torch.Generator().manual_seed(5))
    data = SimpleNamespace(train=SimpleNamespace(x=x))
    mech = Mechanism("amplitude", clip=amplitude_bound(shape), sigma=0.005, seed=2)
    plain, protected = (AmpNorm(AmpNormParams(), 0, 2) for _ in range(2))
    protected.privacy = {"amplitude": mech}
    states = [a.init_client("c", data, None) for a in (plain, protected)]
    y, g = torch.zeros(16, dtype=torch.long), torch.Generator()
    for s in range(0, n, 16):
        for a, st in zip((plain, protected), states, strict=True):
            a.train_batch(x[s : s + 16], y[: len(x[s : s + 16])], st, g)
    want = plain.reply(None, states[0], 1)["amplitude"]["amplitude"].double()
    got = protected.reply(None, states[1], 1)["amplitude"]["amplitude"].double()
    std = mech.std(0.1 / 8)  # batches 16, 16, 8: the last batch's images weigh v / 8
    far = want > 8 * std
    z = ((got - want) / std)[far]
    assert z.numel() > 150
    stat = float(z.pow(2).sum())
    assert chi2.ppf(5e-7, z.numel()) < stat < chi2.ppf(1 - 5e-7, z.numel())
