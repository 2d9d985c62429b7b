"""Issue 28, item 4: loaded files are checked for content, not only integrity. A checkpoint
with a valid header but wrong fields, or ``round=-1``, a ``selected.pt`` copied from another
run, a foreign or hand-edited ``summary.json``: each is one error naming the file and the
field, before anything uses it (they were tracebacks, a silently wrong resume, an accepted
foreign state)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import toy_cfg

from fedshift.cli import main
from fedshift.core.errors import FedshiftError
from fedshift.runtime.checkpoint_io import read_checkpoint, write_checkpoint
from fedshift.runtime.saved import read_selected
from fedshift.runtime.simulation import run_experiment, saved_config

TOY = ["dataset.name=toyshift", "model.name=lenet5", "train.batch_size=16", "name=t"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    """Two finished runs of one config (two run ids), 3 rounds, checkpoint every round."""
    root = tmp_path_factory.mktemp("runs")
    cfg = toy_cfg("checkpoint.every=1", rounds=3)
    for name in ("a", "b"):
        run_experiment(cfg, run_dir=root / name, progress=False)
    return root


def _copy(runs: Path, tmp_path: Path, name: str = "a") -> Path:
    dst = tmp_path / name
    shutil.copytree(runs / name, dst)
    return dst


def _resume_error(run_dir: Path, capsys) -> str:
    assert main(["run", "--resume", str(run_dir), "train.rounds=4", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize(
    "edit, field",
    [
        (lambda ck: ck.pop("server"), "server"),
        (lambda ck: ck.update(round="2"), "round"),
        (lambda ck: ck.update(clients=[1, 2]), "clients"),
        (lambda ck: ck.update(records={"round": 1}), "records"),
        (lambda ck: ck.update(ledger={"rows": 5}), "ledger"),
        (lambda ck: ck.update(round=99), "round"),
    ],
    ids=["missing", "round-text", "clients-list", "records-dict", "ledger-rows", "round-past"],
)
def test_checkpoint_with_wrong_fields_is_one_error(runs, tmp_path, capsys, edit, field):
    """A checkpoint.pt with fedshift's header (a valid SHA-256: anyone can compute one) but
    wrong keys or types: a traceback before; now one error naming the file and the field."""
    run_dir = _copy(runs, tmp_path)
    ck = read_checkpoint(run_dir / "checkpoint.pt")
    edit(ck)
    write_checkpoint(ck, run_dir / "checkpoint.pt")
    err = _resume_error(run_dir, capsys)
    assert f"{run_dir / 'checkpoint.pt'}: field {field!r}" in err


def test_checkpoint_with_round_minus_one_is_refused(runs, tmp_path, capsys):
    """round=-1 resumed into a silently wrong run (rounds 0.. trained again on top of the
    saved state); now it is refused."""
    run_dir = _copy(runs, tmp_path)
    ck = read_checkpoint(run_dir / "checkpoint.pt")
    ck["round"] = -1
    write_checkpoint(ck, run_dir / "checkpoint.pt")
    err = _resume_error(run_dir, capsys)
    assert "field 'round' must be a whole number >= 0, got -1" in err
    assert json.loads((run_dir / "summary.json").read_text())["rounds"] == 3  # untouched


def test_selected_state_copied_from_another_run_is_refused(runs, tmp_path):
    """A selected.pt copied in from another run (here: another run of the same config) was
    loaded as this run's selected model; now it is tied to its run by the run's id and
    config digest."""
    run_dir = _copy(runs, tmp_path)
    shutil.copy(runs / "b" / "selected.pt", run_dir / "selected.pt")
    cfg, key = saved_config(run_dir), read_checkpoint(run_dir / "checkpoint.pt")["run_key"]
    with pytest.raises(FedshiftError, match="belongs to another run"):
        read_selected(run_dir, cfg, key)
    # its own selected.pt loads
    shutil.copy(runs / "a" / "selected.pt", run_dir / "selected.pt")
    assert read_selected(run_dir, cfg, key)["round"] >= 1


@pytest.mark.parametrize(
    "edit, field",
    [
        (lambda s: s.pop("test_mean"), "test_mean"),
        (lambda s: s.update(best_round="three"), "best_round"),
        (lambda s: s.update(test_per_client=[0.5]), "test_per_client"),
        (lambda s: s.update(clients="client0"), "clients"),
        (lambda s: s.update(best_round=40), "best_round"),
    ],
    ids=["missing", "text-round", "list-scores", "clients-text", "round-past"],
)
def test_hand_edited_summary_is_one_error_in_report_and_cross_site(
    runs, tmp_path, capsys, edit, field
):
    """A foreign or hand-edited summary.json crashed `fedshift report` and `fedshift protocol
    cross-site` with tracebacks; now each names the file and the field."""
    run_dir = _copy(runs, tmp_path)
    path = run_dir / "summary.json"
    s = json.loads(path.read_text())
    edit(s)
    path.write_text(json.dumps(s))
    want = f"{path}: field {field!r}"
    for argv in (
        ["report", str(run_dir), "--out", str(tmp_path / "rep")],
        ["protocol", "cross-site", str(run_dir), "--out", str(tmp_path / "cs"), "--quiet"],
    ):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert want in err and err.count("\n") == 1, err
