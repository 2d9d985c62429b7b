"""Algorithms in two halves (fedshift.algorithms.halves): a client process (pool worker,
Flower SuperNode) builds the client half only, with none of the server's machinery, and
trains exactly as the one-class algorithm does; one-class algorithms are their own client
half (the adapter)."""

from __future__ import annotations

import dataclasses
import sys
import types

import pytest
import torch
from doc_commands import find_commands

from fedshift.algorithms import ALGORITHMS
from fedshift.algorithms.adcol import ADCOLClient
from fedshift.algorithms.distrans.aggregator import OffsetAggregator
from fedshift.algorithms.distrans.algorithm import DisTransClient
from fedshift.algorithms.fedavg import FedAvgClient
from fedshift.algorithms.fedavgm import FedAvgMClient
from fedshift.algorithms.fedbn import FedBNClient
from fedshift.algorithms.fedopt import FedAdagradClient, FedAdamClient, FedYogiClient
from fedshift.algorithms.fedprox import FedProxClient
from fedshift.algorithms.fedsam import FedSAM
from fedshift.algorithms.halves import (
    ClientHalf,
    ClientTrainer,
    ServerRule,
    client_class,
    is_split,
    method_spec,
)
from fedshift.algorithms.pfedhn.algorithm import PFedHNClient
from fedshift.algorithms.pfedhn.hypernet import HyperNetwork
from fedshift.core.errors import FedshiftError
from fedshift.runtime.client import train_client
from fedshift.runtime.experiment import build_experiment, init_client_state
from fedshift.testing import check_algorithm, full_round, start, tiny_cfg, tiny_federation

pytestmark = pytest.mark.usefixtures("one_thread")  # bit-for-bit comparisons

#: the algorithms written as two halves, with their client halves
SPLIT = {
    "fedavg": FedAvgClient,
    "fedprox": FedProxClient,
    "fedbn": FedBNClient,
    "pfedhn": PFedHNClient,
    "distrans": DisTransClient,
    "adcol": ADCOLClient,
    "fedavgm": FedAvgMClient,
    "fedadam": FedAdamClient,
    "fedyogi": FedYogiClient,
    "fedadagrad": FedAdagradClient,
}


def test_client_class_is_the_declared_half_or_the_class_itself():
    for name in ALGORITHMS.names():
        cls = ALGORITHMS.get(name)
        want = SPLIT.get(name, cls)
        assert client_class(cls) is want, name
        assert is_split(cls) == (name in SPLIT)
        if name in SPLIT:
            assert issubclass(want, ClientHalf) and issubclass(cls, want)
    # a subclass of a split method that is not split itself is one class again
    assert client_class(FedSAM) is FedSAM


@pytest.mark.parametrize("name", sorted(SPLIT))
def test_client_half_carries_the_methods_spec(name):
    """What the config layer reads (name, Params, tasks, weighting, checks) is the same on
    the client half a client process builds as on the registered class."""
    cls = ALGORITHMS.get(name)
    spec, half = method_spec(cls), method_spec(client_class(cls))
    hooks = ("check", "implied_augments", "wrap_model")  # classmethods: bound to each class
    for f in dataclasses.fields(spec):
        if f.name in hooks:
            assert getattr(half, f.name).__func__ is getattr(spec, f.name).__func__, f.name
        elif f.name != "server":
            assert getattr(half, f.name) == getattr(spec, f.name), f.name
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.name = "other"  # type: ignore[misc]


def _client_exp(cfg, fed):
    exp = build_experiment(cfg, fed, client_only=True)
    assert isinstance(exp.algo.algo, ClientTrainer) and isinstance(exp.algo.algo, ServerRule)
    return exp


