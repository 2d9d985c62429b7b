"""Unpickling users' data files (FedBN's, CIFAR's, HarmoFL's pickles) without running code.

:func:`read_array_pickle` uses an unpickler that builds numpy arrays, numpy scalars and plain
containers (dicts, lists, tuples, strings, numbers) and refuses every other global, so a
pickle cannot construct arbitrary objects or call functions.
"""

from __future__ import annotations

import importlib
import pickle
from pathlib import Path

import numpy as np

from fedshift.core.errors import DataError

__all__ = ["read_array_pickle"]

_ALLOWED_GLOBALS = {
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"),
    ("numpy._core.multiarray", "scalar"),
    ("numpy.core.numeric", "_frombuffer"),
    ("numpy._core.numeric", "_frombuffer"),
    ("_codecs", "encode"),  # bytes in protocol-2 pickles written by Python 3
}


class _ArraysOnly(pickle.Unpickler):
    """Builds numpy arrays, numpy scalars and plain containers; refuses every other global."""

    def find_class(self, module: str, name: str):  # noqa: D401 - pickle API
        if (module, name) not in _ALLOWED_GLOBALS:
            raise pickle.UnpicklingError(f"refusing to build {module}.{name}")
        if module.startswith("numpy.core.") and int(np.__version__.split(".")[0]) >= 2:
            module = "numpy._core." + module[len("numpy.core.") :]  # numpy 2 renamed it
        return getattr(importlib.import_module(module), name)


def read_array_pickle(path: Path, expected: str, encoding: str = "bytes") -> object:
    """Unpickle ``path`` allowing only numpy arrays and plain containers.

    ``expected`` describes the content for the error message. Python-2 pickles (CIFAR's) are
    read with ``encoding`` (``"bytes"``: their str keys stay bytes, as CIFAR documents).
    Raises :class:`DataError` naming the file for anything unreadable.
    """
    try:
        with open(path, "rb") as fh:
            return _ArraysOnly(fh, encoding=encoding).load()
    except Exception as exc:  # a damaged pickle can raise almost anything
        raise DataError(
            f"{path}: not a pickle of numpy arrays fedshift can read ({type(exc).__name__}: "
            f"{exc}); it should hold {expected}"
        ) from exc
