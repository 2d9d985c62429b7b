"""How an attack is scored: image similarity of a reconstruction to the site's nearest true
image (SSIM, PSNR: torchmetrics' implementations), and the ROC of a membership test (area
under the curve, true-positive rate at a low false-positive rate: Carlini et al.'s "first
principles" convention, IEEE S&P 2022)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fedshift.attacks.spectra import align

__all__ = ["Match", "RocScore", "nearest_image", "roc_score"]


@dataclass(frozen=True)
class Match:
    """A reconstruction's nearest true image: its index, SSIM and PSNR (dB), data range 1."""

    index: int
    ssim: float
    psnr: float


def _pair(recon: torch.Tensor, image: torch.Tensor) -> tuple[float, float]:
    # torchmetrics (and the scipy.signal it loads) imported where used: ~3 CPU s that every
    # process importing the attacks (the privacy protocols, the test suite's collection)
    # paid at import, scoring or not
    from torchmetrics.functional.image import (
        peak_signal_noise_ratio,
        structural_similarity_index_measure,
    )

    a, b = recon.float().clamp(0, 1)[None], image.float()[None]
    if a.dim() == 3:  # (1, H, W): one channel
        a, b = a[:, None], b[:, None]
    ssim = float(structural_similarity_index_measure(a, b, data_range=1.0))
    psnr = float(peak_signal_noise_ratio(a, b, data_range=1.0))
    return ssim, psnr


def nearest_image(recon: torch.Tensor, images: torch.Tensor, ambiguous: bool = False) -> Match:
    """The image of ``images`` (``(N, C, H, W)`` or ``(N, H, W)``, in ``[0, 1]``) that
    ``recon`` resembles most (highest SSIM; Hatamizadeh et al.'s closest-training-image score),
    with its SSIM and PSNR. ``ambiguous``: the reconstruction came from an amplitude spectrum,
    so it is first aligned to each image (:func:`~fedshift.attacks.spectra.align`)."""
    best: Match | None = None
    for i, image in enumerate(images):
        cand = align(recon, image).float() if ambiguous else recon
        ssim, psnr = _pair(cand, image)
        if best is None or ssim > best.ssim:
            best = Match(i, ssim, psnr)
    if best is None:
        raise ValueError("nearest_image: no images to compare with")
    return best


@dataclass(frozen=True)
class RocScore:
    """A membership test's ROC: ``auc``; ``tpr`` at false-positive rate at most ``fpr``;
    ``negatives``: how many non-members were scored (below ``1 / fpr`` the rate cannot be
    resolved: the TPR is then the one at no false positive at all)."""

    auc: float
    tpr: float
    fpr: float
    positives: int
    negatives: int


def roc_score(members: torch.Tensor, others: torch.Tensor, fpr: float = 1e-3) -> RocScore:
    """The ROC of scores (higher: "was in the set") of ``members`` against ``others``."""
    from torchmetrics.functional.classification import binary_auroc, binary_roc  # see _pair

    scores = torch.cat([members, others]).double()
    labels = torch.cat([torch.ones(len(members)), torch.zeros(len(others))]).long()
    auc = float(binary_auroc(scores, labels))
    fprs, tprs, _ = binary_roc(scores, labels)
    tpr = float(tprs[fprs <= fpr].max())
    return RocScore(auc, tpr, fpr, len(members), len(others))
