"""``folders``: your own images, a folder per site and per class (one client per site).

Layout (nothing is downloaded; ``dataset.root`` is the folder you keep)::

    <dataset.root>/
      <site>/                      one client per site folder (sorted, or dataset.sites)
        <class>/                   the same class folders in every site
          <image>.png|jpg|jpeg|bmp|tif|tiff    (sub-folders are listed too)
        train.txt val.txt test.txt   optional split lists, paths relative to <site>/

It is the machinery of ``pacs`` / ``officehome`` (:mod:`fedshift.data.domains.class_folders`)
for any number of sites and classes:

* **Clients** are the site folders, named as :mod:`fedshift.data.common.sites` says
  (``Site A`` -> ``site_a``); ``dataset.sites`` picks and orders them by folder name.
* **Classes** are the sorted class-folder names (or ``classes``, the folder names in label
  order: set it when nodes load one site each, so that every node has the same classes);
  every site must have the same set, with at least one image in each. A site lacking a
  class (or whose class folder holds no image) is a :class:`~fedshift.core.errors.DataError`
  naming the site and the class, unless ``allow_missing_classes=true``: then the classes
  are the union over the sites (or ``classes``) and a site simply has no image of the
  classes it lacks (label skew on top of the feature skew).
* **Files**: images are listed recursively (:mod:`fedshift.data.common.walk`): hidden
  entries ignored; other files (``Thumbs.db``, ``notes.txt``) skipped, counted in
  ``info["skipped_files"]`` and named in a warning, as are images lying beside the class
  folders (``<site>/img.png``: in no class); symbolic links followed, each folder
  entered once (a symlink loop is an error naming the link). A file Pillow cannot read (a
  0-byte or damaged image) is an error naming it, as in every fedshift image loader; with
  ``skip_unreadable=true`` it is dropped from its split instead (after the split is drawn,
  so no other image moves), counted and named in a warning.
* **Splits**, per site: the lists ``<site>/train.txt``, ``val.txt``, ``test.txt``
  (:mod:`fedshift.data.common.split_lists`) where the site has them (``splits=auto``, the
  default; ``lists``: every site must have them; ``fractions``: ignore them), else per
  class a seeded permutation cut at ``int(f0 n)`` and ``int((f0 + f1) n)`` with
  ``fractions`` = [0.64, 0.16, 0.2] (as ``pacs``). Then ``max_per_split`` caps each split to
  a seeded class-stratified subsample. An empty split is an error.
* **Images**: ``channels=3`` (default): Pillow ``convert("RGB")``, gray (8- or 16-bit)
  copied to three channels, alpha dropped; ``channels=1``: gray kept, colour images
  converted to luma (0.299 R + 0.587 G + 0.114 B). So a mix of gray and colour images is
  always read into one channel count. Every image is resized to ``size x size`` (unset: the
  model's input size, 28 for ``cnn``, else 224; aspect ratio not kept) by antialiased
  bilinear interpolation and rounded to 8 bits (the cache holds uint8), then float32 in
  [0, 1] ``(N, C, size, size)``.
* **Cache** (``cache=true``): decoded, resized images per client in
  ``<cache>/folders/<digest>.npz``, the digest over the files' paths, sizes and
  modification times (:mod:`fedshift.data.common.image_files`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np

from fedshift.core.datasets import Dataset
from fedshift.core.errors import ConfigError, DataError
from fedshift.core.federation import SPLITS, Federation
from fedshift.data.common.checks import (
    check_cache_dir,
    check_flag,
    check_fractions,
    check_root_key,
    check_size,
    require_root,
)
from fedshift.data.common.image_files import SplitSource, cache_root, federation_info
from fedshift.data.common.sites import check_sites_key, site_folders
from fedshift.data.common.split_lists import check_split_keys, find_split_lists, read_split_lists
from fedshift.data.common.walk import warn_skipped
from fedshift.data.domains.class_folders import (
    ReadOptions,
    SiteListing,
    check_decode_fits,
    check_same_classes,
    fraction_rng,
    list_site,
    read_client,
    split_by_class,
)

__all__ = ["FoldersParams", "load_folders"]

NAME = "folders"
TREE = """\
<dataset.root>/
  <site>/                 one client per site folder
    <class>/              the same class folders in every site
      <image>.png .jpg .jpeg .bmp .tif .tiff
    train.txt val.txt test.txt   (optional split lists: <class>/<image> per line)"""
#: the layout in one line, for errors
LAYOUT = "<dataset.root>/<site>/<class>/<image>"
MISSING_HINT = (
    " (or set dataset.allow_missing_classes=true to let a site lack classes; the classes are "
    "then the union over the sites)"
)


#: the image size of a load without a model to follow (``dataset.size`` unset)
DEFAULT_SIZE = 224


@dataclass
class FoldersParams:
    """The ``dataset.*`` keys of ``folders``."""

    root: str | None = None  # the folder holding one folder per site
    sites: list[str] | None = None  # site folder names, in client order; None: all, sorted
    #: images resized to size x size; None: the model's input size where it has one (cnn,
    #: digitmodel, lenet5: 28), else 224 (set when a config is resolved: catalog.resolve)
    size: int | None = None
    channels: Literal[1, 3] = 3  # 3: RGB (gray copied); 1: gray (colour -> luma)
    splits: Literal["auto", "lists", "fractions"] = "auto"  # per-site lists or fractions
    fractions: list[float] = field(default_factory=lambda: [0.64, 0.16, 0.2])
    seed: int = 0  # the fraction split and the max_per_split subsample
    max_per_split: int | None = None  # per site and split, stratified subsample; None = all
    classes: list[str] | None = None  # class folder names in label order; None: sorted union
    allow_missing_classes: bool = False  # a site may lack classes (classes = the union)
    skip_unreadable: bool = False  # drop (and count) images Pillow cannot read; else error
    cache: bool = True  # cache decoded, resized images
    cache_dir: str | None = None  # None -> $FEDSHIFT_CACHE or ~/.cache/fedshift

    def validate(self, prefix: str = "dataset") -> None:
        """Raise :class:`ConfigError` naming the key for a value the loader cannot honour."""
        check_root_key(self.root, f"{prefix}.root")
        check_sites_key(self.sites, f"{prefix}.sites")
        if self.size is not None:
            check_size(self.size, f"{prefix}.size")
        if self.channels not in (1, 3):
            raise ConfigError(f"config key '{prefix}.channels' must be 1 or 3")
        check_split_keys(self, prefix)
        if self.classes is not None and (
            not self.classes
            or len(set(self.classes)) != len(self.classes)
            or not all(isinstance(c, str) and c for c in self.classes)
        ):
            raise ConfigError(
                f"config key '{prefix}.classes' must be null or distinct class folder names"
            )
        check_flag(self.allow_missing_classes, f"{prefix}.allow_missing_classes")
        check_flag(self.skip_unreadable, f"{prefix}.skip_unreadable")
        check_flag(self.cache, f"{prefix}.cache")
        check_cache_dir(self.cache_dir, f"{prefix}.cache_dir")

    def input_shape(self) -> tuple[int, int, int] | None:
        """The images' shape, known before any is read (None while ``size`` follows the
        model, before the config is resolved)."""
        return None if self.size is None else (self.channels, self.size, self.size)


def _listed_splits(
    listing: SiteListing, lists: dict[str, Path], classes: list[str]
) -> tuple[dict[str, SplitSource], int]:
    """A site's splits from its lists, and how many of its images no list names."""
    folder = listing.folder
    label = {}
    known = {}
    for cls, files in listing.files.items():
        for f in files:
            rel = f.relative_to(folder).as_posix()
            known[rel] = rel
            label[rel] = classes.index(cls)
    entries = read_split_lists(lists, known, f"an image in a class folder of {folder}")
    splits = {}
    for split in SPLITS:
        rels = entries[split]
        splits[split] = SplitSource(
            [folder / r for r in rels],
            np.asarray([label[r] for r in rels], dtype=np.int64),
            [str(lists[split])] * len(rels),
        )
    unlisted = len(known) - sum(len(v) for v in entries.values())
    return splits, unlisted


