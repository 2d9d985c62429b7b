"""``arrays``: your own numpy arrays, one set per site (one client per site), from files or
given in Python (``fedshift.run(config, federation={...})``).

Files (nothing is downloaded; ``dataset.root`` is the folder you keep)::

    <dataset.root>/
      <site>.npz               arrays x, y and optionally split
      <site>/x.npy  y.npy  [split.npy]      (the same, one .npy per array)

In Python, ``federation`` maps each site name to ``(x, y)``, to ``{"x": x, "y": y,
"split": split}`` or to ``{"train": (x, y), "val": (x, y), "test": (x, y)}``; numpy arrays or
torch tensors. Both go through the same checks and conversion (:func:`build_federation`).

* **Clients**: the sites in sorted order (``dataset.sites`` picks and orders them; in Python:
  the mapping's order), named as :mod:`fedshift.data.common.sites` says.
* **x**: ``(N, H, W)`` (one channel) or ``(N, C, H, W)`` / ``(N, H, W, C)``. With
  ``layout=auto`` (default) the channel axis is the one of size <= 4 (1 gray, 3 RGB, or up to
  4 e.g. MRI sequences) when exactly one of axes 1 and 3 is; otherwise set
  ``layout=nchw|nhwc``. Values: uint8 / 255, uint16 / 65535, or float already in [0, 1]
  (NaN, infinity or values outside [0, 1] are an error naming the site: scale them
  yourself, fedshift does not guess a normalisation).
* **Channels**: ``channels=null`` keeps the sites' channel count; sites with 1 channel are
  copied to 3 when the others have 3 (any other mix is an error). ``channels=1`` turns RGB
  into luma (0.299 R + 0.587 G + 0.114 B); ``channels=3`` copies gray to 3 channels.
* **y**: integer class indices ``(N,)`` for ``task=classification`` (default) or label maps
  ``(N, H, W)`` (the size of x) for ``task=segmentation`` (class 0 the background).
  Labels must be >= 0 and below the number of classes: ``len(classes)`` when ``classes`` is
  set, else the largest label + 1 (names "0", "1", ...; ``background`` for 0 in
  segmentation).
* **Size**: ``size=null`` keeps the images' size (every site must have the same); an integer
  resizes images (antialiased bilinear) and label maps (nearest) to ``size x size``.
* **Splits**: ``split`` (``"train"``/``"val"``/``"test"`` or 0/1/2 per example, or the
  Python form with three entries) is used as given; without it, each site is split with
  ``fractions`` = [0.64, 0.16, 0.2] and ``seed``: per class for classification (as
  ``folders``), a plain permutation for segmentation. ``max_per_split`` then subsamples
  each split (class-stratified for classification). An empty split is an error.
* **Fingerprint**: :func:`fingerprint` is the sha256 of every site's name and arrays as given
  (dtype, shape, bytes). ``fedshift.run(federation=...)`` records it as
  ``dataset.fingerprint`` with ``dataset.source=python`` in the run's config (and with it in
  ``summary.json``); loading with ``fingerprint`` set checks the arrays against it, so a
  resumed run (``fedshift.resume(run_dir, federation=...)``) trains on the same data or
  fails naming the difference.
"""

from __future__ import annotations

import hashlib
import os
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from fedshift.core.datasets import MAX_CLASSES, TASK_FROM_PARAMS, Dataset
from fedshift.core.errors import ConfigError, DataError, MissingSourceError
from fedshift.core.federation import SPLITS, ClientData, Federation, Split
from fedshift.core.memory import check_fits
from fedshift.data.common.checks import (
    check_fractions,
    check_root_key,
    check_size,
    require_root,
)
from fedshift.data.common.headers import (
    ArrayHeader,
    array_bytes,
    npy_headers,
    open_regular,
    require_regular,
)
from fedshift.data.common.images import resize_images, resize_labels
from fedshift.data.common.sampling import (
    permutation_cut,
    stratified_cut,
    stratified_subsample,
    uniform_subsample,
)
from fedshift.data.common.seeding import seeded_rng
from fedshift.data.common.sites import check_sites_key, client_names
from fedshift.data.common.split_lists import check_split_keys

