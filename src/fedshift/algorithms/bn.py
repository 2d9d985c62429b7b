"""Batch-norm helpers the algorithms share: the BN policy (which BN tensors stay on the
client) and a context that keeps BN running statistics unchanged during an extra forward
pass (SAM's second pass, DisTrans's offset step)."""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn

from fedshift.core.errors import ConfigError
from fedshift.models.base import FedModel, tracking_bn

BNPolicy = Literal["global", "local", "stats-local"]
BN_STATS = ("running_mean", "running_var", "num_batches_tracked")


def bn_layers(module: nn.Module) -> list[str]:
    """Qualified names of ``module``'s batch-norm layers (a FedModel's ``bn_layer_names``)."""
    if isinstance(module, FedModel):
        return module.bn_layer_names()
    return [n for n, m in module.named_modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]


def bn_keys(model: nn.Module, policy: BNPolicy) -> list[str]:
    """State-dict keys of ``model``'s BN layers that ``policy`` keeps local, in state-dict
    order: none (``global``), every BN tensor (``local``: weight, bias, running mean/var,
    counter, as FedBN) or the running statistics and counter only (``stats-local``)."""
    if policy == "global":
        return []
    layers = bn_layers(model)
    out = []
    for key in model.state_dict():
        owner, _, leaf = key.rpartition(".")
        if owner in layers and (policy == "local" or leaf in BN_STATS):
            out.append(key)
    return out


def require_bn_tensors(algorithm: str, policy: BNPolicy, model: FedModel) -> None:
    """Build-time check: a BN policy other than ``global`` must find tensors to keep local.

    Without it FedBN on a model whose BatchNorm has neither affine parameters nor running
    statistics (``model.bn=harmofl``: ``affine=False, track_running_stats=False``), or on a
    model without BN, keeps nothing local and silently runs FedAvg."""
    if policy == "global" or bn_keys(model, policy):
        return
    layers = model.bn_layer_names()
    what = (
        "running statistics"
        if policy == "stats-local"
        else "affine parameters or running statistics"
    )
    found = (
        f"its {len(layers)} BN layer(s) have no {what}" if layers else "it has no batch-norm layer"
    )
    raise ConfigError(
        f"algorithm {algorithm!r} with algorithm.bn_policy={policy!r} keeps BN tensors on the "
        f"clients, but model {type(model).__name__} has none to keep: {found} (model.bn=harmofl "
        "is BatchNorm without affine parameters or running statistics). Give this algorithm "
        "a model with standard BN (model.bn=standard, or bn=true for the digits models), or "
        "set algorithm.bn_policy=global"
    )


def _counter(m: nn.modules.batchnorm._BatchNorm) -> torch.Tensor:
    """A statistics-tracking BN layer's ``num_batches_tracked`` (typed Optional: it is None
    only in a layer that tracks none, which :func:`tracking_bn` leaves out)."""
    counter = m.num_batches_tracked
    assert counter is not None
    return counter


class FrozenBNStats:
    """Context: BN layers normalise with batch statistics but leave their running statistics
    and counters exactly as they were (momentum 0 for the pass, the counter restored; exact
    also when a layer runs several times per pass)."""

    def __init__(self, model: nn.Module) -> None:
        self.layers = tracking_bn(model)

    def __enter__(self) -> FrozenBNStats:
        self.saved = [(m, m.momentum, _counter(m).clone()) for m in self.layers]
        for m in self.layers:
            m.momentum = 0.0
        return self

    def __exit__(self, *exc: object) -> None:
        for m, momentum, count in self.saved:
            m.momentum = momentum
            _counter(m).copy_(count)
