"""ResNet-18 with batch normalisation.

He, Zhang, Ren & Sun, "Deep Residual Learning for Image Recognition", CVPR 2016: the 18-layer
network of Table 1 built from *basic blocks* (Sec. 3.3, Fig. 2 left: two 3x3 convolutions and
an identity shortcut, y = F(x, {W_i}) + x, Eq. 1), four groups of two blocks, BatchNorm after
every convolution and before the addition's ReLU (Sec. 3.4). Where a group halves the size and
doubles the channels, the shortcut is a projection (option B of Sec. 3.3: 1x1 convolution
with stride 2, then BN; Eq. 2), as in torchvision's ``resnet18``.

Layout (w = ``width``, 64 in the paper):

* ``stages.stem``: ``conv1`` 7x7 stride 2 pad 3 (no bias) -> ``bn1`` -> ``relu`` ->
  ``maxpool`` 3x3 stride 2 pad 1 (224 -> 112 -> 56). With ``small_input=True`` (the usual
  adaptation of ResNet-18 to 32x32 images such as CIFAR) it is a 3x3 stride-1 conv without
  the max-pool, so 32x32 inputs keep 32x32 maps into ``layer1``;
* ``stages.layer1`` .. ``layer4``: two basic blocks each (children ``0`` and ``1``) with w, 2w,
  4w, 8w channels; the first block of layer2..layer4 has stride 2 and a ``downsample``
  projection (children ``0`` = 1x1 conv, ``1`` = BN);
  a block's children are ``conv1``, ``bn1``, ``relu``, ``conv2``, ``bn2`` (, ``downsample``);
* ``layer4`` ends with ``avgpool`` (global average pool), so its output is (B, 8w, 1, 1) and
  the base class's flatten gives the (B, 8w) embedding; ``embed`` is the identity and
  ``classifier`` = Linear(8w, num_classes).

Stage hooks (FFA, MixStyle) act on the output of ``stem`` and each group; on ``layer4`` a hook
sees the pooled 1x1 maps. Sizes on 224x224: stem 56, layer1 56, layer2 28, layer3 14, layer4 1;
on 32x32 with ``small_input``: 32, 32, 16, 8, 1.

BatchNorm layers: 20 (stem, 2 per block, 3 projections). Parameters with w = 64:
11,176,512 without the classifier (torchvision's 11,689,512 minus its 1000-class fc of
513,000), so 11,181,642 for 10 classes; ``small_input`` saves 3 * 64 * (49 - 9) = 7,680.

Initialisation as torchvision's ``resnet18`` (the He et al. initialisation of Sec. 3.4):
every conv weight ``kaiming_normal_`` with mode fan_out and ReLU gain (std = sqrt(2 /
(C_out k^2))), BN weight 1 and bias 0, the linear layer PyTorch's default; the last BN of a
block is *not* zeroed (torchvision's ``zero_init_residual=False``). Modules are created in
torchvision's order (a group's projection before its first block).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from torch import Tensor, nn

from fedshift.core.bounds import bounded
from fedshift.core.errors import ConfigError
from fedshift.models.base import AdaptiveAvgPool2d, FedModel, classifier_input_reason, init_conv_bn
from fedshift.models.normfree import NormFreeParams

#: basic blocks per group (ResNet-18, Table 1)
LAYERS = (2, 2, 2, 2)


@dataclass
class ResNetParams(NormFreeParams):
    """Parameters of the ``resnet18`` model (config keys ``model.*``)."""

    #: CIFAR-style stem for small images: 3x3 stride-1 conv, no max-pool
    small_input: bool = False
    #: channels of layer1 (the groups have width, 2 width, 4 width, 8 width)
    width: int = bounded(64, ge=1)


def conv3x3(cin: int, cout: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(cin, cout, kernel_size=3, stride=stride, padding=1, bias=False)


class BasicBlock(nn.Module):
    """relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x)), shortcut = identity or
    ``downsample`` (1x1 conv + BN) when the size or the channel count changes."""

    def __init__(
        self, cin: int, cout: int, stride: int = 1, downsample: nn.Module | None = None
    ) -> None:
        super().__init__()
        self.conv1 = conv3x3(cin, cout, stride)
        self.bn1 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = conv3x3(cout, cout)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = downsample

    def forward(self, x: Tensor) -> Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        shortcut = x if self.downsample is None else self.downsample(x)
        return self.relu(out + shortcut)


def _group(cin: int, cout: int, blocks: int, stride: int) -> OrderedDict[str, nn.Module]:
    """``blocks`` basic blocks named ``0``, ``1``, ...; the first one may project."""
    downsample = None
    if stride != 1 or cin != cout:
        downsample = nn.Sequential(
            nn.Conv2d(cin, cout, kernel_size=1, stride=stride, bias=False), nn.BatchNorm2d(cout)
        )
    out: OrderedDict[str, nn.Module] = OrderedDict()
    out["0"] = BasicBlock(cin, cout, stride, downsample)
    for i in range(1, blocks):
        out[str(i)] = BasicBlock(cout, cout)
    return out


class ResNet18(FedModel):
    """ResNet-18 (He et al., CVPR 2016) with BN; see the module docstring."""

    def __init__(
        self,
        num_classes: int = 10,
        in_channels: int = 3,
        small_input: bool = False,
        width: int = 64,
    ) -> None:
        super().__init__()
        if isinstance(width, bool) or not isinstance(width, int) or width < 1:
            raise ConfigError(f"config key 'model.width' must be an integer >= 1, got {width!r}")
        if not isinstance(small_input, bool):
            raise ConfigError(
                f"config key 'model.small_input' must be true or false, got {small_input!r}"
            )
        self.small_input = small_input
        w = width
        stem: OrderedDict[str, nn.Module] = OrderedDict()
        if small_input:
            stem["conv1"] = conv3x3(in_channels, w)
        else:
            stem["conv1"] = nn.Conv2d(in_channels, w, 7, stride=2, padding=3, bias=False)
        stem["bn1"] = nn.BatchNorm2d(w)
        stem["relu"] = nn.ReLU(inplace=True)
        if not small_input:
            stem["maxpool"] = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        stages: OrderedDict[str, nn.Module] = OrderedDict(stem=nn.Sequential(stem))
        cin = w
        for i, blocks in enumerate(LAYERS):
            cout = w * 2**i
            group = _group(cin, cout, blocks, stride=1 if i == 0 else 2)
            if i == len(LAYERS) - 1:
                group["avgpool"] = AdaptiveAvgPool2d(1)
            stages[f"layer{i + 1}"] = nn.Sequential(group)
            cin = cout
        self.stages = nn.ModuleDict(stages)
        self.num_features = cin
        self.embed = nn.Identity()
        self.classifier = nn.Linear(cin, num_classes)

        init_conv_bn(self)

    @classmethod
    def check_input(cls, input_shape: tuple[int, ...], task: str) -> str | None:
        return classifier_input_reason("ResNet-18", input_shape, task, 0)