__all__ = [
    "ARRAYS_DATASET",
    "ArraysParams",
    "SiteArrays",
    "build_federation",
    "fingerprint",
    "load_arrays",
    "read_mapping",
]

NAME = "arrays"
TREE = """\
<dataset.root>/
  <site>.npz                    arrays x, y, optional split
  <site>/x.npy y.npy [split.npy]   (the same as .npy files)"""
SPLIT_CODES = {"train": 0, "val": 1, "test": 2}
LUMA = (0.299, 0.587, 0.114)
PYTHON_FIX = (
    "this run's arrays were given in Python (fedshift.run(config, federation=...)) and are "
    "not on disk; resume or rebuild it in Python with the same arrays: "
    "fedshift.resume(run_dir, federation=...) or fedshift.load_run(run_dir)."
    "rebuild(federation=...); export its model with fedshift.export_model(run_dir, out, "
    "federation=...)"
)


@dataclass
class ArraysParams:
    """The ``dataset.*`` keys of ``arrays``."""

    root: str | None = None  # folder of <site>.npz / <site>/x.npy; null for source=python
    sites: list[str] | None = None  # site names, in client order; None: all, sorted
    task: Literal["classification", "segmentation"] = "classification"  # y (N,) or (N, H, W)
    layout: Literal["auto", "nchw", "nhwc"] = "auto"  # where x's channel axis is
    channels: int | None = None  # None: as given (1 copied to 3 beside RGB sites); 1 or 3
    size: int | None = None  # None: keep (all sites the same); else resize to size x size
    classes: list[str] | None = None  # class names (their count bounds the labels)
    fractions: list[float] = field(default_factory=lambda: [0.64, 0.16, 0.2])
    seed: int = 0  # the fraction split and the subsample
    max_per_split: int | None = None  # per site and split, subsample; None = all
    source: Literal["files", "python"] = "files"  # python: given to fedshift.run(federation=)
    fingerprint: str | None = None  # sha256 of the arrays; checked when set

    def validate(self, prefix: str = "dataset") -> None:
        """Raise :class:`ConfigError` naming the key for a value the loader cannot honour."""
        check_root_key(self.root, f"{prefix}.root")
        check_sites_key(self.sites, f"{prefix}.sites")
        if self.channels is not None and self.channels not in (1, 3):
            raise ConfigError(f"config key '{prefix}.channels' must be null, 1 or 3")
        if self.size is not None:
            check_size(self.size, f"{prefix}.size")
        if self.classes is not None and (
            not self.classes or len(set(self.classes)) != len(self.classes)
        ):
            raise ConfigError(f"config key '{prefix}.classes' must be distinct names")
        check_split_keys(self, prefix)
        if self.source == "python" and self.root is not None:
            raise ConfigError(
                f"config key '{prefix}.root' and {prefix}.source=python: the arrays come from "
                "Python (fedshift.run(federation=...)), not from a folder; drop one of them"
            )
        fp = self.fingerprint
        if fp is not None and (len(fp) != 64 or any(c not in "0123456789abcdef" for c in fp)):
            raise ConfigError(f"config key '{prefix}.fingerprint' must be a sha256 hex digest")


# --------------------------------------------------------------------------------------------
# reading: files and Python mappings -> SiteArrays
# --------------------------------------------------------------------------------------------


@dataclass
class SiteArrays:
    """One site's arrays as given, and where they come from (for errors)."""

    name: str
    x: np.ndarray
    y: np.ndarray
    split: np.ndarray | None
    where: str


def _as_numpy(value: Any, what: str) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy()
    if isinstance(value, np.ndarray):
        return value
    raise DataError(f"{what}: expected a numpy array or a torch tensor, got {type(value).__name__}")


