"""Images kept as they are stored: uint8, converted to float per batch.

A :class:`ByteImages` is what a :class:`~fedshift.core.federation.Split` holds as ``x`` for
data read from image files (``folders``, ``pacs``, ``officehome``, ``camelyon17``, ...): the
8-bit images ``(N, C, H, W)`` of the decode cache, indexed like a float tensor. Indexing
returns float32 in ``[0, 1]`` (``uint8 / 255``: the same values, bit for bit, as converting
the whole array first), so training, evaluation and every statistic read through it give the
same numbers whichever way the bytes are kept:

``memory``  a uint8 array in this process (4x smaller than float32; at most 256 MiB of a
            federation's cache files per process: :class:`MemoryBudget`);
``file``    a ``.npy`` file of the decode cache, read per batch with ``pread`` through the
            operating system's page cache: nothing of it is resident in the process, every
            worker process reading the same file shares the one cached copy, and a set larger
            than memory streams from disk;
``device``  a uint8 tensor on a GPU (``run.data``), converted there per batch.

:class:`MemoryBudget` makes the automatic choice between ``memory`` and ``file`` (cache files
are read whole while a federation's budget lasts; the rest are streamed);
``ByteImages.to("cuda")`` makes the ``device`` one. A :class:`ByteImages` pickles as its file
path (``file``) or its bytes (``memory``).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import numpy as np
import torch

from fedshift.core.files import atomic_output

__all__ = [
    "IN_MEMORY_MAX_BYTES",
    "ByteImages",
    "MemoryBudget",
    "cat_images",
    "open_npy",
    "write_npy",
]

#: the bytes of cache files one federation load reads whole into memory (in each process that
#: loads it); the files that do not fit are read per batch
IN_MEMORY_MAX_BYTES = 256 * 2**20


def _header(path: Path) -> tuple[tuple[int, ...], int]:
    """The shape and the data offset of a uint8 C-order ``.npy`` file."""
    with open(path, "rb") as f:
        major, minor = np.lib.format.read_magic(f)
        if (major, minor) == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
        else:
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
        offset = f.tell()
    if dtype != np.uint8 or fortran or len(shape) != 4:
        raise ValueError(f"{path}: not a C-order uint8 (N, C, H, W) array ({dtype}, {shape})")
    return tuple(int(s) for s in shape), offset


def write_npy(path: str | os.PathLike, x: np.ndarray) -> None:
    """Write ``x`` (uint8, ``(N, C, H, W)``) as ``.npy`` atomically: a reader sees the whole
    file or none."""
    with atomic_output(path) as tmp, open(tmp, "r+b") as f:  # a fresh name: no planted link
        np.save(f, np.ascontiguousarray(x, dtype=np.uint8), allow_pickle=False)


class ByteImages:
    """uint8 images ``(N, C, H, W)`` read as float32 in ``[0, 1]`` (module docstring).

    Quacks as much like the float tensor it stands for as the code that reads images needs:
    ``shape``, ``ndim``, ``dim()``, ``dtype`` (float32, what indexing returns), ``device``,
    ``len()``, indexing by an int, a slice or an integer index tensor / array of any shape,
    ``index_select(0, idx)`` (a view: no bytes copied), ``to(device)`` and ``float()`` (the
    whole array converted)."""

    def __init__(
        self,
        data: np.ndarray | torch.Tensor | None = None,
        *,
        path: str | os.PathLike | None = None,
        index: np.ndarray | None = None,
    ) -> None:
        if (data is None) == (path is None):
            raise ValueError("ByteImages: give the uint8 array or the .npy path, not both")
        self._data = data
        self._path = None if path is None else Path(path)
        self._fd: int | None = None
        if self._path is not None:
            shape, self._offset = _header(self._path)
        else:
            assert data is not None  # exactly one of data and path (checked above)
            if data.dtype not in (np.dtype(np.uint8), torch.uint8) or data.ndim != 4:
                raise ValueError(f"ByteImages: expected uint8 (N, C, H, W), got {data.dtype}")
            shape = tuple(int(s) for s in data.shape)
        self._full = shape
        self._index = None if index is None else np.asarray(index, dtype=np.int64)
        n = shape[0] if self._index is None else len(self._index)
        self.shape = torch.Size((n, *shape[1:]))
        self._row = int(np.prod(shape[1:]))

    # ------------------------------------------------------------------ what it is
    @property
    def storage(self) -> str:
        """``memory``, ``file`` or ``device`` (module docstring)."""
        if self._path is not None:
            return "file"
        return "device" if isinstance(self._data, torch.Tensor) and self._data.is_cuda else "memory"

    ndim = 4
    dtype = torch.float32

    @property
    def device(self) -> torch.device:
        if isinstance(self._data, torch.Tensor):
            return self._data.device
        return torch.device("cpu")

    def dim(self) -> int:
        return 4

    def __len__(self) -> int:
        return int(self.shape[0])

    def element_size(self) -> int:
        """Bytes per stored value (1): what the images take where they are kept."""
        return 1

    def nelement(self) -> int:
        return int(np.prod(tuple(self.shape)))

    numel = nelement  # answered from the shape: no conversion of the images

    def size(self, dim: int | None = None) -> torch.Size | int:
        return self.shape if dim is None else self.shape[dim]

    def __repr__(self) -> str:
        where = self._path if self._path is not None else self.storage
        return f"ByteImages({tuple(self.shape)}, uint8, {where})"

    # ------------------------------------------------------------------ reading
    def _rows(self, rows: np.ndarray) -> torch.Tensor:
        """uint8 rows (indices into this view) as a ``(k, C, H, W)`` tensor."""
        if self._index is not None:
            rows = self._index[rows]
        if isinstance(self._data, torch.Tensor):
            return self._data[torch.from_numpy(rows).to(self._data.device)]
        if self._data is not None:
            return torch.from_numpy(self._data[rows])
        return torch.from_numpy(self._read(rows))

    def _read(self, rows: np.ndarray) -> np.ndarray:
        out = np.empty((len(rows), *self._full[1:]), dtype=np.uint8)
        if len(rows) == 0:
            return out
        if self._fd is None:
            assert self._path is not None  # no array in memory: read from the file
            self._fd = os.open(self._path, os.O_RDONLY)
        flat = out.reshape(len(rows), self._row)
        if len(rows) > 1 and np.all(np.diff(rows) == 1):  # a contiguous run: one read
            self._pread(flat.data.cast("B"), int(rows[0]))
            return out
        for i, r in enumerate(rows.tolist()):
            self._pread(memoryview(flat[i]), r)
        return out

    def _pread(self, buf: memoryview, row: int) -> None:
        if not 0 <= row < self._full[0]:
            raise IndexError(f"image {row} out of range for {self._full[0]} images")
        done, want, at = 0, len(buf), self._offset + row * self._row
        assert self._fd is not None  # opened by _read
        while done < want:
            got = os.preadv(self._fd, [buf[done:]], at + done)
            if got <= 0:
                raise OSError(f"{self._path}: file ended at byte {at + done}; delete the cache")
            done += got

    def __getitem__(self, key) -> torch.Tensor:
        if isinstance(key, tuple):  # x[rows, channel, ...]: the rows, then the rest
            rows = self[key[0]]
            rest = key[1:]
            if isinstance(key[0], (int, np.integer)):
                return rows[rest]
            return rows[(slice(None), *rest)]
        n = len(self)
        if isinstance(key, (int, np.integer)):
            i = int(key) + (n if key < 0 else 0)
            if not 0 <= i < n:
                raise IndexError(f"index {key} out of range for {n} images")
            return self._float(self._rows(np.array([i])))[0]
        if isinstance(key, slice):
            return self._float(self._rows(np.arange(n)[key]))
        if isinstance(key, torch.Tensor):
            key = key.detach().cpu().numpy()
        idx = np.asarray(key)
        if idx.dtype == bool:
            raise TypeError("ByteImages: boolean masks are not supported; index with integers")
        idx = idx.astype(np.int64)
        flat = np.where(idx < 0, idx + n, idx).reshape(-1)
        if flat.size and (flat.min() < 0 or flat.max() >= n):
            raise IndexError(f"index out of range for {n} images")
        out = self._float(self._rows(flat))
        return out.reshape(*idx.shape, *self.shape[1:])

    @staticmethod
    def _float(u8: torch.Tensor) -> torch.Tensor:
        # the same operation as fedshift.data.common.images.to_float: identical values
        return u8.to(torch.float32).div_(255.0)

    def u8(self) -> np.ndarray:
        """This view's bytes as one uint8 array in memory."""
        return self._rows(np.arange(len(self))).cpu().numpy()

    def float(self) -> torch.Tensor:
        """Every image as one float32 tensor (4 bytes per value: for small sets only)."""
        return self[:]

    def index_select(self, dim: int, idx: torch.Tensor) -> ByteImages:
        """A view of the rows ``idx`` (``dim`` must be 0); no bytes are copied."""
        if dim != 0:
            raise ValueError("ByteImages.index_select: only dim 0")
        rows = np.asarray(idx.detach().cpu().numpy() if isinstance(idx, torch.Tensor) else idx)
        rows = rows.astype(np.int64).reshape(-1)
        if rows.size and (rows.min() < 0 or rows.max() >= len(self)):
            raise IndexError(f"index out of range for {len(self)} images")
        full = rows if self._index is None else self._index[rows]
        return self._view(full)

    def _view(self, index: np.ndarray | None) -> ByteImages:
        new = object.__new__(ByteImages)
        new.__dict__.update(self.__dict__)
        new._fd = None
        new._index = index
        n = self._full[0] if index is None else len(index)
        new.shape = torch.Size((n, *self._full[1:]))
        return new

    def contiguous(self) -> ByteImages:
        return self

    def to(self, device: torch.device | str, non_blocking: bool = False) -> ByteImages:
        """On ``device``: the CPU keeps it as it is; a GPU gets its uint8 bytes (a quarter of
        the float32 images), converted there per batch."""
        device = torch.device(device)
        if device == self.device:
            return self
        rows = np.arange(len(self))
        u8 = self._rows(rows) if self._index is not None or self._path else None
        if u8 is None:
            u8 = torch.as_tensor(self._data)
        return ByteImages(u8.to(device, non_blocking=non_blocking).contiguous())

    def __getattr__(self, name: str):
        """Other tensor methods (``x.min()``, ``x.mean(0)``, ...) act on the whole float
        tensor (as :meth:`__torch_function__`)."""
        if name.startswith("_") or not hasattr(torch.Tensor, name):
            raise AttributeError(f"'ByteImages' object has no attribute {name!r}")
        return getattr(self.float(), name)

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        """Any other torch function (``torch.equal(x, ...)``, ``torch.cat([x, ...])``, ...)
        sees the whole float tensor: correct, but it converts every image; the training and
        evaluation paths index batches instead."""
        return func(*_as_float(args), **_as_float(kwargs or {}))

    # ------------------------------------------------------------------ pickling
    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_fd"] = None
        if isinstance(self._data, torch.Tensor):  # a GPU copy travels as host bytes
            state["_data"] = self._data.cpu().numpy()
        return state

    def __del__(self) -> None:
        fd = getattr(self, "_fd", None)
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)


