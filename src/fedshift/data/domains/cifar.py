"""``cifar10`` / ``cifar100``: Krizhevsky's CIFAR "python version" batches from the user's disk.

Nothing is downloaded. ``dataset.root`` is the folder holding the extracted batches folder, or
the batches folder itself::

    <dataset.root>/cifar-10-batches-py/        <dataset.root>/cifar-100-python/
      data_batch_1 ... data_batch_5              train
      test_batch                                 test
      batches.meta                               meta

Each batch is a pickled dict (Python 2, so its keys are bytes): ``b"data"`` a ``(N, 3072)``
uint8 array, each row a 32x32 image stored row-major, red plane then green then blue;
``b"labels"`` (CIFAR-10) or ``b"fine_labels"`` and ``b"coarse_labels"`` (CIFAR-100), lists of
ints. ``batches.meta`` has ``b"label_names"``; CIFAR-100's ``meta`` has
``b"fine_label_names"`` and ``b"coarse_label_names"``. Files are read with an unpickler that
builds numpy arrays and plain containers only (never arbitrary objects).

The federation has one client (``cifar10`` / ``cifar100``), to be re-split by a label-skew
``partition`` (``dirichlet``, ``classes``...), as ``fashion-mnist``: a class-stratified seeded
``val_size`` (default 5,000) drawn from the 50,000 training images, a disjoint stratified
``train_size`` from the rest (``None``, the default: all 45,000 others), and a stratified
``test_size`` from the 10,000 test images (``None``: all). Class quotas are proportional to
the class counts (largest remainder), i.e. exactly balanced on CIFAR. ``label_kind`` picks
CIFAR-100's 100 fine or 20 coarse labels. Images: float32 ``[0, 1]`` ``(N, 3, 32, 32)``
(ToTensor's scaling, no augmentation baked in). All 60,000 images take 737 MB in memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import torch

from fedshift.core.datasets import Dataset
from fedshift.core.errors import ConfigError, DataError, MissingSourceError
from fedshift.core.federation import ClientData, Federation, Split
from fedshift.data.common.checks import (
    check_cap,
    check_required_size,
    check_root_key,
    check_seed,
    require_root,
)
from fedshift.data.common.pickles import read_array_pickle
from fedshift.data.common.sampling import stratified_subsample
from fedshift.data.common.seeding import seeded_rng

__all__ = ["CIFAR_SPECS", "CifarParams", "load_cifar10", "load_cifar100", "read_cifar_batch"]

SIDE = 32
PIXELS = 3 * SIDE * SIDE


@dataclass(frozen=True)
class CifarSpec:
    name: str
    folder: str
    train_files: tuple[str, ...]
    test_file: str
    meta_file: str
    label_keys: dict[str, str]  # label_kind -> batch key
    name_keys: dict[str, str]  # label_kind -> meta key
    tree: str


CIFAR_SPECS = {
    "cifar10": CifarSpec(
        "cifar10",
        "cifar-10-batches-py",
        tuple(f"data_batch_{k}" for k in range(1, 6)),
        "test_batch",
        "batches.meta",
        {"fine": "labels"},
        {"fine": "label_names"},
        """\
<dataset.root>/                 (or dataset.root = the cifar-10-batches-py folder)
  cifar-10-batches-py/
    data_batch_1 ... data_batch_5  test_batch  batches.meta""",
    ),
    "cifar100": CifarSpec(
        "cifar100",
        "cifar-100-python",
        ("train",),
        "test",
        "meta",
        {"fine": "fine_labels", "coarse": "coarse_labels"},
        {"fine": "fine_label_names", "coarse": "coarse_label_names"},
        """\