def _npz(path: Path) -> dict[str, np.ndarray]:
    try:
        with open_regular(path, "an array file") as fh, np.load(fh, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise DataError(
            f"{path}: not a readable .npz of plain arrays ({exc}); save it with "
            "np.savez(path, x=..., y=...) (object arrays are refused: they would be unpickled)"
        ) from exc


def _npy(path: Path) -> np.ndarray:
    try:
        with open_regular(path, "an array file") as fh:
            return np.load(fh, allow_pickle=False)
    except (OSError, ValueError, EOFError) as exc:
        raise DataError(
            f"{path}: not a readable .npy of a plain array ({exc}); save it with np.save"
        ) from exc


def _site_headers(path: Path) -> dict[str, ArrayHeader]:
    """The arrays of a site (its ``.npz``, or the ``.npy`` files of its folder) as their
    headers state them; nothing is loaded."""
    if path.suffix == ".npz" and not path.is_dir():
        heads = npy_headers(path)
        missing = [k for k in ("x", "y") if k not in heads]
        extra = sorted(set(heads) - {"x", "y", "split"})
        if missing or extra:
            raise DataError(
                f"{path} holds the arrays {sorted(heads)}; it needs x and y (and may hold "
                f"split), nothing else{f': rename or drop {extra}' if extra else ''}"
            )
        return heads
    heads = {}
    for key in ("x", "y", "split"):
        file = path / f"{key}.npy"
        if os.path.lexists(file):
            heads[key] = npy_headers(file)[""]
    if "y" not in heads:
        raise DataError(f"{path / 'x.npy'} has no {path / 'y.npy'}; add the labels")
    return heads


def check_memory(sites: dict[str, Path]) -> None:
    """Refuse, before anything is loaded, arrays that would not fit in memory: every site's
    arrays as their headers state them, plus the float32 copy of each ``x`` the loader
    makes (:mod:`fedshift.data.common.headers`)."""
    total, largest, shown = 0, -1, ""
    for path in sites.values():
        heads = _site_headers(path)
        need = sum(h.nbytes for h in heads.values())
        if "x" in heads:
            need += array_bytes(heads["x"].shape, np.float32)  # x in [0, 1] as float32
        total += need
        if need > largest:
            largest = need
            shown = f"{path}: " + ", ".join(f"{k} {h}" for k, h in heads.items())
    check_fits(
        total,
        f"dataset {NAME!r}: the arrays of {len(sites)} site(s) (largest: {shown})",
        "load fewer sites (dataset.sites), store x as uint8 rather than float, or use a "
        "machine with more memory",
    )


def read_site_files(root: Path, sites: list[str] | None) -> list[SiteArrays]:
    """The sites of ``root`` (module docstring), in ``sites`` order or sorted."""
    found: dict[str, Path] = {}
    for p in sorted(root.iterdir()):
        if p.name.startswith("."):
            continue
        if p.suffix == ".npz" and not p.is_dir():
            require_regular(p, "an array file")  # a FIFO would block np.load: refused by type
        name = p.name[:-4] if p.is_file() and p.suffix == ".npz" else p.name if p.is_dir() else None
        if name is None or (p.is_dir() and not os.path.lexists(p / "x.npy")):
            continue
        if name in found:
            raise DataError(f"{found[name]} and {p} are both site {name!r}; keep one of them")
        found[name] = p
    if not found:
        raise MissingSourceError(
            f"dataset.root={str(root)!r} holds no <site>.npz and no <site>/x.npy. Expected "
            f"layout:\n{TREE}"
        )
    names = sorted(found) if sites is None else list(sites)
    for name in names:
        if name not in found:
            raise MissingSourceError(
                f"site {name!r} (dataset.sites) is missing: no {root / name}.npz and no "
                f"{root / name}/x.npy; add it or drop it from dataset.sites"
            )
    check_memory({name: found[name] for name in names})  # from the headers, before loading
    out = []
    for name in names:
        path = found[name]
        if path.is_file():
            arrays = _npz(path)
            out.append(SiteArrays(name, arrays["x"], arrays["y"], arrays.get("split"), str(path)))
        else:
            split = _npy(path / "split.npy") if os.path.lexists(path / "split.npy") else None
            x, y = _npy(path / "x.npy"), _npy(path / "y.npy")
            out.append(SiteArrays(name, x, y, split, str(path)))
    return out


def read_mapping(federation: object) -> list[SiteArrays]:
    """The sites of a Python mapping (module docstring), in its order."""
    if not isinstance(federation, Mapping) or not federation:
        raise DataError(
            "federation=: expected a non-empty mapping of site name -> (x, y), "
            f"{{'x': x, 'y': y, 'split': split}} or {{'train': (x, y), 'val': ..., 'test': "
            f"...}}; got {type(federation).__name__}"
        )
    out = []
    for name, value in federation.items():
        where = f"federation[{name!r}]"
        if not isinstance(name, str):
            raise DataError(f"{where}: site names must be strings")
        if isinstance(value, Mapping) and set(value) == set(SPLITS):
            xs, ys, codes = [], [], []
            for split in SPLITS:
                pair = value[split]
                if not isinstance(pair, tuple | list) or len(pair) != 2:
                    raise DataError(f"{where}[{split!r}]: expected a pair (x, y)")
                xs.append(_as_numpy(pair[0], f"{where}[{split!r}][0]"))
                ys.append(_as_numpy(pair[1], f"{where}[{split!r}][1]"))
                codes.append(np.full(len(ys[-1]), SPLIT_CODES[split], dtype=np.int64))
            try:
                x, y = np.concatenate(xs), np.concatenate(ys)
            except ValueError as exc:
                raise DataError(f"{where}: the splits' arrays do not stack ({exc})") from exc
            out.append(SiteArrays(name, x, y, np.concatenate(codes), where))
        elif isinstance(value, Mapping) and {"x", "y"} <= set(value) <= {"x", "y", "split"}:
            split = value.get("split")
            split = None if split is None else _as_numpy(split, f"{where}['split']")
            x, y = _as_numpy(value["x"], f"{where}['x']"), _as_numpy(value["y"], f"{where}['y']")
            out.append(SiteArrays(name, x, y, split, where))
        elif isinstance(value, tuple | list) and len(value) == 2:
            x, y = _as_numpy(value[0], f"{where}[0]"), _as_numpy(value[1], f"{where}[1]")
            out.append(SiteArrays(name, x, y, None, where))
        else:
            raise DataError(
                f"{where}: expected (x, y), {{'x', 'y'[, 'split']}} or {{'train', 'val', "
                f"'test'}} of (x, y) pairs; got {type(value).__name__}"
                + (f" with keys {sorted(map(str, value))}" if isinstance(value, Mapping) else "")
            )
    return out


def fingerprint(sites: list[SiteArrays]) -> str:
    """sha256 of every site's name and arrays as given (dtype, shape, bytes)."""
    h = hashlib.sha256()
    for site in sites:
        h.update(f"site {site.name}\n".encode())
        for key, a in (("x", site.x), ("y", site.y), ("split", site.split)):
            if a is None:
                h.update(f"{key} none\n".encode())
                continue
            a = np.ascontiguousarray(a)
            h.update(f"{key} {a.dtype.str} {a.shape}\n".encode())
            h.update(a.data)
    return h.hexdigest()


# --------------------------------------------------------------------------------------------
# checking and converting -> Federation
# --------------------------------------------------------------------------------------------


def _channels_first(site: SiteArrays, layout: str) -> np.ndarray:
    """x as ``(N, C, H, W)`` (module docstring's layout rule)."""
    x = site.x
    if x.ndim == 3:
        return x[:, None]
    if x.ndim != 4:
        raise DataError(
            f"{site.where}: x has shape {x.shape}; expected (N, H, W), (N, C, H, W) or (N, H, W, C)"
        )
    if layout == "auto":
        first, last = x.shape[1] <= 4, x.shape[3] <= 4
        if first == last:
            raise DataError(
                f"{site.where}: x has shape {x.shape}: cannot tell which axis holds the "
                "channels (axis 1 or 3, the one of size <= 4); set dataset.layout=nchw or nhwc"
            )
        layout = "nchw" if first else "nhwc"
    return x if layout == "nchw" else x.transpose(0, 3, 1, 2)


def _to_float(site: SiteArrays, x: np.ndarray) -> torch.Tensor:
    """x in [0, 1] as float32 (uint8 / 255, uint16 / 65535, float checked)."""
    if x.dtype == np.uint8:
        return torch.from_numpy(np.ascontiguousarray(x)).float().div_(255.0)
    if x.dtype == np.uint16:
        return torch.from_numpy(x.astype(np.float32)).div_(65535.0)
    if x.dtype.kind == "f":
        out = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))
        if out.numel() and (not bool(torch.isfinite(out).all()) or out.min() < 0 or out.max() > 1):
            raise DataError(
                f"{site.where}: x is float with values outside [0, 1] (or NaN / infinite: "
                f"{float(np.nanmin(x))} .. {float(np.nanmax(x))}); scale the images to [0, 1] "
                "(e.g. x / 255), or give uint8"
            )
        return out
    raise DataError(f"{site.where}: x has dtype {x.dtype}; give uint8, uint16 or float in [0, 1]")


