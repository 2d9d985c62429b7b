"""``camelyon17``: Camelyon17 histology patches, five hospitals, read from the user's disk.

RGB 96x96 patches of lymph-node sections (Bandi et al., IEEE TMI 2019) with a binary label
(tumour tissue in the patch centre), as packaged by WILDS (Koh et al., ICML 2021,
``camelyon17_v1.0``) and used by HarmoFL (Jiang et al., AAAI 2022, Sec. "Experiments"). One
client per hospital, ``hospital1`` .. ``hospital5``; classes ``["normal", "tumor"]``; task
classification. Nothing is downloaded: ``dataset.root`` is one of two layouts, found by
``dataset.layout="auto"`` (an error if both or neither marker file is there) or named
``"wilds"`` / ``"harmofl"``::

    WILDS                                        HarmoFL
    <dataset.root>/                              <dataset.root>/
      metadata.csv                                 data.pkl
      patches/                                     patches/
        patient_004_node_4/                          patient_004_node_4/
          patch_patient_004_node_4_x_3328_y_21792.png  ...

* **WILDS**: ``metadata.csv`` has a leading unnamed index column and (by name, any order)
  ``patient, node, x_coord, y_coord, tumor, slide, center``, plus ``split`` (unused). Row r is
  ``patches/patient_{patient:03d}_node_{node}/patch_patient_{patient:03d}_node_{node}_x_{x}_
  y_{y}.png``, label ``tumor``, hospital ``center + 1``. WILDS defines no per-hospital
  train/test for federated learning, so each hospital is split **by slide** (every patch of a
  slide stays in one split): its slides, in a seeded random order
  (``seeded_rng(seed, "camelyon17/hospital<k>/slides")``), each go to the split whose patch
  count is furthest below its target ``fractions x patches`` (ties: train, val, test), with
  ``dataset.fractions`` = [0.64, 0.16, 0.20]. A split left without a slide is an error.
* **HarmoFL**: ``data.pkl`` is a pickled dict ``{"hospital1".."hospital5": {"train": (paths,
  labels), "test": (paths, labels)}}`` of numpy arrays, paths relative to ``dataset.root``.
  As HarmoFL's ``federated/fed_train.py``: val = the last ``floor(0.2 n)`` of the pickled
  train list, train = the rest, test = the pickled test list. ``dataset.fractions`` does not
  apply (setting it is an error). The pickle is read with an unpickler that only builds numpy
  arrays and plain containers, never arbitrary objects.

Size: every patch by default (about 450,000, 12.4 GB as uint8). The patches are decoded once
into the uint8 cache (``<cache>/camelyon17/<digest>/``, :mod:`fedshift.data.common.image_files`;
``cache=false`` holds them in memory instead) and read per batch from there, so the whole set
runs without holding it in memory (it was capped at 5,000 / 1,000 / 2,000 patches per
hospital when images were float32 in memory). For quick runs, ``train_size`` / ``val_size`` /
``test_size`` cap each split of each hospital to a **class-stratified seeded subsample**
(each class keeps its share, largest-remainder rounding; generator
``camelyon17/hospital<k>/<split>``, so the test set does not move when ``train_size`` does);
``None`` (the default) keeps every patch. ``Federation.info`` records the sizes before and
after.

Images: Pillow ``convert("RGB")`` / 255 (HarmoFL's ``ToTensor``): uint8 bytes read as float32
``(N, 3, 96, 96)`` per batch.
Every patch must be 96x96 when ``dataset.size`` is None (otherwise an error naming the file);
with ``dataset.size`` set, every patch is resized to ``size x size`` (bilinear, antialiased).
HarmoFL's loader has no augmentation, so none is lost.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import torch

from fedshift.core.datasets import Dataset
from fedshift.core.errors import ConfigError, DataError, MissingSourceError
from fedshift.core.federation import Federation
from fedshift.core.images import MemoryBudget
from fedshift.data.common.checks import (
    check_cache_dir,
    check_flag,
    check_fractions,
    check_size,
    require_root,
)
from fedshift.data.common.image_files import (
    ClientSource,
    SplitSource,
    cache_root,
    materialize_client,
)
from fedshift.data.common.pickles import read_array_pickle
from fedshift.data.common.sampling import stratified_subsample
from fedshift.data.common.seeding import seeded_rng

NAME = "camelyon17"
HOSPITALS: tuple[str, ...] = tuple(f"hospital{k}" for k in range(1, 6))
CLASSES = ["normal", "tumor"]
PATCH = 96
DEFAULT_FRACTIONS = [0.64, 0.16, 0.2]
HARMOFL_VAL = 0.2
WILDS_COLUMNS = ("patient", "node", "x_coord", "y_coord", "tumor", "slide", "center")
WILDS_HEADER = ",patient,node,x_coord,y_coord,tumor,slide,center,split"
TREE = """\
WILDS (camelyon17_v1.0):            HarmoFL:
<dataset.root>/                     <dataset.root>/
  metadata.csv                        data.pkl
  patches/                            patches/
    patient_004_node_4/                 patient_004_node_4/
      patch_patient_004_node_4_x_3328_y_21792.png ..."""
SIZE_KEYS = {"train": "train_size", "val": "val_size", "test": "test_size"}

__all__ = [
    "CAMELYON17_DATASET",
    "CLASSES",
    "HOSPITALS",
    "CamelyonParams",
    "detect_layout",
    "load_camelyon",
    "read_harmofl_pickle",
    "read_wilds_metadata",
    "split_by_slide",
    "wilds_path",
]


@dataclass
class CamelyonParams:
    """The ``dataset.*`` keys of ``camelyon17``."""

    root: str | None = None  # the camelyon17_v1.0 folder, or HarmoFL's data/camelyon17
    layout: Literal["auto", "wilds", "harmofl"] = "auto"
    fractions: list[float] = field(default_factory=lambda: list(DEFAULT_FRACTIONS))  # WILDS
    seed: int = 0  # slide split (WILDS) and the subsamples
    train_size: int | None = None  # per hospital, stratified subsample; None = all
    val_size: int | None = None
    test_size: int | None = None
    size: int | None = None  # None: patches must be 96x96; an int: resize to size x size
    cache: bool = True  # decode once into the uint8 cache, read per batch from there
    cache_dir: str | None = None  # None -> $FEDSHIFT_CACHE or ~/.cache/fedshift

    def validate(self, prefix: str = "dataset") -> None:
        """Raise :class:`ConfigError` naming the key for a value the loader cannot honour."""
        if self.layout not in ("auto", "wilds", "harmofl"):
            raise ConfigError(
                f"config key '{prefix}.layout' must be 'auto', 'wilds' or 'harmofl', "
                f"got {self.layout!r}"
            )
        check_fractions(self.fractions, f"{prefix}.fractions")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ConfigError(f"config key '{prefix}.seed' must be an integer >= 0")
        for key in SIZE_KEYS.values():
            value = getattr(self, key)
            if value is not None:
                check_size(value, f"{prefix}.{key}")
        if self.size is not None:
            check_size(self.size, f"{prefix}.size")
        check_flag(self.cache, f"{prefix}.cache")
        check_cache_dir(self.cache_dir, f"{prefix}.cache_dir")

    def caps(self) -> dict[str, int | None]:
        return {s: getattr(self, k) for s, k in SIZE_KEYS.items()}


@dataclass
class Source:
    """The patches of one split of one hospital before subsampling."""

    labels: np.ndarray  # int64 in {0, 1}
    path_of: Callable[[int], str]  # entry i's path, relative to dataset.root
    origin_of: Callable[[int], str]  # where entry i is listed, for error messages


# --------------------------------------------------------------------------------------------
# layouts
# --------------------------------------------------------------------------------------------


def detect_layout(root: Path, layout: str) -> str:
    """``wilds`` or ``harmofl``: the named one (its marker file must exist) or the one whose
    marker (``metadata.csv`` / ``data.pkl``) is in ``root``."""
    has = {"wilds": (root / "metadata.csv").is_file(), "harmofl": (root / "data.pkl").is_file()}
    marker = {"wilds": "metadata.csv", "harmofl": "data.pkl"}
    if layout != "auto":
        if not has[layout]:
            raise MissingSourceError(
                f"dataset.layout={layout}: {root / marker[layout]} is missing; point "
                f"dataset.root at the folder that holds it. Expected layouts:\n{TREE}"
            )
        return layout
    if all(has.values()):
        raise DataError(
            f"{root} holds both metadata.csv (WILDS) and data.pkl (HarmoFL); set "
            f"dataset.layout=wilds or dataset.layout=harmofl"
        )
    for name, present in has.items():
        if present:
            return name
    raise MissingSourceError(
        f"dataset.root={str(root)!r} holds neither metadata.csv (WILDS camelyon17_v1.0) nor "
        f"data.pkl (HarmoFL); set dataset.root to one of these folders. Expected layouts:\n"
        f"{TREE}"
    )


def wilds_path(patient: int, node: int, x: int, y: int) -> str:
    """A WILDS patch's path relative to the dataset folder."""
    folder = f"patient_{patient:03d}_node_{node}"
    return f"patches/{folder}/patch_{folder}_x_{x}_y_{y}.png"


