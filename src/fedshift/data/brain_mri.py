"""``brain-mri``: an offline segmentation benchmark. Real anatomy, simulated scanners.

**Anatomy (real).** The MNI152 2009a nonlinear symmetric template (Fonov et al., NeuroImage
2011; the ICBM 2009a T1 average of 152 brains) and its gray- and white-matter probability maps,
as shipped by the PyPI package ``nilearn`` in ``nilearn/datasets/data/``:
``mni_icbm152_{t1,gm,wm}_tal_nlin_sym_09a_converted.nii.gz`` (197x233x189 voxels at 1 mm, RAS,
skull-stripped, values 0..255), read with ``nibabel``. ``dataset.nifti_dir`` points at another
folder holding the same three files. There is one brain: train, validation and test hold
different slices of the same subject, so the benchmark measures robustness to the *scanner*
(feature) shift, not to anatomy across subjects.

**Volume.** The three volumes are cropped to the bounding box of the brain plus a
:data:`MARGIN`-voxel border and zero-padded, centred, to a cube (side 192 for the shipped
template), so that every slice of every orientation is already square ("pad to a square"
happens in 3-D, before the scanner model, and the padding receives the same noise as the rest
of the background).

**Labels.** ``labels: tissue`` (default): per-voxel class probabilities
(max(255 - gm - wm, 0), gm, wm) / 255 for (background = CSF and everything else, gray matter,
white matter); a voxel's class is the argmax (ties go to the lower class). ``labels: brain``:
the probabilities (255 - gm - wm, gm + wm) / 255 (gm + wm <= 255 in the template), i.e. brain
iff gm + wm > 127.5. Labels depend on the gm/wm maps only, never on the scanner.

**Slices.** For each orientation in ``dataset.orientations`` (axial, coronal, sagittal), slice
i is *usable* when 1 <= i <= D - 2 (it has both neighbours, as in HarmoFL's loop) and its
native-resolution label map has a foreground (non-background) fraction of at least
``dataset.min_foreground`` of the square cube plane (so the usable set does not depend on
``dataset.size``). A usable slice
becomes one example as in HarmoFL's and FedFA's prostate MRI loaders: slices (i-1, i, i+1)
of the site's scanner-transformed volume are its three channels and slice i's label map is
its target. Every slice of the volume is resized from the cube side to ``dataset.size`` by
area averaging (bilinear when enlarging), so channel 1 of slice i is exactly channel 0 of
slice i+1. Labels are resized by area-averaging the per-class probability maps, then argmax
(not nearest-neighbour on the label map), so thin cortex survives down-sampling. Display
orientation: axial slices have anterior at the top, coronal and sagittal superior at the top.
A slice is named ``"<orientation>:<index>"`` (index along the native axis of the cube).

**Sites.** ``dataset.sites`` clients ``site1..siteK`` hold disjoint slices: each orientation's
usable slices are cut into blocks of ``dataset.block`` consecutive slices; the blocks of all
orientations are shuffled (seeded by ``dataset.seed``) and dealt round-robin, so each site
sees anatomy from the whole range. Within a site its blocks (never single slices: adjacent
slices are near duplicates) are split in dealt order into train/val/test by
``dataset.fractions`` (FedFA's and HarmoFL's 64/16/20): ``round(0.16 n)`` blocks to val,
``round(0.20 n)`` to test, the rest to train (HarmoFL's loader instead permutes single slices
with a stored index and cuts at int(0.64 n) / int(0.8 n)). Slices on either side of a block
border can still share two of their three channels; only the label slice is never shared.

**Simulated scanners.** Site k applies its own fixed acquisition model (:data:`SCANNERS`, one
row per site; rows beyond the sixth are drawn from a fixed seed by :func:`scanner_table`) to
the whole 3-D T1 volume ``v`` = t1 / 255, in this order:

1. sequence contrast: ``v ** gamma``;
2. receive-coil bias field: ``v * exp(bias * p)``, with p a quadratic polynomial in the
   cube's normalised coordinates (coefficients drawn from ``bias_seed``), scaled so
   max |p| = 1 over the cube;
3. resolution: a 3-D Gaussian blur of ``blur`` mm, and/or thick slices along ``thick_axis``
   (the axis is area-averaged into round(side / thickness) slabs, then linearly interpolated
   back, as a viewer reconstructs a thick-slice acquisition);
4. Rician noise of standard deviation ``noise`` (magnitude of the complex signal with
   Gaussian noise on both channels), seeded by ``dataset.seed`` and the site;
5. per-volume normalisation: the 1st..99th percentile window of the brain voxels (template
   t1 > 0; most of the cube is empty background) is mapped to [0, 1] and clipped (HarmoFL
   clips each prostate volume at its 99th percentile and min-max scales it);
6. display window: ``clip(contrast * v + brightness, 0, 1)``. This linear step comes *after*
   the normalisation on purpose: a positive linear map before a percentile window would be
   cancelled exactly.

``dataset.scanner_strength`` s scales every effect from identity: gamma**s, s*bias, s*blur,
1 + s*(thickness - 1), s*noise, 1 + s*(contrast - 1), s*brightness. s = 0 gives every site
the same noiseless scanner (the no-feature-shift control); values above 1 extrapolate.

Building the default federation takes a few seconds (most of it the six 192^3 scanner
volumes); with ``dataset.cache`` (default) the arrays are kept in
``$FEDSHIFT_CACHE/brain-mri/<digest>.npz`` and later loads read them back.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import importlib.util
import json
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from fedshift.core.errors import ConfigError, DataError, MissingSourceError
from fedshift.data.base import SPLITS, ClientData, Federation, Split
from fedshift.data.digit_sources import default_cache_dir
from fedshift.data.medical_io import atomic_save_npz

NAME = "brain-mri"
DESCRIPTION = "real anatomy (MNI152 2009a template), simulated scanners"
ORIENTATIONS = ("axial", "coronal", "sagittal")
LABEL_SETS: dict[str, list[str]] = {
    "tissue": ["background", "gray matter", "white matter"],
    "brain": ["background", "brain"],
}
TEMPLATE_FILES = {
    k: f"mni_icbm152_{k}_tal_nlin_sym_09a_converted.nii.gz" for k in ("t1", "gm", "wm")
}
#: voxels of background kept around the brain's bounding box before padding to a cube
MARGIN = 4
#: the U-Net pools four times, so the side must be a multiple of 2**4
SIZE_DIVISOR = 16
#: percentile window of the per-volume normalisation (step 5)
WINDOW = (1.0, 99.0)
MAX_STRENGTH = 2.0
PIP_HINT = "pip install nilearn"
#: names the recipe in the cache digest; bump it when the arrays a parameter set gives change
RECIPE = "brain-mri-v1"

__all__ = [
    "DESCRIPTION",
    "LABEL_SETS",
    "ORIENTATIONS",
    "SCANNERS",
    "BrainMRIParams",
    "Scanner",
    "Template",
    "apply_scanner",
    "build_brain_mri",
    "cache_path",
    "load_brain_mri",
    "load_template",
    "locate_template",
    "render_slices",
    "rician_noise",
    "scanner_preview",
    "scanner_table",
    "usable_slices",
]


# --------------------------------------------------------------------------------------------
# parameters
# --------------------------------------------------------------------------------------------


@dataclass
class BrainMRIParams:
    """The ``dataset.*`` keys of ``brain-mri``."""

    #: "tissue": background / gray matter / white matter; "brain": background / brain
    labels: str = "tissue"
    #: slice orientations pooled into the sites (axial alone gives ~22 slices per site at K=6)
    orientations: list[str] = field(default_factory=lambda: ["axial", "coronal"])
    #: a slice is usable when this fraction of its (native, square) label map is foreground
    min_foreground: float = 0.05
    #: output side in pixels; a multiple of 16 (the U-Net pools four times)
    size: int = 64
    #: number of clients site1..siteK
    sites: int = 6
    #: consecutive usable slices per block (the unit dealt to sites and splits)
    block: int = 4
    #: train / val / test shares of each site's blocks (FedFA/HarmoFL: 64/16/20)
    fractions: list[float] = field(default_factory=lambda: [0.64, 0.16, 0.20])
    #: 0: identical noiseless scanners everywhere; 1: the scanner table's values
    scanner_strength: float = 1.0
    #: seeds the block dealing and the scanner noise
    seed: int = 0
    #: folder with the three template files; None: nilearn's installed copy
    nifti_dir: str | None = None
    #: keep the built arrays in <cache>/brain-mri/<digest>.npz and reuse them
    cache: bool = True

    def validate(self, prefix: str = "dataset") -> None:
        """Raise :class:`ConfigError` naming the key of any value the loader cannot honour."""

        def key(name: str) -> str:
            return f"{prefix}.{name}" if prefix else name

        def integer(name: str, value: object, low: int) -> None:
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ConfigError(
                    f"config key '{key(name)}' must be an integer >= {low}, got {value!r}"
                )

        def number(value: object) -> bool:
            return not isinstance(value, bool) and isinstance(value, int | float)

        if self.labels not in LABEL_SETS:
            raise ConfigError(
                f"config key '{key('labels')}': {self.labels!r} is not valid; choose one of "
                + ", ".join(repr(k) for k in LABEL_SETS)
            )
        o = self.orientations
        if isinstance(o, str) or not isinstance(o, list | tuple) or not o:
            raise ConfigError(
                f"config key '{key('orientations')}' must be a non-empty list from "
                f"{list(ORIENTATIONS)}, got {o!r}"
            )
        unknown = [x for x in o if x not in ORIENTATIONS]
        if unknown:
            raise ConfigError(
                f"config key '{key('orientations')}': unknown orientation(s) {unknown}; valid: "
                + ", ".join(ORIENTATIONS)
            )
        if len(set(o)) != len(o):
            raise ConfigError(f"config key '{key('orientations')}' names an orientation twice: {o}")
        if not number(self.min_foreground) or not 0 <= self.min_foreground < 1:
            raise ConfigError(
                f"config key '{key('min_foreground')}' must be a number in [0, 1), "
                f"got {self.min_foreground!r}"
            )
        integer("size", self.size, SIZE_DIVISOR)
        if self.size % SIZE_DIVISOR:
            lower = self.size // SIZE_DIVISOR * SIZE_DIVISOR
            raise ConfigError(
                f"config key '{key('size')}' must be a multiple of {SIZE_DIVISOR} (the U-Net "
                f"halves the image four times), got {self.size}; use {lower} or "
                f"{lower + SIZE_DIVISOR}"
            )
        integer("sites", self.sites, 1)
        integer("block", self.block, 1)
        integer("seed", self.seed, 0)
        f = self.fractions
        if (
            isinstance(f, str)
            or not isinstance(f, list | tuple)
            or len(f) != 3
            or not all(number(v) and v > 0 for v in f)
            or abs(sum(f) - 1.0) > 1e-6
        ):
            raise ConfigError(
                f"config key '{key('fractions')}' must be three positive numbers "
                f"(train, val, test) summing to 1, got {f!r}"
            )
        s = self.scanner_strength
        if not number(s) or not 0 <= s <= MAX_STRENGTH:
            raise ConfigError(
                f"config key '{key('scanner_strength')}' must be a number in "
                f"[0, {MAX_STRENGTH}] (0: identical scanners, 1: the scanner table), got {s!r}"
            )
        if not isinstance(self.cache, bool):
            raise ConfigError(
                f"config key '{key('cache')}' must be true or false, got {self.cache!r}"
            )
        if self.nifti_dir is not None and not isinstance(self.nifti_dir, str | Path):
            raise ConfigError(
                f"config key '{key('nifti_dir')}' must be a folder path or null, "
                f"got {self.nifti_dir!r}"
            )


# --------------------------------------------------------------------------------------------
# the scanner table
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Scanner:
    """One site's acquisition model (see the module docstring for the order of the steps)."""

    gamma: float  # 1. v -> v ** gamma
    bias: float  # 2. bias-field amplitude a: field exp(a p), max |p| = 1
    bias_seed: int  # 2. which quadratic polynomial p
    blur: float  # 3. 3-D Gaussian sigma in mm (voxels); 0: none
    thick_axis: str  # 3. "-" or the cube axis "x" / "y" / "z" acquired in thick slices
    thickness: float  # 3. slice thickness in mm along thick_axis; 1: native
    noise: float  # 4. Rician noise sigma on the [0, 1] intensity scale
    contrast: float  # 6. v -> clip(contrast * v + brightness, 0, 1) after normalisation
    brightness: float  # 6.

    def scaled(self, s: float) -> Scanner:
        """The scanner at strength ``s``: identity at 0, this row at 1."""
        return dataclasses.replace(
            self,
            gamma=float(self.gamma**s),
            bias=s * self.bias,
            blur=s * self.blur,
            thickness=1.0 + s * (self.thickness - 1.0),
            noise=s * self.noise,
            contrast=1.0 + s * (self.contrast - 1.0),
            brightness=s * self.brightness,
        )


