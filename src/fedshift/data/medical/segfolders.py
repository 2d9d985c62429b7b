"""``segfolders``: your own segmentation data, images and masks per site (one client per site).

Layout (nothing is downloaded; ``dataset.root`` is the folder you keep)::

    <dataset.root>/
      <site>/                       one client per site folder (sorted, or dataset.sites)
        images/  a.png  b.tif  case1.nii.gz ...   (.png .jpg .jpeg .tif .tiff .nii .nii.gz)
        masks/   a.png  b.tif  case1.nii.gz ...   (.png .tif .tiff .nii .nii.gz; same names)
        train.txt val.txt test.txt   optional split lists (image names, with or without suffix)

* **Pairs**: an image and its mask share their path below ``images/`` / ``masks/`` without
  the suffix (``images/a.jpg`` pairs with ``masks/a.png``). An image without a mask, a mask
  without an image, two files with one name, a JPEG mask (lossy: its edges would smear), a
  2-D image with a NIfTI mask (or the reverse) and a mask whose size differs from its
  image's are :class:`~fedshift.core.errors.DataError` naming the file(s). Other files are
  skipped, counted in ``info["skipped_files"]`` and named in a warning; files are listed as
  :mod:`fedshift.data.common.walk` says (symlink loops are errors).
* **Masks are label maps**: each pixel's value (a gray PNG/TIFF value, a palette PNG's
  index, a NIfTI voxel) is a class. ``labels`` lists the mask values in class order
  (``[0, 255]``: 0 -> class 0, 255 -> class 1); a mask holding another value is an error
  naming the mask, its image and the values. ``labels=null`` (default): the sorted distinct
  values over every site's masks (at most 64; more means instance ids or a lossy mask:
  set ``labels``). Class 0 is the background (Dice's foreground mean leaves it out).
  ``classes`` names the classes (default ``background`` for value 0, else the value).
  An RGB mask must be gray (R = G = B); colour-coded masks are an error.
* **2-D images**: ``channels=3`` (default) RGB, gray copied to three channels, alpha
  dropped, 8-bit / 255, 16-bit / 65535; ``channels=1``: gray, colour to luma.
* **NIfTI volumes** (nibabel; :func:`~fedshift.data.medical.nifti.read_nifti`): each volume
  is normalised on its own, as ``prostate``'s: values above its 99th percentile clipped,
  then min-max to [0, 1] (a constant volume is an error). It is cut into 2-D slices along
  voxel axis ``axis`` (0, 1, 2 = nibabel's i, j, k; default 2, the last: axial for the usual
  RAS-like scans); a slice keeps the other two axes in SimpleITK's array order. With
  ``slices=foreground`` (default, as HarmoFL and FedFA train prostate MRI) only slices whose
  mask holds a value other than the background (``labels[0]``, or 0 with ``labels=null``)
  are kept; ``slices=all`` keeps every slice. Slices are gray, copied to 3 channels unless
  ``channels=1``.
* **Size**: every image and mask is resized to ``size x size`` (default 256, a multiple of
  16 for the U-Net): antialiased bilinear images, nearest masks (no new values appear).
* **Splits**, per site: the lists ``<site>/train.txt`` ... (:mod:`~fedshift.data.common.
  split_lists`; a line names an image below ``images/``, e.g. ``case1.nii.gz`` or ``case1``)
  where the site has them (``splits=auto``; ``lists``: required; ``fractions``: ignored),
  else a seeded permutation of the site's *images* (a volume's slices stay in one split: no
  leak between neighbouring slices) cut at ``int(f0 n)``, ``int((f0 + f1) n)`` with
  ``fractions`` = [0.64, 0.16, 0.2]. ``max_per_split`` then keeps a seeded subsample of each
  split's slices. An empty split is an error.

Nothing is cached: every load reads the files again (the decoded data is at most what the
run holds in memory).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import torch

from fedshift.core.datasets import Dataset
from fedshift.core.errors import ConfigError, DataError
from fedshift.core.federation import SPLITS, ClientData, Federation, Split
from fedshift.data.common.checks import (
    check_fractions,
    check_root_key,
    check_size,
    require_root,
)
from fedshift.data.common.images import (
    IMAGE_EXTENSIONS,
    LABEL_EXTENSIONS,
    read_image,
    read_image_gray,
    read_mask,
    resize_images,
    resize_labels,
)
from fedshift.data.common.sampling import permutation_cut, uniform_subsample
from fedshift.data.common.seeding import seeded_rng
from fedshift.data.common.sites import check_sites_key, site_folders
from fedshift.data.common.split_lists import check_split_keys, find_split_lists, read_split_lists
from fedshift.data.common.walk import list_files, suffix_of, warn_skipped
from fedshift.data.medical.nifti import read_nifti
from fedshift.data.medical.prostate import normalize_volume

__all__ = ["SegFoldersParams", "list_pairs", "load_segfolders"]

NAME = "segfolders"
NIFTI = (".nii", ".nii.gz")
#: at most this many distinct mask values with labels=null
MAX_VALUES = 64
TREE = """\
<dataset.root>/
  <site>/                 one client per site folder
    images/   a.png  b.tif  case1.nii.gz ...  (.png .jpg .jpeg .tif .tiff .nii .nii.gz)
    masks/    a.png  b.tif  case1.nii.gz ...  (.png .tif .tiff .nii .nii.gz; same names)
    train.txt val.txt test.txt   (optional split lists: image names)"""


@dataclass
class SegFoldersParams:
    """The ``dataset.*`` keys of ``segfolders``."""

    root: str | None = None  # the folder holding one folder per site
    sites: list[str] | None = None  # site folder names, in client order; None: all, sorted
    size: int = 256  # images and masks resized to size x size (multiple of 16)
    channels: Literal[1, 3] = 3  # 3: RGB (gray copied); 1: gray (colour -> luma)
    labels: list[int] | None = None  # mask values in class order; None: sorted distinct values
    classes: list[str] | None = None  # class names; None: background for 0, else the value
    axis: int = 2  # NIfTI voxel axis the volumes are sliced along (0, 1, 2 = i, j, k)
    slices: Literal["foreground", "all"] = "foreground"  # NIfTI slices kept
    splits: Literal["auto", "lists", "fractions"] = "auto"  # per-site lists or fractions
    fractions: list[float] = field(default_factory=lambda: [0.64, 0.16, 0.2])
    seed: int = 0  # the fraction split (of images / volumes) and the subsample
    max_per_split: int | None = None  # per site and split, seeded subsample; None = all

    def validate(self, prefix: str = "dataset") -> None:
        """Raise :class:`ConfigError` naming the key for a value the loader cannot honour."""
        check_root_key(self.root, f"{prefix}.root")
        check_sites_key(self.sites, f"{prefix}.sites")
        check_size(self.size, f"{prefix}.size", multiple=16, minimum=16)
        if self.channels not in (1, 3):
            raise ConfigError(f"config key '{prefix}.channels' must be 1 or 3")
        if self.labels is not None:
            labels = self.labels
            if len(labels) < 2 or len(set(labels)) != len(labels):
                raise ConfigError(
                    f"config key '{prefix}.labels' must list at least two distinct mask values "
                    f"(background first), got {labels!r}"
                )
        if self.classes is not None:
            if len(self.classes) < 2 or len(set(self.classes)) != len(self.classes):
                raise ConfigError(
                    f"config key '{prefix}.classes' must be at least two distinct names"
                )
            if self.labels is not None and len(self.labels) != len(self.classes):
                raise ConfigError(
                    f"config keys '{prefix}.labels' ({len(self.labels)} values) and "
                    f"'{prefix}.classes' ({len(self.classes)} names) must have one entry per class"
                )
        if self.axis not in (0, 1, 2):
            raise ConfigError(f"config key '{prefix}.axis' must be 0, 1 or 2, got {self.axis!r}")
        if self.slices not in ("foreground", "all"):
            raise ConfigError(f"config key '{prefix}.slices' must be foreground or all")
        check_split_keys(self, prefix)


# --------------------------------------------------------------------------------------------
# listing
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Pair:
    """An image and its mask; ``key`` is the image's path below ``images/`` without suffix."""

    key: str
    image: Path
    mask: Path

    @property
    def volume(self) -> bool:
        return suffix_of(self.image) in NIFTI


