"""The Flower App of ``fedshift flower app`` as ``flwr run`` runs it (issue 49, item 3).

- a simulation whose SuperNode count differs from the run's clients is refused at once,
  before the run directory exists, as one line naming ``num-supernodes`` (Flower's own
  in-memory simulation grid, and fedshift's in-process one);
- the app writes runs under an absolute folder its README states; a run directory that holds
  a run is refused (no silent ``-2``) unless the run config ``exists`` says otherwise;
- the app has no ``[tool.flwr.federations]`` and neither writing it nor what ``flwr run``
  does with it before submitting changes the user's Flower config.

No Ray and no SuperLink: the ServerApp's ``main`` is called with a grid directly.
"""

from __future__ import annotations

import io
import logging
import os
import time
import tomllib
from pathlib import Path

import pytest
import yaml

pytest.importorskip("flwr")

from flwr.app import Context, RecordDict  # noqa: E402

from fedshift.cli import main as cli  # noqa: E402
from fedshift.core.errors import FedshiftError  # noqa: E402
from fedshift.flower import apps  # noqa: E402
from fedshift.flower.inprocess import InProcessGrid  # noqa: E402
from fedshift.flower.node import build_client_app  # noqa: E402
from fedshift.runtime.rundir.ownership import RunDirExists  # noqa: E402

TOY = ["dataset.name=toyshift", "model.name=lenet5", "train.batch_size=16", "name=t"]


@pytest.fixture(autouse=True)
def _here(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the app's default out is ./runs, made absolute


def _app(tmp_path: Path, *extra: str) -> dict:
    """Write the app with the CLI; its run config."""
    assert cli(["flower", "app", str(tmp_path / "app"), *TOY, "train.rounds=1", *extra]) == 0
    doc = tomllib.loads((tmp_path / "app" / "pyproject.toml").read_text())
    return dict(doc["tool"]["flwr"]["app"]["config"])


def _context(rc: dict) -> Context:
    return Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=rc)


def _memory_grid(nodes: int):
    """Flower's simulation grid (an ``InMemoryGrid`` on an in-memory link state) with
    ``nodes`` virtual SuperNodes registered as Flower's simulation runtime registers them."""
    from flwr.proto.task_pb2 import Task  # pylint: disable=E0611
    from flwr.server.superlink.fleet.vce.vce_api import _register_nodes
    from flwr.server.superlink.linkstate import LinkStateFactory
    from flwr.server.superlink.linkstate.in_memory_linkstate import RunRecord
    from flwr.supercore.constant import FLWR_IN_MEMORY_DB_NAME, NOOP_FEDERATION_ID
    from flwr.supercore.object_store import ObjectStoreFactory
    from flwr.supercore.run import Run
    from flwr.superlink.federation import NoOpFederationManager
    from flwr.superlink.grid import InMemoryGrid

    factory = LinkStateFactory(
        FLWR_IN_MEMORY_DB_NAME, NoOpFederationManager(), ObjectStoreFactory()
    )
    run = Run.create_empty(run_id=7)
    run.federation_id = NOOP_FEDERATION_ID
    run.primary_task_id = 8
    state = factory.state()
    state.run_ids[run.run_id] = RunRecord(run=run)
    state.task_store[8] = Task(task_id=8, run_id=run.run_id)
    grid = InMemoryGrid(state_factory=factory)
    grid.set_run(run)
    _register_nodes(nodes, factory)
    return grid


@pytest.mark.parametrize("kind", ["flower", "in-process"])
@pytest.mark.parametrize("nodes", [2, 4])
def test_a_simulation_with_another_supernode_count_is_refused_at_once(tmp_path, kind, nodes):
    rc = _app(tmp_path)
    assert rc["nodes"] == 3 and rc["node-wait"] == 120.0
    grid = _memory_grid(nodes) if kind == "flower" else InProcessGrid(build_client_app(), nodes)
    t0 = time.monotonic()
    with pytest.raises(FedshiftError) as e:
        apps.main(grid, _context(rc))
    assert time.monotonic() - t0 < 10  # not the 120 s node-wait
    msg = str(e.value)
    assert f"has {nodes} SuperNode(s) but the run needs 3" in msg
    assert '--federation-config "num-supernodes=3"' in msg and "\n" not in msg
    out = Path(rc["out"])
    assert not out.exists() or not any(out.rglob("*"))  # no run directory, not even empty


def test_a_deployment_waits_node_wait_and_leaves_no_run_directory(tmp_path):
    rc = _app(tmp_path) | {"node-wait": 0.5}
    nodes = [{"client": "client0"}, {"client": "client1"}]  # SuperNodes, not a simulation
    with pytest.raises(FedshiftError, match=r"only 2 of 3 SuperNodes connected after 0.5 s"):
        apps.main(InProcessGrid(build_client_app(), 2, nodes), _context(rc))
    assert not Path(rc["out"]).exists() or not any(Path(rc["out"]).rglob("*"))


def test_a_servers_refusal_is_one_line_in_flowers_log():
    """Flower logs a ServerApp's exception with its traceback; a FedshiftError (a refusal
    that names its fix) becomes its one line."""
    apps.one_line_errors()
    apps.one_line_errors()  # once per process, however often main runs
    flwr_log = logging.getLogger("flwr")
    assert sum(isinstance(f, apps.OneLineErrors) for f in flwr_log.filters) == 1
    buf = io.StringIO()
    handler = logging.StreamHandler(buf)
    flwr_log.addHandler(handler)
    try:
        flwr_log.error("%s raised an exception", "ServerApp", exc_info=FedshiftError("fix X"))
        flwr_log.error("%s raised an exception", "ServerApp", exc_info=ValueError("bug"))
    finally:
        flwr_log.removeHandler(handler)
    first, rest = buf.getvalue().split("\n", 1)
    assert first == "fedshift: error: fix X"
    assert "Traceback" not in first and "ValueError: bug" in rest  # others keep theirs


