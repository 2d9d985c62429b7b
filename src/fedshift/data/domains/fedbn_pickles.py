"""FedBN's benchmarks in FedBN's own pickled layout: ``digits5``, ``office-caltech10``,
``domainnet``, read from the user's disk (nothing is downloaded).

The layouts, splits and image handling follow FedBN's released code (Li et al., ICLR 2021;
med-air/FedBN @2fa38ad: ``utils/data_utils.py``, ``federated/fed_{digits,office,
domainnet}.py``); ``split="fedfa"`` gives FedFA's splits (tfzhou/FedFA @57e9582,
``pyfed/dataset/dataset.py``) for Office and DomainNet. Every pickle is read by
:func:`~fedshift.data.common.pickles.read_array_pickle`, which builds numpy arrays and plain
containers only.

``digits5``::

    <dataset.root>/
      MNIST/ SVHN/ USPS/ SynthDigits/ MNIST_M/
        partitions/train_part0.pkl ... train_part9.pkl
        test.pkl

  Each pickle is a tuple ``(images, labels)``: uint8 images ``(N, H, W)`` (gray: MNIST,
  USPS) or ``(N, H, W, 3)`` (RGB), integer labels 0-9. Clients ``mnist``, ``svhn``, ``usps``,
  ``synth``, ``mnistm`` (FedBN's ``--data`` names), in FedBN's order. Training data =
  FedBN's ``--percent`` rule (``dataset.percent``, default 0.1): ``percent >= 0.1`` takes the
  first ``int(percent * 10)`` parts (0.1 -> ``train_part0``, about 743 images), a smaller
  percent the first ``int(N0 * percent * 10)`` images of ``train_part0``. Test = all of
  ``test.pkl`` (``test_size`` caps it by a seeded stratified subsample). FedBN's digits have
  no validation split; fedshift always selects on validation, so a seeded, class-stratified
  ``val_fraction`` (0.2: ``int(0.2 n)`` images) of the training images is held out as
  validation and the rest trains. Images: resized to 28x28 (antialiased bilinear, rounded to
  8 bits as Pillow does; MNIST and MNIST-M are 28x28 already, FedBN resizes SVHN, USPS and
  SynthDigits), gray copied to three channels (FedBN's ``Grayscale(3)``), float ``[0, 1]``;
  FedBN's ``Normalize(0.5, 0.5)`` is fedshift's default ``input.mean/std``.

``office-caltech10`` and ``domainnet``::

    <dataset.root>/                           <dataset.root>/
      office_caltech_10/                        DomainNet/
        amazon_train.pkl  amazon_test.pkl         clipart_train.pkl clipart_test.pkl ...
        caltech_... dslr_... webcam_...           (infograph painting quickdraw real sketch)
        amazon/back_pack/frame_0001.jpg ...       clipart/bird/clipart_001_000001.jpg ...

  Each pickle is ``(paths, text labels)`` (numpy string arrays); a path is relative to the
  folder that holds ``office_caltech_10/`` / ``DomainNet/`` (FedBN joins it to ``../data``),
  e.g. ``DomainNet/clipart/bird/x.jpg``. ``dataset.root`` may also be the pickles' folder
  itself. Classes in FedBN's label order (``OFFICE_CLASSES``, ``DOMAINNET_CLASSES``).

  ``split="fedbn"`` (default), with ``m`` = the smallest train-pickle length among the loaded
  domains: Office train = the first ``int(0.5 m)`` entries of a domain's train pickle, val =
  its last ``int(0.4 m)``; DomainNet train = first ``int(0.05 m)``, val = last
  ``int(0.05 m)``; test = the test pickle. ``split="fedfa"``: Office train = first
  ``int(0.6 n)`` of the domain's own train pickle (length n), val = the rest (FedFA's
  Table 11); DomainNet val = last ``int(0.2 n)`` and train = first ``int(0.32 n)`` (FedFA's
  Table 12: 672 / 420 of clipart's 2,103 entries; DomainNet's ``fedfa_train=paper``,
  default) or first ``int(0.8 * 0.6 * n)`` (``fedfa_train=released``: the released code's
  ``int(0.8 * train_ratio * n)`` with its configured ratio 0.6).
  ``split="fedrdn"`` (Office only): FedRDN's Table 6 (App. A.1), train = first
  ``int(0.6 n)`` of the domain's train pickle, val = the rest, test = the test pickle
  (exactly Table 6's 459/538/75/141 train, 307/360/50/95 val on the released pickles).
  ``max_per_split`` (None = all) then caps each split by a seeded class-stratified subsample.

  Images as FedBN opens them (:func:`~fedshift.data.common.images.read_image_fedbn`: 3-band
  images kept, anything else made gray and copied to 3 channels), resized to ``size``
  (default 256, FedBN's ``Resize([256, 256])``), float ``[0, 1]`` (FedBN uses no mean/std
  normalisation for these; set ``input.mean=0 input.std=1`` to match). FedBN's train-time
  random horizontal flip and rotation (+-30 deg) are *not* baked in: add an augment.
  Decoded, resized images are cached per client (see :mod:`fedshift.data.common.image_files`).

Sizes of the released data: DomainNet's train pickles hold 2,103 (clipart) .. 4,864 (real)
entries, so FedBN's rule gives 105 train and 105 val images per domain and 526-1,217 test.
At 256x256 float32 an image is 786 kB: all of DomainNet's test pickles (4,573) take 3.6 GB.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Literal

import numpy as np
import torch

from fedshift.core.datasets import Dataset
from fedshift.core.errors import ConfigError, DataError, MissingSourceError
from fedshift.core.federation import SPLITS, ClientData, Federation, Split
from fedshift.core.images import MemoryBudget
from fedshift.data.common.checks import (
    check_cached_image_keys,
    check_cap,
    check_domains,
    check_root_key,
    check_seed,
    require_file,
    require_root,
)
from fedshift.data.common.image_files import (
    ClientSource,
    SplitSource,
    cache_root,
    cap_split,
    capped_federation_info,
    federation_info,
    materialize_client,
)
from fedshift.data.common.images import resize_uint8, to_float
from fedshift.data.common.pickles import read_array_pickle
from fedshift.data.common.sampling import stratified_subsample
from fedshift.data.common.seeding import seeded_rng

__all__ = [
    "DIGITS5_DATASET",
    "OFFICE_CALTECH10_DATASET",
    "DOMAIN_NET_DATASET",
    "DIGITS5_CLASSES",
    "DIGITS5_DOMAINS",
    "DOMAINNET_CLASSES",
    "DOMAINNET_DOMAINS",
    "OFFICE_CLASSES",
    "OFFICE_DOMAINS",
    "Digits5Params",
    "DomainNetParams",
    "OfficeParams",
    "digits5_parts",
    "load_digits5",
    "load_domainnet",
    "load_office",
    "split_bounds",
]

# --------------------------------------------------------------------------------------------
# pickles
# --------------------------------------------------------------------------------------------


def _pair(obj: object, path: Path, expected: str) -> tuple[object, object]:
    if not isinstance(obj, tuple | list) or len(obj) != 2:
        raise DataError(f"{path} holds a {type(obj).__name__}, expected a tuple {expected}")
    return obj[0], obj[1]


# --------------------------------------------------------------------------------------------
# digits5
# --------------------------------------------------------------------------------------------

#: client name -> FedBN's folder, in FedBN's order
DIGITS5_DOMAINS: dict[str, str] = {
    "mnist": "MNIST",
    "svhn": "SVHN",
    "usps": "USPS",
    "synth": "SynthDigits",
    "mnistm": "MNIST_M",
}
DIGITS5_CLASSES = [str(d) for d in range(10)]
DIGITS_SIDE = 28
NUM_PARTS = 10
DIGITS5_TREE = """\
<dataset.root>/
  MNIST/ SVHN/ USPS/ SynthDigits/ MNIST_M/
    partitions/
      train_part0.pkl ... train_part9.pkl   (images uint8 (N,H,W) or (N,H,W,3), labels)
    test.pkl"""
DIGITS_PAIR = "(uint8 images (N, H, W) or (N, H, W, 3), labels 0-9)"


@dataclass
class Digits5Params:
    """The ``dataset.*`` keys of ``digits5``."""

    root: str | None = None  # the folder holding MNIST/ SVHN/ USPS/ SynthDigits/ MNIST_M/
    domains: list[str] = field(default_factory=lambda: list(DIGITS5_DOMAINS))
    percent: float = 0.1  # FedBN's --percent: 0.1 = train_part0 (~743 images), 1.0 = all ten
    val_fraction: float = 0.2  # held out of the training parts (FedBN has no val split)
    test_size: int | None = None  # None: all of test.pkl (FedBN); else a stratified subsample
    seed: int = 0  # the validation hold-out and the test subsample

    def validate(self, prefix: str = "dataset") -> None:
        """Raise :class:`ConfigError` naming the key for a value the loader cannot honour."""
        check_root_key(self.root, f"{prefix}.root")
        check_domains(self.domains, tuple(DIGITS5_DOMAINS), f"{prefix}.domains")
        for key, value in (("percent", self.percent), ("val_fraction", self.val_fraction)):
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ConfigError(f"config key '{prefix}.{key}' must be a number, got {value!r}")
        if not 0 < self.percent <= 1:
            raise ConfigError(
                f"config key '{prefix}.percent' must be in (0, 1] (FedBN's --percent: 0.1 = "
                f"train_part0, 1.0 = all ten parts), got {self.percent!r}"
            )
        if not 0 < self.val_fraction < 1:
            raise ConfigError(
                f"config key '{prefix}.val_fraction' must be in (0, 1), got {self.val_fraction!r}"
            )
        check_cap(self.test_size, f"{prefix}.test_size")
        check_seed(self.seed, f"{prefix}.seed")


def digits5_parts(percent: float) -> tuple[int, float | None]:
    """FedBN's ``DIGITS_DATASET`` rule: ``(parts, None)`` for ``percent >= 0.1`` (the first
    ``int(percent * 10)`` parts), else ``(1, percent)``: the first ``int(N0 * percent * 10)``
    images of ``train_part0``."""
    if percent >= 0.1:
        return int(percent * 10), None
    return 1, percent


def _read_digits(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """One FedBN digits pickle: uint8 images ``(N, H, W, C)`` (C = 1 or 3), int64 labels."""
    images, labels = _pair(read_array_pickle(path, DIGITS_PAIR), path, DIGITS_PAIR)
    if not isinstance(images, np.ndarray) or images.dtype != np.uint8:
        kind = images.dtype if isinstance(images, np.ndarray) else type(images).__name__
        raise DataError(f"{path}: images are {kind}, expected a uint8 array {DIGITS_PAIR}")
    if images.ndim == 3:
        images = images[..., None]
    if images.ndim != 4 or images.shape[-1] not in (1, 3) or min(images.shape[1:3]) < 1:
        raise DataError(
            f"{path}: images have shape {images.shape}, expected (N, H, W) gray or (N, H, W, 3) RGB"
        )
    y = np.asarray(labels)
    if y.ndim > 1:
        y = y.squeeze()  # FedBN: labels.astype(long).squeeze()
    if y.ndim != 1 or len(y) != len(images):
        raise DataError(
            f"{path}: {len(images)} images but labels of shape {np.asarray(labels).shape}; "
            f"expected one label per image"
        )
    if y.dtype.kind not in "iuf" or (y.dtype.kind == "f" and not np.all(y == np.round(y))):
        raise DataError(f"{path}: labels are {y.dtype}, expected integers 0-9")
    y = y.astype(np.int64)
    bad = np.flatnonzero((y < 0) | (y > 9))
    if bad.size:
        raise DataError(f"{path}: label {int(y[bad[0]])} at entry {int(bad[0])} is not a digit 0-9")
    return images, y


def _digits_tensor(images: np.ndarray) -> torch.Tensor:
    """``(N, H, W, C)`` uint8 -> float ``(N, 3, 28, 28)`` in [0, 1]."""
    x = resize_uint8(np.ascontiguousarray(images.transpose(0, 3, 1, 2)), DIGITS_SIDE)
    t = to_float(x)
    return t.expand(-1, 3, -1, -1).contiguous() if t.shape[1] == 1 else t


def _digits_client(folder: Path, domain: str, params: Digits5Params) -> tuple[ClientData, dict]:
    parts, fraction = digits5_parts(params.percent)
    files = [folder / "partitions" / f"train_part{k}.pkl" for k in range(parts)]
    test_file = folder / "test.pkl"
    for f in [*files, test_file]:
        require_file(f, "digits5", DIGITS5_TREE)
    xs, ys = [], []
    for f in files:
        x, y = _read_digits(f)
        if xs and x.shape[1:] != xs[0].shape[1:]:
            raise DataError(
                f"{f}: images are {x.shape[1:]} (H, W, C) but {files[0].name} has "
                f"{xs[0].shape[1:]}; every part of a domain must match"
            )
        xs.append(x)
        ys.append(y)
    x_pool, y_pool = np.concatenate(xs), np.concatenate(ys)
    if fraction is not None:
        keep = int(x_pool.shape[0] * fraction * 10)  # FedBN: int(N * percent * 10)
        x_pool, y_pool = x_pool[:keep], y_pool[:keep]
    n = len(y_pool)
    n_val = int(params.val_fraction * n)
    if n_val < 1 or n_val >= n:
        raise DataError(
            f"digits5 {domain}: {n} training images with dataset.val_fraction="
            f"{params.val_fraction} leave {n_val} for validation and {n - n_val} for training; "
            f"raise dataset.percent or change dataset.val_fraction"
        )
    val_idx = stratified_subsample(y_pool, n_val, seeded_rng(params.seed, f"digits5/{domain}/val"))
    train_idx = np.setdiff1d(np.arange(n), val_idx)
    x_test, y_test = _read_digits(test_file)
    test_idx = stratified_subsample(
        y_test, params.test_size, seeded_rng(params.seed, f"digits5/{domain}/test")
    )
    chosen = {
        "train": (x_pool[train_idx], y_pool[train_idx]),
        "val": (x_pool[val_idx], y_pool[val_idx]),
        "test": (x_test[test_idx], y_test[test_idx]),
    }
    splits = {s: Split(_digits_tensor(x), torch.from_numpy(y)) for s, (x, y) in chosen.items()}
    info = {
        "parts": [f.name for f in files],
        "kept_of_part0": None if fraction is None else n,
        "pool": n,
        "test_available": int(len(y_test)),
        "source_shape": list(x_pool.shape[1:]),
    }
    return ClientData(domain, splits["train"], splits["val"], splits["test"]), info


def load_digits5(params: Digits5Params) -> Federation:
    """The ``digits5`` federation (FedBN's Digits-5 pickles; module docstring)."""
    params.validate()
    root = require_root(params.root, "digits5", DIGITS5_TREE)
    clients, sources = [], {}
    for domain in params.domains:
        folder = root / DIGITS5_DOMAINS[domain]
        if not folder.is_dir():
            raise MissingSourceError(
                f"digits5 domain {domain!r}: the folder {folder} is missing; restore it or drop "
                f"{domain!r} from dataset.domains. Expected layout:\n{DIGITS5_TREE}"
            )
        client, sources[domain] = _digits_client(folder, domain, params)
        clients.append(client)
    fed = Federation("digits5", clients, list(DIGITS5_CLASSES), (3, DIGITS_SIDE, DIGITS_SIDE))
    fed.info = {
        "root": str(root),
        "percent": params.percent,
        "split": (
            "train + val = FedBN's --percent parts of partitions/train_part*.pkl; val = a "
            "seeded class-stratified int(val_fraction n) of them (FedBN has no validation "
            "split; fedshift selects on validation); test = test.pkl"
            + ("" if params.test_size is None else " (stratified subsample to test_size)")
        ),
        "val_fraction": params.val_fraction,
        "test_size": params.test_size,
        "seed": params.seed,
        "sources": sources,
        "transform": (
            "resize to 28x28 (antialiased bilinear, 8-bit rounding), gray -> 3 channels, "
            "[0, 1]; FedBN's Normalize(0.5, 0.5) is input.mean/std"
        ),
        **federation_info(fed, DIGITS_SIDE),
    }
    return fed


# --------------------------------------------------------------------------------------------
# office-caltech10 and domainnet
# --------------------------------------------------------------------------------------------

OFFICE_DOMAINS = ("amazon", "caltech", "dslr", "webcam")
OFFICE_CLASSES = [
    "back_pack",
    "bike",
    "calculator",
    "headphones",
    "keyboard",
    "laptop_computer",
    "monitor",
    "mouse",
    "mug",
    "projector",
]
DOMAINNET_DOMAINS = ("clipart", "infograph", "painting", "quickdraw", "real", "sketch")
DOMAINNET_CLASSES = [
    "bird",
    "feather",
    "headphones",
    "ice_cream",
    "teapot",
    "tiger",
    "whale",
    "windmill",
    "wine_glass",
    "zebra",
]
OFFICE_TREE = """\
<dataset.root>/
  office_caltech_10/
    amazon_train.pkl amazon_test.pkl ... (caltech, dslr, webcam)  ((paths, text labels))
    amazon/back_pack/frame_0001.jpg ...   (paths in the pickles are relative to
                                           <dataset.root>: office_caltech_10/amazon/...)"""
DOMAINNET_TREE = """\
<dataset.root>/
  DomainNet/
    clipart_train.pkl clipart_test.pkl ... (infograph painting quickdraw real sketch)
    clipart/bird/clipart_001_000001.jpg ... (paths in the pickles are relative to
                                             <dataset.root>: DomainNet/clipart/...)"""
PATHS_PAIR = "(image paths, text labels)"


@dataclass(frozen=True)
class PickleSpec:
    name: str
    folder: str
    domains: tuple[str, ...]
    classes: list[str]
    tree: str


OFFICE_SPEC = PickleSpec(
    "office-caltech10", "office_caltech_10", OFFICE_DOMAINS, OFFICE_CLASSES, OFFICE_TREE
)
DOMAINNET_SPEC = PickleSpec(
    "domainnet", "DomainNet", DOMAINNET_DOMAINS, DOMAINNET_CLASSES, DOMAINNET_TREE
)


@dataclass
class PickleParams:
    """The ``dataset.*`` keys shared by ``office-caltech10`` and ``domainnet``."""

    root: str | None = None  # the folder holding office_caltech_10/ or DomainNet/ (or it)
    domains: list[str] = field(default_factory=list)
    split: Literal["fedbn", "fedfa", "fedrdn"] = "fedbn"  # whose train/val rule (docstring)
    size: int = 256  # images resized to size x size (FedBN/FedFA: 256)
    max_per_split: int | None = None  # per domain and split, stratified subsample; None = all
    seed: int = 0  # the max_per_split subsamples (the splits themselves are deterministic)
    cache: bool = True  # cache decoded, resized images
    cache_dir: str | None = None  # None -> $FEDSHIFT_CACHE or ~/.cache/fedshift

    SPEC: ClassVar[PickleSpec]
    SPLITS: ClassVar[tuple[str, ...]] = ("fedbn", "fedfa")  # the split rules this data set has

    def validate(self, prefix: str = "dataset") -> None:
        """Raise :class:`ConfigError` naming the key for a value the loader cannot honour."""
        check_root_key(self.root, f"{prefix}.root")
        check_domains(self.domains, self.SPEC.domains, f"{prefix}.domains")
        if self.split not in self.SPLITS:
            raise ConfigError(
                f"config key '{prefix}.split' of {self.SPEC.name} must be one of "
                f"{', '.join(repr(s) for s in self.SPLITS)}, got {self.split!r}"
            )
        check_cached_image_keys(self, prefix)


@dataclass
class OfficeParams(PickleParams):
    """The ``dataset.*`` keys of ``office-caltech10``."""

    SPEC: ClassVar[PickleSpec] = OFFICE_SPEC
    SPLITS: ClassVar[tuple[str, ...]] = ("fedbn", "fedfa", "fedrdn")
    domains: list[str] = field(default_factory=lambda: list(OFFICE_DOMAINS))


@dataclass
class DomainNetParams(PickleParams):
    """The ``dataset.*`` keys of ``domainnet``."""

    SPEC: ClassVar[PickleSpec] = DOMAINNET_SPEC
    domains: list[str] = field(default_factory=lambda: list(DOMAINNET_DOMAINS))
    #: train share under split=fedfa: "paper" int(0.32 n) (FedFA Table 12), "released"
    #: int(0.8 * 0.6 n) (tfzhou/FedFA's DomainNetDataset with its train_ratio 0.6)
    fedfa_train: Literal["paper", "released"] = "paper"

    def validate(self, prefix: str = "dataset") -> None:
        super().validate(prefix)
        if self.fedfa_train not in ("paper", "released"):
            raise ConfigError(
                f"config key '{prefix}.fedfa_train' must be 'paper' or 'released', "
                f"got {self.fedfa_train!r}"
            )
        if self.fedfa_train != "paper" and self.split != "fedfa":
            raise ConfigError(
                f"config key '{prefix}.fedfa_train' applies to {prefix}.split=fedfa only "
                f"(got split={self.split!r}); remove it or set {prefix}.split=fedfa"
            )


def _pickle_folder(root: Path, spec: PickleSpec, domains: list[str]) -> Path:
    """``root/<spec.folder>``, or ``root`` itself when it holds the pickles."""
    sub = root / spec.folder
    if sub.is_dir():
        return sub
    if (root / f"{domains[0]}_train.pkl").is_file():
        return root
    raise MissingSourceError(
        f"dataset.root={str(root)!r} holds neither {spec.folder}/ nor {domains[0]}_train.pkl; "
        f"set dataset.root to the folder that holds {spec.folder}/. Expected layout:\n"
        f"{spec.tree}"
    )


def _read_paths(path: Path, spec: PickleSpec) -> tuple[list[str], np.ndarray]:
    """A ``(paths, text labels)`` pickle: relative paths and class indices."""
    raw_paths, raw_labels = _pair(read_array_pickle(path, PATHS_PAIR), path, PATHS_PAIR)
    paths = np.asarray(raw_paths).reshape(-1) if not isinstance(raw_paths, str) else None
    labels = np.asarray(raw_labels).reshape(-1) if not isinstance(raw_labels, str) else None
    if paths is None or labels is None or len(paths) != len(labels):
        n_p = "?" if paths is None else len(paths)
        n_l = "?" if labels is None else len(labels)
        raise DataError(
            f"{path}: {n_p} paths but {n_l} labels; expected {PATHS_PAIR} of equal length"
        )
    if len(paths) == 0:
        raise DataError(f"{path} lists no image")

    def text(v: object, what: str, i: int) -> str:
        if isinstance(v, bytes | np.bytes_):
            return bytes(v).decode("utf-8")
        if isinstance(v, str | np.str_):
            return str(v)
        raise DataError(f"{path}: entry {i}'s {what} is {type(v).__name__}, expected text")

    rel = [text(p, "path", i) for i, p in enumerate(paths)]
    index = {c: k for k, c in enumerate(spec.classes)}
    y = np.empty(len(labels), dtype=np.int64)
    for i, v in enumerate(labels):
        name = text(v, "label", i)
        if name not in index:
            raise DataError(
                f"{path}: entry {i} has label {name!r}, not one of the {spec.name} classes "
                f"{spec.classes}"
            )
        y[i] = index[name]
    return rel, y


def split_bounds(
    dataset: str, split: str, n: int, min_len: int, fedfa_train: str = "paper"
) -> dict[str, tuple[int, int]]:
    """``{split: (start, stop)}`` slices of a domain's train pickle (length ``n``).

    ``fedbn``: Office train ``[0, int(0.5 m))``, val ``[n - int(0.4 m), n)``; DomainNet train
    ``[0, int(0.05 m))``, val ``[n - int(0.05 m), n)``, ``m`` = the smallest train pickle.
    ``fedfa``: Office train ``[0, int(0.6 n))``, val ``[int(0.6 n), n)`` (FedFA Table 11);
    DomainNet train ``[0, int(0.32 n))`` (FedFA Table 12; ``fedfa_train="paper"``) or
    ``[0, int(0.8 * 0.6 * n))`` (``"released"``), val ``[n - int(0.2 n), n)``.
    ``fedrdn`` (Office only): FedRDN's Table 6, train ``[0, int(0.6 n))``, val
    ``[int(0.6 n), n)``.
    """
    if split == "fedrdn":
        if dataset != "office-caltech10":
            raise ConfigError(
                f"config key 'dataset.split': 'fedrdn' (FedRDN's Table 6) is defined for "
                f"office-caltech10 only, not {dataset}; use 'fedbn' or 'fedfa'"
            )
        cut = int(0.6 * n)
        return {"train": (0, cut), "val": (cut, n)}
    if split == "fedbn":
        if dataset == "office-caltech10":
            n_train, n_val = int(min_len * 0.5), int(min_len * 0.4)
        else:
            n_train = n_val = int(min_len * 0.05)
        return {"train": (0, n_train), "val": (n - n_val, n)}
    if dataset == "office-caltech10":
        cut = int(0.6 * n)
        return {"train": (0, cut), "val": (cut, n)}
    n_train = int(0.32 * n) if fedfa_train == "paper" else int(0.8 * 0.6 * n)
    return {"train": (0, n_train), "val": (n - int(0.2 * n), n)}


SPLIT_RULES = {
    ("office-caltech10", "fedbn"): (
        "FedBN: train = first int(0.5 m), val = last int(0.4 m) of each train pickle "
        "(m = smallest train pickle of the loaded domains); test = test pickle"
    ),
    ("domainnet", "fedbn"): (
        "FedBN: train = first int(0.05 m), val = last int(0.05 m) of each train pickle "
        "(m = smallest train pickle of the loaded domains); test = test pickle"
    ),
    ("office-caltech10", "fedfa"): (
        "FedFA: train = first int(0.6 n), val = the rest of the domain's train pickle; "
        "test = test pickle"
    ),
    ("office-caltech10", "fedrdn"): (
        "FedRDN (Table 6): train = first int(0.6 n), val = the rest of the domain's train "
        "pickle; test = test pickle"
    ),
    ("domainnet", "fedfa"): (
        "FedFA (Table 12): train = first int(0.32 n), val = last int(0.2 n) of the domain's "
        "train pickle; test = test pickle"
    ),
}
#: DomainNet under split=fedfa with fedfa_train=released
DOMAINNET_FEDFA_RELEASED = (
    "FedFA (released code, train_ratio 0.6): train = first int(0.8 * 0.6 n), val = last "
    "int(0.2 n) of the domain's train pickle; test = test pickle"
)


def _domain_splits(
    params: PickleParams, d: str, lists: dict[str, tuple], base: Path, min_len: int
) -> dict[str, SplitSource]:
    """Domain ``d``'s train/val (cut from its train pickle by ``dataset.split``'s rule) and
    test (its test pickle) files, each file labelled with its pickle entry."""
    spec = params.SPEC
    splits: dict[str, SplitSource] = {}
    train_pkl, rel, y = lists["train"]
    fedfa_train = params.fedfa_train if isinstance(params, DomainNetParams) else "paper"
    bounds = split_bounds(spec.name, params.split, len(y), min_len, fedfa_train)
    for split, (start, stop) in bounds.items():
        if stop - start < 1:
            raise DataError(
                f"{spec.name} {d}: the {params.split} rule leaves the {split} split empty "
                f"({len(y)} entries in {train_pkl}, smallest train pickle {min_len}); "
                f"these pickles are too small for it"
            )
        splits[split] = SplitSource(
            [base / p for p in rel[start:stop]],
            y[start:stop].copy(),
            [f"{train_pkl}, entry {i}" for i in range(start, stop)],
        )
    test_pkl, rel_t, y_t = lists["test"]
    splits["test"] = SplitSource(
        [base / p for p in rel_t], y_t, [f"{test_pkl}, entry {i}" for i in range(len(y_t))]
    )
    return splits


def load_pickled_federation(params: PickleParams, progress: bool = True) -> Federation:
    """The federation of FedBN's path pickles (``office-caltech10``, ``domainnet``)."""
    params.validate()
    spec = params.SPEC
    root = require_root(params.root, spec.name, spec.tree)
    domains = list(params.domains)
    folder = _pickle_folder(root, spec, domains)
    base = folder.parent
    lists = {}
    for d in domains:
        lists[d] = {}
        for which in ("train", "test"):
            path = require_file(folder / f"{d}_{which}.pkl", spec.name, spec.tree)
            lists[d][which] = (path, *_read_paths(path, spec))
    min_len = min(len(lists[d]["train"][2]) for d in domains)
    store = cache_root(params.cache, params.cache_dir)
    clients, available, cache_info = [], {}, {}
    budget = MemoryBudget()  # one for the whole federation (core/images.py)
    for d in domains:
        splits = _domain_splits(params, d, lists[d], base, min_len)
        available[d] = {s: len(src) for s, src in splits.items()}
        for split in SPLITS:
            tag = f"{spec.name}/{d}/{split}/cap"
            splits[split] = cap_split(splits[split], params.max_per_split, params.seed, tag)
        fix = f"restore it (paths in the pickles are relative to {base})"
        client, cache_info[d] = materialize_client(
            spec.name, ClientSource(d, splits), params.size, "fedbn", store, fix, progress,
            budget=budget,
        )  # fmt: skip
        clients.append(client)
    shape = (3, params.size, params.size)
    fed = Federation(spec.name, clients, list(spec.classes), shape, task="classification")
    fed.info = {
        "root": str(root),
        "pickles": str(folder),
        "split_rule": params.split,
        "split": (
            DOMAINNET_FEDFA_RELEASED
            if isinstance(params, DomainNetParams)
            and params.split == "fedfa"
            and params.fedfa_train == "released"
            else SPLIT_RULES[(spec.name, params.split)]
        ),
        "min_train_pickle": min_len,
        "train_pickle_sizes": {d: len(lists[d]["train"][2]) for d in domains},
        **capped_federation_info(
            fed, available, (params.max_per_split, params.seed, params.size),
            "FedBN's: 3-band images kept, others convert('L') copied to 3 channels; "
            "antialiased bilinear resize, rounded to 8 bits; [0, 1], no mean/std",
            cache_info if store is not None else None,
            differences="the released code's train-time random horizontal flip and rotation "
            "(+-30 deg) are not baked in (add an augment)",
        ),
    }  # fmt: skip
    return fed


def load_office(params: OfficeParams, *, progress: bool = True) -> Federation:
    """The ``office-caltech10`` federation (FedBN's pickles; module docstring)."""
    return load_pickled_federation(params, progress)


def load_domainnet(params: DomainNetParams, *, progress: bool = True) -> Federation:
    """The ``domainnet`` federation (FedBN's pickles; module docstring)."""
    return load_pickled_federation(params, progress)


# fmt: off
#: this module's datasets (the dataset contract: :mod:`fedshift.core.datasets`)
DIGITS5_DATASET, OFFICE_CALTECH10_DATASET, DOMAIN_NET_DATASET = (
    Dataset("digits5", Digits5Params, "classification", load_digits5,
            "Digits-5 in FedBN's layout (your MNIST, SVHN, USPS, SynthDigits, MNIST_M pickles)"),
    Dataset("office-caltech10", OfficeParams, "classification", load_office,
            "Office-Caltech-10 in FedBN's layout "
            "(amazon, caltech, dslr, webcam; your pickles + images)"),
    Dataset("domainnet", DomainNetParams, "classification", load_domainnet,
            "DomainNet's 10-class subset in FedBN's layout (six domains; your pickles + images)"),
)
# fmt: on
