"""The round loop's hooks (runtime/hooks.py): the points a hook is called at, in order,
across a stop and a resume; the typed run record summary.json is written from; the
saved-run value a finished run is rebuilt as."""

from __future__ import annotations

import dataclasses
import json

import pytest
from conftest import metric_rows, toy_cfg
from support.same_run import assert_runs_equal

import fedshift
from fedshift.eval.summary import RunRecord, check_summary
from fedshift.runtime.hooks import Hook, RoundRecord
from fedshift.runtime.rundir.saved import SavedRun
from fedshift.runtime.simulation import Simulation, load_finished
from fedshift.runtime.stopping import RunInterrupted

OVER = ("algorithm.name=fedavg", "eval.every=2", "checkpoint.every=1")


class Recorder(Hook):
    """Every call, as (point, what it was given)."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.record: RunRecord | None = None

    def resume(self, state: dict) -> None:
        self.calls.append(("resume", state["round"], state["selected_round"]))

    def open(self, last_round: int, records: list[dict], resumed: bool) -> None:
        self.calls.append(("open", last_round, len(records), resumed))

    def evaluated(self, rnd: int, rows: list[dict]) -> None:
        self.calls.append(("evaluated", rnd, sorted({r["round"] for r in rows})))

    def log_round(self, record: RoundRecord) -> None:
        assert record.replies == 3 and set(record.train_loss) == {"client0", "client1", "client2"}
        assert record.bytes_up > 0 and record.bytes_down > 0 and record.kinds == ["global"]
        self.calls.append(("log_round", record.round, record.rows is not None))

    def checkpointed(self, rnd: int) -> None:
        self.calls.append(("checkpointed", rnd))

    def end(self, record: RunRecord) -> None:
        self.record = record
        self.calls.append(("end", record.config.train.rounds))

    def close(self) -> None:
        self.calls.append(("close",))


def test_a_hook_sees_every_point_in_order_across_a_stop_and_a_resume(tmp_path):
    cfg = toy_cfg(*OVER, rounds=3)
    first = Recorder()
    with pytest.raises(RunInterrupted):
        Simulation(cfg, tmp_path / "r", progress=False, hooks=[first]).run(stop_after=2)
    assert first.calls == [
        ("open", 0, 0, False),
        ("log_round", 1, False),
        ("checkpointed", 1),
        ("evaluated", 2, [2]),
        ("log_round", 2, True),
        ("checkpointed", 2),
        ("close",),
    ]
    second = Recorder()
    sim = Simulation(cfg, tmp_path / "r", progress=False, hooks=[second])
    result = sim.run(resume=True)
    rows = 3  # round 2's rows, one per client, from the checkpoint
    assert second.calls == [
        ("resume", 2, 2),
        ("open", 2, rows, True),
        ("evaluated", 3, [3]),
        ("log_round", 3, True),
        ("checkpointed", 3),
        ("end", 3),
        ("close",),
    ]
    # summary.json is the record's summary, and the record holds what the run wrote
    record = second.record
    assert record is not None
    written = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert written == json.loads(json.dumps(record.summary)) == result.summary
    check_summary(written, "summary.json")
    assert record.records == metric_rows(tmp_path / "r")
    assert record.run_dir == tmp_path / "r" and record.clients == ["client0", "client1", "client2"]
    assert written["bytes_up"] == record.ledger.total("up") > 0
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.wall_s = 0.0  # type: ignore[misc]
    # the run equals an uninterrupted one
    full = Simulation(cfg, tmp_path / "full", progress=False).run()
    assert_runs_equal(tmp_path / "r", full.run_dir)


def test_a_failing_hook_stops_the_run_and_every_opened_hook_closes(tmp_path):
    class Broken(Hook):
        def log_round(self, record: RoundRecord) -> None:
            raise OSError("disk full")

    seen = Recorder()
    sim = Simulation(toy_cfg(*OVER, rounds=2), tmp_path / "r", progress=False,
                     hooks=[seen, Broken()])  # fmt: skip
    with pytest.raises(OSError, match="disk full"):
        sim.run()
    assert seen.calls[-1] == ("close",) and ("end", 2) not in seen.calls


def test_a_finished_run_is_rebuilt_as_a_saved_run(tmp_path):
    """load_finished and the Python API's rebuild return the same frozen value: the state
    of the selected (or last) round, never a loop."""
    res = fedshift.run(toy_cfg(*OVER, rounds=4), out=tmp_path)
    saved = load_finished(res.run_dir)
    assert isinstance(saved, SavedRun) and isinstance(saved, fedshift.SavedRun)
    assert isinstance(res, fedshift.RunResult)
    assert saved.round == res.summary["best_round"] and saved.weights == "selected"
    last = fedshift.load_run(res.run_dir).rebuild(weights="last")
    assert isinstance(last, SavedRun) and last.round == 4
    with pytest.raises(dataclasses.FrozenInstanceError):
        saved.round = 1  # type: ignore[misc]
    assert not hasattr(saved, "run_round")  # nothing in it runs rounds
