"""Checkpoints and the other files a run reads back: nothing runs from a run directory
(``torch.load(weights_only=True)``, checksums, RNG state as plain data), a damaged checkpoint
is a clear error, an edited config.yaml is not silently resumed, a disk full during a
checkpoint write loses nothing, and a file whose content is wrong is one error naming it."""

from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import random
import shlex
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from conftest import toy_cfg
from support.same_run import assert_runs_equal

from fedshift.cli import main
from fedshift.core.errors import FedshiftError
from fedshift.core.seeding import rng_state, seed_global, set_rng_state
from fedshift.runtime.rundir.checkpoint_io import read_checkpoint, write_checkpoint
from fedshift.runtime.rundir.saved import read_selected
from fedshift.runtime.simulation import load_finished, run_experiment, saved_config
from fedshift.runtime.stopping import RunInterrupted

pytestmark = pytest.mark.usefixtures("one_thread")  # bit-for-bit comparisons

TOY = ["dataset.name=toyshift", "model.name=lenet5", "train.batch_size=16", "name=test"]


def cli(capsys, *argv: str) -> tuple[int, str]:
    """``fedshift ARGV`` in this process: (exit code, stderr)."""
    capsys.readouterr()
    code = main([*argv, "--quiet"])
    return code, capsys.readouterr().err


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A finished 3-round fedavg run (copied by each test that changes it)."""
    root = tmp_path_factory.mktemp("finished")
    run_experiment(toy_cfg("algorithm.name=fedavg", rounds=3), run_dir=root / "r", progress=False)
    return root / "r"


def copy_run(src: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(src, tmp_path / "run"))


# ---------------------------------------------------------- nothing runs from a run directory
class _System:
    """Unpickled, runs a shell command (what an attacker puts in a shared run directory)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {shlex.quote(str(self.marker))}",)


