"""Shared readers and helpers for the loaders of users' own medical data.

Nothing here downloads anything: ``prostate``, ``camelyon17`` and ``nuclei`` read folders the
user keeps on disk (config key ``dataset.root``). This module holds what they share:

* :func:`require_root`: ``dataset.root`` unset or not a folder -> :class:`MissingSourceError`
  showing the expected layout as a small tree;
* :func:`read_nifti`: a NIfTI volume (nibabel) as the array SimpleITK's ``GetArrayFromImage``
  returns, i.e. indexed ``(z, y, x)`` (see its docstring);
* :func:`read_image` / :func:`read_mask`: PNG / JPEG / TIFF through Pillow (no ``tifffile``);
* :func:`resize_images` / :func:`resize_labels`: batch resizing in plain torch (bilinear with
  antialiasing for images, like Pillow's bilinear resize; nearest for label maps);
* :func:`stratified_subsample`, :func:`seeded_rng`, :func:`atomic_save_npz` and the parameter
  checks the loaders share.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from fedshift.core.errors import ConfigError, DataError, MissingSourceError

__all__ = [
    "IMAGE_EXTENSIONS",
    "LABEL_EXTENSIONS",
    "atomic_save_npz",
    "check_fractions",
    "check_size",
    "cut_points",
    "read_image",
    "read_mask",
    "read_nifti",
    "require_root",
    "resize_images",
    "resize_labels",
    "seeded_rng",
    "stratified_subsample",
]

#: image files the 2-D readers accept (suffix compared in lower case)
IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".tif", ".tiff")
#: label files must be lossless
LABEL_EXTENSIONS = (".png", ".tif", ".tiff")


# --------------------------------------------------------------------------------------------
# folders and parameters
# --------------------------------------------------------------------------------------------


def require_root(root: str | os.PathLike | None, dataset: str, tree: str) -> Path:
    """``dataset.root`` as an existing folder, else :class:`MissingSourceError`.

    ``tree`` is the expected layout (a few indented lines) shown in the message.
    """
    layout = f"Expected layout:\n{tree.rstrip()}"
    if root is None or str(root) == "":
        raise MissingSourceError(
            f"dataset {dataset!r} reads data you keep on disk (nothing is downloaded): set "
            f"dataset.root to its folder (e.g. `dataset.root=/data/{dataset}`). {layout}"
        )
    path = Path(root).expanduser()
    if not path.is_dir():
        what = "is a file, not a folder" if path.exists() else "does not exist"
        raise MissingSourceError(
            f"dataset.root={str(root)!r} {what}; set dataset.root to the folder holding your "
            f"{dataset} data. {layout}"
        )
    return path


def check_size(value: object, key: str, multiple: int = 1, minimum: int = 1) -> int:
    """An integer ``>= minimum`` divisible by ``multiple`` (a U-Net with four 2x poolings needs
    sides that are multiples of 16), else :class:`ConfigError` naming ``key``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"config key '{key}' must be an integer >= {minimum}, got {value!r}")
    if value % multiple:
        lower = max(multiple, value - value % multiple)
        raise ConfigError(
            f"config key '{key}' must be a multiple of {multiple} (the U-Net halves the image "
            f"four times), got {value}; use e.g. {lower} or {lower + multiple}"
        )
    return value


def check_fractions(value: object, key: str = "dataset.fractions") -> tuple[float, float, float]:
    """Three positive train/val/test fractions summing to 1 (within 1e-6)."""
    ok = isinstance(value, list | tuple) and len(value) == 3
    ok = ok and all(not isinstance(v, bool) and isinstance(v, int | float) for v in value)
    if not ok or any(v <= 0 for v in value) or abs(sum(value) - 1.0) > 1e-6:
        raise ConfigError(
            f"config key '{key}' must be three positive numbers [train, val, test] summing to "
            f"1, e.g. [0.64, 0.16, 0.2]; got {value!r}"
        )
    return float(value[0]), float(value[1]), float(value[2])


