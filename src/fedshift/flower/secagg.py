"""Secure aggregation on Flower: fedshift's records summed by Flower's own SecAgg+.

With ``federation.secure_aggregation=true`` a Flower run (``fedshift flower simulate``,
``flower local``, an app) masks and sums each round's replies with Flower's SecAgg+ protocol
(Bell et al., CCS 2020): the ClientApp's ``train`` handler runs under Flower's
``secaggplus_mod`` (:func:`secure_mod`), and the ServerApp drives the four stages of
Flower's ``SecAggPlusWorkflow`` (setup, share keys, collect masked vectors, unmask) for the
round's clients (:func:`secure_round`). The key agreement, the Shamir shares of the mask
seeds, the masks and the unmasking are Flower's code; what fedshift adds is what goes into
the one flat vector SecAgg+ sums, and what the server makes of the sum.

SecAgg+ sums one vector per client and divides by the sum of the clients' weights (FitRes
``num_examples``). fedshift weights inside the vector instead, as its native masking does
(:mod:`fedshift.runtime.secagg`), so that one round can mix records weighted by the reply
weight (FedAvg's weights) and records of a plain mean (HarmoFL's amplitude). Client ``u``
sends, for every record its method declares summed, in the native layout (records and keys
sorted):

- ``x * w_u / W`` for a weighted record (``w_u``: the algorithm's ``reply_weight``, ``W``:
  the largest reply weight of the round's clients, which the server knows from their
  ``hello``: every client's training-set size), ``x`` for a record of a plain mean;
- then ``w_u / W`` and ``n_u / E`` (its example count over the largest one, ``E``);

with FitRes ``num_examples = 1`` and Flower's ``max_weight = 1``, so Flower's weight factor is
exactly 1 and its result is the plain mean of the vectors over the clients that sent one.
The server divides a weighted record's mean by the mean of ``w_u / W``: the weighted mean
``sum_u w_u x_u / sum_u w_u``, as ``Algorithm.average_record`` computes it from plain replies.

Flower's quantisation is set from fedshift's two keys (:func:`workflow_params`): the
quantization range ``T = 2**30`` (the largest power of two Flower's int32 quantiser holds),
the clipping range ``c = 2**(29 - f)`` (``f = federation.secagg_frac_bits``), so that one
quantisation step, ``2c / T``, is ``2**-f`` as on the native engine, and the modulus
``2**federation.secagg_modulus_bits``. A value beyond ``[-c, c]`` would be clipped by Flower
without a word: the client refuses it instead, naming the tensor. Flower rounds
stochastically (each value off by less than one step, unbiased), not to the nearest step,
so a Flower sum is not bit-equal to a native one; the bounds (:func:`mean_error`): a plain
mean within ``2**-f`` per element, a weighted mean ``mu`` within
``2**-f (1 + |mu|) / (m - 2**-f)``, ``m`` the mean of ``w_u / W`` (at least ``min w / W``).
Flower's stochastic rounding draws from numpy's global generator: the node seeds it from
(run seed, round, client) for that one call and puts it back (:func:`secure_mod`), so a
Flower run repeats, and a resumed one repeats an uninterrupted one.

A client lost during the protocol is recovered by SecAgg+ while at least half of the
round's clients (Flower's reconstruction threshold 0.5, every client each other's
neighbour) stay: the sum is then over those that sent a vector, and the round goes on as
``min_clients`` allows. A client whose code raised stops the run with its reason.

What the server's ledger counts per client (``up``): the masked integers of each record (8
bytes an element, as on the native engine), record ``secagg``: Flower's weight factor and
the masked ``w_u / W`` and ``n_u / E`` (24 bytes), and record ``secagg+``: the key
exchange (two public keys, the encrypted shares for every other client, the shares sent
to unmask), whose size grows with the round's clients; the key traffic the server sends
down is in ``summary.json`` (``runtime.secure_aggregation.key_bytes_down``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.client.mod import secaggplus_mod
from flwr.clientapp.typing import ClientAppCallable
from flwr.common import (
    Code,
    FitIns,
    FitRes,
    Parameters,
    Status,
    bytes_to_ndarray,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, Key
from flwr.compat.common import recorddict_compat as compat
from flwr.server.client_proxy import ClientProxy
from flwr.server.compat.legacy_context import LegacyContext
from flwr.server.strategy import Strategy
from flwr.server.workflow import SecAggPlusWorkflow
from flwr.server.workflow.constant import MAIN_CONFIGS_RECORD, MAIN_PARAMS_RECORD
from flwr.server.workflow.constant import Key as WorkflowKey
from flwr.server.workflow.secure_aggregation.secaggplus_workflow import WorkflowState

from fedshift.core.errors import ConfigError, FedshiftError
from fedshift.core.payload import Payload, Tensors
from fedshift.core.seeding import derive_seed
from fedshift.runtime.secagg import (
    META,
    FixedPoint,
    first_flagged,
    flat_records,
    record_layout,
)

if TYPE_CHECKING:
    from fedshift.flower.transport import GridTransport
    from fedshift.runtime.secagg import SecureAggregation

#: the record of the key exchange in the ledger
KEYS = "secagg+"
#: the ConfigRecord of a round's ``train`` message that gives the clients the scales
SCALES = "fedshift.secagg"
#: the FitRes metric that holds a client's vector layout (JSON)
LAYOUT = "fedshift.secagg.layout"
#: Flower's quantization range is 2**QUANT_BITS: its quantiser rounds into int32
QUANT_BITS = 30
#: Flower's reconstruction threshold: the share of a round's clients that must stay
THRESHOLD = 0.5


def workflow_params(fp: FixedPoint) -> dict:
    """Flower's SecAgg+ quantisation from fedshift's keys (module docstring): one step
    ``2c / T`` equals the native ``2**-frac_bits``."""
    if fp.frac_bits > QUANT_BITS - 1:
        raise ConfigError(
            f"config key 'federation.secagg_frac_bits' = {fp.frac_bits}: on Flower at most "
            f"{QUANT_BITS - 1} (Flower's SecAgg+ quantises into int32: with 2**{QUANT_BITS} "
            f"steps its clipping range 2**({QUANT_BITS - 1} - frac_bits) must be at least 1)"
        )
    return {
        "clipping_range": 2.0 ** (QUANT_BITS - 1 - fp.frac_bits),
        "quantization_range": 2**QUANT_BITS,
        "modulus_range": fp.modulus,
    }


def mean_error(fp: FixedPoint, weighted_mean: float | None = None, mu: float = 0.0) -> float:
    """The bound on ``|Flower's secure mean - plain mean|`` per element (module docstring):
    ``2**-f`` for a plain mean; for a weighted one of value ``mu`` whose weights ``w / W``
    average ``weighted_mean``, ``2**-f (1 + |mu|) / (weighted_mean - 2**-f)``."""
    step = 2.0**-fp.frac_bits
    if weighted_mean is None:
        return step
    return step * (1 + abs(mu)) / (weighted_mean - step)


# ---------------------------------------------------------------------------- client
def encode(
    fp: FixedPoint, rnd: int, cid: str, up: Payload, weight: float, uniform: frozenset[str],
    weight_scale: float, examples_scale: float,
) -> tuple[np.ndarray, str]:  # fmt: skip
    """Client ``cid``'s vector for SecAgg+ (module docstring) and its layout (JSON)."""
    clip = workflow_params(fp)["clipping_range"]
    names = record_layout(up)
    scaled = weight / weight_scale
    parts = flat_records(up, names, uniform, scaled)
    extra = torch.tensor([scaled, up.num_examples / examples_scale], dtype=torch.float64)
    values = torch.cat([*parts, extra])
    flagged = first_flagged(values.abs() > clip, up, names)
    if flagged is not None:
        i, where = flagged
        raise FedshiftError(
            f"round {rnd}: client {cid!r}: Flower's SecAgg+ would clip {where} (value "
            f"{float(values[i]):.4g} outside its clipping range +-{clip:g} = "
            f"2**({QUANT_BITS - 1} - federation.secagg_frac_bits)); lower "
            "federation.secagg_frac_bits"
        )
    layout = [[r, k, list(up.records[r][k].shape), str(up.records[r][k].dtype).removeprefix(
        "torch.")] for r, k in names]  # fmt: skip
    return values.numpy(), json.dumps(layout)


