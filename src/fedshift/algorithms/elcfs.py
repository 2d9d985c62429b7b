"""FedDG-ELCFS (Liu, Chen, Qin, Dou & Heng, "FedDG: Federated Domain Generalization on Medical
Image Segmentation via Episodic Learning in Continuous Frequency Space", CVPR 2021; arXiv
2103.06030): episodic learning in continuous frequency space, for segmentation.

Source: the paper's abstract and Fig. 2 caption (the body text was not obtainable offline, so
section / equation numbers are unverified) and the released code (liuquande/FedDG-ELCFS,
``train_ELCFS.py``, ``dataloaders/fundus_dataloader.py``, ``networks/unet2d.py``).

* Continuous frequency space interpolation with a distribution bank (Sec. 3.2): the ``cfsi``
  augment, implied by this algorithm (:mod:`fedshift.augment.cfsi`: setup exchange of the
  amplitude spectra, interpolation A' = (1 - lambda) A_local + lambda A_other in a
  low-frequency window, own phase). Its parameters are set on the augment: ``augment: [{name:
  cfsi, alpha: ..., lam_min: ..., lam_max: ...}]``. It delivers each batch as the raw images
  followed by their frequency-transformed copies; this algorithm splits the two halves.
* Episodic learning (Sec. 3.3), per mini-batch of client k (raw x, transformed x', labels y):
  meta-train (inner) loss L_in = L_seg(f_theta(x), y) with the run's segmentation loss
  (``train.loss``; released: Dice on sigmoid outputs); fast weights
  theta' = theta - beta * clip(grad_theta L_in, -c, c), beta = ``meta_step`` 1e-3, c = ``clip``
  100 (released ``--meta_step_size``, ``--clip_value``); meta-test (outer) loss
  L_out = L_seg(f_theta'(x'), y) + gamma * L_boundary (gamma = 0.1, released); the local
  optimiser (``train.optimizer``; released: Adam lr 1e-3) steps theta on L_in + L_out. The
  outer forward is :func:`torch.func.functional_call` of the unchanged model with theta'.
  ``order=2`` (default; the meta-learning objective as MLDG-style episodic training writes
  it): grad_theta L_in is kept in the graph (``create_graph``), so L_out differentiates through
  theta' to theta including the second-order term. ``order=1`` (released code: its
  ``autograd.grad`` has no ``create_graph``, so the inner gradient is a constant): L_out reaches
  theta through theta' = theta - const only. BN running statistics are updated by both the
  inner and the outer forward pass (train mode), as in the released code.
* Boundary-oriented meta optimisation (Sec. 3.3): for every foreground class c (released:
  optic disc and cup; brain-mri: gray and white matter) the mask m_c = [y == c] gives the
  boundary region m_c - erode(m_c) and the background-near-boundary region dilate(m_c) - m_c
  (3 x 3 cross structuring element, ``contour_iters`` = 1 erosion and ``background_iters`` = 5
  dilations, released ``_get_coutour_sample``; outside the image counts as background). Each
  region is average-pooled, per image, over the per-pixel embedding ``model.features`` -- for
  the U-Net the output of the last decoder block ``dec1`` (B, w, H, W), the input of the 1x1
  classifier, the layer the released ``Unet2D`` returns as its embedding (``y1``). The pooled
  boundary (label 1) and background (label 0) embeddings of the inner pass (theta on x) and
  the outer pass (theta' on x') form one set per class; L_boundary = sum over classes of the
  NT-Xent loss (:func:`nt_xent`, temperature ``temperature`` = 0.05, released
  ``NTXentLoss(0.05)``). Images whose boundary or background region of a class is empty are
  left out of that class's set (the released fundus masks are never empty).
* Server: sample-size weighted averaging of the models (released ``update_global_model``:
  weights = slices per site), as FedAvg.

Requires a segmentation task and a model with a per-pixel ``features`` (the U-Net).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import torch
import torch.nn.functional as F
from torch.func import functional_call

from fedshift.algorithms.base import FLParams, State, Weighting
from fedshift.algorithms.fedavg import FedAvg
from fedshift.algorithms.local_train import keep_optimizers, run_steps
from fedshift.core.bounds import bounded
from fedshift.core.context import ClientContext
from fedshift.core.errors import ConfigError
from fedshift.models.base import FedModel

#: where the implied ``cfsi`` augment keeps its client state (``aug_key`` of the augment)
CFSI_STATE = "aug/cfsi"


@dataclass
class ELCFSParams(FLParams):
    # beta: the inner (meta-train) step size of the fast weights (released: 1e-3)
    meta_step: float = bounded(1e-3, gt=0)
    # c: the inner gradient is clamped elementwise to [-c, c] (released: 100)
    clip: float = bounded(100.0, gt=0)
    # 2: second-order meta gradient (default); 1: first order (released code)
    order: Literal[1, 2] = 2
    # gamma: weight of the boundary-oriented contrastive loss in the outer loss (released 0.1)
    gamma: float = bounded(0.1, ge=0)
    # tau of the NT-Xent loss (released: 0.05)
    temperature: float = bounded(0.05, gt=0)
    # erosions giving the boundary region m - erode(m) (released: 1)
    contour_iters: int = bounded(1, ge=1)
    # dilations giving the background-near-boundary region dilate(m) - m (released: 5)
    background_iters: int = bounded(5, ge=1)


# ------------------------------------------------------------------ boundary regions (masks)
def dilate(mask: torch.Tensor, iters: int = 1) -> torch.Tensor:
    """Binary dilation of (N, H, W) {0, 1} masks by the 3 x 3 cross, ``iters`` times; pixels
    outside the image count as 0 (scipy's ``binary_dilation`` default)."""
    m = mask
    for _ in range(iters):
        p = F.pad(m, (1, 1, 1, 1), value=0.0)
        m = torch.stack((m, p[:, :-2, 1:-1], p[:, 2:, 1:-1], p[:, 1:-1, :-2], p[:, 1:-1, 2:])).amax(
            0
        )
    return m


def erode(mask: torch.Tensor, iters: int = 1) -> torch.Tensor:
    """Binary erosion by the 3 x 3 cross, ``iters`` times; outside the image counts as 0, so a
    mask pixel on the border is eroded (scipy's ``binary_erosion`` default, border_value=0)."""
    m = mask
    for _ in range(iters):
        p = F.pad(m, (1, 1, 1, 1), value=0.0)
        m = torch.stack((m, p[:, :-2, 1:-1], p[:, 2:, 1:-1], p[:, 1:-1, :-2], p[:, 1:-1, 2:])).amin(
            0
        )
    return m


def boundary_regions(
    y: torch.Tensor, cls: int, contour_iters: int = 1, background_iters: int = 5
) -> tuple[torch.Tensor, torch.Tensor]:
    """(boundary, background-near-boundary) float masks (N, H, W) of class ``cls`` in the
    integer label maps ``y`` (N, H, W): m - erode(m) and dilate(m) - m."""
    m = (y == cls).float()
    return m - erode(m, contour_iters), dilate(m, background_iters) - m


def pooled(emb: torch.Tensor, region: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean embedding (N, D) of ``emb`` (N, D, H, W) over each image's ``region`` (N, H, W),
    and which images have a non-empty region (N,) bool."""
    area = region.sum((-2, -1))
    total = (emb * region.unsqueeze(1)).sum((-2, -1))
    return total / area.clamp_min(1.0).unsqueeze(1), area > 0


# ------------------------------------------------------------------ contrastive loss
def nt_xent(z: torch.Tensor, labels: torch.Tensor, temperature: float) -> torch.Tensor:
    """NT-Xent over labelled embeddings z (M, D) (the semantics of pytorch_metric_learning's
    ``NTXentLoss``, which the released code uses): s_ij = cos(z_i, z_j) / tau; for every
    ordered positive pair (i, p), i != p, same label,
        l_ip = -log( exp(s_ip) / (exp(s_ip) + sum_{n: label_n != label_i} exp(s_in)) ),
    and the loss is the mean over the positive pairs (0 when there is none)."""
    zn = F.normalize(z, dim=1)
    s = zn @ zn.T / temperature
    same = labels[:, None] == labels[None, :]
    eye = torch.eye(len(labels), dtype=torch.bool, device=z.device)
    pos = same & ~eye
    if not bool(pos.any()):
        return z.sum() * 0.0
    neg = ~same
    # log(exp(s_ip) + sum_n exp(s_in)) per pair, stably: logsumexp over {s_ip} U negatives of i
    neg_s = torch.where(neg, s, torch.full_like(s, float("-inf")))
    neg_lse = torch.logsumexp(neg_s, dim=1, keepdim=True).expand_as(s)  # -inf if no negative
    denom = torch.logaddexp(s, neg_lse)
    return (denom - s)[pos].mean()


def boundary_loss(
    embeddings: list[torch.Tensor],
    y: torch.Tensor,
    num_classes: int,
    temperature: float,
    contour_iters: int = 1,
    background_iters: int = 5,
) -> torch.Tensor:
    """L_boundary: sum over foreground classes of :func:`nt_xent` over the pooled boundary
    (label 1) and background-near-boundary (label 0) embeddings of every pass in
    ``embeddings`` (each (N, D, H, W), same labels ``y``)."""
    total = embeddings[0].sum() * 0.0
    for c in range(1, num_classes):
        contour, background = boundary_regions(y, c, contour_iters, background_iters)
        zs, labels = [], []
        for emb in embeddings:
            zc, okc = pooled(emb, contour)
            zb, okb = pooled(emb, background)
            ok = okc & okb
            zs += [zc[ok], zb[ok]]
            k = int(ok.sum())
            labels += [torch.ones(k, device=y.device), torch.zeros(k, device=y.device)]
        total = total + nt_xent(torch.cat(zs), torch.cat(labels), temperature)
    return total


# ------------------------------------------------------------------ the episodic step
class _FeaturesLogits(torch.nn.Module):
    """The model's (features, logits) in one forward, so that one ``functional_call`` with the
    fast weights gives both (parameter names prefixed ``m.``)."""

    def __init__(self, model: FedModel) -> None:
        super().__init__()
        self.m = model

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        z = self.m.features(x)
        return z, self.m.head(z)


def fast_weights(
    named: Sequence[tuple[str, torch.Tensor]],
    loss: torch.Tensor,
    meta_step: float,
    clip: float,
    second_order: bool,
) -> dict[str, torch.Tensor]:
    """theta' = theta - beta * clamp(grad_theta loss, -c, c); with ``second_order`` the
    gradient stays in the graph (d theta' / d theta includes the Hessian term)."""
    params = [p for _, p in named]
    grads = torch.autograd.grad(
        loss, params, create_graph=second_order, retain_graph=True, allow_unused=True
    )
    return {
        n: p if g is None else p - meta_step * g.clamp(-clip, clip)
        for (n, p), g in zip(named, grads, strict=True)
    }


def episodic_loss(
    model: FedModel,
    seg_loss: Any,
    x_raw: torch.Tensor,
    x_freq: torch.Tensor,
    y: torch.Tensor,
    params: ELCFSParams,
    num_classes: int,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """L_in + L_out of one episode (module docstring); returns the total and its parts."""
    wrapped = _FeaturesLogits(model)
    z_in, logits_in = wrapped(x_raw)
    inner = seg_loss(logits_in, y)
    named = [(f"m.{n}", p) for n, p in model.named_parameters() if p.requires_grad]
    fast = fast_weights(named, inner, params.meta_step, params.clip, params.order == 2)
    z_out, logits_out = functional_call(wrapped, fast, (x_freq,), strict=False)
    outer_seg = seg_loss(logits_out, y)
    bnd = (
        boundary_loss(
            [z_in, z_out],
            y,
            num_classes,
            params.temperature,
            params.contour_iters,
            params.background_iters,
        )  # fmt: skip
        if params.gamma > 0
        else outer_seg * 0.0
    )
    total = inner + outer_seg + params.gamma * bnd
    return total, {"inner": inner, "outer_seg": outer_seg, "boundary": bnd}


class ELCFS(FedAvg[ELCFSParams]):
    """FedAvg + CFSI (implied ``cfsi`` augment) + boundary-oriented episodic local steps."""

    name = "elcfs"
    Params = ELCFSParams
    tasks: ClassVar[tuple[str, ...]] = ("segmentation",)
    #: released ``update_global_model``: weights = slices per source site
    paper_weighting: ClassVar[Weighting] = "samples"

    @classmethod
    def implied_augments(cls, params: ELCFSParams) -> list[str]:
        return ["cfsi"]

    def setup(self, model: FedModel) -> None:
        self.num_classes = _num_classes(model)

    def local_train(self, ctx: ClientContext, state: State) -> tuple[int, float]:
        if ctx.state is None or CFSI_STATE not in ctx.state:
            raise ConfigError(
                "algorithm 'elcfs' needs the 'cfsi' augment (its frequency-transformed "
                "images); it is implied unless the config removes it"
            )
        model = ctx.model
        model.train()
        opt = self.make_optimizer(ctx, state)

        def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            n = x.shape[0] // 2
            opt.zero_grad(set_to_none=True)
            total, _ = episodic_loss(
                model, ctx.task.loss, x[:n], x[n:], y[:n], self.params, self.num_classes
            )
            total.backward()
            opt.step()
            return total

        out = run_steps(ctx, step)
        keep_optimizers(state, self.train, optimizer=opt)
        return out


def _num_classes(model: FedModel) -> int:
    """Output channels of the model's 1x1 classifier (the number of segmentation classes)."""
    head = getattr(model, "classifier", None)
    if not isinstance(head, torch.nn.Conv2d):
        raise ConfigError(
            "algorithm 'elcfs' needs a segmentation model with a per-pixel embedding and a "
            "1x1 convolution classifier (model 'unet')"
        )
    return head.out_channels
