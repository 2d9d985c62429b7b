"""Models and transforms of the real benchmarks: FedBN's / FedFA's AlexNet-BN, ResNet-18 and
FedBN's Office / DomainNet training transforms (``flip_rotate``): shapes, hook placement,
names, parameter counts by hand formula, input checks; flip/rotation draws, exact rotations,
label maps following the images, and 1-round runs on toyshift and toyseg."""

from __future__ import annotations

import json
import math

import pytest
import torch
from torch import nn

from fedshift.augment import AUGMENTS, build_augments
from fedshift.augment.ffa import stage_channels
from fedshift.augment.geometric import FlipRotate, FlipRotateParams, flip_rotate, rotation_theta
from fedshift.catalog import resolve
from fedshift.cli import main
from fedshift.core.config import load_config
from fedshift.core.errors import ConfigError
from fedshift.models import build_model
from fedshift.models.alexnet import AlexNetBN
from fedshift.models.resnet import ResNet18
from fedshift.runtime.simulation import run_experiment

CLS = "classification"
SEG = "segmentation"


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def record_stages(model) -> dict[str, tuple[int, ...]]:
    """Install identity hooks on every stage; they record what they see."""
    seen: dict[str, tuple[int, ...]] = {}
    for name in model.stage_names:

        def hook(x, name=name):
            seen[name] = tuple(x.shape)
            return x

        model.stage_hooks[name] = hook
    return seen


# ----------------------------------------------------------------------------- AlexNet
def alexnet_param_total(h: int, k: int, cin: int = 3) -> int:
    """Hand count: conv weights k*k*cin*cout + bias cout; BN weight + bias; FC fin*fout + fout."""
    convs = [(11, cin, 64), (5, 64, 192), (3, 192, 384), (3, 384, 256), (3, 256, 256)]
    conv = sum(kk * kk * a * b + b + 2 * b for kk, a, b in convs)
    fc = (9216 * h + h) + 2 * h + (h * h + h) + 2 * h + (h * k + k)
    return conv + fc


@pytest.mark.parametrize(("hidden", "classes"), [(4096, 10), (1024, 10), (1024, 345)])
def test_alexnet_param_counts_by_formula(hidden, classes):
    with torch.device("meta"):  # no memory, no init: the count only
        model = AlexNetBN(num_classes=classes, hidden=hidden)
    assert n_params(model) == alexnet_param_total(hidden, classes)
    assert n_params(model.stages) == 2_472_000


def test_alexnet_param_count_figures():
    assert alexnet_param_total(4096, 10) == 57_063_498  # FedBN's model
    assert alexnet_param_total(1024, 10) == 12_974_154  # FedFA's model


def test_alexnet_default_is_fedbn_width():
    with torch.device("meta"):
        model = build_model({"name": "alexnet"}, 10, (3, 256, 256), CLS)
    assert model.hidden == 4096 and model.classifier.in_features == 4096
    assert model.embed.fc1.in_features == 9216


def test_alexnet_stage_shapes_are_fedfa_insertion_points():
    torch.manual_seed(0)
    model = build_model({"name": "alexnet", "hidden": 16}, 10, (3, 256, 256), CLS).eval()
    seen = record_stages(model)
    x = torch.rand(2, 3, 256, 256)
    z = model.features(x)
    # FedFA's FFA layers: after pool1, pool2, conv3, conv4 and pool5 (before the avg-pool)
    assert seen == {
        "conv1": (2, 64, 31, 31),
        "conv2": (2, 192, 15, 15),
        "conv3": (2, 384, 15, 15),
        "conv4": (2, 256, 15, 15),
        "conv5": (2, 256, 7, 7),
    }
    assert z.shape == (2, 16)
    assert torch.equal(model.head(z), model(x)) and model(x).shape == (2, 10)
    # FFA reads one channel count per stage from it
    assert [stage_channels(model, s) for s in model.stage_names] == [64, 192, 384, 256, 256]


