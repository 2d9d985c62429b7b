"""The ServerApp side: the native engine's round loop, driven over a Flower ``Grid``.

:class:`FlowerServer` does what :class:`~fedshift.runtime.simulation.Simulation` does, with
every client behind a SuperNode:

1. wait for the SuperNodes, ask each who it is (``query.hello``) and build the experiment
   from their answers: the clients in federation order, the task, classes and image size.
   The server holds no data;
2. the setup exchange (round 0) when an augment needs one (FedRDN's statistics);
3. every round: the same seeded client sample, the algorithm's broadcast payload to each
   sampled node (``train``), its reply payload back, the algorithm's aggregation; every
   payload passes the ledger exactly as in the native engine;
4. every ``eval.every`` rounds and at the end: each client scores its val/test splits with
   the global model and/or its personal model (``evaluate``: the global weights and the
   algorithm's ``server_view`` for that client go down, scores come back);
5. ``summary.json``, ``metrics.jsonl``, ``ledger.json``, ``convergence.png`` as a native run,
   plus ``summary["runtime"]`` (Flower mode, nodes, lost clients, evaluation bytes).

Lost SuperNodes. A sampled client whose node has gone, or whose reply does not come within
``round_timeout`` seconds, is *lost* for that round. The round completes without it when at
least ``min_clients`` of the sampled clients replied (default: all of them, so a run never
silently changes its numbers); otherwise the run stops with an error naming the clients.
A client that replies with an error (its code raised) always stops the run, with its reason.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import yaml
from flwr.app import ConfigRecord, Message, RecordDict
from flwr.common.constant import ErrorCode
from flwr.serverapp import Grid
from tqdm.auto import tqdm

import fedshift
from fedshift.core.config import RunConfig, dump_config
from fedshift.core.errors import ConfigError, FedshiftError
from fedshift.core.payload import Ledger
from fedshift.data.base import ClientData, Federation, Split
from fedshift.flower.node import GLOBAL, HELLO, RUN, VIEW
from fedshift.flower.wire import (
    pack,
    payload_to_records,
    records_to_payload,
    tensors_to_record,
)
from fedshift.runtime.experiment import build_experiment
from fedshift.runtime.simulation import (
    RunResult,
    check_reply,
    finish_run,
    sample_clients,
    write_metrics,
)

log = logging.getLogger("fedshift.flower")

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


class FlowerServer:
    """One run over a Flower ``Grid`` (see the module docstring)."""

    def __init__(
        self,
        cfg: RunConfig,
        run_dir: str | Path,
        options: FlowerOptions | None = None,
        progress: bool = True,
    ) -> None:
        if cfg.algorithm["name"] in ("local", "central"):
            raise ConfigError(
                f"config key 'algorithm.name': {cfg.algorithm['name']!r} exchanges nothing "
                "between clients and server; run it with `fedshift run`, not on Flower"
            )
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.options = options or FlowerOptions()
        self.options.check()
        self.progress = progress
        self.config_text = yaml.safe_dump(cfg.to_dict(), sort_keys=False)
        self.ledger = Ledger()
        self.records: list[dict] = []
        self.wall_before = 0.0
        self.lost: dict[str, int] = {}  # client -> round it was first lost in
        self.eval_bytes = 0
        self.clients: dict[str, ClientInfo] = {}
        self.num_clients: int | None = None

    # ------------------------------------------------------------------ messaging
    def run_record(self, rnd: int, cid: str) -> ConfigRecord:
        rec = {"config": self.config_text, "round": rnd, "client": cid}
        if self.num_clients is not None:
            rec["num_clients"] = self.num_clients
        return ConfigRecord(rec)

    def exchange(
        self, grid: Grid, kind: str, rnd: int, contents: dict[str, RecordDict]
    ) -> tuple[dict[str, Message], list[str]]:
        """Send ``contents[cid]`` to each client's node as a ``kind`` message; return the
        replies by client and the clients lost (node gone, crashed, or silent past the
        timeout). A client whose code raised stops the run with its reason."""
        alive = set(grid.get_node_ids())
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
        replies = list(grid.send_and_receive(messages, timeout=self.options.round_timeout))
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

    def need(self, rnd: int, what: str, asked: list[str], got: int, lost: list[str]) -> None:
        """Stop unless enough of ``asked`` replied (``min_clients``; all if unset)."""
        if not lost:
            return
        need = len(asked) if self.options.min_clients is None else self.options.min_clients
        if got >= min(need, len(asked)):
            log.warning(
                "round %d: %s without lost client(s) %s (%d of %d replied, min-clients %d)",
                rnd, what, lost, got, len(asked), need,
            )  # fmt: skip
            return
        raise FedshiftError(
            f"round {rnd}: {what} needs {need} of the {len(asked)} sampled clients but only "
            f"{got} replied; lost (SuperNode gone or silent for {self.options.round_timeout:g}"
            f" s): {', '.join(lost)}. Restart those SuperNodes and the run, or let rounds "
            "complete with fewer clients (`--min-clients` / run-config min-clients)."
        )

    # ------------------------------------------------------------------ set-up
    def wait_for_nodes(self, grid: Grid) -> list[int]:
        want = self.options.nodes or 1
        t0 = time.monotonic()
        while True:
            nodes = sorted(grid.get_node_ids())
            if len(nodes) >= want:
                return nodes
            if time.monotonic() - t0 > self.options.node_wait:
                raise FedshiftError(
                    f"only {len(nodes)} of {want} SuperNodes connected after "
                    f"{self.options.node_wait:g} s; start the missing SuperNodes (or lower "
                    "--nodes / run-config nodes)"
                )
            time.sleep(0.5)

    def handshake(self, grid: Grid) -> Federation:
        """Ask every node who it is; the clients in federation order (node-reported index,
        then name) and a data-less federation with the shared task, classes and shape."""
        nodes = self.wait_for_nodes(grid)
        msgs = [
            Message(
                RecordDict({RUN: self.run_record(0, "")}),
                dst_node_id=n,
                message_type="query.hello",
                group_id="hello",
            )
            for n in nodes
        ]
        replies = list(grid.send_and_receive(msgs, timeout=self.options.round_timeout))
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

    def setup_exchange(self, grid: Grid) -> None:
        algo, trains = self.algo, list(self.exp.train_clients)
        replies, lost = self.exchange(
            grid, "train.setup_reply", 0, {cid: RecordDict() for cid in trains}
        )
        if lost:
            raise FedshiftError(
                f"setup exchange: client(s) {lost} did not reply; every client must send its "
                "setup statistics before round 1. Restart those SuperNodes and the run."
            )
        ups = []
        for cid in trains:
            up = records_to_payload(replies[cid].content, self.exp.device)
            self.ledger.record(0, cid, "up", up)
            ups.append((cid, up))
        algo.setup_aggregate(self.server, ups)
        downs = {}
        for cid in self.clients:
            down = algo.setup_broadcast(self.server, cid)
            self.ledger.record(0, cid, "down", down)
            downs[cid] = payload_to_records(down)
        _, lost = self.exchange(grid, "train.setup_receive", 0, downs)
        if lost:
            raise FedshiftError(f"setup exchange: client(s) {lost} did not take the statistics")

    # ------------------------------------------------------------------ rounds
    def run_round(self, grid: Grid, rnd: int) -> dict[str, dict]:
        sampled = sample_clients(
            list(self.exp.train_clients), self.cfg.federation.sample_fraction, self.cfg.seed, rnd
        )
        contents = {}
        for cid in sampled:
            down = self.algo.broadcast(self.server, rnd, cid)
            self.ledger.record(rnd, cid, "down", down)
            contents[cid] = payload_to_records(down)
        replies, lost = self.exchange(grid, "train", rnd, contents)
        self.need(rnd, "aggregation", sampled, len(replies), lost)
        ups = []
        for cid in sampled:
            if cid not in replies:
                continue
            up = records_to_payload(replies[cid].content, self.exp.device)
            check_reply(rnd, cid, up)
            self.ledger.record(rnd, cid, "up", up)
            ups.append((cid, up))
        self.algo.aggregate(self.server, rnd, ups)
        return {cid: up.metrics for cid, up in ups}

    def evaluate_round(self, grid: Grid, rnd: int, train_metrics: dict[str, dict]) -> list[dict]:
        algo = self.algo
        global_w = algo.global_weights(self.server)
        global_rec = None if global_w is None else tensors_to_record(global_w)  # once for all
        contents = {}
        for cid in self.clients:
            content = RecordDict()
            if global_rec is not None:
                content[GLOBAL] = global_rec
            if algo.has_personal_model:
                content[VIEW] = pack(algo.server_view(self.server, cid))
            if cid in self.exp.holdout:  # what a client that never trains needs to evaluate
                for name, tensors in algo.eval_broadcast(self.server, cid).records.items():
                    content[name] = tensors_to_record(tensors)
            self.eval_bytes += sum(rec.count_bytes() for rec in content.array_records.values())
            contents[cid] = content
        replies, lost = self.exchange(grid, "evaluate", rnd, contents)
        if not replies:
            raise FedshiftError(f"round {rnd}: no client replied to the evaluation")
        rows = []
        for cid in self.clients:
            row: dict = {"round": rnd, "client": cid}
            if cid in self.exp.holdout:
                row["holdout"] = True
            if cid in train_metrics:
                row["train_loss"] = train_metrics[cid].get("train_loss")
            if cid in replies:
                for kind, rec in replies[cid].content.metric_records.items():
                    row[kind] = dict(rec)
            else:
                row["lost"] = True
            rows.append(row)
        return rows

    # ------------------------------------------------------------------ the loop
    def run(self, grid: Grid) -> RunResult:
        cfg = self.cfg
        t0 = time.perf_counter()
        skeleton = self.handshake(grid)
        self.exp = exp = build_experiment(cfg, skeleton)
        self.fed, self.task, self.model, self.algo = skeleton, exp.task, exp.model, exp.algo
        self.kinds, self.implied, self.holdout = exp.kinds, exp.implied, exp.holdout
        self.num_clients = len(exp.train_clients)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        dump_config(cfg, self.run_dir / "config.yaml")
        write_metrics(self.run_dir, [])
        self.server = self.algo.init_server(self.model)
        self.algo.register_clients(list(exp.train_clients))
        if self.algo.needs_setup:
            self.setup_exchange(grid)
        rounds = cfg.train.rounds
        label = f"{cfg.algorithm['name']} s{cfg.seed} (flower)"
        bar = tqdm(range(1, rounds + 1), desc=label, disable=not self.progress, leave=False)
        metric = self.task.primary
        for rnd in bar:
            train_metrics = self.run_round(grid, rnd)
            loss = [m["train_loss"] for m in train_metrics.values() if "train_loss" in m]
            line = f"round {rnd}/{rounds}: {len(train_metrics)} replies"
            if loss:
                line += f", train loss {sum(loss) / len(loss):.4f}"
            if rnd % cfg.eval.every == 0 or rnd == rounds:
                rows = self.evaluate_round(grid, rnd, train_metrics)
                self.records.extend(rows)
                write_metrics(self.run_dir, rows, append=True)
                scored = [r for r in rows if self.kinds[0] in r and not r.get("holdout")]
                val = sum(r[self.kinds[0]][f"val_{metric.name}"] for r in scored) / len(scored)
                line += f", val {metric.name} {val:.4f} ({self.kinds[0]})"
                bar.set_postfix_str(f"val {metric.name} {val:.3f}")
            if not self.progress:
                print(f"fedshift: {line}", flush=True)
        bar.close()
        self.wall_before = time.perf_counter() - t0
        runtime = {
            "engine": "flower",
            "mode": self.options.mode,
            "flwr": _flwr_version(),
            "nodes": {cid: c.node for cid, c in self.clients.items()},
            "lost": self.lost,
            "min_clients": self.options.min_clients,
            "eval_bytes": self.eval_bytes,
        }
        summary = finish_run(self, label, extra={"runtime": runtime})
        return RunResult(self.run_dir, summary)


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
