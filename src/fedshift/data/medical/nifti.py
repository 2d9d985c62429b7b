"""Reading users' NIfTI volumes (nibabel) in the array order SimpleITK gives.

:func:`read_nifti` is what the ``prostate`` loader reads its cases with. (``brain-mri`` reads
nilearn's MNI152 template with its own reader in :mod:`~fedshift.data.medical.brain_mri`,
which keeps nibabel's ``(x, y, z)`` order.)
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from fedshift.core.errors import DataError, MissingSourceError
from fedshift.core.memory import check_fits
from fedshift.data.common.headers import nifti_bytes, require_regular

__all__ = ["VOLUME_FIX", "read_nifti"]

#: what to do about a volume too large for this machine's memory
VOLUME_FIX = (
    "check the file's header (its dimensions and data type; a damaged or hostile header can "
    "claim any size), crop or downsample the volume, or use a machine with more memory"
)


def read_nifti(path: str | os.PathLike) -> np.ndarray:
    """A 3-D NIfTI volume as SimpleITK's ``GetArrayFromImage(ReadImage(path))`` returns it.

    nibabel indexes the stored voxels ``(i, j, k)`` = ``(x, y, z)``; SimpleITK returns the same
    buffer indexed ``[z, y, x]``. Neither reorients the voxels (the affine / direction cosines
    only describe them), so the result is nibabel's array transposed ``(2, 1, 0)``: axis 0 is
    the slice axis, each slice has rows = y and columns = x (checked against SimpleITK 2.5 on
    non-symmetric int16 volumes with flipped and rotated affines). The on-disk dtype is
    kept (int16 stays int16); a scaled volume (``scl_slope`` != 1) comes back as float32, as
    SimpleITK gives it. A trailing singleton 4th axis is dropped; other shapes are rejected.
    A path that is not a regular file (a FIFO) is refused by type, and a volume whose header
    asks for more memory than this machine has by its estimate
    (:mod:`fedshift.data.common.headers`), before a voxel is read.
    """
    try:
        import nibabel as nib
    except ImportError as exc:  # pragma: no cover - nibabel is installed with fedshift
        raise MissingSourceError(
            f"reading {path} needs the Python package nibabel: `pip install nibabel`"
        ) from exc
    path = Path(path)
    require_regular(path, "a NIfTI volume")  # a FIFO would block nibabel's open
    try:
        img = nib.load(str(path))  # the header: the voxels are read below
        need, shown = nifti_bytes(img)
    except Exception as exc:  # nibabel raises many kinds for damaged files
        raise DataError(f"{path}: not a readable NIfTI file ({exc}); replace the file") from exc
    # the voxels and their reordered copy, known from the header before a byte is read
    check_fits(2 * need, f"{path} (a {shown} volume)", VOLUME_FIX)
    try:
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
