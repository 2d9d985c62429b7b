"""``chmnist`` and ``cub200``: DisTrans's CH-MNIST and Bird-200, read from the user's folders.

DisTrans (Yuan et al., ECCV 2022, Sec. 5 "Datasets and Model Architectures", Table 1) uses
CH-MNIST (8 classes, 8 clients, AlexNet) and Caltech-UCSD Birds-200-2011 ("Bird-200", 200
classes, 10 clients, ResNet-18). No Python package ships either; nothing is downloaded.
Each loader returns a federation with one client (named after the dataset), to be re-split by
a label-skew ``partition`` (``iid``, ``classes``, ``one-class``, ``dirichlet``), as
``cifar10``.

``chmnist``: Kather et al., "Multi-class texture analysis in colorectal cancer histology",
Sci. Rep. 6, 2016 (Zenodo 53169; also Kaggle's "colorectal-histology-mnist")::

    <dataset.root>/                    (or dataset.root = the tiles folder itself)
      Kather_texture_2016_image_tiles_5000/
        01_TUMOR/ 02_STROMA/ 03_COMPLEX/ 04_LYMPHO/
        05_DEBRIS/ 06_MUCOSA/ 07_ADIPOSE/ 08_EMPTY/
          <tile>.tif                   (625 per class, 150x150 RGB)

Kaggle's copy nests the folder twice (``Kather_texture_2016_image_tiles_5000/
Kather_texture_2016_image_tiles_5000/``); that is accepted too. Label = the folder's
two-digit prefix - 1 (01_TUMOR -> 0 ... 08_EMPTY -> 7, as the released DisTrans code's
``int(folder_name[0:2]) - 1``); class names are the folder names. Image files (suffixes
``.tif .tiff .png .jpg .jpeg .bmp``, compared in lower case) directly in each class folder
are read in sorted order; other files are skipped and counted in ``info["skipped_files"]``.
Every class folder must hold ``dataset.tiles_per_class`` images (default 625, the release;
``null`` accepts any non-zero count, e.g. a subset you made), so a half-extracted archive is
an error rather than a silently smaller dataset.

There is no official test split. The released DisTrans code (hyhmia/DisTrans@7836e02,
``CHMNIST.py``) cuts 80 % / 20 % with ``sklearn.train_test_split(train_size=0.8,
random_state=1)`` and has no validation set; fedshift draws, with seeded class-stratified
sampling (largest-remainder class quotas,
:func:`~fedshift.data.common.sampling.stratified_subsample`): ``test_size`` (default 1,000 =
20 % of 5,000, 125 per class) from all tiles, then ``val_size`` (default 500, 62-63 per
class) from the other 4,000, then ``train_size`` from the rest (``None``, the default: all
3,500). Images are resized to ``image_size`` (default 64: the paper states CH-MNIST's tiles
as "(64x64)" and Table 7 counts offsets for "64x64 RGB images"; the released code applies
``Resize((64, 64))`` to the 150x150 tiles).

``cub200``: Wah et al., "The Caltech-UCSD Birds-200-2011 Dataset", CNS-TR-2011-001::

    <dataset.root>/                    (or dataset.root = CUB_200_2011 itself)
      CUB_200_2011/
        images.txt                     "<image id> <class folder>/<file>.jpg"
        image_class_labels.txt         "<image id> <class id>"        (class ids 1..200)
        train_test_split.txt           "<image id> <1 = train, 0 = test>"
        classes.txt                    "<class id> <name>"  (001.Black_footed_Albatross)
        images/<class folder>/<file>.jpg

Images are ordered by image id; label = class id - 1; class names are ``classes.txt``'s names
as written (ids must run 1..K). The three per-image files must list the same image ids (an
error names the file and the ids that differ). The official split is kept: train and val
come from the 5,994 training images (``val_size`` default 600, about 3 per class, drawn
class-stratified and seeded; ``train_size`` from the rest, ``None``: all 5,394), test from
the 5,794 test images (``test_size``, ``None``: all). Images are resized to ``image_size``
(default 128: Sec. 5, "we resize them to 128x128"; the released code's ``Birds_TRANSFORMS``
is ``Resize((128, 128))``), whole image, no bounding-box crop.

Both: Pillow ``convert("RGB")`` (gray images copied to three channels), antialiased bilinear
resize in torch, rounded to 8 bits (:func:`~fedshift.data.common.image_files.read_images`), float32
``[0, 1]`` ``(N, 3, S, S)``; no ImageNet normalisation (the released code normalises with
ImageNet statistics for its pretrained backbones) and no augmentation baked in. Decoded images
are cached (``cache=True``) as uint8 in ``<cache>/<name>/<digest>.npz`` (see
:mod:`fedshift.data.common.image_files`). Memory as float32: CH-MNIST at 64 is 246 MB; CUB at 128
is 2.3 GB (at 64: 580 MB).

Errors: ``dataset.root`` unset or missing, a class folder, an index file or the ``images``
folder missing raise :class:`~fedshift.core.errors.MissingSourceError` naming the path and the fix;
a wrong tile count, a malformed or inconsistent index file raise
:class:`~fedshift.core.errors.DataError`; a bad key value or a size the data cannot honour raises
:class:`~fedshift.core.errors.ConfigError` naming the key.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedshift.core.datasets import Dataset
from fedshift.core.errors import ConfigError, DataError, MissingSourceError
from fedshift.core.federation import Federation
from fedshift.data.common.checks import (
    check_cache_dir,
    check_cap,
    check_flag,
    check_required_size,
    check_root_key,
    check_seed,
    check_size,
    differences,
    require_root,
)
from fedshift.data.common.image_files import (
    ClientSource,
    SplitSource,
    cache_root,
    federation_info,
    materialize_client,
)
from fedshift.data.common.images import IMAGE_SUFFIXES
from fedshift.data.common.sampling import stratified_subsample
from fedshift.data.common.seeding import seeded_rng

__all__ = [
    "CHMNIST_DATASET",
    "CUB200_DATASET",
    "CHMNIST_CLASSES",
    "CHMNISTParams",
    "CUBParams",
    "load_chmnist",
    "load_cub200",
    "read_index",
]

CHMNIST_FOLDER = "Kather_texture_2016_image_tiles_5000"
#: the class folders of Kather_texture_2016_image_tiles_5000, label = position
CHMNIST_CLASSES = (
    "01_TUMOR",
    "02_STROMA",
    "03_COMPLEX",
    "04_LYMPHO",
    "05_DEBRIS",
    "06_MUCOSA",
    "07_ADIPOSE",
    "08_EMPTY",
)
CHMNIST_TREE = f"""\
<dataset.root>/            (or dataset.root = {CHMNIST_FOLDER} itself)
  {CHMNIST_FOLDER}/
    01_TUMOR/ 02_STROMA/ 03_COMPLEX/ 04_LYMPHO/ 05_DEBRIS/ 06_MUCOSA/ 07_ADIPOSE/ 08_EMPTY/
      *.tif  (625 per class)"""

CUB_FOLDER = "CUB_200_2011"
CUB_INDEX = ("images.txt", "image_class_labels.txt", "train_test_split.txt", "classes.txt")
CUB_TREE = f"""\
<dataset.root>/            (or dataset.root = {CUB_FOLDER} itself)
  {CUB_FOLDER}/
    images.txt  image_class_labels.txt  train_test_split.txt  classes.txt
    images/<class folder>/<file>.jpg"""

READER = "Pillow convert('RGB'), antialiased bilinear resize, rounded to 8 bits"


def _check_common(p, prefix: str) -> None:
    check_root_key(p.root, f"{prefix}.root")
    check_size(p.image_size, f"{prefix}.image_size")
    check_cap(p.train_size, f"{prefix}.train_size")
    check_required_size(p.val_size, f"{prefix}.val_size")
    check_seed(p.seed, f"{prefix}.seed")
    check_flag(p.cache, f"{prefix}.cache")
    check_cache_dir(p.cache_dir, f"{prefix}.cache_dir")


@dataclass
class CHMNISTParams:
    """The ``dataset.*`` keys of ``chmnist``."""

    root: str | None = None  # Kather_texture_2016_image_tiles_5000 or the folder holding it
    image_size: int = 64  # tiles (150x150) resized to image_size x image_size
    test_size: int = 1000  # stratified, from all tiles (20 %, the released 80/20 cut)
    val_size: int = 500  # stratified, from the tiles not in test
    train_size: int | None = None  # stratified, from the rest; None: all of it
    tiles_per_class: int | None = 625  # required per class folder; None: any non-zero count
    seed: int = 0  # which tiles go to test / val / train
    cache: bool = True  # cache decoded, resized images
    cache_dir: str | None = None  # None -> $FEDSHIFT_CACHE or ~/.cache/fedshift

    def validate(self, prefix: str = "dataset") -> None:
        """Raise :class:`ConfigError` naming the key for a value the loader cannot honour."""
        _check_common(self, prefix)
        if self.test_size is None:
            raise ConfigError(
                f"config key '{prefix}.test_size' must be an integer >= 1 (CH-MNIST has no "
                f"official test split; default 1000)"
            )
        check_size(self.test_size, f"{prefix}.test_size")
        check_cap(self.tiles_per_class, f"{prefix}.tiles_per_class")


@dataclass
class CUBParams:
    """The ``dataset.*`` keys of ``cub200``."""

    root: str | None = None  # CUB_200_2011 or the folder holding it
    image_size: int = 128  # DisTrans Sec. 5: Bird-200 resized to 128x128
    val_size: int = 600  # stratified, from the official training images
    train_size: int | None = None  # stratified, from the other training images; None: all
    test_size: int | None = None  # stratified, from the official test images; None: all
    seed: int = 0  # which images go to val / train / test
    cache: bool = True  # cache decoded, resized images
    cache_dir: str | None = None  # None -> $FEDSHIFT_CACHE or ~/.cache/fedshift

    def validate(self, prefix: str = "dataset") -> None:
        """Raise :class:`ConfigError` naming the key for a value the loader cannot honour."""
        _check_common(self, prefix)
        check_cap(self.test_size, f"{prefix}.test_size")


# --------------------------------------------------------------------------------------------
# shared: seeded stratified carving of one pool
# --------------------------------------------------------------------------------------------


def _carve(
    labels: np.ndarray,
    pool: np.ndarray,
    dataset: str,
    params: CHMNISTParams | CUBParams,
    key: str,
    what: str,
    *,
    keep_one: bool = False,
    fix: str = "lower it",
) -> tuple[np.ndarray, np.ndarray]:
    """A seeded class-stratified subset of ``dataset.<key>`` of the indices ``pool`` (``None``:
    all) and the indices of ``pool`` left over, both sorted. A size larger than ``pool`` (or
    leaving none of it with ``keep_one``) is refused, naming the key, the ``what`` it asks for
    and the ``fix``."""
    n: int | None = getattr(params, key)
    available = len(pool) - 1 if keep_one else len(pool)
    if n is not None and n > available:
        raise ConfigError(
            f"config key 'dataset.{key}'={n} asks for more than the {available} {what}; {fix}"
        )
    tag = f"{dataset}/{key.removesuffix('_size')}"
    pick = pool[stratified_subsample(labels[pool], n, seeded_rng(params.seed, tag))]
    return pick, np.setdiff1d(pool, pick)


def _source(paths: list[Path], labels: np.ndarray, idx: np.ndarray, origins=None) -> SplitSource:
    return SplitSource(
        [paths[int(i)] for i in idx],
        labels[idx].astype(np.int64),
        None if origins is None else [origins[int(i)] for i in idx],
    )


def _federation(
    name: str,
    splits: dict[str, SplitSource],
    classes: list[str],
    params,
    fix: str,
    progress: bool,
) -> tuple[Federation, dict | None]:
    store = cache_root(params.cache, params.cache_dir)
    client, cache_info = materialize_client(
        name, ClientSource(name, splits), params.image_size, "rgb", store, fix, progress
    )
    shape = (3, params.image_size, params.image_size)
    fed = Federation(name, [client], classes, shape, task="classification")
    return fed, (cache_info if store is not None else None)


# --------------------------------------------------------------------------------------------
# chmnist
# --------------------------------------------------------------------------------------------


def _locate(
    root: Path, folder: str, holds: Callable[[Path], bool], missing: str, *, nested_first: bool
) -> Path:
    """Where a dataset's ``folder`` is under ``dataset.root``: the first of ``root``,
    ``root/folder`` (first when ``nested_first``) and ``root/folder/folder`` that ``holds``
    it; a :class:`MissingSourceError` saying ``missing`` when none does."""
    nested = root / folder
    candidates = (nested, root) if nested_first else (root, nested)
    for candidate in (*candidates, nested / folder):
        if holds(candidate):
            return candidate
    raise MissingSourceError(missing)


def locate_chmnist(root: Path) -> Path:
    """The folder holding the eight class folders: ``root``, ``root/<tiles folder>`` or
    Kaggle's doubly nested ``root/<tiles folder>/<tiles folder>``."""
    candidate = _locate(
        root, CHMNIST_FOLDER, lambda c: any((c / name).is_dir() for name in CHMNIST_CLASSES),
        f"dataset.root={str(root)!r} holds neither {CHMNIST_FOLDER}/ nor its class folders "
        f"{list(CHMNIST_CLASSES)}; extract Kather_texture_2016_image_tiles_5000.zip "
        f"(Zenodo 53169) there or point dataset.root at the extracted folder. Expected "
        f"layout:\n{CHMNIST_TREE}",
        nested_first=False,
    )  # fmt: skip
    for name in CHMNIST_CLASSES:
        if not (candidate / name).is_dir():
            raise MissingSourceError(
                f"{candidate / name} is missing: chmnist needs all eight class folders "
                f"{list(CHMNIST_CLASSES)}; re-extract the archive there. Expected layout:\n"
                f"{CHMNIST_TREE}"
            )
    return candidate


