"""The contract checks fedshift runs on its own algorithms, augments and models, for yours.

    from fedshift.testing import check_algorithm, check_augment, check_model

    def test_my_method_keeps_the_contract():
        check_algorithm("fadingprox")        # an entry-point name, 'module:Class' or the class

Each check builds a tiny run (two ``toyshift`` clients, a few images, two local steps per
round) and raises :class:`ContractError` (an ``AssertionError``, so pytest shows it as a
failed assertion) naming what broke. What is checked, for the algorithm under test (an
augment: FedAvg with it; a model: FedAvg on it):

* the class has every member of :class:`fedshift.core.contract.AlgorithmSpec` with the
  spec's parameter names (an override with another signature fails);
* ``init_server`` / ``init_client`` return plain data (dicts, lists, tensors, numbers,
  strings) that ``torch.save`` writes and ``torch.load(weights_only=True)`` reads back
  unchanged, before and after a round;
* broadcast -> local_update -> aggregate runs a round whose up payloads are finite;
* the global / personal weights have the model's state-dict keys, and
  ``personal_weights(server_view(server, cid), state) == personal_weights(server, state)``;
* re-entrancy: ``broadcast`` and ``local_update`` change no attribute of the algorithm object,
  and a client's round run *inside* another client's round (after its first local step, on
  the same algorithm object, each client with its own working model) gives both clients
  exactly the payloads and states of running them one after the other;
* a model: it subclasses :class:`~fedshift.models.base.FedModel`, names its stages, and
  ``forward(x) == head(features(x))`` with an embedding per image and a logit per class.

tests/core/test_contract.py runs these checks on every built-in algorithm.
:func:`check_declared_state` (apart, for a class that declares its state) runs two rounds in
which a state key read or written without a declaration is an error.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import io
import math
import typing
from collections.abc import Callable

import torch
from torch import nn

from fedshift.algorithms import ALGORITHMS, Algorithm
from fedshift.augment.compose import Composition
from fedshift.catalog import resolve
from fedshift.core.config import RunConfig, TrainConfig, load_config
from fedshift.core.context import ClientContext
from fedshift.core.contract import AlgorithmSpec, FederatedAlgorithm, Reply, State
from fedshift.core.federation import ClientData, Federation
from fedshift.core.payload import Payload
from fedshift.core.seeding import generator, rng_state, seed_global, set_rng_state
from fedshift.data import load_dataset
from fedshift.models.base import FedModel
from fedshift.runtime.experiment import Experiment, build_experiment, init_client_state
from fedshift.runtime.rundir.checkpoint_io import state_departure

__all__ = [
    "TINY",
    "ContractError",
    "check_algorithm",
    "check_augment",
    "check_declared_state",
    "check_model",
    "check_one_round",
    "check_reentrancy",
    "check_spec",
    "tiny_cfg",
]

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

#: the types declared only for type checkers in fedshift.core.contract
TYPE_NAMES = {
    "ClientData": ClientData,
    "Federation": Federation,
    "FedModel": FedModel,
    "TrainConfig": TrainConfig,
}


class ContractError(AssertionError):
    """A component breaks the contract; the message says where."""


def _require(ok: object, message: str) -> None:
    if not ok:
        raise ContractError(message)


def _name(component: str | type) -> str:
    """A registry name for ``component``: as given, or ``module:Class`` for a class."""
    if isinstance(component, str):
        return component
    return f"{component.__module__}:{component.__qualname__}"


# ----------------------------------------------------------------------------- building
def tiny_cfg(algorithm: str | type = "fedavg", *overrides: str) -> RunConfig:
    """The resolved :data:`TINY` config with ``algorithm``, the overrides the algorithm
    ``requires`` (FedWon's model) and ``overrides``."""
    name = _name(algorithm)
    needs = getattr(ALGORITHMS.get(name), "requires", ())
    return resolve(load_config(None, [*TINY, f"algorithm.name={name}", *needs, *overrides]))


def tiny_federation(cfg: RunConfig | None = None) -> Federation:
    """The federation of a tiny config (default: :data:`TINY`'s)."""
    cfg = cfg or tiny_cfg()
    return load_dataset(cfg.dataset, cfg.partition)


@dataclasses.dataclass
class Run:
    """One experiment's parts as a runtime holds them: server, client states, and the
    model / composition each client trains with."""

    cfg: RunConfig
    exp: Experiment
    server: State
    states: dict[str, State]
    #: copies of the server and client state as ``init_server`` / ``init_client`` built them
    #: (before the setup exchange): what a checkpoint is checked against on resume
    initial: tuple[State, dict[str, State]] | None = None

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
    initial = (copy.deepcopy(server), copy.deepcopy(states))
    if comp.needs_setup:
        replies = [(cid, comp.setup_reply(cid, states[cid])) for cid in states]
        comp.setup_aggregate(server, replies)
        for cid in states:
            comp.setup_receive(comp.setup_broadcast(server, cid), states[cid])
    return Run(cfg, exp, server, states, initial)


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


# ----------------------------------------------------------------------------- comparing
def canon(obj: object) -> object:
    """A comparable rendering of (nested) data: tensors by dtype, shape and bytes, modules
    and optimisers by their state dicts."""
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
            _require(isinstance(k, str | int), f"{where}: key {k!r} is not a str or int")
            assert_plain(v, f"{where}[{k!r}]")
    elif isinstance(obj, list | tuple):
        for i, v in enumerate(obj):
            assert_plain(v, f"{where}[{i}]")
    else:
        ok = obj is None or isinstance(obj, torch.Tensor | bool | int | float | str)
        _require(ok, f"{where}: {type(obj).__name__} is not plain data")


def assert_saves_and_loads_back(obj: object, where: str) -> None:
    assert_plain(obj, where)
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    back = torch.load(buf, weights_only=True)
    _require(canon(back) == canon(obj), f"{where} changed through torch.save/load")


def assert_finite(up: Payload, where: str) -> None:
    bad = up.first_non_finite()
    _require(bad is None, f"{where}: non-finite {bad}")
    loss = up.metrics.get("train_loss")
    _require(loss is None or math.isfinite(loss), f"{where}: train_loss={loss}")


def hints(func: Callable, owner: object) -> dict[str, object]:
    module = inspect.getmodule(owner)
    return typing.get_type_hints(func, vars(module), TYPE_NAMES)


def protocol_members(proto: type) -> list[str]:
    """The methods and properties a protocol declares, itself or through the protocols it
    extends (its ClassVars are annotations)."""
    return sorted({n for base in proto.__mro__ for n in vars(base) if not n.startswith("_")})


# ----------------------------------------------------------------------------- the checks
def check_spec(algorithm: str | type) -> None:
    """The algorithm class has every member of ``AlgorithmSpec``, with the spec's parameter
    names (an override with another signature, e.g. the old ``init_client(cid, model)``,
    fails here)."""
    name = _name(algorithm)
    cls = ALGORITHMS.get(name)
    _require(issubclass(cls, Algorithm), f"{name}: not a subclass of Algorithm")
    for member in protocol_members(AlgorithmSpec):
        want = inspect.getattr_static(AlgorithmSpec, member)
        got = inspect.getattr_static(cls, member)  # the class's own or inherited member
        if isinstance(want, property):
            _require(isinstance(got, property), f"{name}.{member} must be a property")
            continue
        ws = inspect.signature(getattr(AlgorithmSpec, member))
        gs = inspect.signature(getattr(cls, member))
        _require(
            list(gs.parameters) == list(ws.parameters),
            f"{name}.{member}: parameters {gs} differ from the contract's {ws}",
        )
    for attr in AlgorithmSpec.__annotations__:
        _require(hasattr(cls, attr), f"{name}: no attribute {attr!r}")


def check_one_round(cfg: RunConfig, fed: Federation | None = None) -> None:
    """One round of ``cfg``: plain, savable state; finite payloads; weights with the model's
    keys; ``server_view`` gives the personal weights the full server state gives."""
    fed = fed or tiny_federation(cfg)
    name = cfg.algorithm.name
    run = start(cfg, fed)
    comp = run.exp.algo
    _require(isinstance(comp, FederatedAlgorithm), f"{name}: not a FederatedAlgorithm")
    _require(isinstance(comp.algo, AlgorithmSpec), f"{name}: not an AlgorithmSpec")
    assert_saves_and_loads_back(run.server, f"{name}: init_server")
    for cid, state in run.states.items():
        assert_saves_and_loads_back(state, f"{name}: init_client({cid})")
    for cid, up in full_round(run, 1):
        assert_finite(up, f"{name}: reply of {cid}")
    assert_saves_and_loads_back(run.server, f"{name}: server after round 1")
    for cid, state in run.states.items():
        assert_saves_and_loads_back(state, f"{name}: state of {cid} after round 1")
    if run.initial is not None:  # what a resumed run's checkpoint is checked against
        departed = state_departure(run.server, run.initial[0], "server") or state_departure(
            run.states, run.initial[1], "clients"
        )
        _require(
            departed is None,
            f"{name}: after round 1, {departed}: keep the keys init_server / init_client "
            "return, with their tensors' shapes and dtypes (a resumed run's checkpoint is "
            "checked against them)",
        )
    _require(comp.has_global_model or comp.has_personal_model, f"{name}: no model to evaluate")
    keys = set(run.exp.model.state_dict())
    if comp.has_global_model:
        _require(
            set(comp.global_weights(run.server)) == keys,
            f"{name}: global_weights does not have the model's state-dict keys",
        )
    if comp.has_personal_model:
        for cid, state in run.states.items():
            full = comp.personal_weights(run.server, state)
            view = comp.personal_weights(comp.server_view(run.server, cid), state)
            _require(set(full) == keys, f"{name}: personal_weights lacks model keys ({cid})")
            _require(canon(view) == canon(full), f"{name}: server_view of {cid}")


def _pair(cfg: RunConfig, fed: Federation) -> tuple[Run, Composition, Experiment]:
    """A run after round 1, plus client B's working parts for round 2: a second
    experiment's model, pipeline and augments (attached to that model) around the *same*
    algorithm object."""
    run = start(cfg, fed)
    full_round(run, 1)
    other = build_experiment(cfg, fed)
    return run, Composition(run.exp.algo.algorithm, other.augments), other


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
    algo = run.exp.algo.algorithm
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
    _require("b" in inner, "client A took fewer than two local steps")
    got = (canon(int_a), canon(run.states[a]), canon(inner["b"]), canon(run.states[key_b]))
    return changed, seq, got


def check_reentrancy(cfg: RunConfig, fed: Federation | None = None) -> None:
    """``broadcast`` / ``local_update`` leave the algorithm object unchanged, and a client's
    round inside another's gives both the results of running them one after the other."""
    fed = fed or tiny_federation(cfg)
    name = cfg.algorithm.name
    changed, seq, got = interleave(cfg, fed)
    _require(
        not changed,
        f"{name}: broadcast/local_update changed algorithm attribute(s) {changed}: keep a "
        "round's working values in ctx.scratch or the client state, never on self",
    )
    _require(got[:2] == seq[:2], f"{name}: client A's round differs when B's runs inside it")
    _require(got[2:] == seq[2:], f"{name}: client B's round differs when run inside A's")


def check_algorithm(algorithm: str | type, *overrides: str) -> None:
    """Every check of the module docstring on ``algorithm`` (a registered or entry-point
    name, ``module:Class``, or the class), in the tiny run plus ``overrides``."""
    check_spec(algorithm)
    cfg = tiny_cfg(algorithm, *overrides)
    fed = tiny_federation(cfg)
    check_one_round(cfg, fed)
    check_reentrancy(cfg, fed)


def check_declared_state(algorithm: str | type = "fedavg", *overrides: str) -> None:
    """Every key two rounds of ``algorithm`` (and the augments ``overrides`` name) read or
    write in a server or client state is declared (``server_vars()`` / ``client_vars()``,
    :mod:`fedshift.algorithms.state`): each state is a
    :class:`~fedshift.algorithms.state.DeclaredState`, and an undeclared key raises
    :class:`ContractError` naming the component and the key. Not part of
    :func:`check_algorithm`: a class that overrides ``init_server`` / ``init_client``
    without declaring its keys still runs; this is for one that declares them."""
    cfg = tiny_cfg(algorithm, *overrides)
    fed = tiny_federation(cfg)
    before = Composition.check_state
    Composition.check_state = True
    try:
        run = start(cfg, fed)
        for rnd in (1, 2):
            full_round(run, rnd)
        comp = run.exp.algo
        if comp.has_global_model:
            comp.global_weights(run.server)
        if comp.has_personal_model:
            for cid, state in run.states.items():
                comp.personal_weights(run.server, state)
                comp.personal_weights(comp.server_view(run.server, cid), state)
    finally:
        Composition.check_state = before


def check_augment(augment: str | type, *overrides: str, algorithm: str = "fedavg") -> None:
    """The round and re-entrancy checks on ``algorithm`` (FedAvg) with ``augment``."""
    cfg = tiny_cfg(algorithm, f"augment=[{_name(augment)!r}]", *overrides)
    fed = tiny_federation(cfg)
    check_one_round(cfg, fed)
    check_reentrancy(cfg, fed)


def check_model(model: str | type, *overrides: str, algorithm: str = "fedavg") -> None:
    """``model`` is a :class:`FedModel` with named stages whose ``forward`` is
    ``head(features(x))``; then the round and re-entrancy checks of ``algorithm`` (FedAvg)
    on it (the tiny run's images: 3 channels)."""
    name = _name(model)
    cfg = tiny_cfg(algorithm, f"model.name={name}", *overrides)
    fed = tiny_federation(cfg)
    cls = cfg.model.factory
    _require(
        isinstance(cls, type) and issubclass(cls, FedModel),
        f"{name}: not a subclass of FedModel",
    )
    built = build_experiment(cfg, fed).model
    _require(len(built.stages) > 0, f"{name}: self.stages names no stage")
    x = fed.clients[0].train.x[:3]
    built.eval()
    with torch.no_grad():
        z = built.features(x)
        logits = built(x)
        _require(z.dim() == 2 and z.shape[0] == 3, f"{name}: features(x) is {tuple(z.shape)}")
        _require(
            tuple(logits.shape) == (3, fed.num_classes),
            f"{name}: forward(x) is {tuple(logits.shape)}, expected (3, {fed.num_classes})",
        )
        _require(torch.equal(built.head(z), logits), f"{name}: forward(x) != head(features(x))")
    check_one_round(cfg, fed)
    check_reentrancy(cfg, fed)
