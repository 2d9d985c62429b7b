"""A run's privacy budget (``privacy.epsilon``, issue 53): which records are protected, the
noise multiplier, and what the run spends (:mod:`fedshift.core.privacy` has the mechanism).

:func:`plan_privacy` is called when the experiment is built (every process that builds it:
the run's, a pool worker, ``fedshift privacy show``), before any client state exists. From
the composition's declarations (:mod:`fedshift.core.disclosure`) it

* refuses, naming the record, a method that sends a statistic, per-example data or
  representations its component cannot clip per example (``Disclosure.clip`` None), and a
  method that shares no statistic at all (``privacy.epsilon`` would protect nothing: weights
  are not covered);
* counts each protected record's releases at one site over the run: 1 for a record sent once
  (in the setup exchange or a site's first round), ``train.rounds`` for one sent every round;
* calibrates one noise multiplier for all of them with Opacus's RDP accountant
  (:func:`fedshift.core.privacy.noise_multiplier`): a budget no noise meets fails here, with
  one line naming ``privacy.epsilon``;
* gives each protecting component its records' :class:`~fedshift.core.privacy.Mechanism`;
* with ``privacy.updates=client``, plans the weights' DP-FedAvg mechanism too
  (:class:`UpdatePlan`, :mod:`fedshift.core.dp_updates`; applied by
  :mod:`fedshift.runtime.dp_updates`): one release a round, its noise multiplier calibrated
  by the same accountant to the same ``(privacy.epsilon, privacy.delta)`` at its own unit,
  one site. The statistics' unit is one example; the two guarantees are reported separately
  and, at the example level, composed in one accountant history (:meth:`Plan.summary`);
* with ``privacy.updates=example``, plans each site's DP-SGD (:class:`ExamplePlan`,
  :mod:`fedshift.core.dpsgd`; applied by :mod:`fedshift.algorithms.dp_sgd`, refusals in
  :mod:`fedshift.runtime.dpsgd`): the statistics' noise is calibrated to
  ``privacy.stats_share`` of ``privacy.epsilon``, then each site's DP-SGD noise multiplier
  so that its ``steps x train.rounds`` steps (Poisson rate ``batch_size / n``) and its
  statistic releases, in one Opacus RDP history, spend at most ``privacy.epsilon``.

The plan is a function of the config alone, so a resumed run plans the same noise and
spends the same budget as an uninterrupted one; an extension (``--resume DIR
train.rounds=N``) that would release a record more often than the plan covers stops before
its first new round (:meth:`Plan.check_rounds`). ``summary.json`` records the plan and the
epsilon spent per record and in all (:meth:`Plan.summary`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fedshift.core.config import RunConfig
from fedshift.core.context import round_steps
from fedshift.core.disclosure import UP, Disclosure, Kind, When
from fedshift.core.dp_updates import UpdateMechanism
from fedshift.core.dpsgd import (
    DPSGD_ALPHAS,
    ExampleMechanism,
    dpsgd_noise_multiplier,
    sample_rate,
)
from fedshift.core.errors import ConfigError
from fedshift.core.privacy import Mechanism, epsilon_composed, epsilon_spent, noise_multiplier

if TYPE_CHECKING:
    from fedshift.augment.compose import Composition
    from fedshift.models.base import FedModel

__all__ = [
    "ExamplePlan",
    "Plan",
    "RecordPlan",
    "SiteSGD",
    "UpdatePlan",
    "plan_privacy",
    "updates_refusal",
]

#: the record ``privacy.updates`` protects
WEIGHTS = "weights"
UK = "config key 'privacy.updates'"  # the start of its refusals


@dataclass(frozen=True)
class UpdatePlan:
    """DP-FedAvg on the ``weights`` record (``privacy.updates=client``): one release a round
    (:mod:`fedshift.core.dp_updates`)."""

    unit: str
    clip: float
    #: the noise multiplier at the unit's sensitivity (``clip / m``): std ``z clip / m``
    noise_multiplier: float
    #: the releases the budget covers (``train.rounds``)
    releases: int

    def mechanism(self, seed: int) -> UpdateMechanism:
        return UpdateMechanism(self.clip, self.noise_multiplier, seed)

    @property
    def example_multiplier(self) -> float:
        """The noise multiplier of one release at the example level: replacing one example
        of a site moves its clipped update anywhere in the ball of radius ``clip``, so the
        mean by at most ``2 clip / m``: half the client-level multiplier."""
        return self.noise_multiplier / 2.0


@dataclass(frozen=True)
class SiteSGD:
    """One site's DP-SGD (``privacy.updates=example``): public sizes and its multiplier."""

    site: str
    #: its training examples ``n``
    examples: int
    #: Poisson sampling's rate ``q = min(1, batch_size / n)``
    sample_rate: float
    #: local steps a round
    steps: int
    noise_multiplier: float


