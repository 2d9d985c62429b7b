"""Reading image and label files (Pillow) and resizing images in torch.

* :func:`read_image`: PNG / JPEG / TIFF / BMP as float32 ``(3, H, W)`` in ``[0, 1]``
  (Pillow ``convert("RGB")``; gray, 16-bit and float images handled, see its docstring);
* :func:`read_image_gray`: an image as float32 ``(1, H, W)`` (colour through Pillow's luma);
* :func:`read_image_fedbn`: an image as FedBN's Office / DomainNet datasets open it;
* :func:`read_mask`: a label image's raw values ``(H, W)``;
* :func:`resize_images` / :func:`resize_labels`: batch resizing in plain torch (bilinear with
  antialiasing for images, like Pillow's bilinear resize; nearest for label maps);
* :func:`resize_uint8`, :func:`to_uint8`, :func:`to_float`: 8-bit arrays in and out (what the
  image caches hold).

Every reader raises :class:`~fedshift.core.errors.DataError` naming the file it cannot read,
including an image whose declared size exceeds Pillow's ``Image.MAX_IMAGE_PIXELS`` (a
"decompression bomb": a few KB that would decode to gigabytes). Pillow refuses one above
twice that limit and only warns between one and two times it; both are an error here.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from fedshift.core.errors import DataError

__all__ = [
    "IMAGE_EXTENSIONS",
    "IMAGE_SUFFIXES",
    "LABEL_EXTENSIONS",
    "read_image",
    "read_image_fedbn",
    "read_image_gray",
    "read_mask",
    "resize_images",
    "resize_labels",
    "resize_uint8",
    "to_float",
    "to_uint8",
]

#: image files the 2-D readers accept (suffix compared in lower case)
IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".tif", ".tiff")
#: label files must be lossless
LABEL_EXTENSIONS = (".png", ".tif", ".tiff")
#: image files listed in class folders (suffix compared in lower case)
IMAGE_SUFFIXES = (*IMAGE_EXTENSIONS, ".bmp")
#: images resized per torch call when a whole array is resized
CHUNK = 2048


# --------------------------------------------------------------------------------------------
# readers
# --------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _no_bombs(path: Path) -> Iterator[None]:
    """Inside: an image over Pillow's pixel limit (its warning or its error) raises
    :class:`DataError` naming ``path``."""
    from PIL import Image

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            yield
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise DataError(
            f"{path}: the image declares more pixels than Pillow reads (Image.MAX_IMAGE_PIXELS"
            f" = {Image.MAX_IMAGE_PIXELS:,}; Pillow: {exc}). A malformed or hostile file (a "
            "'decompression bomb') or a huge image: replace it, or downscale a genuine one"
        ) from None


def _empty(path: Path) -> None:
    """A 0-byte file is a :class:`DataError` saying so (Pillow's message would not)."""
    with contextlib.suppress(OSError):
        if path.stat().st_size == 0:
            raise DataError(
                f"{path}: the file is empty (0 bytes), not an image; replace or remove it"
            )


def _open(path: Path):
    from PIL import Image, UnidentifiedImageError

    _empty(path)
    try:
        with _no_bombs(path):
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


def read_image_gray(path: str | os.PathLike) -> np.ndarray:
    """An image as float32 ``(1, H, W)`` in ``[0, 1]``: gray images as :func:`read_image`
    scales them (8-bit / 255, 16-bit / 65535, float kept); colour images (RGB(A), palette...)
    through Pillow's ``convert("L")`` (ITU-R 601-2 luma: 0.299 R + 0.587 G + 0.114 B), / 255.
    Raises :class:`DataError` naming the file."""
    path = Path(path)
    img = _open(path)
    if img.mode in ("LA", "La"):
        img = img.getchannel("L")
    if img.mode in ("1", "L", "P", "F") or img.mode.startswith("I"):
        gray = _scaled_gray(path, img)  # a palette through convert("L"): its colours' luma
    else:
        gray = np.asarray(img.convert("L"), dtype=np.float64) / 255.0
    return np.ascontiguousarray(gray.astype(np.float32)[None])


def read_mask(path: str | os.PathLike, gray_rgb: bool = False) -> np.ndarray:
    """A label image as an ``(H, W)`` array of its raw values (no binarisation).

    Single-channel modes (1, L, P = palette indices, I;16, I, F) give their values; for RGB(A)
    masks a pixel's value is its largest colour channel (alpha ignored), so a pixel is
    non-zero exactly when any colour channel is. With ``gray_rgb``, an RGB(A) mask must be
    gray (R = G = B in every pixel: a gray mask saved as RGB), else it is a
    :class:`DataError`: colours are not class indices (two colours with one largest channel
    would merge).
    """
    path = Path(path)
    img = _open(path)
    if img.mode in ("RGB", "RGBA", "RGBX"):
        rgb = np.asarray(img.convert("RGB"))
        if gray_rgb and not (
            np.array_equal(rgb[..., 0], rgb[..., 1]) and np.array_equal(rgb[..., 0], rgb[..., 2])
        ):
            raise DataError(
                f"{path}: a colour mask (its pixels are not gray), whose colours fedshift does "
                "not read as class indices; save the class indices as a gray or palette PNG"
            )
        return rgb.max(axis=2)
    if img.mode in ("LA", "La"):
        img = img.getchannel("L")
    if img.mode in ("1", "L", "P") or img.mode.startswith("I") or img.mode == "F":
        arr = np.asarray(img)
        return arr.astype(np.uint8) if arr.dtype == bool else arr
    raise DataError(f"{path}: unsupported label image mode {img.mode!r}; save it as 8-bit gray")


def read_image_fedbn(path: str | os.PathLike) -> np.ndarray:
    """An image as FedBN's ``OfficeDataset``/``DomainNetDataset`` open it: float32
    ``(3, H, W)`` in ``[0, 1]``.

    An image with 3 bands (RGB) is kept; any other band count (L, P, LA, RGBA, CMYK...) goes
    through ``convert("L")`` and is copied to three channels, the released code's
    ``if len(image.split()) != 3: Grayscale(num_output_channels=3)`` (so an RGBA or palette
    image becomes gray, as there). Raises :class:`DataError` naming the file.
    """
    from PIL import Image, UnidentifiedImageError

    path = Path(path)
    _empty(path)
    try:
        with _no_bombs(path), Image.open(path) as img:
            img.load()
            if len(img.getbands()) == 3:
                rgb = np.asarray(img.convert("RGB"), dtype=np.float32) / 255.0
                return np.ascontiguousarray(rgb.transpose(2, 0, 1))
            gray = np.asarray(img.convert("L"), dtype=np.float32) / 255.0
    except (OSError, UnidentifiedImageError, ValueError) as exc:
        raise DataError(f"{path}: Pillow cannot read this image ({exc}); replace the file") from exc
    return np.ascontiguousarray(np.broadcast_to(gray, (3, *gray.shape)))


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


# --------------------------------------------------------------------------------------------
# 8-bit arrays
# --------------------------------------------------------------------------------------------


def to_uint8(x: torch.Tensor) -> torch.Tensor:
    """Float images in ``[0, 1]`` to uint8, rounded (as Pillow returns a resized 8-bit image)."""
    return x.mul(255.0).round_().clamp_(0, 255).to(torch.uint8)


def resize_uint8(x: np.ndarray, size: int) -> np.ndarray:
    """uint8 images ``(N, C, H, W)`` resized to ``size x size`` (antialiased bilinear, see
    :func:`resize_images`) and rounded back to uint8, in chunks."""
    if tuple(x.shape[-2:]) == (size, size):
        return x
    out = np.empty((x.shape[0], x.shape[1], size, size), dtype=np.uint8)
    for start in range(0, x.shape[0], CHUNK):
        chunk = torch.from_numpy(x[start : start + CHUNK]).float().div_(255.0)
        out[start : start + CHUNK] = to_uint8(resize_images(chunk, size)).numpy()
    return out


def to_float(x: np.ndarray) -> torch.Tensor:
    """uint8 ``(N, C, H, W)`` -> float32 in ``[0, 1]``."""
    return torch.from_numpy(np.ascontiguousarray(x)).to(torch.float32).div_(255.0)