def list_chmnist(folder: Path, per_class: int | None) -> tuple[list[Path], np.ndarray, int]:
    """Image files of the eight class folders (sorted by name within a class), their labels
    and the number of skipped non-image files."""
    paths: list[Path] = []
    labels: list[int] = []
    skipped = 0
    for label, name in enumerate(CHMNIST_CLASSES):
        cdir = folder / name
        files = []
        for f in cdir.iterdir():
            if f.name.startswith(".") or not f.is_file():
                continue
            if f.suffix.lower() in IMAGE_SUFFIXES:
                files.append(f)
            else:
                skipped += 1
        if not files:
            raise DataError(
                f"{cdir} holds no image file ({', '.join(IMAGE_SUFFIXES)}); chmnist needs the "
                f"class's tiles there (re-extract the archive)"
            )
        if per_class is not None and len(files) != per_class:
            raise DataError(
                f"{cdir} holds {len(files)} image files, expected {per_class} "
                f"(dataset.tiles_per_class); re-extract {CHMNIST_FOLDER}.zip, or set "
                f"dataset.tiles_per_class=null to use the folders as they are"
            )
        files.sort(key=lambda p: p.name)
        paths += files
        labels += [label] * len(files)
    return paths, np.asarray(labels, dtype=np.int64), skipped


