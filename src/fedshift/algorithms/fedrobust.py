"""FedRobust (Reisizadeh, Farnia, Pedarsani & Jadbabaie, "Robust Federated Learning: The Case
of Affine Distribution Shifts", NeurIPS 2020), the baseline of FedFA's Tables 1-4.

Model of the shift: client i sees its data through an unknown affine map x -> Lambda_i x +
delta_i. FedRobust trains the shared model against the worst such map near the identity, a
minimax problem (their penalised objective):

    min_w max_{Lambda_i, delta_i} (1/n) sum_i  E_{(x, y) ~ P_i}[ l(f_w(Lambda_i x + delta_i), y) ]
                                               - lam (||Lambda_i - I||_F^2 + ||delta_i||_2^2)

solved by local stochastic gradient descent-ascent (their Algorithm 1): in every local step the
client takes one mini-batch, computes the loss at the perturbed inputs, steps the model weights
down the gradient (the run's optimiser, ``train.*``) and its own (Lambda_i, delta_i) up the
gradient of the penalised objective with step ``adv_lr``; the server averages the model weights
only (Lambda_i, delta_i never leave the client and persist across rounds, starting from
Lambda_i = I, delta_i = 0). Aggregation weights: FedAvg's ``federation.weighting``; the paper's
objective weighs the n nodes equally (``paper_weighting = "uniform"``).

Where the affine map acts (``affine``):

* ``full`` (default, the paper's model): x is the flattened input of d = C x H x W values,
  Lambda_i is d x d, delta_i has d entries. d x d is 5.5 M values on 3 x 28 x 28 digits; inputs
  with more than ``max_full_dim`` values (Office/DomainNet at 256 x 256: d = 196,608) are
  rejected with a pointer to ``affine=channel``.
* ``channel``: Lambda_i is C x C, applied to every pixel's channel vector, delta_i has the
  input's shape (C, H, W): the reduced form for large images (a fedshift option: the FedFA
  paper does not say how it ran FedRobust on 256 x 256 images).

The map acts on the model's input as the pipeline hands it over (after ``input.mean/std``);
an affine map of normalised inputs is an affine map of the raw ones, so the model class is the
same.

Defaults and their sources. ``lam`` (penalty) = 1.0, ``adv_lr`` (ascent step) = 0.01 and one
ascent step per descent step: the FedRobust paper tunes lam and the ascent step per
experiment and FedFA's paper (Sec. 4.1, App. E) gives no FedRobust settings, so these are
fedshift's choices (the ascent step equals the model learning rate of FedFA's Table 9 for
Office/DomainNet); the FedRobust paper text is not in ``shared/papers`` and these values are
not checked against it. ``project`` (radius of an optional projection of ||Lambda_i - I||_F and
||delta_i||_2 after each ascent step; None = the penalised form only) is a fedshift option for
the constrained form of the same problem.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from fedshift.algorithms.base import FLParams, State
from fedshift.algorithms.fedavg import FedAvg
from fedshift.algorithms.state import ABSENT, StateVar, client_var
from fedshift.core.bounds import bounded
from fedshift.core.context import ClientContext
from fedshift.core.errors import ConfigError
from fedshift.core.payload import Payload

AFFINE = "affine"
#: ``ctx.scratch`` key of the round's working (Lambda_i, delta_i) (None until the first batch
#: of a client that has none yet)
ADV = "fedrobust/adv"
#: ``ctx.scratch`` key of the ascent step's working buffer (Lambda's shape), kept for the round
BUF = "fedrobust/step"


@dataclass
class FedRobustParams(FLParams):
    #: lam of the penalised minimax objective
    lam: float = bounded(1.0, ge=0)
    #: step size of the gradient ascent on (Lambda_i, delta_i)
    adv_lr: float = bounded(0.01, ge=0)
    #: "full": Lambda is d x d over the flattened input; "channel": C x C per pixel
    affine: Literal["full", "channel"] = "full"
    #: largest d = C x H x W accepted by affine=full
    max_full_dim: int = bounded(8192, ge=1)
    #: optional projection radius of ||Lambda - I||_F and ||delta||_2 (None: none)
    project: float | None = bounded(None, gt=0)

    def validate(self, prefix: str = "algorithm") -> None:
        if self.affine not in ("full", "channel"):
            raise ConfigError(
                f"config key '{prefix}.affine' must be 'full' or 'channel', got {self.affine!r}"
            )


def apply_affine(x: torch.Tensor, lam: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
    """Lambda x + delta for a batch ``x`` (B, C, H, W): ``lam`` d x d (full) or C x C
    (channel), ``delta`` of the input's shape (C, H, W)."""
    b = x.shape[0]
    if lam.shape[0] == x[0].numel():
        out = (x.reshape(b, -1) @ lam.T).reshape(x.shape)
    else:
        out = torch.einsum("ij,bj...->bi...", lam, x)
    return out + delta