def test_the_app_writes_runs_under_the_absolute_folder_its_readme_states(tmp_path):
    rc = _app(tmp_path, "--out", "results")
    out = tmp_path / "results"
    assert rc["out"] == str(out) and rc["exists"] == "error"
    readme = (tmp_path / "app" / "README.md").read_text()
    assert f"Runs are written under `{out}`" in readme
    assert f'flwr run {tmp_path / "app"} local --federation-config "num-supernodes=3"' in readme
    assert "`error` refuses the run" in readme and "`new` writes to the next free" in readme
    # the default: the config's out (runs), made absolute here
    rc = _app(tmp_path)
    assert rc["out"] == str(tmp_path / "runs")
    assert _app(tmp_path, "--new")["exists"] == "new"


def test_a_run_directory_that_holds_a_run_is_refused_not_suffixed(tmp_path):
    """No silent ``-2``: the run config ``exists`` (default ``error``) decides, and the
    refusal names the run config keys that choose otherwise."""
    from fedshift.runtime.rundir.results import planned_dirs

    rc = _app(tmp_path)
    cfg = apps.resolve(yaml.safe_load(rc["fedshift-config"]))
    [planned] = planned_dirs([cfg], rc["out"])
    planned.mkdir(parents=True)
    (planned / "summary.json").write_text("{}")
    with pytest.raises(RunDirExists) as e:
        apps.main(InProcessGrid(build_client_app(), 3), _context(rc))
    msg = str(e.value)
    assert "holds a finished run" in msg and "extend" not in msg  # resume takes the saved config
    assert "--run-config \"exists='new'\"" in msg and "exists='overwrite'" in msg
    assert not planned.with_name(planned.name + "-2").exists()
    assert sorted(p.name for p in planned.parent.iterdir()) == [planned.name]


def _flower_config_home(tmp_path: Path, monkeypatch) -> Path:
    """HOME and FLWR_HOME in ``tmp_path``; the user's Flower config: Flower's default with a
    connection of theirs made the default."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    home = tmp_path / "home" / ".flwr"
    monkeypatch.setenv("FLWR_HOME", str(home))
    home.mkdir(parents=True)
    (home / "config.toml").write_text(
        '[superlink]\ndefault = "mine"\n\n[superlink.mine]\naddress = "10.0.0.9:9093"\n'
        'insecure = true\n\n[superlink.local]\naddress = ":local:"\n'
    )
    return home


def test_writing_and_preparing_the_app_leave_the_users_flower_config_alone(tmp_path, monkeypatch):
    home = _flower_config_home(tmp_path, monkeypatch)
    before = {p: p.read_bytes() for p in home.rglob("*") if p.is_file()}
    _app(tmp_path)
    app = tmp_path / "app"
    doc = tomllib.loads((app / "pyproject.toml").read_text())
    assert "federations" not in doc["tool"]["flwr"]  # Flower 1.41: legacy, migrated away
    pyproject = (app / "pyproject.toml").read_bytes()
    # what `flwr run APP` does with the app before it contacts the SuperLink: migrate a
    # legacy federations section (none here), validate the app, read the connection
    from flwr.cli.config_migration import migrate
    from flwr.cli.config_utils import load_and_validate
    from flwr.cli.flower_config import read_superlink_connection

    migrate(str(app), [], ignore_legacy_usage=True)
    _, warnings = load_and_validate(app / "pyproject.toml")
    assert warnings == []
    assert read_superlink_connection("local").options is None  # no deprecated options.*
    assert read_superlink_connection(None).name == "mine"  # the user's default stays
    assert {p: p.read_bytes() for p in home.rglob("*") if p.is_file()} == before
    assert (app / "pyproject.toml").read_bytes() == pyproject
    assert not (tmp_path / "home" / ".flwr" / "config.toml.bak").exists()


def test_writing_the_app_creates_no_flower_config(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("FLWR_HOME", raising=False)
    _app(tmp_path)
    assert not (tmp_path / "home").exists() or not any((tmp_path / "home").rglob("*"))
    assert os.environ["HOME"] == str(tmp_path / "home")


def test_flower_local_refuses_a_taken_run_directory_before_starting_anything(tmp_path, capsys):
    from fedshift.core.config import load_config
    from fedshift.runtime.rundir.results import planned_dirs

    cfg = apps.resolve(load_config(None, [*TOY, "train.rounds=1"]))
    [planned] = planned_dirs([cfg], tmp_path / "out")
    planned.mkdir(parents=True)
    (planned / "config.yaml").write_text(yaml.safe_dump(cfg.to_dict()))
    t0 = time.monotonic()
    argv = ["flower", "local", *TOY, "train.rounds=1", "--out", str(tmp_path / "out")]
    assert cli(argv) == 2
    assert time.monotonic() - t0 < 10  # no SuperLink was started
    err = capsys.readouterr().err
    assert "holds a run started but not checkpointed yet" in err
    assert "fedshift flower local --resume" in err and "with --new" in err
    assert cli([*argv, "--resume", str(planned), "--new"]) == 2
    assert "drop -c, key=value, --out, --new and --overwrite" in capsys.readouterr().err
