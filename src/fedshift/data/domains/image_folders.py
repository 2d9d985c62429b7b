"""``pacs`` and ``officehome``: a folder per domain and per class, read from the user's disk.

What every image-file loader shares (which files make up each split, reading and resizing
them, the cache of decoded images) is in :mod:`fedshift.data.common.image_files`; the
parameter checks are in :mod:`fedshift.data.common.checks`.

Layout (nothing is downloaded; ``dataset.root`` is the folder you keep)::

    <dataset.root>/                   PACS: also <dataset.root>/kfold/<domain>/...
      <domain>/                       OfficeHome: also <dataset.root>/OfficeHomeDataset_10072016/
        <class>/
          <image>.jpg|.jpeg|.png|.bmp|.tif|.tiff

* ``pacs`` (Li et al., ICCV 2017): domains ``photo``, ``art_painting``, ``cartoon``,
  ``sketch`` (client names = folder names); 7 classes.
* ``officehome`` (Venkateswara et al., CVPR 2017): folders ``Art``, ``Clipart``, ``Product``,
  ``Real World`` (``Real_World`` and ``RealWorld`` are accepted too); clients ``art``,
  ``clipart``, ``product``, ``real_world``; 65 classes.

Classes are the sorted class-folder names and must be the same set in every domain (an error
names the domain and the difference otherwise). Files are listed recursively under each
class folder in sorted order (:mod:`fedshift.data.domains.class_folders`, shared with
``folders``); only image suffixes count (other files, e.g. ``Thumbs.db``, are skipped and
counted in ``info["skipped_files"]``); symbolic links are followed, each folder entered once
(a symlink loop is an error naming the link); a class folder without images is an error.

Splits: neither FedFA's nor FedRDN's released code ships a PACS or OfficeHome loader, and no
split is stated there, so fedshift splits each domain itself: per class, a seeded permutation
(``seeded_rng(seed, "<name>/<domain>/split")``) is cut at ``int(f0 n)`` and
``int((f0 + f1) n)`` (:func:`~fedshift.data.common.sampling.cut_points`), ``dataset.fractions``
= [train, val, test] = [0.64, 0.16, 0.2] by default (HarmoFL's 64/16/20 convention). With
``max_per_split`` set, each split of each domain is then a seeded class-stratified subsample
of at most that many images (``None`` = all).

Images: Pillow ``convert("RGB")`` (torchvision ``ImageFolder``'s loader), resized to
``size x size`` (default 224, ResNet's input; use ``size=256`` for the AlexNet of FedBN/FedFA,
whose configs use 256x256) by antialiased bilinear interpolation in torch (as Pillow's
bilinear resize), rounded to 8 bits as Pillow's resize of an 8-bit image returns, then
read as float32 ``[0, 1]`` ``(N, 3, S, S)`` per batch. No augmentation is baked in (use an
augment).

Memory: the images stay uint8 (150 kB at 224x224, 196 kB at 256x256; float32 would be four
times that), decoded once into the cache (``cache=True``): ``<cache>/<name>/<digest>/`` per
client, read per batch from there when large (:mod:`fedshift.data.common.image_files`).
All of PACS (9,991 images) is about 1.5 GB at 224, all of OfficeHome (15,588) about 2.4 GB;
``max_per_split`` bounds them for quick runs. The digest covers the absolute paths, sizes and
modification times of the chosen files, the size and the reading rule, so an edited file or a
new selection is read again (old entries are not deleted).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from fedshift.core.datasets import Dataset
from fedshift.core.errors import DataError, MissingSourceError
from fedshift.core.federation import Federation
from fedshift.data.common.checks import (
    check_cached_image_keys,
    check_domains,
    check_fractions,
    check_root_key,
    require_root,
)
from fedshift.data.common.image_files import cache_root, capped_federation_info
from fedshift.data.domains.class_folders import (
    ReadOptions,
    check_decode_fits,
    check_same_classes,
    fraction_rng,
    list_domain,
    read_client,
    split_by_class,
)

__all__ = [
    "PACS_DATASET",
    "OFFICE_HOME_DATASET",
    "OFFICEHOME_DOMAINS",
    "PACS_DOMAINS",
    "OfficeHomeParams",
    "PACSParams",
    "list_domain",
    "load_officehome",
    "load_pacs",
]

DEFAULT_FRACTIONS = [0.64, 0.16, 0.2]

#: client name -> accepted folder names, in federation order
PACS_DOMAINS: dict[str, tuple[str, ...]] = {
    "photo": ("photo",),
    "art_painting": ("art_painting",),
    "cartoon": ("cartoon",),
    "sketch": ("sketch",),
}
OFFICEHOME_DOMAINS: dict[str, tuple[str, ...]] = {
    "art": ("Art",),
    "clipart": ("Clipart",),
    "product": ("Product",),
    "real_world": ("Real World", "Real_World", "RealWorld"),
}
PACS_TREE = """\
<dataset.root>/            (or <dataset.root>/kfold/)
  photo/ art_painting/ cartoon/ sketch/
    dog/ elephant/ giraffe/ guitar/ horse/ house/ person/
      pic_001.jpg ..."""
OFFICEHOME_TREE = """\
<dataset.root>/            (or <dataset.root>/OfficeHomeDataset_10072016/)
  Art/ Clipart/ Product/ Real World/   ("Real_World" also accepted)
    Alarm_Clock/ Backpack/ ... (65 class folders, the same in every domain)
      00001.jpg ..."""


# --------------------------------------------------------------------------------------------
# folder-per-domain-per-class datasets
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FolderSpec:
    name: str
    domains: dict[str, tuple[str, ...]]
    containers: tuple[str, ...]  # sub-folders of root that may hold the domain folders
    tree: str


PACS_SPEC = FolderSpec("pacs", PACS_DOMAINS, ("", "kfold"), PACS_TREE)
OFFICEHOME_SPEC = FolderSpec(
    "officehome", OFFICEHOME_DOMAINS, ("", "OfficeHomeDataset_10072016"), OFFICEHOME_TREE
)


@dataclass
class FolderParams:
    """The ``dataset.*`` keys shared by ``pacs`` and ``officehome``."""

    root: str | None = None  # the folder holding the domain folders
    domains: list[str] = field(default_factory=list)
    fractions: list[float] = field(default_factory=lambda: list(DEFAULT_FRACTIONS))
    size: int = 224  # images resized to size x size
    max_per_split: int | None = None  # per domain and split, stratified subsample; None = all
    seed: int = 0  # the split and the subsamples
    cache: bool = True  # cache decoded, resized images
    cache_dir: str | None = None  # None -> $FEDSHIFT_CACHE or ~/.cache/fedshift

    SPEC: ClassVar[FolderSpec]

    def validate(self, prefix: str = "dataset") -> None:
        """Raise :class:`ConfigError` naming the key for a value the loader cannot honour."""
        check_root_key(self.root, f"{prefix}.root")
        check_domains(self.domains, tuple(self.SPEC.domains), f"{prefix}.domains")
        check_fractions(self.fractions, f"{prefix}.fractions")
        check_cached_image_keys(self, prefix)


@dataclass
class PACSParams(FolderParams):
    """The ``dataset.*`` keys of ``pacs``."""

    SPEC: ClassVar[FolderSpec] = PACS_SPEC
    domains: list[str] = field(default_factory=lambda: list(PACS_DOMAINS))


@dataclass
class OfficeHomeParams(FolderParams):
    """The ``dataset.*`` keys of ``officehome``."""

    SPEC: ClassVar[FolderSpec] = OFFICEHOME_SPEC
    domains: list[str] = field(default_factory=lambda: list(OFFICEHOME_DOMAINS))


def locate_domains(root: Path, spec: FolderSpec, domains: list[str]) -> tuple[Path, dict]:
    """The folder holding the domain folders (``root`` or one of ``spec.containers``) and each
    requested domain's folder."""
    candidates = []
    for sub in spec.containers:
        base = root / sub if sub else root
        hits = {d: [base / f for f in spec.domains[d] if (base / f).is_dir()] for d in spec.domains}
        if any(hits.values()):
            candidates.append((base, hits))
    layout = f"Expected layout:\n{spec.tree}"
    if not candidates:
        names = sorted(f for fs in spec.domains.values() for f in fs)
        raise MissingSourceError(
            f"dataset.root={str(root)!r} holds none of the {spec.name} domain folders "
            f"{names}; set dataset.root to the folder that holds them. {layout}"
        )
    if len(candidates) > 1:
        raise DataError(
            f"both {candidates[0][0]} and {candidates[1][0]} hold {spec.name} domain folders; "
            f"point dataset.root at the one to use"
        )
    base, hits = candidates[0]
    folders = {}
    for d in domains:
        if not hits[d]:
            want = " or ".join(repr(f) for f in spec.domains[d])
            raise MissingSourceError(
                f"{spec.name}: domain {d!r} needs the folder {want} in {base}, which is missing; "
                f"restore it or drop {d!r} from dataset.domains. {layout}"
            )
        if len(hits[d]) > 1:
            raise DataError(
                f"{spec.name}: {base} holds {[h.name for h in hits[d]]}, all folders of domain "
                f"{d!r}; keep one"
            )
        folders[d] = hits[d][0]
    return base, folders