def _by_key(folder: Path, suffixes: tuple[str, ...], what: str) -> tuple[dict[str, Path], list]:
    if not folder.is_dir():
        raise DataError(
            f"{folder} is missing: every site folder needs images/ and masks/. Expected "
            f"layout:\n{TREE}"
        )
    listing = list_files(folder, suffixes)
    out: dict[str, Path] = {}
    for path in listing.files:
        rel = path.relative_to(folder).as_posix()
        key = rel[: len(rel) - len(suffix_of(path))]
        if key in out:
            raise DataError(f"{out[key]} and {path} are two {what} named {key!r}; keep one of them")
        out[key] = path
    return out, listing.skipped


def list_pairs(site: Path) -> tuple[list[Pair], list[Path]]:
    """A site's (image, mask) pairs sorted by name, and the skipped files (module docstring)."""
    images, skipped = _by_key(site / "images", (*IMAGE_EXTENSIONS, *NIFTI), "images")
    masks, skipped_masks = _by_key(site / "masks", (*LABEL_EXTENSIONS, *NIFTI), "masks")
    for path in skipped_masks:
        if suffix_of(path) in (".jpg", ".jpeg"):
            raise DataError(
                f"{path}: a JPEG mask; masks must be lossless (.png, .tif, .nii.gz): JPEG "
                "changes the values at class edges. Save it as PNG from the original labels"
            )
    for key, path in images.items():
        if key not in masks:
            raise DataError(
                f"{path} has no mask: expected {site / 'masks' / key}.png (or .tif, .nii.gz); "
                "add it or remove the image"
            )
    for key, path in masks.items():
        if key not in images:
            raise DataError(
                f"{path} has no image: expected {site / 'images' / key} with an image suffix; "
                "add it or remove the mask"
            )
    pairs = [Pair(k, images[k], masks[k]) for k in sorted(images)]
    for p in pairs:
        if (suffix_of(p.mask) in NIFTI) != p.volume:
            raise DataError(
                f"{p.image} and its mask {p.mask} must both be NIfTI volumes or both 2-D images"
            )
    if not pairs:
        raise DataError(f"{site / 'images'} holds no image. Expected layout:\n{TREE}")
    return pairs, [*skipped, *skipped_masks]


