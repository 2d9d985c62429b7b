"""The client's local training: the mini-batch loop every algorithm runs a round's steps
with, the local optimisers (built from ``train``, kept across rounds with
``train.optimizer_state=persist``) and the sharpness-aware second pass (FedSAM, HarmoFL).

:func:`run_steps` is the loop's one shape: a round's mini-batches, one ``step(x, y)`` each,
the mean of the step losses reported. :func:`sgd_steps` is the default step of
:meth:`fedshift.algorithms.base.Algorithm.local_train` (the algorithm's ``loss``, the SAM
pass when ``sam_rho`` is set, ``before_step``, the optimiser step); algorithms with several
optimisers per step (DisTrans, FRAug) pass their own step to :func:`run_steps`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import torch

from fedshift.algorithms.agc import adaptive_clip_, agc_parameters
from fedshift.algorithms.bn import FrozenBNStats
from fedshift.core.config import TrainConfig
from fedshift.core.context import ClientContext
from fedshift.core.contract import State
from fedshift.core.contract_errors import expect

if TYPE_CHECKING:
    from fedshift.algorithms.base import Algorithm

Step = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def build_optimizer(params: list, train: TrainConfig) -> torch.optim.Optimizer:
    """The local optimiser ``train`` asks for: SGD with ``momentum``/``weight_decay``, or Adam
    with ``betas`` (HarmoFL's segmentation tasks: (0.9, 0.99), Sec. 4.1 / App. C) and
    ``weight_decay``."""
    if train.optimizer == "sgd":
        return torch.optim.SGD(
            params, lr=train.lr, momentum=train.momentum, weight_decay=train.weight_decay
        )
    return torch.optim.Adam(
        params,
        lr=train.lr,
        betas=(train.betas[0], train.betas[1]),  # two: checked at load
        weight_decay=train.weight_decay,
    )


#: the optimiser class :func:`restore_optimizer` is given and returns
OptimizerT = TypeVar("OptimizerT", bound=torch.optim.Optimizer)


def restore_optimizer(opt: OptimizerT, state: State, key: str, train: TrainConfig) -> OptimizerT:
    """``opt`` with the state kept under ``state[key]`` loaded, if the run keeps optimiser
    state across rounds (``train.optimizer_state=persist``) and the client has one."""
    if train.optimizer_state == "persist" and key in state:
        opt.load_state_dict(state[key])
    return opt


def keep_optimizers(state: State, train: TrainConfig, **opts: torch.optim.Optimizer | None) -> None:
    """Store each optimiser's state as ``state[key]`` (``train.optimizer_state=persist``)."""
    if train.optimizer_state == "persist":
        for key, opt in opts.items():
            if opt is not None:
                state[key] = opt.state_dict()


def run_steps(ctx: ClientContext, step: Step) -> tuple[int, float]:
    """The round's local loop: ``step(x, y)`` on every mini-batch of ``ctx.batches()``;
    returns (steps taken, mean of the losses the steps returned)."""
    total = torch.zeros((), device=ctx.device)
    steps = 0
    for x, y in ctx.batches():
        total += step(x, y).detach()
        steps += 1
    return steps, float(total) / max(steps, 1)


def _scalar(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.dim() == 0


def sgd_steps(algo: Algorithm, ctx: ClientContext, state: State) -> tuple[int, float]:
    """The default local training: per mini-batch one step of the model optimiser
    (``algo.make_optimizer``) on ``algo.loss`` (+ the SAM pass when ``algo.sam_rho`` is set,
    then ``algo.before_step``, then adaptive gradient clipping when ``train.agc`` is set).
    Returns (steps taken, mean loss)."""
    model = ctx.model
    model.train()
    opt = algo.make_optimizer(ctx, state)
    expect(opt, torch.optim.Optimizer, algo, "make_optimizer", "a torch.optim.Optimizer")
    clip = algo.train.agc  # adaptive gradient clipping (train.agc), before the optimiser step
    clip_params = agc_parameters(model, algo.train.agc_head) if clip is not None else []

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        opt.zero_grad(set_to_none=True)
        loss = expect(algo.loss(ctx, x, y), _scalar, algo, "loss", "a scalar tensor")
        loss.backward()
        if algo.sam_rho:
            algo.sam_second_pass(ctx, x, y, algo.sam_rho)
        algo.before_step(ctx)
        if clip is not None:
            adaptive_clip_(clip_params, clip, algo.train.agc_eps)
        opt.step()
        return loss

    out = run_steps(ctx, step)
    keep_optimizers(state, algo.train, optimizer=opt)
    return out


def sam_second_pass(
    algo: Algorithm, ctx: ClientContext, x: torch.Tensor, y: torch.Tensor, rho: float
) -> None:
    """Sharpness-aware step (Foret et al., ICLR 2021, Eq. 2; HarmoFL's weight perturbation,
    Jiang et al., AAAI 2022, Eq. 6-7). With the gradient g at w already in ``.grad``:
    epsilon = rho * g / ||g|| (one norm over all parameters), then the gradient of
    ``algo.loss`` is taken again at w + epsilon and left in ``.grad`` while the weights go
    back to w, so the optimiser applies the perturbed gradient at w. BN running statistics
    are not updated by the second forward pass."""
    params = [p for p in ctx.model.parameters() if p.grad is not None]
    norm = torch.norm(torch.stack([p.grad.norm(2) for p in params if p.grad is not None]), 2)
    scale = rho / (norm + 1e-12)
    saved = [p.detach().clone() for p in params]  # exact restore: (w + e) - e != w in float
    with torch.no_grad():
        for p in params:
            p.add_(p.grad * scale)
    ctx.model.zero_grad(set_to_none=True)
    with FrozenBNStats(ctx.model):
        algo.loss(ctx, x, y).backward()
    with torch.no_grad():
        for p, w in zip(params, saved, strict=True):
            p.copy_(w)


def last_epoch_start(ctx: ClientContext) -> int:
    """Index (from 0) of the first mini-batch step of the round's last local epoch: what FPL
    and ADCOL collect their uploads from (0 when the round is shorter than one epoch)."""
    return max(0, ctx.planned_steps() - ctx.steps_per_epoch())
