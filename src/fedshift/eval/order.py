"""Sort keys for labels that hold numbers: a table's rows, a report's sections."""

from __future__ import annotations

import re


def natural_key(text: str) -> tuple:
    """``text`` split into alternating (text, number) parts, numbers as floats (a sort key
    that puts ``partition.clients=8`` before ``=20`` before ``=80``)."""
    parts = re.split(r"(\d+(?:\.\d+)?)", text)
    return tuple(float(x) if i % 2 else x for i, x in enumerate(parts))