def read_wilds_metadata(path: Path) -> dict[str, np.ndarray]:
    """The needed columns of WILDS' ``metadata.csv`` as int64 arrays (one entry per row)."""
    try:
        with open(path, newline="") as fh:
            reader = csv.reader(fh)
            header = next(reader, None)
            rows = list(reader)
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise DataError(f"{path}: cannot read it as CSV ({exc})") from exc
    if header is None:
        raise DataError(f"{path} is empty; expected the header {WILDS_HEADER!r} and one row each")
    where = {name.strip(): i for i, name in enumerate(header)}
    missing = [c for c in WILDS_COLUMNS if c not in where]
    if missing:
        raise DataError(
            f"{path}: missing column(s) {missing}; WILDS' camelyon17_v1.0 metadata.csv has the "
            f"header {WILDS_HEADER!r}"
        )
    if not rows:
        raise DataError(f"{path} has a header but no rows")
    out = {}
    for col in WILDS_COLUMNS:
        i = where[col]
        try:
            out[col] = np.array([int(r[i]) for r in rows], dtype=np.int64)
        except (ValueError, IndexError):
            bad = next(n for n, r in enumerate(rows) if not _is_int_at(r, i))
            raise DataError(
                f"{path}, line {bad + 2}: column {col!r} must be an integer, got "
                f"{rows[bad][i] if i < len(rows[bad]) else '(missing)'!r}"
            ) from None
    for col, valid in (("center", range(5)), ("tumor", range(2))):
        bad = np.flatnonzero(~np.isin(out[col], list(valid)))
        if bad.size:
            raise DataError(
                f"{path}, line {int(bad[0]) + 2}: {col} = {int(out[col][bad[0]])}, expected one "
                f"of {list(valid)}"
            )
    return out


