"""The worker side of :mod:`fedshift.runtime.pool.transport`: one long-lived process holding some
clients of a run.

A worker builds the run's experiment itself from the resolved config (the same seeded
initial model, augments and input pipeline as the server's, and the algorithm's client half
only: :func:`~fedshift.runtime.experiment.build_experiment`, ``client_only``), loads the
federation itself (or takes a preloaded one once per run), and keeps its clients' state
between rounds, exactly like a Flower SuperNode (:mod:`fedshift.flower.node`). It then
answers one request at a time, in order, on its pipe (:func:`send` / :func:`recv`: tensors'
bytes out of band); every request is ``(seq, op, args)`` pickled, every reply
``(seq, (status, value))`` with status ``ok``, ``error`` (the exception, pickled when it
can be, with the worker's traceback) or ``cancelled``.

========================  =================================================================
``build(cfg, fed, t)``    set torch to ``t`` threads, load the federation, build the experiment
``clients(cids)``         this worker's clients: their initial state (``init_client_state``)
``setup_reply(cids)``     the augments' setup records of each client
``setup_receive(downs)``  take the server's setup records
``train(rnd, jobs, undo)``  each ``(cid, payload)`` in order: ``train_client``; first, a copy
                          of the state of the clients named in ``undo`` (generation, cids)
``evaluate(g, jobs)``     each ``(cid, view, extra)``: ``evaluate_client``
``get_states(cids)`` / ``set_states(states)``  the clients' state, for checkpoints and resume
``rollback(gen)``         restore the copies taken for generation ``gen``
``stop()``                reply, then exit
========================  =================================================================

Signals: the worker ignores SIGINT and SIGTERM (Ctrl-C reaches the whole process group; the
run's own process decides, and still needs the workers to roll the round back and gather the
state it saves). ``SIGUSR1`` cancels the request in progress if it is a cancellable one
(``train``, ``evaluate``, the setup exchange) whose sequence number is at most the one the
parent wrote in the shared ``cancel`` value: the parent's way to stop a round it is rolling
back without waiting for it. The worker dies with its parent (SIGKILL from the kernel on
Linux, and a thread polling the parent: :func:`fedshift.core.lifeline.die_with_parent`).
"""

from __future__ import annotations

import copy
import io
import os
import pickle
import signal
import struct
import sys
import traceback
from typing import Any

#: requests the parent may cancel (``SIGUSR1``) while they run
CANCELLABLE = frozenset({"train", "evaluate", "setup_reply", "setup_receive"})


# ---------------------------------------------------------------------------- messages
def _tensor(holder: list, dtype: Any, shape: tuple, stride: tuple, offset: int, grad: bool) -> Any:
    """A tensor over ``holder[0]`` (its storage's bytes, received out of band; tensors that
    shared a storage share the holder, and so the storage, again), as :class:`_Pickler`
    reduced it. A holder with a device (``[bytes, "cuda:0"]``: a GPU tensor's storage, sent
    through the host) gets its storage copied to that device once, by the first of its
    tensors; the others share that copy."""
    import torch

    if len(holder) == 3:  # a device storage an earlier tensor of this message rebuilt
        base = holder[2]
    else:
        buf = holder[0]
        base = (
            torch.frombuffer(buf, dtype=torch.uint8)
            if len(buf)
            else torch.empty(0, dtype=torch.uint8)
        )
        if len(holder) == 2:  # to the sender's device, once per storage
            base = base.to(holder[1])
            holder.append(base)
    t = base.view(dtype).as_strided(shape, stride, offset)
    return t.requires_grad_() if grad else t


