"""AlexNet with batch normalisation: FedBN's and FedFA's model for Office-Caltech-10 and DomainNet.

Krizhevsky, Sutskever & Hinton, "ImageNet Classification with Deep Convolutional Neural
Networks", NeurIPS 2012 (Sec. 3.5, Fig. 2): five convolutional layers (max-pooling after the
first, second and fifth) and three fully connected layers, in the single-tower form of
torchvision's ``alexnet`` (64, 192, 384, 256, 256 maps). FedBN (Li et al., ICLR 2021,
med-air/FedBN @2fa38ad, ``nets/models.py`` ``AlexNet``) adds a BatchNorm after every conv and
after the two hidden fully connected layers and drops dropout; FedFA (tfzhou/FedFA @57e9582,
``pyfed/network/alexnet.py``) uses the same network with 1024-wide hidden layers.

Layout (input 3x256x256; map sizes in brackets):

* ``stages.conv1``: conv 11x11 stride 4 pad 2 (in -> 64) -> BN -> ReLU -> max-pool 3 stride 2
  [63 -> 31];
* ``stages.conv2``: conv 5x5 pad 2 (64 -> 192) -> BN -> ReLU -> max-pool 3 stride 2 [15];
* ``stages.conv3``: conv 3x3 pad 1 (192 -> 384) -> BN -> ReLU [15];
* ``stages.conv4``: conv 3x3 pad 1 (384 -> 256) -> BN -> ReLU [15];
* ``stages.conv5``: conv 3x3 pad 1 (256 -> 256) -> BN -> ReLU -> max-pool 3 stride 2 [7];
* ``avgpool``: adaptive average pool to 6x6, then flatten (9216);
* ``embed``: fc1 (9216 -> hidden) -> BN1d -> ReLU -> fc2 (hidden -> hidden) -> BN1d -> ReLU;
* ``classifier``: fc3 (hidden -> num_classes).

``hidden=4096`` is FedBN's network, ``hidden=1024`` FedFA's. Every layer keeps PyTorch's default
initialisation, as both released codes do, and the modules are created in their order.

Stage hooks sit where FedFA's ``AlexNetFedFa`` puts its five FFA layers: after pool1, after
pool2, after conv3's ReLU, after conv4's ReLU and after pool5 (on 256x256 inputs: 64x31x31,
192x15x15, 384x15x15, 256x15x15, 256x7x7). The last one acts *before* the adaptive 6x6
average pool: the base class's ``features`` runs the stages and their hooks, then
``before_flatten`` (here ``avgpool``), ``flatten`` and ``embed`` (putting the pool inside
``conv5`` would make an FFA layer there see 6x6 instead of 7x7 maps).

Names (state-dict keys here <- FedBN's ``AlexNet`` / FedFA's ``AlexNet``):

* ``stages.convK.convK`` / ``stages.convK.bnK`` (K = 1..5) <- ``features.convK`` /
  ``features.bnK`` (FedBN), ``layerK.convK`` / ``layerK.bnK`` (FedFA);
* the pools ``stages.conv1.maxpool1``, ``stages.conv2.maxpool2``, ``stages.conv5.maxpool5``
  <- FedBN's ``features.maxpoolK`` (FedFA: ``poolK``); ``avgpool`` <- ``avgpool``;
* ``embed.fc1``, ``embed.bn6``, ``embed.fc2``, ``embed.bn7`` <- ``classifier.fc1`` ...
  ``classifier.bn7`` (both);
* ``classifier`` <- ``classifier.fc3`` (both).

BatchNorm layers: seven (``bn1`` .. ``bn5`` 2-d, ``bn6``, ``bn7`` 1-d), the ones FedBN keeps
local. Parameters: 2,472,000 in the convolutions and their BNs, plus 9217 h + 2h + h^2 + h +
2h + (h + 1) k for hidden size h and k classes: 57,063,498 for FedBN's (h = 4096, k = 10) and
12,974,154 for FedFA's (h = 1024, k = 10).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch
from torch import nn

from fedshift.core.bounds import bounded
from fedshift.core.errors import ConfigError
from fedshift.models.base import AdaptiveAvgPool2d, FedModel, classifier_input_reason
from fedshift.models.normfree import NormFreeParams

#: smallest H and W for which pool5 still has an output (conv1 15, pool1 7, pool2 3, pool5 1)
MIN_SIZE = 63
#: the adaptive pool's output size (FedBN / FedFA: 6x6 -> 256 * 36 = 9216 features)
POOL_SIZE = 6


@dataclass
class AlexNetParams(NormFreeParams):
    """Parameters of the ``alexnet`` model (config keys ``model.*``)."""

    #: width of the two hidden fully connected layers (FedBN: 4096; FedFA: 1024)
    hidden: int = bounded(4096, ge=1)


def _conv_stage(
    k: int, cin: int, cout: int, kernel: int, stride: int, pad: int, pool: bool
) -> nn.Sequential:
    """conv``k`` -> bn``k`` -> relu``k`` (-> maxpool``k``: 3x3 stride 2), FedBN's names."""
    layers: OrderedDict[str, nn.Module] = OrderedDict()
    layers[f"conv{k}"] = nn.Conv2d(cin, cout, kernel_size=kernel, stride=stride, padding=pad)
    layers[f"bn{k}"] = nn.BatchNorm2d(cout)
    layers[f"relu{k}"] = nn.ReLU(inplace=True)
    if pool:
        layers[f"maxpool{k}"] = nn.MaxPool2d(kernel_size=3, stride=2)
    return nn.Sequential(layers)


