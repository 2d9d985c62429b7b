"""The pool transport: a run's clients in long-lived worker processes (``run.workers``).

:class:`PoolTransport` is a :class:`~fedshift.runtime.transport.Transport` of the round loop
whose clients live in the processes of a :class:`WorkerPool` (``multiprocessing``'s spawn
context). It follows the Flower path's design (:mod:`fedshift.flower.node`): each worker
builds the experiment itself from the resolved config (the same seeded initial model,
augments, input pipeline; the algorithm's client half only), loads the federation itself and
keeps its clients' data and state between rounds (:mod:`fedshift.runtime.pool.worker`). Only
messages cross the process boundary: the broadcast payloads and the replies, the evaluation
requests (global weights, server views, held-out clients' records) and the scores, the setup
records, and the client states at checkpoints and on resume.

**Assignment.** Clients are assigned once per run, deterministically: the training clients,
largest training split first (ties: federation order), each to the worker with the fewest
training examples so far (ties: the lower index); clients that never train (held-out
clients, the federation's clients under ``central``) then round-robin. Results do not depend
on the assignment.

**Determinism.** A round's clients run in their workers in the sampled order, each with the
random streams derived from (seed, round, client), so every client computes what it computes
in one process; the replies come back in the sampled order, so aggregation sums in the same
order; the server's process takes over the global RNG state the last sampled client left (as
one process would). With the same ``run.threads`` (every process, server included) a run
with N workers gives the numbers of the sequential run, bit for bit (tests/runtime/test_same_run.py,
for every algorithm and augment).

**Failure.** An exception in a worker comes back to the run's process and is raised there
with its type and message (a note names the worker, the client and the worker's traceback);
a worker that dies (killed, out of memory) is a :class:`FedshiftError` naming it, never a
hang. Workers die with the run's process (:mod:`fedshift.core.lifeline`), and
:meth:`PoolTransport.close` stops them at the end of a run and on errors. SIGINT / SIGTERM:
the round in progress is cancelled in the workers (``SIGUSR1``) and rolled back from the
copies they took at its start; the loop then gathers the states of the last whole round and
saves them.

Messages are pickled, plain CPU tensors as their storages' raw bytes, rebuilt without a copy
(bit-exact, views kept; no shared memory). Each worker has an I/O thread in this process
that writes its requests and reads its replies, so a signal handler raising in the main
thread never leaves half a message in a pipe.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import queue
import signal
import threading
from collections.abc import Callable, Iterable
from typing import Any, ClassVar

from fedshift.core.config import RunConfig
from fedshift.core.errors import ConfigError, FedshiftError
from fedshift.core.federation import Federation
from fedshift.core.payload import Payload
from fedshift.core.seeding import set_rng_state
from fedshift.data import run_federation
from fedshift.runtime.experiment import Experiment
from fedshift.runtime.pool.worker import dumps, recv, send, worker_main
from fedshift.runtime.transport import (
    EvalRequest,
    RunIdentity,
    Scores,
    SequentialTransport,
    held_client_state,
)

__all__ = ["PoolTransport", "WorkerPool", "assign"]

#: seconds a stopped worker may take to exit before it is killed
STOP_GRACE_S = 5.0


# ---------------------------------------------------------------------------- the processes
class _Job:
    __slots__ = ("data", "done", "reply", "seq")

    def __init__(self, seq: int, data: list) -> None:
        self.seq = seq
        self.data = data
        self.reply: tuple | None = None
        self.done = threading.Event()


class _Link:
    """One worker process and the thread that talks to it (requests in order, one reply
    each)."""

    def __init__(self, index: int, proc: Any, conn: Any, cancel: Any) -> None:
        self.index = index
        self.proc = proc
        self.conn = conn
        self.cancel = cancel
        self.seq = 0
        self.jobs: queue.Queue[_Job | None] = queue.Queue()
        self.current: _Job | None = None
        self.dead: str | None = None
        self.thread = threading.Thread(
            target=self._serve, name=f"fedshift-pool-io-{index}", daemon=True
        )
        self.thread.start()

    def submit(self, op: str, args: tuple) -> _Job:
        self.seq += 1
        job = _Job(self.seq, dumps((self.seq, op, args)))
        self.jobs.put(job)
        self.current = job
        return job

    def _serve(self) -> None:
        if hasattr(signal, "pthread_sigmask"):  # signals are the main thread's business
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        while True:
            try:
                job = self.jobs.get(timeout=0.5)
            except queue.Empty:
                continue
            if job is None:
                return
            reply: tuple
            if self.dead is None:
                try:
                    send(self.conn, job.data)
                    seq, reply = recv(self.conn)
                except (EOFError, OSError):
                    self.dead = self._death()
                    reply = ("dead", self.dead)
                except Exception as e:  # noqa: BLE001 - a reply this process cannot unpickle
                    reply = ("error", {"type": type(e).__name__, "message": str(e)})
            else:
                reply = ("dead", self.dead)
            job.reply = reply
            job.done.set()

    def _death(self) -> str:
        self.proc.join(timeout=2.0)
        code = self.proc.exitcode
        if code is not None and code < 0:
            with contextlib.suppress(ValueError):
                how = f"killed by {signal.Signals(-code).name}"
                return f"pool worker {self.index} (pid {self.proc.pid}) died ({how})"
        how = f"exit code {code}" if code is not None else "its pipe closed"
        return f"pool worker {self.index} (pid {self.proc.pid}) died ({how})"

    def cancel_current(self) -> None:
        """Cancel the request in progress (if cancellable: see the worker's docstring)."""
        job = self.current
        if job is None or job.done.is_set() or not hasattr(signal, "SIGUSR1"):
            return
        self.cancel.value = job.seq
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, signal.SIGUSR1)