def _is_int_at(row: list[str], i: int) -> bool:
    try:
        int(row[i])
    except (ValueError, IndexError):
        return False
    return True


def split_by_slide(
    slides: np.ndarray, fractions: tuple[float, float, float], rng: np.random.Generator
) -> np.ndarray:
    """Split id (0 train, 1 val, 2 test) of each patch, whole slides at a time.

    Slides are taken in a random order; each goes to the split whose patch count is furthest
    below its target ``fraction x total`` (``argmax`` of the deficit: ties to train, val, test).
    """
    ids, counts = np.unique(slides, return_counts=True)
    target = np.asarray(fractions, dtype=np.float64) * counts.sum()
    have = np.zeros(3)
    slide_split = np.zeros(len(ids), dtype=np.int64)
    for j in rng.permutation(len(ids)):
        s = int(np.argmax(target - have))
        slide_split[j] = s
        have[s] += counts[j]
    return slide_split[np.searchsorted(ids, slides)]


def wilds_sources(
    root: Path, fractions: tuple[float, float, float], seed: int
) -> tuple[dict[str, dict[str, Source]], dict]:
    """Per hospital, per split: the WILDS patches, split by slide."""
    meta_path = root / "metadata.csv"
    meta = read_wilds_metadata(meta_path)
    sources: dict[str, dict[str, Source]] = {}
    slides_info: dict[str, dict[str, list[int]]] = {}
    for k, hospital in enumerate(HOSPITALS):
        rows = np.flatnonzero(meta["center"] == k)
        if rows.size == 0:
            raise DataError(
                f"{meta_path} has no row with center = {k} ({hospital}); the WILDS metadata "
                f"lists five centers 0-4"
            )
        slides = meta["slide"][rows]
        assign = split_by_slide(slides, fractions, seeded_rng(seed, f"{NAME}/{hospital}/slides"))
        sources[hospital] = {}
        slides_info[hospital] = {}
        for s, split in enumerate(("train", "val", "test")):
            sel = rows[assign == s]
            if sel.size == 0:
                n_slides = len(np.unique(slides))
                raise DataError(
                    f"camelyon17 {hospital}: splitting its {n_slides} slide(s) by slide with "
                    f"dataset.fractions={list(fractions)} leaves the {split} split empty; "
                    f"change dataset.seed or dataset.fractions, or use more slides"
                )
            sources[hospital][split] = Source(
                meta["tumor"][sel].copy(),
                lambda i, sel=sel: wilds_path(
                    *(int(meta[c][sel[i]]) for c in ("patient", "node", "x_coord", "y_coord"))
                ),
                lambda i, sel=sel: f"{meta_path}, line {int(sel[i]) + 2}",
            )
            slides_info[hospital][split] = sorted(int(v) for v in np.unique(meta["slide"][sel]))
    info = {
        "split": (
            "per hospital by slide (seeded order, each slide to the split furthest below its "
            "target share of patches)"
        ),
        "fractions": list(fractions),
        "slides": slides_info,
    }
    return sources, info


