"""``fashion-mnist``: Zalando's Fashion-MNIST (Xiao et al., 2017) as one fedshift client.

Real data from Debian's ``dataset-fashion-mnist`` package: the four IDX files
``{train,t10k}-{images-idx3,labels-idx1}-ubyte.gz`` (60,000 training and 10,000 test images,
28x28 grayscale, 10 classes). They are looked up in ``dataset.data_dir`` if set, else in
``/usr/share/datasets/fashion-mnist`` (the installed package), then in
``$FEDSHIFT_CACHE/fashion-mnist`` (where ``fedshift data fetch fashion-mnist`` puts them,
via ``apt-get download`` + ``dpkg-deb``, without installing anything).

The federation has one client, ``fashion-mnist``: a class-stratified ``train_size`` pool and a
disjoint ``val_size`` pool drawn from the 60k training images, and a stratified ``test_size``
set from the 10k test images. It is meant to be re-split by a label-skew ``partition``
(``classes``, ``dirichlet``, ``one-class``...). Nothing is cached but the package's own files;
the splits are drawn at load time from ``dataset.seed``.

Images are float ``[0, 1]`` tensors of shape ``(N, 3, 28, 28)``: the gray channel is copied to
three, as fedshift's digits benchmark does (FedBN's convention), so every fedshift 28x28 model
(``cnn``, ``digitmodel``, ``lenet5``, all built for 3x28x28 inputs), the per-channel input
normalisation and the colour-statistics augments (FedRDN, amplitude normalisation) run on it
unchanged.
"""

from __future__ import annotations

import gzip
import os
import tempfile
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from fedshift.core.bounds import bounded
from fedshift.core.datasets import Dataset
from fedshift.core.errors import DataError, MissingSourceError
from fedshift.core.federation import ClientData, Federation, Split
from fedshift.core.files import save_figure
from fedshift.data.common import cache
from fedshift.data.common.debian import apt_download, extract_deb_members, require_tools
from fedshift.data.common.sampling import SIZE_KEYS, class_quota, split_indices
from fedshift.data.common.seeding import seeded_rng

NAME = "fashion-mnist"
CLASSES = [
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
]
INPUT_SHAPE = (3, 28, 28)
SIDE = 28
PACKAGE = "dataset-fashion-mnist"
SYSTEM_DIR = Path("/usr/share/datasets/fashion-mnist")
MEMBER_DIR = "./usr/share/datasets/fashion-mnist"
INSTALL_CMD = f"sudo apt-get install {PACKAGE}"
FETCH_CMD = f"fedshift data fetch {NAME}"
#: (images file, labels file) of the two source sets
FILES = {
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}
ALL_FILES = tuple(f for pair in FILES.values() for f in pair)
IDX_IMAGES = 0x00000803  # unsigned bytes, 3 dimensions
IDX_LABELS = 0x00000801  # unsigned bytes, 1 dimension

__all__ = [
    "FASHION_MNIST_DATASET",
    "CLASSES",
    "FashionParams",
    "apt_download",
    "extract_deb_members",
    "fetch_fashion",
    "load_fashion",
    "locate_fashion",
    "read_idx",
    "show_fashion",
]


@dataclass
class FashionParams:
    """The ``dataset.*`` keys of ``fashion-mnist``."""

    train_size: int = bounded(6000, ge=1)  # drawn (stratified) from the 60k training images
    val_size: int = bounded(1000, ge=1)  # also from the 60k, disjoint from train
    test_size: int = bounded(2000, ge=1)  # from the 10k test images
    seed: int = bounded(0, ge=0)  # data seed: which images are drawn
    data_dir: str | None = None  # None: /usr/share/datasets/fashion-mnist, then the cache


# --------------------------------------------------------------------------------------------
# files
# --------------------------------------------------------------------------------------------


def cache_folder(cache_dir: Path | None = None) -> Path:
    """``<cache>/fashion-mnist`` (``$FEDSHIFT_CACHE`` or ``~/.cache/fedshift`` by default)."""
    return cache.cache_dir(cache_dir) / NAME


def _complete(folder: Path) -> bool:
    return all((folder / f).is_file() for f in ALL_FILES)


def locate_fashion(data_dir: str | Path | None = None) -> Path:
    """The folder holding the four IDX files.

    ``data_dir`` if given (only there), else the installed package's folder, else the cache.
    Raises :class:`MissingSourceError` naming the folders looked in and how to get the files.
    """
    if data_dir is not None:
        candidates = [Path(data_dir).expanduser()]
    else:
        candidates = [SYSTEM_DIR, cache_folder()]
    for folder in candidates:
        if _complete(folder):
            return folder
    looked = ", ".join(str(c) for c in candidates)
    raise MissingSourceError(
        f"Fashion-MNIST needs the files {', '.join(ALL_FILES)} and found them in none of: "
        f"{looked}. Install Debian's package with `{INSTALL_CMD}`, or fetch it into the cache "
        f"with `{FETCH_CMD}` (apt-get download + dpkg-deb, nothing installed)"
        + (", or fix dataset.data_dir" if data_dir is not None else "")
    )


