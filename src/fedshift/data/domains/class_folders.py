"""What every folder-per-site-per-class loader shares (``pacs``, ``officehome``, ``folders``):
listing a site's class folders, checking that the sites agree on the classes, the seeded
per-class split, and turning each site's splits into a client.

A site folder holds one sub-folder per class; the images of a class are every file with an
image suffix (:data:`~fedshift.data.common.images.IMAGE_SUFFIXES`) below its folder, at any
depth, listed by :func:`~fedshift.data.common.walk.list_files` (sorted; hidden entries
ignored; other files skipped and counted; symbolic links followed, each folder entered once,
so a symlink loop is an error naming the link). One ``visited`` set covers a whole site, so
two class folders that are links to one folder are an error too.

The split (:func:`split_by_class`): per class, a seeded permutation cut at ``int(f0 n)`` and
``int((f0 + f1) n)`` (:func:`~fedshift.data.common.sampling.cut_points`); the generator is
``seeded_rng(seed, "<dataset>/<client>/split")``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fedshift.core.errors import DataError
from fedshift.core.federation import SPLITS, ClientData
from fedshift.core.images import MemoryBudget
from fedshift.core.memory import check_fits
from fedshift.data.common.checks import differences
from fedshift.data.common.image_files import (
    READERS,
    ClientSource,
    SplitSource,
    cap_split,
    materialize_client,
)
from fedshift.data.common.images import IMAGE_SUFFIXES
from fedshift.data.common.sampling import stratified_cut
from fedshift.data.common.seeding import seeded_rng
from fedshift.data.common.walk import list_files

__all__ = [
    "SiteListing",
    "check_same_classes",
    "list_domain",
    "list_site",
    "original_sizes",
    "check_decode_fits",
    "read_client",
    "split_by_class",
]


@dataclass
class SiteListing:
    """A site folder's classes: ``files`` (class -> sorted image files) for the classes with
    images, ``empty`` the class folders without any, ``skipped`` the other files found in
    them, ``stray`` the image files directly in the site folder, beside its class folders
    (in no class: not used, but counted and reported, never silently ignored)."""

    folder: Path
    files: dict[str, list[Path]]
    empty: list[str] = field(default_factory=list)
    skipped: list[Path] = field(default_factory=list)
    stray: list[Path] = field(default_factory=list)

    @property
    def count(self) -> int:
        return sum(len(v) for v in self.files.values())


def list_site(
    folder: Path, allow_empty: bool = False, hint: str = "", not_a_site: str = ""
) -> SiteListing:
    """The class folders of ``folder`` and their image files (module docstring). A class
    folder without an image is a :class:`DataError` (``hint`` ends it), or with
    ``allow_empty`` listed in ``empty``; a folder without class folders is one too
    (``not_a_site`` ends it: how to leave out a folder that is not a site)."""
    classes = sorted(p.name for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not classes:
        raise DataError(
            f"{folder} has no class sub-folders; expected {folder}/<class>/<image files>"
            f"{not_a_site}"
        )
    visited = {folder.resolve(): folder}
    out = SiteListing(folder, {})
    out.stray = sorted(
        p for p in folder.iterdir()
        if not p.name.startswith(".") and p.suffix.lower() in IMAGE_SUFFIXES and p.is_file()
    )  # fmt: skip
    for name in classes:
        cdir = folder / name
        listing = list_files(cdir, IMAGE_SUFFIXES, visited)
        out.skipped += listing.skipped
        if listing.files:
            out.files[name] = listing.files
        elif allow_empty:
            out.empty.append(name)
        else:
            raise DataError(
                f"{cdir} holds no image file ({', '.join(IMAGE_SUFFIXES)}); every class "
                f"folder needs at least one image{hint}"
            )
    return out


def list_domain(folder: Path) -> tuple[dict[str, list[Path]], int]:
    """``{class: sorted image files}`` of a domain folder and the number of skipped files
    (images beside the class folders included)."""
    listing = list_site(folder)
    return listing.files, len(listing.skipped) + len(listing.stray)


def original_sizes(folder: Path) -> dict:
    """The sizes of the images in site ``folder``'s class folders as they are on disk, before
    any resizing: ``{"images", "min", "median", "max"}`` (``"WxH"``, ordered by pixel count),
    ``"sizes"`` (how many distinct ones) and ``"unreadable"``; read from each file's header
    (Pillow opens it lazily: no pixel is decoded)."""
    from PIL import Image

    listing = list_site(folder, allow_empty=True)
    sizes, bad = [], 0
    for files in listing.files.values():
        for f in files:
            try:
                with Image.open(f) as im:
                    sizes.append(tuple(int(v) for v in im.size))
            except (OSError, ValueError, Image.DecompressionBombError):
                bad += 1
    sizes.sort(key=lambda wh: (wh[0] * wh[1], wh))
    out: dict = {"images": len(sizes), "sizes": len(set(sizes)), "unreadable": bad}
    for key, i in (("min", 0), ("median", (len(sizes) - 1) // 2), ("max", len(sizes) - 1)):
        out[key] = f"{sizes[i][0]}x{sizes[i][1]}" if sizes else None
    return out


def check_same_classes(
    dataset: str,
    listed: dict[str, dict[str, list[Path]]],
    folders: dict[str, Path],
    unit: str = "domain",
    hint: str = "",
) -> list[str]:
    """Every site has the first site's classes (with images); returns the sorted class list.
    Otherwise a :class:`DataError` names the site, its folder and the classes it lacks or
    has in addition (``hint`` ends it)."""
    first = next(iter(listed))
    ref = set(listed[first])
    for d, classes in listed.items():
        have = set(classes)
        if have != ref:
            diff = differences(ref, have, lambda m: f"lacks {m}", lambda e: f"has extra {e}")
            raise DataError(
                f"{dataset}: {unit} {d!r} ({folders[d]}) {diff} compared with "
                f"{unit} {first!r} ({folders[first]}); every {unit} needs the same class "
                f"folders{hint}"
            )
    return sorted(ref)


def split_by_class(
    files: dict[str, list[Path]],
    classes: list[str],
    fractions: tuple[float, float, float],
    rng: np.random.Generator,
) -> dict[str, SplitSource]:
    """Per class, a seeded permutation cut at ``int(f0 n)`` and ``int((f0 + f1) n)``
    (:func:`~fedshift.data.common.sampling.stratified_cut`); a class absent from ``files``
    contributes nothing (and draws nothing)."""
    paths = [p for name in classes for p in files.get(name, [])]
    labels = np.asarray(
        [c for c, name in enumerate(classes) for _ in files.get(name, [])], dtype=np.int64
    )
    parts = stratified_cut(labels, fractions, rng)
    return {s: SplitSource([paths[int(i)] for i in idx], labels[idx]) for s, idx in parts.items()}


def fraction_rng(dataset: str, client: str, seed: int) -> np.random.Generator:
    """The generator of a client's per-class split."""
    return seeded_rng(seed, f"{dataset}/{client}/split")