class _Exec:
    """Unpickled, runs Python code through ``builtins.exec``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return exec, (f"open({str(self.marker)!r}, 'w').close()",)


def _malicious(marker: Path, framed: bool) -> bytes:
    state = {"round": _System(marker), "server": _Exec(Path(f"{marker}-exec"))}
    buf = io.BytesIO()
    torch.save(state, buf)  # bare: what fedshift wrote before its checkpoints had a header
    payload = buf.getvalue()
    if not framed:
        return payload
    # the documented header (checkpoint_io) with the right length and SHA-256: an attacker
    # can compute both
    head = struct.pack("<IQ32s", 1, len(payload), hashlib.sha256(payload).digest())
    return b"FSHCKPT\n" + head + payload


@pytest.mark.parametrize("framed", [False, True], ids=["bare-pickle", "valid-header"])
def test_malicious_checkpoint_runs_nothing(finished, tmp_path, capsys, framed):
    """A checkpoint whose pickle runs a command (os.system, exec) in a finished run directory:
    --resume, load_finished and protocol cross-site refuse it and the command never runs."""
    run = copy_run(finished, tmp_path)
    marker = tmp_path / "MARKER"
    (run / "checkpoint.pt").write_bytes(_malicious(marker, framed))
    code, err = cli(capsys, "run", "--resume", str(run))
    assert code == 2 and err.startswith("fedshift: error:") and str(run / "checkpoint.pt") in err
    with pytest.raises(FedshiftError, match="checkpoint.pt"):
        load_finished(run)
    code, err = cli(capsys, "protocol", "cross-site", str(run), "--out", str(tmp_path / "cs"))
    assert code == 2 and err.startswith("fedshift: error:") and "checkpoint.pt" in err
    expected = "refused" if framed else "older fedshift"
    assert expected in err
    assert not marker.exists() and not Path(f"{marker}-exec").exists()


def test_malicious_selected_state_runs_nothing(finished, tmp_path):
    """The selected round's state (selected.pt) is read the same way: a malicious one runs
    nothing and is refused."""
    from fedshift.runtime.rundir.checkpoint_io import SELECTED
    from fedshift.runtime.rundir.saved import read_selected
    from fedshift.runtime.simulation import saved_config

    run = copy_run(finished, tmp_path)
    marker = tmp_path / "MARKER"
    (run / SELECTED).write_bytes(_malicious(marker, framed=True))
    with pytest.raises(FedshiftError, match="selected.pt"):
        read_selected(run, saved_config(run), run_key="")
    assert not marker.exists()


def test_flipped_byte_is_an_error_naming_the_file(finished, tmp_path, capsys):
    """One flipped bit in checkpoint.pt: a clear error naming the file, not garbage state."""
    run = copy_run(finished, tmp_path)
    path = run / "checkpoint.pt"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    code, err = cli(capsys, "run", "--resume", str(run))
    assert code == 2 and err.startswith("fedshift: error:")
    assert str(path) in err and "corrupted" in err and "fedshift run --overwrite -c" in err


def test_rng_state_is_plain_data_and_restores_exactly():
    """The global RNG state in a checkpoint loads with weights_only=True and restores torch's,
    numpy's and Python's generators exactly."""

    def draws() -> tuple:
        return torch.rand(3).tolist(), np.random.rand(3).tolist(), [random.random() for _ in "ab"]

    seed_global(7, "x")
    np.random.randn()  # numpy keeps a cached gaussian: it must survive too
    buf = io.BytesIO()
    torch.save({"rng": rng_state()}, buf)
    expected = draws()
    buf.seek(0)
    set_rng_state(torch.load(buf, weights_only=True)["rng"])
    assert draws() == expected


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_rng_state_restores_the_gpu_generators_too():
    """On a GPU the state holds CUDA's generators (FFA noise, FRAug's noise and dropout draw
    there) and restores them exactly, through ``weights_only=True``."""
    seed_global(7, "x")
    torch.randn(5, device="cuda")
    buf = io.BytesIO()
    torch.save({"rng": rng_state()}, buf)
    expected = torch.randn(5, device="cuda").tolist()
    buf.seek(0)
    set_rng_state(torch.load(buf, weights_only=True)["rng"])
    assert torch.randn(5, device="cuda").tolist() == expected


def test_cpu_rng_state_has_no_gpu_part():
    """A CPU run's state holds no CUDA generators (torch's CUDA is never initialised)."""
    if torch.cuda.is_initialized():
        pytest.skip("this process has used CUDA")
    assert "cuda" not in rng_state()


# every algorithm's checkpoint read back with torch.load(weights_only=True) only, resumed to
# the uninterrupted run: tests/runtime/test_same_run.py


def test_flower_snapshots_use_the_checksummed_format(tmp_path):
    """A Flower node's state snapshot is read like a checkpoint: a truncated one is an error
    naming the file, not a torch traceback."""
    from fedshift.flower.simulate import simulate

    cfg = toy_cfg("algorithm.name=fedbn", "checkpoint.every=1", rounds=2)
    with pytest.raises(RunInterrupted):
        simulate(cfg, run_dir=tmp_path / "f", engine="in-process", progress=False, stop_after=1)
    snaps = sorted((tmp_path / "f/flower-state").glob("*/client*/r1.pt"))
    assert snaps
    snaps[0].write_bytes(snaps[0].read_bytes()[:100])
    with pytest.raises(FedshiftError, match=f"{snaps[0]} is truncated"):
        simulate(cfg, run_dir=tmp_path / "f", engine="in-process", progress=False, resume=True)


# --------------------------------------------------------------------- an edited config.yaml
def _edit(run: Path, **changes) -> None:
    """Set dotted keys of ``run``'s config.yaml (what a user does in an editor)."""
    path = run / "config.yaml"
    raw = yaml.safe_load(path.read_text())
    for dotted, value in changes.items():
        node = raw
        *head, last = dotted.split("__")
        for k in head:
            node = node[k]
        node[last] = value
    path.write_text(yaml.safe_dump(raw, sort_keys=False))


EDITS = {
    "lr": ({"train__lr": 0.02}, ["train.lr: 0.01 -> 0.02"]),
    "seed+sizes": (
        {"seed": 1, "train__batch_size": 8},
        ["seed: 0 -> 1", "train.batch_size: 16 -> 8"],
    ),
    "algorithm": (
        {"algorithm": {"name": "fedprox"}},
        ["algorithm.name: 'fedavg' -> 'fedprox'", "algorithm.mu: (not set) -> 0.01"],
    ),
    "model": ({"model": {"name": "cnn"}}, ["model.name: 'lenet5' -> 'cnn'"]),
    "eval.every": ({"eval__every": 2}, ["eval.every: 1 -> 2"]),
}


@pytest.mark.parametrize("edit", list(EDITS))
def test_resume_refuses_an_edited_config(finished, tmp_path, capsys, edit):
    """config.yaml edited after the run started (lr, seed, sizes, algorithm, model, eval
    cadence): --resume, flower simulate --resume and load_finished refuse, naming each
    changed key with its old and new value; nothing is run or written."""
    run = copy_run(finished, tmp_path)
    changes, expected = EDITS[edit]
    _edit(run, **changes)
    before = (run / "metrics.jsonl").read_text(), (run / "summary.json").read_text()
    for argv in (("run", "--resume"), ("flower", "simulate", "--engine", "in-process", "--resume")):
        code, err = cli(capsys, *argv, str(run))
        assert code == 2 and err.startswith("fedshift: error:"), err
        assert str(run / "config.yaml") in err and "restore" in err
        for text in expected:
            assert text in err
    with pytest.raises(FedshiftError, match="differs from the config the run was started"):
        load_finished(run)
    assert ((run / "metrics.jsonl").read_text(), (run / "summary.json").read_text()) == before