def ascent_step(
    lam: torch.Tensor, grad: torch.Tensor, penalty: float, lr: float, scratch: dict
) -> torch.Tensor:
    """The ascent step on Lambda, ``lr * (grad - 2 penalty (Lambda - I))``, computed in a buffer
    kept in ``scratch`` (a d x d step on 3 x 28 x 28 inputs is 22 MB: one buffer a round, not
    five fresh ones a batch). The same float32 operations in the same order as the plain
    expression, so the same bits (tests/algorithms/test_fedfa.py); returns the buffer."""
    buf = scratch.get(BUF)
    if buf is None or buf.shape != lam.shape or buf.device != lam.device:
        buf = scratch[BUF] = torch.empty_like(lam)
    buf.copy_(lam)
    buf.diagonal().sub_(1.0)  # Lambda - I: the off-diagonal entries minus an exact 0
    buf.mul_(2 * penalty)
    torch.sub(grad, buf, out=buf)
    return buf.mul_(lr)


def _project(t: torch.Tensor, centre: torch.Tensor | float, radius: float) -> None:
    with torch.no_grad():
        diff = t - centre
        norm = float(diff.norm())
        if norm > radius:
            t.copy_(centre + diff * (radius / norm))


class FedRobust(FedAvg[FedRobustParams]):
    """FedAvg whose clients train against their own learned affine input shift (local SGDA)."""

    name = "fedrobust"
    trunk_cache_refusal = "perturbs the images (affine distribution shifts) before the trunk"
    Params = FedRobustParams
    paper_weighting = "uniform"

    def _init_affine(
        self,
        shape: tuple[int, ...],
        device: torch.device | None = None,
        dtype: torch.dtype | None = None,
    ) -> dict[str, torch.Tensor]:
        """(I, 0) on ``device`` (the batch's: a d x d identity is not built on the host and
        copied to a GPU)."""
        c = shape[0]
        d = 1
        for s in shape:
            d *= s
        if self.params.affine == "full":
            if d > self.params.max_full_dim:
                raise ConfigError(
                    f"algorithm 'fedrobust' with affine=full needs a {d} x {d} matrix for inputs "
                    f"of shape {shape} (more than algorithm.max_full_dim={self.params.max_full_dim}"
                    "); set algorithm.affine=channel (C x C per pixel) or raise max_full_dim"
                )
            lam = torch.eye(d, device=device, dtype=dtype)
        else:
            lam = torch.eye(c, device=device, dtype=dtype)
        return {"lambda": lam, "delta": torch.zeros(shape, device=device, dtype=dtype)}

    def client_vars(self) -> list[StateVar]:
        return [
            *super().client_vars(),
            client_var(AFFINE, ABSENT, doc="the adversarial affine transform (after round 1)"),
        ]

    def local_update(self, ctx: ClientContext, down: Payload, state: State) -> Payload:
        adv = None
        if AFFINE in state:
            adv = {
                k: v.to(ctx.device).clone().requires_grad_(True) for k, v in state[AFFINE].items()
            }
        ctx.scratch[ADV] = adv
        try:
            reply = super().local_update(ctx, down, state)
            adv = ctx.scratch[ADV]
            if adv is not None:
                state[AFFINE] = {k: v.detach().cpu().clone() for k, v in adv.items()}
        finally:
            del ctx.scratch[ADV]
            ctx.scratch.pop(BUF, None)
        return reply

    def loss(self, ctx: ClientContext, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The task loss at the perturbed inputs Lambda_i x + delta_i (the inner objective
        without its penalty, which does not depend on the model weights). The client's
        (Lambda_i, delta_i) (the round's, in ``ctx.scratch``) start at (I, 0) on its first
        batch, shaped by that batch."""
        if ADV not in ctx.scratch:
            raise RuntimeError("FedRobust.loss is only defined inside local_update")
        adv = ctx.scratch[ADV]
        if adv is None:
            init = self._init_affine(tuple(x.shape[1:]), x.device, x.dtype)
            adv = {k: v.requires_grad_(True) for k, v in init.items()}
            ctx.scratch[ADV] = adv
        return super().loss(ctx, apply_affine(x, adv["lambda"], adv["delta"]), y)

    def before_step(self, ctx: ClientContext) -> None:
        """The ascent step on (Lambda_i, delta_i): gradient of the loss minus the penalty's
        gradient 2 lam (Lambda - I), 2 lam delta; then the optional projection."""
        adv = ctx.scratch[ADV]
        lam, delta = adv["lambda"], adv["delta"]
        p = self.params
        with torch.no_grad():
            g_lam = lam.grad if lam.grad is not None else torch.zeros_like(lam)
            lam.add_(ascent_step(lam, g_lam, p.lam, p.adv_lr, ctx.scratch))
            g_delta = delta.grad if delta.grad is not None else torch.zeros_like(delta)
            delta.add_(p.adv_lr * (g_delta - 2 * p.lam * delta))
            lam.grad = None
            delta.grad = None
        if p.project is not None:
            eye = torch.eye(lam.shape[0], device=lam.device, dtype=lam.dtype)
            _project(lam, eye, p.project)
            _project(delta, 0.0, p.project)