def _wait(job: _Job) -> tuple:
    # a short timeout: the main thread runs its signal handlers between the waits
    while not job.done.wait(0.2):
        pass
    assert job.reply is not None
    return job.reply


class WorkerPool:
    """``workers`` long-lived processes (spawn context) serving runs one at a time; a pool
    may serve several runs one after another (tests, benchmarks): each run rebuilds the
    workers' experiment. Use as a context manager, or call :meth:`close`."""

    def __init__(self, workers: int) -> None:
        import multiprocessing as mp

        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise ConfigError(f"a worker pool needs at least 1 worker, got {workers!r}")
        ctx = mp.get_context("spawn")
        self.links: list[_Link] = []
        self.closed = False
        #: requests the workers stopped when asked to (:meth:`settle`)
        self.cancelled = 0
        try:
            for i in range(workers):
                mine, theirs = ctx.Pipe(duplex=True)
                cancel = ctx.Value("q", 0, lock=False)
                proc = ctx.Process(
                    target=worker_main,
                    args=(theirs, os.getpid(), i, cancel),
                    name=f"fedshift-pool-{i}",
                    daemon=True,
                )
                proc.start()
                theirs.close()
                self.links.append(_Link(i, proc, mine, cancel))
        except BaseException:
            self.close()
            raise

    @property
    def size(self) -> int:
        return len(self.links)

    @property
    def pids(self) -> list[int]:
        return [link.proc.pid for link in self.links]

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def call(
        self,
        jobs: dict[int, tuple[str, tuple]],
        rank: Callable[[str | None], int] | None = None,
    ) -> dict[int, Any]:
        """Send ``jobs[i] = (op, args)`` to worker ``i`` (all at once), wait for every reply
        and return the values by worker. A worker's error is raised here (when several
        failed: the one whose client comes first by ``rank``, as a sequential run would
        have met it first); a dead worker is a :class:`FedshiftError`."""
        if self.closed:
            raise FedshiftError("the worker pool is closed")
        sent = {i: self.links[i].submit(op, args) for i, (op, args) in jobs.items()}
        replies = {i: _wait(job) for i, job in sent.items()}
        dead = [v for status, v in replies.values() if status == "dead"]
        if dead:
            raise FedshiftError(
                f"{dead[0]}: it was killed or ran out of memory. The run stopped; continue "
                "it from its last checkpoint with: fedshift run --resume RUN_DIR (fewer "
                "run.workers need less memory)"
            )
        errors = [(i, v) for i, (status, v) in replies.items() if status == "error"]
        if errors:
            order = rank or (lambda cid: 0)
            i, info = min(errors, key=lambda e: (order(e[1].get("client")), e[0]))
            raise _rebuild(info, self.links[i])
        if any(status == "cancelled" for status, _ in replies.values()):
            raise FedshiftError("a pool worker's request was cancelled")
        return {i: v for i, (_, v) in replies.items()}

    def settle(self) -> None:
        """Cancel the requests in progress and wait until every worker is idle (after an
        interruption, before the next request)."""
        for link in self.links:
            link.cancel_current()
        for link in self.links:
            if link.current is not None and _wait(link.current)[0] == "cancelled":
                self.cancelled += 1

    def close(self) -> None:
        """Stop the workers (killed after :data:`STOP_GRACE_S` if they do not exit) and
        their I/O threads. Safe to call twice."""
        if self.closed:
            return
        self.closed = True
        for link in self.links:
            link.cancel_current()
            link.submit("stop", ())
            link.jobs.put(None)
        for link in self.links:
            link.proc.join(timeout=STOP_GRACE_S)
            if link.proc.is_alive():
                link.proc.kill()
                link.proc.join(timeout=STOP_GRACE_S)
            link.thread.join(timeout=STOP_GRACE_S)
            with contextlib.suppress(OSError):
                link.conn.close()


