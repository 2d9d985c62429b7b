"""The ClientApp side: one fedshift client per Flower SuperNode.

Every message from the ServerApp carries the run's resolved config (``fedshift.run``), so a
SuperNode needs no config file of its own, only its identity and where its data is
(``--node-config``, see :func:`node_settings`). On the first message of a run the node loads
its data, builds the experiment exactly as the native engine does (same seeded initial
model, augments and input pipeline, the algorithm's client half only:
:func:`~fedshift.runtime.experiment.build_experiment`, ``client_only``) and keeps it for the
following messages of the run in this process.

Client state (local BN layers, persisted optimizer state, SCAFFOLD's ``c_i``, DisTrans's
offset, FRAug's RTNet, the augments' statistics) is whatever the algorithm's ``init_client``
returns and ``local_update`` changes. It lives in the node's Flower ``Context.state`` (record
``fedshift.state``) and, with ``state-dir`` set, also on the node's disk, written atomically
after every message (checksummed, read with ``weights_only=True``:
:mod:`fedshift.runtime.rundir.checkpoint_io`); it never leaves the node.

Message types (``<category>.<action>``):

=========================  ============================================================
``query.hello``            build the runtime; reply the client's name, task, classes, sizes
``train.setup_reply``      the augments' setup records (FedRDN's statistics), round 0
``train.setup_receive``    take the server's setup records (the federation statistics)
``train``                  one round of local work: broadcast payload in, reply payload out
``evaluate``               score val/test with the global model and/or the personal model
=========================  ============================================================
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import yaml
from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

import fedshift
from fedshift.catalog import resolve
from fedshift.core.config import RunConfig
from fedshift.core.config_tree import set_dotted
from fedshift.core.consent import ALLOW_ENV, allowed, untrusted
from fedshift.core.errors import ConfigError
from fedshift.core.federation import ClientData, Federation
from fedshift.core.files import ensure_dir
from fedshift.core.payload import Payload
from fedshift.data import federation_key, run_federation
from fedshift.flower.secagg import SCALES, encode, fit_reply, secure_mod, seed_quantiser
from fedshift.flower.wire import (
    pack,
    payload_to_records,
    record_to_tensors,
    records_to_payload,
    unpack,
)
from fedshift.runtime.client import check_reply, evaluate_client, train_client
from fedshift.runtime.experiment import Experiment, build_experiment, init_client_state
from fedshift.runtime.rundir.checkpoint_io import read_checkpoint, write_checkpoint
from fedshift.runtime.secagg import SecureAggregation

log = logging.getLogger("fedshift.flower")

#: the server's per-message record: the run config (YAML), round, client, number of clients
RUN = "fedshift.run"
#: what a node says about itself in reply to ``query.hello``
HELLO = "fedshift.client"
STATE = "fedshift.state"
VIEW = "fedshift.view"
GLOBAL = "fedshift.global"
#: node-config keys a SuperNode understands (besides ``dataset.<key>`` overrides)
NODE_KEYS = (
    "client", "partition-id", "num-partitions", "state-dir", "device", "threads",
    "allow-plugins",
)  # fmt: skip
#: how a SuperNode's operator allows the plug-ins a run config names (fedshift.core.consent)
NODE_YES = (
    f"--node-config allow-plugins=true on this SuperNode (or {ALLOW_ENV}=1 in its environment)"
)


@dataclass
class NodeSettings:
    """What ``--node-config`` says about this SuperNode."""

    client: str | None
    partition: int | None
    state_dir: Path | None
    overrides: dict[str, object]
    #: import the plug-ins a run config from the ServerApp names (``allow-plugins``)
    allow_plugins: bool = False


def node_settings(node_config: dict) -> NodeSettings:
    """Parse a SuperNode's ``node_config``.

    - ``client="site1"``: the client this node is (deployment), or ``partition-id=k``: the
      k-th client of the loaded federation (Flower's simulation engine sets it);
    - ``dataset.<key>=...``: this node's own dataset settings, e.g. ``dataset.root`` (where
      its data lives) or ``dataset.domains=["site1"]`` (load only its own site);
    - ``device="cuda:0"``; ``threads=4`` (torch threads); ``state-dir="/var/lib/fedshift"``:
      keep the client state on disk too;
    - ``allow-plugins=true``: import the ``module:Class`` plug-ins a run config names (the
      config comes from the SuperLink: without it, such a run is refused before any import).
    """
    unknown = [k for k in node_config if k not in NODE_KEYS and not k.startswith("dataset.")]
    if unknown:
        raise ConfigError(
            f"SuperNode --node-config: unknown key(s) {unknown}; fedshift reads "
            f"{', '.join(NODE_KEYS)} and dataset.<key> (e.g. dataset.root)"
        )
    overrides = {k: v for k, v in node_config.items() if k.startswith("dataset.")}
    if "device" in node_config:
        overrides["device"] = node_config["device"]
    pid = node_config.get("partition-id")
    state_dir = node_config.get("state-dir")
    return NodeSettings(
        client=str(node_config["client"]) if "client" in node_config else None,
        partition=None if pid is None else int(pid),
        state_dir=Path(str(state_dir)) if state_dir else None,
        overrides=overrides,
        allow_plugins=str(node_config.get("allow-plugins", "")).strip().lower()
        in ("1", "true", "yes", "on"),
    )


@dataclass
class NodeRuntime:
    """One client's experiment on this node, kept across the messages of a run."""

    cfg: RunConfig
    exp: Experiment
    cid: str
    index: int
    data: ClientData
    settings: NodeSettings
    #: the model's initial weights (the client state starts from them)
    initial: dict[str, torch.Tensor]

    @property
    def trains(self) -> bool:
        return self.cid in self.exp.train_clients


