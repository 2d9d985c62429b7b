"""Independent runs ("cells") one after another in this process, or in parallel worker
processes, each reporting its rounds back: the machinery under ``fedshift bench`` and
``fedshift run --jobs N``.

:func:`run_cells` calls a task (a module-level function, so that spawned workers can import
it) once per cell and hands each outcome, a plain dict (:func:`guarded`), to ``done`` in the
calling thread as the cell ends. With one worker the cells run here; with more, in spawned
processes that die with this one (:func:`~fedshift.core.lifeline.die_with_parent`). A cell
reports its progress through :func:`report` (a :class:`RoundReport` hook reports each whole
round): in this process straight to ``sink``, from a worker through a queue that a thread of
this process drains into ``sink`` (:class:`~fedshift.runtime.progress.CellProgress`).

SIGINT / SIGTERM stop every cell: the running ones save their last whole round, the others
do not start, and :class:`Stopped` propagates for the caller to say how to continue.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from pathlib import Path
from typing import Any

import torch

from fedshift.catalog import resolve
from fedshift.core.errors import FedshiftError
from fedshift.core.lifeline import die_with_parent
from fedshift.runtime.hooks import Hook, RoundRecord
from fedshift.runtime.progress import EVERY_S, CellProgress
from fedshift.runtime.rundir.ownership import LOCK_FILE, clear_run_dir, hold_run, lock_holder
from fedshift.runtime.simulation import Simulation
from fedshift.runtime.stopping import RunSignal
from fedshift.runtime.transports import make_transport

__all__ = [
    "PARENT_GONE_GRACE_S",
    "RoundReport",
    "Stopped",
    "guarded",
    "install",
    "report",
    "run_cells",
    "run_grid",
    "run_job",
]

#: seconds a worker whose parent died may take to save the cell it runs before it exits
PARENT_GONE_GRACE_S = 60.0

#: a cell is running in this process (a worker's parent watch waits for it to save)
_busy = False
#: where :func:`report` sends a cell's progress (None: nowhere)
_sink: Callable[[tuple], None] | None = None
#: in a worker: the pool's stop flag (set by the parent when a signal stops the cells)
_stopping: Any = None
#: a cell a stopped pool never began (the executor had already handed it to a worker)
NOT_STARTED = "not started"


def report(*message: Any) -> None:
    """Send a progress message (``("start", key, rounds)``, ``("round", key, rnd, rounds)``)
    to whoever displays the cells' progress; never fails the cell."""
    if _sink is not None:
        with contextlib.suppress(Exception):
            _sink(message)


