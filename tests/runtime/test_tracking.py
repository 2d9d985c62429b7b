"""Issue 17, tracking and provenance: ``run.log`` in every run directory, the run directory
printed at the start, ``summary.json["provenance"]``, ``metrics.csv`` always and TensorBoard
on request (``track=[tensorboard]``), both resume-safe."""

from __future__ import annotations

import csv
import importlib.util
import json
import logging
import re
import subprocess
from datetime import datetime
from pathlib import Path

import pytest
import torch
from conftest import RESULT_KEYS, metric_rows, toy_cfg
from support.same_run import assert_same_run, kill_and_resume

from fedshift.bench import config_digest
from fedshift.cli import main
from fedshift.core.errors import ConfigError
from fedshift.core.logs import LOGGER, ConsoleHandler
from fedshift.runtime.simulation import run_experiment
from fedshift.runtime.tracking import trackers as track

STAMP = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ"
pytestmark = pytest.mark.usefixtures("one_thread")  # runs compared bit for bit


@pytest.fixture
def fedshift_logger():
    """The ``fedshift`` logger without a console (an earlier CLI test may have added one),
    restored as the test found it afterwards."""
    logger = logging.getLogger(LOGGER)
    handlers, level = list(logger.handlers), logger.level
    for h in handlers:
        if isinstance(h, ConsoleHandler):
            logger.removeHandler(h)
    yield logger
    for h in logger.handlers[:]:
        logger.removeHandler(h)
    for h in handlers:
        logger.addHandler(h)
    logger.setLevel(level)