#: site1..site6. Intensity, bias field, resolution and noise all differ; no row is extreme.
SCANNERS: tuple[Scanner, ...] = (
    #       gamma  bias  seed  blur  thick thickness noise  contrast brightness
    Scanner(1.00, 0.10, 1, 0.0, "-", 1.0, 0.010, 1.00, 0.00),  # site1: near-reference
    Scanner(0.70, 0.25, 2, 0.8, "-", 1.0, 0.020, 1.10, -0.05),  # site2: flat contrast, soft
    Scanner(1.40, 0.15, 3, 0.0, "z", 3.0, 0.015, 0.90, 0.05),  # site3: 3 mm axial slices
    Scanner(0.85, 0.35, 4, 1.2, "-", 1.0, 0.040, 1.00, 0.00),  # site4: strong bias, blurry
    Scanner(1.20, 0.20, 5, 0.0, "y", 4.0, 0.030, 1.20, -0.03),  # site5: 4 mm coronal slices
    Scanner(1.60, 0.30, 6, 0.5, "x", 2.0, 0.050, 0.80, 0.08),  # site6: dark GM, noisiest
)
#: seeds the rows of sites beyond len(SCANNERS); fixed, so site k's scanner never changes
EXTRA_SITES_SEED = zlib.crc32(b"brain-mri/extra-sites")
AXES = {"x": 0, "y": 1, "z": 2}