_FEDERATIONS: dict[str, Federation] = {}
_RUNTIMES: dict[tuple, NodeRuntime] = {}


def _federation(cfg: RunConfig) -> Federation:
    """The node's federation, loaded once per process and dataset settings."""
    key = federation_key(cfg)
    if key not in _FEDERATIONS:
        _FEDERATIONS.clear()  # one federation per process: a node serves one run at a time
        _FEDERATIONS[key] = run_federation(cfg)
    return _FEDERATIONS[key]


def runtime(run: ConfigRecord, context: Context) -> NodeRuntime:
    """The runtime of the run and client a message addresses on this node (built once)."""
    settings = node_settings(dict(context.node_config))
    num_clients = int(run["num_clients"]) if "num_clients" in run else None
    overrides = json.dumps(settings.overrides, sort_keys=True, default=str)
    key = (context.run_id, str(run["config"]), overrides, settings.client, settings.partition,
           num_clients)  # fmt: skip
    if key in _RUNTIMES:
        return _RUNTIMES[key]
    raw = yaml.safe_load(str(run["config"]))
    for k, v in settings.overrides.items():
        set_dotted(raw, k, v)
    where = "the run config sent by the ServerApp"
    with untrusted(where, [raw], allow=settings.allow_plugins, how=NODE_YES):
        cfg = resolve(raw, source=f"{where} + this node's --node-config")
    fed = _federation(cfg)
    if settings.client is not None:
        if settings.client not in fed.client_names:
            raise ConfigError(
                f"SuperNode --node-config client={settings.client!r}: the dataset this node "
                f"loaded ({cfg.dataset.name}) has clients {fed.client_names}"
            )
        cid = settings.client
    elif settings.partition is not None:
        if not 0 <= settings.partition < len(fed.clients):
            of = context.node_config.get("num-partitions")
            raise ConfigError(
                f"SuperNode partition-id={settings.partition}"
                + (f" of {of} SuperNodes" if of is not None else "")
                + f": the config's federation has {len(fed.clients)} clients "
                f"({', '.join(fed.client_names)}); fedshift runs one client per SuperNode, so "
                f"run it with {len(fed.clients)} SuperNodes"
            )
        cid = fed.clients[settings.partition].name
    else:
        raise ConfigError(
            "this SuperNode does not say which client it is: start it with "
            "--node-config \"client='<name>'\" (and dataset.root=... for its data)"
        )
    exp = build_experiment(  # the algorithm's client half only (algorithms/halves.py)
        cfg, fed, num_clients=num_clients, check_holdout=False, client_only=True
    )
    data = exp.train_clients.get(cid) or exp.fed.client(cid)
    for k in [k for k in _RUNTIMES if k[0] != context.run_id]:  # an earlier run's runtimes
        del _RUNTIMES[k]
    initial = {k: v.detach().clone() for k, v in exp.model.state_dict().items()}
    rt = NodeRuntime(cfg, exp, cid, fed.client_names.index(cid), data, settings, initial)
    _RUNTIMES[key] = rt
    return rt


# ---------------------------------------------------------------------------- client state
def snapshot_dir(rt: NodeRuntime, context: Context, run: ConfigRecord) -> Path | None:
    """Where this client keeps its per-round state snapshots: the node's ``state-dir``, else
    the folder a simulation's server names (inside its run directory), per run key."""
    base = rt.settings.state_dir
    if base is None and "snapshot_dir" in run:
        base = Path(str(run["snapshot_dir"]))
    if base is None:
        return None
    key = str(run["run_key"]) if "run_key" in run else f"flower-run{context.run_id}"
    return base / key / rt.cid