def _as_float(obj):
    if isinstance(obj, ByteImages):
        return obj.float()
    if isinstance(obj, (list, tuple)):
        return type(obj)(_as_float(o) for o in obj)
    if isinstance(obj, dict):
        return {k: _as_float(v) for k, v in obj.items()}
    return obj


def in_memory_max_bytes() -> int:
    """``$FEDSHIFT_IN_MEMORY_MAX_BYTES`` when set (0: always read per batch), else
    :data:`IN_MEMORY_MAX_BYTES`."""
    env = os.environ.get("FEDSHIFT_IN_MEMORY_MAX_BYTES")
    return IN_MEMORY_MAX_BYTES if env in (None, "") else int(env)


class MemoryBudget:
    """What one federation load may read into memory: cache files are opened in order, each
    read whole while it fits in what is left (:func:`in_memory_max_bytes` in all), else read
    per batch. One budget per load, so a federation of many sites (and every worker process
    that loads it) holds at most that much, whatever the number of sites."""

    def __init__(self, total: int | None = None) -> None:
        self.remaining = in_memory_max_bytes() if total is None else total

    def open(self, path: str | os.PathLike) -> ByteImages:
        x = open_npy(path, in_memory_max=self.remaining)
        if x.storage == "memory":
            self.remaining -= Path(path).stat().st_size
        return x