class Stopped(BaseException):  # noqa: N818 - a signal, like KeyboardInterrupt
    """SIGINT / SIGTERM stopped :func:`run_cells` (every running cell saved its state)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


class RoundReport(Hook):
    """A round-loop hook that reports every whole round of the run in ``run_dir``
    (``("round", str(run_dir), round, rounds)``) through :func:`report`."""

    def __init__(self, run_dir: str | Path, rounds: int) -> None:
        self.run_dir, self.rounds = str(run_dir), rounds

    def log_round(self, record: RoundRecord) -> None:
        report("round", self.run_dir, record.round, self.rounds)


def guarded(task: Callable[..., str], *args: Any) -> dict:
    """``task(*args)`` with every outcome as a plain (picklable) dict: ``status`` as the task
    returns it (``ran``, ``resumed``...), ``failed`` with ``reason`` (and ``traceback`` for a
    bug), or ``interrupted`` with ``signum``."""
    global _busy
    if _stopping is not None and _stopping.is_set():
        return {"status": NOT_STARTED}
    _busy = True
    try:
        return {"status": task(*args)}
    except RunSignal as e:  # saved its last whole round; the cells stop
        return {"status": "interrupted", "signum": e.signum, "saved_round": e.saved_round}
    except KeyboardInterrupt:  # stopped before its round loop began: nothing to save
        return {"status": "interrupted", "signum": int(signal.SIGINT), "saved_round": None}
    except FedshiftError as e:  # a message for the user: recorded, the other cells run
        return {"status": "failed", "reason": str(e)}
    except Exception as e:  # noqa: BLE001 - a bug or an OS error: kept with its traceback
        reason = f"{type(e).__name__}: {e}"
        return {"status": "failed", "reason": reason, "traceback": traceback.format_exc()}
    finally:
        _busy = False


# ---------------------------------------------------------------------- worker processes
def _worker_sigint(signum: int, frame: Any) -> None:
    """A worker's SIGINT between round loops: stop the cell being built; idle, ignore it
    (the parent decides; a round loop installs its own handler)."""
    if _busy:
        raise KeyboardInterrupt


def _parent_gone(signalled: bool) -> None:
    """A worker's parent watch, once the parent is gone: stop the cell in progress
    (SIGTERM: its round loop saves its last whole round) and wait until it has (at most
    :data:`PARENT_GONE_GRACE_S`); the watch then exits the worker."""
    if not signalled:  # no PR_SET_PDEATHSIG here: send what it would have sent
        os.kill(os.getpid(), signal.SIGTERM)
    deadline = time.monotonic() + PARENT_GONE_GRACE_S
    while _busy and time.monotonic() < deadline:
        time.sleep(0.1)


def _worker_init(parent: int, messages: Any = None, stopping: Any = None) -> None:
    """Initializer of every worker: die with the parent
    (:func:`fedshift.core.lifeline.die_with_parent`: SIGTERM from the kernel on Linux, and a
    thread polling the parent that exits the worker once its cell has saved its state: a
    worker left waiting for work that will never come would live forever); progress goes to
    ``messages`` (a queue the parent drains; a put to a parent that is gone fails, and
    :func:`report` ignores it); ``stopping``: the pool's stop flag, which :func:`guarded`
    reads before it begins a cell."""
    global _sink, _stopping
    die_with_parent(parent, signal.SIGTERM, _parent_gone)
    signal.signal(signal.SIGINT, _worker_sigint)
    if messages is not None:
        _sink = messages.put
    _stopping = stopping


# ---------------------------------------------------------------------- the cells
def _raise_stop(signum: int, frame: Any) -> None:
    raise Stopped(signum)


def install(handlers: Any) -> Any:
    """Set SIGINT and SIGTERM handlers (one function, or a dict as returned); returns the
    previous ones. Only the main thread may: elsewhere, nothing changes."""
    if threading.current_thread() is not threading.main_thread() or handlers is None:
        return None
    sigs = (signal.SIGINT, signal.SIGTERM)
    new = handlers if isinstance(handlers, dict) else dict.fromkeys(sigs, handlers)
    # a handler set outside Python reads as None and cannot be set back: leave it
    return {s: signal.signal(s, h) for s, h in new.items() if h is not None}


def run_cells(
    keys: list[str],
    task: Callable[..., str],
    args: dict[str, tuple],
    workers: int,
    done: Callable[[str, dict], None],
    sink: Callable[[tuple], None] | None = None,
) -> None:
    """``guarded(task, *args[key])`` for every key (a cell's run directory), in this process
    one after the other (``workers`` 1) or in ``workers`` spawned processes; ``done(key,
    outcome)`` as each ends, in this thread; progress messages go to ``sink``. A signal, or a
    cell stopped by one, stops them all (:class:`Stopped`; the running cells save first)."""
    global _sink
    if not keys:
        return
    old = install(_raise_stop)
    before = _sink
    try:
        if workers == 1:
            _sink = sink
            _in_process(keys, task, args, done)
        else:
            _in_pool(keys, task, args, workers, done, sink)
    finally:
        _sink = before
        install(old)


def _in_process(keys: list[str], task: Callable, args: dict, done: Callable) -> None:
    """One worker: the cells run in this process, one after the other."""
    before = torch.get_num_threads()  # the cells run here: leave the caller's setting
    try:
        for key in keys:
            res = guarded(task, *args[key])
            done(key, res)
            if res["status"] == "interrupted":
                raise Stopped(res["signum"])
    finally:
        torch.set_num_threads(before)


def _deliver(messages: Any, sink: Callable[[tuple], None] | None, lock: threading.Lock) -> None:
    """Hand every message waiting in ``messages`` to ``sink`` (under ``lock``, so that a
    cell's last rounds are shown before the cell is reported done)."""
    with lock:
        while not messages.empty():
            message = messages.get()
            if sink is not None:
                with contextlib.suppress(Exception):
                    sink(message)


def _drain(
    messages: Any, sink: Callable[[tuple], None] | None, lock: threading.Lock, stop: Any
) -> None:
    """Deliver the workers' progress messages as they come, until ``stop`` is set."""
    while not stop.is_set():
        try:
            _deliver(messages, sink, lock)
        except (EOFError, OSError, ValueError):  # the queue is closed
            return
        stop.wait(0.05)


def _in_pool(
    keys: list[str],
    task: Callable,
    args: dict,
    n_workers: int,
    done: Callable,
    sink: Callable[[tuple], None] | None,
) -> None:
    """``n_workers`` spawned processes (which die with this one, see :func:`_worker_init`).
    A signal here, or a cell stopped by one, cancels the cells not started and stops the
    running ones (SIGINT: they save their state), then :class:`Stopped` propagates. The
    executor hands a worker one cell beyond those running, which ``cancel`` cannot take
    back: the stop flag makes such a cell return at once, not started (it stays pending)."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    # a worker's put() writes to the pipe before its cell's result is sent: delivering what
    # is waiting before ``done`` shows every round of a cell before the cell ends
    messages = ctx.SimpleQueue()
    stopping = ctx.Event()
    lock, stop_drain = threading.Lock(), threading.Event()
    drain = threading.Thread(target=_drain, args=(messages, sink, lock, stop_drain), daemon=True)
    drain.start()
    pool = ProcessPoolExecutor(
        n_workers,
        mp_context=ctx,
        initializer=_worker_init,
        initargs=(os.getpid(), messages, stopping),
    )
    futs: dict[Future, str] = {}
    recorded: set[Future] = set()

    def collect(fut: Future) -> dict:
        recorded.add(fut)
        try:
            return fut.result()
        except KeyboardInterrupt:
            return {"status": "interrupted", "signum": int(signal.SIGINT), "saved_round": None}
        except Exception as e:  # noqa: BLE001 - a worker that died (killed, out of memory)
            return {"status": "failed", "reason": f"{type(e).__name__}: {e}"}

    stop: int | None = None
    try:
        futs = {pool.submit(guarded, task, *args[k]): k for k in keys}
        pending = set(futs)
        while pending and stop is None:
            finished, pending = wait(pending, return_when=FIRST_COMPLETED)
            for fut in finished:
                res = collect(fut)
                _deliver(messages, sink, lock)
                done(futs[fut], res)
                if res["status"] == "interrupted":
                    stop = res["signum"]
    except Stopped as e:
        stop = e.signum
    finally:
        if stop is not None:
            install(dict.fromkeys((signal.SIGINT, signal.SIGTERM), signal.SIG_IGN))
            stopping.set()
            for fut in futs:
                fut.cancel()
            # a worker freed by a stopped cell may have begun the next one before the flag
            # was set: signal each cell's worker once it holds the cell's lock, until all end
            signalled: set[tuple[int, str]] = set()
            while not all(f.done() for f in futs):
                _interrupt_running([futs[f] for f in futs if f.running()], signalled)
                wait([f for f in futs if not f.done()], timeout=0.2)
        pool.shutdown(wait=True, cancel_futures=True)
        for fut, key in futs.items():  # the cells that ended while the others stopped
            if fut not in recorded and fut.done() and not fut.cancelled():
                res = collect(fut)
                if res["status"] != NOT_STARTED:
                    done(key, res)
        stop_drain.set()
        drain.join()
        messages.close()
    if stop is not None:
        raise Stopped(stop)


def _interrupt_running(keys: list[str], signalled: set[tuple[int, str]]) -> None:
    """SIGINT to the workers running the cells ``keys`` (the holders of their run locks), so
    that they save their last whole round and stop; once per worker and cell (``signalled``)."""
    import multiprocessing as mp

    ours = {p.pid for p in mp.active_children()}
    for key in keys:
        pid = (lock_holder(Path(key) / LOCK_FILE) or {}).get("pid")
        if pid is not None and pid in ours and (pid, key) not in signalled:
            signalled.add((pid, key))
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGINT)


def run_job(cfg_dict: dict, run_dir: str, workers: int, overwrite: bool) -> str:
    """One cell of ``fedshift run --jobs N``: the resolved config run into its claimed
    directory (emptied first, holding its lock, with ``overwrite``), its clients in
    ``workers`` processes, torch at the config's ``run.threads`` (as a sequential run)."""
    path = Path(run_dir)
    cfg = resolve(cfg_dict, source=f"{run_dir}/config.yaml")
    torch.set_num_threads(cfg.run.threads)
    with hold_run(path):
        if overwrite:
            clear_run_dir(path)
        report("start", run_dir, cfg.train.rounds)
        transport = make_transport(cfg, workers=workers)
        try:
            hooks = [RoundReport(path, cfg.train.rounds)]
            Simulation(cfg, path, progress=False, transport=transport, hooks=hooks).run()
        finally:
            transport.close()
    return "ran"


def run_grid(
    title: str,
    rows: list[tuple[str, str, int]],
    task: Callable[..., str],
    args: dict[str, tuple],
    workers: int,
    progress: bool = True,
    every_s: float = EVERY_S,
    on_done: Callable[[str, dict], None] | None = None,
    stops_early: set[str] | None = None,
) -> dict[str, str]:
    """The grid runner of ``fedshift bench`` (:mod:`fedshift.bench`, and so of the studies)
    and ``fedshift run --jobs``: ``task(*args[key])`` per key (a cell's run directory) in
    ``workers`` processes (:func:`run_cells`), the live progress of every ``(key, label,
    rounds)`` row (one not in ``args``: shown done; one in ``stops_early`` may end before its
    rounds: its ETA is an upper bound), ``on_done(key, outcome)`` as each ends.
    Returns ``{key: reason}`` of the failed cells; a signal raises ``Stopped``."""
    finished = {key for key, _, _ in rows} - set(args)
    display = CellProgress(
        title, rows, finished, enabled=progress, every_s=every_s, stops_early=stops_early
    )
    failed: dict[str, str] = {}

    def done(key: str, res: dict) -> None:
        if on_done is not None:
            on_done(key, res)
        if res["status"] == "failed":
            failed[key] = res["reason"]
        display.finish(key, res["status"])

    try:
        run_cells(list(args), task, args, workers, done, display.handle)
    finally:
        display.close()
    return failed
