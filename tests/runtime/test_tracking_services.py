"""The Weights & Biases and MLflow trackers (``track=[wandb]``, ``track=[mlflow]``): what each
library's own reader finds equals ``metrics.jsonl`` / ``ledger.json``, every round once through
a kill and a resume, W&B offline unless ``WANDB_MODE`` says otherwise, MLflow in the run
directory whatever ``MLFLOW_TRACKING_URI`` says, a missing package named with its fix."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import metric_rows, toy_cfg
from support.same_run import kill_and_resume

from fedshift.core.errors import ConfigError
from fedshift.runtime.hooks import RoundRecord
from fedshift.runtime.simulation import run_experiment
from fedshift.runtime.tracking import services as track_services
from fedshift.runtime.tracking.services import MlflowTracker, WandbTracker

#: a run of 4 rounds, checkpointed every 2: killed after round 3, resumed from round 2
KILLED_AT_3 = ["algorithm.name=fedavg", "checkpoint.every=2"]


def expected(run_dir: Path) -> tuple[dict[int, dict[str, float]], list[str]]:
    """Per round, some of the scalars a tracker must hold, from ``metrics.jsonl`` and
    ``ledger.json``; and the tags every round has."""
    rows = metric_rows(run_dir)
    ledger = json.loads((run_dir / "ledger.json").read_text())
    clients = sorted({r["client"] for r in rows})
    out: dict[int, dict[str, float]] = {}
    for rnd in sorted({r["round"] for r in rows}):
        mine = [r for r in rows if r["round"] == rnd]
        losses = [r["train_loss"] for r in mine]
        out[rnd] = {
            "train_loss/mean": sum(losses) / len(losses),
            "bytes/up": ledger["by_round"][str(rnd)]["up"],
            "bytes/down": ledger["by_round"][str(rnd)]["down"],
        }
        for r in mine:
            out[rnd][f"global/test_acc/{r['client']}"] = r["global"]["test_acc"]
            out[rnd][f"train_loss/{r['client']}"] = r["train_loss"]
    tags = ["train_loss/mean", "bytes/up", "bytes/down", "global/val_acc/mean"]
    tags += [f"global/test_acc/{c}" for c in clients] + [f"train_loss/{c}" for c in clients]
    return out, tags


def assert_values(logged: dict[int, dict[str, float]], want: dict[int, dict[str, float]]):
    assert sorted(logged) == sorted(want)
    for rnd, values in want.items():
        for tag, value in values.items():
            assert logged[rnd][tag] == pytest.approx(value, rel=1e-12, abs=1e-12), (rnd, tag)


def record(rnd: int) -> RoundRecord:
    """A round as the loop hands it to trackers (two clients, not evaluated)."""
    return RoundRecord(rnd, {"a": 1.0 / rnd, "b": 2.0 / rnd}, None, 100 * rnd, 10 * rnd)


# ---------------------------------------------------------------------------- missing packages
@pytest.mark.parametrize("name", ["wandb", "mlflow"])
def test_missing_package_names_the_extra(tmp_path, monkeypatch, name):
    """track=[wandb] / track=[mlflow] without the package: a ConfigError before anything runs,
    naming pip install 'fedshift[<name>]'."""
    real = importlib.util.find_spec

    def find_spec(module, *args, **kwargs):
        return None if module == name else real(module, *args, **kwargs)

    monkeypatch.setattr(track_services.importlib.util, "find_spec", find_spec)
    cfg = toy_cfg(f"track=[{name}]", rounds=1)
    with pytest.raises(ConfigError, match=rf"'track'.*pip install 'fedshift\[{name}\]'"):
        run_experiment(cfg, run_dir=tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists() or not any((tmp_path / "run").iterdir())


def test_old_wandb_is_refused(monkeypatch):
    """A wandb older than 0.19.10 (no reinit="create_new": it would log into the caller's own
    W&B run) is a ConfigError naming the extra."""
    monkeypatch.setattr(track_services.importlib.util, "find_spec", lambda name: object())
    monkeypatch.setattr(track_services.importlib.metadata, "version", lambda name: "0.18.7")
    with pytest.raises(ConfigError, match=r"wandb 0\.18\.7 is older than 0\.19\.10.*fedshift\["):
        WandbTracker.check()


def test_trackers_import_nothing_until_a_run_opens_them():
    """`fedshift --help` stays instant: importing the CLI and the trackers imports neither
    wandb nor mlflow."""
    code = (
        "import sys, fedshift.cli, fedshift.runtime.tracking.services; "
        "print(sorted(m for m in ('wandb', 'mlflow') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# ---------------------------------------------------------------------------- MLflow
@pytest.fixture
def mlflow_store(monkeypatch):
    """A reader of a run directory's MLflow store (MlflowClient); MLflow's telemetry off, and
    ``MLFLOW_TRACKING_URI`` pointing at a closed local port: a tracker reading it fails."""
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")  # before mlflow is imported
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:9")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")
    for module in ("mlflow", "sqlalchemy", "alembic"):
        pytest.importorskip(module)
    from mlflow.tracking import MlflowClient

    def client(run_dir: Path):
        db = (run_dir / "mlflow" / "mlflow.db").resolve()
        assert db.is_file()
        return MlflowClient(tracking_uri=f"sqlite:///{db.as_posix()}")

    return client


def mlflow_history(client, run_id: str, tags: list[str]) -> dict[int, dict[str, float]]:
    out: dict[int, dict[str, float]] = {}
    for tag in tags:
        for m in client.get_metric_history(run_id, tag):
            assert tag not in out.setdefault(m.step, {}), f"{tag} twice at step {m.step}"
            out[m.step][tag] = m.value
    return out


def test_mlflow_run_read_back_every_round_once(tmp_path, mlflow_store):
    """track=[mlflow]: one MLflow run in <run>/mlflow/mlflow.db holding the per-round scalars
    (read back with MlflowClient), each round once after a kill and resume: rounds are logged
    when checkpointed, and the resume reopens the same run."""
    cfg = toy_cfg(*KILLED_AT_3, "track=[mlflow]", rounds=4)
    run_dir = tmp_path / "run"
    killed: dict = {}

    def at_stop(run_dir: Path) -> None:  # rounds 1-3 ran, the checkpoint holds 1-2
        client = mlflow_store(run_dir)
        run_id = killed["run_id"] = json.loads((run_dir / "mlflow/run.json").read_text())["run_id"]
        assert [m.step for m in client.get_metric_history(run_id, "bytes/up")] == [1, 2]
        assert client.get_run(run_id).info.status == "KILLED"

    kill_and_resume(cfg, run_dir, stop_after=3, at_stop=at_stop)
    client, run_id = mlflow_store(run_dir), killed["run_id"]
    state = json.loads((run_dir / "mlflow/run.json").read_text())
    assert state == {"run_id": run_id, "logged_through": 4, "missing": []}
    (experiment,) = [e for e in client.search_experiments() if e.name == "test"]
    assert [r.info.run_id for r in client.search_runs([experiment.experiment_id])] == [run_id]
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "run"
    assert run.data.params["train.rounds"] == "4"
    assert run.data.params["algorithm.name"] == "fedavg"
    assert run.data.tags["fedshift.run_dir"] == str(run_dir.resolve())
    want, tags = expected(run_dir)
    assert set(tags) <= set(run.data.metrics)
    logged = mlflow_history(client, run_id, tags)
    assert all(sorted(v) == sorted(tags) for v in logged.values())
    assert_values(logged, want)
    assert "mlflow: run" in (run_dir / "run.log").read_text()


def test_mlflow_rounds_lost_to_a_hard_kill_are_reported(tmp_path, mlflow_store, caplog):
    """A process killed between a checkpoint and its logging (nothing else can stop it
    there): the resume warns, run.json records the rounds as missing, none is logged twice."""
    config = {"name": "t", "train": {"rounds": 4}}
    first = MlflowTracker(tmp_path / "run", config)
    first.open(0, [], resumed=False)
    for rnd in (1, 2, 3):
        first.log_round(record(rnd))
        if rnd == 2:
            first.checkpointed(2)
    # killed outright after the checkpoint of round 3 was written: no log, no close
    second = MlflowTracker(tmp_path / "run", config)
    with caplog.at_level(logging.WARNING, logger="fedshift"):
        second.open(3, [], resumed=True)
    assert "rounds 3-3 may be missing from the mlflow run" in caplog.text
    second.log_round(record(4))
    second.checkpointed(4)
    second.close()
    state = json.loads((tmp_path / "run/mlflow/run.json").read_text())
    assert state == {"run_id": first.run_id, "logged_through": 4, "missing": [[3, 3]]}
    client = mlflow_store(tmp_path / "run")
    history = client.get_metric_history(first.run_id, "train_loss/a")
    assert [(m.step, m.value) for m in history] == [(1, 1.0), (2, 0.5), (4, 0.25)]
    assert client.get_run(first.run_id).info.status == "FINISHED"


# ---------------------------------------------------------------------------- W&B
@pytest.fixture
def wandb_env(tmp_path, monkeypatch):
    """W&B offline (WANDB_MODE), silent, no error reports, its per-user files (settings,
    cache, staging) in the test's folder; W&B's service stopped after the test (it reads
    those when it starts)."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_ERROR_REPORTING", "false")
    monkeypatch.delenv("WANDB_PROJECT", raising=False)
    for var in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "wandb-home" / var.lower()))
    wandb = pytest.importorskip("wandb")
    yield wandb
    wandb.teardown()