# --------------------------------------------------------------------------------------------
# reading
# --------------------------------------------------------------------------------------------


@dataclass
class Unit:
    """What one pair gives: images ``(n, C, size, size)`` float32 and raw mask values
    ``(n, size, size)`` int64 (n = 1 for a 2-D image, the kept slices for a volume)."""

    pair: Pair
    x: torch.Tensor
    values: torch.Tensor
    shape: tuple[int, ...]  # the original image (H, W) or volume shape


def _integral(mask: np.ndarray, pair: Pair) -> np.ndarray:
    whole = mask.dtype.kind != "f" or (
        np.isfinite(mask).all() and np.array_equal(mask, np.round(mask))
    )
    if not whole:
        raise DataError(
            f"{pair.mask} (the mask of {pair.image}) holds values that are not whole "
            "numbers; a mask holds class values (save it with an integer type)"
        )
    return mask.astype(np.int64)


def read_unit(pair: Pair, params: SegFoldersParams, background: int) -> Unit:
    """Read, check, slice (volumes) and resize one pair."""
    size = params.size
    if not pair.volume:
        reader = read_image if params.channels == 3 else read_image_gray
        image = reader(pair.image)
        mask = _integral(read_mask(pair.mask, gray_rgb=True), pair)
        if image.shape[1:] != mask.shape:
            raise DataError(
                f"{pair.image} is {image.shape[2]}x{image.shape[1]} (W x H) but its mask "
                f"{pair.mask} is {mask.shape[1]}x{mask.shape[0]}; they must match pixel for pixel"
            )
        x = resize_images(torch.from_numpy(image)[None], size)
        y = resize_labels(torch.from_numpy(mask)[None], size)
        return Unit(pair, x, y, tuple(mask.shape))
    volume = read_nifti(pair.image)
    mask = read_nifti(pair.mask)
    if volume.shape != mask.shape:
        raise DataError(
            f"{pair.image} has shape {volume.shape[::-1]} (i, j, k) but its mask {pair.mask} "
            f"has {mask.shape[::-1]}; the mask must cover the volume voxel for voxel"
        )
    mask = _integral(mask, pair)
    volume = normalize_volume(volume, quantize=False, path=pair.image)
    along = 2 - params.axis  # read_nifti's arrays are (k, j, i)
    keep = [
        t
        for t in range(volume.shape[along])
        if params.slices == "all" or (np.take(mask, t, axis=along) != background).any()
    ]
    channels = params.channels
    x = torch.empty(len(keep), channels, size, size)
    y = torch.empty(len(keep), size, size, dtype=torch.int64)
    for j, t in enumerate(keep):
        image = torch.from_numpy(np.ascontiguousarray(np.take(volume, t, axis=along)))
        x[j] = resize_images(image.float()[None, None], size)[0].expand(channels, -1, -1)
        labels = torch.from_numpy(np.ascontiguousarray(np.take(mask, t, axis=along)))
        y[j] = resize_labels(labels[None], size)[0]
    return Unit(pair, x, y, tuple(volume.shape[::-1]))


