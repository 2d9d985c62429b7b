"""Config validation: every mistake names the key and the valid choices, and config input
a careless user or an adversary writes is refused or read as meant."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import typing

import pytest
from conftest import fedshift_env, toy_cfg

from fedshift.catalog import REGISTRIES, resolve
from fedshift.cli import main
from fedshift.core.config import (
    CheckpointConfig,
    EvalConfig,
    FederationConfig,
    TrainConfig,
    load_config,
    load_yaml,
)
from fedshift.core.config_tree import expand_sweep
from fedshift.core.errors import ConfigError


def cfg(*overrides):
    return resolve(load_config(None, ["dataset.name=toyshift", *overrides]))


def test_defaults_resolve():
    c = cfg()
    assert c.algorithm.to_dict() == {"name": "fedavg", "bn_policy": "global"}
    assert c.train.lr == 0.01 and c.train.batch_size == 32


def test_unknown_top_level_key_suggests():
    with pytest.raises(ConfigError, match=r"'trian'.*did you mean 'train'"):
        cfg("trian.lr=0.1")


def test_unknown_nested_key_lists_valid_keys():
    with pytest.raises(ConfigError, match=r"'train.lrr'.*did you mean 'lr'.*valid keys"):
        cfg("train.lrr=0.1")


def test_wrong_type():
    with pytest.raises(ConfigError, match=r"'train.rounds': expected int, got 'ten'"):
        cfg("train.rounds=ten")
    with pytest.raises(ConfigError, match=r"'train.lr'"):
        cfg("train.lr=true")


def test_literal_choices():
    with pytest.raises(ConfigError, match=r"'train.optimizer'.*'sgd', 'adam'"):
        cfg("train.optimizer=rmsprop")


def test_unknown_algorithm_lists_choices():
    with pytest.raises(ConfigError, match=r"unknown algorithm 'fedavgg'.*fedavg.*valid:.*scaffold"):
        cfg("algorithm.name=fedavgg")


def test_unknown_dataset_and_model():
    with pytest.raises(ConfigError, match=r"'dataset.name'.*unknown dataset 'mnist'.*digits"):
        resolve(load_config(None, ["dataset.name=mnist"]))
    valid = "alexnet, cnn, densenet121, digitmodel, efficientnet_lite0, lenet5, resnet18, unet"
    with pytest.raises(ConfigError, match=rf"unknown model 'resnet'.*{valid}"):
        cfg("model.name=resnet")


def test_algorithm_params_are_per_algorithm():
    assert cfg("algorithm.name=fedprox", "algorithm.mu=0.1").algorithm.params.mu == 0.1
    with pytest.raises(ConfigError, match=r"'algorithm.mu'"):
        cfg("algorithm.name=fedavg", "algorithm.mu=0.1")
    with pytest.raises(ConfigError, match=r"'algorithm.bn_policy'.*'global', 'local'"):
        cfg("algorithm.bn_policy=some")
    assert cfg("algorithm.name=fedbn").algorithm.params.bn_policy == "local"


def test_nonsense_combinations_fail_at_config_time():
    with pytest.raises(ConfigError, match=r"fednova.*train.optimizer=sgd"):
        cfg("algorithm.name=fednova", "train.optimizer=adam")
    with pytest.raises(ConfigError, match=r"scaffold"):
        cfg("algorithm.name=scaffold", "train.optimizer=adam")


def test_ranges():
    with pytest.raises(ConfigError, match=r"federation.sample_fraction"):
        cfg("federation.sample_fraction=0")
    with pytest.raises(ConfigError, match=r"train.rounds"):
        cfg("train.rounds=0")


def test_bad_override_and_file_errors(tmp_path):
    with pytest.raises(ConfigError, match=r"key=value"):
        load_config(None, ["train.lr"])
    with pytest.raises(ConfigError, match=r"does not exist"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("train:\n  lrr: 0.1\n")
    with pytest.raises(ConfigError, match=r"bad.yaml.*'train.lrr'"):
        resolve(load_config(bad), source=str(bad))


def test_changing_component_name_drops_old_params(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("dataset: {name: toyshift}\nalgorithm: {name: fedprox, mu: 0.5}\n")
    c = resolve(load_config(f, ["algorithm.name=fedavg"]))
    assert c.algorithm.to_dict() == {"name": "fedavg", "bn_policy": "global"}


def test_sweep_expansion():
    raw = load_config(
        None, ["dataset.name=toyshift", "sweep.algorithm.name=[fedavg,fedbn]", "sweep.seed=[0,1]"]
    )
    runs = expand_sweep(raw)
    assert [(r["algorithm"]["name"], r["seed"]) for r in runs] == [
        ("fedavg", 0),
        ("fedavg", 1),
        ("fedbn", 0),
        ("fedbn", 1),
    ]
    with pytest.raises(ConfigError, match=r"sweep key 'seed'"):
        expand_sweep({"sweep": {"seed": 3}})


# ---------------------------------------------------------------------------- careless input
# config input a careless user or an adversary writes: exponents without a dot, non-finite
# and out-of-range values, duplicate keys, YAML alias bombs, run names that are paths
TOY = ["dataset.name=toyshift", "model.name=lenet5", "train.rounds=1", "train.batch_size=16"]


def _fedshift(args: list[str], timeout: float) -> subprocess.CompletedProcess:
    """``python -m fedshift ARGS`` in a fresh interpreter on this checkout's code."""
    return subprocess.run([sys.executable, "-m", "fedshift", *args], capture_output=True,
                          text=True, timeout=timeout, env=fedshift_env())  # fmt: skip


