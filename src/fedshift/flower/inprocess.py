"""A Flower ``Grid`` that delivers messages to ClientApps in this process.

It runs fedshift's real ServerApp logic and ClientApp handlers with Flower's ``Message``,
``RecordDict`` and ``Context`` objects, one ``Context`` per virtual node kept across messages
(as a SuperNode keeps it), but without Ray or gRPC. Every array of every message is copied
through Flower's own ``.npy`` serialisation, so what a node receives is what the wire would
carry. Used by the fast tests and by ``fedshift flower simulate --engine in-process`` to debug
an algorithm under the Flower adapter in one process; ``kill(node)`` emulates a SuperNode that
went away (its messages get no reply).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable

from flwr.app import Array, ArrayRecord, Context, Error, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.constant import ErrorCode
from flwr.serverapp import Grid
from flwr.supercore.run import Run
from flwr.supercore.task_identity import TaskIdentity

_RUN_IDS = itertools.count(1)  # each grid is a new run (nodes rebuild their runtimes)

#: the node id Flower gives the SuperLink (the ServerApp's messages come from it)
SERVER_NODE = 0


class InProcessGrid(Grid):
    """``nodes`` virtual SuperNodes; node ``i`` gets ``node_configs[i]`` (default:
    ``partition-id=i``, as Flower's simulation engine sets it)."""

    def __init__(
        self,
        client_app: ClientApp,
        nodes: int,
        node_configs: list[dict] | None = None,
        run_id: int | None = None,
    ) -> None:
        run_id = next(_RUN_IDS) if run_id is None else run_id
        self.client_app = client_app
        # the identity Flower's runtime gives a ServerApp process: ``Message(...)`` reads it
        TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = run_id, SERVER_NODE, 0
        configs = node_configs or [
            {"partition-id": i, "num-partitions": nodes} for i in range(nodes)
        ]
        self.contexts = {
            1000 + i: Context(run_id, 1000 + i, dict(cfg), RecordDict(), {})
            for i, cfg in enumerate(configs)
        }
        self.dead: set[int] = set()
        #: nodes numbered by partition-id are a simulation's (every node registered here, at
        #: once: :func:`fedshift.flower.supernodes.wait_for_nodes` waits for no more)
        self.simulation = node_configs is None
        self.registered = True
        self._run = Run.create_empty(run_id)
        self._ids = itertools.count(1)
        self._pending: dict[str, Message] = {}
        self.delivered: list[tuple[int, str]] = []  # (node, message type), in order

    # -- Grid --------------------------------------------------------------------------------
    def set_run(self, run: Run) -> None:
        self._run = run

    @property
    def run(self) -> Run:
        return self._run

    def create_message(
        self,
        content: RecordDict,
        message_type: str,
        dst_node_id: int,
        group_id: str,
        ttl: float | None = None,
    ) -> Message:
        return Message(content, dst_node_id, message_type, ttl=ttl, group_id=group_id)

    def get_node_ids(self) -> Iterable[int]:
        return [n for n in self.contexts if n not in self.dead]

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        ids = []
        for msg in messages:
            mid = f"m{next(self._ids)}"
            # the id the SuperLink would assign; replies name it in reply_to_message_id
            msg.metadata.__dict__["_message_id"] = mid
            self._pending[mid] = msg
            ids.append(mid)
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        replies = []
        for mid in message_ids:
            msg = self._pending.pop(mid)
            node = msg.metadata.dst_node_id
            if node in self.dead:
                continue  # a lost node never answers
            self.delivered.append((node, msg.metadata.message_type))
            copy = Message(_copy(msg.content), metadata=msg.metadata)
            try:
                reply = self.client_app(copy, self.contexts[node])
            except Exception as exc:  # as a SuperNode reports a ClientApp exception
                reason = f"{type(exc).__name__}: {exc}"
                error = Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=reason)
                reply = Message(error, reply_to=copy)
            replies.append(reply if reply.has_error() else Message(
                _copy(reply.content), metadata=reply.metadata))  # fmt: skip
        return replies

    def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> Iterable[Message]:
        return self.pull_messages(self.push_messages(messages))

    # -- tests -------------------------------------------------------------------------------
    def kill(self, node: int) -> None:
        """The SuperNode ``node`` goes away: it disappears from ``get_node_ids`` and never
        replies again."""
        self.dead.add(node)


def _copy(content: RecordDict) -> RecordDict:
    """A deep copy of ``content`` whose arrays went through ``.npy`` bytes and back."""
    out = RecordDict()
    for name, rec in content.array_records.items():
        out[name] = ArrayRecord({k: Array(a.numpy()) for k, a in rec.items()})
    for name, rec in content.metric_records.items():
        out[name] = type(rec)(dict(rec))
    for name, rec in content.config_records.items():
        out[name] = type(rec)(dict(rec))
    return out
