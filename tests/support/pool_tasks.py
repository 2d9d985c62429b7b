"""Picklable tasks for :func:`fedshift.runtime.parallel.run_cells` tests (spawned workers
import this module by name)."""

from __future__ import annotations

import time
from pathlib import Path


def sleepy(marker_dir: str, key: str, seconds: float) -> str:
    """A cell that leaves a marker when it begins, then takes ``seconds``."""
    (Path(marker_dir) / f"{key}.began").write_text("")
    time.sleep(seconds)
    return "ran"
