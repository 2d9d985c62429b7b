"""Issue 15, items 1, 3 and 9 (checkpoints): nothing runs from a run directory, a damaged
checkpoint is a clear error, an edited config.yaml is not silently resumed, and a disk full
during a checkpoint write loses nothing."""

from __future__ import annotations

import errno
import hashlib
import io
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
from fedshift.runtime.simulation import (
    RunInterrupted,
    load_finished,
    run_experiment,
)

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


# ---------------------------------------------------------------------------- item 1
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
def test_item1_malicious_checkpoint_runs_nothing(finished, tmp_path, capsys, framed):
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


def test_item1_malicious_selected_state_runs_nothing(finished, tmp_path):
    """The selected round's state (selected.pt) is read the same way: a malicious one runs
    nothing and is refused."""
    from fedshift.runtime.saved import read_selected
    from fedshift.runtime.simulation import SELECTED, saved_config

    run = copy_run(finished, tmp_path)
    marker = tmp_path / "MARKER"
    (run / SELECTED).write_bytes(_malicious(marker, framed=True))
    with pytest.raises(FedshiftError, match="selected.pt"):
        read_selected(run, saved_config(run), run_key="")
    assert not marker.exists()


def test_item1_flipped_byte_is_an_error_naming_the_file(finished, tmp_path, capsys):
    """One flipped bit in checkpoint.pt: a clear error naming the file, not garbage state."""
    run = copy_run(finished, tmp_path)
    path = run / "checkpoint.pt"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    code, err = cli(capsys, "run", "--resume", str(run))
    assert code == 2 and err.startswith("fedshift: error:")
    assert str(path) in err and "corrupted" in err and "fedshift run --overwrite -c" in err


def test_item1_rng_state_is_plain_data_and_restores_exactly():
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
def test_item1_rng_state_restores_the_gpu_generators_too():
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


def test_item1_cpu_rng_state_has_no_gpu_part():
    """A CPU run's state holds no CUDA generators (torch's CUDA is never initialised)."""
    if torch.cuda.is_initialized():
        pytest.skip("this process has used CUDA")
    assert "cuda" not in rng_state()


# every algorithm's checkpoint read back with torch.load(weights_only=True) only, resumed to
# the uninterrupted run: tests/test_same_run.py


def test_item1_flower_snapshots_use_the_checksummed_format(tmp_path):
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


# ---------------------------------------------------------------------------- item 3
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
def test_item3_resume_refuses_an_edited_config(finished, tmp_path, capsys, edit):
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


def test_item3_rounds_below_the_trained_rounds_is_refused(finished, tmp_path, capsys):
    """train.rounds lowered in config.yaml below the rounds trained: a clear error, not a
    summary with best_round past its last round."""
    run = copy_run(finished, tmp_path)
    _edit(run, train__rounds=2)
    code, err = cli(capsys, "run", "--resume", str(run))
    assert code == 2 and "already trained 3 rounds" in err and "train.rounds: 2" in err
    code, err = cli(capsys, "flower", "simulate", "--engine", "in-process", "--resume", str(run))
    assert code == 2 and "already trained 3 rounds" in err


def test_item3_allowed_edits_resume_to_the_uninterrupted_run(tmp_path, capsys):
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


def test_item3_depends_on_rounds_algorithm_refuses_edited_rounds(tmp_path, capsys):
    """FRAug's schedule depends on the total rounds: more rounds in config.yaml is refused
    (the extended run would equal no run from the start)."""
    run = run_experiment(toy_cfg("algorithm.name=fraug", rounds=1), run_dir=tmp_path / "r",
                         progress=False).run_dir  # fmt: skip
    _edit(run, train__rounds=2)
    code, err = cli(capsys, "run", "--resume", str(run))
    assert code == 2 and "total rounds" in err


# ---------------------------------------------------------------------------- item 9
@pytest.mark.parametrize("cut", ["empty", "header", "payload"])
def test_item9_truncated_or_empty_checkpoint_is_a_clear_error(finished, tmp_path, capsys, cut):
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
def test_item9_disk_full_during_a_checkpoint_keeps_the_previous_one(
    tmp_path, capsys, monkeypatch, where
):
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
