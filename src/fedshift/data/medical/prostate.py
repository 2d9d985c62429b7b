"""``prostate``: multi-site prostate MRI segmentation, read from the user's own NIfTI files.

The data are the six-site T2-weighted prostate MRI collection of Liu et al. (SAML, MICCAI
2020; MS-Net, IEEE TMI 2020), used by HarmoFL (Jiang et al., AAAI 2022, Sec. "Experiments"),
FedFA (Zhou & Konukoglu, ICLR 2023) and FedRDN. Nothing is downloaded: point
``dataset.root`` at the folder holding one sub-folder per site::

    <dataset.root>/
      BIDMC/   Case00.nii.gz  Case00_segmentation.nii.gz  Case02.nii.gz ...
      HK/      Case38.nii.gz  Case38_segmentation.nii.gz ...
      I2CVB/   ...
      BMC/     ...     (or ISBI/, HarmoFL's name)
      RUNMC/   ...     (or ISBI_1.5/, whose masks are CaseXX_Segmentation.nii.gz)
      UCL/     ...

Every image ``<name>.nii.gz`` (or ``.nii``) needs its mask ``<name>_segmentation.nii.gz``
(``_Segmentation`` also accepted, one of the two); a mask without an image, an image without
a mask, both casings for one case, a mask of another shape, a site folder named both ways
(``BMC`` and ``ISBI``) or a missing site folder is a :class:`~fedshift.core.errors.DataError`
naming the file. Other files are ignored. Clients are the sites in ``dataset.sites`` order
(default ``BIDMC, HK, I2CVB, BMC, RUNMC, UCL``, HarmoFL's order), always named by these names
whatever the folder is called. The mapping BMC = ``ISBI``, RUNMC = ``ISBI_1.5`` is HarmoFL's
column order (its code lists ``ISBI, ISBI_1.5`` where its paper's tables list ``BMC, RUNMC``).

Preprocessing (HarmoFL ``utils/dataset.py``), per case, in this order:

1. Read both volumes as SimpleITK's ``GetArrayFromImage`` would (:func:`read_nifti`): axis 0 is
   the slice axis z, each slice is (rows = y, columns = x). nibabel's array is ``(x, y, z)``
   and is transposed ``(2, 1, 0)``, so slices have the released code's orientation.
2. Mask: values > 1 set to 1, then cast to int, i.e. foreground = value >= 1.
3. Image, per volume: ``high`` = the 99th percentile (``np.quantile``, linear), ``low`` = the
   minimum; values above ``high`` clipped to it; ``(v - low) / (high - low)`` in float64.
   ``quantize=True`` (default) reproduces the released uint8 step, ``floor(255 x) / 255``
   (``astype(uint8)`` truncates); ``quantize=False`` keeps the float values. A constant
   volume (high == low) is an error.
4. For every slice i in 1..Z-2 whose mask is non-empty: image = slices (i-1, i, i+1) as the
   three channels, label = the mask of slice i. Slices are listed case by case (cases sorted
   by name), i ascending: the order HarmoFL builds before applying its slice index (checked:
   with HarmoFL's ``HK-index.npy`` on a 157-slice fixture, fedshift's splits equal a
   SimpleITK re-run of HarmoFL's steps, byte for byte).
5. Resize to ``size x size`` (default 384, a multiple of 16): bilinear (antialiased) images,
   nearest labels. The SAML volumes are already 384x384 in-plane, so this is a no-op on them;
   the released code does not resize at all.

Splits, per site, with fractions ``dataset.fractions`` = [0.64, 0.16, 0.20]:

* ``split_by="slices"`` (default, the released protocol): the site's slices are permuted
  (``seeded_rng(seed, "prostate/<site>")``, or HarmoFL's own fixed permutation
  ``<index_dir>/<site>-index.npy`` with its names ISBI / ISBI_1.5), then the first
  ``int(0.64 n)`` are train, up to ``int(0.8 n)`` val, the rest test. Neighbouring slices of
  one case (which share two of their three channels) land in different splits, so test
  scores are optimistic. It is the default because it is what HarmoFL / FedFA report.
* ``split_by="cases"`` (recommended for new results): the cases are permuted and cut the same
  way (``int(0.64 C)``, ``int(0.8 C)``), each case's slices stay in its split; the slices of
  each split are then shuffled with the same generator.
* ``truncate_train=True`` (released default; ``--imbalance`` turns it off): every site's train
  split is cut to the smallest site's train length (its first slices in split order).

``split`` picks whose protocol: ``harmofl`` (default, the above) or FedFA's (Zhou &
Konukoglu, ICLR 2023, App. E.3; tfzhou/FedFA ``Prostate``), both on the same slice permutation
(``split_by="slices"`` only) and never truncated (``truncate_train`` defaults to False there):

* ``fedfa`` (Table 13): train = the first ``int(0.6 n)`` slices, val = the next ``int(0.2 n)``,
  test = the last ``int(0.2 n)`` (BIDMC 261 slices: 156 / 52 / 52). ``train_fraction`` f
  (Table 2's mini-ProstateMRI: f = 1/6; Fig. 2 / Table 16: 1/6 .. 1) keeps the first
  ``max(int(f * int(0.6 n)), 32)`` of those training slices (never more than there are), the
  rule behind Table 2's bracketed sizes B 32, H 32, I 46, M 38, R 41, U 32; val and test are
  unchanged.
* ``fedfa-released``: the released code's slicing, ``t = int(max(0.6 f n, 32))`` train
  slices, val = the ``int(0.2 n)`` slices right after them (so a smaller train set shifts the
  validation window), test = the last ``int(0.2 n)``. Same as ``fedfa`` whenever
  ``0.6 f n >= 32`` and f = 1; on a site with fewer than 54 slices its 32 train slices
  overlap (or empty) the validation window, which is an error here.

An empty split is an error. Images are float32 in [0, 1] ``(N, 3, size, size)``, labels int64
``(N, size, size)`` in {0, 1}; classes ``["background", "prostate"]``. The released code feeds
the network 0-255 values (``torch.Tensor`` of the uint8 slices, no division by 255); fedshift
keeps [0, 1] images and applies ``input.mean/std`` per batch. The released training-time
random rotations and flips are not part of the loader. With HarmoFL's slice counts (BIDMC 261,
HK 157, I2CVB 468, BMC 411, RUNMC 384, UCL 175; the lengths of its index files) the six sites
hold 1,856 slices: about 3.3 GB of float32 images and 2.2 GB of int64 label maps at 384x384
(truncation to HK's 100 training slices drops about a third of that).

Cache: reading and normalising the volumes is slow, so each site's preprocessed volumes
(uint8 with ``quantize``, else float32, at native resolution) are stored in
``<cache>/prostate/<digest>/volumes.npz`` (``<cache>`` = ``dataset.cache_dir`` or
``$FEDSHIFT_CACHE`` or ``~/.cache/fedshift``), written atomically. The digest covers the
site folder's absolute path, every case file's name, size and modification time, ``quantize``
and the recipe version, so editing, adding or removing a file rebuilds that site. Slicing,
resizing and splitting run at load time from the cached volumes. ``cache=False`` skips it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import torch

from fedshift.core.datasets import Dataset
from fedshift.core.errors import ConfigError, DataError, MissingSourceError
from fedshift.core.federation import ClientData, Federation, Split
from fedshift.data.common import cache
from fedshift.data.common.checks import (
    check_distinct,
    check_fractions,
    check_size,
    require_root,
)
from fedshift.data.common.images import resize_images, resize_labels
from fedshift.data.common.sampling import cut_points
from fedshift.data.common.seeding import seeded_rng
from fedshift.data.medical.nifti import read_nifti

NAME = "prostate"
SITES: tuple[str, ...] = ("BIDMC", "HK", "I2CVB", "BMC", "RUNMC", "UCL")
#: HarmoFL's folder (and index file) names of two sites
HARMOFL_NAMES = {"BMC": "ISBI", "RUNMC": "ISBI_1.5"}
CLASSES = ["background", "prostate"]
CACHE_VERSION = 1
PERCENTILE = 0.99
MASK_SUFFIXES = ("_segmentation", "_Segmentation")
TREE = """\
<dataset.root>/
  BIDMC/
    Case00.nii.gz
    Case00_segmentation.nii.gz
    ...
  HK/  I2CVB/  UCL/           (same)
  BMC/    or ISBI/            (same)
  RUNMC/  or ISBI_1.5/        (masks may be CaseXX_Segmentation.nii.gz)"""

__all__ = [
    "PROSTATE_DATASET",
    "CLASSES",
    "SITES",
    "ProstateParams",
    "list_cases",
    "load_prostate",
    "normalize_volume",
    "site_folder",
]


@dataclass
class ProstateParams:
    """The ``dataset.*`` keys of ``prostate``."""

    root: str | None = None  # folder with one sub-folder per site
    sites: list[str] = field(default_factory=lambda: list(SITES))  # clients, in this order
    size: int = 384  # output side (multiple of 16); the SAML volumes are 384 in-plane
    quantize: bool = True  # reproduce HarmoFL's uint8 step: floor(255 x) / 255
    fractions: list[float] = field(default_factory=lambda: [0.64, 0.16, 0.2])
    split_by: Literal["slices", "cases"] = "slices"  # "slices" = released; "cases" = no leak
    seed: int = 0  # the permutation of slices (or cases) per site
    #: train cut to the smallest site's (HarmoFL without --imbalance); None: True for
    #: split=harmofl, False for FedFA's splits
    truncate_train: bool | None = None
    #: whose split protocol: "harmofl" (fractions), "fedfa" (Table 13), "fedfa-released"
    split: Literal["harmofl", "fedfa", "fedfa-released"] = "harmofl"
    #: share of FedFA's training slices kept (Table 2 mini-ProstateMRI: 1/6; min 32 slices)
    train_fraction: float = 1.0
    index_dir: str | None = None  # folder with HarmoFL's <site>-index.npy (released order)
    cache: bool = True  # cache each site's preprocessed volumes
    cache_dir: str | None = None  # None -> $FEDSHIFT_CACHE or ~/.cache/fedshift

    def validate(self, prefix: str = "dataset") -> None:
        """Raise :class:`ConfigError` naming the key for a value the loader cannot honour."""
        sites = self.sites
        if isinstance(sites, str) or not isinstance(sites, list | tuple) or not sites:
            raise ConfigError(
                f"config key '{prefix}.sites' must be a non-empty list of {list(SITES)}"
            )
        for site in sites:
            if site not in SITES:
                alias = {v: k for k, v in HARMOFL_NAMES.items()}.get(site)
                hint = f" (the folder {site}/ is read as site {alias!r})" if alias else ""
                raise ConfigError(
                    f"config key '{prefix}.sites': unknown site {site!r}{hint}; "
                    f"valid: {', '.join(SITES)}"
                )
        check_distinct(sites, f"{prefix}.sites")
        check_size(self.size, f"{prefix}.size", multiple=16, minimum=16)
        check_fractions(self.fractions, f"{prefix}.fractions")
        if self.split_by not in ("slices", "cases"):
            raise ConfigError(
                f"config key '{prefix}.split_by' must be 'slices' or 'cases', got {self.split_by!r}"
            )
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ConfigError(f"config key '{prefix}.seed' must be an integer >= 0")
        if self.split not in ("harmofl", "fedfa", "fedfa-released"):
            raise ConfigError(
                f"config key '{prefix}.split' must be harmofl, fedfa or fedfa-released, "
                f"got {self.split!r}"
            )
        f = self.train_fraction
        if isinstance(f, bool) or not isinstance(f, int | float) or not 0 < f <= 1:
            raise ConfigError(f"config key '{prefix}.train_fraction' must be in (0, 1], got {f!r}")
        if self.split == "harmofl" and f != 1:
            raise ConfigError(
                f"config key '{prefix}.train_fraction' is FedFA's subsampling (Table 2, Fig. 2); "
                f"set {prefix}.split=fedfa or remove it"
            )
        if self.split != "harmofl":
            if [float(v) for v in self.fractions] != [0.64, 0.16, 0.2]:
                raise ConfigError(
                    f"config key '{prefix}.fractions' applies to {prefix}.split=harmofl; "
                    f"FedFA's split is 60/20/20 (Table 13); remove {prefix}.fractions"
                )
            if self.split_by != "slices":
                raise ConfigError(
                    f"config key '{prefix}.split={self.split}' splits slices (as FedFA's code "
                    f"does); remove {prefix}.split_by or use split=harmofl"
                )
        if self.index_dir is not None and self.split_by != "slices":
            raise ConfigError(
                f"config key '{prefix}.index_dir' holds HarmoFL's slice permutations, which "
                f"only apply with {prefix}.split_by=slices (got {self.split_by!r})"
            )


# --------------------------------------------------------------------------------------------
# layout
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """One case of a site: its image and mask files."""

    name: str
    image: Path
    mask: Path


def site_folder(root: Path, site: str) -> Path:
    """``<root>/<site>`` or its HarmoFL name (``ISBI`` / ``ISBI_1.5``); exactly one must exist."""
    names = [site] + ([HARMOFL_NAMES[site]] if site in HARMOFL_NAMES else [])
    found = [root / n for n in names if (root / n).is_dir()]
    if len(found) > 1:
        raise DataError(
            f"{root} holds both {found[0].name}/ and {found[1].name}/, two names of site "
            f"{site}; keep one of them (move the other out of dataset.root)"
        )
    if not found:
        alt = f" (or {names[1]}/)" if len(names) > 1 else ""
        raise DataError(
            f"site folder {root / site}{alt} is missing; add it, or drop {site!r} from "
            f"dataset.sites. Expected layout:\n{TREE}"
        )
    return found[0]


_NIFTI = re.compile(r"^(?P<stem>.+)\.nii(\.gz)?$")


def list_cases(folder: Path) -> list[Case]:
    """The cases of a site folder, sorted by name; raises :class:`DataError` naming the file
    for an image without a mask, a mask without an image or a case given twice."""
    images: dict[str, Path] = {}
    masks: dict[str, Path] = {}
    for path in sorted(folder.iterdir()):
        match = _NIFTI.match(path.name)
        if match is None or not path.is_file():
            continue
        stem = match["stem"]
        suffix = next((s for s in MASK_SUFFIXES if stem.endswith(s)), None)
        target, key = (masks, stem[: -len(suffix)]) if suffix else (images, stem)
        if key in target:
            raise DataError(
                f"{folder}: case {key!r} has two {'masks' if suffix else 'images'}, "
                f"{target[key].name} and {path.name}; keep one"
            )
        target[key] = path
    for name, mask in masks.items():
        if name not in images:
            raise DataError(
                f"{mask} has no image: expected {folder / (name + '.nii.gz')}; add the image "
                f"or remove the mask"
            )
    cases = []
    for name in sorted(images):
        if name not in masks:
            raise DataError(
                f"{images[name]} has no segmentation: expected "
                f"{folder / (name + '_segmentation.nii.gz')} (or _Segmentation); add it or "
                f"move the image out of the site folder"
            )
        cases.append(Case(name, images[name], masks[name]))
    if not cases:
        raise DataError(
            f"site folder {folder} holds no <name>.nii.gz + <name>_segmentation.nii.gz "
            f"pairs. Expected layout:\n{TREE}"
        )
    return cases


# --------------------------------------------------------------------------------------------
# preprocessing
# --------------------------------------------------------------------------------------------


def normalize_volume(volume: np.ndarray, quantize: bool, path: Path | str = "volume") -> np.ndarray:
    """HarmoFL's per-volume intensity step: clip at the 99th percentile, min-max to [0, 1].

    Returns uint8 ``floor(255 (v - low) / (high - low))`` with ``quantize`` (the released
    ``astype(np.uint8)``), else float32 ``(v - low) / (high - low)``.
    """
    v = np.asarray(volume, dtype=np.float64)
    if not np.isfinite(v).all():
        raise DataError(f"{path}: the volume holds NaN or infinite values")
    high = float(np.quantile(v, PERCENTILE))
    low = float(v.min())
    if not high > low:
        raise DataError(
            f"{path}: the volume is constant below its 99th percentile ({low} .. {high}); "
            f"it cannot be min-max normalised"
        )
    scaled = (np.minimum(v, high) - low) / (high - low)
    if quantize:
        return (scaled * 255).astype(np.uint8)
    return scaled.astype(np.float32)


def binarize_mask(mask: np.ndarray) -> np.ndarray:
    """HarmoFL's ``label[label > 1] = 1`` then ``astype(int)``: foreground = value >= 1."""
    return (np.asarray(mask) >= 1).astype(np.uint8)