def test_alexnet_conv5_hook_acts_before_the_adaptive_pool():
    torch.manual_seed(0)
    model = AlexNetBN(num_classes=3, hidden=8).eval()
    x = torch.rand(2, 3, 96, 80)  # non-square, pool5 gives 2x1 maps
    got = {}

    def hook(h):
        got["in"] = h
        return h * 0 + torch.arange(h.shape[-1], dtype=h.dtype)  # column index

    model.stage_hooks["conv5"] = hook
    z = model.features(x)
    assert got["in"].shape == (2, 256, 2, 1)
    ramp = torch.zeros(2, 256, 2, 1)
    expected = model.embed(torch.flatten(nn.functional.adaptive_avg_pool2d(ramp, 6), 1))
    assert torch.allclose(z, expected)


def test_alexnet_names_and_bn_layers():
    with torch.device("meta"):
        model = AlexNetBN(hidden=8)
    assert model.stage_names == ["conv1", "conv2", "conv3", "conv4", "conv5"]
    children = {n: list(dict(s.named_children())) for n, s in model.stages.items()}
    assert children == {
        "conv1": ["conv1", "bn1", "relu1", "maxpool1"],
        "conv2": ["conv2", "bn2", "relu2", "maxpool2"],
        "conv3": ["conv3", "bn3", "relu3"],
        "conv4": ["conv4", "bn4", "relu4"],
        "conv5": ["conv5", "bn5", "relu5", "maxpool5"],
    }
    assert model.bn_layer_names() == [
        "stages.conv1.bn1", "stages.conv2.bn2", "stages.conv3.bn3", "stages.conv4.bn4",
        "stages.conv5.bn5", "embed.bn6", "embed.bn7",
    ]  # fmt: skip
    assert list(dict(model.embed.named_children())) == [
        "fc1", "bn6", "relu6", "fc2", "bn7", "relu7"
    ]  # fmt: skip
    assert isinstance(model.classifier, nn.Linear)
    assert not any(isinstance(m, nn.Dropout) for m in model.modules())
    conv = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
    assert [(c.kernel_size[0], c.stride[0], c.padding[0]) for c in conv] == [
        (11, 4, 2), (5, 1, 2), (3, 1, 1), (3, 1, 1), (3, 1, 1)
    ]  # fmt: skip
    pools = [m for m in model.stages.modules() if isinstance(m, nn.MaxPool2d)]
    assert [(p.kernel_size, p.stride) for p in pools] == [(3, 2)] * 3


def test_alexnet_check_input_reasons():
    assert AlexNetBN.check_input((3, 256, 256), CLS) is None
    assert AlexNetBN.check_input((3, 63, 300), CLS) is None  # the smallest size that works
    assert "63" in AlexNetBN.check_input((3, 62, 256), CLS)
    assert "63" in AlexNetBN.check_input((3, 256, 62), CLS)
    assert "segmentation" in AlexNetBN.check_input((3, 256, 256), SEG)
    assert "(C, H, W)" in AlexNetBN.check_input((256, 256), CLS)
    with pytest.raises(ConfigError, match=r"model\.name.*dataset\.size to at least 63"):
        build_model({"name": "alexnet"}, 10, (3, 28, 28), CLS)
    with pytest.raises(ConfigError, match=r"model\.hidden"):
        build_model({"name": "alexnet", "hidden": 0}, 10, (3, 64, 64), CLS)
    # the boundary is real: 63 runs, 62 does not
    model = AlexNetBN(num_classes=2, hidden=4).eval()
    assert model(torch.rand(1, 3, 63, 63)).shape == (1, 2)
    with pytest.raises(RuntimeError):
        model(torch.rand(1, 3, 62, 62))


# ----------------------------------------------------------------------------- ResNet-18
def resnet_param_total(k: int, w: int = 64, small: bool = False, cin: int = 3) -> int:
    """Hand count: bias-free convs, BN weight + bias, 2 blocks per group, projections where
    the width changes, classifier Linear(8w, k)."""
    bn = 2
    total = (9 if small else 49) * cin * w + bn * w
    c = w
    for i in range(4):
        d = w * 2**i
        for b in range(2):
            a = c if b == 0 else d
            total += 9 * a * d + bn * d + 9 * d * d + bn * d
            if b == 0 and a != d:
                total += a * d + bn * d
        c = d
    return total + 8 * w * k + k