def _label_map(units: dict[str, list[Unit]], params: SegFoldersParams) -> list[int]:
    """The mask values in class order: ``labels``, else the sorted distinct values."""
    if params.labels is not None:
        return list(params.labels)
    found = sorted(
        {int(v) for site in units.values() for u in site for v in torch.unique(u.values)}
    )
    if len(found) > MAX_VALUES:
        raise DataError(
            f"{NAME}: the masks hold {len(found)} distinct values ({found[:5]} ... "
            f"{found[-3:]}): instance ids or a lossy / antialiased mask, not class values; set "
            "dataset.labels to the values that are classes"
        )
    if len(found) < 2:
        raise DataError(
            f"{NAME}: every mask holds only the value {found}; a segmentation needs a "
            "background and at least one class (or set dataset.labels)"
        )
    return found


def _to_classes(unit: Unit, values: list[int]) -> torch.Tensor:
    """A unit's mask values as class indices (the positions in ``values``)."""
    ordered, order = torch.sort(torch.tensor(values, dtype=torch.int64))
    pos = torch.searchsorted(ordered, unit.values).clamp(max=len(values) - 1)
    ok = ordered[pos] == unit.values
    if not bool(ok.all()):
        bad = sorted({int(v) for v in unit.values[~ok].unique()})
        raise DataError(
            f"{unit.pair.mask} (the mask of {unit.pair.image}) holds the value(s) {bad}, which "
            f"dataset.labels={values} does not list; add them to dataset.labels or fix the mask"
        )
    return order[pos]


# --------------------------------------------------------------------------------------------
# splits and the loader
# --------------------------------------------------------------------------------------------


def split_units(
    client: str, site: Path, pairs: list[Pair], params: SegFoldersParams
) -> tuple[dict[str, list[int]], str]:
    """Indices of ``pairs`` in each split, and how they were made."""
    lists = find_split_lists(site, params.splits)
    if lists is not None:
        known = {}
        for k, p in enumerate(pairs):
            known[p.key] = known[p.image.relative_to(site / "images").as_posix()] = str(k)
        what = f"an image of {site / 'images'} (its name, with or without suffix)"
        entries = read_split_lists(lists, known, what)
        return {s: [int(i) for i in entries[s]] for s in SPLITS}, "lists"
    fractions = check_fractions(params.fractions)
    rng = seeded_rng(params.seed, f"{NAME}/{client}/split")
    parts = permutation_cut(len(pairs), fractions, rng)
    return {s: v.tolist() for s, v in parts.items()}, f"fractions {list(fractions)}"