@dataclass(frozen=True)
class ExamplePlan:
    """DP-SGD on every site's local steps (``privacy.updates=example``,
    :mod:`fedshift.core.dpsgd`): the clip bound and each site's plan."""

    clip: float
    sites: tuple[SiteSGD, ...]
    #: the rounds the budget covers (``train.rounds``)
    releases: int
    #: the part of ``privacy.epsilon`` the statistics' noise was calibrated to
    stats_share: float

    def site(self, name: str) -> SiteSGD:
        for s in self.sites:
            if s.site == name:
                return s
        raise KeyError(f"privacy.updates=example: no DP-SGD plan for site {name!r}")

    def mechanism(self, name: str, seed: int) -> ExampleMechanism:
        s = self.site(name)
        return ExampleMechanism(self.clip, s.noise_multiplier, s.sample_rate, s.steps,
                                s.examples, seed)  # fmt: skip

    def history(self, s: SiteSGD, rounds: int) -> tuple[float, float, int]:
        """The accountant entry of site ``s``'s steps over ``rounds`` rounds."""
        return (s.noise_multiplier, s.sample_rate, s.steps * rounds)


@functools.lru_cache(maxsize=1024)
def _composed(history: tuple[tuple[float, float, int], ...], delta: float) -> float:
    """:func:`epsilon_composed` over DP-SGD's orders (cached: a summary asks per round)."""
    return epsilon_composed(list(history), delta, DPSGD_ALPHAS)


@dataclass(frozen=True)
class RecordPlan:
    """One protected record: its releases at a site over the planned run."""

    record: str
    source: str
    when: When
    clip: float
    #: whether ``clip`` is the component's default (not set in ``privacy.clip``)
    default_clip: bool
    releases: int

    def released_after(self, rounds: int) -> int:
        """Releases at a site that took part in every one of the first ``rounds`` rounds."""
        if self.when is When.ROUND:
            return rounds
        if self.when is When.ONCE:
            return min(1, rounds)
        return 1  # the setup exchange, before round 1