def load_chmnist(params: CHMNISTParams, *, progress: bool = True) -> Federation:
    """The ``chmnist`` federation: one client, seeded stratified test / val / train (module
    docstring)."""
    params.validate()
    root = require_root(params.root, "chmnist", CHMNIST_TREE)
    folder = locate_chmnist(root)
    paths, labels, skipped = list_chmnist(folder, params.tiles_per_class)
    n = len(labels)
    one_left = "(one must stay for training)"
    test_idx, rest = _carve(
        labels, np.arange(n), "chmnist", params, "test_size", f"tiles {one_left}", keep_one=True
    )
    val_idx, rest = _carve(
        labels,
        rest,
        "chmnist",
        params,
        "val_size",
        f"tiles left after dataset.test_size={params.test_size} {one_left}",
        keep_one=True,
    )
    train_idx, _ = _carve(
        labels,
        rest,
        "chmnist",
        params,
        "train_size",
        f"tiles left after dataset.test_size={params.test_size} and "
        f"dataset.val_size={params.val_size}",
        fix="lower one of them",
    )
    splits = {
        "train": _source(paths, labels, train_idx),
        "val": _source(paths, labels, val_idx),
        "test": _source(paths, labels, test_idx),
    }
    fix = "restore the file or fix dataset.root"
    fed, cache_info = _federation("chmnist", splits, list(CHMNIST_CLASSES), params, fix, progress)
    fed.info = {
        "root": str(root),
        "folder": str(folder),
        "source_sizes": {"all": n},
        "split": (
            "no official split: test = a seeded class-stratified test_size of all tiles, "
            "val = a stratified val_size of the others, train = a stratified train_size of "
            "the rest (null: all of it)"
        ),
        "tiles_per_class": params.tiles_per_class,
        "seed": params.seed,
        "size": params.image_size,
        "reader": READER,
        "skipped_files": skipped,
        "cache": cache_info,
        **federation_info(fed, params.image_size),
    }
    return fed


