"""Model inversion of a shared representation: an image whose features match it.

ADCOL uploads representations of single examples, FedProto / FPL per-class means of them. An
attacker who holds the model (the server does: it aggregates it) looks for an input whose
features equal the shared vector: :func:`invert_features` fits an image in ``[0, 1]`` (a
sigmoid of free variables) by Adam to ``features(x) = target`` (squared error, relative to
the target's norm) with a total-variation prior, as inverting-gradients attacks do for
gradients (Geiping et al., NeurIPS 2020). It needs no decoder: only the forward path from
image to representation, which every such method exposes.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from fedshift.attacks.spectra import total_variation

__all__ = ["invert_features"]


def invert_features(
    features: Callable[[torch.Tensor], torch.Tensor],
    target: torch.Tensor,
    shape: tuple[int, ...],
    steps: int = 300,
    lr: float = 0.05,
    tv: float = 1e-2,
    seed: int = 0,
) -> torch.Tensor:
    """Images (``(B, *shape)``, one per row of ``target``: ``(B, d)``) whose ``features``
    match ``target``; ``features`` maps images in ``[0, 1]`` to ``(B, d)`` and must be
    differentiable. Returns float32 images, detached."""
    gen = torch.Generator().manual_seed(seed)
    z = torch.randn((len(target), *shape), generator=gen).requires_grad_()
    goal = target.detach().float()
    scale = goal.pow(2).sum(1).clamp_min(1e-12)
    opt = torch.optim.Adam([z], lr=lr)
    for _ in range(steps):
        x = torch.sigmoid(z)
        fit = ((features(x) - goal).pow(2).sum(1) / scale).mean()
        loss = fit + tv * total_variation(x)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return torch.sigmoid(z).detach()
