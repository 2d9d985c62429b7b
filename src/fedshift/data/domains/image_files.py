"""What the image-file loaders share (``pacs``, ``officehome``, ``office-caltech10``,
``domainnet``, ``chmnist``, ``cub200``): which files make up each split of a client, reading
and resizing them into memory, and the cache of the decoded, resized images.

Cache: with caching on, a client's images are stored as uint8 in
``<cache>/<dataset>/<digest>.npz`` (one array per split; ``<cache>`` is ``dataset.cache_dir``,
else ``$FEDSHIFT_CACHE``, else ``~/.cache/fedshift``), written atomically and read back with
``allow_pickle=False`` (:mod:`fedshift.data.common.cache`). The digest covers the absolute
paths, sizes and modification times of the chosen files, the size and the reading rule, so an
edited file or a new selection is read again (old entries are not deleted).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from fedshift.core.errors import DataError
from fedshift.data.base import SPLITS, ClientData, Federation, Split
from fedshift.data.common import cache
from fedshift.data.common.images import (
    read_image,
    read_image_fedbn,
    read_image_gray,
    resize_images,
    to_float,
    to_uint8,
)
from fedshift.data.common.sampling import stratified_subsample
from fedshift.data.common.seeding import seeded_rng

__all__ = [
    "ClientSource",
    "SplitSource",
    "cache_root",
    "cap_split",
    "federation_info",
    "materialize_client",
    "read_images",
]

#: bumped when what is cached (or how it is computed) changes
CACHE_VERSION = 1
#: progress bar from this many image files on
PROGRESS_FROM = 300


def cache_root(enabled: bool, cache_dir: str | None) -> Path | None:
    """Where cached images go (``None``: caching off)."""
    return cache.cache_dir(cache_dir) if enabled else None


# --------------------------------------------------------------------------------------------
# sources: which files make up each split of a client
# --------------------------------------------------------------------------------------------


@dataclass
class SplitSource:
    """The image files of one split, their labels and where each is listed (for errors)."""

    paths: list[Path]
    labels: np.ndarray  # int64
    origins: list[str] | None = None  # e.g. "<pkl>, entry 12"; None: the file itself

    def take(self, idx: np.ndarray) -> SplitSource:
        origins = None if self.origins is None else [self.origins[int(i)] for i in idx]
        return SplitSource([self.paths[int(i)] for i in idx], self.labels[idx].copy(), origins)

    def __len__(self) -> int:
        return len(self.paths)


@dataclass
class ClientSource:
    name: str
    splits: dict[str, SplitSource] = field(default_factory=dict)


def cap_split(src: SplitSource, cap: int | None, seed: int, tag: str) -> SplitSource:
    """A seeded class-stratified subsample of at most ``cap`` entries (``None``: all)."""
    if cap is None or cap >= len(src):
        return src
    return src.take(stratified_subsample(src.labels, cap, seeded_rng(seed, tag)))


# --------------------------------------------------------------------------------------------
# reading
# --------------------------------------------------------------------------------------------


#: reading mode -> (reader, channels it returns)
READERS = {
    "rgb": (read_image, 3),
    "fedbn": (read_image_fedbn, 3),
    "gray": (read_image_gray, 1),
}


def _check_exist(src: SplitSource, fix: str) -> None:
    for i, path in enumerate(src.paths):
        if not path.is_file():
            where = f" (listed in {src.origins[i]})" if src.origins is not None else ""
            raise DataError(f"{path} is missing{where}; {fix}")


def read_images(
    paths: Sequence[Path],
    size: int,
    mode: str,
    bar=None,
    unreadable: list[tuple[int, str]] | None = None,
) -> np.ndarray:
    """Read and resize image files: uint8 ``(N, C, size, size)`` (C = 3, or 1 for ``gray``).

    A file Pillow cannot read raises its :class:`DataError`; with ``unreadable`` (a list),
    it is left out instead and ``(index, message)`` appended there, so the array holds the
    readable files in order."""
    reader, channels = READERS[mode]
    out = np.empty((len(paths), channels, size, size), dtype=np.uint8)
    n = 0
    for j, path in enumerate(paths):
        try:
            img = torch.from_numpy(reader(path))[None]
        except DataError as exc:
            if unreadable is None:
                raise
            unreadable.append((j, str(exc)))
            continue
        out[n] = to_uint8(resize_images(img, size))[0].numpy()
        n += 1
        if bar is not None:
            bar.update(1)
    return out if n == len(paths) else out[:n]


def _cache_key(
    dataset: str, client: ClientSource, size: int, mode: str, skip: bool = False
) -> tuple[str, dict]:
    files = {}
    for split, src in client.splits.items():
        rows = []
        for path in src.paths:
            st = path.stat()
            rows.append([str(path.resolve()), st.st_size, st.st_mtime_ns])
        files[split] = rows
    meta = {
        "version": CACHE_VERSION,
        "dataset": dataset,
        "client": client.name,
        "size": size,
        "reader": mode,
        "files": files,
    }
    if skip:  # only then: the keys of entries written without skipping stay as they were
        meta["skip_unreadable"] = True
    return cache.json_digest(meta, 24), meta


def _read_cached(
    path: Path, client: ClientSource, size: int, channels: int, skip: bool
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]] | None:
    """The cached arrays of ``client``'s splits and the indices of the files they hold (all,
    unless unreadable files were skipped), or ``None`` if the entry is unreadable or does not
    hold them (then the images are read again: same result)."""
    stored = cache.load_npz(path)
    if stored is None or not set(client.splits) <= set(stored):
        return None
    arrays = {s: stored[s] for s in client.splits}
    kept = {}
    for split, src in client.splits.items():
        kept[split] = stored.get(f"kept_{split}") if skip else np.arange(len(src))
        idx = kept[split]
        if idx is None or idx.ndim != 1:
            return None
        if len(idx) and not 0 <= idx.min() <= idx.max() < len(src):
            return None
        if arrays[split].shape != (len(idx), channels, size, size):
            return None
        if arrays[split].dtype != np.uint8:
            return None
    return arrays, kept


def materialize_client(
    dataset: str,
    client: ClientSource,
    size: int,
    mode: str,
    cache_dir: Path | None,
    fix: str,
    progress: bool = True,
    skip_unreadable: bool = False,
) -> tuple[ClientData, dict]:
    """Read a client's image files (or its cache entry) into a :class:`ClientData`.

    ``mode`` is ``"rgb"`` (:func:`read_image`: Pillow ``convert("RGB")``, gray copied to 3
    channels), ``"gray"`` (:func:`read_image_gray`, one channel) or ``"fedbn"``
    (:func:`read_image_fedbn`). Every file is checked to exist first (``fix`` ends the error).
    A file Pillow cannot read is a :class:`DataError` naming it; with ``skip_unreadable`` it
    is left out of its split instead (after the split was drawn, so no other file moves) and
    listed in the returned info's ``unreadable``. Returns the client and ``{"path", "hit"}``
    of its cache entry (plus ``unreadable`` when skipping).
    """
    from tqdm import tqdm

    for src in client.splits.values():
        _check_exist(src, fix)
    channels = READERS[mode][1]
    found = None
    info: dict = {"path": None, "hit": False}
    target = None
    if cache_dir is not None:
        digest, _ = _cache_key(dataset, client, size, mode, skip_unreadable)
        target = cache_dir / dataset / f"{digest}.npz"
        info["path"] = str(target)
        if target.is_file():
            found = _read_cached(target, client, size, channels, skip_unreadable)
            info["hit"] = found is not None
    if found is None:
        total = sum(len(s) for s in client.splits.values())
        arrays, kept = {}, {}
        with tqdm(
            total=total,
            desc=f"reading {dataset}/{client.name}",
            unit="img",
            disable=not progress or total < PROGRESS_FROM,
        ) as bar:
            for split, src in client.splits.items():
                bad: list[tuple[int, str]] | None = [] if skip_unreadable else None
                arrays[split] = read_images(src.paths, size, mode, bar, bad)
                dropped = {j for j, _ in bad or []}
                kept[split] = np.asarray(
                    [j for j in range(len(src)) if j not in dropped], dtype=np.int64
                )
        if target is not None:
            extra = {f"kept_{s}": k for s, k in kept.items()} if skip_unreadable else {}
            cache.save_npz(target, {**arrays, **extra})
    else:
        arrays, kept = found
    if skip_unreadable:
        info["unreadable"] = [
            str(src.paths[j])
            for split, src in client.splits.items()
            for j in sorted(set(range(len(src))) - set(kept[split].tolist()))
        ]
    splits = {
        s: Split(
            to_float(arrays[s]),
            torch.from_numpy(client.splits[s].labels[kept[s]].astype(np.int64)),
        )
        for s in SPLITS
    }
    return ClientData(client.name, splits["train"], splits["val"], splits["test"]), info


def federation_info(fed: Federation, size: int) -> dict:
    """Counts, per-class counts and the float32 memory the federation's images take."""
    n = sum(sum(c.values()) for c in fed.counts().values())
    channels = fed.input_shape[0]
    return {
        "counts": fed.counts(),
        "label_counts": {
            c.name: {
                s: torch.bincount(c.split(s).y, minlength=fed.num_classes).tolist() for s in SPLITS
            }
            for c in fed.clients
        },
        "memory_mb": round(n * channels * size * size * 4 / 2**20, 1),
    }
