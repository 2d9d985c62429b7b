"""Geometric training augmentation of the Office-Caltech-10 and DomainNet benchmarks.

``flip_rotate``: FedBN's training transforms for Office-Caltech-10 and DomainNet (med-air/FedBN
@2fa38ad, ``federated/fed_office.py`` / ``fed_domainnet.py``: ``Resize`` ->
``RandomHorizontalFlip()`` -> ``RandomRotation((-30, 30))`` -> ``ToTensor()``), written as
batched tensor operations on the raw [0, 1] batch (the loaders have already resized). FedFA's
released code (tfzhou/FedFA @57e9582, ``pyfed/manager/helper/build_dataset.py``) applies the
same two transforms to DomainNet but none to Office-Caltech-10 (resize only) nor to prostate
MRI; a config reproduces that by listing the augment or not.

1. each image is mirrored left-right with probability ``flip`` (torchvision's default 0.5);
2. each image is then rotated about its centre by an angle drawn uniformly from
   [-``degrees``, ``degrees``] (positive = counter-clockwise as displayed, torchvision's
   convention); pixels that come from outside the image are 0 (torchvision's default fill,
   black before normalisation), and the output keeps the input's size (``expand=False``).

The rotation is one ``affine_grid`` + ``grid_sample`` call for the whole batch, with a per-image
2x3 matrix that maps output to input coordinates in the normalised [-1, 1] frame
(``align_corners=False``, so the centre is the middle of the image, as torchvision rotates
about ((W - 1) / 2, (H - 1) / 2) in pixel coordinates). For an angle a and an H x W image the
inverse rotation in pixel units, rescaled to the normalised frame, is

    [[cos a, -sin a * H / W, 0],
     [sin a * W / H, cos a,  0]],

so non-square images rotate rigidly. The flip is an exact index reversal (``torch.where``
between the batch and its mirror), not a resampling.

``interpolation``: "bilinear" (default) samples the images bilinearly; "nearest" is what
FedBN's released transforms do (torchvision's ``RandomRotation`` interpolates with NEAREST
unless told otherwise).

Segmentation: a label map batch ``y`` of shape (N, H, W) gets the same flip and rotation,
always with nearest sampling (labels are never blended) and fill 0 = background
(``classes[0]``). Classification labels ((N,) integers or (N, classes) soft labels from an
earlier augment) pass through unchanged.

Randomness: the N flip draws and then the N angles come from the client's batch generator
passed to ``train_batch``, so runs are deterministic and resume bit for bit. A part that is
switched off (``flip=0`` or ``degrees=0``) draws nothing, so ``flip=0, degrees=0`` is exactly a
run without the augment. Evaluation is the identity (FedBN's test transform only resizes).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F

from fedshift.augment.base import Augment, State
from fedshift.core.bounds import bounded
from fedshift.core.errors import ConfigError

Interpolation = Literal["bilinear", "nearest"]


@dataclass
class FlipRotateParams:
    """Parameters of the ``flip_rotate`` augment (config keys ``augment.flip_rotate.*``)."""

    #: probability of a horizontal flip per image (FedBN: torchvision's default 0.5)
    flip: float = bounded(0.5, ge=0, le=1)
    #: rotation angles are uniform in [-degrees, degrees] (FedBN: 30)
    degrees: float = bounded(30.0, ge=0, le=180)
    #: image resampling of the rotation: "bilinear", or "nearest" (FedBN's released transform)
    interpolation: Interpolation = "bilinear"


def rotation_theta(angles: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """(N,) angles in degrees (counter-clockwise as displayed) -> (N, 2, 3) ``affine_grid``
    matrices that rotate H x W images about their centre (output -> input coordinates)."""
    rad = angles.to(torch.float64) * (math.pi / 180.0)
    cos, sin = torch.cos(rad), torch.sin(rad)
    zero = torch.zeros_like(rad)
    row0 = torch.stack((cos, -sin * (height / width), zero), dim=-1)
    row1 = torch.stack((sin * (width / height), cos, zero), dim=-1)
    return torch.stack((row0, row1), dim=-2)


def _is_label_map(x: torch.Tensor, y: torch.Tensor) -> bool:
    if y.ndim < 3:
        return False
    if y.shape != (x.shape[0], *x.shape[-2:]):
        raise ValueError(
            f"flip_rotate: label maps must be (N, H, W) = {(x.shape[0], *x.shape[-2:])} to "
            f"match the images {tuple(x.shape)}; got {tuple(y.shape)}"
        )
    return True


def flip_rotate(
    x: torch.Tensor,
    y: torch.Tensor,
    flips: torch.Tensor | None,
    angles: torch.Tensor | None,
    interpolation: Interpolation = "bilinear",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mirror the images where ``flips`` (N,) is true, then rotate image i by ``angles[i]``
    degrees (zero fill); label maps (N, H, W) follow with nearest sampling and fill 0.
    ``None`` skips a step."""
    seg = _is_label_map(x, y)
    if flips is not None:
        m = flips.to(device=x.device, dtype=torch.bool)
        x = torch.where(m.view(-1, 1, 1, 1), x.flip(-1), x)
        if seg:
            y = torch.where(m.view(-1, 1, 1), y.flip(-1), y)
    if angles is not None:
        h, w = x.shape[-2:]
        theta = rotation_theta(angles, h, w).to(device=x.device, dtype=x.dtype)
        grid = F.affine_grid(theta, list(x.shape), align_corners=False)
        x = F.grid_sample(x, grid, mode=interpolation, padding_mode="zeros", align_corners=False)
        if seg:
            lab = F.grid_sample(
                y[:, None].to(grid.dtype),
                grid,
                mode="nearest",
                padding_mode="zeros",
                align_corners=False,
            )
            y = lab[:, 0].round().to(y.dtype)
    return x, y