def load_segfolders(params: SegFoldersParams) -> Federation:
    """The ``segfolders`` federation: one client per site folder (module docstring)."""
    params.validate()
    root = require_root(params.root, NAME, TREE)
    folders = site_folders(root, params.sites, NAME, TREE)
    background = params.labels[0] if params.labels is not None else 0
    units, skipped, chosen, how = {}, {}, {}, {}
    for client, folder in folders.items():
        pairs, skipped[client] = list_pairs(folder)
        chosen[client], how[client] = split_units(client, folder, pairs, params)
        units[client] = [read_unit(p, params, background) for p in pairs]
    values = _label_map(units, params)
    classes = params.classes or ["background" if v == 0 else str(v) for v in values]
    if len(classes) != len(values):
        raise DataError(
            f"{NAME}: dataset.classes names {len(classes)} classes but the masks hold "
            f"{len(values)} values {values}; give one name per value (or set dataset.labels)"
        )
    clients, counts = [], {}
    for client, site_units in units.items():
        splits = {}
        for split in SPLITS:
            picked = [site_units[k] for k in chosen[client][split]]
            x = torch.cat([u.x for u in picked]) if picked else torch.empty(0)
            y = torch.cat([_to_classes(u, values) for u in picked]) if picked else torch.empty(0)
            if len(y) == 0:
                raise DataError(
                    f"{NAME}: site {client!r} ({folders[client]}) gets an empty {split} split "
                    f"({len(picked)} images / volumes from {how[client]}, "
                    f"dataset.slices={params.slices}); add images, or change the lists / "
                    "dataset.fractions"
                )
            if params.max_per_split is not None and len(y) > params.max_per_split:
                rng = seeded_rng(params.seed, f"{NAME}/{client}/{split}/cap")
                idx = torch.from_numpy(uniform_subsample(len(y), params.max_per_split, rng))
                x, y = x[idx], y[idx]
            splits[split] = Split(x.contiguous(), y.contiguous())
        clients.append(ClientData(client, splits["train"], splits["val"], splits["test"]))
        counts[client] = {
            "images": sum(not u.pair.volume for u in site_units),
            "volumes": sum(u.pair.volume for u in site_units),
        }
    names = {c: [str(p) for p in s] for c, s in skipped.items()}
    warn_skipped(NAME, "files that are neither images nor masks", names)
    shape = (params.channels, params.size, params.size)
    fed = Federation(NAME, clients, list(classes), shape, task="segmentation")
    fed.info = {
        "root": str(root),
        "site_folders": {c: str(f) for c, f in folders.items()},
        "counts": fed.counts(),
        "pairs": counts,
        "labels": values,
        "split": how,
        "skipped_files": {c: len(s) for c, s in skipped.items()},
        "skipped": names,
        "preprocessing": {
            "images": "RGB (gray copied), 8-bit / 255, 16-bit / 65535"
            if params.channels == 3
            else "gray (colour to luma)",
            "volumes": "per volume: clip above the 99th percentile, min-max to [0, 1]",
            "axis": params.axis,
            "slices": params.slices,
            "size": params.size,
            "resize": "antialiased bilinear images, nearest masks",
        },
    }
    return fed


#: the ``segfolders`` dataset (the dataset contract: :mod:`fedshift.core.datasets`)
SEG_FOLDERS_DATASET = Dataset(
    "segfolders", SegFoldersParams, "segmentation", load_segfolders,
    "your segmentation data: <root>/<site>/{images,masks}/ (PNG/TIFF or NIfTI volumes)",
)  # fmt: skip
