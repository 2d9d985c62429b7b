"""FPL: Federated Prototypes Learning (Huang, Ye, Shi, Li, Du, "Rethinking Federated Learning
with Domain Shift: A Prototype View", CVPR 2023).

FedAvg whose local objective pulls each embedding towards prototypes that the server builds
from the clients' class prototypes. The paper's text was not obtainable offline: the
elements below are named after the paper's sections (Cluster Prototypes Contrastive
Learning, CPCL; Unbiased Prototypes Consistent Regularization, UPCR; equation numbers
unverified) and their exact form is taken from the released code (WenkeHuang/RethinkFL,
``models/fpl.py``, ``utils/finch.py``):

* local prototype of class k on client m: the mean embedding f(x) of the class-k examples the
  client trained on during its LAST local epoch (training mode, the weights of each step);
  uploaded as record ``prototypes`` (classes x dim, plus the per-class counts; a class the
  client did not see has count 0 and is ignored by the server);
* cluster prototypes (server): per class, the clients' local prototypes are clustered with
  FINCH (Sarfraz et al., CVPR 2019; cosine distance, parameter-free) and each cluster's mean
  is one cluster prototype; the released code takes FINCH's coarsest partition
  (``partition=coarsest``, default), ``partition=first`` the first (finest) one. A class held
  by one client has that client's prototype as its only cluster prototype. They go down as
  record ``cluster_protos`` (M x dim, plus each one's class);
* unbiased prototype of class k: the mean of the class's cluster prototypes (each cluster
  counts once, whatever its size), computed by the client from ``cluster_protos``;
* local objective: CE + lam_cpcl * L_CPCL + lam_upcr * L_UPCR with, for an example (z, y)
  whose class has cluster prototypes P_y among all cluster prototypes P,

    L_CPCL = -log( sum_{p in P_y} exp(cos(z, p)/tau) / sum_{p in P} exp(cos(z, p)/tau) )
    L_UPCR = ||z - u_y||^2 / d          (the code's ``nn.MSELoss``: mean over the dimension)

  both summed over the batch's examples whose class has prototypes and divided by the batch
  size (the code's per-sample loop). The code adds both with weight 1 (defaults). Round 1
  (no prototypes yet): CE only;
* the model is averaged FedAvg-style, weighted by the clients' sample counts (the code's
  ``--averaing weight``); ``bn_policy`` applies as for FedAvg.

Defaults from the released code: tau = 0.02 (``infoNCET``). The code's global prototypes are
rebuilt every round from that round's clients only; so are fedshift's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F

from fedshift.algorithms.base import FLParams, Reply, State
from fedshift.algorithms.fedavg import FedAvg
from fedshift.algorithms.fedproto import (
    FedProto,
    class_sums,
    means_from_sums,
    prototype_regulariser,
    prototype_shape,
    rarest_class_seen,
)
from fedshift.algorithms.local_train import last_epoch_start
from fedshift.algorithms.state import StateVar, server_var
from fedshift.core.bounds import bounded
from fedshift.core.context import ClientContext
from fedshift.core.disclosure import DOWN, UP, Disclosure, Kind, Over, To, When, fixed
from fedshift.core.errors import TrainingError
from fedshift.core.payload import Payload, Tensors
from fedshift.models.base import FedModel

#: ``ctx.scratch`` keys of one local update: the received cluster prototypes (protos (M, d),
#: their classes (M,), unbiased prototypes (C, d) and the mask of classes that have one; None
#: in round 1), the number of classes, the step counter, the first step of the last epoch
#: and the running per-class (sums, counts) of that epoch's embeddings
CLUSTERS = "fpl/clusters"
NUM_CLASSES = "fpl/num_classes"
STEP = "fpl/step"
LAST_EPOCH_FROM = "fpl/last_epoch_from"
SEEN = "fpl/seen"


@dataclass
class FPLParams(FLParams):
    tau: float = bounded(0.02, gt=0)  # CPCL temperature (released ``infoNCET``)
    lam_cpcl: float = bounded(1.0, ge=0)  # weight of L_CPCL (code: 1)
    lam_upcr: float = bounded(1.0, ge=0)  # weight of L_UPCR (code: 1)
    # FINCH partition whose clusters are the cluster prototypes (code: the coarsest)
    partition: Literal["coarsest", "first"] = "coarsest"


# ----------------------------------------------------------------------------- FINCH
def _components(n: int, edges: list[tuple[int, int]]) -> np.ndarray:
    """Connected-component labels 0..K-1 (numbered in order of first appearance)."""
    parent = list(range(n))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for a, b in edges:
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)
    roots = [find(i) for i in range(n)]
    relabel: dict[int, int] = {}
    return np.array([relabel.setdefault(r, len(relabel)) for r in roots], dtype=np.int64)


def first_neighbour_partition(points: np.ndarray) -> np.ndarray:
    """One FINCH step (Sarfraz et al., CVPR 2019, Eq. 1): with kappa(i) the first neighbour of
    row i by cosine distance, i and j are linked when j = kappa(i), i = kappa(j) or
    kappa(i) = kappa(j); the clusters are the connected components of these links. Ties go
    to the lowest index."""
    n = points.shape[0]
    if n == 1:
        return np.zeros(1, dtype=np.int64)
    unit = points / np.maximum(np.linalg.norm(points, axis=1, keepdims=True), 1e-12)
    dist = 1.0 - unit @ unit.T
    np.fill_diagonal(dist, np.inf)
    kappa = dist.argmin(axis=1)
    edges = [(i, int(kappa[i])) for i in range(n)]
    # kappa(i) = kappa(j): both are linked to kappa(i) already, so the components agree
    return _components(n, edges)


def finch(points: np.ndarray) -> list[np.ndarray]:
    """FINCH's partitions of the rows of ``points``, finest first: the first-neighbour
    partition of the points, then of the clusters' means (means of the original points),
    recursively, as long as a step merges clusters and leaves more than one (a step that
    would leave one cluster is dropped, as in the reference ``utils/finch.py`` with
    ``ensure_early_exit=False``; the first partition is always kept, even if it is one
    cluster)."""
    data = np.asarray(points, dtype=np.float64)
    labels = first_neighbour_partition(data)
    partitions = [labels]
    while True:
        k = int(labels.max()) + 1
        means = np.stack([data[labels == c].mean(0) for c in range(k)])
        merged = first_neighbour_partition(means)[labels]
        k_new = int(merged.max()) + 1
        if k_new == 1 or k_new >= k:
            return partitions
        partitions.append(merged)
        labels = merged


def cluster_prototypes(protos: torch.Tensor, partition: str = "coarsest") -> torch.Tensor:
    """The cluster prototypes of one class from its clients' prototypes (rows): the means of
    FINCH's clusters (``coarsest`` or ``first`` partition); one row is its own cluster."""
    if protos.shape[0] == 1:
        return protos.clone()
    parts = finch(protos.double().cpu().numpy())
    labels = torch.from_numpy(parts[-1] if partition == "coarsest" else parts[0]).to(protos.device)
    k = int(labels.max()) + 1
    out = torch.stack([protos.double()[labels == c].mean(0) for c in range(k)])
    return out.to(protos.dtype)


