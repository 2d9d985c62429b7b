"""fedshift's logging: the ``fedshift`` logger tree, the console the CLI shows, and the
``run.log`` of every run directory.

What fedshift reports while it runs goes through :mod:`logging`, to the logger ``fedshift``
and its children (``fedshift.runtime``, ``fedshift.flower``...): INFO for progress (the run
directory, one line per round, checkpoints, the end of a run), WARNING for what needs
attention (lost clients). Importing fedshift configures nothing; a library user sees these
records wherever their own logging configuration sends them.

* :func:`run_log` (every run, :meth:`fedshift.runtime.loop.RoundLoop.run`) appends the
  records of a run, INFO and above with UTC timestamps, to ``<run_dir>/run.log`` while it
  runs (only records of the thread running it, so two runs in one process keep apart). It
  lets INFO through the ``fedshift`` logger when that logger's level is not set; a level the
  user set is kept (``run.log`` then holds only what that level lets through).
* :func:`console` (the CLI) shows on the terminal the records meant for it as
  ``fedshift: ...`` lines: warnings and errors (stderr), and INFO records flagged
  ``extra={"console": True}`` (stdout): the run directory at the start of a run, and the
  round lines when no progress bar shows the rounds (the Flower server). A record flagged
  ``console=False`` stays off the terminal whatever its level (an error the CLI reports
  itself). Lines are written with ``tqdm.write``, so progress bars stay whole.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from fedshift.core.files import open_append

__all__ = ["LOGGER", "RUN_LOG", "ConsoleHandler", "console", "run_log", "showing_console"]

#: the root of fedshift's loggers
LOGGER = "fedshift"
#: the log file in every run directory
RUN_LOG = "run.log"
_FILE_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"

_level_lock = threading.Lock()
_level_holds = 0


class ConsoleHandler(logging.Handler):
    """``fedshift: ...`` lines on the terminal (see the module docstring). The stream is
    looked up at every line (``sys.stdout`` for INFO, ``sys.stderr`` from WARNING), so a
    handler outlives redirections of the standard streams."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.setFormatter(logging.Formatter("%(message)s"))

    def filter(self, record: logging.LogRecord) -> bool:
        if not super().filter(record):
            return False
        return bool(getattr(record, "console", record.levelno >= logging.WARNING))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            from tqdm.auto import tqdm

            level = record.levelno
            head = "fedshift: " if level < logging.WARNING else "fedshift: warning: "
            if level >= logging.ERROR:
                head = "fedshift: error: "
            stream = sys.stdout if level < logging.WARNING else sys.stderr
            tqdm.write(head + self.format(record), file=stream)
            stream.flush()
        except Exception:  # noqa: BLE001 - logging must never break the run
            self.handleError(record)


def _console_handler(logger: logging.Logger) -> ConsoleHandler | None:
    return next((h for h in logger.handlers if isinstance(h, ConsoleHandler)), None)


def console() -> ConsoleHandler:
    """The console handler on the ``fedshift`` logger, added once per process (the CLI),
    with the logger's level set to INFO when unset."""
    logger = logging.getLogger(LOGGER)
    handler = _console_handler(logger)
    if handler is None:
        handler = ConsoleHandler()
        logger.addHandler(handler)
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.INFO)
    return handler


@contextmanager
def showing_console() -> Iterator[None]:
    """A console handler for the ``with`` block, unless one is there already (a run that
    logs its rounds to the terminal outside the CLI: the Flower ServerApp)."""
    logger = logging.getLogger(LOGGER)
    if _console_handler(logger) is not None:
        yield
        return
    handler = ConsoleHandler()
    logger.addHandler(handler)
    try:
        with _info_enabled(logger):
            yield
    finally:
        logger.removeHandler(handler)


@contextmanager
def _info_enabled(logger: logging.Logger) -> Iterator[None]:
    """INFO passes ``logger`` inside the block when its level is unset (counted: nested
    and concurrent blocks restore it once, at the last exit)."""
    global _level_holds
    with _level_lock:
        if _level_holds == 0 and logger.level == logging.NOTSET:
            logger.setLevel(logging.INFO)
            _level_holds = 1
        elif _level_holds:
            _level_holds += 1
    try:
        yield
    finally:
        with _level_lock:
            if _level_holds:
                _level_holds -= 1
                if _level_holds == 0 and logger.level == logging.INFO:
                    logger.setLevel(logging.NOTSET)


class _ThisThread(logging.Filter):
    """Only the records of the thread that created the filter."""

    def __init__(self) -> None:
        super().__init__()
        self.thread = threading.get_ident()

    def filter(self, record: logging.LogRecord) -> bool:
        return record.thread == self.thread


def logged_warnings(run_dir: str | Path) -> list[str]:
    """The warnings (and errors) a run logged, in order and each once: the message of every
    WARNING / ERROR line of ``<run_dir>/run.log`` (a resumed run's earlier segments
    included). Read back so that a method's warning that scrolled past between progress bars
    is shown again under the results (:func:`fedshift.eval.tables.print_tables`, ``fedshift
    report``). A missing or unreadable log gives none."""
    path = Path(run_dir) / RUN_LOG
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    seen: list[str] = []
    for line in text.splitlines():
        parts = line.split(" ", 2)
        if len(parts) == 3 and parts[1] in ("WARNING", "ERROR"):
            message = parts[2].lstrip().split(": ", 1)[-1]
            if message not in seen and not message.startswith("stopped"):
                seen.append(message)
    return seen


@contextmanager
def run_log(run_dir: str | Path) -> Iterator[Path]:
    """Append the ``fedshift`` records of this thread, INFO and above, to
    ``<run_dir>/run.log`` inside the block (a resumed run appends to its log)."""
    path = Path(run_dir) / RUN_LOG
    handler = logging.StreamHandler(open_append(path))  # never through a link
    handler.setLevel(logging.INFO)
    formatter = logging.Formatter(_FILE_FORMAT, datefmt="%Y-%m-%dT%H:%M:%SZ")
    formatter.converter = time.gmtime
    handler.setFormatter(formatter)
    handler.addFilter(_ThisThread())
    logger = logging.getLogger(LOGGER)
    logger.addHandler(handler)
    try:
        with _info_enabled(logger):
            yield path
    finally:
        logger.removeHandler(handler)
        handler.close()
        handler.stream.close()
