"""``model.weights=PATH`` (issue 17): a state-dict file the user has, loaded before the
algorithm wraps the model, checked key by key, pinned by its SHA-256 in the run's config."""

from __future__ import annotations

import hashlib

import pytest
import torch
import yaml
from conftest import toy_cfg

from fedshift.catalog import resolve
from fedshift.core.errors import ConfigError
from fedshift.data import load_dataset
from fedshift.models import build_model
from fedshift.runtime.experiment import build_experiment
from fedshift.runtime.simulation import run_experiment


@pytest.fixture(scope="module")
def fed():
    cfg = toy_cfg()
    return load_dataset(cfg.dataset, cfg.partition)


def _saved(fed, path, num_classes=None, shift=1.0) -> dict[str, torch.Tensor]:
    """Save the state dict of a lenet5 (``num_classes`` outputs) moved away from any init."""
    model = build_model({"name": "lenet5", "bn": True}, num_classes or fed.num_classes, (3, 28, 28))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(shift)
    sd = model.state_dict()
    torch.save(sd, path)
    return sd


def _initial(cfg, fed) -> dict[str, torch.Tensor]:
    """The server's initial weights of ``cfg`` (the model after the algorithm wrapped it)."""
    exp = build_experiment(cfg, fed)
    return exp.algo.init_server(exp.model)["weights"]


def test_model_weights_loads_the_file_and_records_its_sha256(fed, tmp_path, one_thread):
    """The run starts from the file's tensors; config.yaml and summary.json record its SHA-256."""
    path = tmp_path / "pretrained.pt"
    saved = _saved(fed, path)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    cfg = toy_cfg(f"model.weights={path}", rounds=1)
    pinned = {"weights": str(path.resolve()), "weights_sha256": digest, "weights_skip": []}
    assert cfg.model.extras == pinned
    start = _initial(cfg, fed)
    assert start.keys() == saved.keys()
    assert all(torch.equal(start[k], v) for k, v in saved.items())
    # the seed no longer changes the starting point
    other = _initial(toy_cfg(f"model.weights={path}", "seed=5", rounds=1), fed)
    assert all(torch.equal(other[k], v) for k, v in saved.items())

    res = run_experiment(cfg, out=tmp_path / "runs", progress=False)
    assert res.summary["model_weights"] == pinned
    written = yaml.safe_load((res.run_dir / "config.yaml").read_text())
    assert written["model"]["weights_sha256"] == digest
    assert (
        "model_weights"
        not in run_experiment(toy_cfg(rounds=1), out=tmp_path / "runs", progress=False).summary
    )
    assert "weights" not in toy_cfg().model.to_dict()  # configs without weights are unchanged

    # the pinned hash is checked whenever the config is resolved again (--resume, workers)
    path.write_bytes(path.read_bytes() + b"\0")
    with pytest.raises(ConfigError, match="the file changed since the run was configured"):
        resolve(written)


def test_model_weights_mismatch_names_the_file_and_keys(fed, tmp_path, one_thread):
    """Other shapes, a prefixed or wrapped state dict, a non-state-dict file: clear errors."""
    path = tmp_path / "ten_classes.pt"
    saved = _saved(fed, path, num_classes=fed.num_classes + 3)
    own = build_model({"name": "lenet5", "bn": True}, fed.num_classes, (3, 28, 28)).state_dict()
    differ = [k for k in own if saved[k].shape != own[k].shape]
    assert differ  # the classifier
    with pytest.raises(ConfigError) as e:
        _initial(toy_cfg(f"model.weights={path}"), fed)
    msg = str(e.value)
    assert str(path) in msg and "other shapes" in msg and differ[0] in msg
    assert "model.weights_skip" in msg

    # the classifier kept at its seeded initialisation, everything else from the file
    head = differ[0].split(".")[0]
    start = _initial(toy_cfg(f"model.weights={path}", f"model.weights_skip=[{head}]"), fed)
    init = _initial(toy_cfg(), fed)
    for k in own:
        assert torch.equal(start[k], init[k] if k.startswith(head + ".") else saved[k]), k
    with pytest.raises(ConfigError, match=r"weights_skip.*\['nohead'\] match no tensor"):
        _initial(toy_cfg(f"model.weights={path}", "model.weights_skip=[nohead]"), fed)

    prefixed = tmp_path / "ddp.pt"
    torch.save({f"module.{k}": v for k, v in own.items()}, prefixed)
    with pytest.raises(ConfigError, match="missing from the file.*strip it"):
        _initial(toy_cfg(f"model.weights={prefixed}"), fed)
    wrapped = tmp_path / "ckpt.pt"
    torch.save({"epoch": 3, "state_dict": own}, wrapped)
    with pytest.raises(ConfigError, match="under its key 'state_dict'"):
        _initial(toy_cfg(f"model.weights={wrapped}"), fed)
    pickled = tmp_path / "module.pt"
    torch.save(build_model({"name": "lenet5"}, fed.num_classes, (3, 28, 28)), pickled)
    with pytest.raises(ConfigError, match="weights_only=True"):
        _initial(toy_cfg(f"model.weights={pickled}"), fed)


def test_model_weights_config_errors(tmp_path):
    """A missing file, a wrong pinned hash and weights_skip without weights fail at config time."""
    with pytest.raises(ConfigError, match="model.weights.*does not exist.*downloads nothing"):
        toy_cfg(f"model.weights={tmp_path / 'nope.pt'}")
    path = tmp_path / "w.pt"
    torch.save({}, path)
    with pytest.raises(ConfigError, match="pins deadbeef"):
        toy_cfg(f"model.weights={path}", "model.weights_sha256=deadbeef")
    with pytest.raises(ConfigError, match="apply only with model.weights"):
        toy_cfg("model.weights_skip=[classifier]")
    with pytest.raises(ConfigError, match="model.weights.*path of a state-dict file"):
        toy_cfg("model.weights=3")
