"""Building, caching and previewing the ``brain-mri`` federation."""

from __future__ import annotations

import contextlib
import dataclasses
import json
from pathlib import Path

import numpy as np
import torch

from fedshift.core.datasets import Dataset
from fedshift.core.errors import DataError
from fedshift.core.federation import SPLITS, ClientData, Federation, Split
from fedshift.core.files import save_figure
from fedshift.data.common import cache
from fedshift.data.medical.brain_mri.params import (
    DESCRIPTION,
    LABEL_SETS,
    NAME,
    RECIPE,
    WINDOW,
    BrainMRIParams,
)
from fedshift.data.medical.brain_mri.scanner import scanner_table
from fedshift.data.medical.brain_mri.slices import (
    deal,
    label_maps,
    parse_id,
    site_index,
    site_names,
    site_volume,
    slice_images,
    usable_slices,
)
from fedshift.data.medical.brain_mri.template import load_template, locate_template

__all__ = ["build_brain_mri", "cache_path", "load_brain_mri", "render_slices", "scanner_preview"]


# --------------------------------------------------------------------------------------------
# the loader
# --------------------------------------------------------------------------------------------


def render_slices(p: BrainMRIParams, site: int | str, ids: list[str]) -> torch.Tensor:
    """Slices ``ids`` (any, whichever site holds them) imaged by ``site``'s scanner:
    ``(len(ids), 3, size, size)``, exactly as :func:`load_brain_mri` builds them."""
    p.validate()
    k = site_index(site, p.sites)
    template = load_template(p.nifti_dir)
    return slice_images(site_volume(template, p, k), ids, p.size)


def build_brain_mri(p: BrainMRIParams) -> Federation:
    """Build the ``brain-mri`` federation from the template (no disk cache)."""
    p.validate()
    template = load_template(p.nifti_dir)
    usable = usable_slices(template, p)
    dealt = deal(usable, p)
    labels = {o: label_maps(template, p, o, usable[o]) for o in p.orientations}
    position = {o: {int(i): n for n, i in enumerate(usable[o])} for o in p.orientations}

    def label_of(ids: list[str]) -> torch.Tensor:
        out = torch.empty(len(ids), p.size, p.size, dtype=torch.int64)
        for n, sid in enumerate(ids):
            o, i = parse_id(sid)
            out[n] = labels[o][position[o][i]]
        return out

    clients = []
    scanners = scanner_table(p.sites)
    for k, name in enumerate(site_names(p.sites)):
        volume = site_volume(template, p, k)
        splits = {
            s: Split(slice_images(volume, dealt[k][s], p.size), label_of(dealt[k][s]))
            for s in SPLITS
        }
        clients.append(ClientData(name, splits["train"], splits["val"], splits["test"]))
    names = site_names(p.sites)
    info = {
        "description": DESCRIPTION,
        "source": dict(template.source),
        "crop": [list(c) for c in template.crop],
        "cube_side": template.side,
        "labels": p.labels,
        "usable_slices": {o: int(len(usable[o])) for o in p.orientations},
        "counts": {names[k]: {s: len(dealt[k][s]) for s in SPLITS} for k in range(p.sites)},
        "slices": {names[k]: dealt[k] for k in range(p.sites)},
        "scanner_strength": float(p.scanner_strength),
        "scanners": {
            names[k]: dataclasses.asdict(scanners[k].scaled(p.scanner_strength))
            for k in range(p.sites)
        },
        "normalisation": (
            f"per volume, the {WINDOW[0]:g}th..{WINDOW[1]:g}th percentile window of the brain "
            "voxels (template t1 > 0) mapped to [0, 1] and clipped, then "
            "clip(contrast * v + brightness, 0, 1)"
        ),
        "seed": p.seed,
    }
    return Federation(
        NAME, clients, list(LABEL_SETS[p.labels]), (3, p.size, p.size), info, task="segmentation"
    )


def cache_path(p: BrainMRIParams) -> Path:
    """``<cache>/brain-mri/<digest>.npz``: the digest covers :data:`RECIPE`, every parameter
    that changes the arrays and the sha256 of the three template files."""
    sources = locate_template(p.nifti_dir)
    keys = {k: v for k, v in dataclasses.asdict(p).items() if k not in ("nifti_dir", "cache")}
    blob = {
        "recipe": RECIPE,
        "params": keys,
        "sources": {k: cache.sha256_file(path) for k, path in sources.items()},
    }
    return cache.cache_dir() / NAME / f"{cache.json_digest(blob, 20)}.npz"


