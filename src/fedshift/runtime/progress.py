"""Progress of a set of cells (a ``fedshift bench`` suite, a ``fedshift run --jobs`` sweep):
rounds and an ETA inside every running cell, and the whole set's ETA.

The cells report ``("start", key, rounds)`` and ``("round", key, round, rounds)`` messages
(:func:`fedshift.runtime.parallel.report`, from this process or from workers);
:class:`CellProgress` turns them into

* on a terminal: one bar for the set (cells done) and one bar per running cell (its rounds,
  its ETA; the set's ETA on the set's bar);
* elsewhere (a log file, a pipe): one line as each cell starts, a status line per running
  cell at most every ``every_s`` seconds, ``suite demo: cell 3/12 (fedbn s1): round 17/50,
  ETA 4 min, suite ETA 38 min``, and one line as each cell ends; no bars.

A cell's ETA is its remaining rounds at the pace of its rounds so far (in this invocation);
the set's ETA is the rounds left in running and pending cells at the pace of all the rounds
finished so far, all workers together (so it includes the cells' set-up time). Estimates:
cells of another size or speed make them move. A cell with early stopping (``train.patience``)
may end before its ``train.rounds``: its ETA, and the set's while such a cell is running or
pending, count its maximum and read ``at most 4 min``.
"""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, TextIO

from tqdm.auto import tqdm

__all__ = ["CellProgress", "fmt_duration", "fmt_eta"]

#: seconds between two status lines when the output is not a terminal
EVERY_S = 60.0


def fmt_duration(seconds: float | None) -> str:
    """``45 s``, ``4 min``, ``2 h 05 min``; ``?`` while unknown."""
    if seconds is None:
        return "?"
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds / 60:.0f} min"
    hours, rest = divmod(int(seconds), 3600)
    return f"{hours} h {rest // 60:02d} min"


def fmt_eta(seconds: float | None, upper: bool) -> str:
    """``4 min``, or ``at most 4 min`` where ``upper`` (cells that may stop early)."""
    text = fmt_duration(seconds)
    return f"at most {text}" if upper and seconds is not None else text


@dataclass
class _Running:
    """A running cell as its messages describe it."""

    rounds: int
    round: int | None = None
    first: tuple[float, int] | None = None  # (time, round) of its first round message
    last: float = field(default_factory=time.monotonic)
    bar: Any = None
    slot: int = 0

    def eta(self) -> float | None:
        if self.first is None or self.round is None or self.round <= self.first[1]:
            return None
        pace = (self.last - self.first[0]) / (self.round - self.first[1])
        return pace * (self.rounds - self.round)


