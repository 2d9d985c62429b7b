"""``fedshift data check``: the shift report of a federation, from config to files.

:func:`check` loads a config's dataset (the loaders' own checks run first), builds the fixed
model of the ``features`` axis, measures the sites (:func:`fedshift.shift.measure.measure`) and
writes, atomically, into one folder:

* ``report.md``: the tables and the recommendation (also printed);
* ``shift.json``: the same numbers for scripts (keys in :func:`to_json`);
* ``montage.png``: a few images of each site;
* ``intensity.png``, ``amplitude.png``, ``features.png``, ``labels.png``: one figure per
  axis, the per-site quantity on the left and the site-to-site distances on the right.

**The recommendation rule.** The axis with the largest score is the dominant shift and its
methods are recommended; any other axis scoring at least :data:`CLOSE` times as much is named
beside it with its methods. When no axis reaches :data:`NOTABLE` (0.14, a large effect for
eta^2 by Cohen's conventions; 0.06 is medium, 0.01 small: :data:`SIZES`), no shift method is
called for. The features axis sees the input-level shifts too (a random
network's feature statistics move when the intensities or the spectrum do), but more weakly
than the input axis that measures a single such shift directly: it leads when several
input-level differences combine (the brain-mri scanners: contrast, bias field, blur, noise) or
when the sites differ beyond the input statistics (content, texture, style).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from fedshift import __version__
from fedshift.core.components import Component
from fedshift.core.config import RunConfig
from fedshift.core.context import Normalize, Resize, model_input_shape
from fedshift.core.files import atomic_output, write_text_atomic
from fedshift.core.seeding import seed_global
from fedshift.data import load_dataset
from fedshift.models import build_model
from fedshift.shift.files import files_meta, render_files
from fedshift.shift.measure import AXES, FeatureProbe, Measurement, measure, spectral_centroid

#: effect sizes of eta^2 by Cohen's conventions (Statistical Power Analysis, 1988)
SIZES = ((0.14, "large"), (0.06, "medium"), (0.01, "small"))
#: a shift method is recommended for an axis with a large effect (eta^2 >= 0.14) only
NOTABLE = SIZES[0][0]
#: an axis scoring at least this share of the dominant one is named beside it
CLOSE = 0.8
#: what each axis measures (report wording)
MEANING = {
    "intensity": "per-channel intensity mean and std of each image",
    "amplitude": "shape of the amplitude spectrum (HarmoFL Eq. 2), DC left out",
    "features": "per-channel mean and std of a fixed model's stage outputs",
    "labels": "label mix (classes, or per-class pixel fractions)",
}
#: the methods that address each axis, with how to ask fedshift for them
METHODS: dict[str, list[tuple[str, str]]] = {
    "intensity": [("FedRDN", "augment=[fedrdn]")],
    "amplitude": [("HarmoFL", "algorithm.name=harmofl (or augment=[ampnorm])")],
    "features": [
        ("FedFA", "algorithm.name=fedfa"),
        ("FedBN", "algorithm.name=fedbn"),
        ("MixStyle", "augment=[mixstyle]"),
        ("MoEx", "augment=[moex]"),
    ],
    "labels": [
        ("DisTrans", "algorithm.name=distrans"),
        ("FedProx", "algorithm.name=fedprox"),
        ("SCAFFOLD", "algorithm.name=scaffold"),
    ],
}
#: the figure files, one per axis
FIGURES = {axis: f"{axis}.png" for axis in AXES}

__all__ = [
    "CLOSE",
    "METHODS",
    "NOTABLE",
    "SIZES",
    "check",
    "effect_size",
    "feature_model",
    "recommend",
    "to_json",
]


# --------------------------------------------------------------------------------------------
# the recommendation
# --------------------------------------------------------------------------------------------


def _fmt(x: float) -> str:
    return f"{x:.3f}"


def effect_size(score: float) -> str:
    """``large``, ``medium``, ``small`` or ``none`` (:data:`SIZES`)."""
    return next((word for bound, word in SIZES if score >= bound), "none")


def recommend(m: Measurement) -> dict[str, Any]:
    """The dominant axis, the axes close to it, their methods and a paragraph citing the
    measured numbers (module docstring: the rule)."""
    if len(m.sites) < 2:
        text = (
            f"One site ({m.site_names[0]}): there is nothing to compare. Split it across "
            "clients with a partition (partition.name=dirichlet, classes, iid) or add sites."
        )
        return {"dominant": None, "close": [], "methods": [], "text": text}
    scores = {a: s.score for a, s in m.axes.items()}
    ranked = sorted(scores, key=lambda a: -scores[a])
    top = ranked[0]
    others = ", ".join(f"{a} {_fmt(scores[a])}" for a in ranked[1:])
    if scores[top] < NOTABLE:
        text = (
            f"No large shift: every axis scores below {NOTABLE} (the largest, {top} "
            f"{_fmt(scores[top])}, is a {effect_size(scores[top])} effect; {others}), so these "
            "numbers call for no shift method in particular: compare any against plain FedAvg."
        )
        return {"dominant": None, "close": [], "methods": [], "text": text}
    close = [a for a in ranked[1:] if scores[a] >= CLOSE * scores[top]]
    names = m.site_names

    def farthest(axis: str) -> str:
        shift = m.axes[axis]
        k = max(range(len(names)), key=lambda i: shift.to_federation[i])
        return f"{names[k]} is farthest from the federation ({_fmt(shift.to_federation[k])})"

    def methods(axis: str) -> str:
        return "; ".join(f"{n} ({how})" for n, how in METHODS[axis])

    parts = [
        f"The dominant shift is along {top} ({MEANING[top]}): score {_fmt(scores[top])} "
        f"against {others}; {farthest(top)}. Methods that address it: {methods(top)}."
    ]
    if top == "labels" or "labels" in close:
        parts.append(
            f"The label mix has DH = {m.dh:.1f} % (DisTrans Eq. 3-4) and a mean pairwise "
            f"total-variation distance of {m.tv:.1f} %; DisTrans shares its offsets across "
            "clients only below DH = 50 % (algorithm.dh_threshold)."
        )
    for a in close:
        parts.append(
            f"{a.capitalize()} is close ({_fmt(scores[a])}, at least {CLOSE:g} x the "
            f"dominant score; {farthest(a)}): {methods(a)}."
        )
    if top == "features":
        inputs = max(("intensity", "amplitude"), key=lambda a: scores.get(a, 0.0))
        parts.append(
            f"Each input-level axis scores less (best: {inputs} "
            f"{_fmt(scores.get(inputs, 0.0))}): the sites' feature statistics differ by more "
            "than any one input statistic shows, from several input-level differences at "
            "once (intensity, spectrum, spatially varying effects such as a bias field) or "
            "from differences beyond them (content, texture, style); feature-level methods "
            "address these whatever their origin."
        )
    chosen = [top, *close]
    return {
        "dominant": top,
        "close": close,
        "methods": [n for a in chosen for n, _ in METHODS[a]],
        "text": " ".join(parts),
    }


# --------------------------------------------------------------------------------------------
# loading and measuring a config
# --------------------------------------------------------------------------------------------


def feature_model(cfg: RunConfig, task: str, input_shape: tuple[int, ...], given: bool) -> Any:
    """The model section of the ``features`` axis: the config's when it names one (with its
    ``model.weights``), else the default model for this data: ``unet`` for segmentation,
    ``cnn`` for 3x28x28 images, ``resnet18`` otherwise."""
    if given:
        return cfg.model
    if task == "segmentation":
        return {"name": "unet"}
    return {"name": "cnn" if tuple(input_shape) == (3, 28, 28) else "resnet18"}


def check(
    cfg: RunConfig,
    out: str | Path,
    *,
    model_given: bool,
    split: str = "train",
    max_per_site: int | None = 2000,
    batch_size: int = 256,
) -> tuple[Measurement, dict[str, Any], str]:
    """Load ``cfg``'s federation, measure it and write the report into ``out``; returns the
    measurement, the ``shift.json`` content and the Markdown report. The model of the
    features axis is built as a run builds it (seeded by ``cfg.seed``), without touching the
    caller's random state."""
    # the training images a run would use: federation.data_fraction applied
    fed = load_dataset(cfg.dataset, cfg.partition).with_train_fraction(cfg.federation.data_fraction)
    shape = model_input_shape(fed.input_shape, cfg.input.size)  # as a run's model sees them
    section = feature_model(cfg, fed.task, shape, model_given)
    with torch.random.fork_rng(devices=[]):
        seed_global(cfg.seed, "init")
        model = build_model(section, fed.num_classes, shape, fed.task)
    normalize = Normalize(cfg.input, fed.input_shape[0], torch.device("cpu"))
    if cfg.input.size is not None:  # the run's pipeline: input.size's resize, then mean/std
        resize = Resize(cfg.input.size)

        def prepare(x: torch.Tensor) -> torch.Tensor:
            return normalize(resize(x))

        probe = FeatureProbe(model, prepare)
    else:
        probe = FeatureProbe(model, normalize)
    m = measure(
        fed, probe, split=split, max_per_site=max_per_site, seed=cfg.seed, batch_size=batch_size
    )
    rec = recommend(m)
    model_dict = section.to_dict() if isinstance(section, Component) else dict(section)
    meta = {
        "dataset_config": cfg.dataset.to_dict(),
        "partition": cfg.partition.to_dict(),
        "model": model_dict,
        "max_per_site": max_per_site,
        "seed": cfg.seed,
    }
    if fed.info.get("domain_mix"):  # partition.name=domains: each client's domains
        meta["domain_mix"] = fed.info["domain_mix"]
    files = files_meta(fed)  # sizes on disk before resizing; what the loader skipped
    data = {**to_json(m, rec, meta), "files": files}
    text = render_markdown(m, rec, meta, files)
    write(Path(out), m, data, text)
    return m, data, text


