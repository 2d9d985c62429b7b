"""Errors a user can act on, not tracebacks: one line naming the file or key and the fix.
Plug-ins that break the contract (a wrong signature, Params not a dataclass, a hook
returning None, a model with the wrong output width); memory exhaustion from
``dataset.train_size`` / ``model.width`` (an estimate before anything is built);
``train.lr=1e300`` (float32's range); a zero-byte ``model.weights``; a bad digits
``manifest.json``; CSV cells a spreadsheet would run; an ``out:`` key inside a config file;
messages that gave the wrong fix; OS errors at the command line (``--out`` a file or
read-only, a disk full, a permission error) and a decompression-bomb image."""

from __future__ import annotations

import csv
import errno
import json
import os
import shutil
import struct
import subprocess
import sys
import textwrap
import zlib
from pathlib import Path

import pytest
import torch
import yaml
from conftest import toy_cfg

from fedshift.algorithms import ALGORITHMS
from fedshift.augment import AUGMENTS
from fedshift.cli import describe_os_error, main
from fedshift.core.errors import DataError
from fedshift.models import MODELS
from fedshift.runtime.rundir.checkpoint_io import read_checkpoint, write_checkpoint
from fedshift.runtime.simulation import run_experiment

TOY = ["dataset.name=toyshift", "model.name=lenet5", "train.batch_size=16", "name=t",
       "train.rounds=1"]  # fmt: skip


@pytest.fixture
def plugin_dir(tmp_path, monkeypatch):
    """A folder on Python's path for plug-in modules; registries and modules restored."""
    folder = tmp_path / "plugins"
    folder.mkdir()
    monkeypatch.syspath_prepend(str(folder))
    for reg in (ALGORITHMS, AUGMENTS, MODELS):
        monkeypatch.setattr(reg, "_entries", dict(reg._entries))
    before = set(sys.modules)
    yield folder
    for name in set(sys.modules) - before:
        if name.startswith("fsbroken"):
            del sys.modules[name]


BROKEN = {
    "signature": (
        """
        from fedshift.algorithms.fedavg import FedAvg
        class Algo(FedAvg):
            def local_update(self, ctx, down):  # the client state is missing
                return super().local_update(ctx, down, {})
        """,
        "algorithm.name=fsbroken_signature:Algo",
        "local_update(self, ctx, down) cannot take the arguments fedshift passes",
    ),
    "params": (
        """
        from fedshift.algorithms.fedavg import FedAvg
        class Params:
            mu = 0.1
        class Algo(FedAvg):
            Params = Params
        """,
        "algorithm.name=fsbroken_params:Algo",
        "its Params (Params) must be a @dataclass",
    ),
    "loss-none": (
        """
        from fedshift.algorithms.fedavg import FedAvg
        class Algo(FedAvg):
            def loss(self, ctx, x, y):
                super().loss(ctx, x, y)  # forgot the return
        """,
        "algorithm.name=fsbroken_loss:Algo",
        "fsbroken_loss:Algo.loss returned None, but fedshift needs a scalar tensor",
    ),
    "init-client-none": (
        """
        from fedshift.algorithms.fedavg import FedAvg
        class Algo(FedAvg):
            def init_client(self, cid, data, model):
                pass
        """,
        "algorithm.name=fsbroken_init:Algo",
        "fsbroken_init:Algo.init_client returned None, but fedshift needs a dict",
    ),
    "augment-none": (
        """
        from fedshift.augment.base import Augment
        class Aug(Augment):
            def train_batch(self, x, y, state, generator):
                x.mul_(1.0)  # forgot the return
        """,
        "augment=[fsbroken_aug:Aug]",
        "fsbroken_aug:Aug.train_batch returned None, but fedshift needs a tuple (x, y)",
    ),
    "model-width": (
        """
        from torch import nn
        from fedshift.models.digits import SmallCNN
        class Net(SmallCNN):
            def __init__(self, num_classes=10, in_channels=3):
                super().__init__(num_classes + 2, in_channels)  # two logits too many
        """,
        "model.name=fsbroken_model:Net",
        "its output for 2 images has shape (2, 12), but fedshift needs (2, 10)",
    ),
}


