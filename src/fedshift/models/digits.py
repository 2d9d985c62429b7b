"""Models for 3x28x28 digit images."""

from __future__ import annotations

from collections import OrderedDict

from torch import nn

from fedshift.models.base import FedModel, conv_stage, fc_stage


class SmallCNN(FedModel):
    """fedshift's fast default: two 5x5 conv stages (32, 64 channels) with BN, a 128-d
    embedding with BN1d, and a linear head. About 0.45 M parameters."""

    def __init__(self, num_classes: int = 10, in_channels: int = 3, width: int = 32) -> None:
        super().__init__()
        self.stages = nn.ModuleDict(
            OrderedDict(
                conv1=conv_stage(in_channels, width, 5, 2, pool=True),
                conv2=conv_stage(width, 2 * width, 5, 2, pool=True),
            )
        )
        self.embed = fc_stage(2 * width * 7 * 7, 128)
        self.classifier = nn.Linear(128, num_classes)


class DigitModel(FedModel):
    """FedBN's DigitModel (Li et al., ICLR 2021; ``nets/models.py`` of med-air/FedBN).

    conv5x5 p2 3->64, BN, ReLU, maxpool2; conv5x5 p2 64->64, BN, ReLU, maxpool2;
    conv5x5 p2 64->128, BN, ReLU; flatten 6272 -> FC 2048 + BN1d + ReLU -> FC 512 + BN1d +
    ReLU -> FC classes. The embedding is the 512-d output of the second FC block.
    """

    def __init__(self, num_classes: int = 10, in_channels: int = 3) -> None:
        super().__init__()
        self.stages = nn.ModuleDict(
            OrderedDict(
                conv1=conv_stage(in_channels, 64, 5, 2, pool=True),
                conv2=conv_stage(64, 64, 5, 2, pool=True),
                conv3=conv_stage(64, 128, 5, 2, pool=False),
            )
        )
        self.embed = nn.Sequential(OrderedDict(fc1=fc_stage(6272, 2048), fc2=fc_stage(2048, 512)))
        self.classifier = nn.Linear(512, num_classes)


class LeNet5(FedModel):
    """LeNet-5 (LeCun et al., 1998) in its modern form: 5x5 convs (6, 16 channels, the first
    padded so 28x28 inputs give the classic 5x5x16 map), ReLU and max-pooling instead of tanh
    and sub-sampling, FC 400 -> 120 -> 84 -> classes. ``bn=True`` (default) adds BN after each
    conv and hidden FC, so that BN policies apply; ``bn=False`` is the BN-free original."""

    def __init__(self, num_classes: int = 10, in_channels: int = 3, bn: bool = True) -> None:
        super().__init__()
        self.stages = nn.ModuleDict(
            OrderedDict(
                conv1=conv_stage(in_channels, 6, 5, 2, pool=True, bn=bn),
                conv2=conv_stage(6, 16, 5, 0, pool=True, bn=bn),
            )
        )
        self.embed = nn.Sequential(
            OrderedDict(fc1=fc_stage(400, 120, bn=bn), fc2=fc_stage(120, 84, bn=bn))
        )
        self.classifier = nn.Linear(84, num_classes)
