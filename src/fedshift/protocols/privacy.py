"""``fedshift protocol privacy``: what the statistics a site shares before training give away
(issue 51).

FedRDN, HarmoFL, FedDG-ELCFS and FedMix send, besides (or before) any weights, a record
computed from the site's images alone. For each such record this protocol draws sites of
``n`` images from one real domain (a client of the config's dataset: all its images, every
split, are that domain's population), computes the record with the method's own function,
and attacks it (:mod:`fedshift.attacks`):

==========  ==========================================  ========================================
method      record (what one value summarises)           attacks
==========  ==========================================  ========================================
fedrdn      per-channel mean over images of each         membership by site size (likelihood
            image's channel mean and std (Eq. 5-6)      ratio), site property (which domain)
harmofl     the mean amplitude spectrum (Eq. 3; sent     membership by site size, site property,
            as a decayed running mean of batch means)    reconstruction (phase retrieval and
                                                         inversion of the site's mean spectrum)
elcfs       each image's amplitude spectrum (the bank)   reconstruction of single images (phase
                                                         retrieval: no support is known)
fedmix      means of groups of ``m`` images              membership at ``n = m``; the mean image
                                                         as a reconstruction (positive control)
==========  ==========================================  ========================================

Membership draws, per trial, a site of ``n`` images and ``n`` other images of the domain, the
attacker's reference sample being half the domain (disjoint from both); ROC over every
trial's scores (AUC; TPR at FPR 1e-3 with the count of non-members scored). HarmoFL's record is
a decayed running mean over mini-batches, not the plain mean the test assumes: its numbers
are then a lower bound of what the record gives away. Site property: for each domain, sites of
``n`` images; a nearest-class-mean probe, leave-one-site-out, says from the record which domain
(scanner, digit style) a site is, against chance. Reconstruction is scored by SSIM and PSNR to
the nearest image of the site (:func:`fedshift.attacks.scores.nearest_image`), beside the
score of the domain's mean image, which any attacker who knows the domain has without the
record.

Not here yet (issue 51 asks for them): statistics computed by a trained model (FedFA's feature
statistics, FedProto / FPL prototypes, ADCOL representations) and the weights-only FedAvg
membership reference, which need finished runs.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from fedshift.attacks.membership import membership_by_size
from fedshift.attacks.scores import nearest_image
from fedshift.attacks.site_property import probe_accuracy
from fedshift.attacks.spectra import align, amplitude, invert_amplitude, phase_retrieval
from fedshift.core.config import RunConfig
from fedshift.core.errors import ConfigError
from fedshift.core.federation import Federation
from fedshift.core.files import save_figure
from fedshift.data import run_federation
from fedshift.protocols.common import ProtocolResult, output_dir, save_outputs

__all__ = ["METHODS", "Surface", "audit", "domain_images", "fedrdn_features", "privacy"]


def fedrdn_features(x: torch.Tensor) -> torch.Tensor:
    """Per image, what FedRDN's record averages (Eq. 5-6): each channel's mean and std over
    H x W, ``(N, 2C)``; the record is their mean over the site
    (:func:`fedshift.augment.fedrdn.channel_statistics`, checked equal by the tests)."""
    flat = x.flatten(2).double()
    return torch.cat([flat.mean(2), flat.std(2, unbiased=False)], dim=1)


def amplitude_features(x: torch.Tensor) -> torch.Tensor:
    """Per image, its amplitude spectrum flattened: HarmoFL's record averages these."""
    return amplitude(x).flatten(1)


@dataclass(frozen=True)
class Surface:
    """One method's record as the attacks see it: ``features`` (per image) whose mean over a
    site is the record (None: the record is per image, nothing is averaged); ``group``: the
    record averages groups of this many images (FedMix), not the whole site; ``spectrum``: the
    record is an amplitude spectrum (reconstruction by phase retrieval)."""

    method: str
    record: str
    features: Callable[[torch.Tensor], torch.Tensor] | None
    spectrum: bool = False
    group: int | None = None


METHODS: dict[str, Surface] = {
    "fedrdn": Surface("fedrdn", "fedrdn_stats", fedrdn_features),
    "harmofl": Surface("harmofl", "amplitude", amplitude_features, spectrum=True),
    "elcfs": Surface("elcfs", "amplitude (bank)", None, spectrum=True),
    "fedmix": Surface("fedmix", "fedmix_means", lambda x: x.flatten(1).double(), group=5),
}


def domain_images(fed: Federation) -> dict[str, torch.Tensor]:
    """Every image of each client (train, validation and test: one domain's population), as
    float in ``[0, 1]``."""
    out = {}
    for c in fed.clients:
        parts = [s.x for s in (c.train, c.val, c.test) if s is not None and len(s.x)]
        out[c.name] = torch.cat([torch.as_tensor(p[:]).float() for p in parts])
    for name, x in out.items():
        if x.ndim != 4:
            raise ConfigError(
                f"protocol privacy: client {name!r} holds no images (shape {x.shape})"
            )
    return out