def scanner_table(sites: int) -> list[Scanner]:
    """The scanners of ``site1..site<sites>``: the rows of :data:`SCANNERS`, then rows drawn
    from ranges that cover the table with a generator fixed by :data:`EXTRA_SITES_SEED` and
    the site number (so adding sites never changes the earlier ones)."""
    rows = list(SCANNERS[:sites])
    for k in range(len(SCANNERS), sites):
        rng = np.random.default_rng([EXTRA_SITES_SEED, k])
        thick_axis = str(rng.choice(["-", "x", "y", "z"]))
        rows.append(
            Scanner(
                gamma=round(float(np.exp(rng.uniform(-0.4, 0.5))), 3),
                bias=round(float(rng.uniform(0.1, 0.35)), 3),
                bias_seed=k + 1,
                blur=round(float(rng.choice([0.0, rng.uniform(0.4, 1.2)])), 3),
                thick_axis=thick_axis,
                thickness=1.0 if thick_axis == "-" else round(float(rng.uniform(2.0, 4.0)), 3),
                noise=round(float(rng.uniform(0.01, 0.05)), 4),
                contrast=round(float(rng.uniform(0.8, 1.2)), 3),
                brightness=round(float(rng.uniform(-0.08, 0.08)), 3),
            )
        )
    return rows