# --------------------------------------------------------------------------------------------
# JSON and Markdown
# --------------------------------------------------------------------------------------------


def to_json(m: Measurement, rec: dict[str, Any], meta: dict[str, Any]) -> dict[str, Any]:
    """``shift.json``: ``dataset``, ``task``, ``split``, ``input_shape`` [C, H, W],
    ``classes``, ``config`` (dataset, partition and model sections, ``max_per_site``,
    ``seed``), ``sites`` (per site: ``name``, ``counts`` per split, ``sampled`` images,
    ``class_fractions`` (pixel fractions for segmentation), ``channel_mean``,
    ``channel_std``, ``spectral_centroid``, ``amplitude_profile`` (C x rings, mean log),
    ``distance`` per axis), ``axes`` (per axis: ``score``, ``size`` (its effect size),
    ``to_federation`` per site, ``order`` farthest first, ``pairwise`` K x K in site order),
    ``feature_layers`` (stage -> score), ``ring_frequencies`` (cycles per pixel), ``dh`` and
    ``tv_heterogeneity`` (percent), ``recommendation`` (``dominant``, ``close``,
    ``methods``, ``text``), ``thresholds`` and ``fedshift`` (version)."""
    names = m.site_names
    sites = []
    for k, s in enumerate(m.sites):
        sites.append(
            {
                "name": s.name,
                "counts": s.counts,
                "sampled": s.sampled,
                "class_fractions": s.class_fractions,
                "channel_mean": s.channel_mean,
                "channel_std": s.channel_std,
                "spectral_centroid": spectral_centroid(s.profile, m.ring_frequencies),
                "amplitude_profile": s.profile,
                "distance": {a: shift.to_federation[k] for a, shift in m.axes.items()},
            }
        )
    axes = {
        a: {
            "score": shift.score,
            "size": effect_size(shift.score),
            "to_federation": dict(zip(names, shift.to_federation, strict=True)),
            "order": shift.order(names),
            "pairwise": shift.pairwise,
        }
        for a, shift in m.axes.items()
    }
    return {
        "dataset": m.dataset,
        "task": m.task,
        "split": m.split,
        "input_shape": list(m.input_shape),
        "classes": m.classes,
        "config": meta,
        "sites": sites,
        "axes": axes,
        "feature_layers": m.layer_scores,
        "ring_frequencies": m.ring_frequencies,
        "dh": m.dh,
        "tv_heterogeneity": m.tv,
        "recommendation": rec,
        "thresholds": {"notable": NOTABLE, "close": CLOSE},
        "fedshift": __version__,
    }


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    return [_row(head), _row(["---"] * len(head)), *(_row(r) for r in rows), ""]