class _Pickler(pickle.Pickler):
    """The standard pickler (protocol 5), with plain tensors reduced to their storage's raw
    bytes, passed out of band (``buffer_callback``: no copy here) once per storage and
    rebuilt over the received bytes without a copy: bit-exact, views kept, and many times
    faster than a tensor's own reduction (a ``torch.save`` per storage). A GPU tensor's
    storage is copied to the host once and goes the same way, with its device: the receiver
    puts it back there (messages carry host bytes, never a CUDA handle or a ``torch.save``
    of device memory). Anything else (parameters, other layouts, tensors in a graph) pickles
    as usual."""

    def __init__(self, file: Any, buffers: list) -> None:
        super().__init__(file, protocol=5, buffer_callback=buffers.append)
        #: storage -> a one-item list holding its bytes (two items for a device storage: its
        #: bytes and its device): pickle memoizes the list, so a storage shared by several
        #: tensors is sent once and shared again when read
        self.storages: dict[tuple[str, int, int], list] = {}

    def reducer_override(self, obj: Any) -> Any:
        import torch

        if (
            type(obj) is not torch.Tensor
            or obj.device.type == "meta"
            or obj.layout != torch.strided
            or obj.grad_fn is not None
            or obj.is_quantized
            or obj.is_conj()
            or obj.is_neg()
            or getattr(obj, "has_names", lambda: False)()
        ):
            return NotImplemented
        st = obj.untyped_storage()
        if st.nbytes() % obj.element_size():
            return NotImplemented
        key = (str(obj.device), st.data_ptr(), st.nbytes())
        holder = self.storages.get(key)
        if holder is None:
            raw = torch.empty(0, dtype=torch.uint8, device=obj.device).set_(st)
            # (ignores: numpy's stubs declare ndarray's buffer protocol for Python >= 3.12)
            if obj.device.type == "cpu":
                holder = [pickle.PickleBuffer(raw.numpy())]  # type: ignore[arg-type]
            else:  # the storage's bytes through the host, then back to its device
                holder = [pickle.PickleBuffer(raw.cpu().numpy()), str(obj.device)]  # type: ignore[arg-type]
            self.storages[key] = holder
        shape, stride = tuple(obj.shape), obj.stride()
        return _tensor, (holder, obj.dtype, shape, stride, obj.storage_offset(), obj.requires_grad)


def dumps(obj: Any) -> list:
    """``obj`` as the frames of a pool message: the pickle stream, then the raw bytes of each
    tensor storage it holds (:class:`_Pickler`); sent by :func:`send`."""
    f = io.BytesIO()
    buffers: list = []
    _Pickler(f, buffers).dump(obj)
    return [f.getvalue(), *buffers]


def loads(frames: list) -> Any:
    """The object :func:`dumps` turned into ``frames`` (without a pipe: tests, checks)."""
    return pickle.loads(frames[0], buffers=[bytearray(memoryview(b)) for b in frames[1:]])


#: raw reads and writes on the connection's descriptor (POSIX): each out-of-band buffer goes
#: from the socket straight into the memory its tensors are rebuilt over. Elsewhere each
#: buffer is its own ``multiprocessing`` message (which reads into a BytesIO, then copies).
RAW = os.name == "posix" and hasattr(os, "readv")


def send(conn: Any, frames: list) -> None:
    """Write one message (:func:`dumps`'s frames) on ``conn``: a header with the number and
    sizes of the out-of-band buffers and the pickle stream, then each buffer as it is (raw
    bytes on POSIX: the header says how many)."""
    views = [memoryview(b).cast("B") for b in frames[1:]]
    head = struct.pack(f"<I{len(views)}Q", len(views), *(v.nbytes for v in views))
    conn.send_bytes(head + frames[0])
    if RAW:
        fd = conn.fileno()
        for v in views:
            while v.nbytes:
                v = v[os.write(fd, v) :]
        return
    for v in views:
        conn.send_bytes(v)


def _read_exactly(fd: int, view: memoryview) -> None:
    while view.nbytes:
        n = os.readv(fd, [view])
        if not n:
            raise EOFError("the other end of the pool connection closed mid-message")
        view = view[n:]


