"""``model.weights_format`` (issue 54): torchvision's and timm's state dicts of the networks
fedshift also builds, read through the key maps the models declare
(:mod:`fedshift.models.keymaps`).

No torchvision or timm import: each test writes the other library's state dict by hand, with
random tensors of the shapes its modules have, and checks that fedshift's model, loaded from
it, computes what a reference network written here in plain functional ops computes with the
same (other-library-named) tensors."""

from __future__ import annotations

import logging
import math

import pytest
import torch
import torch.nn.functional as F

from fedshift.core.errors import ConfigError
from fedshift.models import build_model
from fedshift.models import keymaps as keymaps_mod
from fedshift.models.weights import resolve_weights

EPS32 = torch.finfo(torch.float32).eps


def _conv(g: torch.Generator, cout: int, cin: int, k: int) -> torch.Tensor:
    return torch.randn(cout, cin, k, k, generator=g) * math.sqrt(2.0 / (cin * k * k))


def _bn(sd: dict, prefix: str, c: int, g: torch.Generator, tracked: bool = True) -> None:
    sd[f"{prefix}.weight"] = 0.5 + torch.rand(c, generator=g)
    sd[f"{prefix}.bias"] = 0.1 * torch.randn(c, generator=g)
    sd[f"{prefix}.running_mean"] = 0.1 * torch.randn(c, generator=g)
    sd[f"{prefix}.running_var"] = 0.5 + torch.rand(c, generator=g)
    if tracked:
        sd[f"{prefix}.num_batches_tracked"] = torch.tensor(7)


def _bn_f(x: torch.Tensor, sd: dict, prefix: str, eps: float = 1e-5) -> torch.Tensor:
    return F.batch_norm(
        x, sd[f"{prefix}.running_mean"], sd[f"{prefix}.running_var"],
        sd[f"{prefix}.weight"], sd[f"{prefix}.bias"], training=False, eps=eps,
    )  # fmt: skip


def _bound(ref: torch.Tensor, fan_ins: list[int]) -> float:
    """float32 rounding bound of the model against the float64 reference: every product
    summed along the network (n per output of a layer with fan-in n) adds a rounding error of
    at most eps relative; independent roundings grow as the square root of their count, so
    4 eps sqrt(sum of fan-ins) relative to the largest logit (4: a margin for the tail)."""
    return 4 * EPS32 * math.sqrt(sum(fan_ins)) * float(ref.abs().max())


def _save(tmp_path, sd: dict, name: str = "w.pt"):
    path = tmp_path / name
    torch.save(sd, path)
    return path


def _build(name: str, path, classes: int, shape, **keys):
    section = {"name": name, **resolve_weights({"weights": str(path), **keys})}
    return build_model(section, classes, shape)


# ----------------------------------------------------------------------------- ResNet-18
RESNET_WIDTHS = (64, 128, 256, 512)


def torchvision_resnet18(seed: int = 0) -> dict[str, torch.Tensor]:
    """A state dict in torchvision's ``resnet18`` names (torchvision/models/resnet.py:
    conv1, bn1, layerL.B.{conv1,bn1,conv2,bn2,downsample.0,downsample.1}, fc)."""
    g = torch.Generator().manual_seed(seed)
    sd: dict[str, torch.Tensor] = {"conv1.weight": _conv(g, 64, 3, 7)}
    _bn(sd, "bn1", 64, g)
    cin = 64
    for i, w in enumerate(RESNET_WIDTHS, start=1):
        for b in range(2):
            p = f"layer{i}.{b}"
            sd[f"{p}.conv1.weight"] = _conv(g, w, cin if b == 0 else w, 3)
            _bn(sd, f"{p}.bn1", w, g)
            sd[f"{p}.conv2.weight"] = _conv(g, w, w, 3)
            _bn(sd, f"{p}.bn2", w, g)
            if b == 0 and i > 1:
                sd[f"{p}.downsample.0.weight"] = _conv(g, w, cin, 1)
                _bn(sd, f"{p}.downsample.1", w, g)
        cin = w
    sd["fc.weight"] = torch.randn(1000, 512, generator=g) * 0.01
    sd["fc.bias"] = torch.zeros(1000)
    return sd


def resnet18_reference(x: torch.Tensor, sd: dict) -> torch.Tensor:
    """ResNet-18 (He et al. 2016, Table 1; torchvision's layout) in functional ops, eval mode:
    the 512-d pooled embedding."""
    x = F.relu(_bn_f(F.conv2d(x, sd["conv1.weight"], stride=2, padding=3), sd, "bn1"))
    x = F.max_pool2d(x, 3, 2, 1)
    for i in range(1, 5):
        for b in range(2):
            p = f"layer{i}.{b}"
            stride = 2 if (b == 0 and i > 1) else 1
            out = F.relu(_bn_f(F.conv2d(x, sd[f"{p}.conv1.weight"], stride=stride, padding=1),
                               sd, f"{p}.bn1"))  # fmt: skip
            out = _bn_f(F.conv2d(out, sd[f"{p}.conv2.weight"], padding=1), sd, f"{p}.bn2")
            short = x
            if f"{p}.downsample.0.weight" in sd:
                short = _bn_f(F.conv2d(x, sd[f"{p}.downsample.0.weight"], stride=stride), sd,
                              f"{p}.downsample.1")  # fmt: skip
            x = F.relu(out + short)
    return x.mean(dim=(2, 3))


