"""Flower's ``Grid`` as a transport of the round loop: every client behind a SuperNode.

:class:`GridTransport` is what :class:`~fedshift.runtime.loop.RoundLoop` talks to on Flower
(the loop itself, with sampling, aggregation, ledger, evaluation, checkpoints and resume, is
the same as a native run's):

1. ``connect``: wait for the SuperNodes, ask each who it is (``query.hello``) and describe the
   federation from their answers (clients in federation order, task, classes, image size).
   The server holds no data;
2. the setup exchange (``train.setup_reply`` / ``train.setup_receive``), each round's
   ``train`` messages and the ``evaluate`` messages (the global weights and each client's
   server view go down, scores come back);
3. client state never leaves the nodes. Each node keeps it in its Flower context and, with a
   snapshot folder (node-config ``state-dir``, or the run directory in a simulation), a
   snapshot after every round it worked in. Every message tells the nodes the run's key, the
   last round the server checkpointed (older snapshots can go) and, after a resume, the round
   to restart from: a resumed Flower run continues exactly like a native one.

Lost SuperNodes. A sampled client whose node has gone, or whose reply does not come within
``round_timeout`` seconds, is *lost* for that exchange; the loop completes the round without
it when at least ``min_clients`` replied (default: all, so numbers never change silently).
A client that replies with an error (its code raised) always stops the run, with its reason.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import torch
import yaml
from flwr.app import ConfigRecord, Message, RecordDict
from flwr.common.constant import ErrorCode
from flwr.serverapp import Grid
from flwr.superlink.grid.http_grid import HttpGrid

import fedshift
from fedshift.core.config import RunConfig
from fedshift.core.errors import ConfigError, FedshiftError
from fedshift.core.federation import ClientData, Federation, Split
from fedshift.core.payload import Payload
from fedshift.flower.inprocess import InProcessGrid
from fedshift.flower.node import GLOBAL, HELLO, RUN, VIEW
from fedshift.flower.supernodes import wait_for_nodes
from fedshift.flower.wire import pack, payload_to_records, records_to_payload, tensors_to_record
from fedshift.runtime.experiment import Experiment
from fedshift.runtime.secagg import SecureAggregation
from fedshift.runtime.transport import SECURE_AGGREGATION, EvalRequest, RunIdentity, Scores
from fedshift.runtime.transports import TRANSPORTS

log = logging.getLogger("fedshift.flower")

#: pulls for replies from a SuperLink: the first after this many seconds, each next wait
#: 1.5x longer up to the cap (Flower's own loop waits a fixed 3 s between pulls)
PULL_FIRST, PULL_MAX = 0.05, 0.5

#: error codes meaning "the node or its reply is gone", not "the client's code failed"
LOST = (
    ErrorCode.NODE_UNAVAILABLE,
    ErrorCode.MESSAGE_UNAVAILABLE,
    ErrorCode.REPLY_MESSAGE_UNAVAILABLE,
    ErrorCode.CLIENT_APP_CRASHED,
)


@dataclass
class FlowerOptions:
    """How the ServerApp treats the federation (not part of the experiment's config, so a
    run's config digest is the same natively and on Flower)."""

    #: SuperNodes to wait for before round 1 (None: as many as the federation has clients,
    #: known only where the server can count them: simulation)
    nodes: int | None = None
    #: seconds to wait for them
    node_wait: float = 120.0
    #: seconds to wait for the replies of one exchange; a node silent that long is lost
    round_timeout: float = 3600.0
    #: replies a round needs to complete; None: every sampled client
    min_clients: int | None = None
    #: how the run was started, for the summary: simulation / deployment / in-process
    mode: str = "deployment"
    #: where nodes without a ``state-dir`` of their own keep per-round state snapshots
    #: (simulations: inside the run directory, so a killed simulation can resume)
    snapshot_dir: Path | None = None
    #: the command that continues a stopped run, ``{run_dir}`` standing for its directory
    #: (``fedshift flower local``: itself with ``--resume``); None: a Flower run of the same
    #: app with the run config ``resume``
    continue_with: str | None = None

    def check(self) -> None:
        if self.min_clients is not None and self.min_clients < 1:
            raise ConfigError(f"min-clients must be at least 1, got {self.min_clients}")
        if self.round_timeout <= 0 or self.node_wait <= 0:
            raise ConfigError("round-timeout and node-wait must be positive (seconds)")


@dataclass
class ClientInfo:
    name: str
    node: int
    index: int
    trains: bool
    info: dict = field(default_factory=dict)


class GridTransport:
    """The round loop's clients behind a Flower ``Grid`` (module docstring)."""

    name = "flower"
    Params: ClassVar[type | None] = None
    #: the registry's declarations (:mod:`fedshift.runtime.transport`): no ``run.executor``
    #: selects it (its entry point is the ServerApp, :mod:`fedshift.flower.server`); secure
    #: aggregation through Flower's SecAgg+ (``secure_train``); no privacy budget yet. Built
    #: by the ServerApp around its Grid, so it has no ``create``
    executor: ClassVar[str | None] = None
    worker_processes: ClassVar[bool] = False
    supports: ClassVar[frozenset[str]] = frozenset({SECURE_AGGREGATION})

    def __init__(
        self, grid: Grid, options: FlowerOptions, stop_check: Callable[[], None] | None = None
    ) -> None:
        options.check()
        self.grid = grid
        self.options = options
        #: called while waiting for nodes and replies: raises to stop the run (a signal
        #: recorded for a ServerApp in a thread of its own, SignalGate.poll)
        self.stop_check = stop_check or (lambda: None)
        self.clients: dict[str, ClientInfo] = {}
        self.lost: dict[str, int] = {}  # client -> round it was first lost in
        self.eval_bytes = 0
        self.num_clients: int | None = None
        self.config_text = ""
        self.run: RunIdentity | None = None
        #: bytes of SecAgg+'s key exchange sent down (federation.secure_aggregation)
        self.key_bytes_down = 0

    # ------------------------------------------------------------------ messaging
    def run_record(self, rnd: int, cid: str, cfg: RunConfig | None = None) -> ConfigRecord:
        if cfg is not None:
            self.config_text = yaml.safe_dump(cfg.to_dict(), sort_keys=False)
        rec: dict = {"config": self.config_text, "round": rnd, "client": cid}
        if self.num_clients is not None:
            rec["num_clients"] = self.num_clients
        if self.run is not None:
            rec["run_key"] = self.run.key
            rec["checkpointed"] = self.run.checkpointed
            if self.run.resume_from is not None:
                rec["resume_from"] = self.run.resume_from
                rec["resume_state"] = cid in self.run.worked
        if self.options.snapshot_dir is not None:
            rec["snapshot_dir"] = str(self.options.snapshot_dir)
        return ConfigRecord(rec)

    def exchange(
        self, kind: str, rnd: int, contents: dict[str, RecordDict]
    ) -> tuple[dict[str, Message], list[str]]:
        """Send ``contents[cid]`` to each client's node as a ``kind`` message; return the
        replies by client and the clients lost (node gone, crashed, or silent past the
        timeout). A client whose code raised stops the run with its reason."""
        alive = set(self.grid.get_node_ids())
        messages, lost = [], []
        for cid, content in contents.items():
            node = self.clients[cid].node
            if node not in alive:
                lost.append(cid)
                continue
            content[RUN] = self.run_record(rnd, cid)
            messages.append(
                Message(content, dst_node_id=node, message_type=kind, group_id=str(rnd))
            )
        replies = send_and_receive(self.grid, messages, self.options.round_timeout, self.stop_check)
        by_cid = _match_replies(messages, replies, {c.node: n for n, c in self.clients.items()})
        out: dict[str, Message] = {}
        for cid in contents:
            if cid in lost:
                continue
            node = self.clients[cid].node
            reply = by_cid.get(cid)
            if reply is None:
                lost.append(cid)
            elif reply.has_error():
                if reply.error.code in LOST:
                    lost.append(cid)
                    continue
                raise FedshiftError(
                    f"round {rnd}: client {cid!r} (SuperNode {node}) failed in {kind!r}: "
                    f"{reply.error.reason}"
                )
            else:
                out[cid] = reply
        for cid in lost:
            self.lost.setdefault(cid, rnd)
        return out, lost

    def deliver(self, rnd: int, messages: list[Message], what: str) -> list[Message]:
        """Send ``messages`` and return their replies (those of lost nodes with their error);
        a client whose code raised stops the run with its reason (``what``: the exchange)."""
        replies = send_and_receive(self.grid, messages, self.options.round_timeout,
                                   self.stop_check)  # fmt: skip
        client_of = {c.node: name for name, c in self.clients.items()}
        for r in replies:
            if r.has_error() and r.error.code not in LOST:
                node = r.metadata.src_node_id
                raise FedshiftError(
                    f"round {rnd}: client {client_of.get(node, node)!r} (SuperNode {node}) "
                    f"failed in {what}: {r.error.reason}"
                )
        return replies

    def wait_for_nodes(self) -> list[int]:
        """The run's SuperNodes (:func:`fedshift.flower.supernodes.wait_for_nodes`)."""
        return wait_for_nodes(self.grid, self.options, self.stop_check)

    def connect(self, cfg: RunConfig) -> Federation:
        """Ask every node who it is; the clients in federation order (node-reported index,
        then name) and a data-less federation with the shared task, classes and shape."""
        nodes = self.wait_for_nodes()
        msgs = [
            Message(
                RecordDict({RUN: self.run_record(0, "", cfg)}),
                dst_node_id=n,
                message_type="query.hello",
                group_id="hello",
            )
            for n in nodes
        ]
        replies = send_and_receive(self.grid, msgs, self.options.round_timeout, self.stop_check)
        node_of = {m.metadata.message_id: m.metadata.dst_node_id for m in msgs}
        infos: list[ClientInfo] = []
        for r in replies:
            node = node_of.get(r.metadata.reply_to_message_id, r.metadata.src_node_id)
            if r.has_error():
                raise FedshiftError(
                    f"SuperNode {node} could not start its client: {r.error.reason}"
                )
            info = dict(r.content.config_records[HELLO])
            if info.get("fedshift") != fedshift.__version__:
                raise FedshiftError(
                    f"SuperNode {node} (client {info['client']!r}) runs fedshift "
                    f"{info.get('fedshift')} but the ServerApp runs {fedshift.__version__}; "
                    "install the same version everywhere"
                )
            infos.append(
                ClientInfo(info["client"], node, int(info["index"]), bool(info["trains"]), info)
            )
        if len(infos) < len(nodes):
            missing = sorted(set(nodes) - {i.node for i in infos})
            raise FedshiftError(f"SuperNode(s) {missing} did not answer the hello message")
        names = [i.name for i in infos]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise FedshiftError(
                f"several SuperNodes claim client(s) {dup}: give each SuperNode its own "
                "--node-config client=..."
            )
        check_federation(infos)
        first = infos[0].info
        for i in infos[1:]:
            for k in ("dataset", "task", "classes", "input_shape"):
                if _plain(i.info[k]) != _plain(first[k]):
                    raise FedshiftError(
                        f"SuperNodes disagree on the data: client {i.name!r} has {k}="
                        f"{i.info[k]!r} but {infos[0].name!r} has {first[k]!r}"
                    )
        infos.sort(key=lambda i: (i.index, i.name))
        self.clients = {i.name: i for i in infos}
        c, h, w = (int(s) for s in first["input_shape"])

        def empty() -> Split:
            return Split(torch.zeros(0, c, h, w), torch.zeros(0, dtype=torch.long))

        clients = [ClientData(i.name, empty(), empty(), empty()) for i in infos]
        info = {"dh": first["dh"]} if "dh" in first else {}
        return Federation(
            str(first["dataset"]), clients, list(first["classes"]), (c, h, w), info,
            str(first["task"]),
        )  # fmt: skip

    # ------------------------------------------------------------------ transport
    def attach(self, exp: Experiment, run: RunIdentity) -> None:
        self.exp = exp
        self.run = run
        self.num_clients = len(exp.train_clients)

    def setup_reply(self, cids: list[str]) -> tuple[dict[str, Payload], list[str]]:
        replies, lost = self.exchange("train.setup_reply", 0, {c: RecordDict() for c in cids})
        return {c: records_to_payload(r.content, self.exp.device) for c, r in replies.items()}, lost

    def setup_receive(self, downs: dict[str, Payload]) -> list[str]:
        contents = {cid: payload_to_records(d) for cid, d in downs.items()}
        return self.exchange("train.setup_receive", 0, contents)[1]

    def train(
        self, rnd: int, cids: list[str], down: Callable[[str], Payload]
    ) -> tuple[dict[str, Payload], list[str]]:
        contents = {cid: payload_to_records(down(cid)) for cid in cids}
        replies, lost = self.exchange("train", rnd, contents)
        dev = self.exp.device
        return {cid: records_to_payload(r.content, dev) for cid, r in replies.items()}, lost

    def secure_train(
        self, rnd: int, cids: list[str], down: Callable[[str], Payload], secure: SecureAggregation
    ) -> tuple[dict[str, Payload], list[str], Payload]:
        """``train`` with federation.secure_aggregation: the round through Flower's SecAgg+
        (:func:`fedshift.flower.secagg.secure_round`); what the server received from each
        client (masked), the clients lost, and the round's secure mean."""
        from fedshift.flower.secagg import secure_round

        def num_train(cid: str) -> int:
            return int(self.clients[cid].info["num_train"])

        def weight(cid: str) -> float:
            return float(secure.weight(Payload({}, num_examples=num_train(cid))))

        alive = set(self.grid.get_node_ids())
        contents = {}
        for cid in cids:
            if self.clients[cid].node in alive:
                contents[cid] = payload_to_records(down(cid))
                contents[cid][RUN] = self.run_record(rnd, cid)
        done = secure_round(self, secure, rnd, cids, contents, weight, num_train)
        for cid in done.lost:
            self.lost.setdefault(cid, rnd)
        self.key_bytes_down += done.key_bytes_down
        return done.replies, done.lost, done.total

    def evaluate(
        self, rnd: int, cids: list[str], request: EvalRequest
    ) -> tuple[dict[str, Scores], list[str]]:
        g = request.global_weights
        global_rec = None if g is None else tensors_to_record(g)  # serialised once for all
        contents = {}
        for cid in cids:
            content = RecordDict()
            if global_rec is not None:
                content[GLOBAL] = global_rec
            if cid in request.views:
                content[VIEW] = pack(request.views[cid])
            if cid in request.extra:
                for name, tensors in request.extra[cid].records.items():
                    content[name] = tensors_to_record(tensors)
            self.eval_bytes += sum(rec.count_bytes() for rec in content.array_records.values())
            contents[cid] = content
        replies, lost = self.exchange("evaluate", rnd, contents)
        scores = {
            cid: {kind: dict(rec) for kind, rec in r.content.metric_records.items()}
            for cid, r in replies.items()
        }
        return scores, lost

    def state_dict(self) -> dict | None:
        return None  # client state stays on the nodes (their snapshots)

    def load_state_dict(self, state: dict | None) -> None:
        refuse_native_state(state)

    def begin_round(self, cids: list[str]) -> None:
        pass  # a node snapshots each round's state; a resume names the round to go back to

    def rollback(self) -> None:
        pass

    def info(self) -> dict:
        return {
            "engine": "flower",
            "mode": self.options.mode,
            "flwr": _flwr_version(),
            "nodes": {cid: c.node for cid, c in self.clients.items()},
            "lost": self.lost,
            "min_clients": self.options.min_clients,
            "eval_bytes": self.eval_bytes,
            **({"secure_aggregation": {"protocol": "flower SecAgg+",
                                       "key_bytes_down": self.key_bytes_down}}
               if self.key_bytes_down else {}),
        }  # fmt: skip

    def close(self) -> None:
        """Nothing to stop: the Grid (and its SuperNodes) belong to the ServerApp."""


#: the one registration (the others: :mod:`fedshift.runtime.transports`); made when Flower's
#: side is imported, so `flwr` stays out of every other command
TRANSPORTS.add(GridTransport.name, GridTransport, GridTransport.Params)


def check_federation(infos: list[ClientInfo]) -> None:
    """Refuse, before round 1, a run whose SuperNodes do not cover the config's federation:
    each node reports the clients of the federation it loaded (all of them where it loads the
    whole dataset, as in a simulation, where Flower numbers the nodes ``partition-id``), and
    fedshift trains one client per node, so a client without a node would silently not take
    part (Flower's default local simulation starts 2 SuperNodes, whatever the config has)."""
    federation: list[str] = []
    for i in infos:
        federation += [str(c) for c in i.info.get("federation", []) if c not in federation]
    connected = {i.name for i in infos}
    missing = [c for c in federation if c not in connected]
    if missing:
        n = len(federation)
        raise FedshiftError(
            f"{len(infos)} SuperNode(s) connected, but the config's federation has {n} clients "
            f"({', '.join(federation)}); fedshift runs one client per SuperNode, and "
            f"{', '.join(missing)} would have none. Run it with {n} SuperNodes: in a "
            f'simulation, flwr run APP_DIR --federation-config "num-supernodes={n}" (the '
            "README of an app written by `fedshift flower app` gives the command); in a "
            "deployment, start one SuperNode per client (--node-config client=...)"
        )


def refuse_native_state(state: dict | None) -> None:
    """A checkpoint that holds every client's state was written by a native run (``fedshift
    run`` / ``bench``), whose clients never had a SuperNode or its snapshots: a Flower resume
    would start every client from scratch, another run. One error that says where to go."""
    if state is not None:
        raise FedshiftError(
            "this checkpoint holds every client's state: it was written by a native run "
            "(`fedshift run` or `fedshift bench`), not on Flower, whose clients keep their "
            "state on the nodes; continue it with `fedshift run --resume RUN_DIR`, not on Flower"
        )


def send_and_receive(
    grid: Grid,
    messages: list[Message],
    timeout: float,
    stop_check: Callable[[], None] = lambda: None,
) -> list[Message]:
    """Push ``messages`` and collect their replies until all came or ``timeout`` seconds
    passed. The replies are pulled after a short wait that grows to :data:`PULL_MAX`
    seconds, so an exchange ends about when its last reply arrives; ``stop_check`` runs
    before each wait (it raises to stop the run: a signal). The in-process grid answers
    at once (its ClientApps run in this thread)."""
    if isinstance(grid, InProcessGrid):
        return list(grid.send_and_receive(messages, timeout=timeout))
    pending = set(grid.push_messages(messages))
    replies: list[Message] = []
    end = time.monotonic() + timeout
    wait = PULL_FIRST
    # a SuperLink over the network: up to PULL_MAX between pulls; the in-memory grid of a
    # simulation is cheap to ask, so no longer than Flower's own 0.1 s
    cap = PULL_MAX if isinstance(grid, HttpGrid) else 0.1
    while pending:
        stop_check()
        remaining = end - time.monotonic()
        if remaining <= 0:
            break
        time.sleep(min(wait, remaining))
        wait = min(wait * 1.5, cap)
        got = list(grid.pull_messages(pending))
        replies.extend(got)
        pending.difference_update(m.metadata.reply_to_message_id for m in got)
    return replies


def _flwr_version() -> str:
    from importlib.metadata import version

    return version("flwr")


def _match_replies(
    sent: list[Message], replies: list[Message], client_of: dict[int, str]
) -> dict[str, Message]:
    """Replies by client. A reply names the message it answers (``reply_to_message_id``);
    the SuperLink's own "node unavailable" error comes from the SuperLink, not from the
    node, so the source node id alone cannot tell whose it is."""
    by_id = {m.metadata.message_id: client_of[m.metadata.dst_node_id] for m in sent}
    out = {}
    for r in replies:
        cid = by_id.get(r.metadata.reply_to_message_id) or client_of.get(r.metadata.src_node_id)
        if cid is not None:
            out[cid] = r
    return out


def _plain(value: object) -> object:
    """Record values compare as plain Python (a ConfigRecord may hand back lists or tuples)."""
    return list(value) if isinstance(value, list | tuple) else value
