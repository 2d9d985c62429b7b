"""Resource guards: what a run's data or model would take in memory, estimated before it is
built and compared with what this machine has available.

A dataset whose parameters make it huge (``dataset.train_size=10000000`` of generated
images) or a model too wide to exist (``model.width=100000``: half a trillion weights) used
to exhaust the memory while being built: a ``MemoryError`` traceback, or the kernel's OOM
killer ending the process without a word. :func:`check_fits` stops it first with a
:class:`ResourceError` that gives the estimate, what is available, and the keys to lower.
An estimate is a lower bound (what the tensors alone take); an unknown available amount (no
``/proc/meminfo`` and no ``sysconf``) checks nothing.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from fedshift.core.errors import FedshiftError

__all__ = ["ResourceError", "available_bytes", "check_fits", "human_bytes"]

#: an estimate may use at most this share of the available memory (the rest: Python, torch,
#: the other copies a run makes while training)
SHARE = 0.8


class ResourceError(FedshiftError):
    """A run would need more memory than this machine has; nothing was built."""


def available_bytes() -> int | None:
    """Memory available to a new allocation now, or None when unknown: Linux's
    ``MemAvailable`` (else ``sysconf``), and no more than a cgroup v2 limit leaves (a
    container's own limit, lower than the machine's)."""
    found: list[int] = []
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    found.append(int(line.split()[1]) * 1024)
                    break
    except (OSError, ValueError, IndexError):
        pass
    if not found:
        with contextlib.suppress(ValueError, OSError, AttributeError):
            found.append(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    with contextlib.suppress(OSError, ValueError):
        cgroup = Path("/sys/fs/cgroup")
        limit = (cgroup / "memory.max").read_text().strip()
        if limit != "max":
            used = int((cgroup / "memory.current").read_text().strip())
            found.append(max(0, int(limit) - used))
    return min(found) if found else None


def human_bytes(n: float) -> str:
    """``1.5 GB``, ``282 TB``... (powers of 1000)."""
    for unit in ("B", "kB", "MB", "GB", "TB", "PB"):
        if abs(n) < 1000 or unit == "PB":
            return f"{n:.3g} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1000
    return f"{n:.3g} PB"


def check_fits(need: int, what: str, fix: str) -> None:
    """Raise :class:`ResourceError` when ``need`` bytes (an estimate of ``what``) exceed
    :data:`SHARE` of the memory available; ``fix`` says which keys to lower."""
    avail = available_bytes()
    if avail is None or need <= SHARE * avail:
        return
    raise ResourceError(
        f"{what} needs about {human_bytes(need)} of memory (an estimate, made before "
        f"building it), and this machine has {human_bytes(avail)} available: {fix}"
    )
