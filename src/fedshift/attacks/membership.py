"""Membership inference on a shared mean: was example ``x`` among the ``n`` examples a site's
statistic summarises?

FedRDN shares each site's mean over its images of per-image channel means and standard
deviations (its Eq. 5-6), FedFA running means of per-image feature statistics, FedProto / FPL
per-class means of embeddings: each is a mean ``s = (1/n) sum_i f(x_i)`` of per-example
features ``f``. The tracing attack of Homer et al. (PLoS Genetics 2008; Dwork, Smith, Steinke
and Ullman, Annu. Rev. Stat. Appl. 2017) tests a target ``x`` against a reference population
the attacker can sample (the same domain: a worst case for the site) by a likelihood ratio.
With the population's per-feature mean ``mu`` and variance ``v`` (diagonal Gaussian model),

* not a member: ``s ~ N(mu, v / n)``;
* a member: ``s ~ N(f(x) / n + (n - 1) mu / n, (n - 1) v / n^2)``;

:func:`llr` is the log of their density ratio at ``s``, summed over features. Its power grows
with the number of features over ``n``: small sites are where statistics leak. With ``n = 1``
the statistic is the example itself, and the test separates members perfectly (the check that
the attack works: ``tests/attacks``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from fedshift.attacks.scores import RocScore, roc_score

__all__ = ["SizeResult", "llr", "membership_by_size", "tracing"]

#: the floor of the member hypothesis's variance (relative), for ``n = 1`` where it is zero
_TINY = 1e-9
#: the floor of a feature's reference variance, as a share of the mean over features
VAR_FLOOR = 1e-3


def llr(
    stat: torch.Tensor,
    targets: torch.Tensor,
    mu: torch.Tensor,
    var: torch.Tensor,
    n: int,
    noise: float = 0.0,
) -> torch.Tensor:
    """The log-likelihood ratio "member" over "not a member" (module docstring) of each target
    (``targets``: ``(m, d)`` features) for the mean ``stat`` (``(d,)``) over ``n`` examples of
    a population with per-feature mean ``mu`` and variance ``var``. ``noise``: the mean was
    released with Gaussian noise of this std per value (a record protected by
    ``privacy.epsilon``); the attacker knows the mechanism and adds its variance to both
    hypotheses."""
    stat, targets, mu, var = (t.double() for t in (stat, targets, mu, var))
    # a feature the reference sample never varies (a ReLU unit at 0) would weigh any
    # difference infinitely: its variance is floored at a share of the mean one
    var = var.clamp_min(VAR_FLOOR * float(var.mean().clamp_min(1e-30)))
    v0 = var / n + noise**2
    v1 = var * max(n - 1, _TINY) / n**2 + noise**2
    m1 = targets / n + (n - 1) * mu / n
    out = -0.5 * ((stat - m1) ** 2 / v1 + torch.log(v1)) + 0.5 * (
        (stat - mu) ** 2 / v0 + torch.log(v0)
    )
    return out.sum(dim=-1)


def tracing(
    stat: torch.Tensor, targets: torch.Tensor, mu: torch.Tensor, var: torch.Tensor
) -> torch.Tensor:
    """The inner-product tracing score (Dwork et al. 2017, Sec. 3): ``sum_j (f_j(x) - mu_j)
    (s_j - mu_j) / v_j``, the linear part of :func:`llr`. Where the attacker's per-example
    features only approximate those the record was computed from (a record of a model in
    training, read with the model after it), the Gaussian model's quadratic terms weigh
    that mismatch, not membership; this score does not, so the record attacks of trained
    models use it."""
    stat, targets, mu, var = (t.double() for t in (stat, targets, mu, var))
    var = var.clamp_min(VAR_FLOOR * float(var.mean().clamp_min(1e-30)))
    return ((targets - mu) * (stat - mu) / var).sum(dim=-1)


@dataclass(frozen=True)
class SizeResult:
    """The attack at one site size: its ROC over every trial's members and non-members."""

    n: int
    trials: int
    roc: RocScore


def membership_by_size(
    features: torch.Tensor,
    sizes: list[int],
    trials: int = 50,
    reference: float = 0.5,
    seed: int = 0,
    fpr: float = 1e-3,
    labels: torch.Tensor | None = None,
    noise: Callable[[int], float] | None = None,
) -> list[SizeResult]:
    """The attack on sites of each size in ``sizes``, drawn from one population's per-example
    ``features`` (``(N, d)``). A ``reference`` share of the examples is the attacker's sample of
    the population (``mu``, ``var``); each trial draws a site of ``n`` others, releases its
    mean, and scores its ``n`` members and ``n`` other examples. ``labels`` (``(N,)``): the
    record is one mean per class (prototypes): a target is tested against its class's mean
    over the site's examples of that class, with that class's reference moments. A size
    larger than half the examples left is refused (members and non-members would not be
    disjoint). ``noise``: the record is released with Gaussian noise, ``noise(m)`` its std
    per value for a mean over ``m`` examples (the Gaussian mechanism of a record protected by
    ``privacy.epsilon``: ``sigma * 2 clip / m``); each trial's release draws it (after the
    trial's site) and the test knows its variance (:func:`llr`). The caller clips the
    features as the mechanism does."""
    gen = torch.Generator().manual_seed(seed)
    perm = torch.randperm(len(features), generator=gen)
    k = int(math.floor(reference * len(features)))
    feats = features.double()
    groups = torch.zeros(len(feats), dtype=torch.long) if labels is None else labels.long()
    ref, pool, pool_g = feats[perm[:k]], feats[perm[k:]], groups[perm[k:]]
    ref_g = groups[perm[:k]]
    moments = {}
    for c in groups.unique().tolist():
        r = ref[ref_g == c]
        if len(r) < 2:
            raise ValueError(
                f"membership_by_size: class {c} has {len(r)} reference example(s); need 2"
            )
        moments[c] = (r.mean(0), r.var(0))
    out = []
    for n in sizes:
        if 2 * n > len(pool):
            raise ValueError(
                f"membership_by_size: a site of {n} needs {2 * n} examples besides the "
                f"reference sample, there are {len(pool)}"
            )
        ins, outs = [], []
        for _ in range(trials):
            idx = torch.randperm(len(pool), generator=gen)
            site, others = idx[:n], idx[n : 2 * n]
            for c in pool_g[site].unique().tolist():
                members = site[pool_g[site] == c]
                stat = pool[members].mean(0)  # the record: this class's (or the site's) mean
                std = 0.0
                if noise is not None:  # released through the Gaussian mechanism
                    std = noise(len(members))
                    stat = stat + std * torch.randn(stat.shape, generator=gen).double()
                mu, var = moments[c]
                ins.append(llr(stat, pool[members], mu, var, len(members), std))
                strangers = others[pool_g[others] == c]
                if len(strangers):
                    outs.append(llr(stat, pool[strangers], mu, var, len(members), std))
        out.append(SizeResult(n, trials, roc_score(torch.cat(ins), torch.cat(outs), fpr)))
    return out
