"""FedProto (Tan et al., "FedProto: Federated Prototype Learning across Heterogeneous
Clients", AAAI 2022).

Clients and server exchange class *prototypes* instead of model weights:

* local prototype of class j on client i: the mean embedding of its class-j training data,
  C_i^(j) = 1/|D_ij| sum_{(x, y) in D_ij} f_i(x)   (the paper's local-prototype equation);
* global prototype: the average of the clients' prototypes of class j, weighted by their
  sample counts |D_ij| (the paper's aggregation equation; weights |D_ij| / N_j);
* local objective: cross-entropy + lam * R, where R pulls each example's embedding towards
  the global prototype of its class: R = 1/B sum_i ||f(x_i) - C_bar^(y_i)||^2 (examples of
  a class without a global prototype contribute 0). In round 1 there are no prototypes yet.

As in the paper (and its released code) model weights are never averaged: every client
keeps its whole model (all state-dict keys are client-local, like ``local``) and is
evaluated with it; only ``prototypes`` (classes x dim, plus per-class counts) go up and
``global_protos`` (classes x dim, plus a mask of the classes that have one) come down.
``share_weights=true`` additionally averages the weights FedAvg-style (then ``bn_policy``
applies); this is not the paper's method.

Released-code options (yuetan031/FedProto):
* ``reg="mse"``: ``nn.MSELoss`` between embeddings and prototypes, i.e. R divided by the
  embedding dimension (mean over batch and dimensions);
* ``aggregation="released"``: unweighted mean over the clients that hold the class;
* ``prototypes="released"``: the mean of the embeddings computed during local training
  (training mode, every batch of every local epoch) instead of one pass over the training
  data with the trained model in evaluation mode (default, the paper's definition).

The paper also classifies by the nearest global prototype; fedshift's evaluation uses each
client's classifier head (the paper's and code's "w/o protos" numbers).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F

from fedshift.algorithms.base import Algorithm, FLParams, Reply, State
from fedshift.algorithms.bn import bn_keys
from fedshift.algorithms.state import StateVar, replaced, server_var
from fedshift.algorithms.tensors import subset
from fedshift.core.bounds import bounded
from fedshift.core.config import TrainConfig
from fedshift.core.context import ClientContext
from fedshift.core.disclosure import DOWN, UP, Disclosure, Kind, Over, Site, To, When, fixed
from fedshift.core.errors import ConfigError, TrainingError
from fedshift.core.payload import Payload, Tensors
from fedshift.models.base import FedModel

#: ``ctx.scratch`` keys of one local update: the received global prototypes and their mask
#: (None in round 1), and with ``prototypes=released`` the number of classes and the running
#: per-class (sums, counts) of the embeddings seen while training (None before the first step)
GLOBAL_PROTOS = "fedproto/global"
COLLECT = "fedproto/collect"
SEEN = "fedproto/seen"


@dataclass
class FedProtoParams(FLParams):
    lam: float = bounded(
        1.0, ge=0
    )  # weight of the prototype regulariser (the released code's default 1)
    # "sq_l2": 1/B sum_i ||f(x_i) - C_bar^(y_i)||^2; "mse": the same / embedding dimension
    reg: Literal["sq_l2", "mse"] = "sq_l2"
    # "paper": count-weighted mean per class; "released": unweighted mean over clients
    aggregation: Literal["paper", "released"] = "paper"
    # "paper": one eval-mode pass after training; "released": embeddings seen while training
    prototypes: Literal["paper", "released"] = "paper"
    # also average model weights (FedAvg + prototypes); not the paper's method
    share_weights: bool = False


def class_sums(
    z: torch.Tensor, y: torch.Tensor, num_classes: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-class sums of the rows of ``z`` and per-class counts."""
    sums = torch.zeros(num_classes, z.shape[1], dtype=torch.float64, device=z.device)
    sums.index_add_(0, y, z.detach().double())
    counts = torch.bincount(y, minlength=num_classes).double()
    return sums, counts


