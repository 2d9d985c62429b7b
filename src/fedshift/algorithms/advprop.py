"""AdvProp (Xie, Tan, Gong, Wang, Yuille & Le, "Adversarial Examples Improve Image
Recognition", CVPR 2020) as a local training scheme under FedAvg.

DisTrans (Yuan et al., 2022) compares against "data transformation (or augmentation), i.e.
mixup and AdvProp" run inside FedAvg; this module is that baseline: FedAvg whose clients train
every local step on

    L(theta) = CE(f(x; theta, main BNs), y) + CE(f(x_adv; theta, auxiliary BNs), y)

the paper's Eq. 3 (clean examples plus adversarial examples as additional examples), with the
two-batch-norm rule of its Algorithm 1: the adversarial mini-batch is generated *through the
auxiliary BNs*, the clean loss uses the main BNs, the adversarial loss the auxiliary BNs, and the
sum is minimised over all shared weights. Test time uses the main BNs only.

Architecture (:meth:`AdvProp.wrap_model`): every batch-norm layer of the backbone becomes a
dual BN: the layer itself keeps being the main BN, at its original state-dict names
(``stages.conv1.bn.weight``...), and gets one child ``aux`` (``stages.conv1.bn.aux.weight``...),
a copy of the freshly initialised layer. A switch (:func:`auxiliary_bn`) routes a forward through
the auxiliary BNs. Both are BN layers of :meth:`FedModel.bn_layer_names`, so the run's
``bn_policy`` applies to main and auxiliary tensors alike; under the default ``global`` policy all
of them are averaged FedAvg-style.

Attacker (the paper's Sec. 5.1): PGD under the L-infinity norm, perturbation size ``epsilon``,
step size ``step_size`` (both in pixel levels out of 255, as the paper states them) and
``iterations`` steps; the paper uses epsilon in 1..4, step 1, ``n = epsilon + 1`` iterations
(``n = 1`` for epsilon 1), and finds that smaller models prefer weaker attackers. fedshift's
default is the weakest, epsilon = 1, step = 1, one iteration (the setting for small networks),
from the clean image (``random_start=false``). Pixel levels are turned into the model's input
units through the run's normalisation (``epsilon / 255 / std`` per channel) and adversarial
images are clipped to the valid range ``[(0 - mean) / std, (1 - mean) / std]``; when an augment
normalises inputs itself the scale is ``1 / 255`` and nothing is clipped.

The attack runs with the model in train mode (BN layers normalise with batch statistics, as in
the paper's on-the-fly generation) but records no running statistics: every BN buffer is put back
after the attack, so only the training forwards count (main BNs: the clean batch, auxiliary
BNs: the adversarial batch). Gradients of the attack are taken with respect to the input only;
parameter gradients are cleared before the training loss is computed.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from fedshift.algorithms.base import FLParams
from fedshift.algorithms.fedavg import FedAvg
from fedshift.core.bounds import bounded
from fedshift.core.context import ClientContext, Normalize
from fedshift.core.errors import ConfigError
from fedshift.core.federation import Federation
from fedshift.models.base import FedModel


@dataclass
class AdvPropParams(FLParams):
    # L-inf radius of the attack, in pixel levels out of 255 (paper: 1..4)
    epsilon: float = bounded(1.0, gt=0)
    # PGD step size, pixel levels out of 255 (paper: 1)
    step_size: float = bounded(1.0, gt=0)
    # PGD iterations (paper: epsilon + 1, or 1 for epsilon = 1)
    iterations: int = bounded(1, ge=1)
    # start PGD from a uniform draw in the epsilon ball instead of the clean image
    random_start: bool = False


# ----------------------------------------------------------------------------- dual BN
class _DualBN:
    """Mixin: a BN layer (the main BN, its own tensors) with an auxiliary BN child ``aux``;
    ``use_aux`` routes the forward through ``aux``."""

    use_aux: bool
    aux: nn.Module

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.use_aux:
            return self.aux(x)
        return super().forward(x)  # type: ignore[misc]


class DualBatchNorm1d(_DualBN, nn.BatchNorm1d):
    """BatchNorm1d (main) + auxiliary BatchNorm1d."""


class DualBatchNorm2d(_DualBN, nn.BatchNorm2d):
    """BatchNorm2d (main) + auxiliary BatchNorm2d."""


class DualBatchNorm3d(_DualBN, nn.BatchNorm3d):
    """BatchNorm3d (main) + auxiliary BatchNorm3d."""


_DUAL: dict[type, type] = {
    nn.BatchNorm1d: DualBatchNorm1d,
    nn.BatchNorm2d: DualBatchNorm2d,
    nn.BatchNorm3d: DualBatchNorm3d,
}


def make_dual(bn: nn.modules.batchnorm._BatchNorm) -> nn.Module:
    """A dual BN whose main BN is ``bn`` (same tensors and settings) and whose auxiliary BN is
    a copy of ``bn``."""
    cls = _DUAL.get(type(bn))
    if cls is None:
        raise ConfigError(
            f"algorithm 'advprop' cannot add an auxiliary BN to a {type(bn).__name__} layer "
            "(supported: BatchNorm1d/2d/3d)"
        )
    dual = cls(
        bn.num_features,
        eps=bn.eps,
        momentum=bn.momentum,
        affine=bn.affine,
        track_running_stats=bn.track_running_stats,
    )
    dual.load_state_dict(bn.state_dict())
    tensors = list(bn.parameters()) + list(bn.buffers())
    if tensors:
        dual.to(tensors[0].device)
    dual.train(bn.training)
    dual.aux = copy.deepcopy(bn)
    dual.use_aux = False
    return dual


def add_auxiliary_bn(model: nn.Module) -> nn.Module:
    """Replace every BatchNorm layer of ``model`` (in place) by a dual BN; idempotent."""
    targets = [
        (name, m)
        for name, m in model.named_modules()
        if isinstance(m, nn.modules.batchnorm._BatchNorm)
        and not isinstance(m, _DualBN)
        and not name.endswith(".aux")
    ]
    for name, bn in targets:
        parent_name, _, attr = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, attr, make_dual(bn))
    return model


def dual_layers(model: nn.Module) -> list[_DualBN]:
    return [m for m in model.modules() if isinstance(m, _DualBN)]


@contextmanager
def auxiliary_bn(model: nn.Module) -> Iterator[None]:
    """Route forwards through the auxiliary BNs inside the block (main BNs again after it)."""
    layers = dual_layers(model)
    for m in layers:
        m.use_aux = True
    try:
        yield
    finally:
        for m in layers:
            m.use_aux = False


@contextmanager
def frozen_bn_stats(model: nn.Module) -> Iterator[None]:
    """BN running statistics (and counters) of every layer are put back after the block."""
    saved = [
        (m, {k: v.clone() for k, v in m.named_buffers(recurse=False)})
        for m in model.modules()
        if isinstance(m, nn.modules.batchnorm._BatchNorm)
    ]
    try:
        yield
    finally:
        with torch.no_grad():
            for m, buffers in saved:
                for k, v in buffers.items():
                    getattr(m, k).copy_(v)


# ----------------------------------------------------------------------------- the attack
def pgd_attack(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    eps: torch.Tensor | float,
    step: torch.Tensor | float,
    iterations: int,
    lo: torch.Tensor | float = float("-inf"),
    hi: torch.Tensor | float = float("inf"),
    random_start: bool = False,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """L-infinity PGD (Madry et al.): ``x_adv <- clip_{x, eps}(x_adv + step * sign(grad))``,
    clipped to ``[lo, hi]``, maximising the cross-entropy of ``model`` (in whatever BN routing
    and mode the caller set). Only the input is differentiated; no parameter ``.grad`` is
    touched. ``eps``, ``step``, ``lo``, ``hi`` broadcast against ``x`` (per channel)."""
    x = x.detach()
    eps_t = torch.as_tensor(eps, dtype=x.dtype, device=x.device)
    lo_t = torch.as_tensor(lo, dtype=x.dtype, device=x.device)
    hi_t = torch.as_tensor(hi, dtype=x.dtype, device=x.device)
    low, high = torch.maximum(x - eps_t, lo_t), torch.minimum(x + eps_t, hi_t)
    x_adv = x.clone()
    if random_start:
        noise = torch.rand(x.shape, generator=generator, device="cpu").to(x.device, x.dtype)
        x_adv = torch.minimum(torch.maximum(x + (2 * noise - 1) * eps_t, low), high)
    for _ in range(iterations):
        x_adv.requires_grad_(True)
        loss = F.cross_entropy(model(x_adv), y)
        (grad,) = torch.autograd.grad(loss, x_adv)
        x_adv = torch.minimum(torch.maximum(x_adv.detach() + step * grad.sign(), low), high)
    return x_adv.detach()


# ----------------------------------------------------------------------------- algorithm
class AdvProp(FedAvg[AdvPropParams]):
    """FedAvg whose local steps minimise CE(clean; main BNs) + CE(PGD adversarial; aux BNs)."""

    name = "advprop"
    trunk_cache_refusal = "trains on adversarial images computed through the trunk"
    tasks = ("classification",)  # its objective needs one label per image
    Params = AdvPropParams

    @classmethod
    def wrap_model(cls, params: AdvPropParams, model: FedModel, federation: Federation) -> FedModel:
        """Every BN of the backbone becomes main + auxiliary BN (in place; main keys keep their
        names, auxiliary ones are ``<bn>.aux.*``)."""
        if not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules()):
            raise ConfigError(
                "algorithm 'advprop' needs a model with batch-norm layers (its auxiliary BNs "
                "are the method); e.g. model.name=cnn, or lenet5 with model.bn=true"
            )
        add_auxiliary_bn(model)
        return model

    def attack_scales(
        self, ctx: ClientContext, x: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(eps, step, lo, hi) in the model's input units (see the module docstring)."""
        p = self.params
        norm = ctx.pipeline.normalize
        if isinstance(norm, Normalize):
            std, mean = norm.std.to(x), norm.mean.to(x)
            lo, hi = (0 - mean) / std, (1 - mean) / std
        else:
            std = torch.ones((), dtype=x.dtype, device=x.device)
            lo = torch.full((), float("-inf"), dtype=x.dtype, device=x.device)
            hi = torch.full((), float("inf"), dtype=x.dtype, device=x.device)
        return p.epsilon / 255 / std, p.step_size / 255 / std, lo, hi

    def adversarial(self, ctx: ClientContext, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Algorithm 1, step 1: the adversarial mini-batch, generated through the auxiliary
        BNs in train mode, with no BN running statistic recorded."""
        eps, step, lo, hi = self.attack_scales(ctx, x)
        with frozen_bn_stats(ctx.model), auxiliary_bn(ctx.model):
            x_adv = pgd_attack(
                ctx.model,
                x,
                y,
                eps,
                step,
                self.params.iterations,
                lo,
                hi,
                self.params.random_start,
            )
        ctx.model.zero_grad(set_to_none=True)
        return x_adv

    def loss(self, ctx: ClientContext, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Eq. 3 with Algorithm 1's BN routing: CE(clean; main BNs) + CE(adversarial; aux)."""
        x_adv = self.adversarial(ctx, x, y)
        clean = F.cross_entropy(ctx.model(x), y)
        with auxiliary_bn(ctx.model):
            adv = F.cross_entropy(ctx.model(x_adv), y)
        loss = clean + adv
        extra = self.penalty(ctx)
        return loss if extra is None else loss + extra
