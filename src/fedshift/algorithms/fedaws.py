"""FedAwS: Federated Averaging with Spreadout (Yu, Rawat, Menon & Kumar, "Federated Learning
with Only Positive Labels", ICML 2020).

Setting (the paper's): every client holds the examples of one class only (fedshift's
``partition.name=one-class``) and must not see the other classes' parameters. The classifier is
embedding-based, ``f(x) = W g(x)``: ``g`` is the embedding network (here: the backbone's
``features`` followed by every layer of its ``classifier`` except the last linear one) and the
rows ``w_c`` of ``W`` (the last linear layer's weight, no bias) are the class embeddings. Both
are l2-normalised (the paper's cosine set-up), so a logit is the cosine ``<g(x), w_c>`` and the
Euclidean distance of unit vectors is ``d(u, v) = sqrt(2 - 2 <u, v>)``.

Algorithm 1 of the paper, as implemented:

* the server sends client i the encoder and **only the rows of the classes it holds**
  (record ``class_embeddings``: ``weight`` rows and their ``classes``);
* the client minimises the positive-only loss (no negatives exist on a client) over the encoder
  and its own rows, for the run's local steps:
  ``squared-hinge`` (default): ``(max(0, m - <g(x), w_y>))^2`` with ``m = positive_margin``;
  ``distance``: ``d(g(x), w_y)^2 = 2 - 2 <g(x), w_y>``, the positive term of the cosine
  contrastive loss the paper's analysis starts from;
* it replies the encoder and its updated rows (plus the per-class example counts, which are
  the rows' averaging weights under ``federation.weighting=samples``);
* the server averages the encoder FedAvg-style, assembles ``W`` row by row from the classes'
  holders (a class no replying client holds keeps its row), then takes ``spreadout_steps``
  gradient steps ``W <- W - spreadout_lr * lambda * grad reg_sp(W)`` (Algorithm 1's
  ``W - lambda eta grad reg_sp``; ``spreadout_lr`` defaults to ``train.lr``, the paper's eta) on

  ``reg_sp(W) = sum_c sum_{c' != c} (max(0, nu - d(w_c, w_c')))^2``          (spreadout)

  or, with ``spreadout_topk=k``, the stochastic-negative-mining variant that keeps for each
  ``c`` only its ``k`` closest classes ``N_k(c)``: ``sum_c sum_{c' in N_k(c)} (...)^2``.

"Client i holds class c" means ``c`` occurs in client i's training labels (``train.y``). The
server knows which rows belong to whom (in the paper each user *is* a class); fedshift takes that
mapping from the federation once, in :meth:`FedAwS.wrap_model`, and every client checks it
against its own labels.

The global model is evaluated as an ordinary classifier whose logits are the cosines
``<g(x), w_c>`` (argmax = nearest class embedding); the evaluation loss is the cross-entropy of
those cosines, so it is not comparable with other methods' losses (accuracy is).

Any partition runs (a client then holds several classes and pulls each example towards its own
class embedding); the method is meant for ``partition.name=one-class``.

Defaults: ``positive_margin=0.9`` (squared hinge on the cosine), spreadout margin ``nu=1.4``
(about the distance of orthogonal unit vectors, sqrt 2), ``spreadout_weight`` (lambda) ``10``,
one server step per round. The paper tunes lambda and nu per dataset; these values are
fedshift's choices for 10-class digits-sized problems, not numbers quoted from the paper.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from fedshift.algorithms.base import FLParams, Reply, State
from fedshift.algorithms.fedavg import FedAvg
from fedshift.algorithms.tensors import clone, subset
from fedshift.core.bounds import bounded
from fedshift.core.context import ClientContext
from fedshift.core.disclosure import DOWN, UP, Disclosure, Kind, To, When
from fedshift.core.errors import ConfigError, FedshiftError
from fedshift.core.federation import Federation
from fedshift.core.payload import Payload
from fedshift.models.base import FedModel

RECORD = "class_embeddings"


@dataclass
class FedAwSParams(FLParams):
    # client loss on the own class: squared hinge on the cosine, or squared distance
    positive_loss: Literal["squared-hinge", "distance"] = "squared-hinge"
    # m in (max(0, m - <g(x), w_y>))^2
    positive_margin: float = 0.9
    # nu: the spreadout margin on distances of unit class embeddings (0 < nu <= 2)
    nu: float = bounded(1.4, gt=0, le=2, why="distances of unit vectors lie in [0, 2]")
    # lambda: multiplier of the spreadout step (Algorithm 1: W - lambda * eta * grad reg_sp)
    spreadout_weight: float = bounded(10.0, ge=0)
    # eta of the server step; null: train.lr (the paper's client learning rate)
    spreadout_lr: float | None = bounded(None, gt=0)
    # server gradient steps on reg_sp per round (Algorithm 1: one)
    spreadout_steps: int = bounded(1, ge=0)
    # null: all pairs; k: only each class's k nearest classes (stochastic negative mining)
    spreadout_topk: int | None = bounded(None, ge=1)


# ----------------------------------------------------------------------------- the model
class ClassEmbeddings(nn.Module):
    """The class embeddings ``W`` (classes x d, no bias): logits are cosines
    ``<g / ||g||, w_c / ||w_c||>``."""

    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight.detach().clone())

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return F.normalize(z, dim=1) @ F.normalize(self.weight, dim=1).t()


def _final_linear(model: FedModel) -> tuple[nn.Module, str, nn.Linear | ClassEmbeddings]:
    """(parent, attribute, module) of the head's last layer: ``classifier`` itself or the last
    child of a Sequential ``classifier``."""
    head = model.classifier
    if isinstance(head, nn.Linear | ClassEmbeddings):
        return model, "classifier", head
    if isinstance(head, nn.Sequential) and len(head) > 0:
        name = list(head._modules)[-1]
        last = head._modules[name]
        if isinstance(last, nn.Linear | ClassEmbeddings):
            return head, name, last
    raise ConfigError(
        f"algorithm 'fedaws' needs a model whose classifier is a linear layer or a Sequential "
        f"ending in one (its rows are the class embeddings); got {type(head).__name__}"
    )


def class_embedding_key(model: nn.Module) -> str:
    """State-dict key of the class-embedding matrix of a FedAwS model."""
    keys = [f"{n}.weight" for n, m in model.named_modules() if isinstance(m, ClassEmbeddings)]
    if len(keys) != 1:
        raise FedshiftError(
            "algorithm 'fedaws' runs on the model its wrap_model returns "
            f"(found {len(keys)} class-embedding layers)"
        )
    return keys[0]


def held_classes(y: torch.Tensor) -> torch.Tensor:
    """The classes a client holds: the distinct labels of its training split, ascending."""
    return torch.unique(y.long(), sorted=True)


# ----------------------------------------------------------------------------- spreadout
def unit_distances(w: torch.Tensor) -> torch.Tensor:
    """Euclidean distances of the l2-normalised rows of ``w`` (C x C), differentiable off the
    diagonal (``d^2 = 2 - 2 cos``, floored at 1e-12 before the square root)."""
    wn = F.normalize(w, dim=1)
    return (2.0 - 2.0 * wn @ wn.t()).clamp_min(1e-12).sqrt()


def spreadout(w: torch.Tensor, nu: float, topk: int | None = None) -> torch.Tensor:
    """``reg_sp(W) = sum_c sum_{c' != c} (max(0, nu - d(w_c, w_c')))^2`` on unit rows (the
    paper's spreadout regulariser: both orders of every pair); with ``topk=k`` the
    sum over ``c'`` runs over the ``k`` classes nearest to ``c`` only (negative mining)."""
    c = w.shape[0]
    d = unit_distances(w)
    hinge = (nu - d).clamp_min(0) ** 2
    off = ~torch.eye(c, dtype=torch.bool, device=w.device)
    if topk is None or topk >= c - 1:
        return hinge[off].sum()
    near = d.detach().masked_fill(~off, float("inf")).topk(topk, dim=1, largest=False).indices
    return hinge.gather(1, near).sum()


def spreadout_step(
    w: torch.Tensor, nu: float, lr: float, weight: float, steps: int, topk: int | None = None
) -> torch.Tensor:
    """``steps`` gradient steps ``W <- W - lr * weight * grad reg_sp(W)`` (Algorithm 1's server
    update of the class embeddings)."""
    out = w.detach().clone()
    for _ in range(steps):
        var = out.clone().requires_grad_(True)
        (grad,) = torch.autograd.grad(spreadout(var, nu, topk), var)
        out = out - lr * weight * grad
    return out


# ----------------------------------------------------------------------------- algorithm
class FedAwS(FedAvg[FedAwSParams]):
    """FedAvg of the encoder + positive-only client loss + spreadout of W at the server."""

    name = "fedaws"
    tasks = ("classification",)  # its objective needs one label per image
    Params = FedAwSParams

    @classmethod
    def wrap_model(cls, params: FedAwSParams, model: FedModel, federation: Federation) -> FedModel:
        """Replace the head's last linear layer by :class:`ClassEmbeddings` (its weight, no
        bias: logits are cosines) and record which classes each training client holds (the
        server's user -> class-embedding map). The backbone is modified in place."""
        parent, attr, last = _final_linear(model)
        if not isinstance(last, ClassEmbeddings):
            setattr(parent, attr, ClassEmbeddings(last.weight))
        # a plain attribute (not a tensor or module): nn.Module's stubs know only those
        model.fedaws_holders = {  # type: ignore[assignment]
            c.name: held_classes(c.train.y).tolist() for c in cls.training_data(federation)
        }
        return model

    def setup(self, model: FedModel) -> None:
        self.w_key = class_embedding_key(model)
        holders = getattr(model, "fedaws_holders", None)
        if holders is None:
            raise FedshiftError("algorithm 'fedaws' needs the model its wrap_model returns")
        self.holders: dict[str, list[int]] = holders
        if self.w_key in self.local_keys:  # impossible with BN policies, kept explicit
            raise ConfigError("fedaws: the class embeddings cannot be client-local")
        self.encoder_keys = [k for k in self.shared_keys if k != self.w_key]

    # -- server ----------------------------------------------------------------------------
    def disclosures(self, model: FedModel) -> list[Disclosure]:
        d = model.state_dict()[self.w_key].shape[1]
        rows = model.state_dict()[self.w_key].element_size() * d
        return [
            *self.weights_disclosures(model, self.encoder_keys),
            Disclosure(RECORD, DOWN, Kind.PARAMETERS, When.ROUND,
                       lambda s: s.classes_held * (rows + 8),
                       "the class embeddings of the site's classes, and their indices",
                       carries=(RECORD,)),
            Disclosure(RECORD, UP, Kind.PARAMETERS, When.ROUND,
                       lambda s: s.classes_held * (rows + 16),
                       "the site's trained class embeddings, its class list and its examples "
                       "per class", to=To.AGGREGATE),
        ]  # fmt: skip

    def broadcast(self, server: State, rnd: int, cid: str) -> Payload:
        classes = torch.tensor(self.holders[cid], dtype=torch.long)
        w = server["weights"][self.w_key]
        return Payload(
            {
                "weights": subset(server["weights"], self.encoder_keys),
                RECORD: {"weight": w[classes.to(w.device)].clone(), "classes": classes},
            }
        )

    def aggregate(self, server: State, rnd: int, replies: list[Reply]) -> None:
        self.aggregate_declared(server, replies)  # the encoder: the replies' mean
        w = server["weights"][self.w_key]
        sums = torch.zeros_like(w)
        totals = torch.zeros(w.shape[0], dtype=w.dtype, device=w.device)
        for _, p in replies:
            rec = p[RECORD]
            classes = rec["classes"].to(w.device)
            if self.federation.weighting == "uniform":
                weights = torch.ones(len(classes), dtype=w.dtype, device=w.device)
            else:
                weights = rec["counts"].to(device=w.device, dtype=w.dtype)
            sums.index_add_(0, classes, rec["weight"].to(w.dtype) * weights[:, None])
            totals.index_add_(0, classes, weights)
        held = totals > 0
        new = w.clone()
        new[held] = sums[held] / totals[held, None]
        hp = self.params
        lr = self.train.lr if hp.spreadout_lr is None else hp.spreadout_lr
        if hp.spreadout_steps > 0 and hp.spreadout_weight > 0:
            new = spreadout_step(
                new, hp.nu, lr, hp.spreadout_weight, hp.spreadout_steps, hp.spreadout_topk
            )
        server["weights"][self.w_key] = new

    # -- client ----------------------------------------------------------------------------
    def local_update(self, ctx: ClientContext, down: Payload, state: State) -> Payload:
        rec = down[RECORD]
        # on the CPU like the server's ``classes``: the labels may be resident on a GPU
        classes = held_classes(ctx.data.train.y).cpu()
        if not torch.equal(classes, rec["classes"].cpu()):
            raise FedshiftError(
                f"fedaws: client {ctx.cid!r} holds classes {classes.tolist()} but the server "
                f"sent the embeddings of {rec['classes'].tolist()}"
            )
        # the client only knows its own rows; the others are zero (never read by its loss)
        template = ctx.model.state_dict()[self.w_key]
        w = torch.zeros_like(template)
        w[classes.to(w.device)] = rec["weight"].to(w.device, w.dtype)
        self.load_client_model(ctx, {**down["weights"], self.w_key: w}, state)
        steps, loss = self.local_train(ctx, state)
        self.keep_local(ctx, state)
        trained = ctx.model.state_dict()[self.w_key]
        counts = torch.bincount(ctx.data.train.y.long().cpu(), minlength=template.shape[0])
        records = {
            "weights": clone(subset(ctx.model.state_dict(), self.encoder_keys)),
            RECORD: {
                "weight": trained[classes.to(trained.device)].detach().clone(),
                "classes": classes,
                "counts": counts[classes],
            },
        }
        return self.reply(ctx, state, steps, loss, records)

    def loss(self, ctx: ClientContext, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The positive-only client loss on the own class embedding (mean over the batch)."""
        if y.dim() != 1:
            raise ConfigError(
                "algorithm 'fedaws' needs hard labels (an augment produced soft labels)"
            )
        cos = ctx.model(x).gather(1, y[:, None]).squeeze(1)
        loss = positive_loss(cos, self.params.positive_loss, self.params.positive_margin)
        extra = self.penalty(ctx)
        return loss if extra is None else loss + extra


def positive_loss(cos: torch.Tensor, form: str, margin: float) -> torch.Tensor:
    """``squared-hinge``: mean (max(0, margin - cos))^2; ``distance``: mean d^2 = 2 - 2 cos."""
    if form == "squared-hinge":
        return ((margin - cos).clamp_min(0) ** 2).mean()
    return (2.0 - 2.0 * cos).mean()
