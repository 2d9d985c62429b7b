"""Example-level DP-SGD (``privacy.updates=example``, issue 53 item 2): one site's mechanism
and its calibration by Opacus's RDP accountant (the local step that applies it:
:mod:`fedshift.algorithms.dp_sgd`; the run's budget: :mod:`fedshift.runtime.privacy`).

**Unit and neighbours.** One training example of one site. Two data sets of a site are
neighbours when one example is replaced by a null example that contributes nothing: no
gradient, no term in a statistic (zero-out adjacency, Kairouz et al., ICML 2021, "Practical
and private (deep) learning without sampling or shuffling", Sec. 2). The site's size ``n``
stays public (every reply states it). Under it Opacus's analysis of the Poisson-subsampled
Gaussian (Mironov, Talwar and Zhang 2019, the add/remove case: a null example's clipped
gradient is 0) holds as it stands, and a statistic released with noise calibrated to the
replace-one sensitivity ``2 C w`` (:mod:`fedshift.core.privacy`) moves by at most ``C w``:
it is at least as private as at its noise multiplier, so both enter one accountant history.
A replaced example (the statistics' own unit) is two such steps.

**One local step** of a site with ``n`` training examples (Abadi et al., CCS 2016,
Algorithm 1, with Poisson sampling):

* its batch is Poisson-sampled: each example independently with probability
  ``q = min(1, train.batch_size / n)`` (Opacus's ``UniformWithReplacementSampler`` on the
  client's batch generator), so a batch's size varies and may be 0;
* each example's gradient of the task loss over every trainable tensor (Opacus's per-sample
  gradients) is scaled to L2 norm at most ``C = privacy.update_clip``, all tensors
  together; the clipped gradients are summed and Gaussian noise of std ``z C`` is added to
  every value (``z`` the noise multiplier), then divided by the expected batch size
  ``q n`` (Opacus's ``DPOptimizer``); the noise is drawn in float64 on the CPU from the
  stream of (seed, ``privacy``, ``dpsgd``, round, site), so a resumed run draws it again;
* the optimiser steps on that. A penalty that reads no data (FedProx's proximal term) adds
  its gradient afterwards, and ``train.agc`` clips the noisy gradient: post-processing.

One step is one subsampled Gaussian mechanism of multiplier ``z`` at rate ``q``; a site's
run is ``steps x rounds`` of them (:class:`ExampleMechanism`). :func:`dpsgd_noise_multiplier`
calibrates ``z`` so that those steps, composed in one Opacus RDP history with the site's
statistic releases, spend at most the budget. Imports only torch, the standard library
and ``core`` (Opacus when a budget is planned).
"""

from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass

from fedshift.core.errors import ConfigError
from fedshift.core.privacy import _accountant, epsilon_composed

__all__ = [
    "DPSGD_ALPHAS",
    "DPSGD_TOLERANCE",
    "ExampleMechanism",
    "dpsgd_noise_multiplier",
    "sample_rate",
]

#: the Renyi orders of every history holding DP-SGD steps: Opacus computes the subsampled
#: Gaussian's RDP at a fractional order by a series (up to 0.1 s an order near 1) and at an
#: integer one in closed form, so 1.5 and integers (2 ... 4096; the statistics' own orders,
#: :data:`fedshift.core.privacy.ALPHAS`, add fractional ones below 11). Fewer orders give a
#: slightly larger (never a smaller) epsilon.
DPSGD_ALPHAS: tuple[float, ...] = (
    1.5,
    *range(2, 64),
    *range(64, 256, 16),
    *(256, 384, 512, 768, 1024, 2048, 4096),
)
#: DP-SGD's calibration precision: its planned epsilon is within this fraction below the
#: budget (coarser than the statistics' :data:`fedshift.core.privacy.TOLERANCE`: each try
#: composes every order of a subsampled history, about 0.3 s)
DPSGD_TOLERANCE = 1e-2


def sample_rate(batch_size: int, n: int) -> float:
    """Poisson sampling's rate ``q = min(1, batch_size / n)`` of a site of ``n`` examples."""
    return min(1.0, batch_size / n) if n > 0 else 1.0


