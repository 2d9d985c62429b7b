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
* gives each protecting component its records' :class:`~fedshift.core.privacy.Mechanism`.

The plan is a function of the config alone, so a resumed run plans the same noise and
spends the same budget as an uninterrupted one; an extension (``--resume DIR
train.rounds=N``) that would release a record more often than the plan covers stops before
its first new round (:meth:`Plan.check_rounds`). ``summary.json`` records the plan and the
epsilon spent per record and in all (:meth:`Plan.summary`).
"""

from __future__ import annotations

from dataclasses import dataclass

from fedshift.core.config import RunConfig
from fedshift.core.disclosure import Disclosure, When
from fedshift.core.errors import ConfigError
from fedshift.core.privacy import Mechanism, epsilon_spent, noise_multiplier

__all__ = ["Plan", "RecordPlan", "plan_privacy"]


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

    @property
    def mechanisms(self) -> dict[str, Mechanism]:
        return {r.record: Mechanism(r.record, r.clip, self.sigma, self.seed) for r in self.records}

    @property
    def planned_releases(self) -> int:
        return sum(r.releases for r in self.records)

    def check_rounds(self, rounds: int) -> None:
        """Refuse to run to ``rounds`` when a record would then be released more often than
        the budget was planned for (an extension of a run that protects a per-round record)."""
        over = [r for r in self.records if r.released_after(rounds) > r.releases]
        if over:
            spent = epsilon_spent(self.sigma, sum(r.released_after(rounds) for r in self.records),
                                  self.delta)  # fmt: skip
            raise ConfigError(
                f"train.rounds={rounds}: the privacy budget (privacy.epsilon={self.epsilon:g}, "
                f"delta {self.delta:g}) was planned for {self.rounds} rounds; record(s) "
                f"{', '.join(repr(r.record) for r in over)} would be released again and the "
                f"run would spend epsilon {spent:.3g}: the run stops before round "
                f"{self.rounds + 1}. Start a new run with the rounds and budget you want"
            )

    def summary(self, rounds: int) -> dict:
        """``summary.json``'s ``privacy``: the plan and the epsilon spent after ``rounds``
        rounds by a site that took part in every round (an upper bound for sampled sites)."""
        per = {r.record: r.released_after(rounds) for r in self.records}
        return {
            "epsilon": self.epsilon,
            "delta": self.delta,
            "accountant": "opacus rdp (sampling rate 1)",
            "noise_multiplier": self.sigma,
            "planned_rounds": self.rounds,
            "records": {
                r.record: {
                    "component": r.source,
                    "clip": r.clip,
                    "clip_default": r.default_clip,
                    "releases": per[r.record],
                    "epsilon_spent": epsilon_spent(self.sigma, per[r.record], self.delta),
                }
                for r in self.records
            },
            "releases": sum(per.values()),
            "epsilon_spent": epsilon_spent(self.sigma, sum(per.values()), self.delta),
            "not_covered": "model weights and updates",
        }


def _refusal(d: Disclosure) -> str:
    why = d.unprotectable or "its component gives no per-example bound for it"
    return (
        f"config key 'privacy.epsilon': {d.source or 'the method'} sends record {d.record!r} "
        f"({d.kind}, over one {d.over}), which it cannot protect: {why}; remove "
        "privacy.epsilon or choose another method (`fedshift privacy show` lists the records)"
    )


def plan_privacy(
    cfg: RunConfig, declared: list[Disclosure], input_shape: tuple[int, int, int]
) -> Plan | None:
    """The budget of ``cfg`` for the records ``declared`` (the composition's, with their
    sources), or None when ``privacy.epsilon`` is off (module docstring)."""
    p = cfg.privacy
    if p.epsilon is None:
        return None
    data = [d for d in declared if d.needs_protection]
    for d in data:
        if d.clip is None:
            raise ConfigError(_refusal(d))
    if not data:
        raise ConfigError(
            f"config key 'privacy.epsilon': {cfg.algorithm.name} shares no statistic of a "
            "site's examples beyond model weights, and privacy.epsilon protects shared "
            "statistics, not weights: it would protect nothing; remove it"
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
    sigma = noise_multiplier(p.epsilon, p.delta, releases)
    return Plan(p.epsilon, p.delta, sigma, rounds, records, cfg.seed)
