"""Reconstruction of images from their Fourier amplitude spectra: what HarmoFL's shared mean
amplitude (its Eq. 3) and ELCFS's per-image amplitude bank give an attacker.

An image's amplitude spectrum ``|F(x)|`` loses the phase; recovering ``x`` from it is the
phase retrieval problem. Two attacks, both on the amplitudes as shared:

* :func:`phase_retrieval`: Fienup's hybrid input-output iterations (Fienup, Appl. Opt. 1982)
  followed by error-reduction (Gerchberg-Saxton) steps, with the constraints an attacker can
  assume of an image: real, within ``[0, 1]`` and, where known, zero outside a support. Random
  restarts; the candidate whose amplitude fits best is kept.
* :func:`invert_amplitude`: the optimisation HarmoFL's appendix (Fig. 7) applies to its
  amplitudes, after inverting gradients (Geiping et al., NeurIPS 2020): an image in ``[0, 1]``
  (a sigmoid of free variables) fitted by Adam to the shared amplitude, with a total-variation
  prior.

The amplitude cannot tell an image from its circular shifts or its point reflection
``x(-r)``: :func:`align` undoes those before a reconstruction is scored.
"""

from __future__ import annotations

import torch

__all__ = ["align", "amplitude", "invert_amplitude", "phase_retrieval", "total_variation"]


def amplitude(x: torch.Tensor) -> torch.Tensor:
    """``|F(x)|``: the 2-D Fourier amplitude of each channel of ``x`` (``(..., H, W)``), as
    HarmoFL and ELCFS compute it (no shift, no log)."""
    return torch.fft.fft2(x.double()).abs()


def _project(amp: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``x`` with its Fourier amplitude replaced by ``amp`` (phase kept), back in space."""
    f = torch.fft.fft2(x)
    return torch.fft.ifft2(amp * torch.exp(1j * torch.angle(f))).real


def phase_retrieval(
    amp: torch.Tensor,
    support: torch.Tensor | None = None,
    iters: int = 400,
    er_iters: int = 100,
    beta: float = 0.9,
    restarts: int = 4,
    seed: int = 0,
) -> torch.Tensor:
    """An image whose amplitude spectrum is ``amp`` (``(C, H, W)`` or ``(H, W)``), by hybrid
    input-output then error reduction; ``support``: a boolean ``(H, W)`` mask outside which the
    image is zero (None: the whole frame). Returns the best of ``restarts`` random starts
    (lowest amplitude error), float32 in ``[0, 1]``."""
    amp = amp.double()
    if support is None:
        support = torch.ones(amp.shape[-2:], dtype=torch.bool)
    gen = torch.Generator().manual_seed(seed)
    best, best_err = None, float("inf")
    for _ in range(restarts):
        x = torch.rand(amp.shape, generator=gen, dtype=torch.float64) * support
        for i in range(iters + er_iters):
            y = _project(amp, x)
            ok = support & (y >= 0) & (y <= 1)
            if i < iters:  # hybrid input-output: push violations back
                x = torch.where(ok, y, x - beta * y)
            else:  # error reduction: project onto the constraints
                x = torch.where(support, y.clamp(0, 1), torch.zeros_like(y))
        x = torch.where(support, x.clamp(0, 1), torch.zeros_like(x))
        err = float((amplitude(x) - amp).norm() / amp.norm())
        if err < best_err:
            best, best_err = x, err
    assert best is not None
    return best.float()


def total_variation(x: torch.Tensor) -> torch.Tensor:
    """Mean absolute difference of neighbouring pixels (anisotropic TV): the image prior of
    the fitting attacks."""
    return (x[..., 1:, :] - x[..., :-1, :]).abs().mean() + (x[..., 1:] - x[..., :-1]).abs().mean()


def invert_amplitude(
    amp: torch.Tensor,
    support: torch.Tensor | None = None,
    steps: int = 600,
    lr: float = 0.05,
    tv: float = 1e-2,
    restarts: int = 2,
    seed: int = 0,
) -> torch.Tensor:
    """An image in ``[0, 1]`` fitted to ``amp`` by Adam (module docstring): the loss is the
    squared error of the log-amplitudes (``log1p``, so every frequency counts, not the DC term
    alone) plus ``tv`` times the image's total variation. Best of ``restarts``; float32."""
    target = torch.log1p(amp.double())
    mask = torch.ones(amp.shape[-2:]) if support is None else support.double()
    gen = torch.Generator().manual_seed(seed)
    best, best_loss = None, float("inf")
    for _ in range(restarts):
        z = torch.randn(amp.shape, generator=gen, dtype=torch.float64).requires_grad_()
        opt = torch.optim.Adam([z], lr=lr)
        for _ in range(steps):
            x = torch.sigmoid(z) * mask
            fit = (torch.log1p(amplitude(x)) - target).pow(2).mean()
            loss = fit + tv * total_variation(x)
            opt.zero_grad()
            loss.backward()
            opt.step()
        with torch.no_grad():
            x = torch.sigmoid(z) * mask
            fit = float((torch.log1p(amplitude(x)) - target).pow(2).mean())
        if fit < best_loss:
            best, best_loss = x.detach(), fit
    assert best is not None
    return best.float()


def align(recon: torch.Tensor, original: torch.Tensor) -> torch.Tensor:
    """``recon`` moved onto ``original`` through what its amplitude cannot tell: the circular
    shift (by the peak of the cross-correlation, over all channels) of itself or of its point
    reflection ``x(-r)``, whichever correlates better."""
    o = torch.fft.fft2(original.double() - original.double().mean())
    best, best_score = recon, float("-inf")
    reflected = torch.roll(torch.flip(recon, dims=(-2, -1)), shifts=(1, 1), dims=(-2, -1))
    for cand in (recon, reflected):
        c = torch.fft.fft2(cand.double() - cand.double().mean())
        corr = torch.fft.ifft2(o * c.conj()).real
        if corr.dim() > 2:
            corr = corr.sum(dim=tuple(range(corr.dim() - 2)))
        score = float(corr.max())
        if score > best_score:
            w = corr.shape[-1]
            idx = int(corr.argmax())
            best = torch.roll(cand, shifts=(idx // w, idx % w), dims=(-2, -1))
            best_score = score
    return best
