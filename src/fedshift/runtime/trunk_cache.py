"""A cached frozen trunk (``train.trunk_cache``): with ``train.trainable=head`` every tensor
of ``model.features`` is frozen and runs in evaluation mode, so an example's embedding is
the same in every round; where nothing else varies it per round (no augment, no stage hook)
each client's embeddings of its training examples are computed once, in this process, and
its rounds train the head on them (the model's ``head``, live: EfficientNet-Lite0's is
dropout, then the classifier).

While a client trains with the cache (:meth:`TrunkCache.active`), its context holds a copy
of its data whose training images are the cached embeddings, an input pipeline that passes
them through unchanged, and the working model's ``features`` is the identity: the local
update (any algorithm's) draws the same mini-batches from the same generator and sees the
embeddings where it would have computed them. The embeddings are computed in evaluation
batches, so they equal the recomputed ones up to float32 rounding of the batched
convolutions (tests/runtime/test_trunk_cache.py: the trained heads agree to a tolerance
derived from it); they are kept at full precision and never saved or sent. ``summary.json``
records under ``trainable.trunk_cache`` whether the trunk was cached, or why not.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, cast

import torch

from fedshift.core.context import ClientContext, InputPipeline
from fedshift.core.federation import ClientData, Split
from fedshift.core.model import FedModel

if TYPE_CHECKING:
    from fedshift.algorithms.base import Algorithm
    from fedshift.runtime.experiment import Experiment

__all__ = ["TrunkCache", "trainable_summary", "trunk_cache_refusal"]


def _identity(x: torch.Tensor) -> torch.Tensor:
    return x


def trunk_cache_refusal(exp: Experiment) -> str | None:
    """Why ``exp``'s clients cannot train on cached embeddings, or None when they can."""
    train = exp.train
    if not train.trunk_cache:
        return "train.trunk_cache=false"
    if train.trainable != "head":
        return f"train.trainable={train.trainable}: the trunk trains"
    model, algo = exp.model, cast("Algorithm", exp.algo.algorithm)
    if type(model).forward is not FedModel.forward:  # scores = head(features(x)) only
        return f"model {type(model).__name__} scores its inputs its own way"
    trained = [k for k in model.state_dict() if k not in set(algo.frozen.keys)]
    if any(not k.startswith("classifier.") for k in trained):
        return "tensors other than the classifier's train"
    if exp.augments:
        return "an augment transforms the inputs or the features"
    if model.stage_hooks:
        return "a stage hook acts on the features"
    if algo.trunk_cache_refusal is not None:
        return f"algorithm {algo.name!r} {algo.trunk_cache_refusal}"
    return None


class TrunkCache:
    """Each client's embeddings of its training examples, computed on first use (module
    docstring). Built by :meth:`of` (None when the run cannot use one)."""

    def __init__(self, exp: Experiment) -> None:
        self.exp = exp
        self.features: dict[str, torch.Tensor] = {}

    @classmethod
    def of(cls, exp: Experiment) -> TrunkCache | None:
        return cls(exp) if trunk_cache_refusal(exp) is None else None

    def _embed(self, data: ClientData, state: dict | None) -> torch.Tensor:
        model, exp = self.exp.model, self.exp
        x_all = data.train.x
        out = []
        was = model.training
        model.eval()
        try:
            with torch.no_grad():
                for start in range(0, len(data.train), exp.eval_batch_size):
                    x = x_all[start : start + exp.eval_batch_size].to(exp.device)
                    out.append(model.features(exp.pipeline.eval(x, state)))
        finally:
            model.train(was)
        return torch.cat(out)

    @contextmanager
    def active(self, ctx: ClientContext) -> Iterator[ClientContext]:
        """``ctx`` training on the cached embeddings (module docstring): yields the context
        to hand to ``local_update``; the working model's ``features`` is restored after."""
        cid = ctx.cid
        if cid not in self.features:
            self.features[cid] = self._embed(ctx.data, ctx.state)
        z = self.features[cid]
        data = dataclasses.replace(ctx.data, train=Split(z, ctx.data.train.y.to(z.device)))
        cached = dataclasses.replace(ctx, data=data, pipeline=InputPipeline([], _identity))
        model = ctx.model
        model.features = _identity  # type: ignore[method-assign]
        try:
            yield cached
        finally:
            del model.features


def trainable_summary(exp: Experiment, server: dict) -> dict | None:
    """``summary.json``'s ``trainable`` (None when every tensor trains): what trained and
    stayed frozen, checked against the run's models
    (:meth:`fedshift.algorithms.trainable.Frozen.at_end`), and whether the trunk was
    cached (or why not)."""
    out = cast("Algorithm", exp.algo.algorithm).frozen.at_end(server, exp.model)
    if out is None:
        return None
    why = trunk_cache_refusal(exp)
    out["trunk_cache"] = {"cached": True} if why is None else {"cached": False, "why": why}
    return out