# --------------------------------------------------------------------------------------------
# the template
# --------------------------------------------------------------------------------------------


def locate_template(nifti_dir: str | Path | None = None) -> dict[str, Path]:
    """Paths of the T1, GM and WM template files (keys ``t1``, ``gm``, ``wm``).

    ``nifti_dir`` if given (only there), else ``<nilearn>/datasets/data`` found without
    importing nilearn. Raises :class:`MissingSourceError` saying what to install or set.
    """
    names = ", ".join(TEMPLATE_FILES.values())
    if nifti_dir is not None:
        folder = Path(nifti_dir).expanduser()
        fix = "fix dataset.nifti_dir, or unset it to use nilearn's copy"
    else:
        spec = importlib.util.find_spec("nilearn")
        if spec is None or not spec.submodule_search_locations:
            raise MissingSourceError(
                f"brain-mri needs the MNI152 2009a template files ({names}) that ship with "
                f"nilearn, which is not installed: `{PIP_HINT}`, or set dataset.nifti_dir to "
                "a folder holding the three files"
            )
        folder = Path(list(spec.submodule_search_locations)[0]) / "datasets" / "data"
        fix = f"reinstall nilearn (`{PIP_HINT} --force-reinstall`) or set dataset.nifti_dir"
    paths = {k: folder / f for k, f in TEMPLATE_FILES.items()}
    missing = [p.name for p in paths.values() if not p.is_file()]
    if missing:
        raise MissingSourceError(
            f"brain-mri: {', '.join(missing)} not found in {folder}; {fix} (the folder must "
            f"hold {names})"
        )
    return paths


