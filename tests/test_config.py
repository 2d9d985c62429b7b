"""Config validation: every mistake names the key and the valid choices."""

from __future__ import annotations

import pytest

from fedshift.catalog import resolve
from fedshift.core.config import expand_sweep, load_config
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
    valid = "alexnet, cnn, densenet121, digitmodel, lenet5, resnet18, unet"
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