# --------------------------------------------------------------------------------------------
# cub200
# --------------------------------------------------------------------------------------------


def locate_cub(root: Path) -> Path:
    """The ``CUB_200_2011`` folder: ``root/CUB_200_2011``, ``root`` or a doubly nested copy."""
    candidate = _locate(
        root, CUB_FOLDER, lambda c: any((c / f).is_file() for f in CUB_INDEX),
        f"dataset.root={str(root)!r} holds neither {CUB_FOLDER}/ nor its index files "
        f"{list(CUB_INDEX)}; extract CUB_200_2011.tgz there or point dataset.root at the "
        f"extracted folder. Expected layout:\n{CUB_TREE}",
        nested_first=True,
    )  # fmt: skip
    for f in (*CUB_INDEX, "images"):
        path = candidate / f
        if not (path.is_dir() if f == "images" else path.is_file()):
            raise MissingSourceError(
                f"{path} is missing: cub200 needs {list(CUB_INDEX)} and images/ in "
                f"{candidate}; re-extract CUB_200_2011.tgz there. Expected layout:\n{CUB_TREE}"
            )
    return candidate


def read_index(path: Path) -> dict[int, str]:
    """A CUB index file: ``{id: rest of the line}`` from lines ``"<int id> <value>"`` (blank
    lines skipped); a malformed line or a repeated id is a :class:`DataError` naming the line."""
    out: dict[int, str] = {}
    text = path.read_text(encoding="utf-8")
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split(maxsplit=1)
        if len(parts) != 2 or not parts[0].isdigit():
            raise DataError(
                f"{path}, line {lineno}: {line!r} is not '<integer id> <value>'; restore the "
                f"file from CUB_200_2011.tgz"
            )
        key = int(parts[0])
        if key in out:
            raise DataError(f"{path}, line {lineno}: id {key} is listed twice")
        out[key] = parts[1].strip()
    if not out:
        raise DataError(f"{path} lists nothing; restore it from CUB_200_2011.tgz")
    return out


