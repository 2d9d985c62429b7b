"""How many processes and threads a machine's runs use: ``run.workers`` resolved, and a
suite's workers shared with its cells' own (:mod:`fedshift.bench`) so that suite workers x
cell workers x threads stays within the usable cores."""

from __future__ import annotations

import os
from typing import Protocol

from fedshift.core.config import RunConfig
from fedshift.core.errors import ConfigError, FedshiftError

__all__ = ["default_workers", "on_gpu", "resolve_workers", "share_cores", "usable_cores"]


class _Cell(Protocol):
    cfg: RunConfig
    run_dir: object


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity where the platform has one)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def on_gpu(device: str) -> bool:
    """Whether the ``device`` key puts a run on a GPU (``auto``: when CUDA is available)."""
    device = str(device)
    if device == "auto":
        import torch

        return torch.cuda.is_available()
    return device.startswith("cuda")


def resolve_workers(workers: int | str, threads: int = 1, device: str = "cpu") -> int:
    """The worker count ``run.workers`` asks for: a number as given; ``auto``: one per usable
    core divided by ``threads`` (at least 1), and 1 on a GPU (its clients share one device)."""
    if workers == "auto":
        if on_gpu(device):
            return 1
        return max(1, usable_cores() // max(1, threads))
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ConfigError(
            f"config key 'run.workers' (--workers) must be a whole number of at least 1 or "
            f"'auto', got {workers!r}"
        )
    return workers


def default_workers(pending: int, per_cell: int = 1) -> int:
    """The suite's default worker count: one per two cores (one per ``per_cell`` cores when
    each cell needs more than two: its own workers x threads), at most one per pending cell."""
    return max(1, min(pending, usable_cores() // max(2, per_cell) or 1))


def share_cores(
    todo: list[_Cell], workers: int | None, oversubscribe: bool = False
) -> tuple[int, dict[str, int]]:
    """The suite's worker count and each pending cell's ``run.workers`` resolved, so that
    suite workers x cell workers x threads <= usable cores (module docstring)."""
    cores = usable_cores()
    fixed = {
        str(c.run_dir): resolve_workers(c.cfg.run.workers, c.cfg.run.threads, c.cfg.device)
        for c in todo
        if c.cfg.run.workers != "auto"
    }
    need = max([fixed.get(str(c.run_dir), 1) * c.cfg.run.threads for c in todo], default=1)
    if workers is None:
        n = default_workers(len(todo), need)
    else:
        n = workers
        nested = any(w > 1 for w in fixed.values())
        if nested and n * need > cores and not oversubscribe:
            raise FedshiftError(
                f"--workers {n} x {need} cores per cell (its run.workers x run.threads) "
                f"needs {n * need} cores but this machine has {cores}: use --workers "
                f"{max(1, cores // need)}, fewer run.workers (run.workers=auto shares what "
                "the suite's workers leave), or --oversubscribe to run it anyway"
            )
    out = {}
    for c in todo:
        key = str(c.run_dir)
        if key in fixed:
            out[key] = fixed[key]
        elif on_gpu(c.cfg.device) or c.cfg.run.executor == "vmap":
            out[key] = 1  # one process: its clients share one device, or one vmap call
        else:
            out[key] = max(1, cores // (n * c.cfg.run.threads))
    return n, out