class AlexNetBN(FedModel):
    """AlexNet with BN after every conv and hidden FC layer (FedBN / FedFA); see the module
    docstring for the layout, the hook positions and the names."""

    def __init__(self, num_classes: int = 10, in_channels: int = 3, hidden: int = 4096) -> None:
        super().__init__()
        if isinstance(hidden, bool) or not isinstance(hidden, int) or hidden < 1:
            raise ConfigError(
                f"config key 'model.hidden' must be an integer >= 1 (FedBN: 4096, FedFA: 1024), "
                f"got {hidden!r}"
            )
        self.hidden = hidden
        self.stages = nn.ModuleDict(
            OrderedDict(
                conv1=_conv_stage(1, in_channels, 64, 11, 4, 2, pool=True),
                conv2=_conv_stage(2, 64, 192, 5, 1, 2, pool=True),
                conv3=_conv_stage(3, 192, 384, 3, 1, 1, pool=False),
                conv4=_conv_stage(4, 384, 256, 3, 1, 1, pool=False),
                conv5=_conv_stage(5, 256, 256, 3, 1, 1, pool=True),
            )
        )
        self.avgpool = AdaptiveAvgPool2d((POOL_SIZE, POOL_SIZE))
        self.embed = nn.Sequential(
            OrderedDict(
                fc1=nn.Linear(256 * POOL_SIZE * POOL_SIZE, hidden),
                bn6=nn.BatchNorm1d(hidden),
                relu6=nn.ReLU(inplace=True),
                fc2=nn.Linear(hidden, hidden),
                bn7=nn.BatchNorm1d(hidden),
                relu7=nn.ReLU(inplace=True),
            )
        )
        self.classifier = nn.Linear(hidden, num_classes)

    @classmethod
    def check_input(cls, input_shape: tuple[int, ...], task: str) -> str | None:
        return classifier_input_reason(
            "AlexNet",
            input_shape,
            task,
            MIN_SIZE,
            "conv1 stride 4 and three 3x3 stride-2 max-pools; FedBN and FedFA use 256x256",
        )

    def before_flatten(self, x: torch.Tensor) -> torch.Tensor:
        """The 6x6 adaptive average pool, after the stages and their hooks (the last hook sees
        pool5's output, FedFA's placement); the base class then flattens and runs fc1/fc2."""
        return self.avgpool(x)
