"""Early stopping: where a run with ``train.patience`` stops (issue 50).

``train.rounds`` stays the most rounds a run trains. With ``train.patience=P`` the run stops
after the first scheduled evaluation (a round that is a multiple of ``eval.every``) at which

* the best mean validation score so far (the curve model selection reads,
  :func:`~fedshift.eval.summary.val_curve`; "improved" means strictly higher, so a tie keeps
  the earlier round, as selection does) was reached ``P`` or more scheduled evaluations ago,
* and the round is at least ``train.min_rounds``.

The decision is a function of the metric rows alone, so a resumed run finds the same stop
(and a finished one, resumed or extended, trains no further), and a run that stops at round
``s`` has, up to ``s``, exactly the rows, selection and state of the fixed-length run of the
same config: nothing else changes. ``summary.json`` records ``stopped_at`` (the last round
trained) and ``stop_reason`` (``"patience"``, or ``"rounds"`` for a run that trained all its
rounds).
"""

from __future__ import annotations

from dataclasses import dataclass

from fedshift.core.config import RunConfig
from fedshift.core.rows import MetricRow
from fedshift.eval.summary import val_curve

__all__ = ["Stop", "patience_stop", "stop_of"]


@dataclass(frozen=True)
class Stop:
    """A run stopped by patience: after ``round``, whose best round was ``best_round``."""

    round: int
    best_round: int
    patience: int

    def describe(self, metric: str) -> str:
        return (
            f"stopped early after round {self.round}: validation {metric} has not improved "
            f"since round {self.best_round} ({self.patience} scheduled evaluations, "
            "train.patience)"
        )


def patience_stop(
    records: list[MetricRow],
    kind: str,
    metric: str,
    every: int,
    patience: int | None,
    min_rounds: int = 0,
) -> Stop | None:
    """The first scheduled evaluation at which a run with ``patience`` stops (module
    docstring), over the metric rows ``records`` of the ``kind`` model; None: it does not
    stop within these rows (or ``patience`` is None)."""
    if patience is None:
        return None
    curve = {rnd: v for rnd, v in val_curve(records, kind, metric).items() if rnd % every == 0}
    best_round, best, since = 0, float("-inf"), 0
    for rnd, value in curve.items():
        if value > best:
            best_round, best, since = rnd, value, 0
        else:
            since += 1
        if since >= patience and rnd >= min_rounds:
            return Stop(rnd, best_round, patience)
    return None


def stop_of(cfg: RunConfig, records: list[MetricRow], kind: str, metric: str) -> Stop | None:
    """:func:`patience_stop` with the run config's ``train.patience``, ``train.min_rounds``
    and ``eval.every``."""
    t = cfg.train
    return patience_stop(records, kind, metric, cfg.eval.every, t.patience, t.min_rounds)