def _labels(site: SiteArrays, task: str, hw: tuple[int, int]) -> np.ndarray:
    y = site.y
    n = site.x.shape[0]
    want = (n,) if task == "classification" else (n, *hw)
    if y.shape != want:
        other = "segmentation" if task == "classification" else "classification"
        fits = y.shape == ((n, *hw) if task == "classification" else (n,))
        hint = f"; for {other} labels set dataset.task={other}" if fits else ""
        raise DataError(
            f"{site.where}: y has shape {y.shape}, but dataset.task={task} with x of shape "
            f"{site.x.shape} needs {want}{hint}"
        )
    if y.dtype.kind not in "iu":
        raise DataError(f"{site.where}: y has dtype {y.dtype}; labels must be integers")
    if y.size and y.min() < 0:
        raise DataError(f"{site.where}: y holds the negative label {int(y.min())}")
    return y.astype(np.int64)


def _split_codes(site: SiteArrays) -> np.ndarray | None:
    split = site.split
    if split is None:
        return None
    n = site.x.shape[0]
    if split.shape != (n,):
        raise DataError(f"{site.where}: split has shape {split.shape}; it needs ({n},)")
    if split.dtype.kind in "US":
        names = split.astype(str)
        bad = sorted(set(names.tolist()) - set(SPLIT_CODES))
        codes = np.asarray([SPLIT_CODES.get(v, -1) for v in names.tolist()], dtype=np.int64)
    elif split.dtype.kind in "iu":
        codes = split.astype(np.int64)
        bad = sorted(set(codes.tolist()) - {0, 1, 2})
    else:
        bad = [f"dtype {split.dtype}"]
    if bad:
        raise DataError(
            f"{site.where}: split holds {bad[:5]}; each entry must be 'train', 'val', 'test' "
            "or 0, 1, 2"
        )
    return codes


