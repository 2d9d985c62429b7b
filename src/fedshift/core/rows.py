"""The round metric row: one evaluated (round, client) of a run, as ``metrics.jsonl`` holds it
(one JSON object a line), ``checkpoint.pt`` keeps it (``records``) and model selection,
early stopping, the plots, the trackers and the report read it.

A :data:`MetricRow` is a ``TypedDict``: a plain dict at run time (JSON and
``torch.load(weights_only=True)`` read it back as it was written, the same keys in the same
order), its keys and their types known to the type checker. Its keys, in the order a row is
built (:func:`metric_row`), each only where it applies:

* ``round`` (int) and ``client`` (str): always;
* ``holdout`` (True): the client never trains (``federation.holdout``): scored, left out of
  model selection and the means;
* ``train_loss`` (float or None): the client trained this round (its mean local loss);
* ``global`` / ``personal`` (:data:`ModelScores`: ``val_<metric>`` / ``test_<metric>`` ->
  value): the scores of each evaluated model kind, in the order the client answered;
* ``lost`` (True): the client did not answer the evaluation (no scores).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, Required, TypedDict

__all__ = ["KINDS", "Kind", "MetricRow", "ModelScores", "as_kind", "metric_row", "scores_of"]

#: a model kind a run evaluates: the server's global model or each client's own
Kind = Literal["global", "personal"]
KINDS: tuple[Kind, ...] = ("global", "personal")
#: one model kind's scores of one client: ``val_acc``, ``test_acc``, ``test_loss``...
ModelScores = dict[str, float]

# the functional form: ``global`` is a Python keyword
MetricRow = TypedDict(
    "MetricRow",
    {
        "round": Required[int],
        "client": Required[str],
        "holdout": bool,
        "train_loss": float | None,
        "global": ModelScores,
        "personal": ModelScores,
        "lost": bool,
    },
    total=False,
)


def as_kind(kind: str) -> Kind:
    """``kind`` as a :data:`Kind`; a name that is not one is a ValueError (a bug: the kinds
    come from the run's experiment)."""
    if kind == "global":
        return "global"
    if kind == "personal":
        return "personal"
    raise ValueError(f"model kind {kind!r} is not one of {KINDS}")


def metric_row(
    rnd: int,
    client: str,
    *,
    holdout: bool = False,
    train: Mapping[str, Any] | None = None,
    scores: Mapping[str, ModelScores] | None = None,
) -> MetricRow:
    """The row of ``client`` at round ``rnd``: ``train``, its reply's metrics when it trained
    this round (None: it did not); ``scores``, its answer to the evaluation by model kind
    (None: it did not answer, the row says ``lost``)."""
    row: MetricRow = {"round": rnd, "client": client}
    if holdout:
        row["holdout"] = True
    if train is not None:
        row["train_loss"] = train.get("train_loss")
    if scores is None:
        row["lost"] = True
    else:
        for kind, values in scores.items():
            row[as_kind(kind)] = values
    return row


def scores_of(row: MetricRow, kind: str) -> ModelScores | None:
    """The ``kind`` model's scores in ``row`` (None: not scored, a lost client)."""
    return row.get(as_kind(kind))
