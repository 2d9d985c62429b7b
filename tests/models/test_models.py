"""Model contract: features/head split, named stages and BN layers, FedBN's exact DigitModel."""

from __future__ import annotations

import pytest
import torch

from fedshift.core.errors import ConfigError
from fedshift.models import MODEL_INPUTS, MODELS, build_model

#: the 3x28x28 classification models (U-Net and DenseNet: tests/models/test_seg_models.py)
DIGIT_MODELS = [n for n in MODELS.names() if MODEL_INPUTS.get(n) == (3, 28, 28)]


@pytest.mark.parametrize("name", DIGIT_MODELS)
def test_features_head_and_names(name):
    torch.manual_seed(0)
    model = build_model({"name": name}, 10, (3, 28, 28)).eval()
    x = torch.randn(4, 3, 28, 28)
    z = model.features(x)
    assert z.ndim == 2 and z.shape[0] == 4
    assert torch.equal(model.head(z), model(x))
    assert model(x).shape == (4, 10)
    assert model.stage_names and all(n.startswith("conv") for n in model.stage_names)
    assert model.bn_layer_names()


def test_stage_hooks_see_each_stage_output():
    model = build_model({"name": "digitmodel"}, 10, (3, 28, 28)).eval()
    seen = {}
    for name in model.stage_names:
        model.stage_hooks[name] = lambda t, n=name: seen.setdefault(n, t.shape) and t
    model(torch.randn(2, 3, 28, 28))
    assert seen == {"conv1": (2, 64, 14, 14), "conv2": (2, 64, 7, 7), "conv3": (2, 128, 7, 7)}


def test_digitmodel_matches_fedbn_layers():
    model = build_model({"name": "digitmodel"}, 10, (3, 28, 28))
    n = sum(p.numel() for p in model.parameters())
    expected = (
        (3 * 64 * 25 + 64)
        + (64 * 64 * 25 + 64)
        + (64 * 128 * 25 + 128)  # convs
        + (6272 * 2048 + 2048)
        + (2048 * 512 + 512)
        + (512 * 10 + 10)  # fc1..fc3
        + 2 * (64 + 64 + 128 + 2048 + 512)  # BN weight+bias
    )
    assert n == expected
    assert len(model.bn_layer_names()) == 5


def test_lenet_without_bn():
    model = build_model({"name": "lenet5", "bn": False}, 10, (3, 28, 28))
    assert model.bn_layer_names() == []


def test_wrong_input_shape_is_a_config_error():
    with pytest.raises(ConfigError, match=r"model 'cnn' takes images of shape 3x28x28"):
        build_model({"name": "cnn"}, 10, (3, 64, 64))