def read_harmofl_pickle(path: Path) -> dict[str, dict[str, tuple[np.ndarray, np.ndarray]]]:
    """HarmoFL's ``data.pkl``: ``{hospital: {"train"|"test": (paths, labels)}}``, checked."""
    shape = "{'hospital1'..'hospital5': {'train': (paths, labels), 'test': (paths, labels)}}"
    data = read_array_pickle(path, f"HarmoFL's data/camelyon17/data.pkl {shape}", "ASCII")
    if not isinstance(data, dict):
        raise DataError(f"{path} holds a {type(data).__name__}, expected a dict {shape}")
    out = {}
    for hospital in HOSPITALS:
        entry = data.get(hospital)
        if not isinstance(entry, dict) or not {"train", "test"} <= set(entry):
            raise DataError(
                f"{path}: no {hospital!r} entry with 'train' and 'test'; expected {shape}"
            )
        out[hospital] = {}
        for split in ("train", "test"):
            pair = entry[split]
            if not isinstance(pair, tuple | list) or len(pair) != 2:
                raise DataError(f"{path}: {hospital}/{split} is not a (paths, labels) pair")
            paths = np.asarray(pair[0]).reshape(-1)
            labels = np.asarray(pair[1])
            if labels.ndim > 1:
                labels = labels.reshape(labels.shape[0], -1)
                if labels.shape[1] != 1:
                    raise DataError(
                        f"{path}: {hospital}/{split} labels have shape {pair[1].shape}; "
                        f"expected one label per patch"
                    )
                labels = labels[:, 0]
            if len(paths) != len(labels):
                raise DataError(
                    f"{path}: {hospital}/{split} has {len(paths)} paths but {len(labels)} labels"
                )
            if labels.dtype.kind not in "iubf" or not np.isin(labels, (0, 1)).all():
                raise DataError(
                    f"{path}: {hospital}/{split} labels must be 0 (normal) or 1 (tumor)"
                )
            if not all(isinstance(p, str | np.str_) for p in paths):
                raise DataError(f"{path}: {hospital}/{split} paths must be strings")
            out[hospital][split] = (paths, labels.astype(np.int64))
    return out