def _without(info: dict[str, dict], key: str) -> dict[str, dict]:
    return {c: {k: v for k, v in i.items() if k != key} for c, i in info.items()}


def _nested_classes(site: SiteListing) -> list[str] | None:
    """The sub-folder names shared by every class folder of ``site`` when each holds its
    images only in such sub-folders (``<site>/<class>/<X>/<image>`` with the same ``X`` in
    every class: classes one level further down), else None."""
    subs = []
    for cls, files in site.files.items():
        top = site.folder / cls
        if any(p.parent == top for p in files):
            return None
        subs.append({p.relative_to(top).parts[0] for p in files})
    if len(subs) < 2 or any(s != subs[0] for s in subs) or len(subs[0]) < 2:
        return None
    return sorted(subs[0])


def _sites_key(folders: dict[str, Path], but: str | None = None) -> str:
    """``dataset.sites=[...]`` listing the site folders (but ``but``)."""
    names = [f.name for f in folders.values() if f.name != but]
    return f"dataset.sites=[{','.join(names)}]"


def _not_a_site(name: str, folders: dict[str, Path]) -> str:
    """How a folder under the root that is not a site is left out (``dataset.sites``)."""
    if len(folders) < 2:
        return ""
    return f". If {name} is not a site, leave it out: {_sites_key(folders, but=name)}"