def _rebuild(info: dict, link: _Link) -> BaseException:
    """The worker's exception, to raise here: the same type and message (unpickled), else a
    :class:`FedshiftError` naming its type; a note names the worker and holds its
    traceback."""
    exc: BaseException | None = None
    if "pickled" in info:
        with contextlib.suppress(Exception):
            exc = pickle.loads(info["pickled"])
    if not isinstance(exc, BaseException):
        exc = FedshiftError(f"{info['type']}: {info['message']}")
    who = f"pool worker {link.index} (pid {link.proc.pid})"
    if info.get("client") is not None:
        who += f", client {info['client']!r}"
    exc.add_note(f"[raised in {who}]\n{info.get('traceback', '').rstrip()}")
    return exc


# ---------------------------------------------------------------------------- the transport
def assign(train: dict[str, int], others: Iterable[str], workers: int) -> dict[str, int]:
    """Client -> worker (module docstring): ``train`` maps the training clients, in
    federation order, to their training examples; ``others`` never train."""
    load = [0] * workers
    out: dict[str, int] = {}
    order = sorted(range(len(train)), key=lambda k: -list(train.values())[k])
    names = list(train)
    for k in order:
        w = min(range(workers), key=lambda i: (load[i], i))
        out[names[k]] = w
        load[w] += train[names[k]]
    for j, cid in enumerate(c for c in others if c not in out):
        out[cid] = j % workers
    return out


