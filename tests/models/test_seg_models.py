"""U-Net (FedFA / HarmoFL) and DenseNet-121 (HarmoFL's Camelyon17 model): shapes, exact
parameter and BN counts, stage-hook placement, input checks and FFA on a U-Net."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from fedshift.augment import build_augments
from fedshift.core.errors import ConfigError
from fedshift.models import build_model
from fedshift.models.densenet import DenseNet
from fedshift.models.unet import UNet

SEG = "segmentation"
CLS = "classification"
#: a DenseNet small enough to run in milliseconds (embedding: 16 channels)
TINY_DENSE = {"growth": 4, "blocks": [2, 2, 2, 2], "init_features": 8, "bn_size": 2}


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def unet(width: int = 4, classes: int = 2, in_channels: int = 3, **kw) -> UNet:
    torch.manual_seed(0)
    return build_model({"name": "unet", "width": width, **kw}, classes, (in_channels, 32, 32), SEG)


def densenet(classes: int = 2, size: int = 32, **kw) -> DenseNet:
    torch.manual_seed(0)
    return build_model({"name": "densenet121", **kw}, classes, (3, size, size), CLS)


# ----------------------------------------------------------------------------- U-Net
def unet_param_total(w: int, cin: int, k: int) -> int:
    """Hand count: block(a, b) = two bias-free 3x3 convs + two BNs (weight, bias);
    up-conv = ConvTranspose2d(2c, c, 2) with bias; classifier = 1x1 conv with bias."""

    def block(a: int, b: int) -> int:
        return 9 * a * b + 9 * b * b + 2 * (2 * b)

    encoder = block(cin, w) + block(w, 2 * w) + block(2 * w, 4 * w) + block(4 * w, 8 * w)
    bottleneck = block(8 * w, 16 * w)
    decoder = sum(4 * (2 * c) * c + c + block(2 * c, c) for c in (8 * w, 4 * w, 2 * w, w))
    return encoder + bottleneck + decoder + (w * k + k)


def test_unet_param_count_full_size():
    model = build_model({"name": "unet"}, 2, (3, 384, 384), SEG)
    assert unet_param_total(32, 3, 2) == 7_763_074
    assert n_params(model) == 7_763_074
    assert n_params(build_model({"name": "unet", "width": 16}, 2, (3, 64, 64), SEG)) == (
        unet_param_total(16, 3, 2)
    )


@pytest.mark.parametrize(("cin", "classes", "hw"), [(3, 2, (32, 32)), (1, 4, (32, 48))])
def test_unet_shapes_and_contract(cin, classes, hw):
    model = unet(width=4, classes=classes, in_channels=cin).eval()
    x = torch.rand(2, cin, *hw)
    z = model.features(x)
    assert z.shape == (2, 4, *hw)  # dec1's per-pixel embedding
    assert torch.equal(model.head(z), model(x))
    assert model(x).shape == (2, classes, *hw)
    assert n_params(model) == unet_param_total(4, cin, classes)


def test_unet_layout_and_bn_names():
    model = unet(width=4)
    assert model.stage_names == ["enc1", "enc2", "enc3", "enc4", "bottleneck"]
    assert list(model.decoder.keys()) == [
        "up4", "dec4", "up3", "dec3", "up2", "dec2", "up1", "dec1"
    ]  # fmt: skip
    assert list(dict(model.stages.enc1.named_children())) == [
        "conv1", "bn1", "relu1", "conv2", "bn2", "relu2"
    ]  # fmt: skip
    blocks = [f"stages.{s}" for s in model.stage_names] + [f"decoder.dec{k}" for k in (4, 3, 2, 1)]
    expected = [f"{b}.bn{i}" for b in blocks for i in (1, 2)]
    assert len(expected) == 18
    assert sorted(model.bn_layer_names()) == sorted(expected)
    assert all(model.get_submodule(n).num_features > 0 for n in expected)
    assert isinstance(model.classifier, nn.Conv2d) and model.classifier.kernel_size == (1, 1)
    # padded, bias-free convolutions inside the blocks
    conv = model.stages.enc1.conv1
    assert conv.bias is None and conv.padding == (1, 1) and conv.kernel_size == (3, 3)


def test_unet_harmofl_bn_has_no_parameters_or_buffers():
    std, harmo = unet(width=4), unet(width=4, bn="harmofl")
    names = harmo.bn_layer_names()
    assert len(names) == 18
    keys = harmo.state_dict().keys()
    assert not [k for k in keys if any(k.startswith(n + ".") for n in names)]
    assert list(harmo.buffers()) == []
    bn_channels = sum(std.get_submodule(n).num_features for n in std.bn_layer_names())
    assert n_params(std) - n_params(harmo) == 2 * bn_channels
    # evaluation normalises with batch statistics: one image's output depends on the others
    x = torch.rand(3, 3, 32, 32)
    harmo.eval()
    a, b = harmo(x[[0, 1]])[0], harmo(x[[0, 2]])[0]
    assert not torch.allclose(a, b)
    std.eval()
    torch.testing.assert_close(std(x[[0, 1]])[0], std(x[[0, 2]])[0])


def test_unet_stage_hooks_see_pooled_encoder_outputs_and_bottleneck():
    model = unet(width=4).eval()
    seen = {}
    for name in model.stage_names:
        model.stage_hooks[name] = lambda t, n=name: seen.setdefault(n, tuple(t.shape)) and t
    model(torch.rand(2, 3, 32, 32))
    assert seen == {
        "enc1": (2, 4, 16, 16),
        "enc2": (2, 8, 8, 8),
        "enc3": (2, 16, 4, 4),
        "enc4": (2, 32, 2, 2),
        "bottleneck": (2, 64, 2, 2),
    }


def test_unet_hook_output_feeds_next_stage_and_skip_is_unhooked():
    model = unet(width=4).eval()
    x = torch.rand(2, 3, 32, 32)
    got = {}

    def grab(key):
        return lambda m, args: got.setdefault(key, args[0].clone())

    model.stages.enc2.register_forward_pre_hook(grab("enc2"))
    model.decoder.up4.register_forward_pre_hook(grab("up4"))
    model.decoder.dec1.register_forward_pre_hook(grab("dec1"))
    model.stage_hooks["enc1"] = lambda t: 2.0 * t
    model.stage_hooks["bottleneck"] = lambda t: t + 1.0
    with torch.no_grad():
        model(x)
        enc1 = model.stages.enc1(x)
    # the next stage gets the hooked, pooled map; the bottleneck's hook feeds the decoder
    torch.testing.assert_close(got["enc2"], 2.0 * nn.functional.max_pool2d(enc1, 2))
    assert got["up4"].shape == (2, 64, 2, 2) and bool((got["up4"] >= 1.0).all())
    # dec1 sees concat(upsampled, skip) and the skip is enc1's un-hooked, un-pooled output
    assert got["dec1"].shape == (2, 8, 32, 32)
    torch.testing.assert_close(got["dec1"][:, 4:], enc1)


@pytest.mark.parametrize("stage", ["enc1", "bottleneck"])
def test_unet_zero_hook_changes_output_but_skips_carry_unhooked_features(stage):
    # training mode: BN normalises with batch statistics, so deep features are not tiny
    model = unet(width=4).train()
    x1, x2 = torch.rand(2, 3, 32, 32), torch.rand(2, 3, 32, 32)
    with torch.no_grad():
        plain = model(x1)
        model.stage_hooks[stage] = torch.zeros_like
        hooked1, hooked2 = model(x1), model(x2)
    assert not torch.allclose(plain, hooked1)  # the hook is applied
    # the skip connections still carry the input: the output is not input-independent
    assert not torch.allclose(hooked1, hooked2)


def test_unet_check_input_reasons():
    assert UNet.check_input((3, 64, 64), SEG) is None
    assert UNet.check_input((1, 384, 32), SEG) is None
    why = UNet.check_input((3, 50, 50), SEG)
    assert "divisible by 16" in why and "3x50x50" in why and "dataset.size" in why
    assert "divisible by 16" in UNet.check_input((3, 64, 40), SEG)
    assert "segmentation model" in UNet.check_input((3, 64, 64), CLS)
    with pytest.raises(ConfigError, match=r"model 'unet'.*divisible by 16.*3x50x50"):
        build_model({"name": "unet"}, 2, (3, 50, 50), SEG)
    with pytest.raises(ConfigError, match=r"model 'unet'.*segmentation model"):
        build_model({"name": "unet"}, 10, (3, 32, 32), CLS)
    with pytest.raises(ValueError, match="divisible by 16"):
        unet(width=4)(torch.rand(1, 3, 40, 32))


@pytest.mark.parametrize(
    ("section", "key"), [({"width": 0}, "model.width"), ({"bn": "group"}, "model.bn")]
)
def test_unet_bad_params_are_config_errors(section, key):
    with pytest.raises(ConfigError, match=key):
        build_model({"name": "unet", **section}, 2, (3, 32, 32), SEG)


def test_ffa_on_unet_one_layer_per_stage_and_trains():
    model = unet(width=4)
    (ffa,) = build_augments([{"name": "ffa", "p": 1.0}], seed=0, num_classes=2)
    ffa.attach(model)
    channels = {"enc1": 4, "enc2": 8, "enc3": 16, "enc4": 32, "bottleneck": 64}
    assert {s: layer.channels for s, layer in ffa.layers.items()} == channels
    assert all(model.stage_hooks[s] is ffa.layers[s] for s in channels)

    x = torch.rand(4, 3, 32, 32)
    y = (x[:, 0] > 0.5).long()  # (N, H, W) label map
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    w0 = model.stages.enc1.conv1.weight.detach().clone()
    loss = nn.functional.cross_entropy(model(x), y)
    assert all(layer.fired for layer in ffa.layers.values())
    assert torch.isfinite(loss)
    opt.zero_grad()
    loss.backward()
    assert model.stages.enc1.conv1.weight.grad.abs().sum() > 0
    opt.step()
    assert not torch.equal(model.stages.enc1.conv1.weight, w0)
    # the FFA layers' momentum statistics moved (Eq. 4) and they are identity at evaluation
    assert not torch.equal(ffa.layers["enc1"].running_mean, torch.zeros(4))
    model.eval()
    with torch.no_grad():
        with_ffa = model(x)
        model.stage_hooks.clear()
        torch.testing.assert_close(model(x), with_ffa)


# ----------------------------------------------------------------------------- DenseNet
def densenet_param_total(
    k: int = 32,
    blocks: tuple[int, ...] = (6, 12, 24, 16),
    c0: int = 64,
    bn_size: int = 4,
    cin: int = 3,
    classes: int = 2,
) -> int:
    """Hand count: stem conv 7x7 + BN; dense layer on c maps = BN(c) + 1x1 conv c -> 4k +
    BN(4k) + 3x3 conv 4k -> k; transition = BN(c) + 1x1 conv c -> c/2; final BN + linear."""
    mid = bn_size * k
    n = cin * c0 * 49 + 2 * c0
    c = c0
    for i, layers in enumerate(blocks):
        for _ in range(layers):
            n += 2 * c + c * mid + 2 * mid + mid * k * 9
            c += k
        if i < len(blocks) - 1:
            n += 2 * c + c * (c // 2)
            c //= 2
    return n + 2 * c + c * classes + classes


def test_densenet121_param_and_bn_counts():
    model = build_model({"name": "densenet121"}, 2, (3, 96, 96), CLS)
    # torchvision's densenet121 has 7,978,856 parameters with a 1000-class head
    assert densenet_param_total() == 7_978_856 - 998 * 1024 - 998 == 6_955_906
    assert n_params(model) == 6_955_906
    assert model.num_features == 1024 and model.classifier.in_features == 1024
    names = model.bn_layer_names()
    assert len(names) == 121
    assert {"stages.stem.bn0", "stages.block1.transition.bn", "stages.block4.bn5"} <= set(names)
    assert "stages.block3.dense.denselayer24.bn2" in names
    assert sum(isinstance(m, nn.Conv2d) for m in model.modules()) + 1 == 121  # weight layers


def test_densenet_small_shapes_contract_and_count():
    model = densenet(**TINY_DENSE).eval()
    x = torch.rand(3, 3, 32, 32)
    z = model.features(x)
    assert z.shape == (3, 16)
    assert torch.equal(model.head(z), model(x))
    assert model(torch.rand(2, 3, 96, 96)).shape == (2, 2)
    assert n_params(model) == densenet_param_total(4, (2, 2, 2, 2), 8, 2)
    assert n_params(densenet(classes=5, **{**TINY_DENSE, "blocks": [3, 1]})) == (
        densenet_param_total(4, (3, 1), 8, 2, classes=5)
    )


@pytest.mark.parametrize(
    ("padding", "sizes"), [(False, (24, 12, 6, 3, 1)), (True, (24, 14, 7, 3, 1))]
)
def test_densenet_stage_hooks_and_released_padding(padding, sizes):
    model = densenet(size=96, released_padding=padding, **TINY_DENSE).eval()
    assert model.stage_names == ["stem", "block1", "block2", "block3", "block4"]
    seen = {}
    for name in model.stage_names:
        model.stage_hooks[name] = lambda t, n=name: seen.setdefault(n, tuple(t.shape)) and t
    model(torch.rand(2, 3, 96, 96))
    channels = (8, 8, 8, 8, 16)
    assert seen == {
        n: (2, c, s, s) for n, c, s in zip(model.stage_names, channels, sizes, strict=True)
    }
    pads = [n for n, m in model.named_modules() if isinstance(m, nn.ZeroPad2d)]
    assert pads == (["stages.block1.pad"] if padding else [])


def test_densenet_hook_changes_output():
    model = densenet(**TINY_DENSE).eval()
    x = torch.rand(2, 3, 32, 32)
    with torch.no_grad():
        plain = model(x)
        model.stage_hooks["block2"] = lambda t: 3.0 * t
        assert not torch.allclose(model(x), plain)


def test_densenet_init_is_kaiming_normal_and_zero_linear_bias():
    model = densenet()
    conv0 = model.stages.stem.conv0.weight  # 64 x 3 x 7 x 7, fan-in 147
    assert abs(conv0.std().item() / math.sqrt(2.0 / 147) - 1.0) < 0.05
    conv = model.stages.block3.dense.denselayer1.conv2.weight  # fan-in 128 x 9
    assert abs(conv.std().item() / math.sqrt(2.0 / (128 * 9)) - 1.0) < 0.05
    assert torch.equal(model.classifier.bias, torch.zeros(2))
    bn = model.stages.block4.bn5
    assert torch.equal(bn.weight, torch.ones(1024)) and torch.equal(bn.bias, torch.zeros(1024))


def test_densenet_harmofl_bn_and_dropout():
    std = densenet(**TINY_DENSE)
    harmo = densenet(bn="harmofl", **TINY_DENSE)
    assert len(harmo.bn_layer_names()) == len(std.bn_layer_names()) == 1 + 2 * 8 + 3 + 1
    assert list(harmo.buffers()) == []
    bn_channels = sum(std.get_submodule(n).num_features for n in std.bn_layer_names())
    assert n_params(std) - n_params(harmo) == 2 * bn_channels

    drop = densenet(drop_rate=0.5, **TINY_DENSE)
    x = torch.rand(4, 3, 32, 32)
    drop.train()
    torch.manual_seed(1)
    a = drop(x)
    assert not torch.allclose(a, drop(x))  # dropout is active in training
    drop.eval()
    torch.testing.assert_close(drop(x), drop(x))


def test_densenet_check_input_reasons_and_bad_params():
    assert DenseNet.check_input((3, 96, 96), CLS) is None
    assert DenseNet.check_input((3, 32, 32), CLS) is None
    why = DenseNet.check_input((3, 28, 28), CLS)
    assert ">= 32" in why and "3x28x28" in why and "dataset.size" in why
    assert "classification model" in DenseNet.check_input((3, 96, 96), SEG)
    with pytest.raises(ConfigError, match=r"model 'densenet121'.*>= 32"):
        build_model({"name": "densenet121"}, 10, (3, 28, 28))
    with pytest.raises(ConfigError, match=r"model 'densenet121'.*classification model"):
        build_model({"name": "densenet121"}, 2, (3, 96, 96), SEG)
    for section, key in [
        ({"blocks": []}, r"model\.blocks"),
        ({"blocks": [6, 0]}, r"model\.blocks\[1\]"),
        ({"growth": 0}, r"model\.growth"),
        ({"drop_rate": 1.0}, r"model\.drop_rate"),
        ({"bn": "none"}, r"model\.bn"),
    ]:
        with pytest.raises(ConfigError, match=key):
            build_model({"name": "densenet121", **section}, 2, (3, 32, 32))
