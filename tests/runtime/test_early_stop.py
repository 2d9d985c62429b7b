"""Early stopping (``train.patience``, issue 50): where a run stops, and that the stopped run
is the fixed-length run up to its stop, resumed or extended alike."""

from __future__ import annotations

import json

import pytest
from conftest import toy_cfg
from support.same_run import assert_runs_equal

from fedshift.core.errors import ConfigError
from fedshift.eval.early_stop import patience_stop
from fedshift.eval.summary import read_metric_rows
from fedshift.runtime.simulation import resume_experiment, run_experiment
from fedshift.runtime.stopping import RunInterrupted

pytestmark = pytest.mark.usefixtures("one_thread")  # bit-for-bit comparisons


def _rows(curve: dict[int, float], holdout: float | None = None) -> list[dict]:
    """Metric rows of two clients scoring ``curve`` (and a held-out one scoring ``holdout``)."""
    rows = []
    for rnd, v in curve.items():
        for cid, dv in (("a", -0.1), ("b", 0.1)):
            rows.append({"round": rnd, "client": cid, "global": {"val_acc": v + dv}})
        if holdout is not None:
            rows.append({"round": rnd, "client": "h", "holdout": True,
                         "global": {"val_acc": holdout * rnd}})  # fmt: skip
    return rows


def test_patience_counts_scheduled_evaluations_since_the_best():
    curve = {1: 0.5, 2: 0.6, 3: 0.6, 4: 0.55, 5: 0.7, 6: 0.6, 7: 0.6}
    # a tie is no improvement (selection keeps the earlier round too): 2 is best at 3 and 4
    stop = patience_stop(_rows(curve), "global", "acc", every=1, patience=2)
    assert (stop.round, stop.best_round) == (4, 2)
    assert patience_stop(_rows(curve), "global", "acc", 1, patience=3) is None  # 5 improves
    # never before min_rounds: the first round at or after it where patience is spent
    stop = patience_stop(_rows(curve), "global", "acc", 1, patience=1, min_rounds=5)
    assert (stop.round, stop.best_round) == (6, 5)
    assert patience_stop(_rows(curve), "global", "acc", 1, patience=None) is None


def test_patience_reads_the_curve_model_selection_reads():
    curve = {2: 0.5, 4: 0.6, 5: 0.9, 6: 0.55, 8: 0.5}
    # round 5 (evaluated because it was a run's last) is not a scheduled evaluation
    stop = patience_stop(_rows(curve), "global", "acc", every=2, patience=2)
    assert (stop.round, stop.best_round) == (8, 4)
    # a held-out client's rising score does not count
    flat = {1: 0.5, 2: 0.5, 3: 0.5}
    stop = patience_stop(_rows(flat, holdout=0.3), "global", "acc", 1, patience=2)
    assert (stop.round, stop.best_round) == (3, 1)
    # another model kind's rows are not read
    assert patience_stop(_rows(flat), "personal", "acc", 1, patience=1) is None


def test_config_refuses_what_early_stopping_cannot_do():
    with pytest.raises(ConfigError, match="train.min_rounds.*train.patience"):
        toy_cfg("train.min_rounds=2")
    with pytest.raises(ConfigError, match=r"train.min_rounds.*exceeds train.rounds"):
        toy_cfg("train.patience=2", "train.min_rounds=9", rounds=4)
    with pytest.raises(ConfigError, match="train.patience"):
        toy_cfg("train.patience=0")


def _summary(run_dir) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


#: a learning rate so small that accuracy cannot move: the curve is flat, the best round is
#: the first and a patience of 2 stops the run at round 3 of 8
FLAT = ("algorithm.name=fedavg", "train.lr=1e-12", "train.patience=2")


def test_a_stopped_run_is_the_fixed_length_run_up_to_its_stop(tmp_path):
    """Same rows, selection and state as the run without patience, up to the stopping
    round; ``summary.json`` says where and why it stopped."""
    fixed = run_experiment(toy_cfg("algorithm.name=fedavg", "train.lr=1e-12", rounds=3),
                           run_dir=tmp_path / "fixed", progress=False)  # fmt: skip
    full = run_experiment(toy_cfg("algorithm.name=fedavg", "train.lr=1e-12", rounds=8),
                          run_dir=tmp_path / "full", progress=False)  # fmt: skip
    want = patience_stop(read_metric_rows(full.run_dir / "metrics.jsonl"), "global", "acc", 1, 2)
    assert want is not None and want.round == 3  # the flat curve stops it at 3
    stopped = run_experiment(toy_cfg(*FLAT, rounds=8), run_dir=tmp_path / "s", progress=False)
    s = stopped.summary
    assert (s["stopped_at"], s["stop_reason"], s["rounds"]) == (3, "patience", 8)
    assert full.summary["stop_reason"] == "rounds" and full.summary["stopped_at"] == 8
    assert_runs_equal(stopped.run_dir, fixed.run_dir, compare=("metrics", "ledger", "state"))
    assert s["best_round"] == fixed.summary["best_round"] == want.best_round
    assert s["test_mean"] == fixed.summary["test_mean"]
    assert "stopped early after round 3" in (stopped.run_dir / "run.log").read_text()


def test_resume_and_extend_respect_the_stop(tmp_path):
    """Interrupted before its stop and resumed, the run stops where the uninterrupted one
    did; a stopped run resumed, or extended to more rounds, trains no further."""
    ref = run_experiment(toy_cfg(*FLAT, rounds=8), run_dir=tmp_path / "ref", progress=False)
    cut = tmp_path / "cut"
    with pytest.raises(RunInterrupted):
        run_experiment(toy_cfg(*FLAT, "checkpoint.every=1", rounds=8), run_dir=cut,
                       progress=False, stop_after=2)  # fmt: skip
    resumed = resume_experiment(cut, progress=False)
    assert resumed.summary["stopped_at"] == ref.summary["stopped_at"] == 3
    assert_runs_equal(cut, ref.run_dir, compare=("metrics", "ledger", "state"))
    before = (ref.run_dir / "ledger.json").read_bytes()
    again = resume_experiment(ref.run_dir, progress=False)
    longer = resume_experiment(ref.run_dir, progress=False, rounds=20)
    assert again.summary["stopped_at"] == longer.summary["stopped_at"] == 3
    assert longer.summary["rounds"] == 20
    assert (ref.run_dir / "ledger.json").read_bytes() == before
