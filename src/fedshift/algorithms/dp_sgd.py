"""The default local step under example-level DP-SGD (``privacy.updates=example``; the
mechanism and its accounting: :mod:`fedshift.core.dpsgd`).

:func:`dp_sgd_steps` replaces :func:`fedshift.algorithms.local_train.sgd_steps` when the
client's context carries a mechanism (``ctx.dpsgd``): ``planned_steps`` steps, each on a
Poisson-sampled batch, with the per-example gradients of the task loss computed by Opacus
(``GradSampleHooks`` on the working model, for the round only), clipped, summed and noised by
Opacus's ``DPOptimizer`` (its noise drawn on the CPU: :class:`_HostNoiseDPOptimizer`), then
the algorithm's data-free penalty gradient and adaptive gradient clipping (post-processing)
and the algorithm's optimiser step. Which algorithms take this step and which are refused
before any training: :mod:`fedshift.runtime.dpsgd`.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import torch

from fedshift.algorithms.agc import adaptive_clip_, agc_parameters
from fedshift.core.context import ClientContext
from fedshift.core.contract import State
from fedshift.core.contract_errors import expect
from fedshift.core.dpsgd import ExampleMechanism
from fedshift.core.seeding import generator

if TYPE_CHECKING:
    from fedshift.algorithms.base import Algorithm

__all__ = ["DPSGD_STEPS", "dp_sgd_steps", "per_example_gradients"]

#: ``ctx.scratch`` key: the DP-SGD steps the round took (the runtime checks them against
#: the plan, so a local loop that bypassed this step cannot pass unnoticed)
DPSGD_STEPS = "privacy/dpsgd_steps"


@contextmanager
def per_example_gradients(model: torch.nn.Module) -> Iterator[object]:
    """Opacus's per-sample gradient hooks on ``model`` while the block runs: each trainable
    parameter's ``grad_sample`` (batch, *shape) after a backward pass. In-place activations
    are switched off meanwhile (a module's backward hook cannot see through them; the
    numbers are the same) and everything is put back after."""
    from opacus.grad_sample.grad_sample_module import GradSampleHooks

    inplace = [m for m in model.modules() if getattr(m, "inplace", False) is True]
    for m in inplace:
        m.inplace = False  # type: ignore[assignment]
    try:
        with warnings.catch_warnings():
            # a first layer's input needs no gradient: PyTorch says its full backward hook
            # fires on the outputs' gradients, which is what Opacus reads
            warnings.filterwarnings("ignore", message="Full backward hook is firing")
            hooks = GradSampleHooks(model, batch_first=True, loss_reduction="mean", strict=True)
            try:
                yield hooks
            finally:
                hooks.cleanup()
    finally:
        for m in inplace:
            m.inplace = True  # type: ignore[assignment]


def _optimizer(opt: torch.optim.Optimizer, mech: ExampleMechanism, noise: torch.Generator):
    """Opacus's ``DPOptimizer`` around ``opt`` whose Gaussian noise is drawn in float64 on the
    CPU from ``noise`` (the same values on any device), key order = the parameters' order."""
    from opacus.optimizers import DPOptimizer

    class _HostNoiseDPOptimizer(DPOptimizer):
        def add_noise(self) -> None:
            std = self.noise_multiplier * self.max_grad_norm
            for p in self.params:
                s = p.summed_grad
                z = (
                    torch.randn(s.shape, generator=noise, dtype=torch.float64)
                    .mul(std)
                    .to(device=s.device, dtype=s.dtype)
                )  # float64 on the host, then where the gradient is
                p.grad = (s + z).view_as(p)

    return _HostNoiseDPOptimizer(
        opt, noise_multiplier=mech.noise_multiplier, max_grad_norm=mech.clip,
        expected_batch_size=mech.expected_batch, loss_reduction="mean",
    )  # fmt: skip


def _poisson_batches(
    ctx: ClientContext, mech: ExampleMechanism, steps: int
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The round's ``steps`` Poisson-sampled batches (Opacus's sampler on the client's batch
    generator), through the input pipeline and on the device; a batch may be empty."""
    from opacus.utils.uniform_sampler import UniformWithReplacementSampler

    split = ctx.data.train
    sampler = UniformWithReplacementSampler(
        num_samples=len(split), sample_rate=mech.sample_rate, generator=ctx.generator,
        steps=steps,
    )  # fmt: skip
    for indices in sampler:
        idx = torch.tensor(indices, dtype=torch.long).to(split.x.device)
        x = split.x[idx].to(ctx.device, non_blocking=True)
        y = split.y[idx].to(ctx.device, non_blocking=True)
        if len(indices) == 0:
            yield x, y  # no example drawn: the step is noise only
        else:
            yield ctx.pipeline.train(x, y, ctx.state, ctx.generator)


def dp_sgd_steps(algo: Algorithm, ctx: ClientContext, state: State) -> tuple[int, float]:
    """The round's DP-SGD steps (module docstring). Returns (steps taken, mean loss of the
    non-empty batches: task loss plus penalty, as :meth:`Algorithm.loss` reports it)."""
    mech = ctx.dpsgd
    assert mech is not None, "dp_sgd_steps without ctx.dpsgd"
    model = ctx.model
    model.train()
    opt = algo.make_optimizer(ctx, state)
    expect(opt, torch.optim.Optimizer, algo, "make_optimizer", "a torch.optim.Optimizer")
    agc = algo.train.agc
    agc_params = agc_parameters(model, algo.train.agc_head) if agc is not None else []
    noise = generator(mech.seed, "privacy", "dpsgd", ctx.round, ctx.cid)
    steps = ctx.planned_steps()
    total, losses, taken = torch.zeros((), device=ctx.device), 0, 0
    with per_example_gradients(model):
        dp = _optimizer(opt, mech, noise)
        params = list(dp.params)
        for x, y in _poisson_batches(ctx, mech, steps):
            dp.zero_grad(set_to_none=True)
            drawn = x.shape[0] > 0
            if drawn:
                loss = ctx.task.loss(model(x), y)
                loss.backward()
            else:  # no example drawn: a zero sum, noised all the same
                for p in params:
                    p.grad_sample = torch.zeros((0, *p.shape), device=p.device, dtype=p.dtype)
            dp.pre_step()  # Opacus: clip each example's gradient, sum, add noise, divide by q n
            penalty = algo.penalty(ctx)  # reads no data (runtime/dpsgd.py): post-processing
            if isinstance(penalty, torch.Tensor) and penalty.requires_grad:
                grads = torch.autograd.grad(penalty, params, allow_unused=True)
                for p, g in zip(params, grads, strict=True):
                    if g is not None:
                        p.grad = g if p.grad is None else p.grad + g
            if agc is not None:
                adaptive_clip_(agc_params, agc, algo.train.agc_eps)
            opt.step()
            taken += 1
            if drawn:
                extra = penalty.detach() if isinstance(penalty, torch.Tensor) else penalty
                total = total + loss.detach() + (0.0 if extra is None else extra)
                losses += 1
        for p in params:
            if hasattr(p, "summed_grad"):
                del p.summed_grad  # the optimiser's attribute: the model leaves as it came
    ctx.scratch[DPSGD_STEPS] = taken
    if algo.train.optimizer_state == "persist":  # as local_train.keep_optimizers
        state["optimizer"] = opt.state_dict()
    return taken, float(total) / max(losses, 1)
