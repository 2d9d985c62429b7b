"""Declared state (:mod:`fedshift.algorithms.state`): every registered algorithm and augment
declares each key of its server and client state, and reads or writes no other.

The registry-driven test runs every algorithm (and FedAvg with every augment, and the options
that add state of their own) for two rounds with ``Composition.check_state`` on: every state
is a :class:`~fedshift.algorithms.state.DeclaredState`, so a key read or written without a
declaration fails the run with a ContractError naming it. A new algorithm or augment is in the
cases without being listed here."""

from __future__ import annotations

import pytest
import torch
from conftest import toy_cfg
from support.same_run import TINY, seg_overrides

from fedshift.algorithms import ALGORITHMS
from fedshift.algorithms.base import Algorithm
from fedshift.algorithms.fedavg import FedAvg
from fedshift.algorithms.state import (
    ABSENT,
    DeclaredState,
    StateInit,
    check_vars,
    client_var,
    declared,
    init_state,
    reduce_replies,
    server_var,
)
from fedshift.augment import AUGMENTS
from fedshift.augment.compose import Composition
from fedshift.core.contract_errors import ContractError
from fedshift.core.payload import Payload
from fedshift.runtime.simulation import run_experiment
from fedshift.testing import check_declared_state, tiny_cfg

pytestmark = pytest.mark.usefixtures("one_thread")

#: the options that give an algorithm or augment state of its own beyond its defaults
OPTIONS = [
    ("algorithm.name=scaffold", "train.optimizer_state=persist", "train.momentum=0.9"),
    ("algorithm.name=fedsr", "algorithm.reference=averaged"),
    ("algorithm.name=fedsr", "algorithm.reference=local"),
    ("algorithm.name=harmofl", "federation.holdout=[client2]"),
    ("algorithm.name=fraug", "algorithm.variant=released"),
    ("algorithm.name=fedavg", "augment=[fedrdn]", "federation.holdout=[client2]"),
    ("algorithm.name=fedavg", "augment=[cfsi]", "federation.holdout=[client2]"),
    ("algorithm.name=fedbn", "augment=[ffa,mixstyle]"),
    ("algorithm.name=fedprox", "augment=[fedrdn,fedmix]"),
    # privacy.epsilon: the clipped statistics and batch sizes the augments keep
    ("algorithm.name=fedavg", "augment=[fedrdn]", "privacy.epsilon=50"),
    ("algorithm.name=fedavg", "augment=[fedmix]", "privacy.epsilon=50"),
    ("algorithm.name=harmofl", "privacy.epsilon=50"),
]  # fmt: skip

CASES = [
    *[(f"algorithm.name={a}", *seg_overrides(a), *ALGORITHMS.get(a).requires)
      for a in ALGORITHMS.names()],
    *[("algorithm.name=fedavg", f"augment=[{a}]") for a in AUGMENTS.names()],
    *OPTIONS,
]  # fmt: skip


@pytest.mark.parametrize("over", CASES, ids=[" ".join(c) for c in CASES])
def test_every_state_key_is_declared(tmp_path, monkeypatch, over):
    """Two rounds with every state a DeclaredState: no undeclared key is read or written,
    and the states the run built hold the declared keys (ABSENT ones once written)."""
    monkeypatch.setattr(Composition, "check_state", True)
    monkeypatch.setattr(torch, "save", lambda *a, **k: None)  # a DeclaredState is no plain dict
    cfg = toy_cfg(*TINY, *over, rounds=2)
    res = run_experiment(cfg, run_dir=tmp_path / "run", progress=False)
    assert res.summary["rounds"] == 2


# ----------------------------------------------------------------------------- the machinery
def test_undeclared_key_is_an_error():
    """A DeclaredState refuses a read, a write, a membership test and a get of a key not
    declared, and names the component and the key."""
    state = declared({"weights": 1}, [server_var("weights", 0)], "algorithm 'x' server")
    assert state["weights"] == 1
    for touch in (lambda: state["control"], lambda: state.get("control"),
                  lambda: "control" in state, lambda: state.__setitem__("control", 0),
                  lambda: state.update(control=0)):  # fmt: skip
        with pytest.raises(ContractError, match="algorithm 'x' server state key 'control'"):
            touch()


def test_declared_state_copies_keep_the_check():
    import copy

    state = declared({"a": {"t": torch.ones(1)}}, [client_var("a", None)], "c")
    twin = copy.deepcopy(state)
    assert isinstance(twin, DeclaredState) and torch.equal(twin["a"]["t"], torch.ones(1))
    with pytest.raises(ContractError):
        twin["b"] = 1