def _membership(surface: Surface, x: torch.Tensor, sizes: list[int], trials: int, seed: int):
    feats = surface.features(x)  # type: ignore[misc]
    sizes = [surface.group] if surface.group is not None else sizes
    room = (len(x) - len(x) // 2) // 2
    if max(sizes) > room:
        raise ConfigError(
            f"protocol privacy: a site of {max(sizes)} images needs {4 * max(sizes)} images of "
            f"one domain (half of them the attacker's reference); the smallest domain has "
            f"{len(x)}: give smaller --sizes"
        )
    return {r.n: r.roc for r in membership_by_size(feats, sizes, trials, seed=seed)}


def _property(surface: Surface, images: dict[str, torch.Tensor], n: int, per: int, seed: int):
    """Probe accuracy at site size ``n``: ``per`` sites of each domain."""
    gen = torch.Generator().manual_seed(seed)
    stats, labels = [], []
    for name, x in images.items():
        for _ in range(per):
            idx = torch.randperm(len(x), generator=gen)[:n]
            stats.append(surface.features(x[idx]).mean(0))  # type: ignore[misc]
            labels.append(name)
    return probe_accuracy(torch.stack(stats), labels)


def _reconstruct(surface: Surface, x: torch.Tensor, n: int, seed: int) -> dict[str, Any]:
    """The reconstruction of one site of ``n`` images (one image for a per-image record)."""
    gen = torch.Generator().manual_seed(seed)
    site = x[torch.randperm(len(x), generator=gen)[: (1 if surface.features is None else n)]]
    gray = site.mean(1)  # attacks and scores on the luminance: one channel, as SSIM reads it
    baseline = nearest_image(x.mean(0).mean(0), gray)  # the domain's mean image: no record
    out: dict[str, Any] = {"baseline": baseline, "site": site}
    if surface.spectrum:
        amp = amplitude(gray).mean(0)  # the record: a (mean) amplitude spectrum
        out["phase retrieval"] = pr = phase_retrieval(amp, seed=seed, restarts=2)
        out["phase retrieval score"] = nearest_image(pr, gray, ambiguous=True)
        out["inversion"] = inv = invert_amplitude(amp, seed=seed, restarts=1, steps=300)
        out["inversion score"] = nearest_image(inv, gray, ambiguous=True)
    elif surface.group is not None:
        mean = gray[: surface.group].mean(0)  # one group's mean image, as FedMix sends it
        out["mean image"] = mean
        out["mean image score"] = nearest_image(mean, gray[: surface.group])
    return out


def audit(
    fed: Federation,
    methods: list[str],
    sizes: list[int],
    seeds: list[int],
    trials: int = 40,
    property_sites: int = 6,
) -> dict[str, Any]:
    """Every attack of the module docstring on each method's record, per seed; returns
    ``{method: {attack: [value per seed]}}`` and the reconstructions of the first seed."""
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise ConfigError(
            f"protocol privacy: no attack for {', '.join(unknown)}; methods whose records are "
            f"attacked: {', '.join(METHODS)} (FedAvg and FedBN share weights only)"
        )
    images = domain_images(fed)
    target = next(iter(images))  # the attacked site's domain: the federation's first client
    prop_n = min(sizes)
    results: dict[str, Any] = {}
    pictures: dict[str, Any] = {}
    for m in methods:
        s = METHODS[m]
        rows: dict[str, list[float]] = {}

        def add(key: str, value: float, rows: dict[str, list[float]] = rows) -> None:
            rows.setdefault(key, []).append(value)

        for seed in seeds:
            if s.features is not None:
                for n, roc in _membership(s, images[target], sizes, trials, seed).items():
                    add(f"membership AUC, n={n}", roc.auc)
                    add(f"membership TPR at FPR {roc.fpr:g}, n={n}", roc.tpr)
                if s.group is None:
                    p = _property(s, images, prop_n, property_sites, seed)
                    add(f"site property accuracy, n={prop_n} (chance {p.chance:.2f})", p.accuracy)
            rec = _reconstruct(s, images[target], prop_n, seed)
            add("SSIM of the domain's mean image (no record)", rec["baseline"].ssim)
            for key in ("phase retrieval", "inversion", "mean image"):
                if f"{key} score" in rec:
                    add(f"SSIM, {key}", rec[f"{key} score"].ssim)
                    add(f"PSNR dB, {key}", rec[f"{key} score"].psnr)
            if seed == seeds[0]:
                pictures[m] = rec
        results[m] = rows
    return {"target": target, "results": results, "pictures": pictures}


def table(results: dict[str, dict[str, list[float]]]) -> str:
    """One Markdown table per method: attack, mean ± std over seeds."""
    lines = []
    for m, rows in results.items():
        lines += [f"**{m}** ({METHODS[m].record})", "", "| attack | mean ± std |", "|---|---|"]
        for key, vals in rows.items():
            mu = sum(vals) / len(vals)
            sd = (
                math.sqrt(sum((v - mu) ** 2 for v in vals) / (len(vals) - 1))
                if len(vals) > 1
                else 0
            )
            lines.append(f"| {key} | {mu:.3f} ± {sd:.3f} |")
        lines.append("")
    return "\n".join(lines)


def pictures_png(pictures: dict[str, Any], path: Path) -> Path:
    """Each method's reconstructions beside the site's nearest true image."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = []
    for m, rec in pictures.items():
        gray = rec["site"].mean(1)
        for key in ("phase retrieval", "inversion", "mean image"):
            if key in rec:
                score = rec[f"{key} score"]
                true = gray[score.index]
                shown = align(rec[key], true) if METHODS[m].spectrum else rec[key]
                rows.append((f"{m}: {key}", shown, true, score.ssim))
    fig, axes = plt.subplots(len(rows), 2, figsize=(4, 2 * max(len(rows), 1)), squeeze=False)
    for (label, img, true, ssim), (a, b) in zip(rows, axes, strict=True):
        a.imshow(img.clamp(0, 1), cmap="gray", vmin=0, vmax=1)
        a.set_title(f"{label}\nSSIM {ssim:.2f}", fontsize=7)
        b.imshow(true, cmap="gray", vmin=0, vmax=1)
        b.set_title("nearest site image", fontsize=7)
        a.axis("off")
        b.axis("off")
    fig.tight_layout()
    return save_figure(fig, path)


def leakage_png(results: dict[str, dict[str, list[float]]], sizes: list[int], path: Path) -> Path:
    """Membership AUC against site size, one line per method (mean ± std over seeds)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5))
    for m, rows in results.items():
        pts = [
            (n, rows[f"membership AUC, n={n}"]) for n in sizes if f"membership AUC, n={n}" in rows
        ]
        if len(pts) < 2:
            continue
        xs = [n for n, _ in pts]
        mus = [sum(v) / len(v) for _, v in pts]
        sds = [torch.tensor(v).std().item() if len(v) > 1 else 0.0 for _, v in pts]
        ax.errorbar(xs, mus, yerr=sds, marker="o", capsize=3, label=f"{m} ({METHODS[m].record})")
    ax.axhline(0.5, color="grey", lw=0.8, ls="--", label="chance (no record)")
    ax.set_xscale("log")
    ax.set_xticks(sizes, [str(n) for n in sizes])
    ax.minorticks_off()
    ax.set_xlabel("images at the site (n)")
    ax.set_ylabel("membership AUC")
    ax.set_title("What a shared statistic gives away, by site size")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return save_figure(fig, path)


