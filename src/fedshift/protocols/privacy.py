"""``fedshift protocol privacy``: what a site gives away, method by method (issue 51).

The records each method sends are its declarations (:mod:`fedshift.core.disclosure`,
``fedshift privacy show``); this protocol attacks them. Over a config's grid (its cells run
through the cached bench machinery and their models loaded) or over finished run directories,
for each run the attacked site is its first training client, and:

* **What the site sends in a round** (:mod:`fedshift.protocols.privacy_runs`): its next local
  update's payload, as the server receives it: membership from the weights (the
  loss-threshold test: the reference row, FedAvg's being "weights only"), from prototypes
  and feature statistics (tracing), and model inversion of shared representations.
* **What the site computes from its images before training** (FedRDN's ``fedrdn_stats``,
  HarmoFL's ``amplitude``, ELCFS's ``cfsi_amplitudes``, FedMix's ``fedmix_means``): the same
  record computed, by the method's rule, on sites of ``n`` images drawn from the attacked
  site's domain (all its images, every split: one domain's population), for each ``n`` of
  ``--sizes``, and attacked (:mod:`fedshift.attacks`):

  ====================  ===================================  ==================================
  record                what one value summarises            attacks
  ====================  ===================================  ==================================
  ``fedrdn_stats``      the site's images: the mean of each  membership by site size (the
                        image's channel mean and std (Eq.    likelihood-ratio test), site
                        5-6)                                 property (which domain)
  ``amplitude``         the site's mean amplitude spectrum   membership by site size, site
                        (Eq. 3; sent as a decayed running    property, reconstruction (phase
                        mean of batch means)                 retrieval, inversion)
  ``cfsi_amplitudes``   one image: its amplitude spectrum    reconstruction of single images
  ``fedmix_means``      a group of ``m`` images: their mean  membership at ``n = m``; the mean
                                                             image as a reconstruction (the
                                                             positive control)
  ====================  ===================================  ==================================

Membership draws, per trial, a site of ``n`` images and ``n`` other images of the domain, the
attacker's reference sample being half the domain (disjoint from both); ROC over every
trial's scores (AUC; TPR at FPR 1e-3 with the count of non-members scored). HarmoFL's record
is a decayed running mean over mini-batches, not the plain mean the test assumes: its numbers
are then a lower bound. Site property: for each domain, sites of ``n`` images; a
nearest-class-mean probe, leave-one-site-out, says from the record which domain (scanner,
digit style) a site is, against chance. Reconstruction is scored by SSIM and PSNR to the
nearest image of the site (:func:`fedshift.attacks.scores.nearest_image`), beside the score
of the domain's mean image, which any attacker who knows the domain has without the record.

**A run protected by ``privacy.epsilon``** releases each protected record through the
Gaussian mechanism of its plan (:mod:`fedshift.runtime.privacy`): every image's vector
clipped to the record's ``clip``, noise of std ``sigma * 2 clip / m`` per value on a mean over
``m`` images. The records computed from images are attacked as released: the features
clipped the same way, each drawn site's record (and each group's, FedMix) given that noise,
and the membership test knowing its variance (:func:`fedshift.attacks.membership.llr`); the
site-property probe and the reconstructions read noisy records too (a luminance spectrum or
mean image: the noise of the mean of the channels' noisy values, ``std / sqrt(C)``). HarmoFL's
record is modelled as a plain mean, whose noise is the smallest its running mean can have:
the protected numbers are then an upper bound. Each such record gets a ``noise std per
value`` row. The weights row still reads the site's next upload before any noise of the
server's (central DP-FedAvg trusts the server with it); ``benchmarks/privacy_price.py``
attacks the released model.

A declared record no attack reads (SCAFFOLD's control variates, DisTrans's offsets, FRAug's
generator...) is listed under its method as *not attacked*, so the table's coverage is
explicit; a method that shares weights only says so and gets the weights row.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from fedshift.attacks.membership import membership_by_size
from fedshift.attacks.scores import nearest_image
from fedshift.attacks.site_property import probe_accuracy
from fedshift.attacks.spectra import align, amplitude, invert_amplitude, phase_retrieval
from fedshift.core.disclosure import UP
from fedshift.core.errors import ConfigError, FedshiftError
from fedshift.core.federation import Federation
from fedshift.core.files import save_figure
from fedshift.core.privacy import Mechanism, clip_rows
from fedshift.protocols.common import (
    ProtocolResult,
    SuiteOptions,
    load_run,
    output_dir,
    run_label,
    run_meta,
    save_outputs,
)
from fedshift.protocols.privacy_runs import attack_run

__all__ = [
    "SURFACES",
    "Surface",
    "domain_images",
    "fedrdn_features",
    "privacy",
    "record_attacks",
]


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
    """A record computed from a site's images alone, as the attacks see it: ``features``
    (per image) whose mean over a site is the record (None: the record is per image,
    nothing is averaged); ``group``: the record averages groups of this many images
    (FedMix), not the whole site; ``spectrum``: the record is an amplitude spectrum
    (reconstruction by phase retrieval)."""

    record: str
    features: Callable[[torch.Tensor], torch.Tensor] | None
    spectrum: bool = False
    group: int | None = None


#: the records computed from a site's images alone, by record name (as declared)
SURFACES: dict[str, Surface] = {
    "fedrdn_stats": Surface("fedrdn_stats", fedrdn_features),
    "amplitude": Surface("amplitude", amplitude_features, spectrum=True),
    "cfsi_amplitudes": Surface("cfsi_amplitudes", None, spectrum=True),
    "fedmix_means": Surface("fedmix_means", lambda x: x.flatten(1).double(), group=5),
}
#: records the round attacks of :mod:`fedshift.protocols.privacy_runs` read
ROUND_ATTACKED = ("weights", "prototypes", "ffa_stats", "features")


def domain_images(fed: Federation) -> dict[str, torch.Tensor]:
    """Every image of each client (train, validation and test: one domain's population), as
    float in ``[0, 1]``."""
    out = {}
    for c in fed.clients:
        parts = [s.x for s in (c.train, c.val, c.test) if s is not None and len(s.x)]
        x = torch.cat([torch.as_tensor(p[:]).float() for p in parts])
        if x.ndim != 4:
            raise ConfigError(f"protocol privacy: client {c.name!r} holds no images")
        out[c.name] = x
    return out


def _features(surface: Surface, x: torch.Tensor, release: Mechanism | None) -> torch.Tensor:
    """The per-image vectors the record averages, clipped as ``release`` clips them."""
    assert surface.features is not None
    feats = surface.features(x)
    return feats if release is None else clip_rows(feats, release.clip)


def _noise(release: Mechanism | None, m: int) -> float:
    """The noise std per value of the record, a mean over ``m`` images (0: not protected)."""
    return 0.0 if release is None else release.std(1.0 / m)


def _membership(
    surface: Surface,
    x: torch.Tensor,
    sizes: list[int],
    trials: int,
    seed: int,
    release: Mechanism | None = None,
):
    sizes = [surface.group] if surface.group is not None else sizes
    room = (len(x) - len(x) // 2) // 2
    if max(sizes) > room:
        raise ConfigError(
            f"protocol privacy: a site of {max(sizes)} images needs {4 * max(sizes)} images of "
            f"one domain (half of them the attacker's reference); the smallest domain has "
            f"{len(x)}: give smaller --sizes"
        )
    noise = None if release is None else (lambda m: _noise(release, m))
    feats = _features(surface, x, release)
    return {r.n: r.roc for r in membership_by_size(feats, sizes, trials, seed=seed, noise=noise)}


def _property(
    surface: Surface,
    images: dict[str, torch.Tensor],
    n: int,
    per: int,
    seed: int,
    release: Mechanism | None = None,
):
    """Probe accuracy at site size ``n``: ``per`` sites of each domain (their records
    released through ``release``'s noise where the run protects the record)."""
    gen = torch.Generator().manual_seed(seed)
    stats, labels = [], []
    for name, x in images.items():
        for _ in range(per):
            idx = torch.randperm(len(x), generator=gen)[:n]
            stat = _features(surface, x[idx], release).mean(0)
            if release is not None:
                stat = stat + _noise(release, n) * torch.randn(stat.shape, generator=gen).double()
            stats.append(stat)
            labels.append(name)
    return probe_accuracy(torch.stack(stats), labels)


def _reconstruct(
    surface: Surface, x: torch.Tensor, n: int, seed: int, release: Mechanism | None = None
) -> dict[str, Any]:
    """The reconstruction of one site of ``n`` images (one image for a per-image record),
    from the record released through ``release``'s noise where the run protects it."""
    gen = torch.Generator().manual_seed(seed)
    site = x[torch.randperm(len(x), generator=gen)[: (1 if surface.features is None else n)]]
    gray = site.mean(1)  # attacks and scores on the luminance: one channel, as SSIM reads it
    baseline = nearest_image(x.mean(0).mean(0), gray)  # the domain's mean image: no record

    def released(record: torch.Tensor, m: int) -> torch.Tensor:
        """``record`` (a luminance image or spectrum, a mean over ``m`` images) as the run
        releases it: the noise of the mean of the C channels' noisy values."""
        if release is None:
            return record
        std = _noise(release, m) / math.sqrt(x.shape[1])
        return record + std * torch.randn(record.shape, generator=gen).to(record.dtype)

    out: dict[str, Any] = {"baseline": baseline, "site": gray}
    if surface.spectrum:
        # the record: a (mean) amplitude spectrum; a noisy value below 0 is no amplitude
        amp = released(amplitude(gray).mean(0), len(site)).clamp_min(0)
        out["phase retrieval"] = pr = phase_retrieval(amp, seed=seed, restarts=2)
        out["phase retrieval score"] = nearest_image(pr, gray, ambiguous=True)
        out["inversion"] = inv = invert_amplitude(amp, seed=seed, restarts=1, steps=300)
        out["inversion score"] = nearest_image(inv, gray, ambiguous=True)
    elif surface.group is not None:
        mean = released(gray[: surface.group].mean(0), surface.group)  # as FedMix sends it
        out["mean image"] = mean
        out["mean image score"] = nearest_image(mean, gray[: surface.group])
    return out


def record_attacks(
    images: dict[str, torch.Tensor],
    target: str,
    record: str,
    sizes: list[int],
    seed: int,
    trials: int = 40,
    property_sites: int = 6,
    release: Mechanism | None = None,
) -> tuple[dict[str, float], dict[str, Any]]:
    """The attacks on one pre-training ``record`` (module docstring) of sites drawn from
    ``images[target]``'s domain, for one seed: ``({attack: value}, reconstructions)``.
    ``release``: the run protects the record with this mechanism (``privacy.epsilon``): it
    is attacked as released (module docstring)."""
    s = SURFACES[record]
    rows: dict[str, float] = {}
    prop_n = min(sizes)
    if s.features is not None:
        found = _membership(s, images[target], sizes, trials, seed, release)
        for n, roc in found.items():
            if release is not None:
                rows[f"noise std per value, {record}, n={n}"] = _noise(release, n)
            rows[f"membership AUC, {record}, n={n}"] = roc.auc
            rows[f"membership TPR at FPR {roc.fpr:g}, {record}, n={n}"] = roc.tpr
        if s.group is None and len(images) > 1:
            p = _property(s, images, prop_n, property_sites, seed, release)
            key = f"site property accuracy, {record}, n={prop_n} (chance {p.chance:.2f})"
            rows[key] = p.accuracy
    rec = _reconstruct(s, images[target], prop_n, seed, release)
    rows[f"SSIM of the domain's mean image (no record), {record}"] = rec["baseline"].ssim
    for key in ("phase retrieval", "inversion", "mean image"):
        if f"{key} score" in rec:
            rows[f"SSIM, {key}, {record}"] = rec[f"{key} score"].ssim
            rows[f"PSNR dB, {key}, {record}"] = rec[f"{key} score"].psnr
    return rows, rec


@dataclass
class _Method:
    """One method's rows over seeds, and what it sends that no attack reads."""

    rows: dict[str, list[float]]
    sent: list[str]
    unread: list[str]
    #: the records a run of it released through the Gaussian mechanism: "clip C, sigma s"
    protected: dict[str, str] = field(default_factory=dict)


def _sent_records(sim: Any) -> list[str]:
    """The records the run's site sends (its declarations, ``up``)."""
    return sorted({d.record for d in sim.algo.disclosures(sim.model) if d.direction == UP})


def attack_runs(
    run_dirs: Iterable[str | Path], sizes: list[int], trials: int, weights: str = "selected"
) -> tuple[dict[str, _Method], dict[str, Any], dict[str, Any]]:
    """Every attack on each finished run: rows grouped by the run's label over seeds, the
    reconstructions, and each run's own rows (by run directory: what the claims read)."""
    methods: dict[str, _Method] = {}
    pictures: dict[str, Any] = {}
    per_run: dict[str, Any] = {}
    for run_dir in run_dirs:
        sim = load_run(run_dir, weights)
        label = run_label(run_meta(sim))
        if sim.exp.privacy is not None:  # a protected run is not pooled with unprotected ones
            label += f" (privacy.epsilon={sim.cfg.privacy.epsilon:g})"
        sent = _sent_records(sim)
        m = methods.setdefault(label, _Method({}, sent, []))
        m.unread = [r for r in sent if r not in ROUND_ATTACKED and r not in SURFACES]
        found = attack_run(sim, seed=sim.cfg.seed)
        rows = dict(found["rows"])
        images = domain_images(sim.fed)
        plan = {} if sim.exp.privacy is None else sim.exp.privacy.mechanisms
        released = {r: v for r, v in plan.items() if r in SURFACES and r in sent}
        for record in (r for r in sent if r in SURFACES):
            more, rec = record_attacks(images, found["site"], record, sizes, sim.cfg.seed, trials,
                                       release=released.get(record))  # fmt: skip
            rows.update(more)
            pictures.setdefault(f"{label}: {record}", rec)
        for key, pic in found["pictures"].items():
            pictures.setdefault(f"{label}: {key}", pic)
        for key, value in rows.items():
            m.rows.setdefault(key, []).append(value)
        noisy = {r: {"clip": v.clip, "sigma": v.sigma} for r, v in released.items()}
        m.protected.update({r: f"clip {v['clip']:.4g}, sigma {v['sigma']:.4g}"
                            for r, v in noisy.items()})  # fmt: skip
        per_run[str(run_dir)] = {"label": label, "seed": sim.cfg.seed, "site": found["site"],
                                 "rows": rows, "protected": noisy}  # fmt: skip
    return methods, pictures, per_run


def _mean_sd(vals: list[float]) -> str:
    mu = sum(vals) / len(vals)
    if len(vals) < 2:
        return f"{mu:.3f} (one seed)"
    sd = math.sqrt(sum((v - mu) ** 2 for v in vals) / (len(vals) - 1))
    return f"{mu:.3f} ± {sd:.3f}"


def table(methods: dict[str, _Method]) -> str:
    """One Markdown table per method: attack, mean ± std over seeds; then its coverage."""
    lines = []
    for label, m in methods.items():
        only = m.sent == ["weights"]
        head = f"**{label}** (sends: {', '.join(m.sent) or 'nothing'})"
        lines += [head + (": weights only, the reference row" if only else ""), ""]
        if m.protected:
            shown = "; ".join(f"{r} ({how})" for r, how in sorted(m.protected.items()))
            lines += [f"Attacked as released through privacy.epsilon's noise: {shown}.", ""]
        lines += ["| attack | mean ± std over seeds |", "|---|---|"]
        lines += [f"| {k} | {_mean_sd(v)} |" for k, v in m.rows.items()]
        if m.unread:
            lines.append(f"\nNot attacked: {', '.join(m.unread)} (no attack reads them yet).")
        lines.append("")
    return "\n".join(lines)


def pictures_png(pictures: dict[str, Any], path: Path) -> Path | None:
    """Each reconstruction beside the site's nearest true image (None: there is none)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = []
    for label, rec in pictures.items():
        if isinstance(rec, tuple):  # (reconstruction, nearest image): representation inversion
            rows.append((label, rec[0], rec[1], float("nan")))
            continue
        gray = rec["site"]
        for key in ("phase retrieval", "inversion", "mean image"):
            if key in rec:
                score = rec[f"{key} score"]
                true = gray[score.index]
                shown = align(rec[key], true) if key != "mean image" else rec[key]
                rows.append((f"{label}, {key}", shown, true, score.ssim))
    if not rows:
        return None
    fig, axes = plt.subplots(len(rows), 2, figsize=(4.4, 2.1 * len(rows)), squeeze=False)
    for (label, img, true, ssim), (a, b) in zip(rows, axes, strict=True):
        a.imshow(img.clamp(0, 1), cmap="gray", vmin=0, vmax=1)
        a.set_title(label + ("" if math.isnan(ssim) else f"\nSSIM {ssim:.2f}"), fontsize=7)
        b.imshow(true, cmap="gray", vmin=0, vmax=1)
        b.set_title("nearest site image", fontsize=7)
        a.axis("off")
        b.axis("off")
    fig.tight_layout()
    return save_figure(fig, path)


def leakage_png(methods: dict[str, _Method], sizes: list[int], path: Path) -> Path:
    """Membership AUC against site size, one line per method and record (mean ± std over
    seeds), with the weights-only rows as horizontal references."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for label, m in methods.items():
        for record in SURFACES:
            keys = [(n, f"membership AUC, {record}, n={n}") for n in sizes]
            pts = [(n, m.rows[k]) for n, k in keys if k in m.rows]
            if len(pts) < 2:
                continue
            mus = [sum(v) / len(v) for _, v in pts]
            sds = [torch.tensor(v).std().item() if len(v) > 1 else 0.0 for _, v in pts]
            ax.errorbar([n for n, _ in pts], mus, yerr=sds, marker="o", capsize=3,
                        label=f"{label}: {record}")  # fmt: skip
        w = m.rows.get("membership AUC, weights (loss threshold)")
        if w and m.sent == ["weights"]:
            ax.axhline(sum(w) / len(w), ls=":", lw=1, label=f"{label}: weights (its site)")
    ax.axhline(0.5, color="grey", lw=0.8, ls="--", label="chance")
    ax.set_xscale("log")
    ax.set_xticks(sizes, [str(n) for n in sizes])
    ax.minorticks_off()
    ax.set_xlabel("images at the site (n)")
    ax.set_ylabel("membership AUC")
    ax.set_title("What a shared record gives away, by site size")
    ax.legend(fontsize=6)
    fig.tight_layout()
    return save_figure(fig, path)


def privacy(
    options: SuiteOptions | None = None,
    run_dirs: list[str | Path] | None = None,
    sizes: list[int] | None = None,
    trials: int = 40,
    out: str | Path | None = None,
    weights: str = "selected",
) -> ProtocolResult:
    """``fedshift protocol privacy``: the attacks of the module docstring on every cell of
    ``options``'s grid (run, cached, models kept) or on the finished ``run_dirs``; written
    to the output folder as ``privacy.md`` / ``privacy.json``, the leakage figure
    ``privacy.png`` and ``privacy-reconstructions.png``."""
    sizes = sorted(sizes or [10, 50, 200])
    if min(sizes) < 1:
        raise ConfigError(f"protocol privacy: site sizes must be >= 1, got {sizes}")
    if (options is None) == (not run_dirs):
        raise FedshiftError("protocol privacy: give a config (-c) or run directories (--run)")
    if options is not None:
        raw = options.load()
        folder = options.output_dir("privacy")
        summaries = options.run_cells(raw, folder / "privacy-suite.yaml", reuse=False)
        run_dirs = [s["run_dir"] for s in summaries]
    else:
        folder = output_dir(out, "privacy")
    methods, pictures, per_run = attack_runs(run_dirs or [], sizes, trials, weights)
    caption = (
        "What each method's site gives away: attacks on the records it sends (its "
        "declarations: `fedshift privacy show`), on the first training client of each run. "
        "Membership: AUC and TPR at FPR 1e-3 (weights: loss threshold on its next upload; "
        "statistics: likelihood-ratio or tracing tests); site property: which domain, from "
        "the record; SSIM / PSNR: reconstruction against the nearest image of the site, "
        "beside the domain's mean image (what an attacker has without the record)."
    )
    text = caption + "\n\n" + table(methods)
    data = {
        "sizes": sizes,
        "trials": trials,
        "runs": per_run,
        "methods": {k: {"sends": m.sent, "not_attacked": m.unread, "rows": m.rows}
                    for k, m in methods.items()},
    }  # fmt: skip
    files = save_outputs(folder, "privacy", "What a site gives away", text, data)
    files["png"] = leakage_png(methods, sizes, folder / "privacy.png")
    drawn = pictures_png(pictures, folder / "privacy-reconstructions.png")
    if drawn is not None:
        files["reconstructions"] = drawn
    return ProtocolResult("privacy", text, data, files)
