"""Differential privacy for the statistics a site shares (``privacy.epsilon``, issue 53):
the Gaussian mechanism on per-example clipped sums, and its calibration by Opacus's RDP
accountant.

The unit of privacy is one training example of one site; two data sets are neighbours when
they differ in one example replaced by another (the site's size ``n`` is public: the ledger
and the aggregation weights reveal it anyway). A protected record is a weighted sum of
per-example vectors, ``S = sum_i w_i clip(z_i)``, where ``clip`` scales each example's
vector ``z_i`` (every tensor of the record concatenated) to L2 norm at most ``C`` (the
record's clip bound) and ``w_i`` is the weight the method gives example ``i`` (``1/n`` for a
plain mean over the site's ``n`` examples, ``1/m`` for a mean over a group of ``m``). Replacing
one example moves ``S`` by at most the sensitivity ``2 C max_i w_i`` in L2, and the site
releases ``S + N(0, (sigma * 2 C max_i w_i)^2 I)``, each tensor of the record getting its
part of the noise (:meth:`Mechanism.release`).

``sigma`` (the noise multiplier) is the same for every release of a run: calibrated once,
before any client state is built, so that all the releases of the run's protected records
at a site (one per record sent once, ``train.rounds`` per record sent every round), composed
by Opacus's Renyi-DP accountant (``opacus.accountants.RDPAccountant``, sampling rate 1),
spend at most ``(privacy.epsilon, privacy.delta)`` (:func:`noise_multiplier`, Opacus's
``get_noise_multiplier``); :func:`epsilon_spent` reports what ``k`` releases spend. Nothing
here composes by hand.

The guarantee covers the records the method's components protect (their declarations,
:attr:`fedshift.core.disclosure.Disclosure.clip`): each is a function of the site's images
alone, so per-example clipping bounds its sensitivity (a statistic of features under a model
trained on the same data is not: replacing one example changes the model). Model weights and
updates are protected only with ``privacy.updates`` (:mod:`fedshift.core.dp_updates`), under
the same ``privacy.epsilon`` (docs/PRIVACY.md).
Imports only torch, the standard library and ``core`` (Opacus when a budget is planned).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import torch

from fedshift.core.errors import ConfigError
from fedshift.core.seeding import generator

__all__ = [
    "ALPHAS",
    "Mechanism",
    "clip_rows",
    "epsilon_composed",
    "epsilon_spent",
    "noise_multiplier",
]

#: the Renyi orders the accountant converts over: Opacus's defaults (1.1 ... 63) and larger
#: orders, which small budgets need (the conversion to (epsilon, delta) at order a costs
#: about log(1/delta) / (a - 1): at delta 1e-5 the defaults alone cannot reach epsilon < 0.2)
ALPHAS: tuple[float, ...] = (
    *(1 + x / 10.0 for x in range(1, 100)),
    *range(12, 64),
    *range(64, 256, 8),
    *range(256, 4097, 128),
)
#: the calibration's precision: the planned epsilon is within this fraction below the budget
TOLERANCE = 1e-3


def _accountant():  # noqa: ANN202 - Opacus's class, imported when a budget is planned
    try:
        from opacus.accountants import RDPAccountant
    except ImportError as e:  # the optional dependency of privacy.epsilon
        raise ConfigError(
            "config key 'privacy.epsilon' needs Opacus's privacy accountant, which is not "
            "installed: pip install 'fedshift[privacy]' (or pip install opacus)"
        ) from e
    return RDPAccountant()


def epsilon_spent(sigma: float, releases: int, delta: float) -> float:
    """The epsilon (at ``delta``) of ``releases`` Gaussian mechanisms of noise multiplier
    ``sigma`` (noise std / L2 sensitivity), sampling rate 1, composed by Opacus's RDP
    accountant; 0 for no release."""
    if releases <= 0:
        return 0.0
    acc = _accountant()
    acc.history = [(float(sigma), 1.0, int(releases))]
    return float(acc.get_epsilon(delta=delta, alphas=list(ALPHAS)))


def epsilon_composed(
    history: list[tuple[float, float, int]], delta: float, alphas: tuple[float, ...] = ALPHAS
) -> float:
    """The epsilon (at ``delta``) of mechanisms of different noise multipliers composed by
    Opacus's RDP accountant: ``history`` holds (noise multiplier, sampling rate, releases)
    entries, as ``RDPAccountant.history`` does; entries of no release are left out.
    ``alphas``: the Renyi orders (DP-SGD's subsampled entries use
    :data:`fedshift.core.dpsgd.DPSGD_ALPHAS`)."""
    entries = [(float(s), float(q), int(k)) for s, q, k in history if k > 0]
    if not entries:
        return 0.0
    acc = _accountant()
    acc.history = entries
    with warnings.catch_warnings():
        # at a large epsilon the best order is the smallest one given: a looser bound (a
        # larger epsilon), never a smaller one; Opacus says so on every call
        warnings.filterwarnings("ignore", message="Optimal order is the smallest alpha")
        return float(acc.get_epsilon(delta=delta, alphas=list(alphas)))


def noise_multiplier(
    epsilon: float, delta: float, releases: int, what: str = "the protected records"
) -> float:
    """The smallest noise multiplier (to :data:`TOLERANCE`) at which ``releases`` Gaussian
    mechanisms compose to at most ``(epsilon, delta)``: Opacus's ``get_noise_multiplier``
    with its RDP accountant (sampling rate 1). A budget no noise can meet is a
    :class:`ConfigError` naming ``privacy.epsilon``."""
    _accountant()  # the install hint first
    from opacus.accountants.utils import get_noise_multiplier

    try:
        return float(
            get_noise_multiplier(
                target_epsilon=epsilon, target_delta=delta, sample_rate=1.0, steps=releases,
                accountant="rdp", epsilon_tolerance=TOLERANCE * epsilon, alphas=list(ALPHAS),
            )
        )  # fmt: skip
    except ValueError as e:  # Opacus: "The privacy budget is too low."
        raise ConfigError(
            f"config key 'privacy.epsilon': {epsilon:g} at delta {delta:g} cannot cover "
            f"{releases} release(s) of {what} at any noise level (Opacus: {e}); "
            "raise privacy.epsilon or privacy.delta, or run fewer rounds"
        ) from e


def clip_rows(z: torch.Tensor, bound: float) -> torch.Tensor:
    """Each row of ``z`` (N, d) scaled to L2 norm at most ``bound`` (rows within it are
    unchanged): the per-example clipping of the mechanism."""
    if z.ndim != 2:
        raise ValueError(f"clip_rows expects (N, d) per-example vectors, got {tuple(z.shape)}")
    norms = z.double().norm(dim=1, keepdim=True)
    scale = (bound / norms.clamp_min(1e-300)).clamp(max=1.0)
    return (z.double() * scale).to(z.dtype)


@dataclass(frozen=True)
class Mechanism:
    """The Gaussian mechanism of one protected record at every site of a run (module
    docstring): its clip bound, the run's noise multiplier and the noise seed."""

    record: str
    #: the L2 bound each example's vector is clipped to
    clip: float
    #: noise std / L2 sensitivity, the same for every release of the run
    sigma: float
    #: the run seed: the noise of a release is drawn from (seed, record, round, site)
    seed: int

    def sensitivity(self, max_weight: float) -> float:
        """The L2 sensitivity of ``sum_i w_i clip(z_i)`` to replacing one example."""
        return 2.0 * self.clip * max_weight

    def std(self, max_weight: float) -> float:
        """The std of the noise added to each value of the record."""
        return self.sigma * self.sensitivity(max_weight)

    def release(
        self, parts: dict[str, torch.Tensor], max_weight: float, rnd: int, site: str
    ) -> dict[str, torch.Tensor]:
        """``parts`` (the record's tensors, each a weighted sum of clipped per-example
        vectors' pieces) plus Gaussian noise of std :meth:`std`, drawn in float64 on the CPU
        from the stream of (seed, record, round, site), so a resumed or re-run release draws
        the same noise on any device; each tensor keeps its dtype and device."""
        if not (max_weight > 0 and math.isfinite(max_weight)):
            raise ValueError(f"record {self.record!r}: max_weight must be > 0, got {max_weight}")
        g = generator(self.seed, "privacy", self.record, rnd, site)
        std = self.std(max_weight)
        out = {}
        for key in sorted(parts):  # a fixed order of draws
            v = parts[key]
            noise = torch.randn(v.shape, generator=g, dtype=torch.float64) * std
            out[key] = (v.double().cpu() + noise).to(device=v.device, dtype=v.dtype)
        return out