def cut_points(n: int, fractions: Sequence[float]) -> tuple[int, int]:
    """Where an ordered list of ``n`` items is cut into train / val / test.

    ``train = [0, int(f0 n))``, ``val = [int(f0 n), int((f0 + f1) n))``, ``test`` the rest:
    HarmoFL's ``utils/dataset.py`` slicing (``int(0.8 n 0.8)``, ``int(0.8 n)``), which gives
    the same integers as ``int(0.64 n)``, ``int(0.8 n)`` for every n below 5,000 (checked).
    """
    f0, f1 = float(fractions[0]), float(fractions[1])
    return int(f0 * n), int((f0 + f1) * n)


def seeded_rng(seed: int, tag: str) -> np.random.Generator:
    """A generator fixed by the data seed and a text tag (the same in every process)."""
    return np.random.default_rng([int(seed), zlib.crc32(tag.encode("utf-8"))])


def stratified_subsample(labels: np.ndarray, n: int | None, rng: np.random.Generator) -> np.ndarray:
    """Sorted indices of a class-stratified random subset of ``n`` of ``labels``.

    Each class keeps its share: class c gets ``n * count_c / N`` rounded by largest
    remainder (ties to the lower class). ``n`` None or ``>= N``: every index.
    """
    labels = np.asarray(labels)
    total = len(labels)
    if n is None or n >= total:
        return np.arange(total)
    classes, counts = np.unique(labels, return_counts=True)
    exact = n * counts / total
    quota = np.floor(exact).astype(np.int64)
    rest = n - int(quota.sum())
    order = np.argsort(-(exact - quota), kind="stable")
    quota[order[:rest]] += 1
    picks = [
        rng.choice(np.flatnonzero(labels == c), size=int(q), replace=False)
        for c, q in zip(classes, quota, strict=True)
    ]
    return np.sort(np.concatenate(picks))


