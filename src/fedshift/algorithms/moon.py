"""MOON (Li, He, Song, "Model-Contrastive Federated Learning", CVPR 2021).

FedAvg whose local objective adds a *model-contrastive* term. For an input x let z be the
representation of the model being trained, z_glob that of the global model the client received
this round and z_prev that of the client's own local model from its previous round (both
frozen). With cosine similarity sim and temperature tau:

  l_con = -log( exp(sim(z, z_glob)/tau) / (exp(sim(z, z_glob)/tau) + exp(sim(z, z_prev)/tau)) )
                                                                     (the paper's Eq. 2)
  l = CE(logits, y) + mu * l_con                                     (local objective, Eq. 3)

averaged over the mini-batch. Aggregation is FedAvg's; the global model is evaluated.

The representation. MOON's network is base encoder -> projection head -> output layer, and z
is the projection head's output (the output layer classifies z). ``projection=true`` (default,
the paper's network and the released ``ModelFedCon``) wraps the configured backbone:
``features(x) = proj(backbone.features(x))`` with proj = Linear(d, d) -> ReLU ->
Linear(d, projection_dim), and a new linear classifier on the projected z. The projection head
and the new classifier are ordinary weights: trained by both loss terms, sent and averaged.
``projection=false`` (the released ``use_project_head=0``) uses the backbone's embedding
``features(x)`` and its own classifier unchanged.

Facts from the released code (QinbinLi/MOON) that fix what the paper leaves open:

* the frozen global and previous models run in evaluation mode (BN running statistics, no
  augmenting layer hooks); fedshift evaluates them with the working model's modules via
  ``torch.func.functional_call`` and the frozen tensors;
* a client with no previous local model yet (its first round) has no negative: the logits
  are the positive similarity alone, so l_con = -log 1 = 0. (Using the received global model
  as z_prev instead gives l_con = log 2 with zero gradient, so training would be the same.)
* one previous model (``model_buffer_size=1``, the paper's setting); the FIFO pool of several
  previous models is not implemented.
* defaults tau = 0.5 and projection_dim = 256 (``--temperature``, ``--out_dim``). The paper's
  best mu is 5 on CIFAR-10 (also the README's simple-CNN example) and 1 on CIFAR-100 and
  Tiny-ImageNet (the code's ``--mu`` default); fedshift defaults to 5, the small-CNN,
  10-class setting closest to its digit benchmarks.

Segmentation (U-Net). The model's ``features`` are per-pixel maps (B, w, H, W); MOON's
projection head is defined for vectors, so on a segmentation dataset ``projection=false`` is
required and z is the flattened decoder output (every pixel's embedding, one vector per
image); the supervised term is the task's loss (the (CE + Dice) / 2 joint loss by default).
This adaptation is fedshift's: MOON's paper has no segmentation experiment.

z_glob uses the received shared tensors plus the client's own local tensors (``bn_policy``);
z_prev is the client's whole model after its last local update, kept in its state (never
sent).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from fedshift.algorithms.base import FLParams, State
from fedshift.algorithms.fedavg import FedAvg
from fedshift.algorithms.state import StateVar, client_var
from fedshift.algorithms.tensors import clone
from fedshift.core.bounds import bounded
from fedshift.core.context import ClientContext
from fedshift.core.errors import ConfigError
from fedshift.core.federation import Federation
from fedshift.core.payload import Payload, Tensors
from fedshift.models.base import FedModel

#: ``ctx.scratch`` keys of the round's frozen models: the received global model (with the
#: client's local tensors) and the client's previous local model (None in its first round)
GLOBAL = "moon/global"
PREVIOUS = "moon/previous"


@dataclass
class MOONParams(FLParams):
    # weight of l_con (paper: 5 on CIFAR-10, 1 on CIFAR-100/Tiny-ImageNet)
    mu: float = bounded(5.0, ge=0)
    tau: float = bounded(0.5, gt=0)  # temperature of l_con
    projection: bool = True  # the paper's projection head (z = its output)
    projection_dim: int = bounded(256, ge=1)  # output size of the projection head


def contrastive_loss(
    z: torch.Tensor, z_glob: torch.Tensor, z_prev: torch.Tensor | None, tau: float
) -> torch.Tensor:
    """Model-contrastive loss (Eq. 2), averaged over the batch (rows of ``z``).

    ``z_prev=None`` (no previous local model yet): only the positive logit, so the loss is 0,
    as in the released code's first round."""
    pos = F.cosine_similarity(z, z_glob, dim=-1)
    cols = [pos] if z_prev is None else [pos, F.cosine_similarity(z, z_prev, dim=-1)]
    logits = torch.stack(cols, dim=1) / tau
    target = torch.zeros(z.shape[0], dtype=torch.long, device=z.device)
    return F.cross_entropy(logits, target)