def _int_values(path: Path, index: dict[int, str], allowed: range) -> dict[int, int]:
    out = {}
    for key, value in index.items():
        if not value.isdigit() or int(value) not in allowed:
            raise DataError(
                f"{path}: id {key} has value {value!r}, expected an integer in "
                f"{allowed.start}..{allowed.stop - 1}"
            )
        out[key] = int(value)
    return out


def _same_ids(ref_path: Path, ref: dict, path: Path, other: dict) -> None:
    if ref.keys() == other.keys():
        return
    diff = differences(
        ref.keys(),
        other.keys(),
        lambda m: f"lacks {len(m)} id(s) of {ref_path.name} (e.g. {m[:5]})",
        lambda e: f"has {len(e)} id(s) {ref_path.name} does not (e.g. {e[:5]})",
    )
    raise DataError(
        f"{path} lists {len(other)} images, {ref_path} {len(ref)}: it {diff}; "
        f"the index files must describe the same images (re-extract CUB_200_2011.tgz)"
    )


def read_cub(folder: Path) -> tuple[list[Path], np.ndarray, np.ndarray, list[str], list[str]]:
    """Image paths (by image id), 0-based labels, official is-train flags, class names and
    where each image is listed (for errors)."""
    f_images, f_labels, f_split, f_classes = (folder / f for f in CUB_INDEX)
    images = read_index(f_images)
    classes_idx = read_index(f_classes)
    k = len(classes_idx)
    if sorted(classes_idx) != list(range(1, k + 1)):
        raise DataError(
            f"{f_classes}: class ids must run 1..{k} (found {sorted(classes_idx)[:5]}...); "
            f"restore the file from CUB_200_2011.tgz"
        )
    labels_idx = _int_values(f_labels, read_index(f_labels), range(1, k + 1))
    split_idx = _int_values(f_split, read_index(f_split), range(0, 2))
    _same_ids(f_images, images, f_labels, labels_idx)
    _same_ids(f_images, images, f_split, split_idx)
    ids = sorted(images)
    paths = [folder / "images" / images[i] for i in ids]
    labels = np.asarray([labels_idx[i] - 1 for i in ids], dtype=np.int64)
    is_train = np.asarray([split_idx[i] == 1 for i in ids], dtype=bool)
    origins = [f"{f_images.name}, image id {i}" for i in ids]
    classes = [classes_idx[c] for c in range(1, k + 1)]
    return paths, labels, is_train, classes, origins


