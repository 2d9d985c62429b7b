"""The round metric row (:mod:`fedshift.core.rows`): the keys ``metrics.jsonl`` has always
held, in the order it has always written them, built in one place."""

from __future__ import annotations

import json

import pytest

from fedshift.core.rows import as_kind, metric_row, scores_of

SCORES = {"global": {"val_acc": 0.5, "test_acc": 0.25}, "personal": {"val_acc": 1.0}}


@pytest.mark.parametrize(
    ("kwargs", "line"),
    [
        # a training client, scored
        ({"train": {"train_loss": 0.5, "steps": 2}, "scores": SCORES},
         '{"round": 3, "client": "c1", "train_loss": 0.5, "global": {"val_acc": 0.5, '
         '"test_acc": 0.25}, "personal": {"val_acc": 1.0}}'),
        # held out: never trains, scored
        ({"holdout": True, "scores": {"global": {"val_acc": 0.5}}},
         '{"round": 3, "client": "c1", "holdout": true, "global": {"val_acc": 0.5}}'),
        # not sampled this round; its reply had no train_loss
        ({"train": {}, "scores": {"personal": {"val_acc": 1.0}}},
         '{"round": 3, "client": "c1", "train_loss": null, "personal": {"val_acc": 1.0}}'),
        # lost: no answer to the evaluation
        ({"train": {"train_loss": 0.5}},
         '{"round": 3, "client": "c1", "train_loss": 0.5, "lost": true}'),
        ({"holdout": True}, '{"round": 3, "client": "c1", "holdout": true, "lost": true}'),
    ],
)  # fmt: skip
def test_metric_row_keys_and_order(kwargs, line):
    """The JSON line of each kind of row, byte for byte as ``metrics.jsonl`` holds it."""
    assert json.dumps(metric_row(3, "c1", **kwargs)) == line


def test_scores_of_and_kinds():
    row = metric_row(1, "c1", scores={"global": {"val_acc": 0.5}})
    assert scores_of(row, "global") == {"val_acc": 0.5}
    assert scores_of(row, "personal") is None
    assert scores_of(metric_row(1, "c1"), "global") is None  # lost
    with pytest.raises(ValueError, match="'local' is not one of"):
        as_kind("local")
    with pytest.raises(ValueError):
        metric_row(1, "c1", scores={"local": {}})