class FlipRotate(Augment):
    """Random horizontal flip + random rotation (FedBN's Office / DomainNet training
    transforms), per image, training only; see the module docstring."""

    name = "flip_rotate"
    Params = FlipRotateParams

    @classmethod
    def check(cls, params: Any, algorithm: str, others: list[str]) -> None:
        where = "config key 'augment.flip_rotate."
        if params.interpolation not in ("bilinear", "nearest"):
            raise ConfigError(
                f"{where}interpolation' must be 'bilinear' or 'nearest', "
                f"got {params.interpolation!r}"
            )

    def train_batch(
        self, x: torch.Tensor, y: torch.Tensor, state: State, generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        n, p = x.shape[0], self.params
        flips = angles = None
        if p.flip > 0:
            flips = torch.rand(n, generator=generator, device=generator.device) < p.flip
        if p.degrees > 0:
            u = torch.rand(n, generator=generator, device=generator.device, dtype=torch.float64)
            angles = (2.0 * u - 1.0) * p.degrees
        return flip_rotate(x, y, flips, angles, p.interpolation)


# ----------------------------------------------------------------------------- rot90_flip
@dataclass
class Rot90FlipParams:
    """Parameters of the ``rot90_flip`` augment (config keys ``augment.rot90_flip.*``)."""

    #: probability of a mirror per image (the axis, horizontal or vertical, is then a coin flip)
    flip: float = bounded(0.5, ge=0, le=1)


def rot90_flip(
    x: torch.Tensor,
    y: torch.Tensor,
    turns: torch.Tensor,
    flips: torch.Tensor,
    vertical: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Image i is rotated by ``turns[i]`` x 90 degrees counter-clockwise, then mirrored where
    ``flips[i]`` (up-down where ``vertical[i]``, else left-right). Exact index operations; label
    maps (N, H, W) follow. Square images only (a quarter turn swaps H and W)."""
    seg = _is_label_map(x, y)
    xs, ys = [], []
    for i in range(x.shape[0]):
        xi = torch.rot90(x[i], int(turns[i]), dims=(-2, -1))
        yi = torch.rot90(y[i], int(turns[i]), dims=(-2, -1)) if seg else y[i]
        if bool(flips[i]):
            dim = -2 if bool(vertical[i]) else -1
            xi = xi.flip(dim)
            yi = yi.flip(dim) if seg else yi
        xs.append(xi)
        ys.append(yi)
    return torch.stack(xs), torch.stack(ys)


class Rot90Flip(Augment):
    """HarmoFL's prostate MRI training augmentation (its App. C, "Prostate MRI segmentation",
    following Liu et al. 2020, MS-Net): each image is rotated by an angle drawn from
    {0, 90, 180, 270} degrees and flipped horizontally or vertically. fedshift draws the
    quarter turns uniformly and mirrors with probability ``flip`` along an axis chosen by a
    fair coin; with ``flip=0.5`` the eight symmetries of the square are equally likely (the
    paper gives no probabilities). Training only; label maps get the same transform.
    Randomness: N turns, N flip draws and N axis draws from the client's batch generator;
    evaluation is the identity."""

    name = "rot90_flip"
    Params = Rot90FlipParams  # flip's range: its bounds, checked as the config is read

    def train_batch(
        self, x: torch.Tensor, y: torch.Tensor, state: State, generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if x.shape[-1] != x.shape[-2]:
            raise ValueError(
                f"augment 'rot90_flip' needs square images (a quarter turn swaps height and "
                f"width), got {tuple(x.shape[-2:])}; resize the dataset to a square or use "
                "'flip_rotate'"
            )
        n, dev = x.shape[0], generator.device
        turns = torch.randint(0, 4, (n,), generator=generator, device=dev)
        flips = torch.rand(n, generator=generator, device=dev) < self.params.flip
        vertical = torch.rand(n, generator=generator, device=dev) < 0.5
        return rot90_flip(x, y, turns, flips, vertical)