def test_resnet18_param_counts_by_formula():
    with torch.device("meta"):
        imagenet = ResNet18(num_classes=1000)
        ten = ResNet18(num_classes=10)
        small = ResNet18(num_classes=10, small_input=True)
        narrow = ResNet18(num_classes=7, width=16, in_channels=1)
    assert n_params(imagenet) == 11_689_512 == resnet_param_total(1000)  # torchvision's count
    assert n_params(ten) == 11_181_642 == resnet_param_total(10)
    assert n_params(small) == resnet_param_total(10, small=True) == 11_181_642 - 3 * 64 * 40
    assert n_params(narrow) == resnet_param_total(7, w=16, cin=1)


def test_resnet18_bn_names():
    with torch.device("meta"):
        model = ResNet18(num_classes=10)
    names = model.bn_layer_names()
    assert len(names) == 20
    assert names[:4] == [
        "stages.stem.bn1", "stages.layer1.0.bn1", "stages.layer1.0.bn2", "stages.layer1.1.bn1"
    ]  # fmt: skip
    assert [n for n in names if "downsample" in n] == [
        f"stages.layer{i}.0.downsample.1" for i in (2, 3, 4)
    ]
    assert model.stage_names == ["stem", "layer1", "layer2", "layer3", "layer4"]
    assert list(dict(model.stages.stem.named_children())) == ["conv1", "bn1", "relu", "maxpool"]
    assert list(dict(model.stages.layer4.named_children())) == ["0", "1", "avgpool"]


@pytest.mark.parametrize(
    ("small", "size", "sizes"),
    [
        (False, 224, [56, 56, 28, 14, 1]),
        (True, 32, [32, 32, 16, 8, 1]),
        (False, 32, [8, 8, 4, 2, 1]),
    ],
)
def test_resnet18_stage_shapes(small, size, sizes):
    torch.manual_seed(0)
    section = {"name": "resnet18", "width": 8, "small_input": small}
    model = build_model(section, 5, (3, size, size), CLS).eval()
    seen = record_stages(model)
    x = torch.rand(2, 3, size, size)
    z = model.features(x)
    widths = [8, 8, 16, 32, 64]
    assert seen == {
        n: (2, c, s, s) for n, c, s in zip(model.stage_names, widths, sizes, strict=True)
    }
    assert z.shape == (2, 64) and isinstance(model.embed, nn.Identity)
    assert torch.equal(model.head(z), model(x)) and model(x).shape == (2, 5)
    assert ("maxpool" in dict(model.stages.stem.named_children())) is not small
    assert model.stages.stem.conv1.kernel_size == ((3, 3) if small else (7, 7))


def test_resnet18_block_is_residual():
    torch.manual_seed(0)
    model = ResNet18(num_classes=3, width=4).eval()
    for bn in model.modules():  # non-trivial BN so a wrong order would show
        if isinstance(bn, nn.BatchNorm2d):
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 2.0)
            bn.weight.data.uniform_(0.5, 1.5)
            bn.bias.data.uniform_(-0.2, 0.2)
    x = torch.randn(2, 4, 8, 8)
    for block, inp in ((model.stages.layer1[0], x), (model.stages.layer2[0], x)):
        relu = torch.relu
        main_path = block.bn2(block.conv2(relu(block.bn1(block.conv1(inp)))))
        short = inp if block.downsample is None else block.downsample(inp)
        assert torch.allclose(block(inp), relu(main_path + short), atol=1e-6)
    assert model.stages.layer1[0].downsample is None
    assert model.stages.layer2[0].conv1.stride == (2, 2)
    assert model.stages.layer2[0].downsample[0].stride == (2, 2)


def test_resnet18_kaiming_fan_out_init():
    torch.manual_seed(0)
    model = ResNet18(num_classes=10)
    s = model.stages

    def std(conv):
        return float(conv.weight.detach().std())

    # fan_out = C_out * k * k (fan_in would give 0.1166, 0.0589, 0.177)
    assert std(s.stem.conv1) == pytest.approx(math.sqrt(2 / (64 * 49)), rel=0.03)
    assert std(s.layer2[0].conv1) == pytest.approx(math.sqrt(2 / (128 * 9)), rel=0.03)
    assert std(s.layer2[0].downsample[0]) == pytest.approx(math.sqrt(2 / 128), rel=0.05)
    assert abs(float(s.layer2[0].conv1.weight.detach().mean())) < 0.002  # normal, not uniform(0, b)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):  # zero_init_residual=False: every gamma is 1
            assert torch.equal(m.weight, torch.ones_like(m.weight))
            assert torch.equal(m.bias, torch.zeros_like(m.bias))
    bias = model.classifier.bias  # PyTorch's default linear init
    assert bias.abs().max() <= 1 / math.sqrt(512) and bias.abs().max() > 0