def privacy(
    cfg: RunConfig,
    methods: list[str],
    sizes: list[int],
    seeds: list[int],
    trials: int = 40,
    out: str | Path | None = None,
) -> ProtocolResult:
    """``fedshift protocol privacy``: :func:`audit` on the federation of ``cfg`` (its dataset
    and partition), written to ``out`` as ``privacy.md`` / ``privacy.json``, the leakage figure
    ``privacy.png`` and the reconstructions ``privacy-reconstructions.png``."""
    if not methods or not sizes or not seeds:
        raise ConfigError("protocol privacy: give at least one method, one size and one seed")
    if min(sizes) < 1:
        raise ConfigError(f"protocol privacy: site sizes must be >= 1, got {sizes}")
    fed = run_federation(cfg)
    res = audit(fed, methods, sorted(sizes), seeds, trials)
    folder = output_dir(out, "privacy")
    caption = (
        f"Attacks on the records each method shares, on {cfg.dataset.name} (attacked domain: "
        f"{res['target']}; seeds {', '.join(map(str, seeds))}; {trials} trials a size). "
        "Membership: likelihood-ratio test on the record of a site of n images; site property: "
        "which domain, from the record; SSIM / PSNR: reconstruction against the nearest image "
        "of the site, beside the domain's mean image (what an attacker has without the record)."
    )
    text = caption + "\n\n" + table(res["results"])
    data = {"dataset": cfg.dataset.name, "target": res["target"], "sizes": sizes, "seeds": seeds,
            "trials": trials, "results": res["results"]}  # fmt: skip
    files = save_outputs(folder, "privacy", "What a site gives away", text, data)
    files["png"] = leakage_png(res["results"], sorted(sizes), folder / "privacy.png")
    files["reconstructions"] = pictures_png(res["pictures"], folder / "privacy-reconstructions.png")
    return ProtocolResult("privacy", text, data, files)