def read_idx(path: Path, magic: int) -> np.ndarray:
    """Read a gzipped IDX file of unsigned bytes; ``magic`` is the expected magic number.

    Returns ``(N, 28, 28)`` uint8 images (``IDX_IMAGES``) or ``(N,)`` uint8 labels
    (``IDX_LABELS``). Raises :class:`DataError` naming the file if it is not such a file.
    """
    path = Path(path)
    hint = f"delete it and run `{FETCH_CMD}` (or reinstall {PACKAGE})"
    try:
        with gzip.open(path, "rb") as fh:
            data = fh.read()
    except (OSError, EOFError, zlib.error) as exc:
        raise DataError(f"{path}: not a readable gzip file ({exc}); {hint}") from exc
    ndim = magic & 0xFF
    header = 4 + 4 * ndim
    if len(data) < header:
        raise DataError(f"{path}: truncated IDX header ({len(data)} bytes); {hint}")
    found = int.from_bytes(data[:4], "big")
    if found != magic:
        raise DataError(
            f"{path}: IDX magic number is 0x{found:08x}, expected 0x{magic:08x} "
            f"({'images' if magic == IDX_IMAGES else 'labels'}); {hint}"
        )
    dims = tuple(int(d) for d in np.frombuffer(data, dtype=">i4", count=ndim, offset=4))
    if magic == IDX_IMAGES and dims[1:] != (SIDE, SIDE):
        raise DataError(f"{path}: images are {dims[1]}x{dims[2]}, expected 28x28; {hint}")
    payload = np.frombuffer(data, dtype=np.uint8, offset=header)
    if payload.size != int(np.prod(dims)):
        raise DataError(
            f"{path}: header says {'x'.join(map(str, dims))} = {int(np.prod(dims))} bytes of "
            f"data but the file holds {payload.size}; {hint}"
        )
    return payload.reshape(dims)


def load_source(folder: Path, which: str) -> tuple[np.ndarray, np.ndarray]:
    """One source set (``train`` or ``test``): uint8 images ``(N, 28, 28)``, int64 labels."""
    images_file, labels_file = (Path(folder) / f for f in FILES[which])
    x = read_idx(images_file, IDX_IMAGES)
    y = read_idx(labels_file, IDX_LABELS).astype(np.int64)
    if len(x) != len(y):
        raise DataError(
            f"{images_file} has {len(x)} images but {labels_file} has {len(y)} labels; "
            f"fetch the files again with `{FETCH_CMD}`"
        )
    if len(y) and int(y.max()) >= len(CLASSES):
        raise DataError(f"{labels_file}: label {int(y.max())} is not a class 0-9")
    return x, y


# --------------------------------------------------------------------------------------------
# splits
# --------------------------------------------------------------------------------------------


def validate_params(params: FashionParams) -> None:
    """Sizes are positive integers and the seed is non-negative."""
    for key, value in (
        (SIZE_KEYS["train"], params.train_size),
        (SIZE_KEYS["val"], params.val_size),
        (SIZE_KEYS["test"], params.test_size),
        ("dataset.seed", params.seed),
    ):
        low = 0 if key == "dataset.seed" else 1
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise DataError(f"{key} must be an integer >= {low}, got {value!r}")


def _check_capacity(y: np.ndarray, sizes: dict[str, int], source: str) -> None:
    have = np.bincount(y, minlength=len(CLASSES))
    need = sum(class_quota(n) for n in sizes.values())
    short = np.flatnonzero(need > have)
    if short.size:
        c = int(short[0])
        keys = " + ".join(f"{SIZE_KEYS[s]}={n}" for s, n in sizes.items())
        raise DataError(
            f"Fashion-MNIST's {source} set has {int(have[c])} images of class {c} "
            f"({CLASSES[c]}), but {keys} needs {int(need[c])} per class (stratified); "
            f"lower them to total at most {int(have.min()) * len(CLASSES)}"
        )


def _to_split(x: np.ndarray, y: np.ndarray, idx: np.ndarray) -> Split:
    """Gray uint8 images to float ``[0, 1]``, the channel copied to three."""
    gray = torch.from_numpy(x[idx]).to(torch.float32).div_(255.0)
    return Split(gray.unsqueeze(1).repeat(1, 3, 1, 1), torch.from_numpy(y[idx]))


