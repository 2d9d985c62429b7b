"""Adaptive gradient clipping (AGC), a local-training option of every algorithm
(``train.agc``): FedWon trains its normalisation-free models with it.

AGC is from NFNets (Brock, De, Smith & Simonyan, "High-Performance Large-Scale Image
Recognition Without Normalization", ICML 2021, arXiv 2102.06171, Sec. 3, Eq. 3). For each
*unit* i of a parameter (a row of a linear layer's weight, an output channel of a
convolution's kernel; a bias or gain vector is one unit as a whole, as in the NF-Nets
released code) with weight W_i and gradient G_i, Frobenius norms taken over the unit:

    G_i <- lambda * (||W_i||* / ||G_i||) * G_i   if ||G_i|| / ||W_i||* > lambda,
    G_i <- G_i                                    otherwise,                       (Eq. 3)

with ||W_i||* = max(||W_i||, eps), eps = 1e-3 (NFNets Sec. 3; ``train.agc_eps``), so that
zero-initialised parameters can still move. NFNets does not clip the final linear layer
(Sec. 4.1); fedshift follows (the model's ``classifier``; ``train.agc_head=true`` clips it
too). On a weight-standardised convolution the clipped weight is the raw W the optimiser
steps, not the standardised one.

The clipping runs in the default local step (:func:`fedshift.algorithms.local_train.sgd_steps`)
after ``backward``, the SAM pass and the algorithm's ``before_step`` (SCAFFOLD's correction)
and right before the optimiser step, so it bounds the update the optimiser applies. Algorithms
with their own step (DisTrans, FRAug) and the vectorised executor refuse ``train.agc``.
FedWon's threshold lambda is not in what could be read of its paper (abstract only); lambda
has no default here: ``train.agc`` is off unless set.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

__all__ = ["adaptive_clip_", "agc_parameters", "unitwise_norm"]

#: the floor of a gradient's unit norm in the clipping factor (no division by zero)
GRAD_FLOOR = 1e-6


def unitwise_norm(x: torch.Tensor) -> torch.Tensor:
    """Frobenius norm per unit: over all entries of a tensor of at most one dimension, else
    per index of dim 0 over the other dimensions (shape (n, 1, ..., 1), broadcastable)."""
    if x.dim() <= 1:
        return torch.linalg.vector_norm(x)
    dims = tuple(range(1, x.dim()))
    return torch.linalg.vector_norm(x, dim=dims, keepdim=True)


@torch.no_grad()
def adaptive_clip_(params: Iterable[torch.Tensor], clip: float, eps: float = 1e-3) -> None:
    """NFNets Eq. 3 on the ``.grad`` of every tensor in ``params`` (in place; tensors without
    a gradient are skipped)."""
    for p in params:
        g = p.grad
        if g is None:
            continue
        max_norm = unitwise_norm(p.detach()).clamp(min=eps) * clip
        g_norm = unitwise_norm(g)
        factor = max_norm / g_norm.clamp(min=GRAD_FLOOR)
        g.copy_(torch.where(g_norm > max_norm, g * factor, g))


def agc_parameters(model: nn.Module, head: bool) -> list[torch.Tensor]:
    """The parameters AGC clips: all of ``model``'s, less those of its ``classifier`` (the
    final linear layer, NFNets Sec. 4.1) unless ``head``."""
    skip: set[int] = set()
    classifier = getattr(model, "classifier", None)
    if not head and isinstance(classifier, nn.Module):
        skip = {id(p) for p in classifier.parameters()}
    return [p for p in model.parameters() if id(p) not in skip]