class CellProgress:
    """The progress display of a set of cells (module docstring). ``cells``: ``(key, label,
    rounds)`` of every cell of the set, in order; ``done``: the keys finished before this
    invocation; ``stops_early``: the keys of cells whose rounds are a maximum (early
    stopping; their ETAs are upper bounds); ``enabled`` False: nothing is shown.
    Thread-safe: :meth:`handle` may be called from a thread draining workers' messages."""

    def __init__(
        self,
        title: str,
        cells: list[tuple[str, str, int]],
        done: set[str] | None = None,
        enabled: bool = True,
        every_s: float = EVERY_S,
        stream: TextIO | None = None,
        stops_early: set[str] | None = None,
    ) -> None:
        done = done or set()
        self.stops_early = stops_early or set()
        self.title = title
        self.index = {key: i for i, (key, _, _) in enumerate(cells, 1)}
        self.labels = {key: label for key, label, _ in cells}
        self.pending = {key: rounds for key, _, rounds in cells if key not in done}
        self.total, self.finished = len(cells), len(cells) - len(self.pending)
        self.running: dict[str, _Running] = {}
        self.ended: set[str] = set()
        self.stream = stream or sys.stderr
        self.enabled = enabled
        tty = enabled and getattr(self.stream, "isatty", lambda: False)()
        self.lines = enabled and not tty
        self.every_s = every_s
        self.started = time.monotonic()
        self.rounds_done = 0
        self.last_line = -float("inf")
        self.lock = threading.RLock()
        self.bar = None
        if tty:
            self.bar = tqdm(
                total=self.total,
                initial=self.finished,
                desc=title,
                file=self.stream,
                dynamic_ncols=True,
                bar_format="{desc}: {n_fmt}/{total_fmt} cells |{bar}| {elapsed}{postfix}",
            )

    # ------------------------------------------------------------------ estimates
    def suite_eta(self) -> float | None:
        """Seconds until every cell is done, at the pace of the rounds finished so far."""
        if not self.rounds_done:
            return None
        left = sum(r.rounds - (r.round or 0) for r in self.running.values())
        left += sum(n for key, n in self.pending.items() if key not in self.running)
        pace = (time.monotonic() - self.started) / self.rounds_done
        return left * pace

    def _suite_eta_text(self) -> str:
        """The set's ETA, ``at most`` while a cell that may stop early is not done."""
        if not self.pending:
            return "0 s"
        upper = any(key in self.stops_early for key in self.pending)
        return fmt_eta(self.suite_eta(), upper)

    def _cell_eta_text(self, key: str) -> str:
        return fmt_eta(self.running[key].eta(), key in self.stops_early)

    def status(self, key: str) -> str:
        """``cell 3/12 (fedbn s1): round 17/50, ETA 4 min, suite ETA 38 min``."""
        r = self.running[key]
        where = f"round {r.round}/{r.rounds}" if r.round is not None else "setting up"
        return (
            f"cell {self.index[key]}/{self.total} ({self.labels[key]}): {where}, "
            f"ETA {self._cell_eta_text(key)}, suite ETA {self._suite_eta_text()}"
        )

    # ------------------------------------------------------------------ messages
    def handle(self, message: tuple) -> None:
        """A cell's message: ``("start", key, rounds)`` or ``("round", key, rnd, rounds)``."""
        if not self.enabled or len(message) < 3 or message[1] not in self.index:
            return
        with self.lock:
            kind, key = message[0], message[1]
            if key in self.ended:  # a late message of a cell that has ended
                return
            if kind == "start":
                self._start(key, int(message[2]))
            elif kind == "round":
                self._round(key, int(message[2]), int(message[3]))

    def _start(self, key: str, rounds: int) -> _Running:
        r = self.running.get(key)
        if r is not None:
            return r
        r = self.running[key] = _Running(rounds)
        if self.lines:  # a cell that sets up for minutes (data to build) is seen to start
            self._print(f"cell {self.index[key]}/{self.total} ({self.labels[key]}): started")
        if self.bar is not None:
            used = {x.slot for x in self.running.values()}
            r.slot = next(i for i in range(1, len(used) + 2) if i not in used)
            r.bar = tqdm(
                total=rounds,
                desc=f"cell {self.index[key]}/{self.total} ({self.labels[key]})",
                position=r.slot,
                leave=False,
                file=self.stream,
                dynamic_ncols=True,
                bar_format="{desc}: {n_fmt}/{total_fmt} rounds |{bar}| {elapsed}{postfix}",
            )
        return r

    def _round(self, key: str, rnd: int, rounds: int) -> None:
        r = self._start(key, rounds)
        now = time.monotonic()
        self.rounds_done += max(1, rnd - (r.round if r.round is not None else rnd - 1))
        r.rounds, r.round, r.last = rounds, rnd, now
        if r.first is None:
            r.first = (now, rnd)
        if r.bar is not None and self.bar is not None:  # a cell has a bar only under a suite bar
            r.bar.total = rounds
            r.bar.n = rnd
            r.bar.set_postfix_str(f"ETA {self._cell_eta_text(key)}")
            self.bar.set_postfix_str(f"suite ETA {self._suite_eta_text()}")
        if self.lines and now - self.last_line >= self.every_s:
            self.last_line = now
            for k in self.running:
                self._print(self.status(k))

    def finish(self, key: str, status: str) -> None:
        """Cell ``key`` ended with ``status`` (``ran``, ``resumed``, ``failed``,
        ``interrupted``...)."""
        if not self.enabled:
            return
        with self.lock:
            self.ended.add(key)
            r = self.running.pop(key, None)
            if r is not None and r.bar is not None:
                r.bar.close()
            if status == "interrupted":
                return
            self.pending.pop(key, None)
            self.finished += 1
            eta = self._suite_eta_text()
            if self.bar is not None:
                self.bar.update(1)
                self.bar.set_postfix_str(f"suite ETA {eta}")
            if self.lines:
                self._print(
                    f"cell {self.index[key]}/{self.total} ({self.labels[key]}): {status}; "
                    f"{self.finished}/{self.total} cells done, suite ETA {eta}"
                )

    def _print(self, line: str) -> None:
        print(f"{self.title}: {line}", file=self.stream, flush=True)

    def close(self) -> None:
        """Close the bars (the running cells' first)."""
        with self.lock:
            for r in self.running.values():
                if r.bar is not None:
                    r.bar.close()
            self.running.clear()
            if self.bar is not None:
                self.bar.close()
