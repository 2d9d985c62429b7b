"""The algorithm contracts of :mod:`fedshift.core.contract`, checked for every registered
algorithm (driven by ``ALGORITHMS.names()``: a new algorithm is tested without being listed).

* the runtime-facing :class:`Composition` satisfies :class:`FederatedAlgorithm` (members,
  parameter names, resolved types) and every algorithm :class:`AlgorithmSpec`;
* ``init_server`` / ``init_client`` return plain data that ``torch.save`` writes and
  ``torch.load(weights_only=True)`` reads back unchanged;
* broadcast -> local_update -> aggregate runs a round; the up payloads are finite;
* ``personal_weights(server_view(server, cid), state) == personal_weights(server, state)``;
* re-entrancy: ``broadcast`` and ``local_update`` leave the algorithm object as it was, and a
  client's round run *inside* another client's round (after its first local step, on the
  same algorithm object, each client with its own working model) gives both clients exactly
  the payloads and states of running them one after the other.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import io
import math
import typing
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn

from fedshift.algorithms import ALGORITHMS, Algorithm
from fedshift.augment.compose import Composition
from fedshift.catalog import resolve
from fedshift.core.config import RunConfig, TrainConfig, load_config
from fedshift.core.context import ClientContext
from fedshift.core.contract import AlgorithmSpec, FederatedAlgorithm, Reply, State
from fedshift.core.payload import Payload
from fedshift.core.seeding import generator, rng_state, seed_global, set_rng_state
from fedshift.data import load_dataset
from fedshift.data.base import ClientData, Federation
from fedshift.models.base import FedModel
from fedshift.runtime.experiment import Experiment, build_experiment, init_client_state

#: a tiny run every registered algorithm accepts: two toyshift clients, a 4-channel BN CNN
#: (FedBN / AdvProp need BN layers, pFedHN a small target model), two local steps per round
TINY = (
    "dataset.name=toyshift",
    "dataset.clients=2",
    "dataset.train_size=12",
    "dataset.val_size=4",
    "dataset.test_size=4",
    "model.name=cnn",
    "model.width=4",
    "train.batch_size=4",
    "train.local_steps=2",
    "train.rounds=2",
    "name=contract",
)

NAMES = ALGORITHMS.names()

#: options that switch an algorithm to another per-round code path (re-entrancy only)
VARIANTS = [
    ("fedproto", "algorithm.prototypes=released"),
    ("fedproto", "algorithm.share_weights=true"),
    ("partialfed", "algorithm.strategy=adaptive"),
    ("fraug", "algorithm.variant=released"),
    ("fraug", "algorithm.embeddings=agnostic"),
    ("distrans", "algorithm.aggregation=avg"),
    ("distrans", "algorithm.aggregation=nn"),
    ("fedrobust", "algorithm.affine=channel"),
    ("scaffold", "train.momentum=0.0"),
    ("pfedavg", "algorithm.finetune_epochs=1"),
]

#: the types declared only for type checkers in fedshift.core.contract
TYPE_NAMES = {
    "ClientData": ClientData,
    "Federation": Federation,
    "FedModel": FedModel,
    "TrainConfig": TrainConfig,
}


# ----------------------------------------------------------------------------- helpers
def tiny_cfg(name: str, *over: str) -> RunConfig:
    return resolve(load_config(None, [*TINY, f"algorithm.name={name}", *over]))


@dataclasses.dataclass
class Run:
    """One experiment's parts as a runtime holds them: server, client states, and the
    model / composition each client trains with."""

    cfg: RunConfig
    exp: Experiment
    server: State
    states: dict[str, State]

    @property
    def cids(self) -> list[str]:
        return list(self.exp.train_clients)


def start(cfg: RunConfig, fed: Federation) -> Run:
    """Build, initialise (server, clients, setup exchange) as a runtime does."""
    exp = build_experiment(cfg, fed)
    comp = exp.algo
    server = comp.init_server(exp.model)
    comp.register_clients(list(exp.train_clients))
    states = {
        cid: init_client_state(exp, cfg.seed, cid, data) for cid, data in exp.train_clients.items()
    }
    if comp.needs_setup:
        replies = [(cid, comp.setup_reply(cid, states[cid])) for cid in states]
        comp.setup_aggregate(server, replies)
        for cid in states:
            comp.setup_receive(comp.setup_broadcast(server, cid), states[cid])
    return Run(cfg, exp, server, states)


def client_round(
    run: Run,
    rnd: int,
    cid: str,
    state: State,
    comp: Composition | None = None,
    exp: Experiment | None = None,
    after_first_step: Callable[[], None] | None = None,
) -> Payload:
    """Client ``cid``'s round as the simulator runs it: broadcast, seeded local update.
    ``comp`` / ``exp``: the composition and the experiment whose model and pipeline the
    client trains with (default: the run's). ``after_first_step`` runs once, between the
    client's first and second local step."""
    comp = comp or run.exp.algo
    exp = exp or run.exp
    down = comp.broadcast(run.server, rnd, cid)
    seed_global(run.cfg.seed, "client", rnd, cid)
    ctx = ClientContext(
        cid=cid,
        round=rnd,
        data=exp.train_clients[cid],
        model=exp.model,
        train=run.cfg.train,
        pipeline=exp.pipeline,
        generator=generator(run.cfg.seed, "batches", rnd, cid),
        device=exp.device,
        state=state,
        task=exp.task,
    )
    if after_first_step is not None:
        batches = ctx.batches

        def interleaved():
            for i, batch in enumerate(batches()):
                if i == 1:
                    after_first_step()
                yield batch

        ctx.batches = interleaved  # type: ignore[method-assign]
    return comp.local_update(ctx, down, state)


def full_round(run: Run, rnd: int) -> list[Reply]:
    replies = [(cid, client_round(run, rnd, cid, run.states[cid])) for cid in run.cids]
    run.exp.algo.aggregate(run.server, rnd, replies)
    return replies


def canon(obj: object) -> object:
    """A comparable, hashable-free rendering of (nested) data: tensors by dtype, shape and
    bytes, modules and optimisers by their state dicts."""
    if isinstance(obj, torch.Tensor):
        t = obj.detach().cpu().contiguous()
        return ("tensor", str(t.dtype), tuple(t.shape), t.numpy().tobytes())
    if isinstance(obj, nn.Module):
        return ("module", obj.training, canon(obj.state_dict()))
    if isinstance(obj, torch.optim.Optimizer):
        return ("optimizer", canon(obj.state_dict()))
    if isinstance(obj, Payload):
        return ("payload", canon(obj.records), obj.num_examples, canon(obj.metrics), obj.config)
    if isinstance(obj, dict):
        return ("dict", [(k, canon(v)) for k, v in obj.items()])
    if isinstance(obj, list | tuple):
        return (type(obj).__name__, [canon(v) for v in obj])
    if obj is None or isinstance(obj, bool | int | float | str):
        return obj
    if dataclasses.is_dataclass(obj):
        return ("dataclass", repr(obj))
    return ("object", type(obj).__qualname__, id(obj))


def snapshot(algo: Algorithm) -> dict[str, tuple[int, object]]:
    """Every attribute of the algorithm object: its identity and its contents."""
    return {k: (id(v), canon(v)) for k, v in vars(algo).items()}


def assert_plain(obj: object, where: str) -> None:
    """State is plain data: dicts (str/int keys), lists, tensors, numbers, strings, None."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            assert isinstance(k, str | int), f"{where}: key {k!r}"
            assert_plain(v, f"{where}[{k!r}]")
    elif isinstance(obj, list | tuple):
        for i, v in enumerate(obj):
            assert_plain(v, f"{where}[{i}]")
    else:
        ok = obj is None or isinstance(obj, torch.Tensor | bool | int | float | str)
        assert ok, f"{where}: {type(obj).__name__} is not plain data"


def assert_saves_and_loads_back(obj: object, where: str) -> None:
    assert_plain(obj, where)
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    back = torch.load(buf, weights_only=True)
    assert canon(back) == canon(obj), f"{where} changed through torch.save/load"


def assert_finite(up: Payload, where: str) -> None:
    assert up.first_non_finite() is None, f"{where}: non-finite {up.first_non_finite()}"
    loss = up.metrics.get("train_loss")
    assert loss is None or math.isfinite(loss), f"{where}: train_loss={loss}"


def hints(func: Callable, owner: object) -> dict[str, object]:
    module = inspect.getmodule(owner)
    return typing.get_type_hints(func, vars(module), TYPE_NAMES)


def protocol_members(proto: type) -> list[str]:
    """The methods and properties a protocol declares (its ClassVars are annotations)."""
    return sorted(n for n in vars(proto) if not n.startswith("_"))


# ----------------------------------------------------------------------------- the protocols
def test_composition_has_the_runtime_protocol_exactly():
    """Every member of FederatedAlgorithm exists on Composition with the same parameters
    (names, kinds, defaults) and the same resolved types; properties stay properties."""
    for name in protocol_members(FederatedAlgorithm):
        want = inspect.getattr_static(FederatedAlgorithm, name)
        got = inspect.getattr_static(Composition, name)
        if isinstance(want, property):
            assert isinstance(got, property), name
            assert hints(got.fget, Composition) == hints(want.fget, FederatedAlgorithm), name
            continue
        ws, gs = inspect.signature(want), inspect.signature(got)
        assert [(p.name, p.kind, p.default) for p in gs.parameters.values()] == [
            (p.name, p.kind, p.default) for p in ws.parameters.values()
        ], name
        assert hints(got, Composition) == hints(want, FederatedAlgorithm), name


def test_runtime_protocol_is_what_the_runtimes_call():
    runtime = {
        "communicates", "has_global_model", "has_personal_model", "needs_setup",
        "init_server", "init_client", "register_clients", "setup_reply", "setup_aggregate",
        "setup_broadcast", "setup_receive", "broadcast", "local_update", "aggregate",
        "eval_broadcast", "eval_receive", "global_weights", "personal_weights", "server_view",
    }  # fmt: skip
    assert set(protocol_members(FederatedAlgorithm)) == runtime
    spec = set(protocol_members(AlgorithmSpec)) | set(AlgorithmSpec.__annotations__)
    assert {"init_client", "local_update", "reply", "broadcast", "aggregate", "check"} <= spec


@pytest.mark.parametrize("name", NAMES)
def test_algorithm_class_implements_the_author_protocol(name):
    """Every member of AlgorithmSpec is there, with the spec's parameter names (an override
    with another signature, e.g. the old ``init_client(cid, model)``, fails here)."""
    cls = ALGORITHMS.get(name)
    assert issubclass(cls, Algorithm)
    for member in protocol_members(AlgorithmSpec):
        want = inspect.getattr_static(AlgorithmSpec, member)
        got = inspect.getattr_static(cls, member)  # the class's own or inherited member
        if isinstance(want, property):
            assert isinstance(got, property), f"{name}.{member}"
            continue
        ws = inspect.signature(getattr(AlgorithmSpec, member))
        gs = inspect.signature(getattr(cls, member))
        assert list(gs.parameters) == list(ws.parameters), f"{name}.{member}: {gs} vs {ws}"
    for attr in AlgorithmSpec.__annotations__:
        assert hasattr(cls, attr), f"{name}.{attr}"


# ----------------------------------------------------------------------------- one round
@pytest.fixture(scope="module")
def fed() -> Federation:
    cfg = tiny_cfg("fedavg")
    return load_dataset(cfg.dataset, cfg.partition)


@pytest.mark.parametrize("name", NAMES)
def test_one_round_state_payloads_and_views(name, fed, one_thread):
    run = start(tiny_cfg(name), fed)
    comp = run.exp.algo
    assert isinstance(comp, FederatedAlgorithm)
    assert isinstance(comp.algo, AlgorithmSpec)
    assert_saves_and_loads_back(run.server, f"{name}: init_server")
    for cid, state in run.states.items():
        assert_saves_and_loads_back(state, f"{name}: init_client({cid})")
    replies = full_round(run, 1)
    for cid, up in replies:
        assert_finite(up, f"{name}: reply of {cid}")
    assert_saves_and_loads_back(run.server, f"{name}: server after round 1")
    for cid, state in run.states.items():
        assert_saves_and_loads_back(state, f"{name}: state of {cid} after round 1")
    assert comp.has_global_model or comp.has_personal_model
    if comp.has_global_model:
        assert set(comp.global_weights(run.server)) == set(run.exp.model.state_dict())
    if comp.has_personal_model:
        for cid, state in run.states.items():
            full = comp.personal_weights(run.server, state)
            view = comp.personal_weights(comp.server_view(run.server, cid), state)
            assert set(full) == set(run.exp.model.state_dict())
            assert canon(view) == canon(full), f"{name}: server_view of {cid}"


# ----------------------------------------------------------------------------- re-entrancy
def _reentrancy_cases() -> list:
    cases = [pytest.param(n, (), id=n) for n in NAMES]
    cases += [pytest.param(n, (o,), id=f"{n}-{o}") for n, o in VARIANTS]
    return cases


def _pair(cfg: RunConfig, fed: Federation) -> tuple[Run, Composition, Experiment]:
    """A run after round 1, plus client B's working parts for round 2: a second
    experiment's model, pipeline and augments (attached to that model) around the *same*
    algorithm object."""
    run = start(cfg, fed)
    full_round(run, 1)
    other = build_experiment(cfg, fed)
    return run, Composition(run.exp.algo.algo, other.augments), other


def interleave(cfg: RunConfig, fed: Federation) -> tuple[list[str], tuple, tuple]:
    """Round 2 of clients A and B (after a full round 1), first one after the other, then
    with B's whole round inside A's (after A's first local step), each time from the same
    start. Returns (algorithm attributes that broadcast/local_update changed, sequential
    results, interleaved results); results are (A's payload, A's state, B's payload, B's
    state)."""

    def setup() -> tuple[Run, Composition, Experiment, str, str, str]:
        run, comp_b, exp_b = _pair(cfg, fed)
        a, b = run.cids[0], run.cids[-1]
        key_b = b
        if a == b:  # one training client (central): B is a second copy of its state
            key_b = "copy"
            run.states[key_b] = copy.deepcopy(run.states[a])
        return run, comp_b, exp_b, a, b, key_b

    run, comp_b, exp_b, a, b, key_b = setup()
    algo = run.exp.algo.algo
    before = snapshot(algo)
    seq_a = client_round(run, 2, a, run.states[a])
    seq_b = client_round(run, 2, b, run.states[key_b], comp_b, exp_b)
    after = snapshot(algo)
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    seq = (canon(seq_a), canon(run.states[a]), canon(seq_b), canon(run.states[key_b]))

    run, comp_b, exp_b, a, b, key_b = setup()
    inner: dict[str, Payload] = {}

    def round_of_b() -> None:
        saved = rng_state()  # B seeds the global RNGs for itself; A's stream continues after
        inner["b"] = client_round(run, 2, b, run.states[key_b], comp_b, exp_b)
        set_rng_state(saved)

    int_a = client_round(run, 2, a, run.states[a], after_first_step=round_of_b)
    assert "b" in inner, "client A took fewer than two local steps"
    got = (canon(int_a), canon(run.states[a]), canon(inner["b"]), canon(run.states[key_b]))
    return changed, seq, got


@pytest.mark.parametrize(("name", "over"), _reentrancy_cases())
def test_rounds_of_two_clients_interleave_on_one_algorithm_object(name, over, fed, one_thread):
    changed, seq, got = interleave(tiny_cfg(name, *over), fed)
    assert not changed, f"{name}: broadcast/local_update changed algorithm attribute(s) {changed}"
    assert got[:2] == seq[:2], f"{name}: client A's round differs when B's runs inside it"
    assert got[2:] == seq[2:], f"{name}: client B's round differs when run inside A's"


def test_the_interleaving_check_catches_round_values_on_self(fed, one_thread, monkeypatch):
    """SCAFFOLD with its round's correction c - c_i kept on ``self`` (as before the contract,
    without the clean-up): both checks see it: the attribute snapshot, and the interleaving
    (B's correction replaces A's in the middle of A's round)."""
    from fedshift.algorithms.scaffold import CORRECTION, Scaffold

    original, original_before_step = Scaffold.local_update, Scaffold.before_step

    def local_update(self, ctx, down, state):
        c, c_i = down["control"], state["control"]
        self._correction = {k: c[k] - c_i[k] for k in self.shared_param_keys}
        return original(self, ctx, down, state)

    def before_step(self, ctx):
        ctx.scratch[CORRECTION] = self._correction  # whichever client wrote it last
        original_before_step(self, ctx)

    monkeypatch.setattr(Scaffold, "local_update", local_update)
    monkeypatch.setattr(Scaffold, "before_step", before_step)
    changed, seq, got = interleave(tiny_cfg("scaffold"), fed)
    assert changed == ["_correction"]
    assert got[:2] != seq[:2]  # A trained with B's correction after its first step
    assert got[2:] == seq[2:]  # B ran whole, with its own


def test_contract_module_sits_in_core_and_names_types_only_for_checkers():
    src = Path(inspect.getfile(FederatedAlgorithm)).read_text()
    assert "from fedshift.data" not in src.split("if TYPE_CHECKING:")[0]
    assert "from fedshift.models" not in src.split("if TYPE_CHECKING:")[0]
