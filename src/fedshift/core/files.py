"""Atomic output files: a reader, a crash or a full disk sees the old file or the new one,
never half of one.

Every result fedshift writes (``summary.json``, ``ledger.json``, ``config.yaml``, reports,
protocol tables and figures, ``bench.json``) goes through :func:`atomic_output`: the content
is written to ``<name>.tmp`` next to the target, flushed and fsynced, then renamed over the
target with ``os.replace`` (atomic on POSIX within one file system). When writing fails the
temporary file is removed and the error propagates; the previous file is untouched.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fedshift.core.errors import FedshiftError

__all__ = ["atomic_output", "read_json", "write_text_atomic"]


@contextlib.contextmanager
def atomic_output(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path to write ``path``'s new content to; on success it is fsynced
    and renamed over ``path``, on failure removed. Writers that infer a format from the file
    name (matplotlib's ``savefig``) must be given the format explicitly."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        yield tmp
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise


def write_text_atomic(path: str | Path, text: str, newline: str | None = None) -> None:
    """Write ``text`` to ``path`` atomically (:func:`atomic_output`)."""
    with atomic_output(path) as tmp, open(tmp, "w", newline=newline) as f:
        f.write(text)


def read_json(path: str | Path) -> Any:
    """The JSON value in ``path``; an empty, truncated or otherwise unreadable result file is a
    :class:`~fedshift.core.errors.FedshiftError` naming it (never a bare ``JSONDecodeError``).
    fedshift writes its result files atomically, so one in that state was damaged or cut off by
    something else (a copy, another tool, a full disk before this fix)."""
    path = Path(path)
    try:
        return json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise FedshiftError(
            f"{path} is not readable JSON ({e}); it was damaged or cut off while being written. "
            "Rerun or resume the run that writes it (`fedshift run --resume DIR`; a bench "
            "suite: run the same `fedshift bench` again), or remove that run directory"
        ) from None


#: a spreadsheet takes a cell that starts with one of these as a formula (and runs it)
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
_NUMBER = re.compile(r"[+-]?((\d+\.?\d*|\.\d+)([eE][+-]?\d+)?|inf(inity)?|nan)", re.IGNORECASE)


def csv_safe(value: Any) -> Any:
    """A CSV cell that no spreadsheet runs as a formula: text starting with ``=``, ``+``,
    ``-``, ``@`` (or a tab / carriage return) gets a leading apostrophe, which spreadsheets
    show as text and do not evaluate (OWASP's "CSV injection" advice); numbers, and text that
    is a number (``-0.5``), stay as they are. A client, dataset or run folder name comes from
    files a user may have received, so every CSV fedshift writes goes through it."""
    if isinstance(value, str) and value.startswith(FORMULA_START) and not _NUMBER.fullmatch(value):
        return "'" + value
    return value