@dataclass
class SiteVolumes:
    """A site's preprocessed volumes, ``(Z, H, W)`` each, cases sorted by name."""

    cases: list[str]
    images: list[np.ndarray]  # uint8 (quantize) or float32 in [0, 1]
    masks: list[np.ndarray]  # uint8 in {0, 1}


def read_site(cases: list[Case], quantize: bool) -> SiteVolumes:
    """Read and preprocess every case (steps 1-3 of the module docstring)."""
    images, masks = [], []
    for case in cases:
        image = read_nifti(case.image)
        mask = read_nifti(case.mask)
        if image.shape != mask.shape:
            zyx = "(z, y, x)"
            raise DataError(
                f"{case.image} has shape {image.shape} {zyx} but its mask {case.mask.name} has "
                f"{mask.shape}; the mask must cover the image voxel for voxel"
            )
        images.append(normalize_volume(image, quantize, case.image))
        masks.append(binarize_mask(mask))
    return SiteVolumes([c.name for c in cases], images, masks)


def _cache_meta(folder: Path, cases: list[Case], quantize: bool) -> dict:
    files = []
    for case in cases:
        for path in (case.image, case.mask):
            st = path.stat()
            files.append([path.name, st.st_size, st.st_mtime_ns])
    return {
        "version": CACHE_VERSION,
        "folder": str(folder.resolve()),
        "files": files,
        "quantize": bool(quantize),
    }


