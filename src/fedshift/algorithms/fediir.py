"""FedIIR (Guo, Guo, Cao, Wu, Chang, "Out-of-Distribution Generalization of Federated Learning via
Implicit Invariant Relationships", ICML 2023).

FedAvg whose clients align their *classifier gradient* with the federation's mean classifier
gradient, which implicitly reduces the disagreement of the clients' invariant relationships
(the paper's idea; its text is not obtainable offline, only the abstract, so equation numbers
are unverified and every form below is the released code's, ``domainbed/algorithms.py``,
class ``FedIIR``, methods ``mean_grad`` and ``update``):

* mean gradient of round t: with the current global model w_t, for every batch b of every
  participating client the gradient of the batch's mean cross-entropy w.r.t. the classifier
  parameters only, g_b = d CE_b / d w_cls; their batch-weighted mean
  g_new = sum_b g_b / (number of batches) (a client with more batches weighs more);
* exponential moving average over rounds: g_bar_t = ema * g_bar_{t-1} + (1 - ema) * g_new,
  g_bar_0 = 0 (ema 0.95);
* client objective per batch: CE + penalty * sum_params ||d CE / d w_cls - g_bar||_2^2, the
  gradient taken with ``create_graph`` so the penalty trains featurizer and classifier
  (second order);
* the server averages the clients' models with equal weights (``paper_weighting =
  "uniform"``; in the released split every client holds the same number of examples).

How the mean gradient fits fedshift's one-exchange round (a deviation in order, not in the
quantity). The released code computes g_new at the start of round t by running the global
model over the sampled clients' data on the simulation host, before their local training,
and uses g_bar_t in round t itself. A real federation cannot: the server holds no data, and
g_new(w_t) needs every client's pass over its data with w_t, which costs one more exchange.
Here each client computes that pass at the start of its local update, on the model it
received (w_t, before training: its gradient sums of the classifier and its batch count, record
``grad`` of the reply, counted in the communication ledger), and the server folds the round's
replies into g_bar in ``aggregate``, so the target broadcast in round t + 1 (record
``grad_mean``) is g_bar_t. The penalty of round t therefore uses g_bar_{t-1}: the released
code's target one round later, from the clients sampled in the previous round (round 1 uses
g_bar_0 = 0, the released initial value). The mean-gradient pass runs the model in training
mode (as the released code does) over the client's training split in order, batches of
``train.batch_size`` through the training input pipeline, a trailing single-example batch
skipped; BN running statistics are left as they were (the released DomainBed networks have
frozen BN or none).

FL-bench's port (``src/server/fediir.py``) was checked too: its server computes the EMA into
a local variable and never stores it, so every round mixes g_new with the initial zeros
(target 0.05 g_new), and it recomputes that for every client package; fedshift keeps g_bar in
the server state, as the released code does.

Defaults (``domainbed/hparams_registry.py``): penalty 1e-3 (the PACS value; RotatedMNIST 1e-2,
VLCS 5e-3, OfficeHome 5e-4), ema 0.95; SGD momentum 0.9, weight decay 0, one local epoch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from fedshift.algorithms.base import FLParams, Reply, State
from fedshift.algorithms.bn import FrozenBNStats
from fedshift.algorithms.fedavg import FedAvg
from fedshift.algorithms.state import StateInit, StateVar, server_var
from fedshift.core.bounds import bounded
from fedshift.core.context import ClientContext
from fedshift.core.disclosure import DOWN, UP, Disclosure, Kind, Over, To, When, fixed, tensor_bytes
from fedshift.core.errors import ConfigError, TrainingError
from fedshift.core.payload import Payload, Tensors
from fedshift.models.base import FedModel

#: ``ctx.scratch`` key of the round's target g_bar (classifier key -> tensor on the device)
TARGET = "fediir/target"
#: the record of the reply's batch count (key of the one tensor in it)
BATCHES = "batches"


@dataclass
class FedIIRParams(FLParams):
    # weight of the gradient-alignment penalty (released: 1e-2 RMNIST, 5e-3 VLCS, 1e-3 PACS,
    # 5e-4 OfficeHome)
    penalty: float = bounded(1e-3, ge=0)
    ema: float = bounded(0.95, ge=0, lt=1)  # EMA factor of the mean classifier gradient


# ----------------------------------------------------------------------------- the equations
def alignment_penalty(
    grads: list[torch.Tensor] | tuple[torch.Tensor, ...], target: list[torch.Tensor]
) -> torch.Tensor:
    """sum over the classifier parameters of ||g - g_bar||_2^2."""
    return sum(((g - t) ** 2).sum() for g, t in zip(grads, target, strict=True))  # type: ignore[return-value]


def batch_weighted_mean(sums: list[tuple[Tensors, float]]) -> Tensors:
    """g_new = (sum over clients of their gradient sums) / (total number of batches), from
    (gradient sum, batch count) per client."""
    total = sum(n for _, n in sums)
    if total <= 0:
        raise TrainingError("fediir: no client computed a gradient this round (0 batches)")
    keys = list(sums[0][0])
    return {k: sum(s[k].double() for s, _ in sums).div(total).float() for k in keys}  # type: ignore[union-attr]


def ema_update(prev: Tensors, new: Tensors, ema: float) -> Tensors:
    """g_bar_t = ema * g_bar_{t-1} + (1 - ema) * g_new."""
    return {k: ema * prev[k] + (1.0 - ema) * new[k] for k in prev}


# ----------------------------------------------------------------------------- the algorithm
class FedIIR(FedAvg[FedIIRParams]):
    """FedAvg with FedIIR's classifier-gradient alignment penalty."""

    name = "fediir"
    tasks = ("classification",)
    # released aggregation_client: the plain mean of the sampled clients' state dicts
    paper_weighting = "uniform"
    Params = FedIIRParams

    def setup(self, model: FedModel) -> None:
        classifier = getattr(model, "classifier", None)
        if not isinstance(classifier, nn.Module) or not list(classifier.parameters()):
            raise ConfigError(
                "algorithm 'fediir' aligns the gradient of the model's classifier: the model "
                "needs a 'classifier' module with parameters"
            )
        ids = {id(p) for p in classifier.parameters()}
        #: state-dict names of the classifier's parameters (the gradient's records)
        self.cls_keys = [n for n, p in model.named_parameters() if id(p) in ids]
        missing = [k for k in self.cls_keys if k not in self.shared_keys]
        if missing:
            raise ConfigError(
                f"algorithm 'fediir': the classifier tensors {missing} are not shared"
            )

    # -- server ----------------------------------------------------------------------------
    def server_vars(self) -> list[StateVar]:
        def zeros(at: StateInit) -> Tensors:
            state = at.model.state_dict()
            return {k: torch.zeros_like(state[k]).cpu() for k in self.cls_keys}

        return [
            *super().server_vars(),
            server_var("grad_mean", zeros, doc="the EMA of the sites' classifier gradients"),
        ]

    def disclosures(self, model: FedModel) -> list[Disclosure]:
        grads = fixed(tensor_bytes(model.state_dict(), self.cls_keys))
        return [
            *self.weights_disclosures(model),
            Disclosure("grad_mean", DOWN, Kind.UPDATE, When.ROUND, grads,
                       "the running mean of the sites' classifier gradients", carries=("grad",)),
            Disclosure("grad", UP, Kind.UPDATE, When.ROUND, grads,
                       "the sum over the site's batches of the classifier's gradient",
                       to=To.AGGREGATE),
            Disclosure(BATCHES, UP, Kind.STATISTIC, When.ROUND, fixed(4),
                       "the number of the site's batches (its size, to the batch)",
                       to=To.SERVER, over=Over.SITE),
        ]  # fmt: skip

    def broadcast(self, server: State, rnd: int, cid: str) -> Payload:
        down = super().broadcast(server, rnd, cid)
        down.records["grad_mean"] = server["grad_mean"]
        return down

    def aggregate(self, server: State, rnd: int, replies: list[Reply]) -> None:
        super().aggregate(server, rnd, replies)
        sums = [(p["grad"], float(p[BATCHES][BATCHES])) for _, p in replies]
        new = batch_weighted_mean(sums)
        server["grad_mean"] = ema_update(server["grad_mean"], new, self.params.ema)

    # -- client ----------------------------------------------------------------------------
    def local_update(self, ctx: ClientContext, down: Payload, state: State) -> Payload:
        self.load_client_model(ctx, down["weights"], state)
        grad_sum, batches = self.gradient_sum(ctx)
        ctx.scratch[TARGET] = [down["grad_mean"][k].to(ctx.device) for k in self.cls_keys]
        try:
            steps, loss = self.local_train(ctx, state)
        finally:
            del ctx.scratch[TARGET]
        self.keep_local(ctx, state)
        records = {
            "weights": self.shared_weights(ctx),
            "grad": grad_sum,
            # host records, like the gradient sums (what goes on the wire)
            BATCHES: {BATCHES: torch.tensor(float(batches), device="cpu")},
        }
        return self.reply(ctx, state, steps, loss, records)

    def classifier_params(self, ctx: ClientContext) -> list[torch.nn.Parameter]:
        params = dict(ctx.model.named_parameters())
        return [params[k] for k in self.cls_keys]

    def gradient_sum(self, ctx: ClientContext) -> tuple[Tensors, int]:
        """Sum over the client's training batches of d CE_b / d w_cls with the model as
        received (training mode, BN running statistics untouched), and the batch count."""
        model, split = ctx.model, ctx.data.train
        params = self.classifier_params(ctx)
        acc = [torch.zeros_like(p, dtype=torch.float64) for p in params]
        n, bs = len(split), self.train.batch_size
        batches = 0
        model.train()
        with FrozenBNStats(model):
            for start in range(0, n, bs):
                if min(bs, n - start) < 2 and n > 1:
                    continue  # a single-example batch (BN cannot run on it), as in training
                x = split.x[start : start + bs].to(ctx.device)
                y = split.y[start : start + bs].to(ctx.device)
                x, y = ctx.pipeline.train(x, y, ctx.state, ctx.generator)
                ce = ctx.task.loss(model(x), y)
                for a, g in zip(acc, torch.autograd.grad(ce, params), strict=True):
                    a += g.double()
                batches += 1
        out = {k: a.float().cpu() for k, a in zip(self.cls_keys, acc, strict=True)}
        return out, batches

    def loss(self, ctx: ClientContext, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """CE + penalty * sum ||d CE / d w_cls - g_bar||^2 (second order; g_bar from
        ``ctx.scratch``) (+ ``penalty``)."""
        ce = ctx.task.loss(ctx.model(x), y)
        loss = ce
        target = ctx.scratch.get(TARGET)
        if self.params.penalty and target is not None:
            grads = torch.autograd.grad(ce, self.classifier_params(ctx), create_graph=True)
            loss = loss + self.params.penalty * alignment_penalty(grads, target)
        extra = self.penalty(ctx)
        return loss if extra is None else loss + extra