<dataset.root>/                 (or dataset.root = the cifar-100-python folder)
  cifar-100-python/
    train  test  meta""",
    ),
}


@dataclass
class CifarParams:
    """The ``dataset.*`` keys of ``cifar10`` and ``cifar100``."""

    root: str | None = None  # the folder holding cifar-10-batches-py/ (or cifar-100-python/)
    train_size: int | None = None  # from the 50k, disjoint from val; None: all the others
    val_size: int = 5000  # from the 50k training images, stratified
    test_size: int | None = None  # from the 10k test images; None: all
    seed: int = 0  # which images go to val / train / test
    label_kind: Literal["fine", "coarse"] = "fine"  # CIFAR-100: 100 fine or 20 coarse classes

    def validate(self, prefix: str = "dataset") -> None:
        """Raise :class:`ConfigError` naming the key for a value the loader cannot honour."""
        check_root_key(self.root, f"{prefix}.root")
        check_cap(self.train_size, f"{prefix}.train_size")
        check_required_size(self.val_size, f"{prefix}.val_size")
        check_cap(self.test_size, f"{prefix}.test_size")
        check_seed(self.seed, f"{prefix}.seed")
        if self.label_kind not in ("fine", "coarse"):
            raise ConfigError(
                f"config key '{prefix}.label_kind' must be 'fine' or 'coarse', got "
                f"{self.label_kind!r}"
            )


def _folder(root: Path, spec: CifarSpec) -> Path:
    for candidate in (root / spec.folder, root):
        if (candidate / spec.test_file).is_file() or (candidate / spec.meta_file).is_file():
            return candidate
    raise MissingSourceError(
        f"dataset.root={str(root)!r} holds neither {spec.folder}/ nor the {spec.name} batch "
        f"files; extract the CIFAR python version there. Expected layout:\n{spec.tree}"
    )


def _keyed(obj: object, path: Path, expected: str) -> dict[str, object]:
    """A pickled dict with its bytes keys decoded."""
    if not isinstance(obj, dict):
        raise DataError(f"{path} holds a {type(obj).__name__}, expected a dict with {expected}")
    return {(k.decode("latin1") if isinstance(k, bytes) else str(k)): v for k, v in obj.items()}


def read_cifar_batch(path: Path, label_key: str) -> tuple[np.ndarray, np.ndarray]:
    """One batch file: uint8 images ``(N, 3, 32, 32)`` and int64 labels."""
    expected = f"b'data' ((N, 3072) uint8) and b'{label_key}'"
    batch = _keyed(read_array_pickle(path, f"a dict with {expected}"), path, expected)
    missing = [k for k in ("data", label_key) if k not in batch]
    if missing:
        raise DataError(
            f"{path}: no key(s) {[k.encode() for k in missing]} (found "
            f"{sorted(k.encode() for k in batch)}); expected {expected}"
        )
    data = batch["data"]
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2:
        what = f"{data.dtype} {data.shape}" if isinstance(data, np.ndarray) else type(data)
        raise DataError(f"{path}: b'data' is {what}, expected a (N, 3072) uint8 array")
    if data.shape[1] != PIXELS:
        raise DataError(
            f"{path}: b'data' rows have {data.shape[1]} values, expected {PIXELS} "
            f"(3 x 32 x 32); is this a CIFAR python-version batch?"
        )
    labels = np.asarray(batch[label_key])
    if labels.shape != (len(data),) or labels.dtype.kind not in "iu":
        raise DataError(
            f"{path}: b'{label_key}' has shape {labels.shape} ({labels.dtype}), expected "
            f"{len(data)} integer labels"
        )
    return data.reshape(-1, 3, SIDE, SIDE), labels.astype(np.int64)


def _class_names(path: Path, key: str) -> list[str]:
    meta = _keyed(read_array_pickle(path, f"a dict with b'{key}'"), path, f"b'{key}'")
    if key not in meta:
        raise DataError(
            f"{path}: no key {key.encode()!r} (found {sorted(k.encode() for k in meta)})"
        )
    names = meta[key]
    if not isinstance(names, list | tuple) or not names:
        raise DataError(f"{path}: {key.encode()!r} is not a list of class names")
    return [n.decode("utf-8") if isinstance(n, bytes) else str(n) for n in names]


def _to_split(x: np.ndarray, y: np.ndarray, idx: np.ndarray) -> Split:
    images = torch.from_numpy(np.ascontiguousarray(x[idx])).to(torch.float32).div_(255.0)
    return Split(images, torch.from_numpy(y[idx]))


def load_cifar(spec: CifarSpec, params: CifarParams) -> Federation:
    """One client with stratified train / val (from the training set) and test splits."""
    params.validate()
    if params.label_kind not in spec.label_keys:
        raise ConfigError(
            f"config key 'dataset.label_kind' must be one of {list(spec.label_keys)} for "
            f"{spec.name}, got {params.label_kind!r}"
            + (" (coarse labels exist for cifar100 only)" if spec.name == "cifar10" else "")
        )
    root = require_root(params.root, spec.name, spec.tree)
    folder = _folder(root, spec)
    files = [folder / f for f in (*spec.train_files, spec.test_file, spec.meta_file)]
    for f in files:
        if not f.is_file():
            raise MissingSourceError(
                f"{f} is missing; {spec.name} needs it. Expected layout:\n{spec.tree}"
            )
    label_key = spec.label_keys[params.label_kind]
    parts = [read_cifar_batch(folder / f, label_key) for f in spec.train_files]
    x_tr = np.concatenate([p[0] for p in parts])
    y_tr = np.concatenate([p[1] for p in parts])
    x_te, y_te = read_cifar_batch(folder / spec.test_file, label_key)
    classes = _class_names(folder / spec.meta_file, spec.name_keys[params.label_kind])
    for path, y in ((folder / spec.train_files[0], y_tr), (folder / spec.test_file, y_te)):
        if len(y) and (int(y.min()) < 0 or int(y.max()) >= len(classes)):
            raise DataError(
                f"{path}: labels span {int(y.min())}..{int(y.max())} but "
                f"{folder / spec.meta_file} names {len(classes)} classes"
            )
    n_tr = len(y_tr)
    if params.val_size >= n_tr:
        raise ConfigError(
            f"config key 'dataset.val_size'={params.val_size} leaves no training image of "
            f"the {n_tr} in {spec.name}'s training batches; lower it"
        )
    rest_n = n_tr - params.val_size
    if params.train_size is not None and params.train_size > rest_n:
        raise ConfigError(
            f"config key 'dataset.train_size'={params.train_size} exceeds the {rest_n} "
            f"training images left after dataset.val_size={params.val_size}; lower one of them"
        )
    if params.test_size is not None and params.test_size > len(y_te):
        raise ConfigError(
            f"config key 'dataset.test_size'={params.test_size} exceeds the {len(y_te)} test "
            f"images; lower it or set it to null (all)"
        )
    val_idx = stratified_subsample(
        y_tr, params.val_size, seeded_rng(params.seed, f"{spec.name}/val")
    )
    rest = np.setdiff1d(np.arange(n_tr), val_idx)
    pick = stratified_subsample(
        y_tr[rest], params.train_size, seeded_rng(params.seed, f"{spec.name}/train")
    )
    train_idx = rest[pick]
    test_idx = stratified_subsample(
        y_te, params.test_size, seeded_rng(params.seed, f"{spec.name}/test")
    )
    client = ClientData(
        spec.name,
        _to_split(x_tr, y_tr, train_idx),
        _to_split(x_tr, y_tr, val_idx),
        _to_split(x_te, y_te, test_idx),
    )
    fed = Federation(spec.name, [client], classes, (3, SIDE, SIDE), task="classification")
    fed.info = {
        "root": str(root),
        "folder": str(folder),
        "label_kind": params.label_kind,
        "source_sizes": {"train": n_tr, "test": int(len(y_te))},
        "split": (
            "val = seeded class-stratified val_size of the training batches; train = a "
            "stratified train_size of the rest (null: all of it); test = a stratified "
            "test_size of the test batch (null: all)"
        ),
        "counts": fed.counts(),
        "seed": params.seed,
    }
    return fed


def load_cifar10(params: CifarParams) -> Federation:
    """The ``cifar10`` federation: one client (module docstring)."""
    return load_cifar(CIFAR_SPECS["cifar10"], params)


def load_cifar100(params: CifarParams) -> Federation:
    """The ``cifar100`` federation: one client, fine or coarse labels (module docstring)."""
    return load_cifar(CIFAR_SPECS["cifar100"], params)


# fmt: off
#: this module's datasets (the dataset contract: :mod:`fedshift.core.datasets`)
CIFAR10_DATASET, CIFAR100_DATASET = (
    Dataset("cifar10", CifarParams, "classification", load_cifar10,
            "CIFAR-10 (your python batches); partition it"),
    Dataset("cifar100", CifarParams, "classification", load_cifar100,
            "CIFAR-100 (your python batches); partition it"),
)
# fmt: on