def wandb_records(path: Path) -> list[dict]:
    """The records of an offline run's ``.wandb`` file, read by W&B's own reader (``wandb
    leet inspect --json``: local, no login)."""
    (file,) = path.glob("*.wandb")
    cmd = [sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(file)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    if out.returncode != 0 and "No such command" in out.stderr:
        pytest.skip("this wandb has no `wandb leet inspect`")
    assert out.returncode == 0, out.stderr
    return [json.loads(line) for line in out.stdout.splitlines() if line.strip()]


def test_wandb_offline_run_read_back_every_round_once(tmp_path, wandb_env):
    """track=[wandb]: an offline W&B run in <run>/wandb, one segment per process under one run
    id, read back with W&B's own reader: the per-round scalars, each round once across the
    killed run's segment (rounds 1-2, the checkpointed ones) and its resume's (3-4)."""
    cfg = toy_cfg(*KILLED_AT_3, "track=[wandb]", rounds=4)
    run_dir = tmp_path / "run"
    kill_and_resume(cfg, run_dir, stop_after=3)  # rounds 1-3 ran, the checkpoint holds 1-2
    state = json.loads((run_dir / "wandb/run.json").read_text())
    assert state["logged_through"] == 4 and state["missing"] == []
    assert state["project"] == "test"
    assert [s["rounds"] for s in state["segments"]] == [[1, 2], [3, 4]]
    logged: dict[int, dict[str, float]] = {}
    steps, exits = [], []
    for segment in state["segments"]:
        records = wandb_records(run_dir / "wandb" / segment["dir"])
        (run,) = [r["run"] for r in records if r["type"] == "run"]
        assert run["run_id"] == state["run_id"] and run["display_name"] == "run"
        assert run["project"] == "test" and run["telemetry"]["feature"]["offline"]
        assert run["config"]["update"]["train"]["rounds"] == 4
        exits += [r["exit"]["exit_code"] for r in records if r["type"] == "exit"]
        for r in records:
            if r["type"] == "history":
                steps.append(r["history"]["step"]["num"])
                logged[steps[-1]] = r["history"]["item"]
    assert steps == [1, 2, 3, 4]  # each round once, in order
    assert exits == [1, 0]  # the killed process's segment ended failed, the resume's finished
    want, tags = expected(run_dir)
    assert all(set(tags) <= set(item) for item in logged.values())
    assert_values(logged, want)
    log_text = (run_dir / "run.log").read_text()
    assert "wandb: offline run" in log_text and "wandb sync" in log_text


def test_wandb_counts_a_segment_once_it_is_finished(tmp_path, wandb_env):
    """W&B completes its offline file when the run finishes: run.json advances then, not at
    the checkpoint, so a resume after a hard kill warns about the rounds that may be lost."""
    config = {"name": "t", "train": {"rounds": 2}}
    tracker = WandbTracker(tmp_path / "run", config)
    tracker.open(0, [], resumed=False)
    for rnd in (1, 2):
        tracker.log_round(record(rnd))
    tracker.checkpointed(2)
    state_file = tmp_path / "run/wandb/run.json"
    assert json.loads(state_file.read_text())["logged_through"] == 0
    tracker.close()
    state = json.loads(state_file.read_text())
    assert state["logged_through"] == 2 and [s["rounds"] for s in state["segments"]] == [[1, 2]]


def test_wandb_is_offline_unless_wandb_mode_is_set(tmp_path, wandb_env, monkeypatch):
    """Without WANDB_MODE the tracker asks wandb.init for offline mode (nothing goes to a
    server); with WANDB_MODE set, W&B follows it. wandb.init is replaced: nothing starts."""
    calls: list[dict] = []

    class Stop(Exception):
        pass

    def init(**kwargs):
        calls.append(kwargs)
        raise Stop

    monkeypatch.setattr(wandb_env, "init", init)
    monkeypatch.delenv("WANDB_MODE")
    tracker = WandbTracker(tmp_path / "run", {"name": "exp/1"})
    with pytest.raises(Stop):
        tracker.open(0, [], resumed=False)
    monkeypatch.setenv("WANDB_MODE", "disabled")
    with pytest.raises(Stop):
        tracker.open(0, [], resumed=False)
    assert [c["mode"] for c in calls] == ["offline", None]
    first = calls[0]
    assert first["dir"] == str(tmp_path / "run") and first["name"] == "run"
    assert first["project"] == "exp-1" and first["reinit"] == "create_new"
    assert first["settings"].console == "off" and first["settings"].x_disable_stats
    assert track_services.wandb_mode({}) == "offline"
    assert track_services.wandb_mode({"WANDB_MODE": "online"}) is None