@pytest.mark.parametrize("case", list(BROKEN))
def test_plugins_that_break_the_contract_are_one_error(plugin_dir, tmp_path, capsys, case):
    """Each was a traceback from deep inside a round (or, for the model two logits too wide,
    a run that trained and reported silently); now one error naming the class and member."""
    source, override, want = BROKEN[case]
    module = override.split("=", 1)[1].strip("[]").split(":")[0]
    (plugin_dir / f"{module}.py").write_text(textwrap.dedent(source))
    code = main(["run", *TOY, override, "--out", str(tmp_path / "runs"), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert want in err and err.count("\n") == 1, err


@pytest.mark.parametrize(
    "over, want",
    [
        (["dataset.train_size=1000000000000"], "dataset.train_size=1000000000000"),
        (["model.name=cnn", "model.width=1000000"], "model.width=1000000"),
    ],
    ids=["data", "model"],
)
def test_runs_that_cannot_fit_in_memory_are_refused_with_the_estimate(tmp_path, capsys, over, want):
    """dataset.train_size / model.width far beyond the memory: a MemoryError traceback (or
    the OOM killer) before; now refused before anything is built, with the estimate."""
    code = main(["run", *TOY, *over, "--out", str(tmp_path / "runs"), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert want in err and "needs about" in err and ("TB of memory" in err or "PB of memory" in err)
    assert "available" in err and err.count("\n") == 1, err


def test_float_keys_must_fit_float32(tmp_path, capsys):
    """train.lr=1e300 trained in float32 as inf and stopped on NaN weights with "Lower
    train.lr"; now refused at config time, naming float32's range."""
    code = main(["run", *TOY, "train.lr=1e300", "--out", str(tmp_path / "runs"), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and "'train.lr' = '1e300' overflows float32" in err, err
    assert not (tmp_path / "runs").exists()


def test_zero_byte_model_weights_is_one_error(tmp_path, capsys):
    empty = tmp_path / "weights.pt"
    empty.write_bytes(b"")
    code = main(["run", *TOY, f"model.weights={empty}", "--out", str(tmp_path / "r"), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and f"{empty} is empty (0 bytes" in err and err.count("\n") == 1, err


@pytest.mark.parametrize(
    "domains, want",
    [
        ({"mnist": 5}, "domains.mnist must be a mapping"),
        ({"mnist": {"count": 1, "files": [], "sources": {}}}, "domains.mnist.files"),
        ({"nope": {}}, "domains.nope: not a digits domain"),
    ],
)
def test_bad_digits_manifest_is_one_error(tmp_path, monkeypatch, capsys, domains, want):
    """A digits cache whose manifest.json has a wrong entry gave a TypeError /
    AttributeError traceback while loading; now one error naming the file and the fix."""
    from fedshift.data.digits import benchmark

    monkeypatch.setenv("FEDSHIFT_CACHE", str(tmp_path / "cache"))
    folder = benchmark.pool_dir(benchmark.DigitsParams(domains=["mnist"]))
    folder.mkdir(parents=True)
    for name in benchmark._pool_files("mnist"):
        (folder / name).write_bytes(b"x")  # present, so nothing is rebuilt
    manifest = benchmark._new_manifest(benchmark.DigitsParams())
    manifest["domains"] = domains
    (folder / "manifest.json").write_text(json.dumps(manifest))
    argv = ["run", "dataset.name=digits", "dataset.domains=[mnist]", "train.rounds=1",
            "--out", str(tmp_path / "runs"), "--quiet"]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"{folder / 'manifest.json'} is unreadable" in err and want in err, err
    assert "fedshift data build digits" in err and err.count("\n") == 1


def test_csv_cells_are_escaped_against_formulas(tmp_path):
    """report.csv and metrics.csv wrote cells starting with =, +, -, @ as they are, so a
    spreadsheet ran them; now such text gets a leading apostrophe; numbers stay numbers."""
    from fedshift.runtime.tracking.trackers import CsvTracker

    evil = ['=HYPERLINK("http://x","a")', "+1+1", "@SUM(A1)", "-2+3"]
    tracker = CsvTracker(tmp_path)
    rows = [{"round": 1, "client": c, "global": {"test_acc": -0.5}} for c in [*evil, "-0.25"]]
    tracker.open(0, rows, False)
    table = list(csv.DictReader((tmp_path / "metrics.csv").open()))
    assert [r["client"] for r in table] == [f"'{c}" for c in evil] + ["-0.25"]
    assert {r["global.test_acc"] for r in table} == {"-0.5"}
    # report.csv: a client named like a formula (a run directory received from elsewhere)
    run = run_experiment(toy_cfg(rounds=1), run_dir=tmp_path / "runs" / "r", progress=False)
    path = run.run_dir / "summary.json"
    s = json.loads(path.read_text())
    names = dict(zip(s["clients"], evil, strict=False))
    s["clients"] = [names[c] for c in s["clients"]]
    for key in ("test_per_client", "val_per_client"):
        s[key] = {names[c]: v for c, v in s[key].items()}
    path.write_text(json.dumps(s))
    assert main(["report", str(tmp_path / "runs"), "--out", str(tmp_path / "rep")]) == 0
    cells = [row for row in csv.reader((tmp_path / "rep" / "report.csv").open())]
    header = cells[0]
    clients = [r[header.index("client")] for r in cells[1:]]
    assert clients[:3] == [f"'{c}" for c in evil[:3]] and clients[3] == "mean"
    assert not any(c.startswith(("=", "+", "@")) for row in cells for c in row)
    assert float(cells[1][header.index("test")]) == pytest.approx(s["test_per_client"][evil[0]])


def test_out_key_in_a_config_file_is_printed_at_start(tmp_path, capsys):
    """An `out:` inside a config file sent the runs anywhere without a word."""
    cfg = tmp_path / "c.yaml"
    elsewhere = tmp_path / "elsewhere"
    cfg.write_text(yaml.safe_dump({"dataset": {"name": "toyshift"}, "model": {"name": "lenet5"},
                                   "train": {"rounds": 1, "batch_size": 16}, "name": "o",
                                   "out": str(elsewhere)}))  # fmt: skip
    assert main(["run", "-c", str(cfg), "--quiet"]) == 0
    err = capsys.readouterr().err
    assert f"run directories go under {elsewhere}" in err and "key 'out' in" in err
    assert (elsewhere / "o").is_dir()
    assert main(["run", "-c", str(cfg), "--quiet", "--out", str(tmp_path / "mine")]) == 0
    assert "go under" not in capsys.readouterr().err  # chosen on the command line: no notice


def test_read_only_cache_and_foreign_nan_weights_get_the_right_fix(tmp_path, monkeypatch, capsys):
    """A read-only data cache was told to choose another --out (which changes nothing); NaN
    weights from a model.weights file or an edited checkpoint were told to lower train.lr."""
    monkeypatch.setenv("FEDSHIFT_CACHE", str(tmp_path / "cache"))
    target = tmp_path / "cache" / "digits" / "v1-seed0" / "mnist_x.npy"
    msg = describe_os_error(PermissionError(errno.EACCES, "Permission denied", str(target)))
    assert "FEDSHIFT_CACHE" in msg and "--out" not in msg
    msg = describe_os_error(PermissionError(errno.EACCES, "Permission denied", "runs/x/y"))
    assert "--out" in msg  # a run's own folder: --out is the fix there
    # NaN weights from a file
    from fedshift.models.digits import LeNet5

    state = LeNet5().state_dict()
    state["classifier.weight"][0, 0] = float("nan")
    weights = tmp_path / "w.pt"
    torch.save(state, weights)
    code = main(["run", *TOY, f"model.weights={weights}", "--out", str(tmp_path / "r"), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and "holds NaN or inf in classifier.weight" in err and "train.lr" not in err
    # NaN in a checkpoint's server state (edited or damaged): named, not blamed on train.lr
    run = run_experiment(toy_cfg("checkpoint.every=1", rounds=2), run_dir=tmp_path / "k",
                         progress=False)  # fmt: skip
    ck = read_checkpoint(run.run_dir / "checkpoint.pt")
    tensor = next(t for t in ck["server"]["weights"].values() if t.is_floating_point())
    tensor.view(-1)[0] = float("nan")
    write_checkpoint(ck, run.run_dir / "checkpoint.pt")
    assert main(["run", "--resume", str(run.run_dir), "train.rounds=3", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "field 'server' holds NaN or inf (at server/weights/" in err and "train.lr" not in err
    shutil.rmtree(tmp_path / "k")


# ---------------------------------------------------------------------------- OS errors
# OS errors at the command line: --out a file or read-only, a disk full, a decompression bomb
def test_out_is_a_file(tmp_path, capsys):
    """`--out FILE` ended in a NotADirectoryError traceback."""
    file = tmp_path / "results.txt"
    file.write_text("not a folder")
    assert main(["run", *TOY, "--quiet", "--out", str(file)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fedshift: error: ") and err.count("\n") == 1
    assert f"{file} is a file, not a folder" in err and "--out" in err


def _mount_read_only(path: Path) -> bool:
    path.mkdir()
    cmd = ["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(path)]
    try:
        return subprocess.run(cmd, capture_output=True).returncode == 0
    except OSError:
        return False


def test_out_is_read_only(tmp_path, capsys):
    """`--out` on a read-only file system ended in a traceback (root ignores chmod, so a
    read-only tmpfs stands in; skipped where mounting is not allowed)."""
    ro = tmp_path / "ro"
    if not _mount_read_only(ro):
        pytest.skip("cannot mount a read-only tmpfs here (needs root)")
    try:
        assert main(["run", *TOY, "--quiet", "--out", str(ro)]) == 2
    finally:
        subprocess.run(["umount", str(ro)], check=True)
    err = capsys.readouterr().err
    assert err.startswith("fedshift: error: ") and str(ro) in err
    assert "Read-only file system" in err and "writable folder with --out" in err


@pytest.mark.parametrize(
    "code, words",
    [
        (errno.ENOSPC, ["/r/metrics.jsonl: No space", "Free space", "fedshift run --resume"]),
        (errno.EACCES, ["/r/metrics.jsonl: Permission denied", "writable folder with --out"]),
        (errno.EISDIR, ["a file is expected here"]),
    ],
)
def test_os_errors_are_one_line_with_the_fix(monkeypatch, capsys, code, words):
    """A disk full or a permission error escaped as a traceback."""
    from fedshift.cli import run

    def fail(args):
        raise OSError(code, os.strerror(code), "/r/metrics.jsonl")

    monkeypatch.setattr(run, "_cmd_run", fail)
    assert main(["run", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fedshift: error: ") and err.count("\n") == 1
    for w in words:
        assert w in err


def _png(path: Path, width: int, height: int, rows: bytes | None = None) -> None:
    """A 1-bit gray PNG: ``rows`` as its data, else only a header claiming the size."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(kind + data)
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)

    head = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)
    body = zlib.compress(rows if rows is not None else b"")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", head) + chunk(b"IDAT", body) + chunk(b"IEND", b"")
    )


def test_decompression_bomb_png_names_the_file(tmp_path, capsys):
    """A PNG declaring 20000x20000 pixels (a few bytes) ended in a DecompressionBombError
    traceback; between 1x and 2x Pillow's limit it was only a warning."""
    from fedshift.data.common.images import read_image, read_image_fedbn, read_mask

    root = tmp_path / "PACS"
    for cls in ("dog", "horse"):
        for i in range(6):
            _png(root / "photo" / cls / f"img_{i}.png", 8, 8, b"\x00\xff" * 8)
    bomb = root / "photo" / "dog" / "img_3.png"
    _png(bomb, 20000, 20000)
    args = ["dataset.name=pacs", f"dataset.root={root}", "dataset.domains=[photo]"]
    args += ["dataset.size=8", "dataset.cache=false", "model.name=cnn", "train.rounds=1"]
    assert main(["run", *args, "--quiet", "--out", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"fedshift: error: {bomb}: ") and "decompression bomb" in err
    warn_only = tmp_path / "big.png"  # 1x-2x the limit: Pillow only warns
    _png(warn_only, 10000, 10000)
    for reader in (read_image, read_image_fedbn, read_mask):
        with pytest.raises(DataError, match=r"big.png: .*MAX_IMAGE_PIXELS.*decompression bomb"):
            reader(warn_only)
