"""Differential privacy for model updates (``privacy.updates``, issue 53 item 2): DP-FedAvg's
client-level clipping and server noise (McMahan, Ramage, Talwar and Zhang, ICLR 2018,
"Learning differentially private recurrent language models", Algorithm 1 with the
fixed-denominator estimator and uniform weights).

**Unit and neighbours** (``privacy.updates=client``): one site and all its data; two
federations are neighbours when one site's data is present in one and absent in the other
(McMahan et al.'s user-level adjacency). A site's **update** in a round is the difference
``delta_k = w_k - w`` between the shared floating-point tensors it sends (record
``weights``) and the global ones it received; :func:`clip_update` scales it to L2 norm at most
``C`` (``privacy.update_clip``) over all those tensors together. The server releases

    w + (1/m) sum_{k in round} clip(delta_k) + N(0, (z C / m)^2 I)

where ``m`` is the number of clients sampled for the round (public: fixed before any site
trains; a client lost in the round counts as a zero update, so the denominator never depends
on the data) and ``z`` is the noise multiplier. Adding or removing one site moves the sum by
at most ``C``, so the mean's sensitivity is ``C / m`` and ``z`` is the noise std over that
sensitivity: one round is one Gaussian mechanism of noise multiplier ``z``
(:class:`UpdateMechanism`). The noise is drawn in float64 on the CPU from the stream of
(seed, ``privacy``, ``updates``, round), key by key in sorted order, so a resumed run adds
the same noise on any device.

Tensors that never leave the site (FedBN's local BatchNorm layers, personal heads, tensors
frozen by ``train.trainable``) are not in the ``weights`` record: not clipped, not charged.
Integer tensors in it (BatchNorm's ``num_batches_tracked``) count local steps, a function of
the site's size, which the ledger reveals anyway; they are averaged as sent, not clipped.
Imports only torch and ``core``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from fedshift.core.payload import Tensors
from fedshift.core.seeding import generator

__all__ = ["UpdateMechanism", "clip_update", "update_norm"]


def _float_keys(tensors: Tensors) -> list[str]:
    return sorted(k for k, t in tensors.items() if t.is_floating_point())


def update_norm(sent: Tensors, reference: Tensors) -> float:
    """The L2 norm of ``sent - reference`` over every floating-point tensor of ``sent``
    (float64)."""
    total = 0.0
    for k in _float_keys(sent):
        d = sent[k].detach().double().cpu() - reference[k].detach().double().cpu()
        total += float(d.pow(2).sum())
    return math.sqrt(total)


def clip_update(sent: Tensors, reference: Tensors, clip: float) -> tuple[Tensors, float]:
    """``sent`` with its update over ``reference`` scaled to L2 norm at most ``clip``
    (module docstring): each floating-point tensor becomes ``reference + s (sent -
    reference)`` with ``s = min(1, clip / norm)``, computed in float64 and returned in its
    dtype and device; an update within the bound is returned unchanged, integer tensors as
    sent. Also returns the update's norm before clipping."""
    missing = sorted(set(sent) - set(reference))
    if missing:
        raise ValueError(f"clip_update: no reference tensor for {missing[:3]}")
    norm = update_norm(sent, reference)
    if norm <= clip:
        return dict(sent), norm
    s = clip / norm
    out = dict(sent)
    for k in _float_keys(sent):
        t = sent[k]
        ref = reference[k].detach().double().cpu()
        clipped = ref + (t.detach().double().cpu() - ref) * s
        out[k] = clipped.to(device=t.device, dtype=t.dtype)
    return out, norm


@dataclass(frozen=True)
class UpdateMechanism:
    """The Gaussian mechanism on the mean of a round's clipped updates (module docstring)."""

    #: the L2 bound of one site's update (``privacy.update_clip``)
    clip: float
    #: noise std / the mean's sensitivity ``clip / m``
    noise_multiplier: float
    #: the run seed
    seed: int

    def std(self, clients: int) -> float:
        """The noise std per value of the mean over ``clients`` sampled clients:
        ``noise_multiplier * clip / clients``."""
        if clients < 1:
            raise ValueError(f"a round needs at least one client, got {clients}")
        return self.noise_multiplier * self.clip / clients

    def release(
        self, reference: Tensors, clipped: list[Tensors], clients: int, rnd: int
    ) -> Tensors:
        """``reference + sum(clipped - reference) / clients`` plus Gaussian noise of std
        :meth:`std` (``clients``: the round's sampled clients, at least ``len(clipped)``),
        per floating-point tensor of ``reference``; integer tensors are the rounded mean of
        ``clipped`` (as :func:`fedshift.algorithms.tensors.weighted_average` does)."""
        if not clipped or clients < len(clipped):
            raise ValueError(f"release of {len(clipped)} update(s) over {clients} clients")
        g = generator(self.seed, "privacy", "updates", rnd)
        std = self.std(clients)
        out: Tensors = {}
        for k in sorted(reference):
            ref = reference[k]
            if not ref.is_floating_point():
                acc = torch.stack([c[k].double().cpu() for c in clipped]).mean(dim=0)
                out[k] = acc.round().to(device=ref.device, dtype=ref.dtype)
                continue
            r = ref.detach().double().cpu()
            total = torch.zeros_like(r)
            for c in clipped:
                total += c[k].detach().double().cpu() - r
            noise = torch.randn(r.shape, generator=g, dtype=torch.float64) * std
            out[k] = (r + total / clients + noise).to(device=ref.device, dtype=ref.dtype)
        return out