def _vec(values: list[float], digits: int = 3) -> str:
    return " / ".join(f"{v:.{digits}f}" for v in values)


def _balance(fractions: list[float], classes: list[str]) -> str:
    """Class balance in one cell: every class when there are few, else the extremes."""
    if len(classes) <= 10:
        return " ".join(f"{c}:{f:.2f}" for c, f in zip(classes, fractions, strict=True))
    lo = min(range(len(fractions)), key=lambda i: fractions[i])
    hi = max(range(len(fractions)), key=lambda i: fractions[i])
    absent = sum(1 for f in fractions if f == 0)
    return (
        f"max {classes[hi]}:{fractions[hi]:.3f}, min {classes[lo]}:{fractions[lo]:.3f}, "
        f"{absent} absent"
    )


def _domain_mix_lines(meta: dict[str, Any]) -> list[str]:
    """The training examples per client and domain of a ``domains`` partition (none for
    other partitions)."""
    mix = meta.get("domain_mix")
    if not mix:
        return []
    part = meta["partition"]
    doms = list(dict.fromkeys(d for c in mix.values() for d in c))
    lines = [
        "## Domains per client",
        "",
        f"partition 'domains' (Bai et al., arXiv 2307.04942): {len(mix)} clients from "
        f"{len(doms)} domains, lam = {part.get('lam')} (0: one domain per client, 1: equal "
        "shares); training examples per domain (figure: domains.png).",
        "",
    ]
    lines += _table(
        ["client", *doms, "total"],
        [[c, *(str(mix[c].get(d, 0)) for d in doms), str(sum(mix[c].values()))] for c in mix],
    )
    return lines