def atomic_save_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """Write ``arrays`` as an uncompressed ``.npz`` under a temporary name, then rename it into
    place (readers never see a half-written file; concurrent writers each use their own
    temporary file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as fh:
            np.savez(fh, **arrays)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


# --------------------------------------------------------------------------------------------
# readers
# --------------------------------------------------------------------------------------------


def read_nifti(path: str | os.PathLike) -> np.ndarray:
    """A 3-D NIfTI volume as SimpleITK's ``GetArrayFromImage(ReadImage(path))`` returns it.

    nibabel indexes the stored voxels ``(i, j, k)`` = ``(x, y, z)``; SimpleITK returns the same
    buffer indexed ``[z, y, x]``. Neither reorients the voxels (the affine / direction cosines
    only describe them), so the result is nibabel's array transposed ``(2, 1, 0)``: axis 0 is
    the slice axis, each slice has rows = y and columns = x (checked against SimpleITK 2.5 on
    non-symmetric int16 volumes with flipped and rotated affines). The on-disk dtype is
    kept (int16 stays int16); a scaled volume (``scl_slope`` != 1) comes back as float32, as
    SimpleITK gives it. A trailing singleton 4th axis is dropped; other shapes are rejected.
    """
    try:
        import nibabel as nib
    except ImportError as exc:  # pragma: no cover - nibabel is installed with fedshift
        raise MissingSourceError(
            f"reading {path} needs the Python package nibabel: `pip install nibabel`"
        ) from exc
    path = Path(path)
    try:
        img = nib.load(str(path))
        data = np.asanyarray(img.dataobj)
    except Exception as exc:  # nibabel raises many kinds for damaged files
        raise DataError(f"{path}: not a readable NIfTI file ({exc}); replace the file") from exc
    while data.ndim > 3 and data.shape[-1] == 1:
        data = data[..., 0]
    if data.ndim != 3:
        raise DataError(f"{path}: expected a 3-D volume, got shape {tuple(data.shape)}")
    if data.dtype == np.float64 and img.get_data_dtype() != np.float64:
        data = data.astype(np.float32)
    return np.ascontiguousarray(data.transpose(2, 1, 0))


def _open(path: Path):
    from PIL import Image, UnidentifiedImageError

    try:
        img = Image.open(path)
        img.load()
    except (OSError, UnidentifiedImageError, ValueError) as exc:
        raise DataError(
            f"{path}: Pillow cannot read this image ({exc}); convert it to PNG"
        ) from exc
    return img


def _scaled_gray(path: Path, img) -> np.ndarray:
    """A single-channel image as float64 in [0, 1]: 8-bit / 255, 16-bit / 65535, float kept."""
    if img.mode in ("1", "L", "P"):
        return np.asarray(img.convert("L"), dtype=np.float64) / 255.0
    arr = np.asarray(img)
    if img.mode.startswith("I"):  # I;16* (16-bit) or I (32-bit ints, how 16-bit PNGs may open)
        if arr.size and (arr.min() < 0 or arr.max() > 65535):
            raise DataError(
                f"{path}: integer image with values outside 0-65535 ({arr.min()}..{arr.max()});"
                " save it as 8- or 16-bit"
            )
        return arr.astype(np.float64) / 65535.0
    if img.mode == "F":
        if arr.size and (np.nanmin(arr) < 0 or np.nanmax(arr) > 1 or np.isnan(arr).any()):
            raise DataError(
                f"{path}: float image with values outside [0, 1]; scale it to [0, 1] or save it"
                " as 8-bit"
            )
        return arr.astype(np.float64)
    raise DataError(f"{path}: unsupported image mode {img.mode!r}; save it as 8-bit gray or RGB")


def read_image(path: str | os.PathLike) -> np.ndarray:
    """An image as float32 ``(3, H, W)`` in ``[0, 1]``.

    RGB(A) and palette images -> RGB (alpha dropped, as Pillow's ``convert("RGB")`` does);
    8-bit values / 255 (``ToTensor``'s scaling). Gray images (8-bit, 16-bit / 65535, or float
    already in [0, 1]) are copied to three channels. Raises :class:`DataError` naming the file.
    """
    path = Path(path)
    img = _open(path)
    if img.mode in ("RGB", "RGBA", "RGBX", "P", "PA", "CMYK", "YCbCr", "LAB", "HSV"):
        rgb = np.asarray(img.convert("RGB"))
        out = rgb.astype(np.float32).transpose(2, 0, 1) / 255.0
        return np.ascontiguousarray(out)
    if img.mode in ("LA", "La"):
        img = img.getchannel("L")
    gray = _scaled_gray(path, img).astype(np.float32)
    return np.ascontiguousarray(np.broadcast_to(gray, (3, *gray.shape)))


def read_mask(path: str | os.PathLike) -> np.ndarray:
    """A label image as an ``(H, W)`` array of its raw values (no binarisation).

    Single-channel modes (1, L, P = palette indices, I;16, I, F) give their values; for RGB(A)
    masks a pixel's value is its largest colour channel (alpha ignored), so a pixel is
    non-zero exactly when any colour channel is.
    """
    path = Path(path)
    img = _open(path)
    if img.mode in ("RGB", "RGBA", "RGBX"):
        return np.asarray(img.convert("RGB")).max(axis=2)
    if img.mode in ("LA", "La"):
        img = img.getchannel("L")
    if img.mode in ("1", "L", "P") or img.mode.startswith("I") or img.mode == "F":
        arr = np.asarray(img)
        return arr.astype(np.uint8) if arr.dtype == bool else arr
    raise DataError(f"{path}: unsupported label image mode {img.mode!r}; save it as 8-bit gray")


# --------------------------------------------------------------------------------------------
# resizing
# --------------------------------------------------------------------------------------------


def resize_images(x: torch.Tensor, size: int) -> torch.Tensor:
    """Resize float images ``(N, C, H, W)`` to ``size x size``: bilinear, ``align_corners``
    False, antialiased when shrinking (as Pillow's bilinear resize, which torchvision's
    ``Resize`` uses on PIL images). Values are clamped to [0, 1]. Same size: returned as is."""
    if tuple(x.shape[-2:]) == (size, size):
        return x
    out = F.interpolate(
        x.float(), size=(size, size), mode="bilinear", align_corners=False, antialias=True
    )
    return out.clamp_(0.0, 1.0)


def resize_labels(y: torch.Tensor, size: int) -> torch.Tensor:
    """Resize integer label maps ``(N, H, W)`` to ``size x size`` by nearest neighbour on
    pixel centres (torch's ``nearest-exact``, Pillow's NEAREST), so no new classes appear."""
    if tuple(y.shape[-2:]) == (size, size):
        return y
    out = F.interpolate(y[:, None].float(), size=(size, size), mode="nearest-exact")
    return out[:, 0].round().to(y.dtype)
