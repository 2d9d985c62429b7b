"""Stateless seeding: every random stream is derived from (run seed, purpose, round, client).

Deriving seeds instead of threading one generator through the run makes a resumed run
draw exactly the numbers an uninterrupted one draws, and makes a client's randomness
independent of which other clients were sampled or in which order they ran.
"""

from __future__ import annotations

import functools
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


@functools.cache
def _cuda_available() -> bool:
    """Whether this process can use CUDA (asked once: the driver query takes milliseconds)."""
    return torch.cuda.is_available()


def seed_global(seed: int, *parts: object) -> None:
    """Seed torch's (CPU and, where there is one, every GPU's), numpy's and Python's global
    RNGs (for modules that draw from them).

    The generators ``torch.manual_seed`` seeds, less the back-ends fedshift never runs on
    (MPS, XPU, MTIA, custom devices): on a CPU-only machine each call cost 90 us, and 0.9 ms
    on a GPU host (queueing seeds for back-ends that are not there records a stack trace),
    and the runtime seeds once per client and round."""
    s = derive_seed(seed, *parts)
    torch.default_generator.manual_seed(s)
    if _cuda_available():
        torch.cuda.manual_seed_all(s)
    np.random.seed(s % (2**32))
    random.seed(s)


def rng_state() -> dict:
    """The global RNGs' state as tensors and plain numbers only, so a checkpoint holding it
    loads with ``torch.load(weights_only=True)`` (numpy's own state tuple holds an ndarray,
    which that refuses); :func:`set_rng_state` restores it exactly."""
    name, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    version, internal, gauss_next = random.getstate()
    state = {
        "torch": torch.get_rng_state(),
        "numpy": {
            "name": str(name),
            "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
        "python": {"version": int(version), "internal": list(internal), "gauss_next": gauss_next},
    }
    if torch.cuda.is_initialized():  # a GPU run: the generators behind on-device draws too
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    """Restore the global RNGs from :func:`rng_state` (tensors may come back on any device).
    The GPUs' generators are restored where the state has them and this process has as many
    GPUs."""
    torch.set_rng_state(state["torch"].cpu())
    cuda = state.get("cuda")
    if cuda and _cuda_available() and torch.cuda.device_count() == len(cuda):
        torch.cuda.set_rng_state_all([t.cpu() for t in cuda])
    n = state["numpy"]
    keys = n["keys"].cpu().numpy().astype(np.uint32)
    np.random.set_state((n["name"], keys, n["pos"], n["has_gauss"], n["cached_gaussian"]))
    p = state["python"]
    random.setstate((p["version"], tuple(p["internal"]), p["gauss_next"]))


def rng_state_problem(state: object) -> str | None:
    """What is wrong with ``state`` as a :func:`rng_state` of this platform (the key and
    what it must be), or None: :func:`set_rng_state` would raise deep inside torch, numpy or
    Python on a wrong size or type, or restore generators that draw other numbers."""
    if not isinstance(state, dict):
        return "rng: must be a dict"
    cpu = torch.get_rng_state()
    t = state.get("torch")
    if not (isinstance(t, torch.Tensor) and t.dtype == torch.uint8 and t.shape == cpu.shape):
        return f"rng/torch: must be a uint8 tensor of {cpu.numel()} bytes"
    n = state.get("numpy")
    if not isinstance(n, dict):
        return "rng/numpy: must be a dict"
    keys = n.get("keys")
    if n.get("name") != "MT19937":
        return "rng/numpy/name: must be 'MT19937'"
    if not (isinstance(keys, torch.Tensor) and keys.dtype == torch.int64 and keys.shape == (624,)):
        return "rng/numpy/keys: must be an int64 tensor of 624 values"
    if bool(((keys < 0) | (keys >= 2**32)).any()):
        return "rng/numpy/keys: must hold 32-bit unsigned values"
    pos = n.get("pos")
    if not (isinstance(pos, int) and not isinstance(pos, bool) and 0 <= pos <= 624):
        return "rng/numpy/pos: must be a whole number in [0, 624]"
    if n.get("has_gauss") not in (0, 1) or not isinstance(n.get("cached_gaussian"), float):
        return "rng/numpy/has_gauss, cached_gaussian: must be 0 or 1, and a number"
    p = state.get("python")
    version, internal, _ = random.getstate()
    if not isinstance(p, dict) or p.get("version") != version:
        return f"rng/python/version: must be {version}"
    inner = p.get("internal")
    if not (
        isinstance(inner, list | tuple)
        and len(inner) == len(internal)
        and all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**32 for v in inner)
        and inner[-1] <= len(internal) - 1
    ):
        return f"rng/python/internal: must be {len(internal)} 32-bit whole numbers"
    if not (p.get("gauss_next") is None or isinstance(p.get("gauss_next"), float)):
        return "rng/python/gauss_next: must be None or a number"
    cuda = state.get("cuda")
    if cuda is not None and not (
        isinstance(cuda, list | tuple)
        and all(isinstance(c, torch.Tensor) and c.dtype == torch.uint8 for c in cuda)
    ):
        return "rng/cuda: must be a list of uint8 tensors"
    return None
