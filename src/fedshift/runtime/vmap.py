"""The vectorised executor (``run.executor=vmap``): a round's clients trained together.

Many small clients on one GPU leave it idle when they train one after another: each step is a
few tiny kernels. Here the round's clients are one batch of models. Their weights (and BN
buffers) are stacked along a new leading dimension, and each local step is one call of
``torch.func.vmap(grad_and_value(loss))`` over the clients that take a step of the same batch
size, followed by the SGD update (momentum, weight decay: ``torch.optim.SGD``'s formula) on
the stacked tensors. What a client computes is exactly its sequential round:

* its batches are the ones :meth:`ClientContext.batches` draws for it (the same generator
  from (seed, round, client), the same input pipeline), drawn for the whole round before the
  first step, right after the global RNGs are seeded for it, as the sequential executor does;
* clients whose step counts differ (a Dirichlet split) stop stepping when theirs run out;
  clients whose batches differ in size at a step (a trailing batch) are stepped in one
  vectorised call per batch size, never padded (padding would change BatchNorm statistics);
* the algorithm's ``load_client_model``, ``keep_local`` and ``reply`` and the augments'
  ``receive`` / ``reply`` run per client as in :meth:`Composition.local_update`.

Results equal the sequential executor's up to float rounding (batched convolutions sum in
another order). On a CPU it is slower than the sequential executor (measured 1.6-3.7x for
10-200 small clients), so it is never a CPU default.

It computes what it can compute exactly and refuses the rest (:func:`check_vmap`): the
algorithm's local objective must be the task loss with plain SGD steps (FedAvg's
``local_update`` and the base hooks: FedAvg, FedBN, FedAvgM, FedAdam/FedYogi/FedAdagrad,
FedRDN, centralised), augments must act on the input only (no model hooks: FedFA's and
MixStyle's layers draw random numbers inside the forward pass), and the model must not draw
random numbers (no dropout).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar, cast

import torch
from torch.func import functional_call, grad_and_value, vmap

from fedshift.algorithms.base import Algorithm
from fedshift.algorithms.fedavg import FedAvg
from fedshift.augment.base import Augment
from fedshift.core.config import TrainConfig
from fedshift.core.context import ClientContext
from fedshift.core.contract import State
from fedshift.core.errors import ConfigError
from fedshift.core.payload import Payload
from fedshift.runtime.client import client_context
from fedshift.runtime.experiment import Experiment
from fedshift.runtime.native import InProcessTransport

__all__ = ["VmapTransport", "check_vmap", "train_stacked"]

#: the algorithm hooks whose base behaviour the vectorised loop reproduces
_ALGO_HOOKS = {
    "local_update": FedAvg,
    "local_train": Algorithm,
    "loss": Algorithm,
    "penalty": Algorithm,
    "before_step": Algorithm,
    "make_optimizer": Algorithm,
    "trainable": Algorithm,
}
#: augment hooks that touch the model or its training (input-level augments override none)
_AUGMENT_HOOKS = ("attach", "before_train")


def check_vmap(exp: Experiment, workers: int = 1) -> None:
    """Refuse a run the vectorised executor cannot compute as the sequential one does,
    naming what stands in the way and the fix."""
    fix = "use run.executor=sequential"
    algo = cast(Algorithm, exp.algo.algorithm)  # every registered algorithm subclasses it
    name = algo.name
    if workers != 1:
        raise ConfigError(
            f"config key 'run.executor': vmap trains every client in one process; it does not "
            f"combine with run.workers={workers} (set run.workers=1, or {fix})"
        )
    for hook, base in _ALGO_HOOKS.items():
        if getattr(type(algo), hook) is not getattr(base, hook):
            raise ConfigError(
                f"config key 'run.executor': vmap computes the plain local objective (task loss, "
                f"SGD steps), but algorithm {name!r} defines its own {hook!r}; {fix}"
            )
    if algo.sam_rho:
        raise ConfigError(f"config key 'run.executor': vmap has no SAM step ({name!r}); {fix}")
    t: TrainConfig = algo.train
    if t.agc is not None:
        raise ConfigError(
            f"config key 'run.executor': vmap has no adaptive gradient clipping (train.agc); {fix}"
        )
    if t.optimizer != "sgd" or t.optimizer_state != "reset":
        raise ConfigError(
            "config key 'run.executor': vmap steps plain SGD with a fresh optimiser every round "
            f"(train.optimizer=sgd, train.optimizer_state=reset), got train.optimizer="
            f"{t.optimizer}, train.optimizer_state={t.optimizer_state}; {fix}"
        )
    for a in exp.augments:
        for hook in _AUGMENT_HOOKS:
            if getattr(type(a), hook) is not getattr(Augment, hook):
                raise ConfigError(
                    f"config key 'run.executor': augment {a.name!r} changes the model "
                    f"({hook!r}); vmap supports input-level augments only; {fix}"
                )
    for mod_name, m in exp.model.named_modules():
        if isinstance(m, torch.nn.modules.dropout._DropoutNd) and m.p > 0:
            raise ConfigError(
                f"config key 'run.executor': the model draws random numbers in its forward "
                f"pass (dropout {mod_name!r}, p={m.p}), which vmap cannot draw as the "
                f"sequential executor does; {fix}"
            )
    if any(not p.requires_grad for p in exp.model.parameters()):
        raise ConfigError(
            f"config key 'run.executor': the model has frozen parameters; vmap trains all; {fix}"
        )


@dataclass
class _Client:
    cid: str
    ctx: ClientContext
    state: State
    #: the working model's state dict at the start of the round (shared + local tensors)
    start: dict[str, torch.Tensor]
    batches: list[tuple[torch.Tensor, torch.Tensor]]


def train_stacked(
    model: torch.nn.Module,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    train: TrainConfig,
    starts: list[dict[str, torch.Tensor]],
    batches: list[list[tuple[torch.Tensor, torch.Tensor]]],
) -> tuple[list[dict[str, torch.Tensor]], list[float]]:
    """Every client's local SGD steps, vectorised (module docstring).

    ``starts[i]``: client i's state dict at the start (parameters and buffers of ``model``);
    ``batches[i]``: its batches, in order. Returns each client's final state dict and the
    mean loss of its steps (0 for a client without a step)."""
    model.train()
    pnames = [n for n, _ in model.named_parameters()]
    bnames = [n for n, _ in model.named_buffers()]
    params = {n: torch.stack([s[n].detach() for s in starts]) for n in pnames}
    buffers = {n: torch.stack([s[n].detach() for s in starts]) for n in bnames}
    momentum: dict[str, torch.Tensor] = {}
    lr, mu, wd = train.lr, train.momentum, train.weight_decay
    steps = [len(b) for b in batches]
    device = next(iter(params.values())).device
    losses = torch.zeros(len(starts), dtype=torch.float32, device=device)

    def one(p: dict, b: dict, x: torch.Tensor, y: torch.Tensor):
        b = {k: v.clone() for k, v in b.items()}  # BN updates its running statistics in place
        return loss_fn(functional_call(model, (p, b), (x,)), y), b

    step_fn = vmap(grad_and_value(one, has_aux=True))
    for s in range(max(steps, default=0)):
        groups: dict[int, list[int]] = defaultdict(list)
        for i, n_steps in enumerate(steps):
            if s < n_steps:
                groups[int(batches[i][s][0].shape[0])].append(i)
        for _, members in sorted(groups.items(), reverse=True):
            ix = torch.tensor(members, device=device)
            x = torch.stack([batches[i][s][0] for i in members])
            y = torch.stack([batches[i][s][1] for i in members])
            p = {n: t.index_select(0, ix) for n, t in params.items()}
            b = {n: t.index_select(0, ix) for n, t in buffers.items()}
            grads, (loss, new_b) = step_fn(p, b, x, y)
            with torch.no_grad():
                for n in pnames:
                    # torch.optim.SGD: d = g + wd * w; buf = mu * buf + d (d on the first
                    # step); w = w - lr * buf
                    d = grads[n]
                    if wd:
                        d = d.add(p[n], alpha=wd)
                    if mu:
                        if s == 0:
                            d = d.clone()
                            momentum.setdefault(n, torch.zeros_like(params[n]))
                        else:
                            d = momentum[n].index_select(0, ix).mul_(mu).add_(d)
                        momentum[n].index_copy_(0, ix, d)
                    params[n].index_copy_(0, ix, p[n].add(d, alpha=-lr))
                for n in bnames:
                    buffers[n].index_copy_(0, ix, new_b[n])
                losses.index_add_(0, ix, loss.detach().float())
    finals = [
        {n: (params[n][i] if n in params else buffers[n][i]).clone() for n in starts[i]}
        for i in range(len(starts))
    ]
    return finals, [float(losses[i]) / max(n, 1) for i, n in enumerate(steps)]


class VmapTransport(InProcessTransport):
    """The in-process transport with a round's clients trained together
    (module docstring); set-up, evaluation and client state are the in-process ones."""

    name = "vmap"
    executor: ClassVar[str | None] = "vmap"

    def attach(self, exp: Experiment, run) -> None:
        check_vmap(exp)
        super().attach(exp, run)

    def train(
        self, rnd: int, cids: list[str], down: Callable[[str], Payload]
    ) -> tuple[dict[str, Payload], list[str]]:
        exp = self.exp
        comp, algo = exp.algo, cast(Algorithm, exp.algo.algorithm)  # as check_vmap
        clients = []
        for cid in cids:
            state = self.states[cid]
            ctx = client_context(exp, exp.seed, cid, exp.train_clients[cid], rnd, state)
            msg = down(cid)
            comp.before_local(ctx, msg, state)
            algo.load_client_model(ctx, msg["weights"], state)
            start = {k: v.detach().clone() for k, v in exp.model.state_dict().items()}
            clients.append(_Client(cid, ctx, state, start, list(ctx.batches())))
        finals, losses = train_stacked(
            exp.model, exp.task.loss, exp.train, [c.start for c in clients],
            [c.batches for c in clients],
        )  # fmt: skip
        replies = {}
        for c, weights, loss in zip(clients, finals, losses, strict=True):
            exp.model.load_state_dict(weights)
            algo.keep_local(c.ctx, c.state)
            up = algo.reply(c.ctx, c.state, len(c.batches), loss)
            replies[c.cid] = comp.after_local(c.ctx, c.state, up)
        return replies, []

    def info(self) -> dict:
        return {**super().info(), "executor": "vmap"}
