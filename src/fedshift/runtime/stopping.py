"""How a run stops: the exceptions that end one early, and the gate that turns SIGINT and
SIGTERM into a clean stop of the round loop (:mod:`fedshift.runtime.loop`).

A signal raises :class:`Caught` in the main thread, where the loop rolls the round in
progress back, saves the last whole round and raises :class:`RunSignal` (the CLI exits
130 / 143). Two moments defer it: while a checkpoint is being written (a file is never cut
in half: the signal is acted on once it is written) and once the run is already saving its
state to stop (a second Ctrl-C waits for that save).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from fedshift.core.errors import FedshiftError
from fedshift.runtime.checkpoint_io import CHECKPOINT

__all__ = ["Caught", "RunInterrupted", "RunSignal", "SignalGate"]


class RunInterrupted(FedshiftError):
    """Raised by ``stop_after`` to emulate a run killed after a given round (tests, demos)."""


class RunSignal(BaseException):  # noqa: N818 - a signal, like KeyboardInterrupt
    """SIGINT or SIGTERM arrived; the run saved its last whole round before this propagated.

    A ``BaseException`` (like ``KeyboardInterrupt``) so that no ``except Exception`` on the
    way swallows it. ``resume``: how to continue the run, when not ``fedshift run --resume``
    (a run on Flower continues on Flower)."""

    def __init__(
        self, signum: int, run_dir: Path, saved_round: int | None, resume: str = ""
    ) -> None:
        self.signum = signum
        self.run_dir = run_dir
        self.saved_round = saved_round
        name = signal.Signals(signum).name
        where = (
            f"state of round {saved_round} saved in {run_dir / CHECKPOINT}"
            if saved_round is not None
            else "nothing to save yet (stopped during set-up)"
        )
        how = resume or f"fedshift run --resume {run_dir}"
        super().__init__(f"{name}: {where}; continue with: {how}")

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


class Caught(BaseException):  # noqa: N818
    """A signal, raised in the loop by :class:`SignalGate` (the loop turns it into a
    :class:`RunSignal` once it has saved)."""

    def __init__(self, signum: int) -> None:
        self.signum = signum


class SignalGate:
    """SIGINT / SIGTERM for one run: :meth:`installed` routes them to :meth:`handle`, which
    raises :class:`Caught`, except inside :meth:`held` (acted on when the block ends) and
    once :attr:`stopping` is set."""

    def __init__(self) -> None:
        self.holding = False
        #: the run is saving its state to stop: further signals wait for that
        self.stopping = False
        self.pending: int | None = None

    def handle(self, signum: int, frame: object) -> None:
        if self.stopping:
            return
        if self.holding:  # never cut a checkpoint in half: act once it is written
            self.pending = signum
            return
        raise Caught(signum)

    @contextmanager
    def installed(self) -> Iterator[None]:
        """The gate handles SIGINT / SIGTERM in the block (main thread only; elsewhere signal
        handlers cannot be set, and the block runs without)."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        old = {s: signal.signal(s, self.handle) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for s, h in old.items():
                signal.signal(s, h)

    @contextmanager
    def held(self) -> Iterator[None]:
        """Signals wait while the block runs (a checkpoint being written); one that arrived
        is acted on when it ends, unless it ends with an error (which propagates)."""
        self.holding = True
        try:
            yield
        finally:
            self.holding = False
        if self.pending is not None:
            signum, self.pending = self.pending, None
            self.handle(signum, None)