def test_resnet18_check_input_and_params():
    assert ResNet18.check_input((3, 32, 32), CLS) is None
    assert "segmentation" in ResNet18.check_input((3, 32, 32), SEG)
    assert "(C, H, W)" in ResNet18.check_input((32, 32), CLS)
    with pytest.raises(ConfigError, match=r"model\.name"):
        build_model({"name": "resnet18"}, 2, (3, 32, 32), SEG)
    with pytest.raises(ConfigError, match=r"model\.width"):
        build_model({"name": "resnet18", "width": 0}, 2, (3, 32, 32), CLS)
    with pytest.raises(ConfigError, match=r"model\.small_input"):
        build_model({"name": "resnet18", "small_input": "yes"}, 2, (3, 32, 32), CLS)


# ----------------------------------------------------------------------------- flip_rotate
def augment(**kw) -> FlipRotate:
    return FlipRotate(FlipRotateParams(**kw), seed=0, num_classes=3)


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_flip_rotate_is_registered_for_both_tasks():
    entry = AUGMENTS.entry("flip_rotate", key="augment")
    assert entry.obj is FlipRotate and entry.params is FlipRotateParams
    assert set(FlipRotate.tasks) == {CLS, SEG}
    p = FlipRotateParams()
    assert (p.flip, p.degrees, p.interpolation) == (0.5, 30.0, "bilinear")
    (aug,) = build_augments([{"name": "flip_rotate", "degrees": 10.0}], 0, 3)
    assert isinstance(aug, FlipRotate) and aug.params.degrees == 10.0


def test_flip_rotate_is_deterministic_given_the_generator():
    x, y = torch.rand(6, 3, 12, 10), torch.arange(6)
    a = augment().train_batch(x, y, {}, gen(1))[0]
    b = augment().train_batch(x, y, {}, gen(1))[0]
    c = augment().train_batch(x, y, {}, gen(2))[0]
    assert torch.equal(a, b) and not torch.allclose(a, c)


def test_flip_rotate_draw_protocol_flips_then_angles_per_image():
    x, y = torch.rand(8, 3, 10, 10), torch.arange(8)
    out, _ = augment(flip=0.5, degrees=20.0).train_batch(x, y, {}, gen(3))
    g = gen(3)
    flips = torch.rand(8, generator=g) < 0.5
    angles = (2 * torch.rand(8, generator=g, dtype=torch.float64) - 1) * 20.0
    assert 0 < int(flips.sum()) < 8 and angles.abs().max() <= 20.0 and angles.std() > 1.0
    assert torch.equal(out, flip_rotate(x, y, flips, angles)[0])
    # one draw per image: a batch of one image repeated comes out different per sample
    same = augment(flip=0.0).train_batch(x[:1].repeat(4, 1, 1, 1), y[:4], {}, gen(0))[0]
    assert not torch.allclose(same[0], same[1])


def test_flip_rotate_identity_when_switched_off_and_at_eval():
    x, y = torch.rand(4, 3, 9, 11), torch.randint(0, 3, (4, 9, 11))
    g = gen(5)
    before = g.get_state()
    out_x, out_y = augment(flip=0.0, degrees=0.0).train_batch(x, y, {}, g)
    assert torch.equal(out_x, x) and torch.equal(out_y, y)
    assert torch.equal(g.get_state(), before)  # nothing drawn: same as no augment
    assert augment().eval_batch(x, {}) is x


def test_flip_only_mirrors_exactly_and_keeps_class_labels():
    x, y = torch.rand(5, 3, 7, 6), torch.tensor([0, 1, 2, 1, 0])
    out_x, out_y = augment(flip=1.0, degrees=0.0).train_batch(x, y, {}, gen(0))
    assert torch.equal(out_x, x.flip(-1)) and out_y is y
    soft = torch.softmax(torch.randn(5, 3), 1)  # soft labels from an earlier augment
    assert augment().train_batch(x, soft, {}, gen(0))[1] is soft
    maps = torch.randint(0, 3, (5, 7, 6))
    out_maps = augment(flip=1.0, degrees=0.0).train_batch(x, maps, {}, gen(0))[1]
    assert torch.equal(out_maps, maps.flip(-1))


