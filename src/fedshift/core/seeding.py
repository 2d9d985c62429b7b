"""Stateless seeding: every random stream is derived from (run seed, purpose, round, client).

Deriving seeds instead of threading one generator through the run makes a resumed run
draw exactly the numbers an uninterrupted one draws, and makes a client's randomness
independent of which other clients were sampled or in which order they ran.
"""

from __future__ import annotations

import hashlib
import random

import numpy as np
import torch


def derive_seed(seed: int, *parts: object) -> int:
    """A 63-bit seed from the run seed and any labels (stable across processes/machines)."""
    text = "/".join([str(seed), *map(str, parts)])
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little") >> 1


def generator(seed: int, *parts: object) -> torch.Generator:
    g = torch.Generator()
    g.manual_seed(derive_seed(seed, *parts))
    return g


def seed_global(seed: int, *parts: object) -> None:
    """Seed torch's, numpy's and Python's global RNGs (for modules that draw from them)."""
    s = derive_seed(seed, *parts)
    torch.manual_seed(s)
    np.random.seed(s % (2**32))
    random.seed(s)


def rng_state() -> dict:
    return {
        "torch": torch.get_rng_state(),
        "numpy": np.random.get_state(),
        "python": random.getstate(),
    }


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
