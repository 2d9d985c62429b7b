"""The figures of ``fedshift data check`` (PNG, matplotlib's Agg canvas: no display, no global
pyplot state): a montage of each site's images and one figure per shift axis, the per-site
quantity on the left and the site-to-site distances on the right."""

from __future__ import annotations

from pathlib import Path

import matplotlib
import torch
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from fedshift.core.files import atomic_output
from fedshift.shift.measure import Measurement

__all__ = ["axis_figure", "domain_mix_figure", "montage", "site_montage"]

#: annotate heatmap cells up to this many sites
ANNOTATE = 10


def _save(fig: Figure, path: Path) -> Path:
    with atomic_output(path) as tmp:
        fig.savefig(tmp, format="png", dpi=100)
    return path


def _image(x: torch.Tensor) -> tuple[torch.Tensor, str | None]:
    """A (C, H, W) image as something ``imshow`` shows: RGB for 3 channels, else the first
    channel in gray."""
    if x.shape[0] == 3:
        return x.permute(1, 2, 0).clamp(0, 1), None
    return x[0], "gray"


def montage(m: Measurement, path: Path) -> Path:
    """One row per site: the first sampled images of its measured split."""
    rows = [(site.name, list(site.preview)) for site in m.sites]
    return site_montage(rows, f"{m.dataset}: {m.split} images per site", path)


def site_montage(
    rows: list[tuple[str, list[torch.Tensor]]], title: str, path: Path, stretch: bool = False
) -> Path:
    """One row per site (its name, its (C, H, W) images) in one PNG. ``stretch``: each image
    shown from its own minimum to its maximum (data not in [0, 1]: normalised, CT numbers);
    otherwise clamped to [0, 1]. Display only: nothing is written back."""
    cols = max(1, max((len(images) for _, images in rows), default=1))
    fig = Figure(figsize=(1.4 + 1.0 * cols, 1.0 * max(1, len(rows)) + 0.4))
    FigureCanvasAgg(fig)
    axes = fig.subplots(max(1, len(rows)), cols, squeeze=False)
    for r, (name, images) in enumerate(rows):
        for c in range(cols):
            ax = axes[r][c]
            ax.set_xticks([])
            ax.set_yticks([])
            if c < len(images):
                x = images[c].float()
                if stretch:
                    lo, hi = float(x.min()), float(x.max())
                    x = (x - lo) / (hi - lo) if hi > lo else torch.zeros_like(x)
                img, cmap = _image(x)
                ax.imshow(img.numpy(), cmap=cmap, vmin=0, vmax=1)
        axes[r][0].set_ylabel(name, rotation=0, ha="right", va="center", fontsize=9)
    fig.suptitle(title, fontsize=10)
    fig.subplots_adjust(left=0.14, right=0.99, top=0.9, bottom=0.02, wspace=0.05, hspace=0.1)
    return _save(fig, path)


def _heatmap(ax: Axes, fig: Figure, m: Measurement, axis: str) -> None:
    dist = torch.tensor(m.axes[axis].pairwise)
    names = m.site_names
    im = ax.imshow(dist.numpy(), cmap="viridis", vmin=0, vmax=max(float(dist.max()), 1e-6))
    ax.set_xticks(range(len(names)), names, rotation=45, ha="right", fontsize=8)
    ax.set_yticks(range(len(names)), names, fontsize=8)
    if len(names) <= ANNOTATE:
        top = float(dist.max()) if dist.numel() else 0.0
        for i in range(len(names)):
            for j in range(len(names)):
                v = float(dist[i, j])
                ax.text(
                    j,
                    i,
                    f"{v:.2f}",
                    ha="center",
                    va="center",
                    fontsize=7,
                    color="black" if v > 0.6 * top else "white",
                )
    ax.set_title("distance between sites (total std units)", fontsize=9)
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)


def _intensity(ax: Axes, m: Measurement) -> None:
    c = m.input_shape[0]
    width = 0.8 / c
    colours = ["tab:red", "tab:green", "tab:blue"] if c == 3 else [None] * c
    for ch in range(c):
        xs = [k + (ch - (c - 1) / 2) * width for k in range(len(m.sites))]
        ax.bar(
            xs,
            [s.channel_mean[ch] for s in m.sites],
            width,
            yerr=[s.channel_std[ch] for s in m.sites],
            capsize=2,
            color=colours[ch],
            alpha=0.8,
            label=f"channel {ch}",
        )
    ax.set_xticks(range(len(m.sites)), m.site_names, rotation=45, ha="right", fontsize=8)
    ax.set_ylabel("pixel mean (bar) and std (whisker)")
    ax.legend(fontsize=7)