def _snapshots(folder: Path) -> dict[int, Path]:
    """``{round: file}`` of the snapshots in ``folder`` (round -1: the initial state)."""
    out = {}
    for f in folder.glob("r*.pt") if folder.is_dir() else []:
        try:
            out[int(f.stem[1:])] = f
        except ValueError:
            continue
    return out


def load_state(rt: NodeRuntime, context: Context, run: ConfigRecord) -> dict:
    """The client's state: from the node's context, else its newest snapshot (not past the
    round a resumed run restarts from), else ``init_client``."""
    if STATE in context.state.array_records:
        return unpack(context.state.array_records[STATE], rt.exp.device)  # type: ignore[return-value]
    folder = snapshot_dir(rt, context, run)
    resume = int(run["resume_from"]) if "resume_from" in run else None
    if folder is not None:
        snaps = {r: f for r, f in _snapshots(folder).items() if resume is None or r <= resume}
        if snaps:
            fix = f"client {rt.cid!r}'s state is lost: start the run again"
            return read_checkpoint(snaps[max(snaps)], map_location=rt.exp.device, fix=fix)
    if resume is not None and bool(run.get("resume_state", False)):
        where = folder or "(none: set --node-config state-dir=...)"
        raise ConfigError(
            f"client {rt.cid!r}: the run resumes from round {resume}, but this node has no "
            f"snapshot of the client's state up to that round in {where}; a Flower run "
            "resumes only when its SuperNodes keep their state on disk (node-config state-dir)"
        )
    # init_client reads the model: give it the initial weights, whatever ran before
    rt.exp.model.load_state_dict(rt.initial)
    state = init_client_state(rt.exp, rt.cfg.seed, rt.cid, rt.data)
    _write_snapshot(folder, -1, state)
    return state


def _write_snapshot(folder: Path | None, rnd: int, state: dict) -> None:
    if folder is None:
        return
    ensure_dir(folder)  # a snapshot folder that is a link is not written through
    write_checkpoint(state, folder / f"r{rnd}.pt")  # atomic, checksummed


def save_state(rt: NodeRuntime, context: Context, run: ConfigRecord, state: dict) -> None:
    """Keep the state in the node's context and, with a snapshot folder, on disk as the
    snapshot of this message's round; snapshots older than the server's last checkpoint go
    (the newest of them stays: a resume may go back to it)."""
    context.state[STATE] = pack(state)
    folder = snapshot_dir(rt, context, run)
    if folder is None:
        return
    _write_snapshot(folder, int(run["round"]), state)
    done = int(run.get("checkpointed", -1))
    old = sorted(r for r in _snapshots(folder) if r <= done)
    for r in old[:-1]:
        _snapshots(folder)[r].unlink(missing_ok=True)


# ---------------------------------------------------------------------------- handlers
def _run_record(msg: Message) -> ConfigRecord:
    if RUN not in msg.content.config_records:
        raise ConfigError(
            f"message {msg.metadata.message_type!r} has no {RUN!r} record: it was not sent by "
            "fedshift's ServerApp (fedshift.flower.apps:server_app)"
        )
    return msg.content.config_records[RUN]


def hello(msg: Message, context: Context) -> Message:
    rt = runtime(_run_record(msg), context)
    fed = _federation(rt.cfg)
    info = {
        "fedshift": fedshift.__version__,
        "client": rt.cid,
        "index": rt.index,
        "trains": rt.trains,
        "dataset": rt.cfg.dataset.name,
        "task": fed.task,
        "classes": list(fed.classes),
        "input_shape": [int(s) for s in fed.input_shape],
        "num_train": len(rt.data.train),
        "num_val": len(rt.data.val),
        "num_test": len(rt.data.test),
        # the clients of the federation this node loaded (all of them, unless the node loads
        # only its own site): the ServerApp checks that every one has its SuperNode
        "federation": list(fed.client_names),
    }
    if fed.info.get("dh") is not None:
        info["dh"] = float(fed.info["dh"])
    log.info("client %s ready: %d/%d/%d train/val/test", rt.cid, *[
        info[k] for k in ("num_train", "num_val", "num_test")])  # fmt: skip
    return Message(RecordDict({HELLO: ConfigRecord(info)}), reply_to=msg)


def setup_reply(msg: Message, context: Context) -> Message:
    run = _run_record(msg)
    rt = runtime(run, context)
    state = load_state(rt, context, run)
    up = rt.exp.algo.setup_reply(rt.cid, state)
    save_state(rt, context, run, state)
    return Message(payload_to_records(up), reply_to=msg)