def open_npy(path: str | os.PathLike, in_memory_max: int | None = None) -> ByteImages:
    """The images of a cache file: read whole when it is at most ``in_memory_max`` bytes
    (``memory``; default :func:`in_memory_max_bytes`), else read per batch (``file``). Both
    give the same numbers."""
    path = Path(path)
    if in_memory_max is None:
        in_memory_max = in_memory_max_bytes()
    if path.stat().st_size <= in_memory_max:
        return ByteImages(np.load(path, allow_pickle=False))
    return ByteImages(path=path)


def cat_images(parts: list) -> torch.Tensor | ByteImages:
    """Images concatenated along the first axis: float tensors as ``torch.cat``; when any
    part is :class:`ByteImages`, their uint8 bytes in memory (a quarter of float32)."""
    if not any(isinstance(p, ByteImages) for p in parts):
        return torch.cat(parts)
    u8 = [p.u8() if isinstance(p, ByteImages) else _to_u8(p) for p in parts]
    return ByteImages(np.concatenate(u8))


def _to_u8(x: torch.Tensor) -> np.ndarray:
    u8 = x.mul(255.0).round_().clamp_(0, 255).to(torch.uint8)
    if not torch.equal(u8.float().div_(255.0), x):
        raise ValueError("cat_images: float images that are not 8-bit values cannot join uint8")
    return u8.cpu().numpy()
