"""DenseNet-121 for histology patches (HarmoFL's Camelyon17 classifier).

Huang, Liu, van der Maaten & Weinberger, "Densely Connected Convolutional Networks", CVPR 2017:
the DenseNet-BC of Sec. 3 and Table 1 (ImageNet column, 121 layers).

* Stem: conv7x7 stride 2 pad 3 (no bias) -> BN -> ReLU -> max-pool 3x3 stride 2 pad 1.
* Dense connectivity (Sec. 3, "Dense connectivity"): layer l of a block receives the
  concatenation [x_0, ..., x_{l-1}] and adds ``growth`` (k) feature maps.
* Bottleneck layers (Sec. 3, "Bottleneck layers", DenseNet-B): H_l = BN -> ReLU ->
  conv1x1 (``bn_size`` * k maps) -> BN -> ReLU -> conv3x3 pad 1 (k maps), all convolutions
  bias-free; dropout with ``drop_rate`` on the new maps (0 in the paper's ImageNet models).
* Transition layers with compression theta = 0.5 (Sec. 3, "Compression", DenseNet-C):
  BN -> ReLU -> conv1x1 (floor(m / 2) maps) -> 2x2 average pool stride 2.
* After the last block: BN -> ReLU -> global average pool -> linear classifier.

With the defaults (k = 32, blocks (6, 12, 24, 16), 64 stem features, bn_size 4) the network
has the paper's 121 weight layers (the stem conv, 2 x 58 dense-layer convs, 3 transition convs
and the classifier), 121 BatchNorm layers (stem, 2 x 58, 3 transitions, final) and a 1024-d
embedding. On 3x96x96 patches the stem gives
24x24 maps and blocks 1..4 run at 24, 12, 6 and 3 pixels.

Stages (``FedModel.stage_hooks`` attach to their outputs): ``stem``; ``block1`` .. ``block3``
= dense block i + transition i (output halved in size and channels); ``block4`` = the last
dense block + final BN (``bn5``) + ReLU + global average pool, so its output is
(B, 1024, 1, 1) and the base class's flatten gives the (B, 1024) embedding (``embed`` is the
identity, ``classifier`` = Linear(1024, num_classes)). A feature-level layer that needs
spatial statistics (FFA, MixStyle) therefore belongs after ``stem`` .. ``block3``; on
``block4`` it sees 1x1 maps.

Released code (med-air/HarmoFL @63182fe, ``nets/models.py``), as options:

* ``released_padding=True``: the released model inserts ``ZeroPad2d(2)`` after the first
  dense block (before transition 1), so 96x96 patches run blocks 2..4 at 14, 7 and 3 pixels;
  the paper's DenseNet has no such padding (default False). The padding is the child ``pad``
  of ``block1``.
* ``bn="harmofl"``: every BatchNorm is ``BatchNorm2d(affine=False, track_running_stats=False)``
  (no parameters, no running buffers; evaluation normalises with batch statistics).
* The released model applies HarmoFL's amplitude normalisation inside ``forward``; here that
  is the ``ampnorm`` augment.

Initialisation, as the official DenseNet code (torchvision's ``densenet.py``, copied into
HarmoFL with the comment "Official init from torch repo"): every conv weight
``kaiming_normal_`` (fan-in, gain sqrt(2): std = sqrt(2 / fan_in)), BN weight 1 and bias 0,
linear bias 0 (the linear weight keeps PyTorch's default uniform initialisation).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from fedshift.core.bounds import bounded, bounds
from fedshift.core.errors import ConfigError
from fedshift.models.base import AdaptiveAvgPool2d, FedModel, classifier_input_reason
from fedshift.models.normfree import NormFreeParams
from fedshift.models.unet import batch_norm, check_bn

BNKind = Literal["standard", "harmofl"]
#: smallest H and W: the stem and three transitions divide the size by 32
MIN_SIZE = 32


@dataclass
class DenseNetParams(NormFreeParams):
    """Parameters of the ``densenet121`` model (config keys ``model.*``)."""

    #: growth rate k (feature maps added by each dense layer)
    growth: int = bounded(32, ge=1)
    #: number of dense layers in each block (DenseNet-121: 6, 12, 24, 16)
    blocks: list[int] = field(default_factory=lambda: [6, 12, 24, 16], metadata=bounds(ge=1))
    #: feature maps of the stem convolution
    init_features: int = bounded(64, ge=1)
    #: bottleneck width factor: the 1x1 conv gives bn_size * k maps
    bn_size: int = bounded(4, ge=1)
    #: dropout probability on each dense layer's new maps
    drop_rate: float = bounded(0.0, ge=0, lt=1)
    #: "standard" BatchNorm2d, or HarmoFL's BatchNorm2d(affine=False, track_running_stats=False)
    bn: BNKind = "standard"
    #: HarmoFL's released model: ZeroPad2d(2) after the first dense block (paper: none)
    released_padding: bool = False


class DenseLayer(nn.Module):
    """Bottleneck dense layer H_l: BN-ReLU-conv1x1-BN-ReLU-conv3x3; output = [x, new maps]."""

    def __init__(self, cin: int, growth: int, bn_size: int, drop_rate: float, bn: str) -> None:
        super().__init__()
        mid = bn_size * growth
        self.bn1 = batch_norm(cin, bn)
        self.relu1 = nn.ReLU(inplace=True)
        self.conv1 = nn.Conv2d(cin, mid, kernel_size=1, bias=False)
        self.bn2 = batch_norm(mid, bn)
        self.relu2 = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(mid, growth, kernel_size=3, padding=1, bias=False)
        self.drop_rate = drop_rate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        new = self.conv1(self.relu1(self.bn1(x)))
        new = self.conv2(self.relu2(self.bn2(new)))
        if self.drop_rate > 0:
            new = F.dropout(new, p=self.drop_rate, training=self.training)
        return torch.cat((x, new), dim=1)


def dense_block(
    layers: int, cin: int, growth: int, bn_size: int, drop_rate: float, bn: str
) -> nn.Sequential:
    """``layers`` dense layers (``denselayer1`` ...): cin -> cin + layers * growth maps."""
    return nn.Sequential(
        OrderedDict(
            (f"denselayer{i + 1}", DenseLayer(cin + i * growth, growth, bn_size, drop_rate, bn))
            for i in range(layers)
        )
    )


def transition(cin: int, cout: int, bn: str) -> nn.Sequential:
    """BN -> ReLU -> conv1x1 -> avg-pool 2 (compression: cout = cin // 2)."""
    return nn.Sequential(
        OrderedDict(
            bn=batch_norm(cin, bn),
            relu=nn.ReLU(inplace=True),
            conv=nn.Conv2d(cin, cout, kernel_size=1, bias=False),
            pool=nn.AvgPool2d(kernel_size=2, stride=2),
        )
    )


def _positive_int(value: object, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"config key 'model.{key}' must be an integer >= 1, got {value!r}")
    return value


class DenseNet(FedModel):
    """DenseNet-BC (DenseNet-121 by default); see the module docstring."""

    def __init__(
        self,
        num_classes: int = 2,
        in_channels: int = 3,
        growth: int = 32,
        blocks: Sequence[int] = (6, 12, 24, 16),
        init_features: int = 64,
        bn_size: int = 4,
        drop_rate: float = 0.0,
        bn: BNKind = "standard",
        released_padding: bool = False,
    ) -> None:
        super().__init__()
        _positive_int(growth, "growth")
        _positive_int(init_features, "init_features")
        _positive_int(bn_size, "bn_size")
        if isinstance(blocks, str | bytes) or not isinstance(blocks, Sequence) or not blocks:
            raise ConfigError(
                f"config key 'model.blocks' must be a non-empty list of layer counts, "
                f"got {blocks!r}"
            )
        for i, n in enumerate(blocks):
            _positive_int(n, f"blocks[{i}]")
        if not 0.0 <= drop_rate < 1.0:
            raise ConfigError(f"config key 'model.drop_rate' must be in [0, 1), got {drop_rate}")
        check_bn(bn)

        stages: OrderedDict[str, nn.Module] = OrderedDict(
            stem=nn.Sequential(
                OrderedDict(
                    conv0=nn.Conv2d(
                        in_channels, init_features, kernel_size=7, stride=2, padding=3, bias=False
                    ),
                    bn0=batch_norm(init_features, bn),
                    relu0=nn.ReLU(inplace=True),
                    pool0=nn.MaxPool2d(kernel_size=3, stride=2, padding=1),
                )
            )
        )
        channels = init_features
        for i, layers in enumerate(blocks):
            parts: OrderedDict[str, nn.Module] = OrderedDict(
                dense=dense_block(layers, channels, growth, bn_size, drop_rate, bn)
            )
            channels += layers * growth
            if i == 0 and released_padding:
                parts["pad"] = nn.ZeroPad2d(2)
            if i < len(blocks) - 1:
                parts["transition"] = transition(channels, channels // 2, bn)
                channels //= 2
            else:
                parts["bn5"] = batch_norm(channels, bn)
                parts["relu5"] = nn.ReLU(inplace=True)
                parts["pool5"] = AdaptiveAvgPool2d(1)
            stages[f"block{i + 1}"] = nn.Sequential(parts)
        self.stages = nn.ModuleDict(stages)
        self.num_features = channels
        self.embed = nn.Identity()
        self.classifier = nn.Linear(channels, num_classes)

        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight)
            elif isinstance(m, nn.BatchNorm2d) and m.affine:
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Linear):
                nn.init.zeros_(m.bias)

    @classmethod
    def check_input(cls, input_shape: tuple[int, ...], task: str) -> str | None:
        return classifier_input_reason(
            "DenseNet",
            input_shape,
            task,
            MIN_SIZE,
            "the stem and three transitions divide the size by 32",
        )