def _read_cache(path: Path, n_cases: int) -> SiteVolumes | None:
    """The cached volumes, or ``None`` if the file is unreadable or holds another number of
    cases (then they are rebuilt from the NIfTI files: same result)."""
    z = cache.load_npz(path)
    if z is None or "cases" not in z:
        return None
    names = [str(s) for s in z["cases"]]
    keys = [f"{kind}_{k}" for kind in ("image", "mask") for k in range(n_cases)]
    if len(names) != n_cases or not all(k in z for k in keys):
        return None
    images = [z[f"image_{k}"] for k in range(n_cases)]
    masks = [z[f"mask_{k}"] for k in range(n_cases)]
    return SiteVolumes(names, images, masks)


def load_site_volumes(
    folder: Path, quantize: bool, cache_root: Path | None
) -> tuple[SiteVolumes, dict]:
    """A site's volumes from the cache if its key matches, else read (and cached)."""
    cases = list_cases(folder)
    if cache_root is None:
        return read_site(cases, quantize), {"path": None, "hit": False}
    meta = _cache_meta(folder, cases, quantize)
    target = cache_root / NAME / cache.json_digest(meta, 24)
    path = target / "volumes.npz"
    if path.is_file():
        cached = _read_cache(path, len(cases))
        if cached is not None and cached.cases == [c.name for c in cases]:
            return cached, {"path": str(target), "hit": True}
    vols = read_site(cases, quantize)
    cache.atomic_write_text(target / "meta.json", json.dumps(meta, indent=1) + "\n")
    arrays: dict[str, np.ndarray] = {"cases": np.array(vols.cases, dtype=str)}
    for k, (image, mask) in enumerate(zip(vols.images, vols.masks, strict=True)):
        arrays[f"image_{k}"] = image
        arrays[f"mask_{k}"] = mask
    cache.save_npz(path, arrays)
    return vols, {"path": str(target), "hit": False}