@dataclass
class ReadOptions:
    """How :func:`read_client` caps and reads a client's splits."""

    size: int
    mode: str = "rgb"  # image_files.READERS
    cap: int | None = None  # max_per_split
    seed: int = 0
    cache_dir: Path | None = None
    fix: str = "restore the file or fix dataset.root"
    progress: bool = True
    skip_unreadable: bool = False
    #: the config key that skips unreadable images (an unreadable image's error names it)
    skip_key: str | None = None
    #: one per federation load: what its cache files may hold in memory (core/images.py)
    budget: MemoryBudget = field(default_factory=MemoryBudget)


def check_decode_fits(
    dataset: str, clients: dict[str, dict[str, SplitSource]], options: ReadOptions
) -> None:
    """Refuse, before any image is decoded, images that would not fit in memory once decoded
    at ``dataset.size``: every split's file count (capped at ``max_per_split``) x channels x
    size x size bytes, all of it without the cache, the largest client with it (a client is
    decoded whole, then written to its cache files and read back from them). The estimate
    and the fix name ``dataset.size``; nothing is read first (``dataset.size=20000`` on a
    dozen images asked for 15.6 GB)."""
    channels, size = READERS[options.mode][1], options.size
    cap = options.cap
    counts = {
        c: sum(len(s) if cap is None else min(len(s), cap) for s in splits.values())
        for c, splits in clients.items()
    }
    per_image = channels * size * size
    largest = max(counts, key=lambda c: counts[c]) if counts else None
    if largest is None:
        return
    if options.cache_dir is None:
        n = sum(counts.values())
        held = f"all {n} images"
    else:
        n = counts[largest]
        held = f"the {n} images of client {largest!r}"
    check_fits(
        n * per_image,
        f"dataset {dataset!r}: {held} decoded at dataset.size={size} ({channels}x{size}x{size} "
        "bytes each)",
        "lower dataset.size (or dataset.max_per_split), or use a machine with more memory",
    )


def read_client(
    dataset: str,
    client: str,
    splits: dict[str, SplitSource],
    options: ReadOptions,
    empty: Callable[[str], str],
) -> tuple[ClientData, dict]:
    """A client from its splits' files: an empty split is a :class:`DataError` with the
    message ``empty(split)``; each split is capped to ``options.cap`` (a seeded,
    class-stratified subsample, tag ``<dataset>/<client>/<split>/cap``), then read (or taken
    from the cache). Returns the client and its cache info."""
    capped = {}
    for split, src in splits.items():
        if len(src) == 0:
            raise DataError(empty(split))
        tag = f"{dataset}/{client}/{split}/cap"
        capped[split] = cap_split(src, options.cap, options.seed, tag)
    data, info = materialize_client(
        dataset,
        ClientSource(client, capped),
        options.size,
        options.mode,
        options.cache_dir,
        options.fix,
        options.progress,
        options.skip_unreadable,
        budget=options.budget,
        skip_key=options.skip_key,
    )
    for split in SPLITS:
        if len(data.split(split)) == 0:
            raise DataError(
                f"{empty(split)} (every file of the {split} split was unreadable and skipped: "
                f"{', '.join(info.get('unreadable', []))})"
            )
    return data, info