class ProjectedModel(FedModel):
    """A backbone with MOON's projection head between its embedding and a new classifier:
    ``features(x) = proj(backbone.features(x))``, ``head(z) = Linear(projection_dim, C)(z)``.

    The backbone's stages stay the stages (stage hooks and BN layers work as before); its
    embedding becomes ``embed.base`` and the projection ``embed.proj``."""

    def __init__(self, backbone: FedModel, projection_dim: int, num_classes: int) -> None:
        super().__init__()
        if type(backbone).features is not FedModel.features:
            raise ConfigError(
                f"algorithm 'moon': model {type(backbone).__name__} has its own features(); "
                "the projection head needs the standard stages -> embed layout "
                "(set algorithm.projection=false to use the model's embedding)"
            )
        dim = int(cast(nn.Linear, backbone.classifier).in_features)  # the standard layout
        self.stages = backbone.stages
        if "adapters" in backbone._modules:  # train.trainable=adapters: after the stages
            self.adapters = backbone.adapters
        proj = nn.Sequential(
            OrderedDict(
                fc1=nn.Linear(dim, dim),
                relu=nn.ReLU(inplace=True),
                fc2=nn.Linear(dim, projection_dim),
            )
        )
        self.embed = nn.Sequential(OrderedDict(base=backbone.embed, proj=proj))
        self.classifier = nn.Linear(projection_dim, num_classes)
        self._backbone_pool = backbone.before_flatten  # parameter-free (AlexNet's adaptive pool)

    def before_flatten(self, x: torch.Tensor) -> torch.Tensor:
        return self._backbone_pool(x)


class _Features(nn.Module):
    """``forward = model.features`` so that ``functional_call`` can run the embedding."""

    def __init__(self, model: FedModel) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model.features(x)


class MOON(FedAvg[MOONParams]):
    """FedAvg with the model-contrastive local objective."""

    name = "moon"
    paper_weighting = "samples"  # Li et al., CVPR 2021, Alg. 1: w = sum_i |D^i| / N w_i
    Params = MOONParams

    @classmethod
    def wrap_model(cls, params: MOONParams, model: FedModel, federation: Federation) -> FedModel:
        if not params.projection:
            return model
        if federation.task == "segmentation":
            raise ConfigError(
                "algorithm 'moon' on a segmentation dataset contrasts the flattened per-pixel "
                "features; the projection head is for vector embeddings: set "
                "algorithm.projection=false"
            )
        if not isinstance(getattr(model, "classifier", None), nn.Linear):
            raise ConfigError(
                "algorithm 'moon' with projection=true needs a model whose classifier is a "
                "torch.nn.Linear (set algorithm.projection=false otherwise)"
            )
        return ProjectedModel(model, params.projection_dim, federation.num_classes)

    def client_vars(self) -> list[StateVar]:
        return [
            *super().client_vars(),
            client_var("prev", None, doc="the client's whole model after its last update"),
        ]

    def local_update(self, ctx: ClientContext, down: Payload, state: State) -> Payload:
        dev = ctx.device
        glob = {k: v.to(dev) for k, v in {**down["weights"], **state["local"]}.items()}
        prev = state.get("prev")
        ctx.scratch[GLOBAL] = glob
        ctx.scratch[PREVIOUS] = None if prev is None else {k: v.to(dev) for k, v in prev.items()}
        try:
            up = super().local_update(ctx, down, state)
        finally:
            del ctx.scratch[GLOBAL], ctx.scratch[PREVIOUS]
        state["prev"] = clone(ctx.model.state_dict())
        return up

    @torch.no_grad()
    def frozen_features(
        self, ctx: ClientContext, tensors: Tensors, x: torch.Tensor
    ) -> torch.Tensor:
        """Representation of ``x`` under the frozen weights ``tensors``, in evaluation mode."""
        model = ctx.model
        was_training = model.training
        model.eval()
        try:
            return torch.func.functional_call(
                _Features(model), {f"model.{k}": v for k, v in tensors.items()}, (x,)
            )
        finally:
            model.train(was_training)

    def loss(self, ctx: ClientContext, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Task loss (CE) + mu * l_con (Eq. 3) (+ ``penalty``); the frozen global and
        previous models are the round's (``ctx.scratch``)."""
        glob = ctx.scratch.get(GLOBAL)
        if glob is None:  # not inside local_update (e.g. a subclass evaluating a loss)
            return super().loss(ctx, x, y)
        prev = ctx.scratch[PREVIOUS]
        z_glob = self.frozen_features(ctx, glob, x)
        z_prev = None if prev is None else self.frozen_features(ctx, prev, x)
        z = ctx.model.features(x)
        loss = ctx.task.loss(ctx.model.head(z), y)
        z, z_glob = z.flatten(1), z_glob.flatten(1)  # per-pixel maps -> one vector per image
        z_prev = None if z_prev is None else z_prev.flatten(1)
        loss = loss + self.params.mu * contrastive_loss(z, z_glob, z_prev, self.params.tau)
        extra = self.penalty(ctx)
        return loss if extra is None else loss + extra
