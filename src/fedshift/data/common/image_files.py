"""What the image-file loaders share (``pacs``, ``officehome``, ``office-caltech10``,
``domainnet``, ``chmnist``, ``cub200``): which files make up each split of a client, reading
and resizing them into memory, and the cache of the decoded, resized images.

Cache: with caching on, a client's images are decoded once and stored as uint8 in
``<cache>/<dataset>/<digest>/<split>.npy`` (``<cache>`` is ``dataset.cache_dir``, else
``$FEDSHIFT_CACHE``, else ``~/.cache/fedshift``), each file written atomically, with
``kept.npz`` (the indices of the files each split holds), the entry complete when its
``digest.json`` is there; read back with ``allow_pickle=False``. The digest
covers the absolute paths, sizes and modification times of the chosen files, the size and the
reading rule, so an edited file or a new selection is read again (old entries are not
deleted).

What is read back is checked before it is used: ``digest.json`` seals the entry with the
SHA-256 of every file (:mod:`fedshift.data.common.sealed`: a multi-GB file is hashed again
only when its size, times or inode changed), and ``kept.npz`` must hold, per split, integer
indices in range, strictly increasing (as written; all of them unless unreadable files were
skipped). An entry that fails (bytes changed, a split file replaced by a link to another
array, index arrays permuted, an entry of an older fedshift) is read again from the image
files, with a warning naming the file (logger ``fedshift.data``); one that still fails after
that is a :class:`~fedshift.core.errors.DataError` naming it.

Memory: a split's images stay uint8 (:class:`~fedshift.core.images.ByteImages`), converted to
float per batch. A cache file up to :data:`~fedshift.core.images.IN_MEMORY_MAX_BYTES` is read
into memory; a larger one is read per batch from the file (every worker process shares the
operating system's one cached copy; a set larger than memory streams from disk). Without the
cache the bytes are held in memory. The numbers do not depend on where the bytes are kept.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from fedshift.core.errors import DataError
from fedshift.core.federation import SPLITS, ClientData, Federation, Split
from fedshift.core.files import ensure_dir
from fedshift.core.images import ByteImages, MemoryBudget, write_npy
from fedshift.data.common import cache, sealed
from fedshift.data.common.images import (
    read_image,
    read_image_fedbn,
    read_image_gray,
    resize_images,
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

#: bumped when what is cached (or how it is computed) changes (2: a folder of .npy files)
CACHE_VERSION = 2
#: progress bar from this many image files on
PROGRESS_FROM = 300
#: the index file of an entry (its split files are ``<split>.npy``)
KEPT = "kept.npz"

log = logging.getLogger("fedshift.data")


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
    exact: str | None = None,
    skip_key: str | None = None,
) -> np.ndarray:
    """Read and resize image files: uint8 ``(N, C, size, size)`` (C = 3, or 1 for ``gray``).

    A file Pillow cannot read raises its :class:`DataError`; with ``unreadable`` (a list),
    it is left out instead and ``(index, message)`` appended there, so the array holds the
    readable files in order. With ``exact`` (the fix to suggest), an image that is not
    already ``size x size`` is a :class:`DataError` naming it instead of being resized.
    ``skip_key``: the config key that would skip unreadable files instead (its error names
    it: ``dataset.skip_unreadable``)."""
    reader, channels = READERS[mode]
    out = np.empty((len(paths), channels, size, size), dtype=np.uint8)
    n = 0
    for j, path in enumerate(paths):
        try:
            img = torch.from_numpy(reader(path))[None]
        except DataError as exc:
            if unreadable is None and skip_key is not None:
                raise DataError(
                    f"{exc}, or leave unreadable images out with {skip_key}=true (each is "
                    "counted and named in a warning)"
                ) from None
            if unreadable is None:
                raise
            unreadable.append((j, str(exc)))
            continue
        if exact is not None and tuple(img.shape[2:]) != (size, size):
            raise DataError(
                f"{path} is {img.shape[3]}x{img.shape[2]} pixels, not {size}x{size}; {exact}"
            )
        if tuple(img.shape[2:]) != (size, size):  # resizing to its own size is the identity
            img = resize_images(img, size)
        out[n] = to_uint8(img)[0].numpy()
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


def _entry_files(client: ClientSource) -> list[str]:
    return [*(f"{split}.npy" for split in client.splits), KEPT]


def _check_kept(idx: np.ndarray | None, n: int, skip: bool) -> str | None:
    """What is wrong with one split's index array of ``kept.npz`` (``n`` files listed), or
    None: as written, it is 1-D integers in [0, n), strictly increasing, and all of them
    unless unreadable files were skipped."""
    if idx is None:
        return "is missing"
    if idx.ndim != 1 or idx.dtype.kind not in "iu":
        return f"must be a 1-D integer array, got {idx.dtype} of shape {tuple(idx.shape)}"
    if len(idx) and not 0 <= int(idx.min()) <= int(idx.max()) < n:
        return f"has indices outside [0, {n})"
    if len(idx) > 1 and not bool(np.all(np.diff(idx.astype(np.int64)) > 0)):
        return "is not strictly increasing (indices repeated or reordered)"
    if not skip and len(idx) != n:
        return f"holds {len(idx)} of the {n} files, but no file was to be skipped"
    return None


def _read_cached(
    folder: Path,
    client: ClientSource,
    size: int,
    channels: int,
    skip: bool,
    budget: MemoryBudget,
) -> tuple[tuple[dict[str, ByteImages], dict[str, np.ndarray]] | None, str | None]:
    """The cached images of ``client``'s splits and the indices of the files they hold (all,
    unless unreadable files were skipped), or ``None`` and what is wrong with the entry
    (naming the file) if it is incomplete, unsealed, altered or does not hold them (then the
    images are read again: same result)."""
    problem = sealed.check(folder, _entry_files(client))
    if problem is not None:
        return None, problem
    kept_all = cache.load_npz(folder / KEPT)
    if kept_all is None:
        return None, f"{folder / KEPT} is unreadable"
    arrays, kept = {}, {}
    for split, src in client.splits.items():
        idx = kept_all.get(split)
        wrong = _check_kept(idx, len(src), skip)
        if wrong is not None:
            return None, f"{folder / KEPT}: the index array {split!r} {wrong}"
        path = folder / f"{split}.npy"
        try:
            arrays[split] = budget.open(path)
        except (OSError, ValueError) as e:
            return None, f"{path} is unreadable ({e})"
        want = (len(idx), channels, size, size)
        if tuple(arrays[split].shape) != want:
            return None, f"{path} holds images {tuple(arrays[split].shape)}, not {want}"
        kept[split] = idx.astype(np.int64)
    return (arrays, kept), None


def _write_cache(folder: Path, arrays: dict[str, np.ndarray], kept: dict[str, np.ndarray]):
    """The entry's split files and ``kept.npz``, then ``digest.json`` (its presence marks
    the entry complete, and seals what the others hold)."""
    ensure_dir(folder)  # a cache entry that is a link is not written through
    for name in [*(f"{split}.npy" for split in arrays), KEPT, sealed.DIGESTS]:
        path = folder / name  # a link or FIFO found in place of a file (the check said so):
        if path.is_symlink() or (path.exists() and not path.is_file()):
            path.unlink()  # removed as such (never its target), then written anew
    for split, x in arrays.items():
        write_npy(folder / f"{split}.npy", x)
    cache.save_npz(folder / KEPT, kept)
    sealed.seal(folder, [*(f"{split}.npy" for split in arrays), KEPT])


def _decode_client(
    dataset: str,
    client: ClientSource,
    size: int,
    mode: str,
    progress: bool,
    skip_unreadable: bool,
    exact: str | None,
    skip_key: str | None,
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Decode every split's files (a progress bar over the client): the uint8 arrays and,
    per split, the indices of the files kept (all but the unreadable ones when skipping)."""
    from tqdm import tqdm

    arrays: dict[str, np.ndarray] = {}
    kept: dict[str, np.ndarray] = {}
    total = sum(len(s) for s in client.splits.values())
    with tqdm(
        total=total,
        desc=f"reading {dataset}/{client.name}",
        unit="img",
        disable=not progress or total < PROGRESS_FROM,
    ) as bar:
        for split, src in client.splits.items():
            bad: list[tuple[int, str]] | None = [] if skip_unreadable else None
            arrays[split] = read_images(src.paths, size, mode, bar, bad, exact, skip_key)
            dropped = {j for j, _ in bad or []}
            kept[split] = np.asarray(
                [j for j in range(len(src)) if j not in dropped], dtype=np.int64
            )
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
    exact: str | None = None,
    budget: MemoryBudget | None = None,
    skip_key: str | None = None,
) -> tuple[ClientData, dict]:
    """Read a client's image files (or its cache entry) into a :class:`ClientData`.

    ``mode`` is ``"rgb"`` (:func:`read_image`: Pillow ``convert("RGB")``, gray copied to 3
    channels), ``"gray"`` (:func:`read_image_gray`, one channel) or ``"fedbn"``
    (:func:`read_image_fedbn`). Every file is checked to exist first (``fix`` ends the error).
    A file Pillow cannot read is a :class:`DataError` naming it; with ``skip_unreadable`` it
    is left out of its split instead (after the split was drawn, so no other file moves) and
    listed in the returned info's ``unreadable``. ``exact``: see :func:`read_images`.
    ``budget``: the load's :class:`~fedshift.core.images.MemoryBudget` (pass one for every
    client of a federation; default: a budget of this client's own). ``skip_key``: the
    config key that skips unreadable files (:func:`read_images`).
    Returns the client and ``{"path", "hit"}`` of its cache entry (plus ``unreadable`` when
    skipping).
    """
    for src in client.splits.values():
        _check_exist(src, fix)
    budget = MemoryBudget() if budget is None else budget
    channels = READERS[mode][1]
    found = None
    info: dict = {"path": None, "hit": False}
    target = None
    if cache_dir is not None:
        digest, _ = _cache_key(dataset, client, size, mode, skip_unreadable)
        target = cache_dir / dataset / digest
        info["path"] = str(target)
        if (target / KEPT).exists() or (target / sealed.DIGESTS).exists():
            found, problem = _read_cached(target, client, size, channels, skip_unreadable, budget)
            info["hit"] = found is not None
            if problem is not None:
                info["rebuilt"] = problem
                log.warning("decode cache: %s; reading the images again", problem)
    if found is None:
        arrays, kept = _decode_client(
            dataset, client, size, mode, progress, skip_unreadable, exact, skip_key
        )
        if target is not None:
            _write_cache(target, arrays, kept)
            found, problem = _read_cached(target, client, size, channels, skip_unreadable, budget)
            if found is None:
                raise DataError(
                    f"{target}: the cache entry just written cannot be read back ({problem}); "
                    "delete that folder, or set dataset.cache_dir to another folder"
                )
            arrays, kept = found
        else:
            arrays = {s: ByteImages(a) for s, a in arrays.items()}
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
            arrays[s],
            torch.from_numpy(client.splits[s].labels[kept[s]].astype(np.int64)),
        )
        for s in SPLITS
    }
    return ClientData(client.name, splits["train"], splits["val"], splits["test"]), info


def capped_federation_info(
    fed: Federation,
    available: dict,
    caps: tuple[int | None, int, int],
    reader: str,
    cache_info: dict | None,
    **extra: object,
) -> dict:
    """The ``fed.info`` entries a capped image-file federation (``pacs``, ``officehome``,
    ``office-caltech10``, ``domainnet``) shares, in order: the files ``available`` per client
    and split, ``caps`` (``max_per_split``, ``seed``, ``size``) and the subsample rule, the
    ``reader``, then ``extra``, the ``cache`` entries (None without a cache) and
    :func:`federation_info`."""
    max_per_split, seed, size = caps
    return {
        "available": available,
        "max_per_split": max_per_split,
        "subsample": "seeded class-stratified subsample of each split to max_per_split",
        "seed": seed,
        "size": size,
        "reader": reader,
        **extra,
        "cache": cache_info,
        **federation_info(fed, size),
    }


def federation_info(fed: Federation, size: int) -> dict:
    """Counts, per-class counts and the memory the federation's images take (uint8)."""
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
        "memory_mb": round(n * channels * size * size / 2**20, 1),  # uint8
    }