def slice_table(vols: SiteVolumes) -> np.ndarray:
    """Step 4's selection: ``(N, 2)`` rows (case index, slice i) for every slice i in
    1..Z-2 with a non-empty mask, case by case (sorted by name), i ascending."""
    rows = [
        (k, i)
        for k, mask in enumerate(vols.masks)
        for i in range(1, mask.shape[0] - 1)
        if mask[i].any()
    ]
    return np.asarray(rows, dtype=np.int64).reshape(-1, 2)


def build_split(vols: SiteVolumes, table: np.ndarray, idx: np.ndarray, size: int) -> Split:
    """Steps 4-5 for the slices ``table[idx]``, in that order: images = slices (i-1, i, i+1)
    as float32 ``(n, 3, size, size)`` in [0, 1], labels = mask i as int64 ``(n, size, size)``."""
    x = torch.empty(len(idx), 3, size, size, dtype=torch.float32)
    y = torch.empty(len(idx), size, size, dtype=torch.int64)
    for j, (k, i) in enumerate(table[np.asarray(idx, dtype=np.int64)]):
        image = torch.from_numpy(vols.images[k][i - 1 : i + 2])
        image = image.float().div_(255.0) if image.dtype == torch.uint8 else image.float()
        x[j] = resize_images(image[None], size)[0]
        y[j] = resize_labels(torch.from_numpy(vols.masks[k][i][None]).long(), size)[0]
    return Split(x, y)