def _check_layout(root: Path, listed: dict[str, SiteListing], sites_given: bool) -> None:
    """Refuse a tree whose layout is probably not the one meant, naming the one that is: a
    root that yields one site (``dataset.root`` one level too high: the sites became its
    classes), or class folders that hold the same folders rather than images."""
    for client, site in listed.items():
        nested = _nested_classes(site)
        if nested is not None:
            raise DataError(
                f"{NAME}: the class folders of site {client!r} ({', '.join(site.files)} in "
                f"{site.folder}) hold the same folders ({', '.join(nested)}) rather than "
                f"images: fedshift expects {LAYOUT}. If {site.folder} is your folder of sites, "
                f"give dataset.root={site.folder}"
            )
    if len(listed) == 1 and not sites_given:
        ((client, site),) = listed.items()
        raise DataError(
            f"{NAME}: dataset.root={root} holds one site folder ({site.folder.name}); a "
            f"federation needs one folder per site ({LAYOUT}). Give the folder that holds "
            f"the site folders as dataset.root, or load this one site on purpose (a "
            f"SuperNode's) with dataset.sites=[{site.folder.name}]"
        )


def _site_classes(
    params: FoldersParams, listed: dict, folders: dict[str, Path], hint: str
) -> list[str]:
    """The federation's classes: ``dataset.classes`` checked against every site's class
    folders, else the union of the sites' (``allow_missing_classes``), else the one set
    every site has (refused when they differ)."""
    allow = params.allow_missing_classes
    files = {c: site.files for c, site in listed.items()}
    if params.classes is not None:
        classes = list(params.classes)
        for client, site in listed.items():
            extra = sorted((set(site.files) | set(site.empty)) - set(classes))
            lacks = sorted(set(classes) - set(site.files))
            if extra:
                raise DataError(
                    f"{NAME}: site {client!r} ({folders[client]}) has the class folder(s) "
                    f"{extra}, which dataset.classes does not list; add them to it or move "
                    "the folders out"
                )
            if lacks and not allow:
                raise DataError(
                    f"{NAME}: site {client!r} ({folders[client]}) lacks {lacks} of "
                    f"dataset.classes; every site needs every class folder{hint}"
                )
        return classes
    if allow:
        return sorted({cls for site in files.values() for cls in site})
    also = f"; if one of the folders is not a site, list the sites: {_sites_key(folders)}"
    return check_same_classes(NAME, files, folders, unit="site", hint=hint + also)


def _plan_splits(
    params: FoldersParams,
    folders: dict[str, Path],
    listed: dict,
    classes: list[str],
    fractions: tuple[float, ...],
) -> tuple[dict, dict[str, str], dict[str, str], dict]:
    """Each site's train/val/test files: from its split lists where it has them, else cut
    per class by ``dataset.fractions``; with how each was made (for ``info``), the rule an
    empty split's error names, and the files no list names."""
    planned: dict = {}
    how: dict[str, str] = {}
    rules: dict[str, str] = {}
    unlisted: dict = {}
    for client, folder in folders.items():
        lists = find_split_lists(folder, params.splits)
        if lists is None:
            planned[client] = split_by_class(
                listed[client].files, classes, fractions, fraction_rng(NAME, client, params.seed)
            )
            how[client] = f"fractions {list(fractions)}, per class"
            rules[client] = f"dataset.fractions={list(fractions)} (cut per class at int(f0 n))"
        else:
            planned[client], unlisted[client] = _listed_splits(listed[client], lists, classes)
            how[client] = "lists " + ", ".join(str(p) for p in lists.values())
            rules[client] = "its split lists"
    return planned, how, rules, unlisted


