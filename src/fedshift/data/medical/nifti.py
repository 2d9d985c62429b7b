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

__all__ = ["read_nifti"]


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