def recv(conn: Any) -> Any:
    """Read one message written by :func:`send`: each buffer straight into fresh,
    uninitialised memory (the tensors are rebuilt over it; no zero-filling, no intermediate
    copy on POSIX), then the object."""
    import numpy as np

    head = memoryview(conn.recv_bytes())
    (n,) = struct.unpack_from("<I", head)
    sizes = struct.unpack_from(f"<{n}Q", head, 4)
    fd = conn.fileno() if RAW else -1
    buffers = []
    for size in sizes:
        buf = np.empty(size, dtype=np.uint8)
        if RAW:
            _read_exactly(fd, buf.data)
        elif size:
            conn.recv_bytes_into(buf)
        else:
            conn.recv_bytes()
        buffers.append(buf)
    return pickle.loads(head[4 + 8 * n :], buffers=buffers)


class Cancelled(BaseException):  # noqa: N818 - a cancellation, like KeyboardInterrupt
    """The parent cancelled the request in progress."""


class _Worker:
    """One worker's run: its experiment, clients and their state."""

    def __init__(self, index: int, cancel: Any) -> None:
        self.index = index
        self.cancel = cancel
        self.seq = 0
        self.cancellable = False
        self.exp: Any = None
        self.cfg: Any = None
        self.fed: Any = None
        self.initial: dict | None = None
        self.states: dict[str, dict] = {}
        self.undo: tuple[int, dict[str, dict]] | None = None
        #: federations loaded from a config, by dataset settings (a pool reused across runs)
        self.feds: dict[str, Any] = {}

    # ------------------------------------------------------------------ signals
    def on_cancel(self, signum: int, frame: Any) -> None:
        if self.cancellable and self.seq <= self.cancel.value:
            raise Cancelled

    # ------------------------------------------------------------------ requests
    def build(self, cfg_dict: dict, preloaded: Any, threads: int) -> None:
        import torch

        from fedshift.catalog import resolve
        from fedshift.data import federation_key, run_federation
        from fedshift.runtime.experiment import build_experiment

        torch.set_num_threads(threads)
        cfg = resolve(cfg_dict, source="the run config sent to the pool worker")
        if preloaded is not None:
            fed = run_federation(cfg, preloaded)
        else:
            key = federation_key(cfg)
            if key not in self.feds:
                self.feds.clear()  # one federation at a time: a pool serves one run
                self.feds[key] = run_federation(cfg)
            fed = self.feds[key]
        self.exp = None  # the previous run's, if any, goes first
        self.states, self.undo = {}, None
        self.cfg, self.fed = cfg, fed
        self.exp = build_experiment(cfg, fed, client_only=True)  # no server machinery
        self.exp.algo.register_clients(list(self.exp.train_clients))
        self.initial = {k: v.detach().clone() for k, v in self.exp.model.state_dict().items()}

    def clients(self, cids: list[str]) -> None:
        from fedshift.runtime.experiment import init_client_state

        exp = self.exp
        for cid in cids:
            if cid in exp.train_clients:
                data = exp.train_clients[cid]
            elif cid in exp.holdout:  # never trains; its augments' own statistics
                data = exp.fed.client(cid)
            else:  # evaluated only (central training's clients): no state, as in-process
                continue
            # init_client reads the model: the initial weights, whatever ran before
            exp.model.load_state_dict(self.initial)
            self.states[cid] = init_client_state(exp, exp.seed, cid, data)

    def setup_reply(self, cids: list[str]) -> dict:
        return {cid: self.exp.algo.setup_reply(cid, self.states[cid]) for cid in cids}

    def setup_receive(self, downs: dict) -> None:
        for cid, down in downs.items():
            self.exp.algo.setup_receive(down, self.states[cid])

    def train(self, rnd: int, jobs: list, undo: tuple[int, list[str]] | None) -> dict:
        from fedshift.core.seeding import rng_state
        from fedshift.runtime.client import train_client

        if undo is not None:
            gen, cids = undo
            self.undo = (gen, {cid: copy.deepcopy(self.states[cid]) for cid in cids})
        exp, ups = self.exp, []
        for cid, down in jobs:
            try:
                state, data = self.states[cid], exp.train_clients[cid]
                ups.append((cid, train_client(exp, exp.seed, cid, data, rnd, down, state)))
            except Exception as e:
                e.fedshift_client = cid  # type: ignore[attr-defined]
                raise
        # the global RNGs after the last client: the server continues from them, as it does
        # when every client runs in its process
        return {"ups": ups, "rng": rng_state()}

    def evaluate(self, global_weights: Any, jobs: list) -> dict:
        from fedshift.runtime.client import evaluate_client

        exp, bs, out = self.exp, self.exp.eval_batch_size, {}
        for cid, view, extra in jobs:
            try:
                out[cid] = evaluate_client(
                    exp, exp.fed.client(cid), self.states.get(cid), bs, global_weights, view,
                    extra,
                )  # fmt: skip
            except Exception as e:
                e.fedshift_client = cid  # type: ignore[attr-defined]
                raise
        return out

    def get_states(self, cids: list[str]) -> dict:
        return {cid: self.states[cid] for cid in cids if cid in self.states}

    def set_states(self, states: dict) -> None:
        self.states = dict(states)
        self.undo = None

    def rollback(self, gen: int) -> bool:
        undo, self.undo = self.undo, None
        if undo is None or undo[0] != gen:
            return False
        self.states.update(undo[1])
        return True


