"""Slicing ``brain-mri``'s cube into examples and dealing them to sites and splits."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from fedshift.core.errors import ConfigError
from fedshift.core.federation import SPLITS
from fedshift.data.common.seeding import seeded_rng
from fedshift.data.medical.brain_mri.params import ORIENTATIONS, BrainMRIParams
from fedshift.data.medical.brain_mri.scanner import apply_scanner, noise_rng, scanner_table
from fedshift.data.medical.brain_mri.template import Template, class_probabilities

__all__ = [
    "deal",
    "label_maps",
    "oriented",
    "parse_id",
    "site_index",
    "site_names",
    "site_volume",
    "slice_images",
    "usable_slices",
]


# --------------------------------------------------------------------------------------------
# slicing
# --------------------------------------------------------------------------------------------


def oriented(volume: np.ndarray, orientation: str) -> np.ndarray:
    """A view of a cube (optionally with leading channel axes) as a stack of display slices
    ``[..., i, row, col]``: axial (z, -y, x), coronal (y, -z, x), sagittal (x, -z, y)."""
    lead = volume.ndim - 3
    x, y, z = lead, lead + 1, lead + 2
    order = {"axial": (z, y, x), "coronal": (y, z, x), "sagittal": (x, z, y)}[orientation]
    v = volume.transpose(*range(lead), *order)
    return v[..., ::-1, :]


def resize_stack(stack: torch.Tensor, size: int) -> torch.Tensor:
    """``(N, C, S, S)`` -> ``(N, C, size, size)``: area averaging, bilinear when enlarging."""
    if stack.shape[-1] == size:
        return stack.clone()
    if size < stack.shape[-1]:
        return F.interpolate(stack, size=(size, size), mode="area")
    return F.interpolate(stack, size=(size, size), mode="bilinear", align_corners=False)


def usable_slices(template: Template, p: BrainMRIParams) -> dict[str, np.ndarray]:
    """Per orientation, the usable slice indices (see :mod:`fedshift.data.medical.brain_mri`)."""
    probs = class_probabilities(template.gm, template.wm, p.labels)
    fg = probs[1:].max(0) > probs[0]  # argmax != 0, ties to the background
    side = template.side
    out = {}
    for o in p.orientations:
        frac = oriented(fg, o).sum(axis=(1, 2)) / float(side * side)
        idx = np.flatnonzero(frac >= p.min_foreground)
        out[o] = idx[(idx >= 1) & (idx <= side - 2)]
    return out


def label_maps(
    template: Template, p: BrainMRIParams, orientation: str, idx: np.ndarray
) -> torch.Tensor:
    """int64 ``(len(idx), size, size)`` label maps: resized class probabilities, argmax."""
    gm = np.ascontiguousarray(oriented(template.gm, orientation)[idx])
    wm = np.ascontiguousarray(oriented(template.wm, orientation)[idx])
    probs = class_probabilities(gm, wm, p.labels)  # (C, n, S, S)
    t = torch.from_numpy(np.ascontiguousarray(probs.transpose(1, 0, 2, 3)))
    return resize_stack(t, p.size).argmax(dim=1).to(torch.int64)


def parse_id(slice_id: str) -> tuple[str, int]:
    """``"axial:93"`` -> ``("axial", 93)``."""
    o, _, i = slice_id.partition(":")
    if o not in ORIENTATIONS or not i.isdigit():
        raise ValueError(f"not a brain-mri slice id: {slice_id!r} (want '<orientation>:<index>')")
    return o, int(i)


def slice_images(volume: np.ndarray, ids: list[str], size: int) -> torch.Tensor:
    """The 3-channel images (slices i-1, i, i+1) of ``ids`` from one site's volume. Each
    needed slice is resized once, so neighbouring examples share their channels exactly."""
    parsed = [parse_id(sid) for sid in ids]
    side = volume.shape[-1]
    for (_, i), sid in zip(parsed, ids, strict=True):
        if not 1 <= i <= side - 2:
            raise ValueError(f"slice {sid!r} lacks a neighbour (valid indices 1..{side - 2})")
    out = torch.empty(len(ids), 3, size, size, dtype=torch.float32)
    for o in ORIENTATIONS:
        rows = [n for n, (oo, _) in enumerate(parsed) if oo == o]
        if not rows:
            continue
        need = sorted({parsed[n][1] + d for n in rows for d in (-1, 0, 1)})
        where = {i: j for j, i in enumerate(need)}
        stack = torch.from_numpy(np.ascontiguousarray(oriented(volume, o)[need]))
        small = resize_stack(stack.unsqueeze(1), size)[:, 0]
        for n in rows:
            i = parsed[n][1]
            out[n] = small[[where[i - 1], where[i], where[i + 1]]]
    return out


# --------------------------------------------------------------------------------------------
# sites and splits
# --------------------------------------------------------------------------------------------


def _round_half_up(x: float) -> int:
    return int(np.floor(x + 0.5))


def deal(usable: dict[str, np.ndarray], p: BrainMRIParams) -> list[dict[str, list[str]]]:
    """Per site, the slice ids of each split (sorted by orientation, then index)."""
    blocks: list[list[str]] = []
    for o in p.orientations:
        ids = [f"{o}:{int(i)}" for i in usable[o]]
        blocks += [ids[j : j + p.block] for j in range(0, len(ids), p.block)]
    total = sum(len(b) for b in blocks)
    order = seeded_rng(p.seed, "brain-mri/deal").permutation(len(blocks))
    rank = {o: r for r, o in enumerate(ORIENTATIONS)}

    def key(sid: str) -> tuple[int, int]:
        o, i = parse_id(sid)
        return rank[o], i

    sites = []
    for k in range(p.sites):
        mine = [blocks[j] for j in order[k :: p.sites]]
        n = len(mine)
        n_val = _round_half_up(p.fractions[1] * n)
        n_test = _round_half_up(p.fractions[2] * n)
        n_train = n - n_val - n_test
        if min(n_train, n_val, n_test) < 1:
            raise ConfigError(
                f"brain-mri: {total} usable slices in {len(blocks)} blocks of dataset.block="
                f"{p.block} give site{k + 1} {n} block(s), too few for a train, a val and a "
                f"test block (dataset.fractions={list(p.fractions)}); lower dataset.sites or "
                "dataset.block, add dataset.orientations, or lower dataset.min_foreground"
            )
        cuts = {"train": mine[:n_train], "val": mine[n_train : n_train + n_val]}
        cuts["test"] = mine[n_train + n_val :]
        sites.append({s: sorted((i for b in cuts[s] for i in b), key=key) for s in SPLITS})
    return sites


def site_names(sites: int) -> list[str]:
    """``site1`` .. ``site<sites>``."""
    return [f"site{k + 1}" for k in range(sites)]


def site_index(site: int | str, sites: int) -> int:
    """The 0-based index of a site given by name or index (checked against ``sites``)."""
    names = site_names(sites)
    if isinstance(site, str):
        if site not in names:
            raise ValueError(f"no site {site!r}; sites: {', '.join(names)}")
        return names.index(site)
    if not 0 <= site < sites:
        raise ValueError(f"site index {site} out of range 0..{sites - 1}")
    return site


def site_volume(template: Template, p: BrainMRIParams, site: int) -> np.ndarray:
    """Site ``site`` (0-based)'s scanner-transformed, normalised cube."""
    scanner = scanner_table(site + 1)[site].scaled(p.scanner_strength)
    return apply_scanner(template.t1, scanner, noise_rng(p.seed, site), template.mask)
