"""Worker processes that die with the process that started them.

A worker left behind by a parent that was killed (``kill -9``, out of memory) would wait for
work that never comes, holding memory (a copy of the dataset) forever. Every fedshift worker
(``fedshift bench``'s cell workers, the pool workers of ``run.workers``) therefore calls
:func:`die_with_parent` first thing:

* on Linux the kernel sends ``signum`` when the parent dies (``prctl(PR_SET_PDEATHSIG)``);
* everywhere a daemon thread polls ``os.getppid()`` and, once the parent is gone, calls the
  worker's ``on_gone`` (which may first let the work in progress save itself) and then exits
  the process with ``os._exit(1)``.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable

__all__ = ["die_with_parent", "parent_death_signal"]

#: seconds between two looks at the parent
POLL_S = 0.5


def parent_death_signal(signum: int) -> bool:
    """Ask the kernel to send ``signum`` to this process when its parent dies (Linux's
    ``prctl(PR_SET_PDEATHSIG)``); False where that is not available."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        return libc.prctl(pr_set_pdeathsig, int(signum), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _watch(parent: int, signalled: bool, on_gone: Callable[[bool], None] | None) -> None:
    while os.getppid() == parent:
        time.sleep(POLL_S)
    if on_gone is not None:
        on_gone(signalled)
    os._exit(1)


def die_with_parent(
    parent: int,
    signum: int = signal.SIGTERM,
    on_gone: Callable[[bool], None] | None = None,
) -> bool:
    """Make this process (a worker started by ``parent``) end when ``parent`` ends: the
    kernel's death signal ``signum`` where the platform has one, and a daemon thread that
    polls the parent and, once it is gone, calls ``on_gone(signalled)`` (``signalled``: the
    kernel has already sent ``signum``) and exits. Exits at once if ``parent`` is already
    gone. Returns whether the death signal is set."""
    signalled = parent_death_signal(signum)
    if os.getppid() != parent:  # the parent died before the line above
        os._exit(1)
    threading.Thread(
        target=_watch, args=(parent, signalled, on_gone), name="fedshift-parent-watch",
        daemon=True,
    ).start()  # fmt: skip
    return signalled