@dataclass(frozen=True)
class ExampleMechanism:
    """DP-SGD at one site (module docstring): what its local steps apply in every round."""

    #: the L2 bound of one example's gradient (``privacy.update_clip``)
    clip: float
    #: noise std / clip, per value of the summed clipped gradients
    noise_multiplier: float
    #: Poisson sampling's rate ``q``
    sample_rate: float
    #: local steps a round (each one release)
    steps: int
    #: the site's training examples ``n`` (public)
    examples: int
    #: the run seed: the noise of a step is drawn from (seed, round, site)
    seed: int

    @property
    def expected_batch(self) -> float:
        """``q n``: what the noisy sum is divided by."""
        return self.sample_rate * self.examples


def _epsilon_at(
    sigma: float, q: float, steps: int, fixed: tuple[tuple[float, float, int], ...], delta: float
) -> float:
    return epsilon_composed([*fixed, (sigma, q, steps)], delta, DPSGD_ALPHAS)


@functools.lru_cache(maxsize=256)
def dpsgd_noise_multiplier(
    epsilon: float,
    delta: float,
    q: float,
    steps: int,
    fixed: tuple[tuple[float, float, int], ...] = (),
) -> float:
    """The noise multiplier (to :data:`DPSGD_TOLERANCE` of ``epsilon``) at which ``steps``
    subsampled Gaussian steps at rate ``q``, composed with the releases ``fixed`` ((noise
    multiplier, rate, releases) entries: the site's statistics) in Opacus's RDP accountant,
    spend at most ``(epsilon, delta)``. Without ``fixed`` it is Opacus's
    ``get_noise_multiplier`` itself; with it, the same doubling-then-bisection search over
    the composed history (Opacus's function takes one entry). A budget no noise meets is a
    :class:`ConfigError` naming ``privacy.epsilon``. Cached: every process that builds a run
    (a pool worker too) asks the same questions."""
    _accountant()  # the install hint first
    tol = DPSGD_TOLERANCE * epsilon
    floor = epsilon_composed(list(fixed), delta, DPSGD_ALPHAS)
    if floor >= epsilon - tol:
        raise ConfigError(
            f"config key 'privacy.epsilon': {epsilon:g} at delta {delta:g} is spent by the "
            f"statistics' releases alone (epsilon {floor:.4g}), leaving nothing for DP-SGD's "
            f"{steps} step(s); raise privacy.epsilon or lower privacy.stats_share"
        )
    if not fixed:
        from opacus.accountants.utils import get_noise_multiplier

        try:
            with warnings.catch_warnings():  # as epsilon_composed: a looser bound only
                warnings.filterwarnings("ignore", message="Optimal order is the smallest alpha")
                return float(
                    get_noise_multiplier(
                        target_epsilon=epsilon, target_delta=delta, sample_rate=q, steps=steps,
                        accountant="rdp", epsilon_tolerance=tol, alphas=list(DPSGD_ALPHAS),
                    )
                )  # fmt: skip
        except ValueError as e:  # Opacus: "The privacy budget is too low."
            raise _too_small(epsilon, delta, steps, q) from e
    low, high = 0.0, 10.0
    eps_high = float("inf")
    while eps_high > epsilon:
        high *= 2
        if high > 1e6:
            raise _too_small(epsilon, delta, steps, q)
        eps_high = _epsilon_at(high, q, steps, fixed, delta)
    while epsilon - eps_high > tol:
        mid = (low + high) / 2
        eps = _epsilon_at(mid, q, steps, fixed, delta)
        if eps < epsilon:
            high, eps_high = mid, eps
        else:
            low = mid
    return high


def _too_small(epsilon: float, delta: float, steps: int, q: float) -> ConfigError:
    return ConfigError(
        f"config key 'privacy.epsilon': {epsilon:g} at delta {delta:g} cannot cover {steps} "
        f"DP-SGD step(s) at sampling rate {q:.4g} at any noise level; raise privacy.epsilon "
        "or privacy.delta, or train fewer steps (train.rounds, train.local_epochs)"
    )