def _save(fed: Federation, path: Path) -> None:
    arrays = {"info": np.frombuffer(json.dumps(fed.info).encode(), dtype=np.uint8)}
    for c in fed.clients:
        for s in SPLITS:
            arrays[f"{c.name}/{s}/x"] = c.split(s).x.numpy()
            arrays[f"{c.name}/{s}/y"] = c.split(s).y.to(torch.uint8).numpy()
    cache.save_npz(path, arrays)


def _restore(path: Path, p: BrainMRIParams) -> Federation | None:
    """The cached federation, or None if the file is absent or unreadable (then rebuilt)."""
    z = cache.load_npz(path)
    if z is None:
        return None
    try:
        info = json.loads(z["info"].tobytes().decode())
        clients = []
        for name in site_names(p.sites):
            splits = {
                s: Split(
                    torch.from_numpy(z[f"{name}/{s}/x"]),
                    torch.from_numpy(z[f"{name}/{s}/y"].astype(np.int64)),
                )
                for s in SPLITS
            }
            clients.append(ClientData(name, splits["train"], splits["val"], splits["test"]))
    except (KeyError, ValueError):
        return None
    classes = list(LABEL_SETS[p.labels])
    return Federation(NAME, clients, classes, (3, p.size, p.size), info, task="segmentation")


def load_brain_mri(p: BrainMRIParams) -> Federation:
    """The ``brain-mri`` federation (see :mod:`fedshift.data.medical.brain_mri`). With
    ``dataset.cache`` the built arrays are kept in :func:`cache_path` (written atomically) and
    read back next time; a cached federation equals a fresh build bit for bit."""
    p.validate()
    if not p.cache:
        return build_brain_mri(p)
    path = cache_path(p)
    fed = _restore(path, p)
    if fed is None:
        fed = build_brain_mri(p)
        # an unwritable cache only costs a rebuild next time; the arrays are the same
        with contextlib.suppress(OSError):
            _save(fed, path)
    fed.info["cache"] = str(path)
    return fed


# --------------------------------------------------------------------------------------------
# preview
# --------------------------------------------------------------------------------------------


def scanner_preview(params: BrainMRIParams, path: str | Path, slice_id: str | None = None) -> dict:
    """Save a PNG with one row per site: the same slice (channel 1, i.e. slice i itself) in
    each orientation of ``params.orientations`` under that site's scanner, then the label
    map. ``slice_id`` picks the first orientation's slice; default: its middle usable slice.
    Returns the slice ids shown and the PNG path."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.colors import ListedColormap
    from matplotlib.figure import Figure

    params.validate()
    template = load_template(params.nifti_dir)
    usable = usable_slices(template, params)
    ids = []
    for n, o in enumerate(params.orientations):
        if not len(usable[o]):
            raise DataError(f"brain-mri: no usable {o} slice; lower dataset.min_foreground")
        ids.append(
            slice_id if n == 0 and slice_id else f"{o}:{int(usable[o][len(usable[o]) // 2])}"
        )
    o0, i0 = parse_id(ids[0])
    label = label_maps(template, params, o0, np.array([i0]))[0].numpy()
    cols = len(ids) + 1
    fig = Figure(figsize=(1.9 * cols + 1.2, 1.9 * params.sites + 0.4))
    FigureCanvasAgg(fig)
    axes = fig.subplots(params.sites, cols, squeeze=False)
    colours = ListedColormap(["black", "tab:orange", "white"][: len(LABEL_SETS[params.labels])])
    for k, name in enumerate(site_names(params.sites)):
        images = slice_images(site_volume(template, params, k), ids, params.size)
        for j in range(len(ids)):
            axes[k][j].imshow(images[j, 1].numpy(), cmap="gray", vmin=0, vmax=1)
        axes[k][-1].imshow(label, cmap=colours, vmin=0, vmax=len(LABEL_SETS[params.labels]) - 1)
        axes[k][0].set_ylabel(name, rotation=0, ha="right", va="center")
        for ax in axes[k]:
            ax.set_xticks([])
            ax.set_yticks([])
    for j, sid in enumerate(ids):
        axes[0][j].set_title(sid, fontsize=8)
    axes[0][-1].set_title(f"labels {ids[0]}", fontsize=8)
    fig.subplots_adjust(left=0.12, right=0.99, top=0.96, bottom=0.01, wspace=0.04, hspace=0.04)
    path = save_figure(fig, path)
    return {"slices": ids, "path": str(path)}


#: the ``brain-mri`` dataset (the dataset contract: :mod:`fedshift.core.datasets`)
BRAIN_MRI_DATASET = Dataset(
    "brain-mri", BrainMRIParams, "segmentation", load_brain_mri,
    "offline segmentation: real MNI152 brain anatomy (nilearn), K sites with simulated scanners",
)  # fmt: skip
