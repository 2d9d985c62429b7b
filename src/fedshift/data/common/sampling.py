"""Stratified splits and subsamples shared by the loaders (all randomness from a generator
the caller passes, see :func:`~fedshift.data.common.seeding.seeded_rng`)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fedshift.core.errors import DataError
from fedshift.core.federation import SPLITS

__all__ = [
    "SIZE_KEYS",
    "class_quota",
    "cut_points",
    "permutation_cut",
    "split_indices",
    "stratified_cut",
    "stratified_subsample",
    "uniform_subsample",
]

#: classes of the 28x28 benchmarks that use :func:`split_indices` (digits, Fashion-MNIST)
TEN = 10
#: the config keys of those benchmarks' per-client split sizes, by split
SIZE_KEYS = {"train": "dataset.train_size", "val": "dataset.val_size", "test": "dataset.test_size"}


def class_quota(total: int, num_classes: int = TEN) -> np.ndarray:
    """Split ``total`` over the classes as evenly as possible; the first classes get the rest."""
    base, rest = divmod(total, num_classes)
    quota = np.full(num_classes, base, dtype=np.int64)
    quota[:rest] += 1
    return quota


def split_indices(
    y: np.ndarray, sizes: dict[str, int], rng: np.random.Generator, num_classes: int = TEN
) -> dict[str, np.ndarray]:
    """Disjoint, class-stratified index sets ``{split: indices}`` with even class quotas
    (:func:`class_quota` of each split's size).

    Per class, one permutation is cut into test, then val, then train, so the test set does
    not change when only ``train_size`` does. Each split is then shuffled. A class with too
    few examples is a :class:`DataError`.
    """
    quotas = {s: class_quota(sizes[s], num_classes) for s in SPLITS}
    parts: dict[str, list[np.ndarray]] = {s: [] for s in SPLITS}
    for c in range(num_classes):
        idx = rng.permutation(np.flatnonzero(y == c))
        start = 0
        for split in ("test", "val", "train"):
            stop = start + int(quotas[split][c])
            if stop > len(idx):
                raise DataError(f"class {c} has {len(idx)} images, the splits need {stop}")
            parts[split].append(idx[start:stop])
            start = stop
    return {s: rng.permutation(np.concatenate(parts[s])) for s in ("test", "val", "train")}


def stratified_subsample(labels: np.ndarray, n: int | None, rng: np.random.Generator) -> np.ndarray:
    """Sorted indices of a class-stratified random subset of ``n`` of ``labels``.

    Each class keeps its share: class c gets ``n * count_c / N`` rounded by largest
    remainder (ties to the lower class). ``n`` None or ``>= N``: every index.
    """
    labels = np.asarray(labels)
    total = len(labels)
    if n is None or n >= total:
        return np.arange(total)
    classes, counts = np.unique(labels, return_counts=True)
    exact = n * counts / total
    quota = np.floor(exact).astype(np.int64)
    rest = n - int(quota.sum())
    order = np.argsort(-(exact - quota), kind="stable")
    quota[order[:rest]] += 1
    picks = [
        rng.choice(np.flatnonzero(labels == c), size=int(q), replace=False)
        for c, q in zip(classes, quota, strict=True)
    ]
    return np.sort(np.concatenate(picks))


def cut_points(n: int, fractions: Sequence[float]) -> tuple[int, int]:
    """Where an ordered list of ``n`` items is cut into train / val / test.

    ``train = [0, int(f0 n))``, ``val = [int(f0 n), int((f0 + f1) n))``, ``test`` the rest:
    HarmoFL's ``utils/dataset.py`` slicing (``int(0.8 n 0.8)``, ``int(0.8 n)``), which gives
    the same integers as ``int(0.64 n)``, ``int(0.8 n)`` for every n below 5,000 (checked).
    """
    f0, f1 = float(fractions[0]), float(fractions[1])
    return int(f0 * n), int((f0 + f1) * n)


def stratified_cut(
    labels: np.ndarray, fractions: Sequence[float], rng: np.random.Generator
) -> dict[str, np.ndarray]:
    """Indices of each split, per class: for every class present (ascending), a permutation of
    its items (one ``rng.permutation`` draw) cut at :func:`cut_points`; each split lists the
    classes in order, each class's picks in ascending index order."""
    labels = np.asarray(labels)
    parts: dict[str, list[np.ndarray]] = {s: [] for s in SPLITS}
    for c in np.unique(labels):
        idx = np.flatnonzero(labels == c)
        perm = rng.permutation(len(idx))
        a, b = cut_points(len(idx), fractions)
        for split, sel in zip(SPLITS, (perm[:a], perm[a:b], perm[b:]), strict=True):
            parts[split].append(idx[np.sort(sel)])
    empty = np.zeros(0, dtype=np.int64)
    return {s: np.concatenate(p).astype(np.int64) if p else empty for s, p in parts.items()}


def permutation_cut(
    n: int, fractions: Sequence[float], rng: np.random.Generator
) -> dict[str, np.ndarray]:
    """Sorted indices of each split: one permutation of ``n`` items cut at
    :func:`cut_points` (no strata: segmentation images, volumes)."""
    order = rng.permutation(n)
    a, b = cut_points(n, fractions)
    parts = {"train": order[:a], "val": order[a:b], "test": order[b:]}
    return {s: np.sort(v).astype(np.int64) for s, v in parts.items()}


def uniform_subsample(n: int, cap: int | None, rng: np.random.Generator) -> np.ndarray:
    """Sorted indices of a uniform random subset of ``cap`` of ``n`` items (``None`` or
    ``cap >= n``: all)."""
    if cap is None or cap >= n:
        return np.arange(n)
    return np.sort(rng.choice(n, size=cap, replace=False))