@dataclass
class _Site:
    name: str
    where: str
    x: torch.Tensor  # (N, C, H, W) float in [0, 1]
    y: np.ndarray  # int64
    codes: np.ndarray | None


def _prepare(sites: list[SiteArrays], params: ArraysParams) -> list[_Site]:
    names = client_names([s.name for s in sites], "the arrays' sites")
    out = []
    for client, site in zip(names, sites, strict=True):
        x = _channels_first(site, params.layout)
        y = _labels(site, params.task, (x.shape[2], x.shape[3]))
        codes = _split_codes(site)
        out.append(_Site(client, site.where, _to_float(site, x), y, codes))
    channels = {s.x.shape[1] for s in out}
    want = params.channels
    if want is None:
        want = 3 if channels == {1, 3} else channels.pop() if len(channels) == 1 else None
        if want is None:
            raise DataError(
                f"the sites' images have {sorted(channels)} channels; they must agree (1 and 3 "
                "may mix: gray is copied to 3), or set dataset.channels=1 or 3"
            )
    for s in out:
        c = s.x.shape[1]
        if c == want:
            continue
        if c == 1 and want == 3:
            s.x = s.x.expand(-1, 3, -1, -1).contiguous()
        elif c == 3 and want == 1:
            w = torch.tensor(LUMA).view(1, 3, 1, 1)
            s.x = (s.x * w).sum(dim=1, keepdim=True)
        else:
            raise DataError(
                f"{s.where}: {c} channels cannot become dataset.channels={want} (only 1 <-> 3)"
            )
    if params.size is None:
        sizes = {tuple(s.x.shape[2:]) for s in out}
        if len(sizes) > 1:
            raise DataError(
                f"the sites' images have different sizes {sorted(sizes)}; set dataset.size to "
                "resize them all"
            )
    else:
        for s in out:
            s.x = resize_images(s.x, params.size)
            if params.task == "segmentation":
                s.y = resize_labels(torch.from_numpy(s.y), params.size).numpy()
    return out