@dataclass(frozen=True)
class Template:
    """The cropped, cube-padded template: ``t1`` float32 in [0, 1]; ``gm``/``wm`` uint8;
    ``mask`` the skull-stripped brain (t1 > 0), where the normalisation window is measured."""

    t1: np.ndarray
    gm: np.ndarray
    wm: np.ndarray
    mask: np.ndarray
    crop: tuple[tuple[int, int], ...]  # (start, stop) per native axis
    source: dict[str, str]

    @property
    def side(self) -> int:
        return int(self.t1.shape[0])


def _read_nifti(path: Path) -> np.ndarray:
    try:
        import nibabel
    except ImportError as exc:
        raise MissingSourceError(
            "brain-mri reads NIfTI files with nibabel, which is not installed: "
            "`pip install nibabel`"
        ) from exc
    try:
        data = np.asarray(nibabel.load(str(path)).dataobj)
    except Exception as exc:  # nibabel raises many types for a corrupt file
        raise DataError(
            f"{path}: not a readable NIfTI file ({exc}); reinstall nilearn (`{PIP_HINT} "
            "--force-reinstall`) or fix dataset.nifti_dir"
        ) from exc
    if data.ndim != 3:
        raise DataError(f"{path}: expected a 3-D volume, got shape {data.shape}")
    return data


def load_template(nifti_dir: str | Path | None = None) -> Template:
    """Read the three files, crop to the brain + :data:`MARGIN`, pad to a cube (centred)."""
    paths = locate_template(nifti_dir)
    stamp = tuple((str(p), p.stat().st_mtime_ns, p.stat().st_size) for p in paths.values())
    return _load_template(stamp)


