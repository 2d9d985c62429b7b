"""FRAug's building blocks (Chen et al., ICCV 2023): the MMD distance and the entropy of
Eq. 5-6, the ramp-up schedule (Sec. 3.2), the class prototypes of Eq. 4, and the shared
generator and the client's RTNet (Sec. 3.1)."""

from __future__ import annotations

import math
from collections import OrderedDict
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn


# ----------------------------------------------------------------------------- MMD
def pairwise_sq_dists(a: torch.Tensor) -> torch.Tensor:
    """``D[i, j] = ||a_i - a_j||^2`` by explicit differences (exactly symmetric, exact zeros)."""
    return (a.unsqueeze(0) - a.unsqueeze(1)).pow(2).sum(-1)


def mmd(
    x: torch.Tensor,
    y: torch.Tensor,
    kernel: Literal["gaussian", "mean_cov"] = "gaussian",
    kernel_mul: float = 2.0,
    kernel_num: int = 5,
    bandwidth: float | None = None,
) -> torch.Tensor:
    """Squared maximum mean discrepancy between the sample sets ``x`` (n, d) and ``y`` (m, d),
    as FRAug's released code computes it (``utils/loss_utils.py``, ``MMD_loss``).

    ``gaussian`` (the code's ``MMD_kernel``): the biased estimate
    ``mean K_xx + mean K_yy - 2 mean K_xy`` with a sum of ``kernel_num`` Gaussian kernels
    ``k(a, b) = sum_k exp(-||a - b||^2 / s_k)``, ``s_k = s * kernel_mul^(k - kernel_num // 2)``
    (default: s/4, s/2, s, 2s, 4s). ``s`` is ``bandwidth`` if given, else the mean squared
    distance over all ordered pairs of distinct indices of the pooled set ``[x; y]``, taken
    without gradient. (The code assumes n = m; for n = m this equals its
    ``mean(XX + YY - XY - YX)``.) Identical sets give exactly 0.

    ``mean_cov`` (the code's default ``MMD_loss()``, named "MMD" in its configs):
    ``mean((mu_x - mu_y)^2) + mean((C_x - C_y)^2)`` with unbiased covariances ``C``.
    """
    if x.ndim != 2 or y.ndim != 2 or x.shape[1] != y.shape[1]:
        raise ValueError(
            f"mmd needs (n, d) and (m, d) tensors, got {tuple(x.shape)}, {tuple(y.shape)}"
        )
    if kernel == "mean_cov":
        mx, my = x.mean(0, keepdim=True), y.mean(0, keepdim=True)
        cx = (x - mx).t() @ (x - mx) / (x.shape[0] - 1)
        cy = (y - my).t() @ (y - my) / (y.shape[0] - 1)
        return (mx - my).pow(2).mean() + (cx - cy).pow(2).mean()
    if kernel != "gaussian":
        raise ValueError(f"unknown MMD kernel {kernel!r}")
    n = x.shape[0]
    total = torch.cat([x, y], 0)
    d2 = pairwise_sq_dists(total)
    if bandwidth is None:
        size = total.shape[0]
        base = d2.detach().sum() / (size * size - size)
    else:
        base = torch.tensor(float(bandwidth), dtype=d2.dtype, device=d2.device)
    base = base.clamp_min(1e-12) / kernel_mul ** (kernel_num // 2)
    k = sum(torch.exp(-d2 / (base * kernel_mul**i)) for i in range(kernel_num))
    assert isinstance(k, torch.Tensor)
    return k[:n, :n].mean() + k[n:, n:].mean() - k[:n, n:].mean() - k[n:, :n].mean()


def entropy(logits: torch.Tensor) -> torch.Tensor:
    """Mean prediction entropy ``H = -1/B sum_i sum_k p_ik log p_ik`` (the code's ``HLoss``)."""
    return -(F.softmax(logits, 1) * F.log_softmax(logits, 1)).sum(1).mean()


# ----------------------------------------------------------------------------- schedule
def ramp_factor(rnd: int, rounds: int, gamma: float) -> float:
    """The released code's exponential ramp-up ``exp(gamma * (e - T))`` with ``e = rnd - 1``
    rounds already done (fedshift counts rounds from 1, the code from 0) and ``T = rounds``."""
    return math.exp(gamma * ((rnd - 1) - rounds))


def synthetic_weight(
    rnd: int, rounds: int, lambda_syn: float, gamma: float, ramp_up: bool = True
) -> float:
    """``w_t`` of Eq. 1: ``min(lambda_syn, ramp_factor)``; ``lambda_syn`` without ramp-up."""
    r = ramp_factor(rnd, rounds, gamma) if ramp_up else 1.0
    return min(lambda_syn, r)


# ----------------------------------------------------------------------------- prototypes
@torch.no_grad()
def update_prototypes(
    protos: torch.Tensor, u: torch.Tensor, y: torch.Tensor, momentum: float
) -> torch.Tensor:
    """Eq. 4: ``u_bar_c <- (1 - mu) u_bar_c + mu * mean{u_i : y_i = c}`` for every class ``c``
    in the batch; the other classes keep their prototype. Returns the new (C, d) tensor."""
    num_classes = protos.shape[0]
    onehot = F.one_hot(y, num_classes).to(u.dtype)  # (B, C)
    counts = onehot.sum(0)  # (C,)
    means = (onehot.t() @ u.detach()) / counts.clamp(min=1)[:, None]
    mu = (counts > 0).to(u.dtype)[:, None] * momentum
    return protos * (1 - mu) + means * mu


def cyclic_labels(offset: int, n: int, num_classes: int, device: torch.device) -> torch.Tensor:
    """Class-balanced labels ``(offset + i) mod C``, i = 0..n-1 (the code's ``y_fake``)."""
    return (torch.arange(n, device=device) + offset) % num_classes


# ----------------------------------------------------------------------------- networks
class Generator(nn.Module):
    """``g(z, y)``: ``[z, onehot(y)] -> Linear + BN1d + ReLU -> Linear + BN1d + ReLU -> R^d``
    (the released code's ``G``; hidden width ``d`` there)."""

    def __init__(self, noise_dim: int, num_classes: int, dim: int, hidden: int) -> None:
        super().__init__()
        self.noise_dim, self.num_classes = noise_dim, num_classes
        self.net = nn.Sequential(
            OrderedDict(
                fc1=nn.Linear(noise_dim + num_classes, hidden),
                bn1=nn.BatchNorm1d(hidden),
                relu1=nn.ReLU(inplace=True),
                fc2=nn.Linear(hidden, dim),
                bn2=nn.BatchNorm1d(dim),
                relu2=nn.ReLU(inplace=True),
            )
        )

    def forward(self, z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        onehot = F.one_hot(y, self.num_classes).to(z.dtype)
        return self.net(torch.cat([z, onehot], 1))


class RTNet(nn.Module):
    """``m``: the client-specific residual ``dec(enc([g, onehot(y)]))`` added to a base
    embedding (a real one, Eq. 2, or a class prototype, Eq. 3). ``enc = Linear + BN1d + ReLU``,
    ``dec = Linear + BN1d`` (the released code's ``FTNet`` with BN and the label input)."""

    def __init__(self, dim: int, num_classes: int, hidden: int) -> None:
        super().__init__()
        self.num_classes = num_classes
        self.encoder = nn.Sequential(
            OrderedDict(
                fc=nn.Linear(dim + num_classes, hidden),
                bn=nn.BatchNorm1d(hidden),
                relu=nn.ReLU(inplace=True),
            )
        )
        self.decoder = nn.Sequential(OrderedDict(fc=nn.Linear(hidden, dim), bn=nn.BatchNorm1d(dim)))

    def forward(
        self, base: torch.Tensor, g: torch.Tensor, y: torch.Tensor, scale: float = 1.0
    ) -> torch.Tensor:
        """``base + scale * m(g, y)``: Eq. 3 with ``scale = lambda_syn`` (paper); the released
        code adds the residual unscaled (``scale = 1``)."""
        onehot = F.one_hot(y, self.num_classes).to(g.dtype)
        residual = self.decoder(self.encoder(torch.cat([g, onehot], 1)))
        return base + residual if scale == 1.0 else base + scale * residual


def entropies(logits: torch.Tensor) -> torch.Tensor:
    """Per-sample prediction entropies ``H_i = -sum_k p_ik log p_ik`` (the terms of the sums
    over classes in Eq. 6)."""
    return -(F.softmax(logits, 1) * F.log_softmax(logits, 1)).sum(1)