def means_from_sums(sums: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    return (sums / counts.clamp(min=1)[:, None]).float()


def aggregate_prototypes(
    items: list[tuple[torch.Tensor, torch.Tensor]], weighting: str = "paper"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Global prototypes from (prototypes (C, d), counts (C,)) per client: per class the
    count-weighted mean (``paper``) or the plain mean over the clients holding the class
    (``released``). Returns (prototypes, total weight per class); weight 0 = no prototype."""
    acc = torch.zeros_like(items[0][0], dtype=torch.float64)
    total = torch.zeros(items[0][0].shape[0], dtype=torch.float64)
    for protos, counts in items:
        c = counts.double().cpu()
        w = c if weighting == "paper" else (c > 0).double()
        acc += w[:, None].to(acc.device) * protos.double()
        total += w
    out = acc / total.clamp(min=1e-12)[:, None].to(acc.device)
    return out.float(), total


def prototype_regulariser(
    z: torch.Tensor,
    y: torch.Tensor,
    protos: torch.Tensor,
    mask: torch.Tensor,
    form: str = "sq_l2",
) -> torch.Tensor:
    """R = 1/B sum_i [class y_i has a prototype] ||z_i - C_bar^(y_i)||^2 (``sq_l2``), or that
    divided by the embedding dimension (``mse``: the released ``nn.MSELoss``)."""
    has = mask[y].to(z.dtype)
    sq = ((z - protos[y].detach()) ** 2).sum(1) * has
    reg = sq.sum() / z.shape[0]
    return reg / z.shape[1] if form == "mse" else reg


class FedProto(Algorithm[FedProtoParams]):
    """Federated prototype learning: personal models, shared class prototypes."""

    name = "fedproto"
    tasks = ("classification",)  # its objective needs one label per image
    Params = FedProtoParams

    @classmethod
    def check(cls, params: FedProtoParams, train: TrainConfig) -> None:
        if not params.share_weights and params.bn_policy != "global":
            raise ConfigError(
                "algorithm 'fedproto' keeps every weight on its client (no weights are "
                "averaged), so 'algorithm.bn_policy' has no effect; set "
                "algorithm.share_weights=true to average weights with that BN policy"
            )

    def compute_local_keys(self, model: FedModel) -> list[str]:
        if self.params.share_weights:
            return bn_keys(model, self.params.bn_policy)
        return list(model.state_dict())

    @property
    def has_personal_model(self) -> bool:
        return bool(self.local_keys)

    # -- server ----------------------------------------------------------------------------
    def server_vars(self) -> list[StateVar]:
        share = self.params.share_weights
        return [
            *replaced(super().server_vars(), "weights", reduce="mean" if share else "none"),
            server_var("protos", None, doc="the global prototype of each class (after round 1)"),
            server_var("proto_weight", None, doc="the examples behind each class's prototype"),
        ]  # fmt: skip

    def disclosures(self, model: FedModel) -> list[Disclosure]:
        k, d = prototype_shape(model)
        weights = self.weights_disclosures(model) if self.params.share_weights else []
        how = "during training" if self.params.prototypes == "released" else "after training"
        return [
            *weights,
            Disclosure("prototypes", UP, Kind.STATISTIC, When.ROUND, fixed(k * (d + 1) * 4),
                       f"the site's mean embedding per class ({how}) and its examples per "
                       "class", to=To.AGGREGATE, over=Over.CLASS,
                       count=rarest_class_seen if self.params.prototypes == "released" else None,
                       unprotectable="computed with the model the site trained on its own "
                       "data, which privacy.epsilon does not protect: clipping each example's "
                       "features cannot bound the record's sensitivity (issue 53 item 2, DP "
                       "training, is not built)"),
            Disclosure("global_protos", DOWN, Kind.STATISTIC, When.ROUND, fixed(k * (d * 4 + 1)),
                       "the sites' prototypes averaged per class, and which classes have one",
                       carries=("prototypes",), maybe="after the first aggregation"),
        ]  # fmt: skip

    def broadcast(self, server: State, rnd: int, cid: str) -> Payload:
        records: dict[str, Tensors] = {}
        if self.params.share_weights:
            records["weights"] = subset(server["weights"], self.shared_keys)
        if server["protos"] is not None:
            records["global_protos"] = {
                "protos": server["protos"],
                "mask": server["proto_weight"] > 0,
            }
        return Payload(records)

    def aggregate(self, server: State, rnd: int, replies: list[Reply]) -> None:
        self.aggregate_declared(server, replies)  # share_weights: the weights' mean
        items = [(p["prototypes"]["protos"], p["prototypes"]["counts"]) for _, p in replies]
        protos, weight = aggregate_prototypes(items, self.params.aggregation)
        if server["protos"] is None:
            server["protos"], server["proto_weight"] = protos, weight
        else:  # classes nobody sampled this round keep their previous prototype
            seen = weight > 0
            server["protos"][seen] = protos[seen]
            server["proto_weight"][seen] = weight[seen]

    # -- client ----------------------------------------------------------------------------
    def local_update(self, ctx: ClientContext, down: Payload, state: State) -> Payload:
        shared = down["weights"] if self.params.share_weights else {}
        self.load_client_model(ctx, shared, state)
        gp = down.records.get("global_protos")
        ctx.scratch[GLOBAL_PROTOS] = (
            None if gp is None else (gp["protos"].to(ctx.device), gp["mask"].to(ctx.device))
        )
        num_classes = self._num_classes(ctx)
        collect = self.params.prototypes == "released"
        ctx.scratch[COLLECT] = num_classes if collect else None
        ctx.scratch[SEEN] = None
        try:
            steps, loss = self.local_train(ctx, state)
            if collect:
                seen = ctx.scratch[SEEN]
                if seen is None:
                    raise TrainingError(f"fedproto: client {ctx.cid!r} took no training step")
                sums, counts = seen
            else:
                sums, counts = self.local_class_sums(ctx, num_classes)
        finally:
            for key in (GLOBAL_PROTOS, COLLECT, SEEN):
                ctx.scratch.pop(key, None)
        self.keep_local(ctx, state)
        records: dict[str, Tensors] = {
            "prototypes": {
                "protos": means_from_sums(sums, counts).cpu(),
                "counts": counts.float().cpu(),
            }
        }
        if self.params.share_weights:
            records["weights"] = self.shared_weights(ctx)
        return self.reply(ctx, state, steps, loss, records)

    @staticmethod
    def _num_classes(ctx: ClientContext) -> int:
        head = ctx.model.classifier
        if isinstance(head, torch.nn.Linear):
            return head.out_features
        raise TrainingError("fedproto needs a model whose classifier is a torch.nn.Linear")

    @torch.no_grad()
    def local_class_sums(
        self, ctx: ClientContext, num_classes: int, batch: int = 500
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-class embedding sums and counts over the client's training data, with the
        trained model in evaluation mode and the evaluation input pipeline."""
        model, split = ctx.model, ctx.data.train
        was_training = model.training
        model.eval()
        sums, counts = None, None
        for s in range(0, len(split), batch):
            x = ctx.pipeline.eval(split.x[s : s + batch].to(ctx.device), ctx.state)
            y = split.y[s : s + batch].to(ctx.device)
            bs, bc = class_sums(model.features(x), y, num_classes)
            sums = bs if sums is None else sums + bs
            counts = bc if counts is None else counts + bc
        model.train(was_training)
        assert sums is not None and counts is not None
        return sums, counts

    def loss(self, ctx: ClientContext, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Cross-entropy + lam * prototype regulariser (+ ``penalty``), with the round's
        global prototypes from ``ctx.scratch`` (none: no regulariser); with
        ``prototypes=released`` the batch's embeddings are added to the round's running
        per-class sums there."""
        if y.ndim != 1:
            raise TrainingError(
                "fedproto needs integer labels, but an augment produced soft labels"
            )
        z = ctx.model.features(x)
        loss = F.cross_entropy(ctx.model.head(z), y)
        collect = ctx.scratch.get(COLLECT)
        if collect is not None:
            sums, counts = class_sums(z, y, collect)
            seen = ctx.scratch.get(SEEN)
            if seen is not None:
                sums, counts = sums + seen[0], counts + seen[1]
            ctx.scratch[SEEN] = (sums, counts)
        glob = ctx.scratch.get(GLOBAL_PROTOS)
        if glob is not None and self.params.lam:
            protos, mask = glob
            loss = loss + self.params.lam * prototype_regulariser(
                z, y, protos, mask, self.params.reg
            )
        extra = self.penalty(ctx)
        return loss if extra is None else loss + extra

    # -- evaluation ------------------------------------------------------------------------
    def global_weights(self, server: State) -> Tensors | None:
        return server["weights"] if self.has_global_model else None


def prototype_shape(model: FedModel) -> tuple[int, int]:
    """(classes, embedding dimension) of a prototype table: the classifier's shape."""
    head = model.classifier
    if not isinstance(head, torch.nn.Linear):
        raise TrainingError("fedproto needs a model whose classifier is a torch.nn.Linear")
    return head.out_features, head.in_features


def rarest_class_seen(site: Site) -> int:
    """Examples behind the prototype of the site's rarest class when prototypes are taken
    from the training batches (FPL, ``prototypes="released"``): its count when the round
    covers a whole epoch, else 1 (a partial epoch may draw one example of a class)."""
    if site.steps >= site.steps_per_epoch:
        return min((c for c in site.class_counts or () if c), default=site.examples)
    return 1