def load_cub200(params: CUBParams, *, progress: bool = True) -> Federation:
    """The ``cub200`` federation: one client, the official train/test split with a seeded
    stratified val carved from train (module docstring)."""
    params.validate()
    root = require_root(params.root, "cub200", CUB_TREE)
    folder = locate_cub(root)
    paths, labels, is_train, classes, origins = read_cub(folder)
    pool_train, pool_test = np.flatnonzero(is_train), np.flatnonzero(~is_train)
    f_split = folder / "train_test_split.txt"
    for what, pool in (("training", pool_train), ("test", pool_test)):
        if len(pool) == 0:
            raise DataError(f"{f_split} marks no image as {what}; restore it from CUB_200_2011.tgz")
    val_idx, rest = _carve(
        labels,
        pool_train,
        "cub200",
        params,
        "val_size",
        "official training images (one must stay for training)",
        keep_one=True,
    )
    train_idx, _ = _carve(
        labels,
        rest,
        "cub200",
        params,
        "train_size",
        f"training images left after dataset.val_size={params.val_size}",
        fix="lower one of them",
    )
    test_idx, _ = _carve(
        labels,
        pool_test,
        "cub200",
        params,
        "test_size",
        "official test images",
        fix="lower it or set it to null (all)",
    )
    splits = {
        "train": _source(paths, labels, train_idx, origins),
        "val": _source(paths, labels, val_idx, origins),
        "test": _source(paths, labels, test_idx, origins),
    }
    fix = "restore the image under images/ or fix dataset.root"
    fed, cache_info = _federation("cub200", splits, classes, params, fix, progress)
    fed.info = {
        "root": str(root),
        "folder": str(folder),
        "source_sizes": {"train": int(len(pool_train)), "test": int(len(pool_test))},
        "split": (
            "official train_test_split.txt: val = a seeded class-stratified val_size of the "
            "training images, train = a stratified train_size of the rest (null: all of it), "
            "test = a stratified test_size of the test images (null: all)"
        ),
        "seed": params.seed,
        "size": params.image_size,
        "reader": READER,
        "cache": cache_info,
        **federation_info(fed, params.image_size),
    }
    return fed


# fmt: off
#: this module's datasets (the dataset contract: :mod:`fedshift.core.datasets`)
CHMNIST_DATASET, CUB200_DATASET = (
    Dataset("chmnist", CHMNISTParams, "classification", load_chmnist,
            "CH-MNIST colorectal histology, 8 classes "
            "(your Kather 2016 tile folders); partition it"),
    Dataset("cub200", CUBParams, "classification", load_cub200,
            "CUB-200-2011 birds, official split (your CUB_200_2011 folder); partition it"),
)
# fmt: on