def harmofl_sources(root: Path) -> tuple[dict[str, dict[str, Source]], dict]:
    """Per hospital: HarmoFL's train (minus its last 20 %, the val split) and test lists."""
    pkl = root / "data.pkl"
    data = read_harmofl_pickle(pkl)
    sources: dict[str, dict[str, Source]] = {}
    for hospital in HOSPITALS:
        paths, labels = data[hospital]["train"]
        n = len(labels)
        n_val = math.floor(HARMOFL_VAL * n)
        cut = n - n_val
        parts = {
            "train": (paths[:cut], labels[:cut], 0),
            "val": (paths[cut:], labels[cut:], cut),
            "test": (*data[hospital]["test"], 0),
        }
        sources[hospital] = {}
        for split, (p, y, offset) in parts.items():
            if len(y) == 0:
                raise DataError(
                    f"{pkl}: {hospital}'s {split} split is empty ({n} train entries; val is "
                    f"the last floor(0.2 n) of them, as in HarmoFL)"
                )
            which = "test" if split == "test" else "train"
            sources[hospital][split] = Source(
                y,
                lambda i, p=p: str(p[i]),
                lambda i, w=which, o=offset, h=hospital: f"{pkl} [{h!r}][{w!r}] entry {o + i}",
            )
    info = {"split": "HarmoFL: val = last floor(0.2 n) of data.pkl's train list, test = its test"}
    return sources, info


# --------------------------------------------------------------------------------------------
# images
# --------------------------------------------------------------------------------------------


def split_source(root: Path, source: Source, idx: np.ndarray) -> SplitSource:
    """The chosen patches' files and labels (for :func:`materialize_client`)."""
    paths = [root / source.path_of(int(i)) for i in idx]
    origins = [source.origin_of(int(i)) for i in idx]
    return SplitSource(paths, source.labels[idx].astype(np.int64), origins)


def load_camelyon(params: CamelyonParams) -> Federation:
    """The ``camelyon17`` federation: five hospitals, tumour / normal patch classification."""
    params.validate()
    root = require_root(params.root, NAME, TREE)
    layout = detect_layout(root, params.layout)
    fractions = check_fractions(params.fractions)
    if layout == "harmofl":
        if [float(f) for f in params.fractions] != DEFAULT_FRACTIONS:
            raise ConfigError(
                "config key 'dataset.fractions' applies to the WILDS layout only; HarmoFL's "
                "data.pkl fixes train/test and fedshift takes val as the last 20 % of train "
                "(fed_train.py). Remove dataset.fractions"
            )
        sources, split_info = harmofl_sources(root)
    else:
        sources, split_info = wilds_sources(root, fractions, params.seed)
    caps = params.caps()
    side = PATCH if params.size is None else params.size
    exact = None
    if params.size is None:
        exact = (
            f"Camelyon17 patches are {PATCH}x{PATCH}. Set dataset.size (e.g. dataset.size=96) "
            "to resize every patch, or replace the file"
        )
    store = cache_root(params.cache, params.cache_dir)
    budget = MemoryBudget()  # one for the whole federation (core/images.py)
    clients, available, label_counts, cache_info = [], {}, {}, {}
    for hospital in HOSPITALS:
        chosen = {}
        available[hospital] = {s: len(src.labels) for s, src in sources[hospital].items()}
        for split, src in sources[hospital].items():
            rng = seeded_rng(params.seed, f"{NAME}/{hospital}/{split}")
            idx = stratified_subsample(src.labels, caps[split], rng)
            chosen[split] = split_source(root, src, idx)
        client, cache_info[hospital] = materialize_client(
            NAME,
            ClientSource(hospital, chosen),
            side,
            "rgb",
            store,
            "restore the patch or fix dataset.root",
            exact=exact,
            budget=budget,
        )
        clients.append(client)
        label_counts[hospital] = {
            s: torch.bincount(client.split(s).y, minlength=2).tolist() for s in chosen
        }
    fed = Federation(NAME, clients, list(CLASSES), (3, side, side), task="classification")
    fed.info = {
        "root": str(root),
        "layout": layout,
        "counts": fed.counts(),
        "available": available,
        "label_counts": label_counts,
        "caps": caps,
        "subsample": (
            "class-stratified seeded subsample of each split to its cap (largest-remainder "
            "class quotas); a null cap keeps every patch"
        ),
        "seed": params.seed,
        "size": side,
        "resized": params.size is not None,
        "cache": cache_info,
        **split_info,
    }
    return fed


#: the ``camelyon17`` dataset (the dataset contract: :mod:`fedshift.core.datasets`)
CAMELYON17_DATASET = Dataset(
    "camelyon17", CamelyonParams, "classification", load_camelyon,
    "Camelyon17 histology patches, five hospitals (your WILDS or HarmoFL data.pkl folder)",
)  # fmt: skip
