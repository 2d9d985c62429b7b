"""How a run stops: the exceptions that end one early, and the gate that turns SIGINT and
SIGTERM into a clean stop of the round loop (:mod:`fedshift.runtime.loop`).

A signal raises :class:`Caught` in the main thread, where the loop rolls the round in
progress back, saves the last whole round and raises :class:`RunSignal` (the CLI exits
130 / 143). Two moments defer it: while a checkpoint is being written (a file is never cut
in half: the signal is acted on once it is written) and once the run is already saving its
state to stop (a second Ctrl-C waits for that save).

A loop that runs in another thread (the Flower ServerApp of a simulation on Ray, whose main
thread runs Flower's engine) cannot be interrupted by a signal handler: the main thread's
handler only records the signal (:meth:`SignalGate.forwarded`, :meth:`SignalGate.request`)
and the loop acts on it where it waits or between rounds (:meth:`SignalGate.poll`), with the
same rollback and save.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from fedshift.core.errors import FedshiftError
from fedshift.runtime.rundir.checkpoint_io import CHECKPOINT

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
        #: a signal recorded for a loop in another thread (:meth:`request`)
        self.requested: int | None = None

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

    def request(self, signum: int, frame: object = None) -> None:
        """Record ``signum`` for the loop to act on at its next :meth:`poll` (a handler in
        the main thread, for a loop running in another thread)."""
        if not self.stopping and self.requested is None:
            self.requested = signum

    def poll(self) -> None:
        """Where a loop in another thread may stop: raise :class:`Caught` for a signal
        :meth:`request` recorded (not while a checkpoint is written, not while stopping)."""
        if self.requested is not None and not self.holding and not self.stopping:
            signum, self.requested = self.requested, None
            raise Caught(signum)

    @contextmanager
    def forwarded(self) -> Iterator[Callable[[], None]]:
        """In the main thread, while the loop runs in another: SIGINT / SIGTERM are recorded
        for it (:meth:`request`) instead of interrupting this thread. Yields a function that
        sets the handlers again (a library that installed its own, as Ray does when it
        starts, is overridden)."""
        if threading.current_thread() is not threading.main_thread():
            yield lambda: None
            return
        sigs = (signal.SIGINT, signal.SIGTERM)
        old = {s: signal.getsignal(s) for s in sigs}

        def install() -> None:
            for s in sigs:
                signal.signal(s, self.request)

        install()
        try:
            yield install
        finally:
            for s, h in old.items():
                signal.signal(s, h if h is not None else signal.SIG_DFL)

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
        self.poll()