def load_fashion(params: FashionParams) -> Federation:
    """The ``fashion-mnist`` federation: one client with stratified train/val/test splits."""
    validate_params(params)
    folder = locate_fashion(params.data_dir)
    x_tr, y_tr = load_source(folder, "train")
    x_te, y_te = load_source(folder, "test")
    pool_sizes = {"train": params.train_size, "val": params.val_size}
    _check_capacity(y_tr, pool_sizes, "training (60k)")
    _check_capacity(y_te, {"test": params.test_size}, "test (10k)")
    rng_tr = seeded_rng(params.seed, f"{NAME}/train-val")
    idx_tr = split_indices(y_tr, {**pool_sizes, "test": 0}, rng_tr)
    rng_te = seeded_rng(params.seed, f"{NAME}/test")
    idx_te = split_indices(y_te, {"train": 0, "val": 0, "test": params.test_size}, rng_te)
    client = ClientData(
        NAME,
        _to_split(x_tr, y_tr, idx_tr["train"]),
        _to_split(x_tr, y_tr, idx_tr["val"]),
        _to_split(x_te, y_te, idx_te["test"]),
    )
    info = {
        "source": str(folder),
        "source_sizes": {"train": int(len(y_tr)), "test": int(len(y_te))},
        "seed": params.seed,
    }
    return Federation(NAME, [client], list(CLASSES), INPUT_SHAPE, info)


def by_hand(dest: Path) -> str:
    """How to put the files in place without apt (for error messages)."""
    return (
        f"put the four files of the Fashion-MNIST release ({', '.join(ALL_FILES)}) into "
        f"{dest}, or into a folder you name with dataset.data_dir=..."
    )


def fetch_fashion(cache_dir: Path | None = None, update: bool = False) -> Path:
    """Fetch the four Fashion-MNIST files into ``<cache>/fashion-mnist`` and return it.

    Runs ``apt-get download dataset-fashion-mnist`` (~31 MB; after ``apt-get update`` only
    when ``update``) in a temporary folder, extracts only the IDX files, checks that they
    read, moves them into place and deletes the ``.deb``. A complete folder is returned as
    is. Without apt-get, dpkg-deb or tar: a :class:`MissingSourceError` saying how to put the
    files there by hand.
    """
    dest = cache_folder(cache_dir)
    if _complete(dest):
        return dest
    require_tools(PACKAGE, by_hand(dest))
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest, prefix=".fetch-") as tmp:
        workdir = Path(tmp)
        deb = apt_download(PACKAGE, workdir, update=update)
        try:
            members = [f"{MEMBER_DIR}/{f}" for f in ALL_FILES]
            paths = extract_deb_members(deb, members, workdir)
        finally:
            deb.unlink(missing_ok=True)
        folder = paths[0].parent
        for which in FILES:
            load_source(folder, which)  # raises DataError if a file is malformed
        for path in paths:
            os.replace(path, dest / path.name)
    return dest


# --------------------------------------------------------------------------------------------
# montage
# --------------------------------------------------------------------------------------------


def show_fashion(params: FashionParams, out_png: Path, per_class: int = 10) -> dict:
    """Write a montage PNG (one row per class, training images) and return the split sizes
    and per-class counts of each split."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    if per_class < 1:
        raise DataError(f"per_class must be >= 1, got {per_class}")
    fed = load_fashion(params)
    train = fed.clients[0].train
    fig = Figure(figsize=(2.0 + 0.8 * per_class, 0.85 * len(CLASSES) + 0.3))
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(CLASSES), per_class, squeeze=False)
    labels = train.y.numpy()
    for c, name in enumerate(CLASSES):
        picks = np.flatnonzero(labels == c)[:per_class]
        for j in range(per_class):
            ax = axes[c][j]
            ax.set_xticks([])
            ax.set_yticks([])
            if j < len(picks):
                ax.imshow(train.x[picks[j], 0].numpy(), cmap="gray", vmin=0, vmax=1)
        axes[c][0].set_ylabel(name, rotation=0, ha="right", va="center", fontsize=9)
    fig.subplots_adjust(left=0.16, right=0.99, top=0.98, bottom=0.02, wspace=0.05, hspace=0.1)
    save_figure(fig, out_png)
    client = fed.clients[0]
    return {
        "source": fed.info["source"],
        "sizes": fed.counts()[NAME],
        "class_counts": {
            s: torch.bincount(client.split(s).y, minlength=len(CLASSES)).tolist()
            for s in ("train", "val", "test")
        },
    }


#: the ``fashion-mnist`` dataset (the dataset contract: :mod:`fedshift.core.datasets`)
FASHION_MNIST_DATASET = Dataset(
    "fashion-mnist", FashionParams, "classification", load_fashion,
    "Fashion-MNIST (Debian dataset-fashion-mnist), one client; re-split it with a partition",
)  # fmt: skip