def _same_round(cfg, fed) -> None:
    """Round 1 of every client trained by the client half equals the one-class algorithm's
    (the server's down payload, the reply's records and metrics, the client state)."""
    run = start(cfg, fed)
    client = _client_exp(cfg, fed)
    # every client's initial state first: init_client reads the model's initial weights
    states = {c: init_client_state(client, cfg.seed, c, d) for c, d in client.train_clients.items()}
    for cid, data in run.exp.train_clients.items():
        state = states[cid]
        down = run.exp.algo.broadcast(run.server, 1, cid)
        want = train_client(run.exp, cfg.seed, cid, data, 1, down, run.states[cid])
        got = train_client(client, cfg.seed, cid, data, 1, down, state)
        assert got.metrics == want.metrics
        assert got.records.keys() == want.records.keys()
        for rec, tensors in want.records.items():
            for k, t in tensors.items():
                assert torch.equal(got.records[rec][k], t), (cid, rec, k)
        for k, t in run.states[cid]["local"].items():
            assert torch.equal(state["local"][k], t), (cid, k)


@pytest.mark.parametrize(
    "name", ["fedavg", "fedprox", "fedbn", "fedavgm", "fedadam", "fedyogi", "fedadagrad"]
)
def test_client_half_trains_as_the_one_class_algorithm(name):
    _same_round(tiny_cfg(name), tiny_federation())


@pytest.mark.parametrize("averaging", ["none", "fedavg"])
def test_adcol_client_half_holds_no_server_discriminator(averaging):
    """ADCOL's client half has no server discriminator (nor its party rows): only D's shape,
    whose values it never reads, and it trains as the whole algorithm does."""
    cfg, fed = tiny_cfg("adcol", f"algorithm.averaging={averaging}"), tiny_federation()
    half = _client_exp(cfg, fed).algo.algo
    assert type(half) is ADCOLClient
    assert not hasattr(half, "disc") and not hasattr(half, "_rows")
    _same_round(cfg, fed)


def test_pfedhn_client_half_builds_no_hypernetwork(monkeypatch):
    """A pool worker / SuperNode builds pFedHN's client half: no hypernetwork is constructed
    (its constructor is never called), the half holds no hypernetwork parameter, and it
    trains on the generated weights as the whole algorithm does."""
    cfg, fed = tiny_cfg("pfedhn"), tiny_federation()
    built = []
    real = HyperNetwork.__init__

    def counted(self, *args, **kwargs):
        built.append(1)
        real(self, *args, **kwargs)

    monkeypatch.setattr(HyperNetwork, "__init__", counted)
    client = _client_exp(cfg, fed)
    assert built == []
    half = client.algo.algo
    assert type(half) is PFedHNClient
    assert not any(isinstance(v, torch.nn.Module) for v in vars(half).values())
    assert not hasattr(half, "hnet") and not hasattr(half, "opt")
    server = build_experiment(cfg, fed)  # the server process's: both halves
    assert built == [1] and isinstance(server.algo.algo.hnet, HyperNetwork)  # type: ignore[attr-defined]
    _same_round(cfg, fed)


def test_pfedhn_client_half_evaluates_from_the_server_view():
    cfg, fed = tiny_cfg("pfedhn"), tiny_federation()
    run = start(cfg, fed)
    client = _client_exp(cfg, fed)
    cid, data = next(iter(run.exp.train_clients.items()))
    state = init_client_state(client, cfg.seed, cid, data)
    view = run.exp.algo.server_view(run.server, cid)
    got = client.algo.personal_weights(view, state)
    want = run.exp.algo.personal_weights(run.server, run.states[cid])
    assert got is not None and want is not None and got.keys() == want.keys()
    assert all(torch.equal(got[k], want[k]) for k in want)
    with pytest.raises(FedshiftError, match="no generated weights"):
        client.algo.personal_weights({}, state)