@pytest.mark.parametrize("k", [1, 2, 3, -1])
def test_right_angle_rotations_equal_rot90(k):
    x = torch.rand(3, 2, 8, 8)
    y = torch.randint(0, 4, (3, 8, 8))
    angles = torch.full((3,), 90.0 * k)
    want_x, want_y = torch.rot90(x, k, (-2, -1)), torch.rot90(y, k, (-2, -1))
    near_x, near_y = flip_rotate(x, y, None, angles, "nearest")
    assert torch.equal(near_x, want_x) and torch.equal(near_y, want_y)
    bil_x, bil_y = flip_rotate(x, y, None, angles, "bilinear")
    assert torch.allclose(bil_x, want_x, atol=1e-5)
    assert torch.equal(bil_y, want_y)  # label maps are always sampled nearest
    assert bil_y.dtype == torch.int64


def test_rotation_of_a_non_square_image_is_rigid():
    # 4x6 image, centre (1.5, 2.5): +90 degrees (counter-clockwise as displayed) takes the
    # pixel at row 0, column 3 (dx = 0.5, dy = -1.5) to column 2.5 + dy = 1, row 1.5 - dx = 1
    x = torch.zeros(1, 1, 4, 6)
    x[0, 0, 0, 3] = 1.0
    y = x[:, 0].long() * 2
    out_x, out_y = flip_rotate(x, y, None, torch.tensor([90.0]), "nearest")
    assert out_x[0, 0].nonzero().tolist() == [[1, 1]]
    assert out_y[0].nonzero().tolist() == [[1, 1]] and int(out_y.max()) == 2
    half_turn = flip_rotate(x, y, None, torch.tensor([180.0]))[1]
    assert torch.equal(half_turn, torch.rot90(y, 2, (-2, -1)))
    theta = rotation_theta(torch.tensor([90.0]), 4, 6)
    assert torch.allclose(theta, torch.tensor([[[0.0, -4 / 6, 0.0], [6 / 4, 0.0, 0.0]]]).double())


def test_rotation_fills_with_zero_and_background():
    x = torch.ones(1, 3, 16, 16)
    y = torch.ones(1, 16, 16, dtype=torch.long)
    out_x, out_y = flip_rotate(x, y, None, torch.tensor([45.0]))
    for img in (out_x[0, 0], out_y[0].float()):
        assert float(img[0, 0]) == 0.0 and float(img[-1, -1]) == 0.0  # corners come from outside
        assert float(img[8, 8]) == 1.0  # the centre stays inside


@pytest.mark.parametrize("interpolation", ["nearest", "bilinear"])
def test_segmentation_label_maps_move_with_the_images(interpolation):
    n, h, w = 16, 12, 10
    x = torch.zeros(n, 1, h, w)
    y = torch.zeros(n, h, w, dtype=torch.long)
    rows = torch.randint(4, 8, (n,), generator=gen(0))
    cols = torch.randint(3, 7, (n,), generator=gen(1))
    for i in range(n):  # a marked 3x3 block per image, near the centre (stays inside)
        r, c = int(rows[i]), int(cols[i])
        x[i, 0, r - 1 : r + 2, c - 1 : c + 2] = 1.0
        y[i, r - 1 : r + 2, c - 1 : c + 2] = 2
    aug = augment(flip=0.5, degrees=180.0, interpolation=interpolation)
    out_x, out_y = aug.train_batch(x, y, {}, gen(7))
    assert out_y.shape == y.shape and out_y.dtype == torch.long
    assert set(out_y.unique().tolist()) == {0, 2}
    marked = out_y == 2
    assert marked.flatten(1).any(1).all()  # every image keeps its block
    if interpolation == "nearest":  # the same grid, the same rounding
        assert torch.equal(out_x[:, 0], marked.float())
    else:  # the nearest source pixel is within half a pixel: its bilinear weight is >= 1/4
        assert float(out_x[:, 0][marked].min()) >= 0.25 - 1e-6
        assert not bool(marked[out_x[:, 0] == 0].any())  # no neighbour in the block: background
    ii, rr, cc = marked.nonzero(as_tuple=True)
    count = torch.bincount(ii, minlength=n).float()
    r_mean = torch.bincount(ii, rr.float(), minlength=n) / count
    c_mean = torch.bincount(ii, cc.float(), minlength=n) / count
    moved = ((r_mean - rows).abs() + (c_mean - cols).abs()) > 1.0
    assert int(moved.sum()) >= n // 2  # the blocks did move