def setup_receive(msg: Message, context: Context) -> Message:
    run = _run_record(msg)
    rt = runtime(run, context)
    state = load_state(rt, context, run)
    rt.exp.algo.setup_receive(records_to_payload(msg.content, rt.exp.device), state)
    save_state(rt, context, run, state)
    return Message(RecordDict(), reply_to=msg)


def train(msg: Message, context: Context) -> Message:
    run = _run_record(msg)
    rt = runtime(run, context)
    cfg, exp, rnd = rt.cfg, rt.exp, int(run["round"])
    if not rt.trains:
        raise ConfigError(f"client {rt.cid!r} is held out (federation.holdout); it never trains")
    t0 = time.perf_counter()
    state = load_state(rt, context, run)
    down = records_to_payload(msg.content, exp.device)
    up = train_client(exp, cfg.seed, rt.cid, rt.data, rnd, down, state)
    check_reply(rnd, rt.cid, up)
    save_state(rt, context, run, state)
    if SCALES in msg.content.config_records:  # under Flower's SecAgg+ (secure_mod)
        return Message(secure_reply(rt, rnd, up, msg.content.config_records[SCALES]),
                       reply_to=msg)  # fmt: skip
    sent = up.nbytes()
    log.info(
        "client %s round %d: loss %.4f in %.1fs; sends %s",
        rt.cid,
        rnd,
        up.metrics.get("train_loss", float("nan")),
        time.perf_counter() - t0,
        ", ".join(f"{k} {v / 1e6:.2f} MB" for k, v in sent.items()),
    )
    return Message(payload_to_records(up), reply_to=msg)


def secure_reply(rt: NodeRuntime, rnd: int, up: Payload, scales: ConfigRecord) -> RecordDict:
    """The reply that Flower's ``secaggplus_mod`` masks: the client's records as one vector
    (:func:`fedshift.flower.secagg.encode`), with its stochastic quantisation seeded."""
    secure = SecureAggregation(rt.cfg)
    secure.check(rt.exp)  # the same refusals as the server's; the weighting and means
    vector, layout = encode(
        secure.fp, rnd, rt.cid, up, float(secure.weight(up)), secure.uniform,
        float(scales["weight_scale"]), float(scales["examples_scale"]),
    )  # fmt: skip
    seed_quantiser(rt.cfg.seed, rnd, rt.cid)
    log.info("client %s round %d: sends its records masked (Flower SecAgg+)", rt.cid, rnd)
    return fit_reply(vector, layout, dict(up.metrics))


def evaluate(msg: Message, context: Context) -> Message:
    run = _run_record(msg)
    rt = runtime(run, context)
    exp, bs = rt.exp, rt.cfg.eval.batch_size
    state = load_state(rt, context, run)
    arrays = msg.content.array_records
    g = record_to_tensors(arrays[GLOBAL], exp.device) if GLOBAL in arrays else None
    view = unpack(arrays[VIEW], exp.device) if VIEW in arrays else None
    # a held-out client's evaluation records (augments' eval_broadcast); the state is not saved
    extra = records_to_payload(msg.content, exp.device)
    scores = evaluate_client(exp, rt.data, state, bs, g, view, extra)  # type: ignore[arg-type]
    out = RecordDict({kind: MetricRecord(v) for kind, v in scores.items()})
    return Message(out, reply_to=msg)  # evaluation leaves the client state as it was


def build_client_app(threads: int | None = None, trust_server: bool = False) -> ClientApp:
    """fedshift's ClientApp (``fedshift.flower.apps:client_app``).

    ``threads``: torch threads for the client's work (a node's ``threads`` node-config key
    wins; None and no key: torch's default). Float reductions split over a different number
    of threads differ in the last bits, so runs compared bit for bit use the same count.
    ``trust_server``: the ServerApp is this user's own (a simulation): the plug-ins its run
    config names are imported without the node's ``allow-plugins``."""

    def with_threads(handler: Callable[[Message, Context], Message]):
        @functools.wraps(handler)
        def run(msg: Message, context: Context) -> Message:
            n = context.node_config.get("threads", threads)
            if n:
                torch.set_num_threads(int(n))  # type: ignore[arg-type]
            with allowed() if trust_server else contextlib.nullcontext():
                return handler(msg, context)

        return run

    app = ClientApp()
    app.query("hello")(with_threads(hello))
    app.train("setup_reply")(with_threads(setup_reply))
    app.train("setup_receive")(with_threads(setup_receive))
    # Flower's SecAgg+ on the round's train messages (federation.secure_aggregation)
    app.train(mods=[secure_mod])(with_threads(train))
    app.evaluate()(with_threads(evaluate))
    return app
