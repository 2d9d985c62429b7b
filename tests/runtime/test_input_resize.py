"""``input.size=[H, W]`` (issue 54): the input pipeline resizes every image bilinearly after
the augments and before ``input.mean/std``, in training, in evaluation and in the exported
predictor alike, and the model is built for the resized images; bad values are refused in
one line naming the key; unset, a config's digest is the one it had before the key."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from conftest import toy_cfg

import fedshift
from fedshift.core.errors import ConfigError
from fedshift.core.identity import number_config
from fedshift.runtime.experiment import build_experiment, score_client
from fedshift.runtime.simulation import load_finished, run_experiment
from fedshift.testing import tiny_cfg, tiny_federation

pytestmark = pytest.mark.usefixtures("one_thread")

#: a model that takes any size (the toy data is 28x28), upsampled to a non-square size
RESIZED = ("model.name=resnet18", "model.width=4", "input.size=[36, 44]")


def _expected(x: torch.Tensor) -> torch.Tensor:
    """What the pipeline must give the model: bilinear to 36x44, then (x - 0.5) / 0.5."""
    return (F.interpolate(x, size=(36, 44), mode="bilinear", align_corners=False) - 0.5) / 0.5


def test_training_and_evaluation_see_the_same_resized_images():
    cfg = tiny_cfg("fedavg", *RESIZED)
    fed = tiny_federation(cfg)
    exp = build_experiment(cfg, fed)
    x = torch.as_tensor(fed.clients[0].train.x[:5]).float()
    y = fed.clients[0].train.y[:5]
    xt, yt = exp.pipeline.train(x, y, None, torch.Generator().manual_seed(0))
    xe = exp.pipeline.eval(x, None)
    assert xt.shape == (5, 3, 36, 44) and torch.equal(yt, y)
    assert torch.equal(xt, xe) and torch.equal(xe, _expected(x))
    # the model is built for the resized images: its output for them is one score a class
    with torch.no_grad():
        assert exp.model.eval()(xe).shape == (5, fed.num_classes)
    # without input.size the same pipeline passes the 28x28 images on
    plain = build_experiment(tiny_cfg("fedavg", *RESIZED[:2]), fed)
    assert plain.pipeline.eval(x, None).shape == (5, 3, 28, 28)


def test_a_model_too_small_for_the_data_runs_once_resized(tmp_path):
    """efficientnet_lite0 takes at least 32x32: the 28x28 toy images are refused (the error
    names input.size), and upsampled to 32x32 a round trains; the resize happens after an
    augment that transforms the raw images (HarmoFL's amplitude normalisation)."""
    over = ("dataset.clients=2", "dataset.train_size=8", "dataset.val_size=4",
            "dataset.test_size=4", "model.name=efficientnet_lite0", "input.mean=[0]",
            "input.std=[1]", "train.batch_size=4", "train.local_steps=1")  # fmt: skip
    fed = tiny_federation(toy_cfg(*over[:4], rounds=1))
    with pytest.raises(ConfigError, match=r"input.size=\[H, W\]"):
        build_experiment(toy_cfg(*over, rounds=1), fed)
    cfg = toy_cfg(*over, "input.size=[32, 32]", "augment=[ampnorm]", rounds=1)
    res = run_experiment(cfg, run_dir=tmp_path / "run", federation=fed, progress=False)
    assert res.summary is not None


@pytest.mark.parametrize(
    "value",
    ["[0, 32]", "[32]", "[32, 32, 32]", "[32.5, 32]", "[true, 32]", "[99999, 32]", "64", "big"],
)
def test_bad_sizes_are_refused_in_one_line_naming_the_key(value):
    with pytest.raises(ConfigError) as e:
        toy_cfg(f"input.size={value}")
    assert "'input.size'" in str(e.value) and "\n" not in str(e.value)


def test_segmentation_is_refused():
    """A resize of the images would leave their per-pixel masks at the old size."""
    with pytest.raises(ConfigError, match=r"'input.size'.*classification only"):
        toy_cfg("dataset.name=toyseg", "model.name=unet", "input.size=[32, 32]")


def test_unset_the_digest_is_the_one_before_the_key():
    """input.size at its off value leaves the numbers' config (and so every committed
    digest) as it was; set, it is part of it."""
    assert "size" not in number_config(toy_cfg().to_dict())["input"]
    assert toy_cfg().to_dict()["input"]["size"] is None
    assert number_config(toy_cfg("input.size=[32, 32]").to_dict())["input"]["size"] == [32, 32]


def test_export_predicts_as_the_run_evaluated(tmp_path):
    """The exported predictor takes the dataset's 28x28 images and resizes them as the run
    did: its scores equal the run's own evaluation (score_client's batches) on a client's test
    images; the state_dict export rebuilds the model for 36x44 and loads."""
    cfg = tiny_cfg("fedavg", *RESIZED)
    run_dir = run_experiment(cfg, run_dir=tmp_path / "run", progress=False).run_dir
    done = fedshift.export_model(run_dir, tmp_path / "m.pt")
    assert done.config["input"]["size"] == [36, 44] and done.config["input_shape"] == [3, 28, 28]
    pred = fedshift.load_predictor(done.predictor_path)
    sim = load_finished(run_dir)
    client = sim.fed.clients[0]
    sim.model.load_state_dict(sim.weights_for(client.name, "global"))
    sim.model.eval()
    x = torch.as_tensor(client.split("test").x).float()
    with torch.no_grad():
        want = sim.model(sim.pipeline.eval(x, None))
    got = pred.scores(x)
    assert torch.equal(got.argmax(1), want.argmax(1))
    torch.testing.assert_close(got, want)
    model = fedshift.load_exported(done.path)
    with torch.no_grad():
        assert torch.equal(model(_expected(x)), want)
    assert score_client(sim.exp, client, None, 500)  # the evaluation path runs on it too
    meta = json.loads((tmp_path / "m.json").read_text())
    assert meta["plain"] is True
