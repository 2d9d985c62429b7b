"""Normalisation-free models: FedWon's model option, usable with every algorithm.

FedWon (Zhuang & Lyu, "Is Normalization Indispensable for Multi-domain Federated Learning?",
ICLR 2024, arXiv 2306.05879, Sec. 3 and Fig. 2c) removes every normalisation layer of the
network and reparameterises every convolution with *scaled weight standardisation* (WSConv),
taken from the NF-ResNets of Brock, De & Smith ("Characterizing signal propagation to close
the performance gap in unnormalized ResNets", ICLR 2021, arXiv 2101.08692, Sec. 4). Per
output channel i of a kernel W with fan-in N (input channels x kernel height x width):

    W_hat_i = g_i * gamma * (W_i - mu_i) / (sigma_i * sqrt(N))                   (FedWon Eq. 1)

with mu_i, sigma_i^2 the mean and (population) variance of W_i's N entries, g_i a learnable
gain (initialised to 1, NF-Nets' affine gain) and gamma a fixed, nonlinearity-dependent gain:
for ReLU gamma = sqrt(2 / (1 - 1/pi)) ~ 1.7129 (NF-ResNets Sec. 4; the NF-Nets released code
uses the constant 1.7140: ``model.ws_gamma`` takes either), so that a standardised
layer followed by a ReLU keeps unit variance. The standardisation is computed in every
forward pass from the raw weight, so the raw weight, the bias and the gain are what the
optimiser steps and the server averages; nothing depends on the batch, and the model has no
running statistics (which is why FedWon trains with batch size 1). The denominator is
``sqrt(max(N sigma^2, eps))`` with eps = 1e-4 (the NF-Nets released code; the paper's eps is
unverified). FedWon's text was not obtainable here beyond the abstract; Eq. 1's form
(including gamma) is NF-ResNets' and the OpenReview reviews of FedWon confirm an Eq. 1 with
a gamma and that only convolutions are standardised (linear layers stay plain).

:func:`make_norm_free` converts a built model in place of its modules:

* ``norm="none"``: every normalisation layer (BatchNorm 1-d/2-d/3-d, InstanceNorm, GroupNorm,
  LayerNorm, LocalResponseNorm) becomes ``nn.Identity``; a convolution that had no bias
  (because a BN's shift followed it, ResNet / U-Net / DenseNet) gets a zero-initialised bias,
  as NF-Nets' WSConv has one;
* ``conv="ws"``: every ``nn.Conv2d`` becomes a :class:`WSConv2d` holding the same weight and
  bias plus the gain ``<conv>.gain``; state-dict keys of weights and biases are unchanged.

The two keys are the model keys ``model.norm`` (``keep`` | ``none``) and ``model.conv``
(``plain`` | ``ws``), with ``model.ws_gamma``; FedWon is ``model.norm=none model.conv=ws``
(:class:`NormFreeParams`). Every built-in model takes them (:func:`fedshift.models.build_model`
applies them after building the model and before loading ``model.weights``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from fedshift.core.bounds import bounded
from fedshift.core.errors import ConfigError

__all__ = [
    "NORM_FREE_KEYS",
    "NORM_TYPES",
    "RELU_GAMMA",
    "WS_EPS",
    "NormFreeParams",
    "WSConv2d",
    "is_norm_free",
    "make_norm_free",
    "norm_layer_names",
    "standardize_weight",
]

#: NF-ResNets' gain for ReLU (Brock et al. 2021a, Sec. 4): sqrt(2 / (1 - 1/pi))
RELU_GAMMA = math.sqrt(2.0 / (1.0 - 1.0 / math.pi))
#: the floor of N * sigma^2 under the square root (the NF-Nets released code's value)
WS_EPS = 1e-4
#: the normalisation layers ``norm="none"`` removes
NORM_TYPES: tuple[type[nn.Module], ...] = (
    nn.modules.batchnorm._NormBase,  # BatchNorm*d, InstanceNorm*d, SyncBatchNorm
    nn.GroupNorm,
    nn.LayerNorm,
    nn.LocalResponseNorm,
)
#: the model keys every built-in model accepts for this option
NORM_FREE_KEYS = ("norm", "conv", "ws_gamma")


@dataclass
class NormFreeParams:
    """FedWon's model option (config keys ``model.norm``, ``model.conv``, ``model.ws_gamma``),
    a base of every built-in model's parameters. Defaults leave the model as built."""

    #: "keep": the model's normalisation layers as built; "none": every one removed
    norm: Literal["keep", "none"] = "keep"
    #: "plain": ordinary convolutions; "ws": scaled weight standardisation (FedWon Eq. 1)
    conv: Literal["plain", "ws"] = "plain"
    #: the fixed gain gamma of Eq. 1 (ReLU's, NF-ResNets Sec. 4); used with conv=ws only
    ws_gamma: float = bounded(RELU_GAMMA, gt=0)


