"""The MNI152 template of ``brain-mri``: finding nilearn's files, reading them, cropping to the
brain and padding to a cube, and the per-class probability maps of the labels."""

from __future__ import annotations

import functools
import importlib.util
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedshift.core.errors import DataError, FedshiftError, MissingSourceError
from fedshift.core.memory import check_fits
from fedshift.data.common.headers import nifti_bytes, require_regular
from fedshift.data.medical.brain_mri.params import MARGIN, PIP_HINT, TEMPLATE_FILES
from fedshift.data.medical.nifti import VOLUME_FIX

__all__ = ["Template", "class_probabilities", "load_template", "locate_template"]


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
                f"nilearn, which is not installed: `pip install 'fedshift[mri]'` (or "
                f"`{PIP_HINT}`), or set dataset.nifti_dir to a folder holding the three files"
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
    require_regular(path, "a NIfTI volume")  # a FIFO would block nibabel's open
    try:
        img = nibabel.load(str(path))  # the header; the voxels are read below
        need, shown = nifti_bytes(img)
        check_fits(need, f"{path} (a {shown} volume)", VOLUME_FIX)  # before a voxel is read
        data = np.asarray(img.dataobj)
    except FedshiftError:
        raise
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
