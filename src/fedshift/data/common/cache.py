"""The on-disk cache of the dataset loaders: where it lives and how arrays go in and out.

Every loader that caches (digits pools, brain-mri federations, prostate volumes, decoded
image files) goes through these helpers:

* :func:`cache_dir`: ``dataset.cache_dir`` if set, else ``$FEDSHIFT_CACHE``, else
  ``~/.cache/fedshift``;
* :func:`atomic_write` / :func:`atomic_write_text`: write under a temporary name in the
  target folder, then ``os.replace`` it into place, so a reader never sees a half-written
  file and concurrent writers never clobber each other's temporary file;
* :func:`save_npz` / :func:`load_npz`: uncompressed ``.npz`` archives of named arrays,
  written atomically and read with ``allow_pickle=False`` (a cache file holding an object
  array is refused, never unpickled: the loader rebuilds it instead);
* :func:`npy_bytes` / :func:`load_npy_bytes`: one array as ``.npy`` bytes (the digits pools,
  whose manifest records the sha256 of exactly these bytes);
* :func:`json_digest`: the hex digest that names a cache entry after what it was built from;
  :func:`sha256_file`: the checksum of a source file (recorded in manifests and digests).

Nothing here caches with ``torch.save``; a loader that ever does must read it back with
``torch.load(..., weights_only=True)``.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import zipfile
from pathlib import Path

import numpy as np

from fedshift.core.files import atomic_output, write_bytes_atomic

__all__ = [
    "atomic_write",
    "atomic_write_text",
    "cache_dir",
    "json_digest",
    "load_npy_bytes",
    "load_npz",
    "npy_bytes",
    "save_npz",
    "sha256_file",
]

#: what reading a damaged, truncated or pickle-holding cache file may raise
UNREADABLE = (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile)


def cache_dir(override: str | os.PathLike | None = None) -> Path:
    """The cache folder: ``override`` (``~`` expanded) if given and non-empty, else
    ``$FEDSHIFT_CACHE`` if set, else ``~/.cache/fedshift``. Read at call time, so a changed
    environment variable takes effect at once."""
    if override:
        return Path(override).expanduser()
    env = os.environ.get("FEDSHIFT_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "fedshift"


def atomic_write(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically, never through a link planted in the cache
    (:func:`fedshift.core.files.write_bytes_atomic`); creates the parent folder."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_bytes_atomic(path, data)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """:func:`atomic_write` of ``text`` encoded as UTF-8."""
    atomic_write(path, text.encode("utf-8"))


def save_npz(path: str | os.PathLike, arrays: dict[str, np.ndarray]) -> None:
    """Write ``arrays`` as an uncompressed ``.npz`` atomically (see :func:`atomic_write`)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_output(path) as tmp, open(tmp, "r+b") as fh:
        np.savez(fh, **arrays)


def load_npz(path: str | os.PathLike) -> dict[str, np.ndarray] | None:
    """Every array of a cached ``.npz``, read with ``allow_pickle=False``; ``None`` if the
    file is absent, unreadable, truncated or holds an object (pickled) array, so that the
    caller rebuilds the entry (the rebuilt arrays are the same)."""
    path = Path(path)
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as z:
            return {name: z[name] for name in z.files}
    except UNREADABLE:
        return None


def npy_bytes(array: np.ndarray) -> bytes:
    """``array`` (made C-contiguous) as the bytes of a ``.npy`` file, without pickling."""
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(array), allow_pickle=False)
    return buf.getvalue()


def load_npy_bytes(data: bytes) -> np.ndarray:
    """The array of ``.npy`` bytes; raises ``ValueError`` for an object (pickled) array."""
    return np.load(io.BytesIO(data), allow_pickle=False)


def sha256_file(path: str | os.PathLike) -> str:
    """Hex sha256 of a file's bytes, read in 1 MiB chunks (a file larger than memory too)."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(2**20):
            h.update(chunk)
    return h.hexdigest()


def json_digest(obj: object, length: int) -> str:
    """The first ``length`` hex digits of the sha256 of ``obj`` as sorted-key JSON."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode("utf-8")).hexdigest()[:length]