@dataclass(frozen=True)
class Plan:
    """The budget of a run (module docstring)."""

    epsilon: float
    delta: float
    #: noise std / L2 sensitivity of every release
    sigma: float
    rounds: int
    records: tuple[RecordPlan, ...]
    seed: int
    #: the weights' plan (``privacy.updates=client``), or None: weights not covered
    updates: UpdatePlan | None = None
    #: DP-SGD's plan (``privacy.updates=example``), or None
    example: ExamplePlan | None = None

    @property
    def mechanisms(self) -> dict[str, Mechanism]:
        return {r.record: Mechanism(r.record, r.clip, self.sigma, self.seed) for r in self.records}

    @property
    def planned_releases(self) -> int:
        return sum(r.releases for r in self.records)

    def check_rounds(self, rounds: int) -> None:
        """Refuse to run to ``rounds`` when a record would then be released more often than
        the budget was planned for (an extension of a run that protects a per-round record)."""
        over = [r.record for r in self.records if r.released_after(rounds) > r.releases]
        covered = [u.releases for u in (self.updates, self.example) if u is not None]
        if covered and rounds > covered[0]:
            over.append(WEIGHTS)
        if over:
            spent = self._spent(rounds)
            raise ConfigError(
                f"train.rounds={rounds}: the privacy budget (privacy.epsilon={self.epsilon:g}, "
                f"delta {self.delta:g}) was planned for {self.rounds} rounds; record(s) "
                f"{', '.join(map(repr, over))} would be released again and the "
                f"run would spend epsilon {spent:.3g}: the run stops before round "
                f"{self.rounds + 1}. Start a new run with the rounds and budget you want"
            )

    def _history(self, rounds: int, weights: bool) -> list[tuple[float, float, int]]:
        """The example-level accountant history after ``rounds`` rounds: the statistics'
        releases and, with ``weights``, the weights' at their example-level multiplier."""
        history = [(self.sigma, 1.0, sum(r.released_after(rounds) for r in self.records))]
        if weights and self.updates is not None:
            history.append((self.updates.example_multiplier, 1.0, rounds))
        return history

    def _spent(self, rounds: int) -> float:
        """What the budget covers at its unit after ``rounds`` rounds: the statistics at the
        example level; with ``privacy.updates=client`` the larger of that and the weights'
        client-level epsilon (each budgeted by ``privacy.epsilon`` on its own)."""
        if self.example is not None:
            return self._example_all(rounds)
        spent = epsilon_composed(self._history(rounds, weights=False), self.delta)
        if self.updates is not None:
            spent = max(spent, epsilon_spent(self.updates.noise_multiplier, rounds, self.delta))
        return spent

    def _example_all(self, rounds: int) -> float:
        """DP-SGD's run: the largest over the sites of its steps and the statistics' releases
        after ``rounds`` rounds, in one accountant history (over DP-SGD's orders)."""
        assert self.example is not None
        stats = self._history(rounds, weights=False)[0]
        return max(
            (_composed((stats, self.example.history(s, rounds)), self.delta)
             for s in self.example.sites),
            default=0.0,
        )  # fmt: skip

    def _example_summary(self, rounds: int, out: dict) -> None:
        """``summary``'s DP-SGD part: the ``weights`` record per site, and the epsilon in
        all at the example level (statistics and DP-SGD in one history, the largest site)."""
        e = self.example
        assert e is not None
        stats = self._history(rounds, weights=False)[0]
        sites = {
            s.site: {
                "examples": s.examples,
                "sample_rate": s.sample_rate,
                "steps_per_round": s.steps,
                "noise_multiplier": s.noise_multiplier,
                "releases": s.steps * rounds,
                "epsilon_spent": _composed((e.history(s, rounds),), self.delta),
                "epsilon_spent_with_statistics": _composed(
                    (stats, e.history(s, rounds)), self.delta
                ),
            }
            for s in e.sites
        }
        out["records"][WEIGHTS] = {
            "component": "privacy.updates",
            "unit": "example",
            "mechanism": "DP-SGD (Opacus: per-example gradient clipping, Poisson sampling, "
            "Gaussian noise at every local step)",
            "clip": e.clip,
            "noise_std": "noise_multiplier * clip on the sum of a step's clipped gradients",
            "releases": max((v["releases"] for v in sites.values()), default=0),
            "epsilon_spent": max((v["epsilon_spent"] for v in sites.values()), default=0.0),
            "sites": sites,
        }
        out["accountant"] = (
            "opacus rdp (statistics: sampling rate 1; DP-SGD: Poisson sampling rate "
            "batch_size / n per site)"
        )
        out["adjacency"] = "one example of a site replaced by a null example (zero-out)"
        out["stats_share"] = e.stats_share if self.records else None
        out["releases"] += out["records"][WEIGHTS]["releases"]
        out["epsilon_spent"] = self._example_all(rounds)
        out["not_covered"] = "the training metrics (loss, steps) sent each round"

    def summary(self, rounds: int) -> dict:
        """``summary.json``'s ``privacy``: the plan and the epsilon spent after ``rounds``
        rounds by a site that took part in every round (an upper bound for sampled sites):
        per record (``weights`` too, with ``privacy.updates``, at its unit) and in all at the
        example level, every release in one accountant history."""
        per = {r.record: r.released_after(rounds) for r in self.records}
        records: dict[str, dict] = {
            r.record: {
                "component": r.source,
                "unit": "example",
                "clip": r.clip,
                "clip_default": r.default_clip,
                "releases": per[r.record],
                "epsilon_spent": epsilon_spent(self.sigma, per[r.record], self.delta),
            }
            for r in self.records
        }
        out = {
            "epsilon": self.epsilon,
            "delta": self.delta,
            "accountant": "opacus rdp (sampling rate 1)",
            "noise_multiplier": self.sigma if self.records else None,
            "planned_rounds": self.rounds,
            "records": records,
            "releases": sum(per.values()),
            "unit": "example",
            "epsilon_spent": epsilon_composed(self._history(rounds, False), self.delta),
            "not_covered": "model weights and updates",
        }
        if self.example is not None:
            self._example_summary(rounds, out)
        u = self.updates
        if u is not None:
            client = epsilon_spent(u.noise_multiplier, rounds, self.delta)
            example = epsilon_spent(u.example_multiplier, rounds, self.delta)
            records[WEIGHTS] = {
                "component": "privacy.updates",
                "unit": u.unit,
                "clip": u.clip,
                "noise_multiplier": u.noise_multiplier,
                "noise_std": "noise_multiplier * clip / (clients sampled in the round)",
                "releases": rounds,
                "epsilon_spent": client,
                "example_level_epsilon_spent": example,
            }
            out["releases"] = sum(per.values()) + rounds
            # privacy.epsilon budgets each unit: the weights at the client level (here), the
            # statistics at the example level ("epsilon_spent" above)
            out["client_level"] = {"records": [WEIGHTS], "epsilon_spent": client}
            # what the client-level guarantee implies for one example, composed with the
            # statistics in one accountant history (not budgeted: it may exceed epsilon)
            out["example_level_all_records"] = {
                "records": sorted([*records]),
                "epsilon_spent": epsilon_composed(self._history(rounds, True), self.delta),
            }
            out["not_covered"] = "the training metrics (loss, steps) sent each round"
        return out


