"""The U-Net of FedFA and HarmoFL for 2-D segmentation.

Ronneberger, Fischer & Brox, "U-Net: Convolutional Networks for Biomedical Image
Segmentation", MICCAI 2015 (Sec. 2, Fig. 1): a contracting path of double-conv blocks with 2x2
max-pooling, an expanding path of 2x2 up-convolutions whose output is concatenated with the
encoder feature map of the same resolution, then a 1x1 convolution to the class logits.

This is the variant both FedFA (tfzhou/FedFA @57e9582, ``pyfed/network/unet.py``) and HarmoFL
(med-air/HarmoFL @63182fe, ``nets/models.py``) train on prostate MRI, which differs from the
2015 paper in three ways: the 3x3 convolutions are padded (output size = input size, so no
cropping of the skips), each convolution is bias-free and followed by BatchNorm, and the base
width is 32 instead of 64 (encoder widths w, 2w, 4w, 8w, bottleneck 16w).

Layout (w = ``width``):

* block(c_in, c_out) = conv3x3(no bias) -> BN -> ReLU -> conv3x3(no bias) -> BN -> ReLU,
  children ``conv1, bn1, relu1, conv2, bn2, relu2``;
* ``stages``: ``enc1`` (in -> w), ``enc2`` (w -> 2w), ``enc3`` (2w -> 4w), ``enc4``
  (4w -> 8w), ``bottleneck`` (8w -> 16w); a 2x2 max-pool follows each encoder stage;
* ``decoder``: ``upK`` = ConvTranspose2d(k=2, s=2) halving the channels and ``decK`` =
  block(2c -> c) over concat(upsampled, skip of encK), for K = 4, 3, 2, 1;
* ``classifier`` = Conv2d(w, num_classes, 1) (with bias).

Stage hooks (``FedModel.stage_hooks``) sit where FedFA's released U-Net puts its FFA layers:
on the *pooled* output of ``encK`` (the input of the next stage) and on the bottleneck's
output. The skip connection carries the un-hooked, un-pooled ``encK`` output. A hook on
``encK`` therefore sees (B, 2^(K-1) w, H / 2^K, W / 2^K), one on ``bottleneck`` sees
(B, 16 w, H / 16, W / 16).

Contract: ``features(x)`` is ``dec1``'s output (B, w, H, W), the per-pixel embedding;
``head(z)`` the 1x1 classifier, giving logits (B, num_classes, H, W).

``bn="harmofl"``: every BatchNorm is ``BatchNorm2d(affine=False, track_running_stats=False)``
as in HarmoFL's released models. Such a layer has no parameters and no running buffers, and
normalises with the statistics of the current batch in evaluation mode too, so HarmoFL's
evaluation uses batch statistics (results depend on the evaluation batch). HarmoFL's model
also applies its amplitude normalisation inside ``forward``; here that is the ``ampnorm``
augment. Weights keep PyTorch's default initialisation, as both released codes do; the
modules are created in the released models' order (encoders, bottleneck, then up-conv /
decoder pairs from the deepest, then the classifier).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from fedshift.core.bounds import bounded
from fedshift.core.errors import ConfigError
from fedshift.models.base import FedModel
from fedshift.models.normfree import NormFreeParams

BNKind = Literal["standard", "harmofl"]
#: encoder stages, shallow to deep; each is followed by a 2x2 max-pool
ENCODER = ("enc1", "enc2", "enc3", "enc4")
#: spatial size must be divisible by this (four 2x poolings)
DIVISOR = 2 ** len(ENCODER)


@dataclass
class UNetParams(NormFreeParams):
    """Parameters of the ``unet`` model (config keys ``model.*``)."""

    #: base number of features w (encoder widths w, 2w, 4w, 8w; bottleneck 16w)
    width: int = bounded(32, ge=1)
    #: "standard": BatchNorm2d with affine parameters and running statistics;
    #: "harmofl": HarmoFL's BatchNorm2d(affine=False, track_running_stats=False)
    bn: BNKind = "standard"


def batch_norm(channels: int, bn: str) -> nn.BatchNorm2d:
    """A BatchNorm2d of the chosen kind (see :class:`UNetParams`)."""
    if bn == "harmofl":
        return nn.BatchNorm2d(channels, affine=False, track_running_stats=False)
    return nn.BatchNorm2d(channels)


def check_bn(bn: str) -> None:
    if bn not in ("standard", "harmofl"):
        raise ConfigError(
            f"config key 'model.bn': {bn!r} is not valid; choose 'standard' or 'harmofl'"
        )


def double_conv(cin: int, cout: int, bn: str) -> nn.Sequential:
    """conv3x3 -> BN -> ReLU -> conv3x3 -> BN -> ReLU (padded, bias-free convolutions)."""
    return nn.Sequential(
        OrderedDict(
            conv1=nn.Conv2d(cin, cout, 3, padding=1, bias=False),
            bn1=batch_norm(cout, bn),
            relu1=nn.ReLU(inplace=True),
            conv2=nn.Conv2d(cout, cout, 3, padding=1, bias=False),
            bn2=batch_norm(cout, bn),
            relu2=nn.ReLU(inplace=True),
        )
    )


class UNet(FedModel):
    """U-Net with padded convolutions and BN (FedFA / HarmoFL); see the module docstring."""

    def __init__(
        self, num_classes: int = 2, in_channels: int = 3, width: int = 32, bn: BNKind = "standard"
    ) -> None:
        super().__init__()
        if isinstance(width, bool) or not isinstance(width, int) or width < 1:
            raise ConfigError(f"config key 'model.width' must be an integer >= 1, got {width!r}")
        check_bn(bn)
        w = width
        self.width = w
        self.stages = nn.ModuleDict(
            OrderedDict(
                enc1=double_conv(in_channels, w, bn),
                enc2=double_conv(w, 2 * w, bn),
                enc3=double_conv(2 * w, 4 * w, bn),
                enc4=double_conv(4 * w, 8 * w, bn),
                bottleneck=double_conv(8 * w, 16 * w, bn),
            )
        )
        self.pool = nn.MaxPool2d(kernel_size=2, stride=2)
        decoder: OrderedDict[str, nn.Module] = OrderedDict()
        for k in (4, 3, 2, 1):
            c = w * 2 ** (k - 1)  # channels of encK = output channels of decK
            decoder[f"up{k}"] = nn.ConvTranspose2d(2 * c, c, kernel_size=2, stride=2)
            decoder[f"dec{k}"] = double_conv(2 * c, c, bn)
        self.decoder = nn.ModuleDict(decoder)
        self.embed = nn.Identity()
        self.classifier = nn.Conv2d(w, num_classes, kernel_size=1)

    @classmethod
    def check_input(cls, input_shape: tuple[int, ...], task: str) -> str | None:
        if task != "segmentation":
            return (
                "U-Net is a segmentation model (per-pixel logits) and this is a "
                f"{task} dataset; use a classification model"
            )
        shape = "x".join(map(str, input_shape))
        if len(input_shape) != 3:
            return f"U-Net takes (C, H, W) images; got shape {shape}"
        h, w = input_shape[1], input_shape[2]
        if h % DIVISOR or w % DIVISOR or h < DIVISOR or w < DIVISOR:
            return (
                f"U-Net needs H and W divisible by {DIVISOR} ({len(ENCODER)} 2x poolings); "
                f"got {shape}: set dataset.size to a multiple of {DIVISOR}"
            )
        return None

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """Images (B, C, H, W) -> per-pixel embedding (B, w, H, W) (``dec1``'s output)."""
        h, w = x.shape[-2:]
        if h % DIVISOR or w % DIVISOR:
            raise ValueError(
                f"U-Net needs H and W divisible by {DIVISOR}; got input of shape {tuple(x.shape)}"
            )
        skips: list[torch.Tensor] = []
        for name in ENCODER:
            out = self.stages[name](x)
            skips.append(out)  # the skip takes the un-pooled, un-hooked encoder output
            x = self._hook(name, self.pool(out))
        x = self._hook("bottleneck", self.stages["bottleneck"](x))
        for k in (4, 3, 2, 1):
            x = self.decoder[f"up{k}"](x)
            x = self.decoder[f"dec{k}"](torch.cat((x, skips[k - 1]), dim=1))
        return self.embed(x)

    def _hook(self, name: str, x: torch.Tensor) -> torch.Tensor:
        hook = self.stage_hooks.get(name)
        return x if hook is None else hook(x)