def test_init_state_follows_the_declarations():
    """Declaration order; a plain value copied per state, a factory called, ABSENT left out."""
    vars = [client_var("n", 0), client_var("seen", []), client_var("later", ABSENT),
            client_var("who", lambda at: at.cid)]  # fmt: skip
    a = init_state(vars, StateInit(model=None, cid="c1"))  # type: ignore[arg-type]
    b = init_state(vars, StateInit(model=None, cid="c2"))  # type: ignore[arg-type]
    assert list(a) == ["n", "seen", "who"] and a["who"] == "c1" and b["who"] == "c2"
    a["seen"].append(1)
    assert b["seen"] == []


@pytest.mark.parametrize(
    ("vars", "side", "match"),
    [
        ([server_var("w", 0), server_var("w", 1)], "server", "declared twice"),
        ([client_var("w", 0)], "server", "is a client variable"),
        ([server_var("w", 0, "keep-local")], "server", "keeps no variable local"),
        ([server_var("w", 0, "median")], "server", "not one of"),  # type: ignore[arg-type]
    ],
)
def test_check_vars_refuses_what_means_nothing(vars, side, match):
    with pytest.raises(ContractError, match=match):
        check_vars(vars, side, "algorithm 'x'")


def test_reduce_replies_mean_and_sum():
    """mean: weighted by ``weight``, a dict updated in place (keys not sent are kept); sum:
    the plain sum."""
    server = {"w": {"a": torch.zeros(1), "local": torch.full((1,), 7.0)}, "s": None, "n": 3}
    vars = [server_var("w", None, "mean"), server_var("s", None, "sum", record="t"),
            server_var("n", 0)]  # fmt: skip
    replies = [
        ("c1", Payload({"w": {"a": torch.ones(1)}, "t": {"x": torch.ones(1)}}, num_examples=1)),
        ("c2", Payload({"w": {"a": torch.full((1,), 4.0)}, "t": {"x": torch.ones(1)}},
                       num_examples=2)),
    ]  # fmt: skip
    reduce_replies(server, vars, replies, lambda p: float(p.num_examples))
    assert server["w"]["a"].item() == pytest.approx(3.0)  # (1 * 1 + 2 * 4) / 3
    assert server["w"]["local"].item() == 7.0
    assert server["s"]["x"].item() == 2.0 and server["n"] == 3


def test_default_state_is_read_from_the_declarations():
    """FedAvg's server and client state are exactly what its declarations say, and an
    algorithm that adds a declaration gets it from the default init (no init override)."""

    class Counted(FedAvg):
        name = "counted"

        def client_vars(self):
            return [*super().client_vars(), client_var("rounds", 0)]

    from fedshift.runtime.experiment import build_experiment
    from fedshift.testing import tiny_federation

    cfg = tiny_cfg("fedavg")
    exp = build_experiment(cfg, tiny_federation(cfg))
    algo = exp.algo.algo
    assert isinstance(algo, Algorithm)
    model = exp.model
    assert list(algo.init_server(model)) == [v.name for v in algo.server_vars()] == ["weights"]
    assert list(algo.init_client("c", None, model)) == ["local"]  # optimizer: ABSENT
    counted = Counted(algo.params, algo.train, algo.federation, model, algo.num_clients)
    assert counted.init_client("c", None, model)["rounds"] == 0


class _Counting(FedAvg):
    """FedAvg that counts each client's rounds in its state (``rounds``)."""

    name = "test-state-counting"

    def local_update(self, ctx, down, state):
        state["rounds"] = state.get("rounds", 0) + 1
        return super().local_update(ctx, down, state)


class _CountingDeclared(_Counting):
    name = "test-state-counting-declared"

    def client_vars(self):
        return [*super().client_vars(), client_var("rounds", ABSENT, doc="rounds trained")]


@pytest.fixture
def counting(monkeypatch):
    """The two classes registered for the test only."""
    from fedshift.algorithms import ALGORITHMS as registry

    for cls in (_Counting, _CountingDeclared):
        registry.add(cls.name, cls, cls.Params)
    yield
    for cls in (_Counting, _CountingDeclared):
        registry._entries.pop(cls.name)


def test_check_declared_state_names_an_undeclared_key(counting):
    """fedshift.testing.check_declared_state: the undeclared key fails, declared it passes."""
    with pytest.raises(ContractError, match="'test-state-counting' client state key 'rounds'"):
        check_declared_state(_Counting.name)
    check_declared_state(_CountingDeclared.name)
