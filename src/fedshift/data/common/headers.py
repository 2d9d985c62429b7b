"""What a user's array or volume file will take in memory, read from its header before it is
loaded, and the check that it is a regular file at all.

A 2.8 MB compressed ``.npz`` can hold arrays of 12 GB, a 4.4 MB ``.nii.gz`` a volume of
7.6 GB: loading one asked the machine for that memory (a ``MemoryError`` traceback, or the
kernel's OOM killer). A ``.npy`` header states its shape and dtype in its first bytes (in an
``.npz`` each member is a ``.npy`` file: its first bytes are decompressed, nothing more), a
NIfTI header its dimensions and data type, so the loaders here estimate the bytes first
(:func:`array_bytes`, :func:`npy_headers`, :func:`nifti_bytes`: the volume that
``nibabel.load`` describes before it reads a voxel) and refuse an estimate over
the memory available (:func:`fedshift.core.memory.check_fits`) with the estimate and the fix.

A FIFO (named pipe), socket or device in place of a data file blocks the reader forever (a
FIFO's ``open`` waits for a writer): :func:`open_regular` opens without blocking and refuses
anything but a regular file (a symbolic link to one is fine), :func:`require_regular` checks
a path by ``stat`` where a library opens the file by name (nibabel).
"""

from __future__ import annotations

import math
import os
import stat
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

from fedshift.core.errors import DataError

__all__ = [
    "ArrayHeader",
    "array_bytes",
    "nifti_bytes",
    "npy_headers",
    "open_regular",
    "require_regular",
]

#: what a path is, by the type bits of its mode
_KINDS = (
    (stat.S_ISFIFO, "a named pipe (FIFO)"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISDIR, "a folder"),
)


def _not_regular(path: Path, mode: int, what: str) -> DataError:
    kind = next((k for test, k in _KINDS if test(mode)), "not a regular file")
    return DataError(
        f"{path} is {kind}, not a regular file; {what} is read from regular files only (a "
        "pipe or device would block the reader or never end): put the file itself there"
    )


def require_regular(path: str | os.PathLike, what: str = "data") -> Path:
    """``path`` if it is a regular file (or a link to one), else a :class:`DataError` saying
    what it is; a missing path is left to the caller's own error (``OSError`` then)."""
    path = Path(path)
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return path
    if not stat.S_ISREG(mode):
        raise _not_regular(path, mode, what)
    return path


def open_regular(path: str | os.PathLike, what: str = "data") -> BinaryIO:
    """``path`` opened for binary reading if it is a regular file: opened without blocking
    (a FIFO's ``open`` would wait for a writer), then checked on the open descriptor, so a
    file swapped in between is caught too. Anything else: a :class:`DataError`."""
    path = Path(path)
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise _not_regular(path, mode, what)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


@dataclass(frozen=True)
class ArrayHeader:
    """One array as its ``.npy`` header states it."""

    shape: tuple[int, ...]
    dtype: np.dtype

    @property
    def nbytes(self) -> int:
        return array_bytes(self.shape, self.dtype)

    def __str__(self) -> str:
        return f"{self.shape} {self.dtype}"


def array_bytes(shape: tuple[int, ...], dtype: np.dtype | type | str) -> int:
    """The bytes of an array of ``shape`` and ``dtype`` (Python integers: no overflow)."""
    return math.prod(int(s) for s in shape) * np.dtype(dtype).itemsize


def _header(fh: BinaryIO, where: str) -> ArrayHeader:
    """The shape and dtype of the ``.npy`` data starting at ``fh`` (only its header read)."""
    fmt = np.lib.format
    try:
        version = fmt.read_magic(fh)
        if version == (1, 0):
            shape, _, dtype = fmt.read_array_header_1_0(fh)
        elif version == (2, 0):
            shape, _, dtype = fmt.read_array_header_2_0(fh)
        else:  # 3.0: a utf-8 header, read as numpy reads it
            shape, _, dtype = fmt._read_array_header(fh, version)  # noqa: SLF001
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as exc:
        raise DataError(
            f"{where}: not a readable .npy array header ({exc}); save it with np.save / np.savez"
        ) from exc
    return ArrayHeader(tuple(int(s) for s in shape), np.dtype(dtype))


def npy_headers(path: str | os.PathLike) -> dict[str, ArrayHeader]:
    """The arrays a ``.npy`` (``{"": header}``) or ``.npz`` (``{member name without .npy:
    header}``) file holds, from the headers alone; a file that is not regular, not a zip or
    not ``.npy`` members is a :class:`DataError` naming it."""
    path = Path(path)
    with open_regular(path, "an array file") as fh:
        if path.suffix != ".npz":
            return {"": _header(fh, str(path))}
        try:
            with zipfile.ZipFile(fh) as z:
                out = {}
                for info in z.infolist():
                    name = info.filename.removesuffix(".npy")
                    with z.open(info) as member:
                        out[name] = _header(member, f"{path} (array {name!r})")
                return out
        except (zipfile.BadZipFile, OSError, EOFError) as exc:
            raise DataError(
                f"{path}: not a readable .npz of plain arrays ({exc}); save it with "
                "np.savez(path, x=..., y=...)"
            ) from exc


def nifti_bytes(img: object) -> tuple[int, str]:
    """The bytes reading a NIfTI volume takes (its voxels at the dtype nibabel returns: the
    stored one, float64 when the header scales integers) and a description (``197x233x189
    int16``), from ``img``, what ``nibabel.load`` returned: the header only (nibabel reads
    the voxels when asked for them)."""
    shape = tuple(int(s) for s in img.shape)  # type: ignore[attr-defined]
    dtype = np.dtype(img.get_data_dtype())  # type: ignore[attr-defined]
    proxy = img.dataobj  # type: ignore[attr-defined]
    slope, inter = getattr(proxy, "slope", 1.0), getattr(proxy, "inter", 0.0)

    def set_(v: object, neutral: float) -> bool:
        return v is not None and not np.isnan(v) and float(v) != neutral  # type: ignore[arg-type]

    scaled = set_(slope, 1.0) or set_(inter, 0.0)
    out = np.dtype(np.float64) if scaled and dtype.kind in "iu" else dtype
    return array_bytes(shape, out), f"{'x'.join(map(str, shape))} {dtype}"
