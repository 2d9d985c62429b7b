"""Parameter-efficient layers added to a built model: residual adapters after its stages and
low-rank (LoRA) updates of its convolution and linear weights.

Both start as the identity of the model they are added to (the adapter's up projection and
LoRA's ``B`` are zero), so the model computes what the backbone computed until they train;
``train.trainable=adapters|lora`` (:mod:`fedshift.algorithms.trainable`) then trains them
and the classifier with everything else frozen.

* :class:`Adapter`: ``x + up(relu(down(x)))`` with 1x1 convolutions ``C -> C/r -> C``, the
  residual bottleneck adapter of Houlsby et al. (ICML 2019, Sec. 2.1) in the convolutional
  form of Rebuffi et al.'s residual adapters (NeurIPS 2017); one after each chosen stage
  (``train.adapter_stages``, default every stage), held in ``model.adapters`` and applied by
  :meth:`fedshift.core.model.FedModel.features`.
* :class:`LoRA`: ``W x + (alpha / r) B A x`` (Hu et al., ICLR 2022, Eq. 3: ``A`` random,
  ``B`` zero, scale ``alpha / r``), for a convolution ``A`` a convolution to ``r`` channels
  with the base layer's kernel, stride, padding and dilation and ``B`` a 1x1 convolution
  back; added to every plain ``nn.Linear`` and ungrouped ``nn.Conv2d`` outside the classifier
  (grouped / depthwise convolutions and subclasses of those classes, which may pad or
  transform in their forward, are left as they are; EfficientNet-Lite0 pads TF "SAME" in a
  step of its own before plain convolutions, which LoRA takes), held in ``model.lora`` and
  applied by a forward hook on the base layer, which sees the layer's own input (already
  padded). ``alpha`` is ``r`` (scale 1).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from fedshift.core.errors import ConfigError
from fedshift.core.model import FedModel
from fedshift.core.seeding import derive_seed

__all__ = ["Adapter", "LoRA", "add_adapters", "add_lora", "added_layers_rng", "stage_shapes"]


class Adapter(nn.Module):
    """Residual bottleneck ``x + up(relu(down(x)))`` over ``channels`` (module docstring)."""

    def __init__(self, channels: int, reduction: int) -> None:
        super().__init__()
        hidden = max(1, channels // reduction)
        self.down = nn.Conv2d(channels, hidden, 1)
        self.up = nn.Conv2d(hidden, channels, 1)
        nn.init.zeros_(self.up.weight)  # the identity at the start
        nn.init.zeros_(self.up.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.up(torch.relu(self.down(x)))


class LoRA(nn.Module):
    """The low-rank update of one linear or ungrouped convolution layer (module
    docstring); :meth:`hook` adds it to the base layer's output."""

    def __init__(self, base: nn.Module, rank: int) -> None:
        super().__init__()
        self.scale = 1.0  # alpha / r with alpha = r
        if isinstance(base, nn.Linear):
            self.a: nn.Module = nn.Linear(base.in_features, rank, bias=False)
            self.b: nn.Module = nn.Linear(rank, base.out_features, bias=False)
        elif isinstance(base, nn.Conv2d) and base.groups == 1:
            self.a = nn.Conv2d(
                base.in_channels, rank, base.kernel_size, stride=base.stride,
                padding=base.padding, dilation=base.dilation, bias=False,
                padding_mode=base.padding_mode,
            )  # fmt: skip
            self.b = nn.Conv2d(rank, base.out_channels, 1, bias=False)
        else:
            raise TypeError(f"LoRA takes nn.Linear or ungrouped nn.Conv2d, not {base}")
        nn.init.kaiming_uniform_(self.a.weight, a=math.sqrt(5))
        nn.init.zeros_(self.b.weight)  # B = 0: the base layer's output at the start

    def hook(self, module: nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
        """Forward hook of the base layer: its output plus the low-rank path."""
        return output + self.scale * self.b(self.a(args[0]))


@contextmanager
def added_layers_rng(seed: int, mode: str) -> Iterator[None]:
    """Initialise added layers from their own stream (derived from the run's ``seed`` and
    ``mode``), leaving torch's random generator as it was: the backbone, a method's wrapper
    and the augments draw exactly what they draw with ``train.trainable=all``."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(derive_seed(seed, "trainable", mode))
        yield


def stage_shapes(model: FedModel, input_shape: tuple[int, ...]) -> dict[str, tuple[int, ...]]:
    """The output shape of each of ``model``'s stages for two images of ``input_shape``
    (evaluation mode, no gradient, the random generators and the model's statistics left
    as they were)."""
    shapes: dict[str, tuple[int, ...]] = {}
    was = model.training
    x = torch.zeros(2, *input_shape, device=next(model.parameters()).device)
    try:
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            model.eval()
            for name, stage in model.stages.items():
                x = stage(x)
                shapes[name] = tuple(x.shape)
    finally:
        model.train(was)
    return shapes


def add_adapters(
    model: FedModel, input_shape: tuple[int, ...], reduction: int, stages: list[str]
) -> None:
    """Add an :class:`Adapter` after each stage in ``stages`` (every stage when empty) as
    ``model.adapters``. Refuses (naming ``train.trainable``) a model that computes its
    features otherwise than stage after stage (U-Net's skip connections) and unknown or
    non-convolutional stages."""
    if type(model).features is not FedModel.features:
        raise ConfigError(
            f"config key 'train.trainable=adapters': model {type(model).__name__} computes "
            "its features its own way, not stage after stage (U-Net's skip connections), so "
            "an adapter after a stage has no single place; use train.trainable=lora"
        )
    names = list(model.stages.keys())
    unknown = [s for s in stages if s not in names]
    if unknown:
        raise ConfigError(
            f"config key 'train.adapter_stages': {unknown} are not stages of model "
            f"{type(model).__name__} ({', '.join(names)})"
        )
    shapes = stage_shapes(model, input_shape)
    layers = {}
    for name in stages or names:
        if len(shapes[name]) != 4:
            raise ConfigError(
                f"config key 'train.adapter_stages': stage {name!r} of model "
                f"{type(model).__name__} outputs {shapes[name][1:]}, not feature maps; name "
                "convolutional stages"
            )
        layers[name] = Adapter(shapes[name][1], reduction)
    model.adapters = nn.ModuleDict(layers)


def add_lora(model: FedModel, rank: int) -> int:
    """Add a :class:`LoRA` update to every linear layer and ungrouped convolution of
    ``model`` outside its classifier, as ``model.lora``; returns how many."""
    outside = [
        (name, m) for name, m in model.named_modules()
        if not (name == "classifier" or name.startswith("classifier."))
    ]  # fmt: skip
    # the layers' own classes only: a subclass that pads or transforms in its forward would
    # give the low-rank path another geometry than the layer's (a model pads in a step of its
    # own before the convolution, as EfficientNet-Lite0's SamePad)
    targets = [
        (name, m) for name, m in outside
        if type(m) is nn.Linear or (type(m) is nn.Conv2d and m.groups == 1)
    ]  # fmt: skip
    if not targets:
        own = sorted({type(m).__name__ for _, m in outside if isinstance(m, nn.Conv2d)})
        raise ConfigError(
            f"config key 'train.trainable=lora': model {type(model).__name__} has no plain "
            "linear layer or ungrouped convolution outside its classifier"
            + (f" (its convolutions are {', '.join(own)}: grouped, or classes of their own "
               "that may pad or transform in their forward)" if own else "")
            + "; use train.trainable=adapters or head"
        )  # fmt: skip
    lora = nn.ModuleDict()
    for name, m in targets:
        update = LoRA(m, rank)
        lora[name.replace(".", "__")] = update
        m.register_forward_hook(update.hook)
    model.lora = lora
    return len(targets)