# --------------------------------------------------------------------------------------------
# splits
# --------------------------------------------------------------------------------------------


def harmofl_index(index_dir: str, site: str, n: int) -> np.ndarray:
    """HarmoFL's fixed slice permutation ``<index_dir>/<name>-index.npy`` for ``site``."""
    name = HARMOFL_NAMES.get(site, site)
    path = Path(index_dir).expanduser() / f"{name}-index.npy"
    if not path.is_file():
        raise MissingSourceError(
            f"dataset.index_dir: {path} is missing (HarmoFL ships data/prostate/{name}-index.npy"
            f"); point dataset.index_dir at that folder or unset it for a seeded permutation"
        )
    try:
        index = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise DataError(f"{path}: not a readable .npy file ({exc})") from exc
    index = np.asarray(index).reshape(-1)
    if index.dtype.kind not in "iu" or not np.array_equal(np.sort(index), np.arange(n)):
        raise DataError(
            f"{path} is not a permutation of the {n} slices fedshift found for site {site} "
            f"(it has {index.size} entries): the files in the site folder differ from the ones "
            f"HarmoFL indexed; unset dataset.index_dir to use a seeded permutation"
        )
    return index.astype(np.int64)


def split_site(
    site: str, owner: np.ndarray, n_cases: int, params: ProstateParams
) -> dict[str, np.ndarray]:
    """Slice indices of each split (in split order) for one site."""
    fractions = check_fractions(params.fractions)
    n = len(owner)
    rng = seeded_rng(params.seed, f"{NAME}/{site}")
    if params.split_by == "slices":
        if params.index_dir is not None:
            order = harmofl_index(params.index_dir, site, n)
        else:
            order = rng.permutation(n)
        if params.split == "harmofl":
            a, b = cut_points(n, fractions)
            parts = {"train": order[:a], "val": order[a:b], "test": order[b:]}
        else:
            cuts = fedfa_cuts(n, params.split, params.train_fraction)
            parts = {s: order[lo:hi] for s, (lo, hi) in cuts.items()}
        unit, total = "slices", n
    else:
        case_order = rng.permutation(n_cases)
        a, b = cut_points(n_cases, fractions)
        groups = {"train": case_order[:a], "val": case_order[a:b], "test": case_order[b:]}
        parts = {s: rng.permutation(np.flatnonzero(np.isin(owner, g))) for s, g in groups.items()}
        unit, total = "cases", n_cases
    for split, idx in parts.items():
        if len(idx) == 0:
            raise DataError(
                f"prostate site {site}: the {split} split is empty ({total} {unit} with "
                f"prostate slices, {n} slices, cut by dataset.split={params.split} "
                f"(fractions={list(fractions)}, train_fraction={params.train_fraction}) with "
                f"dataset.split_by={params.split_by}); add cases to the site, drop it from "
                f"dataset.sites, or change dataset.split / dataset.fractions"
            )
    return parts