def load_folders(params: FoldersParams, *, progress: bool = True) -> Federation:
    """The ``folders`` federation: one client per site folder (module docstring)."""
    params.validate()
    if params.size is None:  # loaded without a model (data show / check): the usual size
        params = dataclasses.replace(params, size=DEFAULT_SIZE)
    fractions = check_fractions(params.fractions)
    root = require_root(params.root, NAME, TREE)
    folders = site_folders(root, params.sites, NAME, TREE)
    allow = params.allow_missing_classes
    hint = "" if allow else MISSING_HINT
    listed = {
        c: list_site(f, allow_empty=allow, hint=hint, not_a_site=_not_a_site(f.name, folders))
        for c, f in folders.items()
    }
    _check_layout(root, listed, sites_given=params.sites is not None)
    files = {c: site.files for c, site in listed.items()}
    classes = _site_classes(params, listed, folders, hint)
    missing = {c: sorted(set(classes) - set(f)) for c, f in files.items()}
    options = ReadOptions(
        params.size,
        "rgb" if params.channels == 3 else "gray",
        params.max_per_split,
        params.seed,
        cache_root(params.cache, params.cache_dir),
        progress=progress,
        skip_unreadable=params.skip_unreadable,
        skip_key="dataset.skip_unreadable",
    )
    planned, how, rules, unlisted = _plan_splits(params, folders, listed, classes, fractions)
    clients, available, cache_info = [], {}, {}
    check_decode_fits(NAME, planned, options)  # dataset.size x the images: before decoding
    for client, splits in planned.items():
        available[client] = {s: len(src) for s, src in splits.items()}
        n = listed[client].count

        def empty(split: str, client: str = client, n: int = n) -> str:
            return (
                f"{NAME}: site {client!r} ({folders[client]}, {n} images) gets an empty "
                f"{split} split from {rules[client]}; add images, or change the lists / "
                f"dataset.fractions"
            )

        data, cache_info[client] = read_client(NAME, client, splits, options, empty)
        clients.append(data)
    skipped = {c: [str(p) for p in site.skipped] for c, site in listed.items()}
    stray = {c: [str(p) for p in site.stray] for c, site in listed.items()}
    unreadable = {c: cache_info[c].get("unreadable", []) for c in folders}
    warn_skipped(NAME, "files that are not images", skipped)
    warn_skipped(NAME, f"images beside the class folders, in no class ({LAYOUT})", stray)
    warn_skipped(NAME, "unreadable images (dataset.skip_unreadable=true)", unreadable)
    shape = (params.channels, params.size, params.size)
    fed = Federation(NAME, clients, classes, shape, task="classification")
    fed.info = {
        "root": str(root),
        "site_folders": {c: str(f) for c, f in folders.items()},
        "split": how,
        "fractions": list(fractions),
        "available": available,
        "unlisted": unlisted,
        "missing_classes": {c: m for c, m in missing.items() if m},
        "max_per_split": params.max_per_split,
        "seed": params.seed,
        "size": params.size,
        "channels": params.channels,
        "reader": (
            "Pillow convert('RGB'), gray copied to 3 channels"
            if params.channels == 3
            else "Pillow gray; colour to luma (convert('L'))"
        )
        + "; antialiased bilinear resize, rounded to 8 bits",
        "skipped_files": {c: len(skipped[c]) + len(stray[c]) + len(unreadable[c]) for c in folders},
        "skipped": {"not_images": skipped, "stray_images": stray, "unreadable": unreadable},
        "cache": None if options.cache_dir is None else _without(cache_info, "unreadable"),
        **federation_info(fed, params.size),
    }
    return fed


#: the ``folders`` dataset (the dataset contract: :mod:`fedshift.core.datasets`)
FOLDERS_DATASET = Dataset(
    "folders", FoldersParams, "classification", load_folders,
    "your images: <root>/<site>/<class>/<image>, one client per site (`fedshift docs datasets`)",
)  # fmt: skip