def updates_refusal(algo: Composition, model: FedModel) -> str | None:
    """Why ``privacy.updates=client`` cannot protect the composition ``algo``
    (:mod:`fedshift.runtime.dp_updates`' docstring), or None: one line naming the key."""
    weighting = algo.algorithm.weighting
    if weighting != "uniform":
        return (
            f"{UK} (DP-FedAvg) needs federation.weighting=uniform: the noise is calibrated "
            f"to the mean's sensitivity clip / (clients in the round), which weighting by "
            f"sample size ({weighting}) would raise to the largest site's share; set "
            "federation.weighting=uniform"
        )
    ups = [d for d in algo.disclosures(model) if d.direction == UP]
    if not any(d.record == WEIGHTS for d in ups):
        sent = ", ".join(sorted({repr(d.record) for d in ups})) or "nothing"
        return (
            f"{UK}: {algo.algorithm.name} sends no shared weights (it sends {sent}), and "
            "DP-FedAvg clips the weights record only; choose a method that sends its weights, "
            "or privacy.updates=none"
        )
    for d in ups:
        if d.when is When.SETUP:  # the setup exchange: privacy.epsilon's records or refused
            continue
        if d.record == WEIGHTS and d.kind is Kind.PARAMETERS:
            if not d.summed:
                return (
                    f"{UK}: {d.source}'s server reads each site's weights, not only their "
                    "mean (its aggregate is not declared sums_only), so the noise on the mean "
                    "does not cover it; choose a method that averages the weights, or "
                    "privacy.updates=none"
                )
            continue
        if d.needs_protection and d.clip is not None and d.summed:
            continue  # a statistic privacy.epsilon protects, averaged by the server
        return (
            f"{UK}: {d.source or 'the method'} sends record {d.record!r} ({d.kind}) besides "
            "the weights, which DP-FedAvg's clipping does not bound and privacy.epsilon does "
            "not protect; choose a method whose replies are its weights (and protected "
            "statistics), or privacy.updates=none"
        )
    return None