def test_rounds_below_the_trained_rounds_is_refused(finished, tmp_path, capsys):
    """train.rounds lowered in config.yaml below the rounds trained: a clear error, not a
    summary with best_round past its last round."""
    run = copy_run(finished, tmp_path)
    _edit(run, train__rounds=2)
    code, err = cli(capsys, "run", "--resume", str(run))
    assert code == 2 and "already trained 3 rounds" in err and "train.rounds: 2" in err
    code, err = cli(capsys, "flower", "simulate", "--engine", "in-process", "--resume", str(run))
    assert code == 2 and "already trained 3 rounds" in err


def test_allowed_edits_resume_to_the_uninterrupted_run(tmp_path, capsys):
    """config.yaml edited with train.rounds up, checkpoint cadence and name: the run is
    extended and ends exactly as an uninterrupted run of the new rounds (the old last round,
    evaluated only because it was last, is not kept)."""
    over = ("algorithm.name=fedavg", "eval.every=2")
    full = run_experiment(toy_cfg(*over, rounds=4), run_dir=tmp_path / "full", progress=False)
    short = run_experiment(toy_cfg(*over, rounds=3), run_dir=tmp_path / "r", progress=False)
    _edit(short.run_dir, train__rounds=4, checkpoint__every=2, name="renamed")
    code, err = cli(capsys, "run", "--resume", str(short.run_dir))
    assert code == 0, err
    assert_runs_equal(short.run_dir, full.run_dir)
    resumed = load_finished(short.run_dir, weights="last")
    assert resumed.cfg.train.rounds == 4 and resumed.round == 4


def test_depends_on_rounds_algorithm_refuses_edited_rounds(tmp_path, capsys):
    """FRAug's schedule depends on the total rounds: more rounds in config.yaml is refused
    (the extended run would equal no run from the start)."""
    run = run_experiment(toy_cfg("algorithm.name=fraug", rounds=1), run_dir=tmp_path / "r",
                         progress=False).run_dir  # fmt: skip
    _edit(run, train__rounds=2)
    code, err = cli(capsys, "run", "--resume", str(run))
    assert code == 2 and "total rounds" in err