def test_float_keys_read_exponents_without_a_dot(tmp_path):
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
def test_non_finite_floats_are_refused(override, key):
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
def test_out_of_range_values_are_refused(overrides, match):
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


def test_every_numeric_parameter_declares_its_range():
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


def test_duplicate_yaml_keys_are_refused(tmp_path):
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


def test_alias_bomb_fails_fast(tmp_path):
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


def test_aliases_are_copies(tmp_path):
    """An override set through one alias of a shared YAML mapping changed the other too."""
    path = tmp_path / "alias.yaml"
    path.write_text("dataset: &d {name: toyshift}\nother: *d\n")
    raw = load_config(path, ["dataset.seed=1"])
    assert raw["dataset"] == {"name": "toyshift", "seed": 1}
    assert raw["other"] == {"name": "toyshift"}


@pytest.mark.parametrize("name", ["/abs/path", "../..", "a/b", "..", ".", "", "a\\b"])
def test_run_name_is_a_plain_folder_name(tmp_path, name):
    """`name=/abs/path` or `name=../..` wrote outside --out."""
    with pytest.raises(ConfigError, match=r"config key 'name' must be a plain folder name"):
        toy_cfg(f"name='{name}'")
    out = tmp_path / "inside" / "out"
    assert main(["run", *TOY, f"name='{name}'", "--quiet", "--out", str(out)]) == 2
    assert not (tmp_path / "inside").exists()


def test_config_directory_is_named_as_one(tmp_path, capsys):
    """`-c somedir` said the directory 'does not exist'."""
    with pytest.raises(ConfigError, match=r"is a directory; give a YAML file"):
        load_config(tmp_path)
    assert main(["run", "-c", str(tmp_path)]) == 2
    assert "is a directory" in capsys.readouterr().err


def test_section_keys_without_a_name_under_a_swept_name_are_an_error():
    from fedshift.core.config_tree import expand_sweep

    raw = {"algorithm": {"penalty": 0.01}, "sweep": {"algorithm.name": ["fedavg", "fediir"]}}
    with pytest.raises(ConfigError, match=r"algorithm\.penalty.*no algorithm\.name"):
        expand_sweep(raw)
    # a named section keeps its keys for its own name and gives way to the others
    raw = {"algorithm": {"name": "fedprox", "mu": 0.1},
           "sweep": {"algorithm.name": ["fedavg", "fedprox"]}}  # fmt: skip
    assert [c["algorithm"] for c in expand_sweep(raw)] == [
        {"name": "fedavg"},
        {"name": "fedprox", "mu": 0.1},
    ]
