"""The processes a local deployment started, however deep, and stopping all of them.

Flower's processes do not stay in the process group they were started in: the SuperLink
starts a SuperExec in a session of its own, which starts each run's ServerApp
(``flwr-serverapp``); each SuperNode does the same for its ClientApps. Killing the groups
``fedshift flower local`` started therefore left a ServerApp training and writing
checkpoints into the run directory after the command ended. This module finds every
descendant of a process by its parent id (Linux's ``/proc``; elsewhere none are found and the
callers fall back to process groups) so that each one can be asked to stop, then killed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterable
from pathlib import Path

__all__ = ["alive", "command", "descendants", "stop_all"]

_PROC = Path("/proc")


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, parent pid) of ``pid`` from ``/proc/<pid>/stat``; None when it is gone."""
    try:
        text = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    rest = text[text.rfind(")") + 2 :].split()  # the command name may hold spaces and ')'
    return rest[0], int(rest[1])


def descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (children first, then theirs), from ``/proc``."""
    children: dict[int, list[int]] = {}
    if not _PROC.is_dir():
        return []
    for entry in _PROC.iterdir():
        if entry.name.isdigit():
            st = _stat(int(entry.name))
            if st is not None:
                children.setdefault(st[1], []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in sorted(children.get(todo.pop(0), [])):
            found.append(child)
            todo.append(child)
    return found


def command(pid: int) -> str:
    """The command line of ``pid`` ("" when it is gone)."""
    try:
        return (_PROC / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def alive(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie, dead but not yet reaped, does not)."""
    st = _stat(pid)
    if st is not None:
        return st[0] != "Z"
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return not _PROC.is_dir()


def stop_all(pids: Iterable[int], grace: float, sig: int = signal.SIGTERM) -> list[int]:
    """Send ``sig`` to each of ``pids``, wait up to ``grace`` seconds for them to end, then
    SIGKILL those still running. Returns the ones that had to be killed."""
    pids = [p for p in pids if alive(p)]
    for p in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(p, sig)
    end = time.monotonic() + grace
    while time.monotonic() < end and any(alive(p) for p in pids):
        time.sleep(0.1)
    killed = [p for p in pids if alive(p)]
    for p in killed:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(p, signal.SIGKILL)
    return killed
