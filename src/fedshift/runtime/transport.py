"""How the round loop reaches its clients: the :class:`Transport` interface.

The loop (:mod:`fedshift.runtime.loop`, with its hooks: :mod:`fedshift.runtime.hooks`) owns
everything that is the same for every way of running a federation: the server state, client
sampling, the setup exchange, aggregation, the ledger, reply checks, evaluation rows, model
selection, checkpoints and resume, progress and the summary. A transport only delivers
messages and brings back replies:

============================  ===============================================================
``connect(cfg)``              the federation the server builds the experiment from (natively
                              the loaded data; on Flower a data-less description the
                              SuperNodes report)
``attach(exp, run)``          the experiment is built: prepare the clients (natively: their
                              initial state; on Flower: nothing, nodes build their own)
``setup_reply(cids)``         round 0, up: each client's setup records (FedRDN's statistics)
``setup_receive(downs)``      round 0, down: the server's setup records
``train(rnd, cids, down)``    one round of local work; ``down(cid)`` is the broadcast payload
                              (recorded in the ledger when it is asked for); returns the
                              replies and the clients lost on the way
``evaluate(rnd, request)``    every client scores its val/test splits; returns the scores and
                              the clients lost
``state_dict()`` / ``load_state_dict(s)``  client state the server may checkpoint (natively all
                              of it; on Flower none: it stays on the nodes, which keep
                              per-round snapshots instead)
``begin_round(cids)`` / ``rollback()``  make the round's client work undoable, so a run
                              interrupted mid-round saves the state of the last whole round
``info()``                    what the summary records about the transport (``runtime``)
``close()``                   the run is over: stop what the transport started (the pool
                              transport's worker processes; in-process and on Flower: nothing)
============================  ===============================================================

Every transport class declares, as class attributes, what the registry of transports
(:data:`fedshift.runtime.transports.TRANSPORTS`) and the loop read of it:

============================  ===============================================================
``name``                      its registered name (``native``, ``vmap``, ``pool``, ``flower``)
``Params``                    its parameter dataclass (None: it takes none)
``executor``                  the ``run.executor`` value that selects it for a run on this
                              machine (None: it has its own entry point, as Flower's)
``worker_processes``          whether it runs the clients in worker processes (chosen for
                              ``run.workers`` > 1 or a running pool)
``supports``                  the config keys it can serve (:data:`FEATURES`: secure
                              aggregation, which wraps it in a
                              :class:`~fedshift.runtime.secagg.SecureTransport`; the privacy
                              budget, DP-FedAvg's :class:`~fedshift.runtime.dp_updates.
                              DPTransport` included); the loop refuses a run asking for one it
                              does not (:func:`check_supported`)
============================  ===============================================================

Four implementations: :class:`fedshift.runtime.native.InProcessTransport` (``native``:
clients in this process, one after another), :class:`fedshift.runtime.vmap.VmapTransport`
(``vmap``: the same, a round's clients trained together: ``run.executor=vmap``),
:class:`fedshift.runtime.pool.transport.PoolTransport` (``pool``: clients in long-lived worker
processes of this machine, ``run.workers``) and
:class:`fedshift.flower.transport.GridTransport` (``flower``: clients behind Flower
SuperNodes, in simulation or deployed; its own entry point, ``fedshift flower``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from fedshift.core.errors import ConfigError, FedshiftError
from fedshift.core.payload import Payload, Tensors

if TYPE_CHECKING:
    from fedshift.core.config import RunConfig
    from fedshift.core.federation import Federation
    from fedshift.runtime.experiment import Experiment

#: scores of one client: ``{"global": {...}, "personal": {...}}``
Scores = dict[str, dict[str, float]]


@dataclass
class RunIdentity:
    """What every client of a run is told about the run it serves."""

    #: a random id fixed when the run starts and kept across resumes: where nodes keep their
    #: per-round state snapshots
    key: str
    #: the round a resumed run restarts from (its checkpoint); ``None`` for a fresh start
    resume_from: int | None = None
    #: the last round the server checkpointed: snapshots older than it can go
    checkpointed: int = 0
    #: after a resume: the clients whose state changed up to ``resume_from`` (set-up or a
    #: round they trained in); each must restore it, the others start from their initial state
    worked: set[str] = field(default_factory=set)


def held_client_state(state: dict | None) -> dict:
    """The client state a checkpoint holds, for a transport that keeps its clients' state
    (in-process, pool). ``None`` is a checkpoint of a run on Flower, whose clients keep their
    state on the nodes (per-round snapshots): loading it here would start every client from
    its initial state, silently another run, so it is refused, naming where to continue."""
    if state is None:
        raise FedshiftError(
            "this checkpoint holds no client state: it was written by a run on Flower, whose "
            "clients keep their state on the nodes; continue it on Flower (a simulation: "
            "`fedshift flower simulate --resume RUN_DIR`; a deployment: the run config "
            "resume=RUN_DIR), not with `fedshift run --resume`"
        )
    return state


@dataclass
class EvalRequest:
    """What the server sends for one evaluation: the global weights once (``None`` when the
    run has no global model), each client's server view for its personal model, and the
    records a held-out client needs first (``extra``)."""

    global_weights: Tensors | None
    views: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Payload] = field(default_factory=dict)


#: what a transport can declare it serves (its ``supports``), each the config key asking for
#: it: secure aggregation (the loop wraps the transport in ``SecureTransport``) and the
#: privacy budget (noisy shared statistics; with ``privacy.updates=client`` the loop wraps
#: the transport in DP-FedAvg's ``DPTransport``)
SECURE_AGGREGATION = "federation.secure_aggregation"
PRIVACY = "privacy.epsilon"
FEATURES = (SECURE_AGGREGATION, PRIVACY)


class SequentialTransport:
    """The registry declarations fedshift's own ``run.executor=sequential`` transports share
    (``native``: the clients in this process; ``pool``: in worker processes, selected with
    more than one worker or a running pool): no ``transport.*`` keys, every :data:`FEATURES`
    served. A subclass declares its ``name`` and ``worker_processes``."""

    Params: ClassVar[type | None] = None
    executor: ClassVar[str | None] = "sequential"
    supports: ClassVar[frozenset[str]] = frozenset(FEATURES)


def asked_features(cfg: RunConfig) -> list[str]:
    """The :data:`FEATURES` ``cfg`` turns on, by config key."""
    asked = {SECURE_AGGREGATION: cfg.federation.secure_aggregation,
             PRIVACY: cfg.privacy.epsilon is not None}  # fmt: skip
    return [k for k in FEATURES if asked[k]]


def check_supported(transport: object, cfg: RunConfig, fix: str = "") -> None:
    """Refuse a run that turns on a feature the transport (a class or an instance) does not
    declare in its ``supports``: a :class:`ConfigError` naming the key, the transport and
    ``fix`` (default: turn the key off)."""
    supports: frozenset[str] = getattr(transport, "supports", frozenset())
    missing = [k for k in asked_features(cfg) if k not in supports]
    if missing:
        name = getattr(transport, "name", type(transport).__name__)
        raise ConfigError(
            f"config key {missing[0]!r}: not available on the {name!r} transport (it does not "
            f"declare it in its `supports`); {fix or 'turn it off'}"
        )


class Transport(Protocol):
    """The message layer under :class:`~fedshift.runtime.loop.RoundLoop` (see the module
    docstring for each call and each declaration)."""

    name: str

    @property
    def supports(self) -> frozenset[str]: ...

    def connect(self, cfg: RunConfig) -> Federation: ...

    def attach(self, exp: Experiment, run: RunIdentity) -> None: ...

    def setup_reply(self, cids: list[str]) -> tuple[dict[str, Payload], list[str]]: ...

    def setup_receive(self, downs: dict[str, Payload]) -> list[str]: ...

    def train(
        self, rnd: int, cids: list[str], down: Callable[[str], Payload]
    ) -> tuple[dict[str, Payload], list[str]]: ...

    def evaluate(
        self, rnd: int, cids: list[str], request: EvalRequest
    ) -> tuple[dict[str, Scores], list[str]]: ...

    def state_dict(self) -> dict | None: ...

    def load_state_dict(self, state: dict | None) -> None: ...

    def begin_round(self, cids: list[str]) -> None: ...

    def rollback(self) -> None: ...

    def info(self) -> dict | None: ...

    def close(self) -> None: ...


class WrappedTransport:
    """A transport around another (secure aggregation, DP-FedAvg): every call goes to the
    wrapped ``inner`` transport (its own attributes too); a subclass changes :meth:`train`
    and checks the experiment in :meth:`check` before any client state is built."""

    def __init__(self, inner: Transport) -> None:
        self.inner = inner
        self.name = inner.name
        self.supports: frozenset[str] = inner.supports

    def __getattr__(self, name: str) -> Any:  # the wrapped transport's own attributes
        return getattr(self.inner, name)

    def check(self, exp: Experiment) -> None:
        """Refuse an experiment the wrapper cannot protect (before any client state)."""

    def connect(self, cfg: RunConfig) -> Federation:
        return self.inner.connect(cfg)

    def attach(self, exp: Experiment, run: RunIdentity) -> None:
        self.check(exp)
        self.inner.attach(exp, run)

    def setup_reply(self, cids: list[str]) -> tuple[dict[str, Payload], list[str]]:
        return self.inner.setup_reply(cids)

    def setup_receive(self, downs: dict[str, Payload]) -> list[str]:
        return self.inner.setup_receive(downs)

    def train(
        self, rnd: int, cids: list[str], down: Callable[[str], Payload]
    ) -> tuple[dict[str, Payload], list[str]]:
        return self.inner.train(rnd, cids, down)

    def evaluate(
        self, rnd: int, cids: list[str], request: EvalRequest
    ) -> tuple[dict[str, Scores], list[str]]:
        return self.inner.evaluate(rnd, cids, request)

    def state_dict(self) -> dict | None:
        return self.inner.state_dict()

    def load_state_dict(self, state: dict | None) -> None:
        self.inner.load_state_dict(state)

    def begin_round(self, cids: list[str]) -> None:
        self.inner.begin_round(cids)

    def rollback(self) -> None:
        self.inner.rollback()

    def info(self) -> dict | None:
        return self.inner.info()

    def close(self) -> None:
        self.inner.close()