def _score_lines(m: Measurement) -> list[str]:
    """The score of every axis, the label mix and the feature score per stage."""
    lines = ["## Shift scores", ""]
    lines += _table(
        ["axis", "score", "effect", "measures", "sites, farthest first", "methods"],
        [
            [
                a,
                _fmt(shift.score),
                effect_size(shift.score),
                MEANING[a],
                ", ".join(shift.order(m.site_names)),
                ", ".join(n for n, _ in METHODS[a]),
            ]
            for a, shift in m.axes.items()
        ],
    )
    lines += [
        f"Label mix: DH = {m.dh:.1f} % (DisTrans Eq. 3-4), mean pairwise total variation "
        f"{m.tv:.1f} %.",
        "",
    ]
    if m.layer_scores:
        lines += [
            "Feature score per stage: "
            + ", ".join(f"{k} {_fmt(v)}" for k, v in m.layer_scores.items())
            + ".",
            "",
        ]
    return lines


def _how_to_read(m: Measurement, meta: dict[str, Any]) -> list[str]:
    """What the scores and distances mean, and the figures beside the report."""
    return [
        "## How to read the scores",
        "",
        "Each axis turns every image into a vector of statistics. Per statistic, the score is "
        "the share of its variance (over the sites, weighted equally) explained by which site "
        "an image comes from, eta^2 = B / (B + W), with the between-site variance B corrected "
        "for sampling; the axis's score is the mean over its statistics (features: over the "
        "model's stages too). 0: the sites are alike; 1: they do not overlap; 0.01, 0.06 and "
        "0.14 are small, medium and large effects by Cohen's conventions. Distances are "
        "differences of site means in units of the statistic's total standard deviation. "
        "Figures: montage.png, "
        + ", ".join(FIGURES[a] for a in m.axes)
        + (", domains.png" if meta.get("domain_mix") else "")
        + ".",
        "",
    ]


def render_markdown(
    m: Measurement, rec: dict[str, Any], meta: dict[str, Any], files: dict | None = None
) -> str:
    """``report.md``: sites, their files (``files``: :func:`~fedshift.shift.files.
    files_meta`), channel statistics, scores, distances, the recommendation."""
    c, h, w = m.input_shape
    model = meta["model"]
    lines = [
        f"# Shift report: {m.dataset}",
        "",
        f"{len(m.sites)} sites, {m.task}, images {c}x{h}x{w}, {len(m.classes)} classes; "
        f"measured on the {m.split} split (at most {meta['max_per_site'] or 'all'} images "
        f"per site, seed {meta['seed']}); features from model {model.get('name')!r}"
        + (f" with weights {model['weights']}" if model.get("weights") else " (seeded random)")
        + ".",
        "",
        "## Sites",
        "",
    ]
    balance = "pixel fractions per class" if m.task == "segmentation" else "class balance"
    lines += _table(
        ["site", "train", "val", "test", "measured", "image", balance],
        [
            [
                s.name,
                *(str(s.counts[sp]) for sp in ("train", "val", "test")),
                str(s.sampled),
                f"{c}x{h}x{w}",
                _balance(s.class_fractions, m.classes),
            ]
            for s in m.sites
        ],
    )
    if files is not None:
        lines += render_files(files)
    lines += _domain_mix_lines(meta)
    lines += ["## Intensity and spectrum per site", ""]
    lines += _table(
        ["site", "channel mean", "channel std", "spectral centroid (cycles/px)"],
        [
            [
                s.name,
                _vec(s.channel_mean),
                _vec(s.channel_std),
                f"{spectral_centroid(s.profile, m.ring_frequencies):.4f}",
            ]
            for s in m.sites
        ],
    )
    lines += _score_lines(m)
    lines += ["## Distance of each site to the federation", ""]
    lines += _table(
        ["site", *m.axes],
        [
            [s.name, *(_fmt(shift.to_federation[k]) for shift in m.axes.values())]
            for k, s in enumerate(m.sites)
        ],
    )
    lines += ["## Recommendation", "", rec["text"], ""]
    lines += _how_to_read(m, meta)
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# files
# --------------------------------------------------------------------------------------------


def write(out: Path, m: Measurement, data: dict[str, Any], text: str) -> None:
    """Write the report's files into ``out`` (created), each atomically."""
    from fedshift.shift import figures

    out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out / "report.md", text)
    with atomic_output(out / "shift.json") as tmp:
        tmp.write_text(json.dumps(data, indent=2) + "\n")
    figures.montage(m, out / "montage.png")
    for axis in m.axes:
        figures.axis_figure(m, axis, out / FIGURES[axis])
    mix = data["config"].get("domain_mix")
    if mix:
        lam = data["config"]["partition"].get("lam")
        figures.domain_mix_figure(
            {f"lam = {lam}": mix}, out / "domains.png", f"{m.dataset}: training examples per domain"
        )
