"""fedshift's Dice metric and soft-Dice loss against MONAI's and torchmetrics' (issue 17), on
random label maps. Test-only dependencies: each test is skipped when its library is absent.

fedshift's metric (:mod:`fedshift.core.tasks`) is the per-image, per-class Dice of the arg-max
map, averaged per class over the images where the class is in the prediction or the ground
truth. The libraries give the per-image, per-class Dice; an image where a class is in neither
map has no Dice in fedshift (skipped), so those entries are masked out of the references
before the same average is taken. The maps are drawn so that every case occurs: classes in
both maps, in one only, and in neither.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fedshift.core.tasks import dice_counts, dice_from_counts, nanmean, soft_dice_loss

N, C, H, W = 6, 4, 12, 10


def _maps(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(pred, target) label maps (N, H, W) in which each image uses a random subset of the
    classes, so some classes are absent from one map or both."""
    g = torch.Generator().manual_seed(seed)
    maps = []
    for _ in range(2):
        allowed = torch.rand(N, C, generator=g) < 0.6
        allowed[:, 0] = True  # background always there
        scores = torch.rand(N, C, H, W, generator=g).masked_fill(~allowed[..., None, None], -1)
        maps.append(scores.argmax(1))
    pred, target = maps
    # both-absent, one-absent and both-present (class, image) pairs all occur
    inp, ing = F.one_hot(pred, C).amax((1, 2)), F.one_hot(target, C).amax((1, 2))
    assert ((inp == 0) & (ing == 0)).any() and (inp != ing).any() and (inp & ing).bool().any()
    return pred, target


def _fedshift(pred: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """fedshift's per-class Dice, and the (image, class) entries where the class is in the
    prediction or the target (where fedshift defines a Dice), found independently."""
    present = F.one_hot(pred, C).sum((1, 2)) + F.one_hot(target, C).sum((1, 2))
    return dice_from_counts(dice_counts(pred, target, C)), present > 0


def _masked_mean(per_image: torch.Tensor, defined: torch.Tensor) -> torch.Tensor:
    """Per class: the mean over the images where fedshift defines the Dice."""
    vals = torch.where(defined, per_image.double(), torch.nan)
    return torch.nanmean(vals, 0)


def _onehot(labels: torch.Tensor) -> torch.Tensor:
    return F.one_hot(labels, C).movedim(-1, 1).float()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_dice_reference_matches_monai(seed):
    """Per-class and mean Dice (foreground, all classes) equal MONAI's compute_dice."""
    metrics = pytest.importorskip("monai.metrics")
    pred, target = _maps(seed)
    ours, defined = _fedshift(pred, target)
    theirs = metrics.compute_dice(
        _onehot(pred), _onehot(target), include_background=True, ignore_empty=False
    )
    assert theirs.shape == (N, C)
    ref = _masked_mean(theirs, defined)
    torch.testing.assert_close(ours, ref, rtol=1e-6, atol=1e-7, equal_nan=True)
    assert nanmean(ours[1:]) == pytest.approx(nanmean(ref[1:]), rel=1e-6)
    assert nanmean(ours) == pytest.approx(nanmean(ref), rel=1e-6)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_dice_reference_matches_torchmetrics(seed):
    """Per-class Dice equals torchmetrics' dice_score (per sample, per class)."""
    seg = pytest.importorskip("torchmetrics.functional.segmentation")
    pred, target = _maps(seed)
    ours, defined = _fedshift(pred, target)
    theirs = seg.dice_score(
        pred, target, num_classes=C, include_background=True, average="none", input_format="index"
    )
    assert theirs.shape == (N, C)
    torch.testing.assert_close(
        ours, _masked_mean(theirs, defined), rtol=1e-6, atol=1e-7, equal_nan=True
    )


@pytest.mark.parametrize("seed", [0, 1])
def test_dice_reference_soft_dice_matches_monai(seed):
    """The soft-Dice loss equals MONAI's DiceLoss (softmax, batch-level sums, smoothing 1e-5)."""
    losses = pytest.importorskip("monai.losses")
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(N, C, H, W, generator=g, dtype=torch.float64) * 3
    _, target = _maps(seed)
    ref = losses.DiceLoss(
        include_background=True,
        to_onehot_y=True,
        softmax=True,
        batch=True,
        smooth_nr=1e-5,
        smooth_dr=1e-5,
    )(logits, target[:, None])
    torch.testing.assert_close(soft_dice_loss(logits, target), ref, rtol=1e-10, atol=1e-12)