def fit_reply(vector: np.ndarray, layout: str, metrics: dict) -> RecordDict:
    """The content of a client's ``train`` reply under ``secaggplus_mod``: a FitRes whose
    parameters are the vector and whose weight (``num_examples``) is 1."""
    res = FitRes(
        status=Status(Code.OK, ""),
        parameters=ndarrays_to_parameters([vector]),
        num_examples=1,
        metrics={**metrics, LAYOUT: layout},
    )
    return compat.fitres_to_recorddict(res, keep_input=False)


def secure_mod(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
    """The ``train`` handler's mod: a message of Flower's SecAgg+ protocol goes through
    ``secaggplus_mod`` (the handler runs in its collect stage); any other passes as it is.
    numpy's global generator, which Flower's stochastic quantisation draws from, is put
    back as it was afterwards (the handler seeds it: :func:`seed_quantiser`)."""
    if RECORD_KEY_CONFIGS not in msg.content.config_records:
        return call_next(msg, context)
    saved = np.random.get_state()
    try:
        return secaggplus_mod(msg, context, call_next)
    finally:
        np.random.set_state(saved)


def seed_quantiser(seed: int, rnd: int, cid: str) -> None:
    """Seed numpy's global generator for Flower's stochastic quantisation of client
    ``cid``'s round ``rnd`` vector (the draws of a resumed run are those of an
    uninterrupted one)."""
    np.random.seed(derive_seed(seed, "secagg+", rnd, cid) % 2**32)


# ---------------------------------------------------------------------------- server
class _Proxy(ClientProxy):
    """The node a FitIns goes to (SecAgg+ reads only ``node_id``)."""

    def __init__(self, node_id: int) -> None:
        super().__init__(str(node_id))
        self.node_id = node_id

    def _unused(self, *args: object, **kwargs: object):
        raise NotImplementedError("fedshift's SecAgg+ round sends no legacy messages")

    get_properties = get_parameters = fit = evaluate = reconnect = _unused  # type: ignore


class _Round(Strategy):
    """The Strategy SecAgg+ asks: the round's nodes, and where the sum goes."""

    def __init__(self, nodes: list[int]) -> None:
        self.nodes = nodes
        self.summed: Parameters | None = None
        self.results: list[tuple[ClientProxy, FitRes]] = []

    def initialize_parameters(self, client_manager):  # type: ignore[no-untyped-def]
        return None

    def configure_fit(self, server_round, parameters, client_manager):  # type: ignore[no-untyped-def]
        return [(_Proxy(n), FitIns(Parameters([], ""), {})) for n in self.nodes]

    def aggregate_fit(self, server_round, results, failures):  # type: ignore[no-untyped-def]
        self.results = list(results)
        self.summed = results[0][1].parameters if results else None
        return self.summed, {}

    def configure_evaluate(self, server_round, parameters, client_manager):  # type: ignore[no-untyped-def]
        return []

    def aggregate_evaluate(self, server_round, results, failures):  # type: ignore[no-untyped-def]
        return None, {}

    def evaluate(self, server_round, parameters):  # type: ignore[no-untyped-def]
        return None


def _value_bytes(value: object) -> int:
    if isinstance(value, bytes | str):
        return len(value)
    if isinstance(value, list | tuple):
        return sum(_value_bytes(v) for v in value)
    return 8  # a number


def _key_bytes(content: RecordDict) -> int:
    """Bytes of the SecAgg+ record of a message, the masked vector left out."""
    rec = content.config_records.get(RECORD_KEY_CONFIGS, {})
    return sum(_value_bytes(v) for k, v in rec.items() if k != Key.MASKED_PARAMETERS)


@dataclass
class _Tap:
    """The Grid the workflow talks to: the transport's send-and-receive (stop checks and
    timeouts), a client error raised at once (SecAgg+ would drop the client silently), and
    the bytes of the key exchange counted per node."""

    transport: GridTransport
    rnd: int
    up: dict[int, int] = field(default_factory=dict)
    down: dict[int, int] = field(default_factory=dict)
    masked: dict[int, list[np.ndarray]] = field(default_factory=dict)

    def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> list[Message]:
        messages = list(messages)
        for m in messages:
            node = m.metadata.dst_node_id
            self.down[node] = self.down.get(node, 0) + _key_bytes(m.content)
        replies = self.transport.deliver(self.rnd, messages, "Flower's SecAgg+")
        for r in replies:
            node = r.metadata.src_node_id
            if r.has_error():  # a node lost (deliver raised for any other error)
                continue
            self.up[node] = self.up.get(node, 0) + _key_bytes(r.content)
            rec = r.content.config_records.get(RECORD_KEY_CONFIGS, {})
            if Key.MASKED_PARAMETERS in rec:
                self.masked[node] = [bytes_to_ndarray(b) for b in rec[Key.MASKED_PARAMETERS]]
        return replies


@dataclass
class SecureRound:
    """What a round of SecAgg+ gave the server."""

    #: per client that sent a vector: what the server received (masked), for the ledger
    replies: dict[str, Payload]
    #: the round's secure mean, as the algorithm's one reply
    total: Payload
    #: clients that sent no vector
    lost: list[str]
    #: bytes of the key exchange the server sent down
    key_bytes_down: int


def secure_round(
    transport: GridTransport, secure: SecureAggregation, rnd: int, cids: list[str],
    contents: dict[str, RecordDict], weight_of: Callable[[str], float],
    examples_of: Callable[[str], int],
) -> SecureRound:  # fmt: skip
    """Round ``rnd`` of ``cids`` through Flower's SecAgg+ workflow (module docstring);
    ``contents``: the ``train`` message of each client whose node is there (the others are
    lost)."""
    fp = secure.fp
    params = workflow_params(fp)
    gone = [c for c in cids if c not in contents]
    sent = [c for c in cids if c in contents]
    if len(sent) < 2:
        raise FedshiftError(
            f"round {rnd}: Flower's SecAgg+ needs at least 2 clients a round, "
            f"{len(sent)} can take part; raise federation.sample_fraction, or set "
            "federation.secure_aggregation=false"
        )
    if len(sent) * params["quantization_range"] >= params["modulus_range"]:
        raise ConfigError(
            f"config key 'federation.secagg_modulus_bits' = {fp.modulus_bits}: the sum of "
            f"{len(sent)} clients' values quantised to 2**{QUANT_BITS} steps would wrap around "
            f"the modulus; raise it (at most 62)"
        )
    scales = ConfigRecord({
        "weight_scale": float(max(weight_of(c) for c in sent)),
        "examples_scale": float(max(max(examples_of(c) for c in sent), 1)),
    })  # fmt: skip
    by_node: dict[int, RecordDict] = {}
    for cid in sent:
        contents[cid][SCALES] = scales
        by_node[transport.clients[cid].node] = contents[cid]
    strategy = _Round(list(by_node))
    context = LegacyContext(Context(0, 0, {}, RecordDict(), {}), strategy=strategy)
    context.state.config_records[MAIN_CONFIGS_RECORD] = ConfigRecord(
        {WorkflowKey.CURRENT_ROUND: rnd}
    )
    context.state.array_records[MAIN_PARAMS_RECORD] = compat.parameters_to_arrayrecord(
        Parameters([], ""), True
    )
    workflow = SecAggPlusWorkflow(
        num_shares=1.0, reconstruction_threshold=THRESHOLD, max_weight=1.0,
        timeout=transport.options.round_timeout, **params,
    )  # fmt: skip
    tap = _Tap(transport, rnd)
    state = WorkflowState()
    flwr_log = logging.getLogger("flwr")
    level = flwr_log.level
    flwr_log.setLevel(logging.WARNING)  # its per-stage lines (and an empty client manager's
    try:  # "out of 0"): fedshift's round line says what happened
        _stages(workflow, tap, context, state, by_node, rnd, cids, transport)
    finally:
        flwr_log.setLevel(level)
    if strategy.summed is None:
        raise FedshiftError(f"round {rnd}: Flower's SecAgg+ returned no sum")
    return _finish(transport, secure, rnd, cids, sent, gone, strategy, tap, scales)


def _stages(
    workflow: SecAggPlusWorkflow, tap: _Tap, context: LegacyContext, state: WorkflowState,
    contents: dict[int, RecordDict], rnd: int, cids: list[str], transport: GridTransport,
) -> None:  # fmt: skip
    """SecAgg+'s four stages, fedshift's message forwarded in the third."""
    stages = (workflow.setup_stage, workflow.share_keys_stage,
              workflow.collect_masked_vectors_stage, workflow.unmask_stage)  # fmt: skip
    for i, stage in enumerate(stages):
        if i == 1:  # the FitIns SecAgg+ forwards in its collect stage: fedshift's message
            state.nid_to_fitins = {n: contents[n] for n in state.nid_to_fitins}
        if i == 2:
            # a client lost before its encrypted shares went out masks with nobody: it is no
            # part of the sum. Flower's workflow would still list it as dropped at the unmask
            # stage, where the others hold no share of its key (their mod fails with a
            # KeyError): the clients of the protocol are those still there now
            state.sampled_node_ids = set(state.active_node_ids)
        if not stage(tap, context, state):  # type: ignore[arg-type]
            name = stage.__name__.removesuffix("_stage")
            lost = [c for c in cids if transport.clients[c].node not in tap.up]
            raise FedshiftError(
                f"round {rnd}: Flower's SecAgg+ halted in its {name} stage: fewer than "
                f"{THRESHOLD:.0%} of the round's clients replied (lost: "
                f"{', '.join(lost) or 'none'}); restart the lost clients and resume the run "
                "(`--resume`)"
            )


def _finish(
    transport: GridTransport, secure: SecureAggregation, rnd: int, cids: list[str],
    sent: list[str], gone: list[str], strategy: _Round, tap: _Tap, scales: ConfigRecord,
) -> SecureRound:  # fmt: skip
    """The round's result from the workflow's: the secure mean decoded, what the server
    received from each client."""
    assert strategy.summed is not None
    name_of = {transport.clients[c].node: c for c in sent}
    got = {name_of[p.node_id]: res for p, res in strategy.results}
    lost = gone + [c for c in sent if c not in got]
    layouts = {c: str(res.metrics[LAYOUT]) for c, res in got.items()}
    first = next(iter(got))
    bad = [c for c, lay in layouts.items() if lay != layouts[first]]
    if bad:
        raise FedshiftError(
            f"round {rnd}: secure aggregation needs the same records from every client; "
            f"client {bad[0]!r} sent other records or shapes than client {first!r}"
        )
    layout = json.loads(layouts[first])
    (mean,) = parameters_to_ndarrays(strategy.summed)
    total = decode(mean, layout, len(got), scales, secure.uniform, secure.device)
    replies = {}
    for cid, res in got.items():
        node = transport.clients[cid].node
        metrics = {k: v for k, v in res.metrics.items() if k != LAYOUT}
        replies[cid] = _seen(tap.masked.get(node, []), layout, tap.up.get(node, 0), metrics)
    return SecureRound(replies, total, lost, sum(tap.down.values()))


def decode(
    mean: np.ndarray, layout: list, clients: int, scales: ConfigRecord,
    uniform: frozenset[str], device: torch.device | str = "cpu",
) -> Payload:  # fmt: skip
    """The algorithm's one reply from SecAgg+'s mean vector over ``clients`` clients: each
    record's weighted (or plain) mean and the summed example count."""
    values = torch.from_numpy(np.asarray(mean, dtype=np.float64))
    n = sum(int(np.prod(shape)) for _, _, shape, _ in layout)
    weight, examples = float(values[n]), float(values[n + 1])
    records: dict[str, Tensors] = {}
    start = 0
    for r, k, shape, dtype in layout:
        size = int(np.prod(shape))
        part = values[start : start + size].reshape(shape)
        start += size
        mean_rk = part if r in uniform else part / weight
        dt = getattr(torch, dtype)
        if not dt.is_floating_point:
            mean_rk = mean_rk.round()  # integer tensors (BN counters), as weighted_average does
        records.setdefault(r, {})[k] = mean_rk.to(device=device, dtype=dt)
    total = round(examples * float(scales["examples_scale"]) * clients)
    return Payload(records, num_examples=total)


def _seen(masked: list[np.ndarray], layout: list, key_bytes: int, metrics: dict) -> Payload:
    """What the server received from one client, as the ledger counts it: each record's
    masked integers, Flower's weight factor with the masked weight and example count
    (record ``secagg``) and the key exchange (record ``secagg+``, its bytes)."""
    factor, vector = (torch.from_numpy(np.asarray(a, dtype=np.int64)).flatten()
                      for a in masked)  # fmt: skip
    records: dict[str, Tensors] = {}
    start = 0
    for r, k, shape, _ in layout:
        size = int(np.prod(shape))
        records.setdefault(r, {})[k] = vector[start : start + size].reshape(shape)
        start += size
    records[META] = {"factor": factor, "weight": vector[start : start + 1],
                     "examples": vector[start + 1 : start + 2]}  # fmt: skip
    records[KEYS] = {"bytes": torch.zeros(key_bytes, dtype=torch.uint8)}
    return Payload(records, num_examples=0, metrics=metrics)