def csv_rows(run_dir: Path) -> list[dict]:
    with open(run_dir / "metrics.csv", newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def as_csv(run_dir: Path) -> list[dict]:
    """``metrics.jsonl`` as ``metrics.csv`` must hold it: flattened, every column filled."""
    rows = [track.flatten_row(r) for r in metric_rows(run_dir)]
    columns = {"round": None, "client": None} | {k: None for r in rows for k in r}

    def cell(v: object) -> str:
        return "" if v is None else v if isinstance(v, str) else json.dumps(v)

    return [{c: cell(r.get(c)) for c in columns} for r in rows]


# ---------------------------------------------------------------------------- run.log
def test_run_log_holds_the_round_lines(tmp_path, fedshift_logger):
    """A run left no trace of its progress: run.log with timestamped round lines, appended
    to on resume."""
    cfg = toy_cfg("algorithm.name=fedavg", "checkpoint.every=1", rounds=3)
    run_dir = tmp_path / "run"
    kill_and_resume(cfg, run_dir, stop_after=2)
    lines = (run_dir / "run.log").read_text().splitlines()
    assert all(re.match(STAMP + r" (INFO|WARNING|ERROR) +fedshift\.", x) for x in lines), lines
    text = "\n".join(lines)
    assert text.count(f"run directory {run_dir.resolve()}") == 2  # the run and its resume
    for rnd in (1, 2, 3):
        assert re.search(rf"round {rnd}/3: 3 replies, train loss [0-9.]+, val acc", text)
    assert "resuming after round 2" in text and "stopped after round 2" in text
    assert text.rstrip().splitlines()[-1].split(": ", 1)[1].startswith("done: accuracy")


def test_cli_prints_the_run_directory_at_the_start(tmp_path, capsys, fedshift_logger):
    """`fedshift run` named its run directory only after the run had finished."""
    args = ["dataset.name=toyshift", "model.name=lenet5", "train.rounds=1", "name=t"]
    assert main(["run", *args, "--out", str(tmp_path), "--quiet"]) == 0
    out = capsys.readouterr().out.splitlines()
    [run_dir] = (p.resolve() for p in (tmp_path / "t").iterdir())
    assert out[0] == f"fedshift: run directory {run_dir}"
    assert not [x for x in out if "round 1/1" in x]  # round lines go to run.log only
    assert "round 1/1" in (run_dir / "run.log").read_text()


# ---------------------------------------------------------------------------- provenance
def test_summary_records_provenance(tmp_path):
    """summary.json did not say which code, versions, command and host produced a run."""
    cfg = toy_cfg("algorithm.name=fedavg", rounds=1)
    summary = run_experiment(cfg, run_dir=tmp_path / "run", progress=False).summary
    prov = json.loads((tmp_path / "run/summary.json").read_text())["provenance"]
    assert prov == summary["provenance"]
    keys = {"fedshift", "torch", "numpy", "flwr", "python", "platform", "git", "command"}
    assert keys | {"host", "start", "end", "resumed_from"} <= set(prov)
    assert prov["torch"] == str(torch.__version__) and prov["fedshift"]
    assert isinstance(prov["command"], list) and prov["host"]
    start, end = (datetime.fromisoformat(prov[k]) for k in ("start", "end"))
    assert start.utcoffset().total_seconds() == 0 and start <= end
    git = prov["git"]
    assert git is None or (re.fullmatch("[0-9a-f]{40}", git["commit"]) and "dirty" in git)
    # not a result: tests' comparisons and suite digests ignore it
    assert "provenance" not in RESULT_KEYS


def test_git_state_of_a_checkout(tmp_path):
    """The git commit (and whether tracked files changed) of the source, None outside git."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("x = 1\n")
    assert track.git_state(pkg) is None  # not a git checkout
    git = ["git", "-C", str(pkg), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    assert track.git_state(pkg) is None  # the package is not tracked
    subprocess.run([*git, "add", "__init__.py"], check=True)
    subprocess.run([*git, "commit", "-qm", "c"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    assert track.git_state(pkg) == {"commit": head.strip(), "dirty": False}
    (pkg / "notes.txt").write_text("untracked files do not count\n")
    assert track.git_state(pkg)["dirty"] is False
    (pkg / "__init__.py").write_text("x = 2\n")
    assert track.git_state(pkg)["dirty"] is True


def test_provenance_asks_git_once_per_process(monkeypatch):
    """Every run's provenance ran three git processes (~40 ms of CPU each run, the engine
    benchmark's largest per-run cost after the plot): the source's state is the process's."""
    forget = getattr(track, "_source_git_state", None)
    forget = forget.cache_clear if forget is not None else lambda: None
    forget()
    calls = []
    real = subprocess.run

    def counting(args, *a, **k):
        calls.append(args)
        return real(args, *a, **k)

    monkeypatch.setattr(track.subprocess, "run", counting)
    first = track.provenance(track.utc_now())["git"]
    asked = len(calls)
    assert asked >= 1  # ls-files (and rev-parse, status in a checkout)
    second = track.provenance(track.utc_now())
    assert len(calls) == asked and second["git"] == first
    if first is not None:  # a copy each time: a caller's change stays its own
        second["git"]["dirty"] = "changed"
        assert track.provenance(track.utc_now())["git"] == first
    forget()


# ---------------------------------------------------------------------------- metrics.csv
def test_metrics_csv_matches_metrics_jsonl(tmp_path):
    """Only metrics.jsonl held the metric rows: metrics.csv, the same rows flattened, kept
    exact through a resume (rewritten from the checkpoint's rows, no duplicates)."""
    over = ["algorithm.name=fedbn", "eval.every=2", "checkpoint.every=2"]
    # killed after round 3 (the checkpoint is from round 2): the same metrics.csv
    runs = assert_same_run(toy_cfg(*over, rounds=5), tmp_path, stop_after=3,
                           files=["metrics.csv"])  # fmt: skip
    full = runs.dir("native")
    assert csv_rows(full) == as_csv(full)
    assert list(csv_rows(full)[0])[:2] == ["round", "client"]
    assert {r["round"] for r in csv_rows(full)} == {"2", "4", "5"}


def test_track_key_changes_no_digest():
    """Trackers change no number: a suite cell's digest ignores ``track``."""
    plain = toy_cfg("algorithm.name=fedavg")
    assert config_digest(toy_cfg("algorithm.name=fedavg", "track=[]")) == config_digest(plain)
    with pytest.raises(ConfigError, match="track"):
        toy_cfg("track=[nosuchtracker]")


# ---------------------------------------------------------------------------- TensorBoard
def test_tensorboard_missing_package_names_the_install(tmp_path, monkeypatch):
    """track=[tensorboard] without the package: a ConfigError naming the extra to install."""
    cfg = toy_cfg("track=[tensorboard]", rounds=1)
    real = importlib.util.find_spec

    def find_spec(name, *args, **kwargs):
        return None if name == "tensorboard" else real(name, *args, **kwargs)

    monkeypatch.setattr(track.importlib.util, "find_spec", find_spec)
    with pytest.raises(ConfigError, match=r"'track'.*pip install 'fedshift\[tensorboard\]'"):
        run_experiment(cfg, run_dir=tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists() or not any((tmp_path / "run").iterdir())


def test_tensorboard_event_file_read_back(tmp_path):
    """track=[tensorboard] wrote nothing: per-round scalars read back with tensorboard's
    EventAccumulator, each round once after a resume (purge_step)."""
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    over = ["algorithm.name=fedavg", "track=[tensorboard]", "checkpoint.every=2"]
    cfg = toy_cfg(*over, rounds=4)
    run_dir = tmp_path / "run"
    kill_and_resume(cfg, run_dir, stop_after=3)  # rounds 1-3 logged, the checkpoint has 1-2
    acc = EventAccumulator(str(run_dir / "tensorboard"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    clients = sorted({r["client"] for r in metric_rows(run_dir)})
    want = {"train_loss/mean", "bytes/up", "bytes/down", "global/val_acc/mean"}
    want |= {f"global/test_acc/{c}" for c in clients} | {f"train_loss/{c}" for c in clients}
    assert want <= tags, sorted(tags)
    rows = metric_rows(run_dir)
    ledger = json.loads((run_dir / "ledger.json").read_text())
    for tag in ("train_loss/mean", "global/val_acc/mean", "bytes/up"):
        assert [e.step for e in acc.Scalars(tag)] == [1, 2, 3, 4], tag  # each round once
    for e in acc.Scalars("train_loss/mean"):
        losses = [r["train_loss"] for r in rows if r["round"] == e.step]
        assert e.value == pytest.approx(sum(losses) / len(losses), rel=1e-6)
    for e in acc.Scalars(f"global/test_acc/{clients[0]}"):
        (row,) = [r for r in rows if r["round"] == e.step and r["client"] == clients[0]]
        assert e.value == pytest.approx(row["global"]["test_acc"], rel=1e-6)
    for e in acc.Scalars("bytes/up"):
        assert e.value == ledger["by_round"][str(e.step)]["up"]


def test_console_handler_shows_only_what_is_meant_for_the_terminal(capsys, fedshift_logger):
    """Round lines under a progress bar stayed off the terminal; warnings and flagged lines
    show as `fedshift: ...`."""
    fedshift_logger.addHandler(ConsoleHandler())
    fedshift_logger.setLevel(logging.INFO)
    log = logging.getLogger("fedshift.test")
    log.info("round 1/2: quiet")
    log.info("run directory X", extra={"console": True})
    log.warning("lost client2")
    log.error("failed, reported elsewhere", extra={"console": False})
    captured = capsys.readouterr()
    assert captured.out == "fedshift: run directory X\n"
    assert captured.err == "fedshift: warning: lost client2\n"


def test_the_trackers_are_a_registry_whose_unknown_name_is_one_line_naming_the_key():
    from fedshift.runtime.tracking.registry import TRACKERS, check_trackers

    assert TRACKERS.names() == ["mlflow", "tensorboard", "wandb"]
    assert TRACKERS.get("tensorboard") is track.TensorBoardTracker
    with pytest.raises(ConfigError) as e:
        check_trackers(["tensorbord"])  # a name the config schema would refuse, from code
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("config key 'track': unknown tracker 'tensorbord'")
    assert "did you mean 'tensorboard'" in msg and "mlflow, tensorboard, wandb" in msg
