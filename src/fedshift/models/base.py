"""Building blocks of fedshift's models, and the model contract :class:`FedModel`
(re-exported from :mod:`fedshift.core.model`, where the contracts name it)."""

from __future__ import annotations

from collections import OrderedDict

import torch
from torch import nn

from fedshift.core.model import FedModel

__all__ = [
    "AdaptiveAvgPool2d",
    "init_conv_bn",
    "FedModel",
    "adaptive_avg_pool2d_matmul",
    "classifier_input_reason",
    "conv_stage",
    "fc_stage",
    "pooling_matrix",
]


def classifier_input_reason(
    model: str, input_shape: tuple[int, ...], task: str, min_size: int = 0, why: str = ""
) -> str | None:
    """The shared ``check_input`` of image classifiers: a classification task, (C, H, W)
    images and H, W >= ``min_size`` (``why`` says what sets the minimum)."""
    if task != "classification":
        return (
            f"{model} is a classification model and this is a {task} dataset; "
            "use a segmentation model such as unet"
        )
    shape = "x".join(map(str, input_shape))
    if len(input_shape) != 3:
        return f"{model} takes (C, H, W) images; got shape {shape}"
    if input_shape[1] < min_size or input_shape[2] < min_size:
        return (
            f"{model} needs H and W >= {min_size} ({why}); got {shape}: where the dataset "
            f"has a size key (folders, pacs, officehome) set dataset.size to at least {min_size}"
        )
    return None


def conv_stage(cin: int, cout: int, k: int, pad: int, pool: bool, bn: bool = True) -> nn.Sequential:
    """conv -> (BN) -> ReLU -> (max-pool 2), with named children (``conv``, ``bn``, ...)."""
    layers: OrderedDict[str, nn.Module] = OrderedDict(conv=nn.Conv2d(cin, cout, k, padding=pad))
    if bn:
        layers["bn"] = nn.BatchNorm2d(cout)
    layers["relu"] = nn.ReLU(inplace=True)
    if pool:
        layers["pool"] = nn.MaxPool2d(2)
    return nn.Sequential(layers)


def fc_stage(fin: int, fout: int, bn: bool = True) -> nn.Sequential:
    """linear -> (BN1d) -> ReLU, with named children (``fc``, ``bn``, ``relu``)."""
    layers: OrderedDict[str, nn.Module] = OrderedDict(fc=nn.Linear(fin, fout))
    if bn:
        layers["bn"] = nn.BatchNorm1d(fout)
    layers["relu"] = nn.ReLU(inplace=True)
    return nn.Sequential(layers)


# ----------------------------------------------------------------------------- GPU determinism
def pooling_matrix(size: int, out: int, like: torch.Tensor) -> torch.Tensor:
    """(out, size): row i averages adaptive pooling's window i of a length-``size`` axis,
    ``[floor(i size / out), ceil((i + 1) size / out))`` (PyTorch's windows), on ``like``'s
    device and dtype."""
    i = torch.arange(out, device=like.device)
    start = (i * size) // out
    end = -((-(i + 1) * size) // out)  # ceil
    pos = torch.arange(size, device=like.device)
    inside = (pos[None, :] >= start[:, None]) & (pos[None, :] < end[:, None])
    return inside.to(like.dtype) / (end - start).to(like.dtype)[:, None]


def adaptive_avg_pool2d_matmul(
    x: torch.Tensor, output_size: int | tuple[int | None, int | None]
) -> torch.Tensor:
    """``adaptive_avg_pool2d(x, output_size)`` as two matrix products (deterministic forward
    and backward on a GPU; equal to PyTorch's up to rounding)."""
    h, w = x.shape[-2:]
    oh, ow = (output_size, output_size) if isinstance(output_size, int) else output_size
    ph = pooling_matrix(h, h if oh is None else oh, x)
    pw = pooling_matrix(w, w if ow is None else ow, x)
    return ph @ x @ pw.T


class AdaptiveAvgPool2d(nn.AdaptiveAvgPool2d):
    """``nn.AdaptiveAvgPool2d`` that a GPU run in deterministic mode (``run.deterministic``:
    ``torch.use_deterministic_algorithms(True)``) can train: PyTorch's CUDA backward of
    adaptive average pooling has no deterministic implementation and raises there, so on a
    CUDA tensor with deterministic algorithms on the pooling is computed by
    :func:`adaptive_avg_pool2d_matmul`. Everywhere else (the CPU: bit-identical to before)
    it is PyTorch's. No parameters: state dicts are unchanged."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.is_cuda and torch.are_deterministic_algorithms_enabled():
            return adaptive_avg_pool2d_matmul(x, self.output_size)
        return super().forward(x)


def tracking_bn(model: nn.Module) -> list[nn.modules.batchnorm._BatchNorm]:
    """The model's BatchNorm layers that keep running statistics (and evaluate with them):
    what AdaBN re-estimates, what a frozen-statistics pass must leave untouched."""
    return [
        m
        for m in model.modules()
        if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats
    ]


def init_conv_bn(model: nn.Module) -> None:
    """He (fan-out, ReLU) initialisation of every Conv2d's weight and BatchNorm2d at weight 1,
    bias 0, in module order (torchvision's ResNet rule; EfficientNet-Lite0 uses it too)."""
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
        elif isinstance(m, nn.BatchNorm2d):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
