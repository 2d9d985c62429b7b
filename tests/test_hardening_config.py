"""Issue 15, items 8, 9 (command line) and 10: config input a careless user or an adversary
writes, OS errors at the command line, and Flower's ``submit --insecure``."""

from __future__ import annotations

import dataclasses
import errno
import os
import struct
import subprocess
import sys
import typing
import zlib
from pathlib import Path

import pytest
from conftest import toy_cfg

import fedshift
from fedshift.catalog import REGISTRIES, resolve
from fedshift.cli import main
from fedshift.core.config import (
    CheckpointConfig,
    EvalConfig,
    FederationConfig,
    TrainConfig,
    expand_sweep,
    load_config,
    load_yaml,
)
from fedshift.core.errors import ConfigError, DataError

TOY = ["dataset.name=toyshift", "model.name=lenet5", "train.rounds=1", "train.batch_size=16"]


def _fedshift(args: list[str], timeout: float) -> subprocess.CompletedProcess:
    """``python -m fedshift ARGS`` in a fresh interpreter on this checkout's code."""
    env = {**os.environ, "PYTHONPATH": str(Path(fedshift.__file__).parents[1])}
    return subprocess.run(
        [sys.executable, "-m", "fedshift", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


# ----------------------------------------------------------------------------- item 8
def test_item8_float_keys_read_exponents_without_a_dot(tmp_path):
    """`train.lr=1e-3` and YAML `lr: 5e-4` (strings to YAML 1.1) were 'expected float'."""
    assert toy_cfg("train.lr=1e-3").train.lr == 0.001
    path = tmp_path / "c.yaml"
    path.write_text("dataset: {name: toyshift}\ntrain:\n  lr: 5e-4\n  weight_decay: 1E-5\n")
    cfg = resolve(load_config(path), str(path))
    assert (cfg.train.lr, cfg.train.weight_decay) == (5e-4, 1e-5)
    assert toy_cfg("name=1e-3").name == "1e-3"  # a str key keeps the string
    with pytest.raises(ConfigError, match=r"'train.lr': expected float, got 'fast'"):
        toy_cfg("train.lr=fast")


@pytest.mark.parametrize(
    "override, key",
    [
        ("train.lr=.nan", "train.lr"),
        ("train.weight_decay=.inf", "train.weight_decay"),
        ("train.momentum=.nan", "train.momentum"),
        ("input.mean=[0.5, .nan, 0.5]", r"input.mean\[1\]"),
        ("train.lr=inf", "train.lr"),
    ],
)
def test_item8_non_finite_floats_are_refused(override, key):
    """nan / inf were accepted for lr, weight_decay, momentum, input.mean."""
    with pytest.raises(ConfigError, match=rf"'{key}' must be a finite number"):
        toy_cfg(override)


@pytest.mark.parametrize(
    "overrides, match",
    [
        (["train.momentum=-5"], r"'train.momentum' must be in \[0, 1\)"),
        (["train.weight_decay=-1"], r"'train.weight_decay' must be >= 0"),
        (["algorithm.name=fedprox", "algorithm.mu=-5"], r"'algorithm.mu' must be >= 0"),
        (
            ["algorithm.name=fedavgm", "algorithm.server_lr=-1"],
            r"'algorithm.server_lr' must be > 0",
        ),
        (
            ["algorithm.name=fedadam", "algorithm.beta1=1.5"],
            r"'algorithm.beta1' must be in \[0, 1\)",
        ),
        (["algorithm.name=fedsam", "algorithm.rho=-0.1"], r"'algorithm.rho' must be >= 0"),
        (
            ["algorithm.name=scaffold", "algorithm.server_lr=0"],
            r"'algorithm.server_lr' must be > 0",
        ),
        (["model.name=cnn", "model.width=0"], r"'model.width' must be >= 1"),
        (["model.name=densenet121", "model.blocks=[6, 0]"], r"'model.blocks\[1\]' must be >= 1"),
        (["dataset.clients=0"], r"'dataset.clients' must be >= 1"),
        (["seed=-1"], r"'seed' must be >= 0"),
    ],
)
def test_item8_out_of_range_values_are_refused(overrides, match):
    """momentum=-5 crashed inside torch; server_lr=-1 and mu=-5 ran to completion."""
    with pytest.raises(ConfigError, match=match):
        toy_cfg(*overrides)


#: numeric parameters with no obvious valid range (a margin, an angle-free weight...), or
#: ranged by their dataset's own ``validate``
UNBOUNDED = {
    "algorithm.fedaws": {"positive_margin"},
    "augment.norm": {"mean"},
    "dataset": {"*"},  # datasets with a validate() method check their own keys
}


def _numeric(tp: object) -> bool:
    args = typing.get_args(tp) or (tp,)
    inner = [typing.get_args(a)[0] if typing.get_origin(a) is list else a for a in args]
    return any(a in (int, float) for a in inner)


def test_item8_every_numeric_parameter_declares_its_range():
    """One mechanism: each numeric key of the fixed sections and of every algorithm, augment,
    model and partition has field bounds (and its default lies inside them)."""
    from fedshift.core.bounds import check_bounds

    classes = {f"fixed.{c.__name__}": c for c in (TrainConfig, FederationConfig, EvalConfig)}
    classes["fixed.CheckpointConfig"] = CheckpointConfig
    for section, reg in REGISTRIES.items():
        for e in reg.entries():
            if e.params is not None and section != "dataset":
                classes[f"{section}.{e.name}"] = e.params
    missing = []
    for where, cls in classes.items():
        check_bounds(cls(), where)  # defaults are valid
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if not _numeric(hints[f.name]) or f.name in UNBOUNDED.get(where, ()):
                continue
            if "bounds" not in f.metadata:
                missing.append(f"{where}.{f.name}")
    for name in ("toyshift", "toyseg", "digits", "fashion-mnist"):
        for f in dataclasses.fields(REGISTRIES["dataset"].entry(name).params):
            if f.name in ("train_size", "val_size", "test_size", "seed", "clients"):
                assert "bounds" in f.metadata, (name, f.name)
    assert missing == [], missing


def test_item8_duplicate_yaml_keys_are_refused(tmp_path):
    """A second `train:` section silently replaced the first."""
    path = tmp_path / "dup.yaml"
    path.write_text("train:\n  lr: 0.1\ndataset: {name: toyshift}\ntrain:\n  rounds: 2\n")
    with pytest.raises(ConfigError, match=r"dup.yaml, line 4: key 'train' appears twice.*line 1"):
        load_config(path)
    nested = tmp_path / "nested.yaml"
    nested.write_text("train: {lr: 0.1, lr: 0.2}\n")
    with pytest.raises(ConfigError, match=r"nested.yaml, line 1: key 'lr' appears twice"):
        load_config(nested)
    with pytest.raises(ConfigError, match=r"key 'name' appears twice"):
        load_config(None, ["algorithm={name: fedprox, name: fedavg}"])
    merged = tmp_path / "merge.yaml"  # a '<<:' merge may still be overridden
    merged.write_text("base: &b {lr: 0.1, rounds: 2}\ntrain: {<<: *b, lr: 0.2}\n")
    assert load_yaml(merged)["train"] == {"lr": 0.2, "rounds": 2}


def _bomb(levels: int = 9) -> str:
    """A valid-looking config whose ``train.lr`` holds 9 ** levels strings through nested
    aliases (a few hundred bytes of YAML)."""
    lists = ["&a0 [" + ", ".join(["lol"] * 9) + "]"]
    lists += [f"&a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, levels)]
    return "dataset: {name: toyshift}\ntrain:\n  lr: [" + ", ".join(lists) + "]\n"


def test_item8_alias_bomb_fails_fast(tmp_path):
    """A 'billion laughs' config hung validation (the error message repr'd the whole value)."""
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(_bomb())
    out = _fedshift(["run", "-c", str(bomb), "--quiet", "--out", str(tmp_path)], timeout=30)
    assert out.returncode == 2, out.stderr
    assert out.stderr.startswith("fedshift: error: ") and "aliases" in out.stderr
    assert "bomb.yaml" in out.stderr and "Traceback" not in out.stderr
    grid = tmp_path / "grid.yaml"  # 10^7 combinations: refused before any is built
    grid.write_text("sweep:\n" + "".join(f"  k{i}: [0,1,2,3,4,5,6,7,8,9]\n" for i in range(7)))
    with pytest.raises(ConfigError, match="grid.yaml: the sweep grid has 10,000,000 combinations"):
        expand_sweep(load_config(grid), str(grid))
    cyclic = tmp_path / "cycle.yaml"
    cyclic.write_text("train: &t {lr: 0.1, more: [*t]}\n")
    with pytest.raises(ConfigError, match="refers to a mapping or list that contains it"):
        load_config(cyclic)
    levels = ["&l0 [" + ", ".join("1" * 10) + "]"]
    levels += [f"&l{i} [" + ", ".join([f"*l{i - 1}"] * 10) + "]" for i in range(1, 6)]
    with pytest.raises(ConfigError, match="more than 100,000 values"):  # in an override too
        load_config(None, [f"x=[{', '.join(levels)}]"])


def test_item8_aliases_are_copies(tmp_path):
    """An override set through one alias of a shared YAML mapping changed the other too."""
    path = tmp_path / "alias.yaml"
    path.write_text("dataset: &d {name: toyshift}\nother: *d\n")
    raw = load_config(path, ["dataset.seed=1"])
    assert raw["dataset"] == {"name": "toyshift", "seed": 1}
    assert raw["other"] == {"name": "toyshift"}


@pytest.mark.parametrize("name", ["/abs/path", "../..", "a/b", "..", ".", "", "a\\b"])
def test_item8_run_name_is_a_plain_folder_name(tmp_path, name):
    """`name=/abs/path` or `name=../..` wrote outside --out."""
    with pytest.raises(ConfigError, match=r"config key 'name' must be a plain folder name"):
        toy_cfg(f"name='{name}'")
    out = tmp_path / "inside" / "out"
    assert main(["run", *TOY, f"name='{name}'", "--quiet", "--out", str(out)]) == 2
    assert not (tmp_path / "inside").exists()


def test_item8_config_directory_is_named_as_one(tmp_path, capsys):
    """`-c somedir` said the directory 'does not exist'."""
    with pytest.raises(ConfigError, match=r"is a directory; give a YAML file"):
        load_config(tmp_path)
    assert main(["run", "-c", str(tmp_path)]) == 2
    assert "is a directory" in capsys.readouterr().err


# ----------------------------------------------------------------------------- item 9
def test_item9_out_is_a_file(tmp_path, capsys):
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


def test_item9_out_is_read_only(tmp_path, capsys):
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
def test_item9_os_errors_are_one_line_with_the_fix(monkeypatch, capsys, code, words):
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


def test_item9_decompression_bomb_png_names_the_file(tmp_path, capsys):
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


# ----------------------------------------------------------------------------- item 10
def test_item10_insecure_submit_warns(monkeypatch, capsys, tmp_path):
    """`fedshift flower submit --insecure` printed no warning."""
    from fedshift.flower import deploy

    calls = []

    def fake_submit(app, home, stream=True, timeout=None, log=None):
        calls.append((home / "config.toml").read_text())
        return "7", "submitted", ""

    monkeypatch.setattr(deploy, "submit_app", fake_submit)
    base = ["flower", "submit", *TOY, "--superlink", "10.0.0.5:9093", "--nodes", "3"]
    assert main([*base, "--insecure", "--no-stream"]) == 0
    err = capsys.readouterr().err
    assert "fedshift: warning: --insecure" in err and "10.0.0.5:9093" in err
    assert "unencrypted" in err and "not authenticated" in err and "trusted local network" in err
    assert "insecure = true" in calls[0]
    ca = tmp_path / "ca.crt"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    assert main([*base, "--root-cert", str(ca), "--no-stream"]) == 0
    assert "warning" not in capsys.readouterr().err