def _amplitude(ax: Axes, m: Measurement) -> None:
    for s in m.sites:
        profile = torch.tensor(s.profile).mean(0)
        ax.plot(m.ring_frequencies, profile.numpy(), marker="o", ms=3, label=s.name)
    ax.set_xlabel("spatial frequency (cycles/pixel)")
    ax.set_ylabel("log share of the amplitude (mean)")
    ax.legend(fontsize=7)


def _features(ax: Axes, m: Measurement) -> None:
    names = list(m.layer_scores)
    ax.bar(range(len(names)), [m.layer_scores[n] for n in names], color="tab:purple")
    ax.set_xticks(range(len(names)), names, rotation=45, ha="right", fontsize=8)
    ax.set_ylabel("score per stage")
    ax.set_ylim(0, 1)


def _labels(ax: Axes, m: Measurement) -> None:
    bottom = torch.zeros(len(m.sites))
    cmap = matplotlib.colormaps["tab20"]
    for j, cls in enumerate(m.classes):
        frac = torch.tensor([s.class_fractions[j] for s in m.sites])
        ax.bar(
            range(len(m.sites)),
            frac.numpy(),
            bottom=bottom.numpy(),
            color=cmap(j % 20),
            label=cls if len(m.classes) <= 10 else None,
        )
        bottom += frac
    ax.set_xticks(range(len(m.sites)), m.site_names, rotation=45, ha="right", fontsize=8)
    ax.set_ylabel("pixel fraction" if m.task == "segmentation" else "class fraction")
    if len(m.classes) <= 10:
        ax.legend(fontsize=6, ncol=2)
    ax.set_title(f"DH {m.dh:.1f} %, TV {m.tv:.1f} %", fontsize=9)


PANELS = {
    "intensity": _intensity,
    "amplitude": _amplitude,
    "features": _features,
    "labels": _labels,
}


def axis_figure(m: Measurement, axis: str, path: Path) -> Path:
    """The figure of one axis: its per-site panel and the pairwise distance heatmap."""
    fig = Figure(figsize=(11, 4.2))
    FigureCanvasAgg(fig)
    left, right = fig.subplots(1, 2)
    PANELS[axis](left, m)
    _heatmap(right, fig, m, axis)
    fig.suptitle(f"{m.dataset}: {axis}, score {m.axes[axis].score:.3f}", fontsize=11)
    fig.tight_layout()
    return _save(fig, path)


def _domain_mix_panel(ax: Axes, mix: dict[str, dict[str, int]], title: str) -> None:
    """Stacked bars: one per client, its training examples per domain (colour)."""
    clients = list(mix)
    domains = list(dict.fromkeys(d for c in clients for d in mix[c]))
    cmap = matplotlib.colormaps["tab10" if len(domains) <= 10 else "tab20"]
    bottom = torch.zeros(len(clients))
    for j, dom in enumerate(domains):
        counts = torch.tensor([float(mix[c].get(dom, 0)) for c in clients])
        ax.bar(range(len(clients)), counts.numpy(), bottom=bottom.numpy(), color=cmap(j), label=dom)
        bottom += counts
    step = max(1, len(clients) // 20)
    ax.set_xticks(range(0, len(clients), step), clients[::step], rotation=90, fontsize=7)
    ax.set_ylabel("training examples", fontsize=8)
    ax.set_title(title, fontsize=9)


def domain_mix_figure(
    panels: dict[str, dict[str, dict[str, int]]], path: Path, title: str = ""
) -> Path:
    """The client x domain shares of one or more domain partitions
    (``partition.name=domains``): per panel (e.g. one per ``lam``), a stacked bar per client
    of its training examples from each domain; the legend names the domains."""
    n = len(panels)
    fig = Figure(figsize=(min(4.2 * n + 1.3, 17), 3.8))
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, n, squeeze=False)[0]
    for ax, (label, mix) in zip(axes, panels.items(), strict=True):
        _domain_mix_panel(ax, mix, label)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper right", fontsize=7, ncol=1)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0, 1 - 1.1 / min(4.2 * n + 1.3, 17), 0.97))
    return _save(fig, path)