# ----------------------------------------------------------------------------- the losses
def cpcl_loss(
    z: torch.Tensor, y: torch.Tensor, protos: torch.Tensor, labels: torch.Tensor, tau: float
) -> torch.Tensor:
    """L_CPCL summed over the examples whose class has cluster prototypes, divided by the
    batch size: -log(sum_{pos} exp(cos/tau) / sum_{all} exp(cos/tau)), several positives
    inside the log (computed with log-sum-exp)."""
    sims = F.cosine_similarity(z[:, None, :], protos[None, :, :].detach(), dim=-1) / tau
    pos = labels[None, :] == y[:, None]
    has = pos.any(1)
    # an example without positives gets every column as "positive" (loss 0, finite gradient)
    # and is then dropped from the sum
    pos = pos | ~has[:, None]
    log_pos = torch.logsumexp(sims.masked_fill(~pos, float("-inf")), dim=1)
    per = torch.logsumexp(sims, dim=1) - log_pos
    return (per * has.to(per.dtype)).sum() / z.shape[0]


def unbiased_prototypes(
    protos: torch.Tensor, labels: torch.Tensor, num_classes: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per class the plain mean of its cluster prototypes, and the mask of classes that
    have any."""
    sums = torch.zeros(num_classes, protos.shape[1], dtype=torch.float64, device=protos.device)
    sums.index_add_(0, labels, protos.double())
    counts = torch.bincount(labels, minlength=num_classes)
    return means_from_sums(sums, counts.double()), counts > 0


class FPL(FedAvg[FPLParams]):
    """FedAvg with cluster-prototype contrastive learning and unbiased-prototype consistency."""

    name = "fpl"
    tasks = ("classification",)  # prototypes are per class
    paper_weighting = "samples"  # released code: ``--averaing weight`` (sample counts)
    Params = FPLParams

    # -- server ----------------------------------------------------------------------------
    def server_vars(self) -> list[StateVar]:
        return [
            *super().server_vars(),
            server_var("clusters", None,
                       doc='{"protos": (M, d), "labels": (M,)} after the first round'),
        ]

    def disclosures(self, model: FedModel) -> list[Disclosure]:
        k, d = prototype_shape(model)
        return [
            *(self.weights_disclosures(model) if self.shared_keys else []),
            Disclosure("prototypes", UP, Kind.STATISTIC, When.ROUND, fixed(k * (d + 1) * 4),
                       "the site's mean embedding per class over its last local epoch, and its "
                       "examples per class; a cluster holding one site's prototype is sent on "
                       "as it is", to=To.CLIENTS, over=Over.CLASS, count=rarest_class_seen,
                       unprotectable="computed with the model the site trained on its own "
                       "data, which privacy.epsilon does not protect: clipping each example's "
                       "features cannot bound the record's sensitivity (issue 53 item 2, DP "
                       "training, is not built)"),
            Disclosure("cluster_protos", DOWN, Kind.STATISTIC, When.ROUND,
                       lambda s: s.num_sites * k * (d * 4 + 8),
                       "the per-class clusters (FINCH) of the sites' prototypes, with labels",
                       carries=("prototypes",), maybe="after the first aggregation",
                       exact=False),
        ]  # fmt: skip

    def broadcast(self, server: State, rnd: int, cid: str) -> Payload:
        down = super().broadcast(server, rnd, cid)
        if server["clusters"] is not None:
            down.records["cluster_protos"] = dict(server["clusters"])
        return down

    def aggregate(self, server: State, rnd: int, replies: list[Reply]) -> None:
        super().aggregate(server, rnd, replies)
        protos = torch.stack([p["prototypes"]["protos"] for _, p in replies])  # (K, C, d)
        counts = torch.stack([p["prototypes"]["counts"] for _, p in replies])  # (K, C)
        rows, labels = [], []
        for c in range(protos.shape[1]):
            held = protos[counts[:, c] > 0, c]
            if held.shape[0]:
                found = cluster_prototypes(held, self.params.partition)
                rows.append(found)
                labels.append(
                    torch.full((found.shape[0],), c, dtype=torch.long, device=found.device)
                )
        server["clusters"] = (
            {"protos": torch.cat(rows), "labels": torch.cat(labels)} if rows else None
        )

    # -- client ----------------------------------------------------------------------------
    def local_update(self, ctx: ClientContext, down: Payload, state: State) -> Payload:
        num_classes = FedProto._num_classes(ctx)
        got = down.records.get("cluster_protos")
        if got is None:
            ctx.scratch[CLUSTERS] = None
        else:
            protos, labels = got["protos"].to(ctx.device), got["labels"].to(ctx.device)
            unbiased, mask = unbiased_prototypes(protos, labels, num_classes)
            ctx.scratch[CLUSTERS] = (protos, labels, unbiased, mask)
        ctx.scratch[NUM_CLASSES] = num_classes
        ctx.scratch[STEP] = 0
        ctx.scratch[LAST_EPOCH_FROM] = last_epoch_start(ctx)
        ctx.scratch[SEEN] = None
        try:
            self.load_client_model(ctx, down["weights"], state)
            steps, loss = self.local_train(ctx, state)
            seen = ctx.scratch[SEEN]
            if seen is None:
                raise TrainingError(f"fpl: client {ctx.cid!r} took no training step")
        finally:
            for key in (CLUSTERS, NUM_CLASSES, STEP, LAST_EPOCH_FROM, SEEN):
                ctx.scratch.pop(key, None)
        self.keep_local(ctx, state)
        sums, counts = seen
        records: dict[str, Tensors] = {
            "prototypes": {
                "protos": means_from_sums(sums, counts).cpu(),
                "counts": counts.float().cpu(),
            }
        }
        if self.shared_keys:
            records["weights"] = self.shared_weights(ctx)
        return self.reply(ctx, state, steps, loss, records)

    def loss(self, ctx: ClientContext, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """CE + lam_cpcl * L_CPCL + lam_upcr * L_UPCR (+ ``penalty``) with the round's cluster
        prototypes from ``ctx.scratch``; during the last local epoch the batch's embeddings
        are added to the round's per-class sums (the local prototypes)."""
        if y.ndim != 1:
            raise TrainingError("fpl needs integer labels, but an augment produced soft labels")
        z = ctx.model.features(x)
        loss = F.cross_entropy(ctx.model.head(z), y)
        if NUM_CLASSES in ctx.scratch:
            step = ctx.scratch[STEP]
            ctx.scratch[STEP] = step + 1
            if step >= ctx.scratch[LAST_EPOCH_FROM]:
                sums, counts = class_sums(z, y, ctx.scratch[NUM_CLASSES])
                seen = ctx.scratch[SEEN]
                if seen is not None:
                    sums, counts = sums + seen[0], counts + seen[1]
                ctx.scratch[SEEN] = (sums, counts)
        clusters = ctx.scratch.get(CLUSTERS)
        if clusters is not None:
            protos, labels, unbiased, mask = clusters
            p = self.params
            if p.lam_cpcl:
                loss = loss + p.lam_cpcl * cpcl_loss(z, y, protos, labels, p.tau)
            if p.lam_upcr:
                loss = loss + p.lam_upcr * prototype_regulariser(z, y, unbiased, mask, "mse")
        extra = self.penalty(ctx)
        return loss if extra is None else loss + extra