def test_label_map_of_the_wrong_size_is_an_error():
    with pytest.raises(ValueError, match="label maps"):
        flip_rotate(torch.rand(2, 3, 8, 8), torch.zeros(2, 8, 7, dtype=torch.long), None, None)


@pytest.mark.parametrize(
    ("entry", "key"),
    [
        ("{name: flip_rotate, flip: 1.5}", "augment.flip_rotate.flip"),
        ("{name: flip_rotate, degrees: -1}", "augment.flip_rotate.degrees"),
        ("{name: flip_rotate, degrees: 200}", "augment.flip_rotate.degrees"),
        ("{name: flip_rotate, interpolation: bicubic}", "interpolation'.*bicubic"),
    ],
)
def test_flip_rotate_bad_params_are_config_errors(make_cfg, entry, key):
    with pytest.raises(ConfigError, match=key):
        make_cfg(f"augment=[{entry}]")


# ----------------------------------------------------------------------------- end to end
def test_flip_rotate_runs_on_toyshift_via_the_cli(tmp_path):
    over = ["dataset.name=toyshift", "model.name=cnn", "train.rounds=1", "train.batch_size=16"]
    over += ["name=fr", "augment=[flip_rotate]"]
    assert main(["run", *over, "--out", str(tmp_path), "--quiet"]) == 0
    (run_dir,) = (tmp_path / "fr").iterdir()
    s = json.loads((run_dir / "summary.json").read_text())
    assert s["rounds"] == 1 and 0.0 <= s["test_mean"] <= 1.0
    rows = [json.loads(r) for r in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert rows and all(math.isfinite(r["train_loss"]) for r in rows)


def test_flip_rotate_runs_on_toyseg_via_the_cli(tmp_path):
    over = ["dataset.name=toyseg", "dataset.train_size=12", "dataset.val_size=4"]
    over += ["dataset.test_size=4", "model.name=unet", "model.width=4", "train.rounds=1"]
    over += ["train.batch_size=6", "train.optimizer=adam", "train.lr=0.003", "name=frs"]
    over += ["augment=[{name: flip_rotate, degrees: 45}]"]
    assert main(["run", *over, "--out", str(tmp_path), "--quiet"]) == 0
    (run_dir,) = (tmp_path / "frs").iterdir()
    s = json.loads((run_dir / "summary.json").read_text())
    assert s["task"] == SEG and s["metric"] == "dice" and 0.0 <= s["test_mean"] <= 1.0


def test_switched_off_augment_equals_no_augment_and_default_changes_training(tmp_path):
    def run(name: str, *over: str) -> str:
        base = ["dataset.name=toyshift", "model.name=cnn", "train.rounds=1", "name=t"]
        cfg = resolve(load_config(None, [*base, "train.batch_size=16", *over]))
        run_experiment(cfg, run_dir=tmp_path / name, progress=False)
        return (tmp_path / name / "metrics.jsonl").read_text()

    plain = run("plain")
    assert run("off", "augment=[{name: flip_rotate, flip: 0, degrees: 0}]") == plain
    assert run("on", "augment=[flip_rotate]") != plain


def test_moon_projection_wraps_alexnet_after_its_adaptive_pool():
    from fedshift.algorithms.moon import ProjectedModel
    from fedshift.models import build_model

    backbone = build_model({"name": "alexnet", "hidden": 32}, 10, (3, 64, 64))
    wrapped = ProjectedModel(backbone, 16, 10)
    x = torch.rand(2, 3, 64, 64)
    assert wrapped.features(x).shape == (2, 16)
    assert wrapped(x).shape == (2, 10)