# -------------------------------------------------------- damaged and unwritable checkpoints
@pytest.mark.parametrize("cut", ["empty", "header", "payload"])
def test_truncated_or_empty_checkpoint_is_a_clear_error(finished, tmp_path, capsys, cut):
    """An empty or truncated checkpoint.pt: `fedshift: error:` naming the file and the fix."""
    run = copy_run(finished, tmp_path)
    path = run / "checkpoint.pt"
    data = path.read_bytes()
    path.write_bytes({"empty": b"", "header": data[:20], "payload": data[: len(data) // 2]}[cut])
    cross_site = ("protocol", "cross-site", str(run), "--out", str(tmp_path / "cs"))
    for argv in (("run", "--resume", str(run)), cross_site):
        code, err = cli(capsys, *argv)
        assert code == 2 and err.startswith("fedshift: error:"), err
        assert str(path) in err and ("empty" in err or "truncated" in err)
        assert "start the run again from its config: fedshift run --overwrite -c" in err


@pytest.mark.parametrize("where", ["write", "fsync"])
def test_disk_full_during_a_checkpoint_keeps_the_previous_one(tmp_path, capsys, monkeypatch, where):
    """ENOSPC while checkpoint.pt of round 3 is written (during the write, or when it is
    flushed to disk): `fedshift: error:` naming the file, the round still on disk and the
    fix; no .tmp left; the resumed run equals an uninterrupted one."""
    from fedshift.runtime.loop import RoundLoop

    over = [*TOY, "algorithm.name=fedavg", "checkpoint.every=1", "train.rounds=4"]
    full = run_experiment(toy_cfg(*over[4:], rounds=4), run_dir=tmp_path / "full", progress=False)
    real = torch.save, os.fsync, RoundLoop.save_checkpoint
    failing = []

    def save(obj, f, *args, **kwargs):
        if where == "write" and failing and isinstance(obj, dict) and "ledger" in obj:
            if hasattr(f, "write"):
                f.write(b"PK\x03")
            else:
                Path(f).write_bytes(b"PK\x03")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real[0](obj, f, *args, **kwargs)

    def fsync(fd):
        if where == "fsync" and failing:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real[1](fd)

    def save_checkpoint(self):
        if self.last_round == 3:
            failing.append(1)
        try:
            return real[2](self)
        finally:
            failing.clear()

    monkeypatch.setattr(torch, "save", save)
    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(RoundLoop, "save_checkpoint", save_checkpoint)
    code, err = cli(capsys, "run", *over, "--out", str(tmp_path / "out"))
    monkeypatch.undo()
    [run] = (tmp_path / "out/test").iterdir()
    assert code == 2 and err.startswith("fedshift: error:"), err
    assert f"could not write {run / 'checkpoint.pt'}" in err and "No space left" in err
    assert "still holds the state of round 2" in err and f"fedshift run --resume {run}" in err
    assert not list(run.glob("*.tmp"))
    code, err = cli(capsys, "run", "--resume", str(run))
    assert code == 0, err
    assert_runs_equal(run, full.run_dir)


# ---------------------------------------------------------------------------- content
# a file whose integrity checks pass but whose content is wrong (fields, round=-1), a
# selected.pt copied from another run, a foreign or hand-edited summary.json: each is one
# error naming the file and the field, before anything uses it
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
        (lambda s: s.update(test_mean=1e308), "test_mean"),
        (lambda s: s["val_per_client"].update(client0=-5.0), "val_per_client.client0"),
        (lambda s: s["test_per_client"].update(client1=5.0), "test_per_client.client1"),
        (lambda s: s["models"]["global"]["final"].update(test_mean=5.0),
         "models.global.final.test_mean"),
    ],
    ids=["missing", "text-round", "list-scores", "clients-text", "round-past", "1e308",
         "negative", "500%", "models-block"],
)  # fmt: skip
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


# ------------------------------------------------------- content against the run's model
# issue 48: a checkpoint whose header and fields pass but whose tensors do not fit the run's
# model (shape, dtype, a string, a key gone), whose RNG state has the wrong size, or whose
# rows belong to rounds it never ran: a traceback deep in torch, numpy or random, or rows of
# a future round merged into metrics.jsonl; now one line naming the file and the key
def _first(ck: dict) -> str:
    return next(iter(ck["server"]["weights"]))


def _set_weight(ck: dict, value) -> None:
    ck["server"]["weights"][_first(ck)] = value


def _weight(ck: dict) -> torch.Tensor:
    return ck["server"]["weights"][_first(ck)]


@pytest.mark.parametrize(
    "edit, key",
    [
        (lambda ck: _set_weight(ck, torch.zeros(3)), "server/weights/{w}"),
        (lambda ck: _set_weight(ck, _weight(ck).double()), "server/weights/{w}"),
        (lambda ck: _set_weight(ck, "not a tensor"), "server/weights/{w}"),
        (lambda ck: ck["server"]["weights"].pop(_first(ck)), "server/weights/{w}"),
        (lambda ck: ck["clients"].pop("client1"), "clients/client1"),
        (lambda ck: ck["clients"].update(stranger={}), "clients/stranger"),
        (lambda ck: ck["rng"].update(torch=ck["rng"]["torch"][:100]), "rng/torch"),
        (lambda ck: ck["rng"]["numpy"].update(keys=torch.zeros(9)), "rng/numpy/keys"),
        (lambda ck: ck["rng"]["numpy"].update(pos=10_000), "rng/numpy/pos"),
        (lambda ck: ck["rng"]["python"].update(internal=[1, 2, 3]), "rng/python/internal"),
        (lambda ck: ck["records"].append({**ck["records"][-1], "round": 9}), "records/{n}/round"),
        (lambda ck: ck["ledger"]["rows"].append((9, "client0", "up", "w", 1)), "ledger/rows/{r}"),
    ],
    ids=[
        "shape", "dtype", "string", "key-gone", "client-gone", "client-unknown", "rng-torch",
        "rng-numpy-keys", "rng-numpy-pos", "rng-python", "future-record", "future-ledger-row",
    ],
)  # fmt: skip
def test_checkpoint_not_of_this_run_is_one_error_naming_the_key(runs, tmp_path, capsys, edit, key):
    run_dir = _copy(runs, tmp_path)
    path = run_dir / "checkpoint.pt"
    ck = read_checkpoint(path)
    names = {"w": _first(ck), "n": len(ck["records"]), "r": len(ck["ledger"]["rows"])}
    metrics = (run_dir / "metrics.jsonl").read_text()
    edit(ck)
    write_checkpoint(ck, path)
    err = _resume_error(run_dir, capsys)
    assert f"{path}: key {key.format(**names)!r}" in err, err
    assert (run_dir / "metrics.jsonl").read_text() == metrics  # nothing merged or rewritten


def test_a_finished_run_with_a_foreign_state_is_refused_when_rebuilt(runs, tmp_path):
    """load_finished (the protocols, fedshift.load_run) checks the state it rebuilds too."""
    run_dir = _copy(runs, tmp_path)
    path = run_dir / "checkpoint.pt"
    ck = read_checkpoint(path)
    _set_weight(ck, torch.zeros(3))
    write_checkpoint(ck, path)
    with pytest.raises(FedshiftError, match=rf"checkpoint\.pt: key 'server/weights/{_first(ck)}'"):
        load_finished(run_dir, weights="last")
