"""The machine a result was computed on: CPU model and the kernel path torch picked for it,
cores, GPU, torch version. Accuracies depend on these (float sums in other orders), so every
run's provenance and every committed results folder records them."""

from __future__ import annotations

import os
import platform
from functools import cache
from typing import Any


@cache
def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``; ``platform.processor()`` elsewhere)."""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def machine() -> dict[str, Any]:
    """``cpu``, ``capability`` (torch's CPU kernel path: DEFAULT, AVX2, AVX512...; the
    ``ATEN_CPU_CAPABILITY`` environment variable can lower it), ``cores``, ``gpu`` (name of
    CUDA device 0, or None) and ``torch``."""
    import torch

    try:
        capability = str(torch.backends.cpu.get_cpu_capability())
    except AttributeError:  # torch before 2.1
        capability = None
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {
        "cpu": cpu_model(),
        "capability": capability,
        "cores": os.cpu_count(),
        "gpu": gpu,
        "torch": str(torch.__version__),
    }