def load_folder_federation(params: FolderParams, progress: bool = True) -> Federation:
    """The federation of a folder-per-domain-per-class dataset (``pacs``, ``officehome``)."""
    params.validate()
    spec = params.SPEC
    fractions = check_fractions(params.fractions)
    root = require_root(params.root, spec.name, spec.tree)
    base, folders = locate_domains(root, spec, list(params.domains))
    listed, skipped = {}, {}
    for d in params.domains:
        listed[d], skipped[d] = list_domain(folders[d])
    classes = check_same_classes(spec.name, listed, folders)
    store = cache_root(params.cache, params.cache_dir)
    options = ReadOptions(
        params.size, "rgb", params.max_per_split, params.seed, store, progress=progress
    )
    clients, available, cache_info = [], {}, {}
    planned = {
        d: split_by_class(listed[d], classes, fractions, fraction_rng(spec.name, d, params.seed))
        for d in params.domains
    }
    check_decode_fits(spec.name, planned, options)  # before an image is decoded
    for d in params.domains:
        splits = planned[d]
        available[d] = {s: len(src) for s, src in splits.items()}
        n = sum(len(v) for v in listed[d].values())

        def empty(split: str, d: str = d, n: int = n) -> str:
            return (
                f"{spec.name}: domain {d!r} ({folders[d]}, {n} images) gets an empty "
                f"{split} split with dataset.fractions={list(fractions)} (cut per class at "
                f"int(f0 n), int((f0 + f1) n)); add images or change dataset.fractions"
            )

        client, cache_info[d] = read_client(spec.name, d, splits, options, empty)
        clients.append(client)
    shape = (3, params.size, params.size)
    fed = Federation(spec.name, clients, classes, shape, task="classification")
    fed.info = {
        "root": str(root),
        "domain_folders": {d: str(folders[d]) for d in params.domains},
        "layout_base": str(base),
        "split": (
            "per domain and class: a seeded permutation cut at int(f0 n), int((f0 + f1) n) "
            "(fedshift's own split: the released FedFA/FedRDN code has no PACS/OfficeHome "
            "loader)"
        ),
        "fractions": list(fractions),
        **capped_federation_info(
            fed, available, (params.max_per_split, params.seed, params.size),
            "Pillow convert('RGB'), antialiased bilinear resize, rounded to 8 bits",
            cache_info if store is not None else None, skipped_files=skipped,
        ),
    }  # fmt: skip
    return fed


def load_pacs(params: PACSParams, *, progress: bool = True) -> Federation:
    """The ``pacs`` federation: one client per domain (module docstring)."""
    return load_folder_federation(params, progress)


def load_officehome(params: OfficeHomeParams, *, progress: bool = True) -> Federation:
    """The ``officehome`` federation: one client per domain (module docstring)."""
    return load_folder_federation(params, progress)


# fmt: off
#: this module's datasets (the dataset contract: :mod:`fedshift.core.datasets`)
PACS_DATASET, OFFICE_HOME_DATASET = (
    Dataset("pacs", PACSParams, "classification", load_pacs,
            "PACS (photo, art_painting, cartoon, sketch; your folder per domain and class)"),
    Dataset("officehome", OfficeHomeParams, "classification", load_officehome,
            "OfficeHome (Art, Clipart, Product, Real World; your folder per domain and class)"),
)
# fmt: on