@pytest.mark.parametrize("aggregation", ["nn", "auto"])
def test_distrans_client_half_builds_no_aggregator(monkeypatch, aggregation):
    """DisTrans's client half (pool worker, SuperNode) never constructs the NN aggregator,
    not even for its disclosures, and trains as the whole algorithm does."""
    cfg = tiny_cfg("distrans", f"algorithm.aggregation={aggregation}")
    fed = tiny_federation()
    run = start(cfg, fed)  # the server's half builds it (init_server)
    assert "aggregator" in run.server

    def refuse(self, *args, **kwargs):
        raise AssertionError("the client half built the server's NN aggregator")

    monkeypatch.setattr(OffsetAggregator, "__init__", refuse)
    client = _client_exp(cfg, fed)
    half = client.algo.algo
    assert type(half) is DisTransClient and not hasattr(half, "_aggregator")
    assert client.algo.disclosures(client.model)
    monkeypatch.undo()
    _same_round(cfg, fed)


@pytest.mark.parametrize("name", ["pfedhn", "fedsam"])
def test_client_process_refuses_the_server_side(name):
    """A client composition runs no server step, split or one-class algorithm alike."""
    cfg, fed = tiny_cfg(name), tiny_federation()
    run = start(cfg, fed)
    client = _client_exp(cfg, fed).algo
    assert client.client_only and not run.exp.algo.client_only
    calls = {
        "init_server": lambda: client.init_server(run.exp.model),
        "broadcast": lambda: client.broadcast(run.server, 1, "client0"),
        "aggregate": lambda: client.aggregate(run.server, 1, []),
        "server_view": lambda: client.server_view(run.server, "client0"),
        "global_weights": lambda: client.global_weights(run.server),
    }
    for what, call in calls.items():
        with pytest.raises(FedshiftError, match=f"{what} is the server's"):
            call()


def test_client_disclosures_say_what_the_server_only_sums():
    """The client process's disclosures (its privacy plan) mark the records the server
    half's aggregate only sums, as the server process's do."""
    cfg, fed = tiny_cfg("fedavg"), tiny_federation()
    server = build_experiment(cfg, fed)
    client = _client_exp(cfg, fed)
    def shown(exp):
        return [(d.record, d.direction, d.what, d.summed) for d in exp.algo.disclosures(exp.model)]

    assert shown(client) == shown(server)
    assert any(summed for *_, summed in shown(client))


def test_the_architecture_example_is_a_working_algorithm():
    """docs/ARCHITECTURE.md's "An algorithm in two halves" snippet, executed as written: its
    one registration makes `algorithm.name=mine` run (the contract checks), and a client
    process builds its client half only."""
    (snippet,) = [f for f in find_commands() if f.text == "example: new-algorithm"]
    assert "ALGORITHMS.add(" in snippet.context
    module = types.ModuleType("doc_new_algorithm")  # as the file it stands for is a module
    sys.modules[module.__name__] = module
    try:
        code = compile(snippet.context, "ARCHITECTURE.md:new-algorithm", "exec", dont_inherit=True)
        exec(code, module.__dict__)
        cls = ALGORITHMS.get("mine")
        assert client_class(cls) is module.MineClient and is_split(cls)
        check_algorithm("mine")
        cfg, fed = tiny_cfg("mine"), tiny_federation()
        assert type(_client_exp(cfg, fed).algo.algo) is module.MineClient
        run = start(cfg, fed)
        full_round(run, 1)
        assert run.server["replies"] == len(run.cids)
        _same_round(cfg, fed)
    finally:
        del sys.modules[module.__name__]


def test_pool_worker_builds_the_client_half_only(monkeypatch):
    """A pool worker's build request (run in this process) builds pFedHN's client half: no
    hypernetwork, a composition that refuses the server side."""
    from fedshift.runtime.pool.worker import _Worker

    def refuse(self, *args, **kwargs):
        raise AssertionError("the pool worker built the server's hypernetwork")

    monkeypatch.setattr(HyperNetwork, "__init__", refuse)
    cfg = tiny_cfg("pfedhn")
    worker = _Worker(0, None)
    worker.build(cfg.to_dict(), None, torch.get_num_threads())
    assert type(worker.exp.algo.algo) is PFedHNClient and worker.exp.algo.client_only
    worker.clients(list(worker.exp.train_clients))
    assert set(worker.states) == set(worker.exp.train_clients)