def _refusal(d: Disclosure) -> str:
    why = d.unprotectable or "its component gives no per-example bound for it"
    return (
        f"config key 'privacy.epsilon': {d.source or 'the method'} sends record {d.record!r} "
        f"({d.kind}, over one {d.over}), which it cannot protect: {why}; remove "
        "privacy.epsilon or choose another method (`fedshift privacy show` lists the records)"
    )


def plan_privacy(
    cfg: RunConfig,
    declared: list[Disclosure],
    input_shape: tuple[int, int, int],
    sites: dict[str, int] | None = None,
) -> Plan | None:
    """The budget of ``cfg`` for the records ``declared`` (the composition's, with their
    sources), or None when ``privacy.epsilon`` is off (module docstring). ``sites``: each
    training site's number of training examples (``privacy.updates=example`` needs them)."""
    p = cfg.privacy
    if p.epsilon is None:
        return None
    data = [d for d in declared if d.needs_protection]
    for d in data:
        if d.clip is None:
            raise ConfigError(_refusal(d))
    if not data and p.updates == "none":
        raise ConfigError(
            f"config key 'privacy.epsilon': {cfg.algorithm.name} shares no statistic of a "
            "site's examples beyond model weights, and privacy.epsilon protects shared "
            "statistics, not weights: it would protect nothing; remove it, or protect the "
            "weights too with privacy.updates=client"
        )
    names = {d.record for d in data}
    unknown = sorted(set(p.clip) - names)
    if unknown:
        raise ConfigError(
            f"config key 'privacy.clip.{unknown[0]}': the run protects no record of that "
            f"name; its protected records: {sorted(names)}"
        )
    rounds = cfg.train.rounds
    records = tuple(
        RecordPlan(
            record=d.record, source=d.source, when=d.when,
            clip=float(p.clip.get(d.record, d.clip(input_shape))),  # type: ignore[misc]
            default_clip=d.record not in p.clip,
            releases=RecordPlan(d.record, d.source, d.when, 0, True, 0).released_after(rounds),
        )
        for d in data
    )  # fmt: skip
    releases = sum(r.releases for r in records)
    share = p.stats_share if p.updates == "example" else 1.0  # DP-SGD takes the rest
    sigma = noise_multiplier(share * p.epsilon, p.delta, releases) if releases else 0.0
    updates = example = None
    if p.updates == "client":
        z = noise_multiplier(p.epsilon, p.delta, rounds, "the weights (privacy.updates)")
        updates = UpdatePlan("client", float(p.update_clip), z, rounds)
    if p.updates == "example":
        if sites is None:
            raise ValueError("plan_privacy: privacy.updates=example needs the sites' sizes")
        stats = ((sigma, 1.0, releases),) if releases else ()
        plans = []
        for name, n in sites.items():
            q, steps = sample_rate(cfg.train.batch_size, n), round_steps(n, cfg.train)
            z = dpsgd_noise_multiplier(p.epsilon, p.delta, q, steps * rounds, stats)
            plans.append(SiteSGD(name, n, q, steps, z))
        example = ExamplePlan(float(p.update_clip), tuple(plans), rounds, share)
    return Plan(p.epsilon, p.delta, sigma, rounds, records, cfg.seed, updates, example)