def fedfa_cuts(n: int, split: str, train_fraction: float = 1.0) -> dict[str, tuple[int, int]]:
    """FedFA's ``{split: (start, stop)}`` positions in a site's permuted slices (``n`` of them;
    module docstring): ``split="fedfa"`` (Table 13, Table 2's subsample) or
    ``"fedfa-released"`` (tfzhou/FedFA's slicing)."""
    n_val = n_test = int(0.2 * n)
    if split == "fedfa":
        full = int(0.6 * n)
        n_train = min(full, max(int(train_fraction * full), 32))
        return {"train": (0, n_train), "val": (full, full + n_val), "test": (n - n_test, n)}
    n_train = int(max(0.6 * train_fraction * n, 32))
    return {
        "train": (0, n_train),
        "val": (n_train, n_train + n_val),
        "test": (n - n_test, n),
    }


# --------------------------------------------------------------------------------------------
# the loader
# --------------------------------------------------------------------------------------------


def load_prostate(params: ProstateParams) -> Federation:
    """The ``prostate`` federation: one client per site, 2-D slices for segmentation."""
    params.validate()
    root = require_root(params.root, NAME, TREE)
    folders = {site: site_folder(root, site) for site in params.sites}
    cache_root = cache.cache_dir(params.cache_dir) if params.cache else None
    per_site = {}
    cache_info = {}
    for site, folder in folders.items():
        vols, cache_info[site] = load_site_volumes(folder, params.quantize, cache_root)
        table = slice_table(vols)
        parts = split_site(site, table[:, 0], len(vols.cases), params)
        per_site[site] = (vols, table, parts)
    before = {s: len(v[2]["train"]) for s, v in per_site.items()}
    truncate = params.truncate_train
    if truncate is None:
        truncate = params.split == "harmofl"
    keep = min(before.values()) if truncate else None
    clients, split_cases = [], {}
    for site, (vols, table, parts) in per_site.items():
        parts = dict(parts)
        if keep is not None:
            parts["train"] = parts["train"][:keep]
        splits = {s: build_split(vols, table, parts[s], params.size) for s in parts}
        clients.append(ClientData(site, splits["train"], splits["val"], splits["test"]))
        split_cases[site] = {
            s: sorted({vols.cases[k] for k in table[np.asarray(parts[s], dtype=np.int64), 0]})
            for s in ("train", "val", "test")
        }
    fed = Federation(
        NAME, clients, list(CLASSES), (3, params.size, params.size), task="segmentation"
    )
    fed.info = {
        "root": str(root),
        "site_folders": {s: f.name for s, f in folders.items()},
        "counts": fed.counts(),
        "cases": {s: len(v[0].cases) for s, v in per_site.items()},
        "slices": {s: len(v[1]) for s, v in per_site.items()},
        "split_cases": split_cases,
        "preprocessing": {
            "orientation": "SimpleITK array order (z, y, x): nibabel array transposed (2, 1, 0)",
            "intensity": f"clip at the {PERCENTILE:.0%} quantile, min-max per volume",
            "quantize": params.quantize,
            "mask": "foreground = value >= 1",
            "slices": "i in 1..Z-2 with non-empty mask; channels = slices i-1, i, i+1",
            "size": params.size,
            "resize": "bilinear (antialiased) images, nearest labels, only if not size x size",
        },
        "split": {
            "by": params.split_by,
            "fractions": list(params.fractions),
            "seed": params.seed,
            "index_dir": params.index_dir,
            "protocol": params.split,
            "train_fraction": params.train_fraction,
            "truncate_train": truncate,
            "train_before_truncation": before,
            "leaks_adjacent_slices": params.split_by == "slices",
        },
        "cache": cache_info if params.cache else None,
    }
    return fed


#: the ``prostate`` dataset (the dataset contract: :mod:`fedshift.core.datasets`)
PROSTATE_DATASET = Dataset(
    "prostate", ProstateParams, "segmentation", load_prostate,
    "multi-site prostate MRI segmentation (your NIfTI files: BIDMC, HK, I2CVB, BMC, RUNMC, UCL)",
)  # fmt: skip