class PoolTransport(SequentialTransport):
    """The round loop's clients in worker processes (module docstring). ``workers``: the
    size of the pool this transport starts (at most one worker per client), or ``pool``: a
    running :class:`WorkerPool` to use (left running by :meth:`close`). ``federation``: a
    pre-loaded dataset, sent to every worker once per run (tests, benchmarks)."""

    name = "pool"
    worker_processes: ClassVar[bool] = True

    @classmethod
    def create(
        cls, cfg: RunConfig, federation: Federation | None, workers: int, pool: WorkerPool | None
    ) -> PoolTransport:
        """The transport for a run (:func:`fedshift.runtime.transports.make_transport`):
        ``pool`` if given (left running), else ``workers`` processes of its own."""
        if pool is not None:
            return cls(federation, pool=pool)
        return cls(federation, workers=workers)

    def __init__(
        self,
        federation: Federation | None = None,
        workers: int = 2,
        pool: WorkerPool | None = None,
    ) -> None:
        self.preloaded = federation
        self.workers = workers
        self.pool = pool
        self.own_pool = pool is None
        self.where: dict[str, int] = {}
        self._gen = 0
        self._begun: tuple[int, list[str]] | None = None
        self._building = False

    # ------------------------------------------------------------------ set-up
    def connect(self, cfg: RunConfig) -> Federation:
        self.fed = run_federation(cfg, self.preloaded)
        self.cfg = cfg
        if self.pool is None:
            self.pool = WorkerPool(max(1, min(self.workers, len(self.fed.clients))))
        # the workers build their experiment while this process builds the server's
        args = (cfg.to_dict(), self.preloaded, cfg.run.threads)
        self._build = {i: link.submit("build", args) for i, link in enumerate(self.pool.links)}
        return self.fed

    def attach(self, exp: Experiment, run: RunIdentity) -> None:
        self.exp = exp
        pool = self._pool()
        for i, job in self._build.items():
            status, value = _wait(job)
            if status != "ok":
                raise _failed(status, value, pool.links[i])
        sizes = {cid: len(d.train) for cid, d in exp.train_clients.items()}
        self.where = assign(sizes, self.fed.client_names, pool.size)
        self.order = {cid: k for k, cid in enumerate(self.where)}
        pool.call({i: ("clients", (self._mine(i, self.where),)) for i in range(pool.size)})

    def _pool(self) -> WorkerPool:
        if self.pool is None:
            raise FedshiftError("the pool transport is not connected")
        return self.pool

    def _mine(self, i: int, cids: Iterable[str]) -> list[str]:
        return [cid for cid in cids if self.where[cid] == i]

    def _split(self, cids: Iterable[str]) -> dict[int, list[str]]:
        out: dict[int, list[str]] = {}
        for cid in cids:
            out.setdefault(self.where[cid], []).append(cid)
        return out

    # ------------------------------------------------------------------ messages
    def setup_reply(self, cids: list[str]) -> tuple[dict[str, Payload], list[str]]:
        parts = self._split(cids)
        got = self._pool().call({i: ("setup_reply", (c,)) for i, c in parts.items()})
        merged = {k: v for part in got.values() for k, v in part.items()}
        return {cid: merged[cid] for cid in cids}, []

    def setup_receive(self, downs: dict[str, Payload]) -> list[str]:
        parts = self._split(downs)
        jobs = {i: ("setup_receive", ({c: downs[c] for c in cs},)) for i, cs in parts.items()}
        self._pool().call(jobs)
        return []

    def train(
        self, rnd: int, cids: list[str], down: Callable[[str], Payload]
    ) -> tuple[dict[str, Payload], list[str]]:
        downs = {cid: down(cid) for cid in cids}  # in the sampled order: the ledger's
        begun = self._begun
        jobs = {}
        for i, mine in self._split(cids).items():
            undo = None if begun is None else (begun[0], self._mine(i, begun[1]))
            jobs[i] = ("train", (rnd, [(c, downs[c]) for c in mine], undo))
        got = self._pool().call(jobs, rank=_ranker(cids))
        ups = {cid: up for part in got.values() for cid, up in part["ups"]}
        if cids:
            set_rng_state(got[self.where[cids[-1]]]["rng"])
        return {cid: ups[cid] for cid in cids}, []

    def evaluate(
        self, rnd: int, cids: list[str], request: EvalRequest
    ) -> tuple[dict[str, Scores], list[str]]:
        jobs = {
            i: (
                "evaluate",
                (
                    request.global_weights,
                    [(c, request.views.get(c), request.extra.get(c)) for c in mine],
                ),
            )
            for i, mine in self._split(cids).items()
        }
        got = self._pool().call(jobs, rank=_ranker(cids))
        merged = {k: v for part in got.values() for k, v in part.items()}
        return {cid: merged[cid] for cid in cids}, []

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict:
        pool = self._pool()
        pool.settle()
        got = pool.call({i: ("get_states", (self._mine(i, self.where),)) for i in range(pool.size)})
        merged = {k: v for part in got.values() for k, v in part.items()}
        return {cid: merged[cid] for cid in self.where if cid in merged}

    def load_state_dict(self, state: dict | None) -> None:
        state = held_client_state(state)
        unknown = [cid for cid in state if cid not in self.where]
        if unknown:
            raise FedshiftError(f"client state for unknown client(s) {unknown}")
        pool = self._pool()
        pool.settle()
        jobs = {
            i: ("set_states", ({c: state[c] for c in self._mine(i, state)},))
            for i in range(pool.size)
        }
        pool.call(jobs)

    def begin_round(self, cids: list[str]) -> None:
        # the copies are taken by the workers when the round's train request arrives (nothing
        # changes a client's state in between); a generation number ties them to this round
        self._gen += 1
        self._begun = (self._gen, list(cids)) if cids else None

    def rollback(self) -> None:
        begun, self._begun = self._begun, None
        pool = self._pool()
        pool.settle()  # cancel the round in progress; its replies are dropped
        if begun is not None:
            pool.call({i: ("rollback", (begun[0],)) for i in range(pool.size)})

    def info(self) -> dict:
        return {
            "engine": "native",
            "executor": "pool",
            "workers": self._pool().size,
            "threads": self.cfg.run.threads,
        }

    def close(self) -> None:
        """Stop the pool this transport started; a pool given to it is left running (idle,
        ready for another run)."""
        if self.pool is None:
            return
        if self.own_pool:
            self.pool.close()
        else:
            with contextlib.suppress(FedshiftError):
                self.pool.settle()


def _ranker(cids: list[str]) -> Callable[[str | None], int]:
    pos = {cid: k for k, cid in enumerate(cids)}
    return lambda cid: pos.get(cid, -1) if cid is not None else -1


def _failed(status: str, value: Any, link: _Link) -> BaseException:
    if status == "dead":
        return FedshiftError(f"{value} while building the experiment")
    if status == "error":
        return _rebuild(value, link)
    return FedshiftError(f"pool worker {link.index}: the build was {status}")