def _describe(e: BaseException) -> dict:
    """An exception as the parent re-raises it: pickled when it survives a round trip (its
    type and message are then the ones a sequential run shows), with the traceback text."""
    info: dict = {
        "type": f"{type(e).__module__}.{type(e).__qualname__}",
        "message": str(e),
        "traceback": "".join(traceback.format_exception(e)),
        "client": getattr(e, "fedshift_client", None),
    }
    try:
        blob = pickle.dumps(e)
        pickle.loads(blob)
        info["pickled"] = blob
    except Exception:  # noqa: BLE001 - an exception whose arguments do not pickle
        pass
    return info


def _exit() -> None:
    """Exit at once, without the interpreter's slow tear-down, but after multiprocessing's
    own clean-up (what a worker process runs when its target returns: the finalizers that
    release semaphores, e.g. tqdm's lock, which the resource tracker would otherwise report
    as leaked)."""
    from multiprocessing import util

    try:
        util._exit_function()  # type: ignore[attr-defined]  # private: not in typeshed
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def worker_main(conn: Any, parent: int, index: int, cancel: Any) -> None:
    """A pool worker's process (target of ``multiprocessing``'s spawn context)."""
    from fedshift.core.lifeline import die_with_parent

    die_with_parent(parent, signal.SIGKILL)  # nothing to save: the state is the parent's
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    worker = _Worker(index, cancel)
    if hasattr(signal, "SIGUSR1"):
        signal.signal(signal.SIGUSR1, worker.on_cancel)
    import torch  # noqa: F401 - the first request should not pay for the import

    import fedshift.runtime.client  # noqa: F401

    while True:
        try:
            seq, op, args = recv(conn)
        except (EOFError, OSError):
            return  # the parent closed the pipe: it is gone, or done with us
        if op == "stop":
            send(conn, dumps((seq, ("ok", None))))
            _exit()
        worker.seq = seq
        try:
            try:
                worker.cancellable = op in CANCELLABLE
                value = getattr(worker, op)(*args)
            finally:
                worker.cancellable = False
            reply: tuple = ("ok", value)
        except Cancelled:
            # raised by a signal anywhere, also between a no_grad block's entry and its
            # guard: the next request starts with autograd on, as a fresh worker would
            import torch

            torch.set_grad_enabled(True)
            reply = ("cancelled", None)
        except Exception as e:  # noqa: BLE001 - every error goes back to the parent
            reply = ("error", _describe(e))
        try:
            data = dumps((seq, reply))
        except Exception as e:  # noqa: BLE001 - a reply that cannot be pickled
            data = dumps((seq, ("error", _describe(e))))
        send(conn, data)
