"""The one random-generator recipe of the dataset loaders and partitions.

A loader never draws from a global RNG: each step that needs randomness (a split, a
subsample, a recipe's noise) gets its own numpy ``Generator`` from the data seed and a text
tag naming the step, e.g. ``seeded_rng(seed, "camelyon17/hospital1/train")``. The tag is
hashed with CRC32, which (unlike :func:`hash`) is the same in every process, so the draws
depend on nothing but the seed and the tag.

(:mod:`fedshift.core.seeding` derives the *run's* torch seeds with sha256; the data loaders
keep this recipe, which every cached pool and published split was drawn with.)
"""

from __future__ import annotations

import zlib

import numpy as np

__all__ = ["seeded_rng", "stable_hash"]


def stable_hash(tag: str) -> int:
    """CRC32 of ``tag`` in UTF-8: a 32-bit hash that is the same in every process."""
    return zlib.crc32(tag.encode("utf-8"))


def seeded_rng(seed: int, *parts: str | int) -> np.random.Generator:
    """``np.random.default_rng([seed, *parts])`` with each text part replaced by its
    :func:`stable_hash` (integers are used as they are).

    ``seeded_rng(seed, tag)`` is the usual form; more parts name a sub-step, e.g.
    ``seeded_rng(seed, domain, "split")`` or ``seeded_rng(seed, "brain-mri/noise", site)``.
    """
    words = [stable_hash(p) if isinstance(p, str) else int(p) for p in parts]
    return np.random.default_rng([int(seed), *words])