RESNET_FAN_INS = [3 * 49] + [9 * w for w in RESNET_WIDTHS for _ in range(4)] + [512]


@pytest.mark.parametrize("fmt", ["torchvision", "timm", "auto"])
def test_resnet18_reads_torchvision_and_timm_layouts(tmp_path, fmt, caplog):
    """torchvision's and timm's resnet18 share their names: either format (and auto) loads
    the file, the model then computes the reference ResNet-18 with those tensors, and the
    checkpoint's 1000-class fc is dropped (the log says so) for a new 7-class classifier."""
    sd = torchvision_resnet18()
    path = _save(tmp_path, sd)
    torch.manual_seed(3)
    keys = {} if fmt == "auto" else {"weights_format": fmt}
    with caplog.at_level(logging.INFO, logger="fedshift"):
        model = _build("resnet18", path, 7, (3, 64, 64), **keys).eval()
    assert "fc.weight, fc.bias) dropped" in caplog.text
    assert "torchvision layout" in caplog.text or "timm layout" in caplog.text
    x = torch.rand(2, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        got = model(x).double()
        d64 = {k: v.double() if v.is_floating_point() else v for k, v in sd.items()}
        emb = resnet18_reference(x.double(), d64)
        head = model.classifier
        ref = emb @ head.weight.double().T + head.bias.double()
    assert head.weight.shape == (7, 512)
    torch.testing.assert_close(got, ref, rtol=0, atol=_bound(ref, RESNET_FAN_INS))


def test_resnet18_fedshift_layout_unchanged_by_auto(tmp_path):
    """A file of fedshift's own names loads under auto exactly as before the key existed, and
    the resolved config leaves auto out (configs and digests unchanged)."""
    torch.manual_seed(0)
    src = build_model({"name": "resnet18"}, 4, (3, 32, 32))
    path = _save(tmp_path, src.state_dict())
    assert "weights_format" not in resolve_weights({"weights": str(path)})
    assert "weights_format" not in resolve_weights({"weights": str(path), "weights_format": "auto"})
    torch.manual_seed(9)
    model = _build("resnet18", path, 4, (3, 32, 32))
    for k, v in src.state_dict().items():
        assert torch.equal(model.state_dict()[k], v), k


def test_wrong_architecture_names_keys_count_and_fix(tmp_path):
    """A torchvision file of another depth (a resnet34-like extra block) and a file with a
    tensor missing: one-line errors naming the keys, how many, and the fix."""
    sd = torchvision_resnet18()
    g = torch.Generator().manual_seed(5)
    extra = {f"layer1.2.conv{i}.weight": _conv(g, 64, 64, 3) for i in (1, 2)}
    path = _save(tmp_path, {**sd, **extra}, "deeper.pt")
    with pytest.raises(ConfigError) as e:
        _build("resnet18", path, 3, (3, 64, 64), weights_format="torchvision")
    msg = str(e.value)
    assert "\n" not in msg
    assert "layer1.2.conv1.weight (-> stages.layer1.2.conv1.weight)" in msg
    assert "model.weights_format" in msg and "torchvision" in msg
    # auto: the file is closest to the torchvision layout; the error says so
    with pytest.raises(ConfigError, match=r"read in the torchvision layout.*not in the model"):
        _build("resnet18", path, 3, (3, 64, 64))
    cut = {k: v for k, v in sd.items() if not k.startswith("layer4")}
    path = _save(tmp_path, cut, "cut.pt")
    with pytest.raises(ConfigError, match=r"missing from the file: stages\.layer4.*\(\d+ in all\)"):
        _build("resnet18", path, 3, (3, 64, 64), weights_format="timm")


def test_alexnet_has_no_foreign_layout(tmp_path):
    """fedshift's AlexNet is FedBN's (BN after every layer): torchvision's alexnet is another
    network, and the error says why and which models have key maps."""
    path = _save(tmp_path, {"features.0.weight": torch.zeros(64, 3, 11, 11)})
    with pytest.raises(ConfigError, match=r"cannot read the torchvision layout.*BatchNorm"):
        _build("alexnet", path, 3, (3, 64, 64), weights_format="torchvision")


def test_auto_refuses_a_file_two_layouts_read_differently(tmp_path, monkeypatch):
    """auto never guesses: a file that fits two declared layouts with different tensors is a
    ConfigError asking for model.weights_format."""
    swapped = keymaps_mod.KeyMap(
        rules=(
            (r"layer1\.0\.(.+)", r"stages.layer1.1.\1"),
            (r"layer1\.1\.(.+)", r"stages.layer1.0.\1"),
            *keymaps_mod.KEY_MAPS["resnet18"]["torchvision"].rules,
        ),
        head=("fc.",),
    )
    monkeypatch.setitem(
        keymaps_mod.KEY_MAPS, "resnet18",
        {"torchvision": keymaps_mod.KEY_MAPS["resnet18"]["torchvision"], "timm": swapped},
    )  # fmt: skip
    path = _save(tmp_path, torchvision_resnet18())
    with pytest.raises(ConfigError, match=r"several layouts.*torchvision, timm.*weights_format"):
        _build("resnet18", path, 3, (3, 64, 64))


def test_weights_format_is_checked():
    with pytest.raises(ConfigError, match="weights_format' must be one of auto"):
        resolve_weights({"weights": __file__, "weights_format": "keras"})


# ----------------------------------------------------------------------------- DenseNet-121
DENSE_BLOCKS, GROWTH = (6, 12, 24, 16), 32


def torchvision_densenet121(legacy: bool, seed: int = 0) -> dict[str, torch.Tensor]:
    """A state dict in torchvision's ``densenet121`` names (features.conv0, norm0,
    denseblockB.denselayerL.{norm1,conv1,norm2,conv2}, transitionB.{norm,conv}, norm5,
    classifier); ``legacy``: the dotted ``norm.1`` / ``conv.1`` of its older files, without
    num_batches_tracked."""
    g = torch.Generator().manual_seed(seed)
    sd: dict[str, torch.Tensor] = {"features.conv0.weight": _conv(g, 64, 3, 7)}
    _bn(sd, "features.norm0", 64, g, tracked=not legacy)
    c = 64
    dot = "." if legacy else ""
    for b, layers in enumerate(DENSE_BLOCKS, start=1):
        for i in range(1, layers + 1):
            p = f"features.denseblock{b}.denselayer{i}"
            _bn(sd, f"{p}.norm{dot}1", c, g, tracked=not legacy)
            sd[f"{p}.conv{dot}1.weight"] = _conv(g, 4 * GROWTH, c, 1)
            _bn(sd, f"{p}.norm{dot}2", 4 * GROWTH, g, tracked=not legacy)
            sd[f"{p}.conv{dot}2.weight"] = _conv(g, GROWTH, 4 * GROWTH, 3)
            c += GROWTH
        if b < len(DENSE_BLOCKS):
            _bn(sd, f"features.transition{b}.norm", c, g, tracked=not legacy)
            sd[f"features.transition{b}.conv.weight"] = _conv(g, c // 2, c, 1)
            c //= 2
    _bn(sd, "features.norm5", c, g, tracked=not legacy)
    sd["classifier.weight"] = torch.randn(1000, c, generator=g) * 0.01
    sd["classifier.bias"] = torch.zeros(1000)
    return sd


def densenet121_reference(x: torch.Tensor, sd: dict, legacy: bool) -> torch.Tensor:
    """DenseNet-121 (Huang et al. 2017, Table 1) in functional ops, eval mode: the embedding."""
    dot = "." if legacy else ""
    x = F.relu(_bn_f(F.conv2d(x, sd["features.conv0.weight"], stride=2, padding=3), sd,
                     "features.norm0"))  # fmt: skip
    x = F.max_pool2d(x, 3, 2, 1)
    for b, layers in enumerate(DENSE_BLOCKS, start=1):
        for i in range(1, layers + 1):
            p = f"features.denseblock{b}.denselayer{i}"
            new = F.conv2d(F.relu(_bn_f(x, sd, f"{p}.norm{dot}1")), sd[f"{p}.conv{dot}1.weight"])
            new = F.conv2d(F.relu(_bn_f(new, sd, f"{p}.norm{dot}2")),
                           sd[f"{p}.conv{dot}2.weight"], padding=1)  # fmt: skip
            x = torch.cat([x, new], 1)
        if b < len(DENSE_BLOCKS):
            t = f"features.transition{b}"
            x = F.avg_pool2d(F.conv2d(F.relu(_bn_f(x, sd, f"{t}.norm")), sd[f"{t}.conv.weight"]), 2)
    return F.relu(_bn_f(x, sd, "features.norm5")).mean(dim=(2, 3))


@pytest.mark.parametrize("legacy", [False, True])
def test_densenet121_reads_torchvision_layouts(tmp_path, legacy):
    """torchvision's densenet121 names (and its older files' dotted ones) load into
    fedshift's densenet121, which then computes the reference DenseNet-121."""
    sd = torchvision_densenet121(legacy)
    path = _save(tmp_path, sd)
    torch.manual_seed(0)
    model = _build("densenet121", path, 2, (3, 64, 64)).eval()
    x = torch.rand(2, 3, 64, 64, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        got = model(x).double()
        d64 = {k: v.double() if v.is_floating_point() else v for k, v in sd.items()}
        emb = densenet121_reference(x.double(), d64, legacy)
        ref = emb @ model.classifier.weight.double().T + model.classifier.bias.double()
    fan_ins = [3 * 49] + [1024] * (2 * sum(DENSE_BLOCKS))  # 1x1 convs up to 1024 inputs
    torch.testing.assert_close(got, ref, rtol=0, atol=_bound(ref, fan_ins))