@functools.lru_cache(maxsize=2)
def _load_template(stamp: tuple[tuple[str, int, int], ...]) -> Template:
    paths = {k: Path(s[0]) for k, s in zip(TEMPLATE_FILES, stamp, strict=True)}
    vols = {k: _read_nifti(p) for k, p in paths.items()}
    shapes = {k: v.shape for k, v in vols.items()}
    if len(set(shapes.values())) != 1:
        raise DataError(f"brain-mri: the template volumes differ in shape: {shapes}")
    for k in ("gm", "wm"):
        v = vols[k]
        if v.min() < 0 or v.max() > 255:
            raise DataError(f"{paths[k]}: probability map outside 0..255")
    t1 = np.clip(vols["t1"].astype(np.float32) / 255.0, 0.0, 1.0)
    gm = vols["gm"].astype(np.uint8)
    wm = np.minimum(vols["wm"].astype(np.int32), 255 - gm.astype(np.int32)).astype(np.uint8)
    inside = np.argwhere((t1 > 0) | (gm > 0) | (wm > 0))
    if inside.size == 0:
        raise DataError(f"brain-mri: {paths['t1']} and the GM/WM maps are empty")
    lo = np.maximum(inside.min(0) - MARGIN, 0)
    hi = np.minimum(inside.max(0) + 1 + MARGIN, t1.shape)
    crop = tuple((int(a), int(b)) for a, b in zip(lo, hi, strict=True))
    side = int(max(b - a for a, b in crop))

    def cube(v: np.ndarray) -> np.ndarray:
        part = v[tuple(slice(a, b) for a, b in crop)]
        pad = [((side - n) // 2, side - n - (side - n) // 2) for n in part.shape]
        out = np.pad(part, pad)
        out.setflags(write=False)
        return out

    t1c = cube(t1)
    mask = t1c > 0
    mask.setflags(write=False)
    source = {k: str(p) for k, p in paths.items()}
    return Template(t1c, cube(gm), cube(wm), mask, crop, source)


def class_probabilities(gm: np.ndarray, wm: np.ndarray, labels: str) -> np.ndarray:
    """Per-class probability maps ``(C, *gm.shape)`` float32 for ``tissue`` or ``brain``.

    ``gm``/``wm`` are uint8 (0..255) with gm + wm <= 255 (see :func:`load_template`)."""
    g = gm.astype(np.int16)
    w = wm.astype(np.int16)
    bg = np.clip(255 - g - w, 0, 255)
    # integer shares first, then one division: a tie stays an exact tie in float32
    stack = np.stack([bg, g, w] if labels == "tissue" else [bg, g + w])
    return stack.astype(np.float32) / np.float32(255.0)


# --------------------------------------------------------------------------------------------
# the scanner model
# --------------------------------------------------------------------------------------------


def bias_field(side: int, amplitude: float, seed: int) -> np.ndarray:
    """``exp(amplitude * p)`` on a cube, p a random quadratic in coordinates in [-1, 1]
    (monomials x, y, z, x^2, y^2, z^2, xy, xz, yz) scaled to max |p| = 1."""
    c = np.random.default_rng([zlib.crc32(b"brain-mri/bias"), seed]).standard_normal(9)
    t = np.linspace(-1.0, 1.0, side, dtype=np.float64)
    fx, fy, fz = (c[i] * t + c[i + 3] * t * t for i in range(3))
    xy = fx[:, None] + fy[None, :] + c[6] * np.outer(t, t)  # terms in (x, y)
    xz = fz[None, :] + c[7] * np.outer(t, t)  # terms in (x, z) and z alone
    yz = c[8] * np.outer(t, t)  # the (y, z) term
    p = xy.astype(np.float32)[:, :, None] + xz.astype(np.float32)[:, None, :]
    p += yz.astype(np.float32)[None, :, :]
    p *= np.float32(amplitude / np.abs(p).max())
    return np.exp(p, out=p)


def thick_slices(v: np.ndarray, axis: int, thickness: float) -> np.ndarray:
    """Average ``axis`` into round(n / thickness) slabs, then interpolate back linearly."""
    n = v.shape[axis]
    m = max(1, round(n / thickness))
    if m >= n:
        return v
    moved = np.ascontiguousarray(np.moveaxis(v, axis, -1))
    t = torch.from_numpy(moved).reshape(1, -1, n)
    low = F.adaptive_avg_pool1d(t, m)
    back = F.interpolate(low, size=n, mode="linear", align_corners=False)
    return np.moveaxis(back.reshape(moved.shape).numpy(), -1, axis)


def rician_noise(v: np.ndarray, sigma: float, rng: np.random.Generator) -> np.ndarray:
    """``|v + sigma (n1 + i n2)|`` with n1, n2 ~ N(0, 1): the magnitude of an MR signal with
    complex Gaussian noise (Rician; Rayleigh with mean sigma sqrt(pi / 2) where v = 0).
    Overwrites and returns float32 arrays; ``v`` itself is consumed."""
    s = np.float32(sigma)
    real = rng.standard_normal(v.shape, dtype=np.float32)
    real *= s
    real += v
    real *= real
    out = rng.standard_normal(v.shape, dtype=np.float32)
    out *= s
    out *= out
    out += real
    return np.sqrt(out, out=out)


def apply_scanner(
    t1: np.ndarray,
    scanner: Scanner,
    rng: np.random.Generator,
    mask: np.ndarray | None = None,
) -> np.ndarray:
    """Steps 1-6 of the module docstring on a float32 volume in [0, 1]; returns float32
    in [0, 1]. The percentile window of step 5 is taken over ``mask`` (the template's brain:
    most of the cube is empty background, whose percentiles say nothing about tissue) or the
    whole volume. A step whose parameter is at its identity value is skipped exactly."""
    from scipy.ndimage import gaussian_filter

    v = np.array(t1, dtype=np.float32)
    if scanner.gamma != 1.0:
        np.power(v, np.float32(scanner.gamma), out=v)
    if scanner.bias != 0.0:
        if v.shape[0] != v.shape[1] or v.shape[1] != v.shape[2]:
            raise ValueError("the bias field needs a cube")
        v *= bias_field(v.shape[0], scanner.bias, scanner.bias_seed)
    if scanner.blur > 0.0:
        v = gaussian_filter(v, sigma=scanner.blur, mode="nearest")
    if scanner.thick_axis != "-" and scanner.thickness > 1.0:
        v = thick_slices(v, AXES[scanner.thick_axis], scanner.thickness)
    if scanner.noise > 0.0:
        v = rician_noise(v, scanner.noise, rng)
    lo, hi = np.percentile(v if mask is None else v[mask], WINDOW)
    if not hi > lo:
        raise DataError(
            f"brain-mri: the {WINDOW[0]:g}..{WINDOW[1]:g} percentile window of a scanner "
            "volume is empty; the template files look wrong (check dataset.nifti_dir)"
        )
    v -= np.float32(lo)
    v *= np.float32(1.0 / (hi - lo))
    np.clip(v, 0.0, 1.0, out=v)
    if scanner.contrast != 1.0 or scanner.brightness != 0.0:
        v *= np.float32(scanner.contrast)
        v += np.float32(scanner.brightness)
        np.clip(v, 0.0, 1.0, out=v)
    return v


def _noise_rng(seed: int, site: int) -> np.random.Generator:
    return np.random.default_rng([seed, zlib.crc32(b"brain-mri/noise"), site])


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


def _resize(stack: torch.Tensor, size: int) -> torch.Tensor:
    """``(N, C, S, S)`` -> ``(N, C, size, size)``: area averaging, bilinear when enlarging."""
    if stack.shape[-1] == size:
        return stack.clone()
    if size < stack.shape[-1]:
        return F.interpolate(stack, size=(size, size), mode="area")
    return F.interpolate(stack, size=(size, size), mode="bilinear", align_corners=False)


def usable_slices(template: Template, p: BrainMRIParams) -> dict[str, np.ndarray]:
    """Per orientation, the usable slice indices (see the module docstring)."""
    probs = class_probabilities(template.gm, template.wm, p.labels)
    fg = probs[1:].max(0) > probs[0]  # argmax != 0, ties to the background
    side = template.side
    out = {}
    for o in p.orientations:
        frac = oriented(fg, o).sum(axis=(1, 2)) / float(side * side)
        idx = np.flatnonzero(frac >= p.min_foreground)
        out[o] = idx[(idx >= 1) & (idx <= side - 2)]
    return out


def _label_maps(template: Template, p: BrainMRIParams, orientation: str, idx: np.ndarray):
    """int64 ``(len(idx), size, size)`` label maps: resized class probabilities, argmax."""
    gm = np.ascontiguousarray(oriented(template.gm, orientation)[idx])
    wm = np.ascontiguousarray(oriented(template.wm, orientation)[idx])
    probs = class_probabilities(gm, wm, p.labels)  # (C, n, S, S)
    t = torch.from_numpy(np.ascontiguousarray(probs.transpose(1, 0, 2, 3)))
    return _resize(t, p.size).argmax(dim=1).to(torch.int64)


def parse_id(slice_id: str) -> tuple[str, int]:
    """``"axial:93"`` -> ``("axial", 93)``."""
    o, _, i = slice_id.partition(":")
    if o not in ORIENTATIONS or not i.isdigit():
        raise ValueError(f"not a brain-mri slice id: {slice_id!r} (want '<orientation>:<index>')")
    return o, int(i)


def _images(volume: np.ndarray, ids: list[str], size: int) -> torch.Tensor:
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
        small = _resize(stack.unsqueeze(1), size)[:, 0]
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
    order = np.random.default_rng([p.seed, zlib.crc32(b"brain-mri/deal")]).permutation(len(blocks))
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


# --------------------------------------------------------------------------------------------
# the loader
# --------------------------------------------------------------------------------------------


def site_names(sites: int) -> list[str]:
    return [f"site{k + 1}" for k in range(sites)]


def _site_index(site: int | str, sites: int) -> int:
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
    return apply_scanner(template.t1, scanner, _noise_rng(p.seed, site), template.mask)


def render_slices(p: BrainMRIParams, site: int | str, ids: list[str]) -> torch.Tensor:
    """Slices ``ids`` (any, whichever site holds them) imaged by ``site``'s scanner:
    ``(len(ids), 3, size, size)``, exactly as :func:`load_brain_mri` builds them."""
    p.validate()
    k = _site_index(site, p.sites)
    template = load_template(p.nifti_dir)
    return _images(site_volume(template, p, k), ids, p.size)


def build_brain_mri(p: BrainMRIParams) -> Federation:
    """Build the ``brain-mri`` federation from the template (no disk cache)."""
    p.validate()
    template = load_template(p.nifti_dir)
    usable = usable_slices(template, p)
    dealt = deal(usable, p)
    labels = {o: _label_maps(template, p, o, usable[o]) for o in p.orientations}
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
            s: Split(_images(volume, dealt[k][s], p.size), label_of(dealt[k][s])) for s in SPLITS
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
        "sources": {
            k: hashlib.sha256(path.read_bytes()).hexdigest() for k, path in sources.items()
        },
    }
    digest = hashlib.sha256(json.dumps(blob, sort_keys=True).encode()).hexdigest()[:20]
    return default_cache_dir() / NAME / f"{digest}.npz"


def _save(fed: Federation, path: Path) -> None:
    arrays = {"info": np.frombuffer(json.dumps(fed.info).encode(), dtype=np.uint8)}
    for c in fed.clients:
        for s in SPLITS:
            arrays[f"{c.name}/{s}/x"] = c.split(s).x.numpy()
            arrays[f"{c.name}/{s}/y"] = c.split(s).y.to(torch.uint8).numpy()
    atomic_save_npz(path, arrays)


def _restore(path: Path, p: BrainMRIParams) -> Federation | None:
    """The cached federation, or None if the file is absent or unreadable (then rebuilt)."""
    if not path.is_file():
        return None
    try:
        with np.load(path) as z:
            info = json.loads(z["info"].tobytes().decode())
            clients = []
            for name in site_names(p.sites):
                splits = {
                    s: Split(
                        torch.from_numpy(z[f"{name}/{s}/x"].copy()),
                        torch.from_numpy(z[f"{name}/{s}/y"].astype(np.int64)),
                    )
                    for s in SPLITS
                }
                clients.append(ClientData(name, splits["train"], splits["val"], splits["test"]))
    except (OSError, KeyError, ValueError, zipfile.BadZipFile):
        return None
    classes = list(LABEL_SETS[p.labels])
    return Federation(NAME, clients, classes, (3, p.size, p.size), info, task="segmentation")


def load_brain_mri(p: BrainMRIParams) -> Federation:
    """The ``brain-mri`` federation (see the module docstring). With ``dataset.cache`` the
    built arrays are kept in :func:`cache_path` (written atomically) and read back next time;
    a cached federation equals a fresh build bit for bit."""
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
    label = _label_maps(template, params, o0, np.array([i0]))[0].numpy()
    cols = len(ids) + 1
    fig = Figure(figsize=(1.9 * cols + 1.2, 1.9 * params.sites + 0.4))
    FigureCanvasAgg(fig)
    axes = fig.subplots(params.sites, cols, squeeze=False)
    colours = ListedColormap(["black", "tab:orange", "white"][: len(LABEL_SETS[params.labels])])
    for k, name in enumerate(site_names(params.sites)):
        images = _images(site_volume(template, params, k), ids, params.size)
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
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    return {"slices": ids, "path": str(path)}
