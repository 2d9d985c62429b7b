"""The registry of transports (:mod:`fedshift.runtime.transports`): the registered ones and
their declarations, the selection by ``run.executor`` / ``run.workers``, the one-line errors,
and a transport registered here (a test's own) running a tiny run."""

from __future__ import annotations

import dataclasses
import sys
import types

import pytest
from conftest import toy_cfg
from support.same_run import assert_runs_equal

from fedshift.core.errors import ConfigError
from fedshift.runtime.native import InProcessTransport
from fedshift.runtime.pool.transport import PoolTransport
from fedshift.runtime.simulation import run_experiment
from fedshift.runtime.transport import FEATURES, SECURE_AGGREGATION, check_supported
from fedshift.runtime.transports import TRANSPORTS, make_transport, transport_entry
from fedshift.runtime.vmap import VmapTransport

pytestmark = pytest.mark.usefixtures("one_thread")  # bit-for-bit comparisons


def _executor(cfg, executor: str):
    """``cfg`` with a ``run.executor`` the config schema would refuse (as code may build)."""
    return dataclasses.replace(cfg, run=dataclasses.replace(cfg.run, executor=executor))


def test_the_transports_on_this_machine_are_registered_with_their_declarations():
    assert {"native", "pool", "vmap"} <= set(TRANSPORTS.names())
    for name, cls in (("native", InProcessTransport), ("pool", PoolTransport),
                      ("vmap", VmapTransport)):  # fmt: skip
        entry = TRANSPORTS.entry(name)
        assert entry.obj is cls and cls.name == name and entry.params is None
        assert cls.supports == frozenset(FEATURES)  # secure aggregation and privacy wrap each
        assert entry.description  # its docstring's first line
    assert PoolTransport.worker_processes and not InProcessTransport.worker_processes
    assert (InProcessTransport.executor, PoolTransport.executor) == ("sequential", "sequential")
    assert VmapTransport.executor == "vmap"


@pytest.mark.parametrize(
    ("over", "workers", "name", "n"),
    [
        ((), None, "native", 1),
        ((), 2, "pool", 2),
        (("run.workers=3",), None, "pool", 3),
        (("run.executor=vmap",), None, "vmap", 1),
        (("run.executor=vmap", "run.workers=auto"), None, "vmap", 1),
    ],
)
def test_run_executor_and_workers_select_a_registered_transport(over, workers, name, n):
    cfg = toy_cfg(*over)
    entry, got = transport_entry(cfg, workers)
    assert (entry.name, got) == (name, n)
    transport = make_transport(cfg, workers=workers)  # nothing starts before connect
    try:
        assert type(transport) is TRANSPORTS.get(name)
    finally:
        transport.close()


def test_vmap_with_worker_processes_is_refused_naming_the_keys():
    with pytest.raises(ConfigError) as e:
        make_transport(toy_cfg("run.executor=vmap", "run.workers=2"))
    msg = str(e.value)
    assert "\n" not in msg and "config key 'run.executor'" in msg and "run.workers=1" in msg


def test_an_executor_no_transport_computes_is_one_line_listing_the_registered():
    with pytest.raises(ConfigError) as e:
        make_transport(_executor(toy_cfg(), "nope"))
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("config key 'run.executor':")
    assert "'nope'" in msg and "sequential, vmap" in msg
    assert all(name in msg for name in ("native", "pool", "vmap"))


class Counting(InProcessTransport):
    """A test's transport: in-process, counting the rounds it delivers; no secure aggregation
    or privacy declared."""

    name = "counting"
    executor = "counting"
    supports = frozenset()
    rounds: list[int] = []

    def train(self, rnd, cids, down):
        Counting.rounds.append(rnd)
        return super().train(rnd, cids, down)


@pytest.fixture
def counting():
    TRANSPORTS.add(Counting.name, Counting, Counting.Params)
    Counting.rounds = []
    yield Counting
    TRANSPORTS._entries.pop(Counting.name)


def test_a_registered_transport_runs_a_run_as_the_built_in_one(counting, tmp_path):
    cfg = toy_cfg(rounds=2)
    ref = run_experiment(cfg, run_dir=tmp_path / "native", progress=False)
    run_experiment(_executor(cfg, "counting"), run_dir=tmp_path / "c", progress=False)
    assert counting.rounds == [1, 2]
    assert_runs_equal(tmp_path / "c", ref.run_dir)


def test_a_feature_the_transport_does_not_declare_is_refused_before_building(counting, tmp_path):
    cfg = _executor(toy_cfg(f"{SECURE_AGGREGATION}=true", rounds=1), "counting")
    with pytest.raises(ConfigError) as e:
        run_experiment(cfg, run_dir=tmp_path / "r", progress=False)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"config key '{SECURE_AGGREGATION}'")
    assert "'counting' transport" in msg
    assert counting.rounds == []
    check_supported(InProcessTransport, cfg)  # the built-in declares it: no error


def test_flower_registers_its_transport_and_refuses_what_it_does_not_declare(tmp_path):
    pytest.importorskip("flwr")
    from fedshift.flower.server import FlowerServer
    from fedshift.flower.transport import GridTransport

    assert TRANSPORTS.get("flower") is GridTransport and GridTransport.executor is None
    assert GridTransport.supports == frozenset({SECURE_AGGREGATION})
    cfg = toy_cfg("privacy.epsilon=50", "augment=[fedrdn]", rounds=1)
    with pytest.raises(
        ConfigError, match=r"^config key 'privacy.epsilon': .*'flower' .*fedshift run"
    ):
        FlowerServer(cfg, tmp_path / "r")


def test_the_architecture_example_is_a_working_transport(tmp_path):
    """docs/ARCHITECTURE.md's "Where a new transport goes" snippet, executed as written: its
    one registration makes `run.executor=timed` run through it, to the native run's numbers."""
    from doc_commands import find_commands

    (snippet,) = [f for f in find_commands() if f.text == "example: new-transport"]
    assert "TRANSPORTS.add(" in snippet.context
    module = types.ModuleType("doc_new_transport")  # as the file it stands for is a module
    sys.modules[module.__name__] = module
    try:
        code = compile(snippet.context, "ARCHITECTURE.md:new-transport", "exec", dont_inherit=True)
        exec(code, module.__dict__)
        assert TRANSPORTS.get("timed") is module.TimedTransport
        cfg = toy_cfg(rounds=2)
        ref = run_experiment(cfg, run_dir=tmp_path / "native", progress=False)
        got = run_experiment(_executor(cfg, "timed"), run_dir=tmp_path / "t", progress=False)
        runtime = got.summary["runtime"]
        assert runtime["executor"] == "timed" and runtime["train_s"] >= 0
        assert_runs_equal(tmp_path / "t", ref.run_dir)
    finally:
        del sys.modules[module.__name__]
        TRANSPORTS._entries.pop("timed", None)