def _splits(site: _Site, params: ArraysParams) -> dict[str, np.ndarray]:
    if site.codes is not None:
        return {s: np.flatnonzero(site.codes == code) for s, code in SPLIT_CODES.items()}
    rng = seeded_rng(params.seed, f"{NAME}/{site.name}/split")
    fractions = check_fractions(params.fractions)
    if params.task == "classification":
        return stratified_cut(site.y, fractions, rng)
    return permutation_cut(len(site.y), fractions, rng)


def build_federation(sites: list[SiteArrays], params: ArraysParams) -> Federation:
    """The federation of the given sites' arrays (module docstring), checked against
    ``params.fingerprint`` when set."""
    params.validate()
    digest = fingerprint(sites)
    if params.fingerprint is not None and digest != params.fingerprint:
        raise DataError(
            f"the arrays ({', '.join(s.where for s in sites)}) are not the ones this run was "
            f"started with: their sha256 is {digest}, dataset.fingerprint is "
            f"{params.fingerprint}; give the same arrays (same sites, order, dtypes, shapes "
            "and values), or start a new run"
        )
    prepared = _prepare(sites, params)
    top = max(int(s.y.max()) if s.y.size else -1 for s in prepared)
    if params.classes is None and top >= MAX_CLASSES:  # not a class list of 10**12 names
        where = next(s.where for s in prepared if s.y.size and s.y.max() == top)
        raise DataError(
            f"{where}: y holds the label {top}; without dataset.classes the classes are the "
            f"labels 0..{top}, and more than {MAX_CLASSES} classes are refused: labels are "
            "class indices, so renumber them 0..C-1 (or name the classes in dataset.classes)"
        )
    if params.classes is not None:
        classes = list(params.classes)
        if top >= len(classes):
            where = next(s.where for s in prepared if s.y.size and s.y.max() == top)
            raise DataError(
                f"{where}: y holds the label {top}, but dataset.classes names {len(classes)} "
                f"classes (labels 0..{len(classes) - 1})"
            )
    else:
        classes = [str(i) for i in range(max(top + 1, 2))]
        if params.task == "segmentation":
            classes[0] = "background"
    clients, available = [], {}
    for site in prepared:
        parts = _splits(site, params)
        available[site.name] = {s: len(v) for s, v in parts.items()}
        splits = {}
        for split, idx in parts.items():
            if len(idx) == 0:
                how = "its split array" if site.codes is not None else "dataset.fractions"
                raise DataError(
                    f"{site.where}: site {site.name!r} ({len(site.y)} examples) gets an empty "
                    f"{split} split from {how}; add examples or change the split"
                )
            rng = seeded_rng(params.seed, f"{NAME}/{site.name}/{split}/cap")
            if params.task == "classification":
                keep = stratified_subsample(site.y[idx], params.max_per_split, rng)
            else:
                keep = uniform_subsample(len(idx), params.max_per_split, rng)
            idx = idx[keep]
            t = torch.from_numpy(idx)
            splits[split] = Split(site.x[t].contiguous(), torch.from_numpy(site.y[idx]))
        clients.append(ClientData(site.name, splits["train"], splits["val"], splits["test"]))
    x0 = prepared[0].x
    shape = (int(x0.shape[1]), int(x0.shape[2]), int(x0.shape[3]))
    fed = Federation(NAME, clients, classes, shape, task=params.task)
    fed.info = {
        "source": params.source,
        "sites": {s.name: s.where for s in prepared},
        "fingerprint": digest,
        "counts": fed.counts(),
        "available": available,
        "split": {
            s.name: "given" if s.codes is not None else f"fractions {list(params.fractions)}"
            for s in prepared
        },
        "channels": shape[0],
        "size": shape[1:],
    }
    return fed


def load_arrays(params: ArraysParams) -> Federation:
    """The ``arrays`` federation from ``dataset.root`` (module docstring)."""
    params.validate()
    if params.source == "python":
        raise DataError(f"dataset.source=python: {PYTHON_FIX}")
    root = require_root(params.root, NAME, TREE)
    return build_federation(read_site_files(root, params.sites), params)


#: the ``arrays`` dataset (the dataset contract: :mod:`fedshift.core.datasets`)
ARRAYS_DATASET = Dataset(
    "arrays", ArraysParams, TASK_FROM_PARAMS, load_arrays,
    "your numpy arrays: <root>/<site>.npz (x, y[, split]) or fedshift.run(federation=...)",
)  # fmt: skip
