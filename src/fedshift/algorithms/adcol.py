"""ADCOL: Adversarial Collaborative Learning (Li, He, Song, "Adversarial Collaborative
Learning on Non-IID Features", ICML 2023).

Instead of averaging models, the server trains a *discriminator* D that tells from a
representation which party produced it, and the parties train their encoders so that D
cannot tell (its prediction should be the uniform distribution over the N parties), while a
predictor on top keeps the representation useful for the party's task. From the paper's
abstract and introduction (its body, and so its equation numbers, was not obtainable
offline): no model averaging, each party keeps its encoder and its own predictor
(personalised; fedshift evaluates each client's own model, ``averaging=none``, default).

The exact form of each element is taken from FL-bench's port (KarhouTam/FL-bench,
``src/server/adcol.py``, ``src/client/adcol.py``; the authors' repository was not
obtainable):

* party (client) objective on a batch, with z = f(x) the encoder's representation (fedshift:
  ``model.features``, the embedding the classifier reads) and D frozen in evaluation mode:

    l = CE(g(z), y) + mu * KL(U || softmax(D(z)))
    KL(U || q) = sum_j (1/N) (log(1/N) - log q_j)    averaged over the batch,

  U uniform over the N training clients;
* upload: the representations (detached) of every example of the client's LAST local epoch,
  record ``features`` (examples x dim float32: the communication ledger counts them);
* server: D is trained on the pooled uploads, each labelled with its client's index
  (cross-entropy), for ``dis_epochs`` epochs of mini-batches (``train.batch_size``,
  a seeded shuffle per round) with SGD (lr ``dis_lr``, momentum ``dis_momentum``; the
  optimiser state is kept in the server state), then sent down as record ``discriminator``
  with the next round. In round 1 the clients use the initial D.
* D = Linear(d, h, no bias) -> BN1d -> ReLU -> Linear(h, h, no bias) -> BN1d -> ReLU ->
  Linear(h, N, no bias), h = 512.

FL-bench's deviation, as an option: ``averaging=fedavg`` also averages the model weights
(sample-count weighted, ``bn_policy`` applies) and evaluates the global model. FL-bench's z is
the pre-ReLU output of its base network (its classifier applies the ReLU); fedshift's models
end their embedding with the ReLU, so z here is post-activation.

Privacy: the uploaded representations are per-example data about the client's training
images (far more than a model update says about them); a deployment must weigh that, as the
paper's discussion of privacy does.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from fedshift.algorithms.base import FLParams, Reply, State
from fedshift.algorithms.bn import bn_keys
from fedshift.algorithms.fedavg import FedAvgClient, FedAvgServer
from fedshift.algorithms.local_train import last_epoch_start
from fedshift.algorithms.state import StateVar, replaced, server_var
from fedshift.algorithms.tensors import clone, subset
from fedshift.core.bounds import bounded
from fedshift.core.config import TrainConfig
from fedshift.core.context import ClientContext
from fedshift.core.disclosure import DOWN, UP, Disclosure, Kind, Over, To, When, fixed, tensor_bytes
from fedshift.core.errors import ConfigError, FedshiftError, TrainingError
from fedshift.core.payload import Payload, Tensors
from fedshift.core.seeding import generator
from fedshift.models.base import FedModel

#: ``ctx.scratch`` keys of one local update: the received discriminator tensors, the step
#: counter, the first step of the last epoch and the representations collected in it
DISC = "adcol/disc"
STEP = "adcol/step"
LAST_EPOCH_FROM = "adcol/last_epoch_from"
FEATURES = "adcol/features"


@dataclass
class ADCOLParams(FLParams):
    mu: float = bounded(0.5, ge=0)  # weight of the KL term (FL-bench default 0.5)
    dis_lr: float = bounded(0.01, gt=0)  # discriminator SGD learning rate (FL-bench 0.01)
    dis_epochs: int = bounded(3, ge=1)  # discriminator epochs per round (FL-bench 3)
    dis_momentum: float = bounded(0.0, ge=0, lt=1)  # FL-bench: plain SGD
    dis_hidden: int = bounded(512, ge=1)  # hidden width of D (FL-bench 512)
    # "none": the paper's personalised parties; "fedavg": FL-bench's averaged model
    averaging: Literal["none", "fedavg"] = "none"


def discriminator(dim: int, hidden: int, parties: int) -> nn.Sequential:
    """D: representation (dim) -> logits over the parties."""
    return nn.Sequential(
        OrderedDict(
            fc1=nn.Linear(dim, hidden, bias=False),
            bn1=nn.BatchNorm1d(hidden),
            relu1=nn.ReLU(),
            fc2=nn.Linear(hidden, hidden, bias=False),
            bn2=nn.BatchNorm1d(hidden),
            relu2=nn.ReLU(),
            fc3=nn.Linear(hidden, parties, bias=False),
        )
    )


def kl_to_uniform(logits: torch.Tensor) -> torch.Tensor:
    """KL(U || softmax(logits)) per row, averaged over the rows; U uniform over the columns:
    sum_j (1/N)(log(1/N) - log q_j) = -log N - mean_j log q_j."""
    n = logits.shape[1]
    logq = F.log_softmax(logits, dim=1)
    return (
        -torch.log(torch.tensor(float(n), dtype=logq.dtype, device=logq.device)) - logq.mean(1)
    ).mean()


def train_discriminator(
    disc: nn.Module,
    opt: torch.optim.Optimizer,
    z: torch.Tensor,
    party: torch.Tensor,
    epochs: int,
    batch_size: int,
    gen: torch.Generator,
) -> float:
    """``epochs`` passes of cross-entropy mini-batch steps of ``disc`` on (z, party index),
    each a fresh permutation from ``gen`` (a trailing batch of one row is skipped: BN);
    returns the mean loss of the last epoch. The permutations are drawn on ``gen`` (a CPU
    generator) and moved to z's device: the same batches wherever D trains."""
    disc.train()
    n = z.shape[0]
    last = torch.zeros((), device=z.device)
    for _ in range(epochs):
        perm = torch.randperm(n, generator=gen).to(z.device)
        total, steps = torch.zeros((), device=z.device), 0
        for s in range(0, n, batch_size):
            idx = perm[s : s + batch_size]
            if idx.numel() < 2:
                continue
            loss = F.cross_entropy(disc(z[idx]), party[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            total += loss.detach()
            steps += 1
        last = total / max(steps, 1)
    disc.eval()
    return float(last)


def _representation_dim(model: FedModel) -> int:
    """The width of the representation the classifier reads (what D takes)."""
    head = getattr(model, "classifier", None)
    if not isinstance(head, nn.Linear):
        raise ConfigError(
            "algorithm 'adcol' needs a model whose classifier is a torch.nn.Linear "
            "(the discriminator reads the classifier's input)"
        )
    return int(head.in_features)


class ADCOLClient(FedAvgClient[ADCOLParams]):
    """ADCOL's client half: the party's encoder and predictor trained against the received
    discriminator; uploads its last epoch's representations. It holds D's shape only
    (``client_disc``, whose own values are never read: the received tensors are)."""

    name = "adcol"
    tasks = ("classification",)
    paper_weighting = "samples"  # only used by averaging=fedavg (FL-bench's FedAvg)
    Params = ADCOLParams

    @classmethod
    def check(cls, params: ADCOLParams, train: TrainConfig) -> None:
        if params.averaging == "none" and params.bn_policy != "global":
            raise ConfigError(
                "algorithm 'adcol' keeps every weight on its client (averaging=none, the "
                "paper's design), so 'algorithm.bn_policy' has no effect; set "
                "algorithm.averaging=fedavg to average weights with that BN policy"
            )

    def setup(self, model: FedModel) -> None:
        p = self.params
        dim = _representation_dim(model)
        self.client_disc = discriminator(dim, p.dis_hidden, self.num_clients).eval()

    def compute_local_keys(self, model: FedModel) -> list[str]:
        if self.params.averaging == "fedavg":
            return bn_keys(model, self.params.bn_policy)
        return list(model.state_dict())

    def disclosures(self, model: FedModel) -> list[Disclosure]:
        shapes = self.client_disc.state_dict()  # D's shapes: the server's D is built alike
        dim = shapes[next(iter(shapes))].shape[1]
        weights = self.weights_disclosures(model) if self.params.averaging == "fedavg" else []
        return [
            *weights,
            Disclosure("discriminator", DOWN, Kind.PARAMETERS, When.ROUND,
                       fixed(tensor_bytes(shapes)),
                       "the discriminator the server trained on the sites' representations",
                       carries=("features",)),
            Disclosure("features", UP, Kind.REPRESENTATION, When.ROUND,
                       lambda s: s.last_epoch_examples * dim * 4,
                       "the representation of every example of the site's last local epoch",
                       to=To.SERVER, over=Over.EXAMPLE, exact=False,
                       unprotectable="one example's representation per value: noise large "
                       "enough to hide an example leaves nothing of it"),
        ]  # fmt: skip

    # -- client ----------------------------------------------------------------------------
    def local_update(self, ctx: ClientContext, down: Payload, state: State) -> Payload:
        shared = down["weights"] if self.params.averaging == "fedavg" else {}
        ctx.scratch[DISC] = {k: v.to(ctx.device) for k, v in down["discriminator"].items()}
        ctx.scratch[STEP] = 0
        ctx.scratch[LAST_EPOCH_FROM] = last_epoch_start(ctx)
        ctx.scratch[FEATURES] = []
        try:
            self.load_client_model(ctx, shared, state)
            steps, loss = self.local_train(ctx, state)
            feats = ctx.scratch[FEATURES]
            if not feats:
                raise TrainingError(f"adcol: client {ctx.cid!r} took no training step")
        finally:
            for key in (DISC, STEP, LAST_EPOCH_FROM, FEATURES):
                ctx.scratch.pop(key, None)
        self.keep_local(ctx, state)
        records: dict[str, Tensors] = {"features": {"z": torch.cat(feats).float().cpu()}}
        if self.shared_keys:
            records["weights"] = self.shared_weights(ctx)
        return self.reply(ctx, state, steps, loss, records)

    def discriminate(self, tensors: Tensors, z: torch.Tensor) -> torch.Tensor:
        """D(z) with the frozen tensors ``tensors`` (evaluation mode: BN running statistics;
        the gradient flows to z only)."""
        return torch.func.functional_call(self.client_disc, tensors, (z,))

    def loss(self, ctx: ClientContext, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """CE + mu * KL(U || softmax(D(z))) (+ ``penalty``); the representations of the last
        local epoch are kept for the upload."""
        z = ctx.model.features(x)
        loss = ctx.task.loss(ctx.model.head(z), y)  # CE (soft labels of mixing augments too)
        if STEP in ctx.scratch:
            step = ctx.scratch[STEP]
            ctx.scratch[STEP] = step + 1
            if step >= ctx.scratch[LAST_EPOCH_FROM]:
                ctx.scratch[FEATURES].append(z.detach().flatten(1))
        disc = ctx.scratch.get(DISC)
        if disc is not None and self.params.mu:
            loss = loss + self.params.mu * kl_to_uniform(self.discriminate(disc, z.flatten(1)))
        extra = self.penalty(ctx)
        return loss if extra is None else loss + extra


class ADCOLServer(FedAvgServer[ADCOLParams]):
    """ADCOL's server half: the discriminator D, trained on the pooled representations
    (each labelled with its party's row), sent down every round."""

    def setup(self, model: FedModel) -> None:
        p = self.params
        dim = _representation_dim(model)
        # D first, then the client half's copy: the draws of the one-class algorithm
        self.disc = discriminator(dim, p.dis_hidden, self.num_clients).eval()
        super().setup(model)
        self._rows: dict[str, int] = {}

    def register_clients(self, cids: list[str]) -> None:
        self._rows = {cid: i for i, cid in enumerate(cids)}

    # -- server ----------------------------------------------------------------------------
    def server_vars(self) -> list[StateVar]:
        fedavg = self.params.averaging == "fedavg"
        return [
            *replaced(super().server_vars(), "weights", reduce="mean" if fedavg else "none"),
            server_var("disc", lambda at: clone(self.disc.state_dict()),
                       doc="the discriminator the server trains"),
            server_var("disc_opt", None, doc="its optimiser's state"),
            server_var("disc_seed", lambda at: int(torch.randint(0, 2**62, ())),
                       doc="the seed of its training batches"),
            server_var("disc_loss", None, doc="mean CE of its last training epoch"),
        ]  # fmt: skip

    def broadcast(self, server: State, rnd: int, cid: str) -> Payload:
        records: dict[str, Tensors] = {"discriminator": server["disc"]}
        if self.params.averaging == "fedavg":
            records["weights"] = subset(server["weights"], self.shared_keys)
        return Payload(records)

    def aggregate(self, server: State, rnd: int, replies: list[Reply]) -> None:
        self.aggregate_declared(server, replies)  # averaging=fedavg: the weights' mean
        zs, parties = [], []
        for cid, pl in replies:
            if cid not in self._rows:
                raise FedshiftError(f"adcol: unknown client {cid!r} (no discriminator class)")
            z = pl["features"]["z"].float().cpu()
            zs.append(z)
            parties.append(
                torch.full((z.shape[0],), self._rows[cid], dtype=torch.long, device=z.device)
            )
        p = self.params
        self.disc.load_state_dict(server["disc"])
        opt = torch.optim.SGD(self.disc.parameters(), lr=p.dis_lr, momentum=p.dis_momentum)
        if server["disc_opt"] is not None:
            opt.load_state_dict(server["disc_opt"])
        gen = generator(server["disc_seed"], "adcol/discriminator", rnd)
        server["disc_loss"] = train_discriminator(
            self.disc, opt, torch.cat(zs), torch.cat(parties), p.dis_epochs,
            self.train.batch_size, gen,
        )  # fmt: skip
        server["disc"] = clone(self.disc.state_dict())
        server["disc_opt"] = opt.state_dict()


class ADCOL(ADCOLServer, ADCOLClient):
    """Personalised parties trained against a server discriminator of their representations."""

    client_half = ADCOLClient