def standardize_weight(
    weight: torch.Tensor, gain: torch.Tensor, gamma: float, eps: float = WS_EPS
) -> torch.Tensor:
    """FedWon Eq. 1: per output channel (dim 0) of ``weight`` (C_out, C_in/groups, kh, kw),
    ``gain * gamma * (W - mean) / sqrt(max(N var, eps))`` with N the fan-in and var the
    population variance."""
    dims = tuple(range(1, weight.dim()))
    fan_in = math.prod(weight.shape[1:])
    mean = weight.mean(dim=dims, keepdim=True)
    var = weight.var(dim=dims, unbiased=False, keepdim=True)
    scale = torch.rsqrt(torch.clamp(var * fan_in, min=eps))
    shape = (-1,) + (1,) * (weight.dim() - 1)
    return (weight - mean) * scale * (gain.reshape(shape) * gamma)


class WSConv2d(nn.Conv2d):
    """``nn.Conv2d`` whose forward pass uses the standardised weight of FedWon Eq. 1
    (:func:`standardize_weight`) with a learnable per-channel ``gain`` (initialised to 1)."""

    def __init__(
        self,
        *args: object,
        gamma: float = RELU_GAMMA,
        eps: float = WS_EPS,
        **kwargs: object,
    ) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.gain = nn.Parameter(
            torch.ones(self.out_channels, device=self.weight.device, dtype=self.weight.dtype)
        )
        self.gamma = float(gamma)
        self.eps = float(eps)

    def standardized_weight(self) -> torch.Tensor:
        return standardize_weight(self.weight, self.gain, self.gamma, self.eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._conv_forward(x, self.standardized_weight(), self.bias)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, gamma={self.gamma:.4f}, eps={self.eps:g}"


def _ws_from(conv: nn.Conv2d, gamma: float, with_bias: bool) -> WSConv2d:
    """A WSConv2d holding ``conv``'s weight (and bias; a zero bias if ``with_bias`` and
    ``conv`` has none). Built on the meta device, so no random number is drawn."""
    w = conv.weight
    with torch.device("meta"):
        ws = WSConv2d(
            conv.in_channels,
            conv.out_channels,
            conv.kernel_size,  # type: ignore[arg-type]
            stride=conv.stride,
            padding=conv.padding,
            dilation=conv.dilation,
            groups=conv.groups,
            bias=conv.bias is not None or with_bias,
            padding_mode=conv.padding_mode,
            gamma=gamma,
        )
    ws = ws.to_empty(device=w.device).to(w.dtype)
    with torch.no_grad():
        ws.weight.copy_(w)
        ws.gain.fill_(1.0)
        if ws.bias is not None:
            ws.bias.copy_(conv.bias if conv.bias is not None else torch.zeros_like(ws.bias))
    ws.train(conv.training)
    return ws


def _add_bias(conv: nn.Conv2d) -> None:
    """Give a bias-free convolution a zero bias (what the removed BN's shift provided)."""
    w = conv.weight
    conv.bias = nn.Parameter(torch.zeros(conv.out_channels, device=w.device, dtype=w.dtype))


def make_norm_free(
    model: nn.Module,
    norm: str = "keep",
    conv: str = "plain",
    ws_gamma: float = RELU_GAMMA,
) -> nn.Module:
    """Apply FedWon's model option to ``model`` (in place; returned): ``norm="none"``
    replaces every normalisation layer by ``nn.Identity``, ``conv="ws"`` every ``nn.Conv2d``
    by a :class:`WSConv2d` with the same weight (see the module docstring)."""
    if norm not in ("keep", "none"):
        raise ConfigError(f"config key 'model.norm': {norm!r} is not valid; choose keep or none")
    if conv not in ("plain", "ws"):
        raise ConfigError(f"config key 'model.conv': {conv!r} is not valid; choose plain or ws")
    if norm == "keep" and conv == "plain":
        return model
    drop = norm == "none"
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if drop and isinstance(child, NORM_TYPES):
                setattr(parent, name, nn.Identity())
            elif isinstance(child, nn.Conv2d) and not isinstance(child, WSConv2d):
                if conv == "ws":
                    setattr(parent, name, _ws_from(child, ws_gamma, with_bias=drop))
                elif drop and child.bias is None:
                    _add_bias(child)
    return model


def norm_layer_names(model: nn.Module) -> list[str]:
    """Qualified names of ``model``'s normalisation layers (:data:`NORM_TYPES`)."""
    return [n for n, m in model.named_modules() if isinstance(m, NORM_TYPES)]


def is_norm_free(model: nn.Module) -> str | None:
    """Why ``model`` is not FedWon's model (no normalisation layer, no running-statistics
    buffer, every Conv2d a WSConv2d, at least one), or None if it is."""
    norms = norm_layer_names(model)
    if norms:
        return f"it has {len(norms)} normalisation layer(s) ({', '.join(norms[:3])}...)"
    convs = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.Conv2d)]
    plain = [n for n, m in convs if not isinstance(m, WSConv2d)]
    if plain:
        return f"its convolution(s) {', '.join(plain[:3])} are not weight-standardised"
    if not convs:
        return "it has no convolution to weight-standardise"
    return None
