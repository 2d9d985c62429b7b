"""The model contract every fedshift model follows (:class:`FedModel`).

A :class:`FedModel` splits into ``features(x) -> z`` and ``head(z) -> logits`` (FRAug, MOON,
FedProto and t-SNE plots need the embedding), names its convolutional *stages* in order (the
insertion points for feature-level layers such as FedFA's FFA or MixStyle), and names its
normalisation layers so that a BN policy (:mod:`fedshift.models.bn`) is one explicit rule over
state-dict keys rather than a substring match on ``"bn"``.

It lives in core because the algorithm and dataset contracts (:mod:`fedshift.core.contract`)
name it; :mod:`fedshift.models.base` re-exports it with the layers models are built from.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

import torch
from torch import nn


class FedModel(nn.Module):
    """Base class: subclasses build ``self.stages`` (an ordered ModuleDict) and ``self.head``."""

    stages: nn.ModuleDict
    embed: nn.Module
    classifier: nn.Module
    #: ``(mean, std)`` per channel on [0, 1] images when the model normalises its input
    #: itself (its pretrained weights' normalisation): the run's ``input.mean/std`` must then
    #: be the identity (``fedshift.core.config.check_ranges``); None: the run normalises
    input_norm: tuple[tuple[float, ...], tuple[float, ...]] | None = None
    #: the image size the model's pretrained weights were trained at (None: no such size)
    input_size: int | None = None

    def __init__(self) -> None:
        super().__init__()
        # Hooks called on the output of each named stage, e.g. {"conv1": ffa_layer}.
        self.stage_hooks: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {}

    @classmethod
    def check_input(cls, input_shape: tuple[int, ...], task: str) -> str | None:
        """Why this model cannot take images of ``input_shape`` for ``task``
        (``classification`` / ``segmentation``), or None if it can. ``build_model`` turns a
        reason into a ConfigError naming the config keys."""
        return None if task == "classification" else "it is a classification model"

    @property
    def stage_names(self) -> list[str]:
        return list(self.stages.keys())

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """Input images -> embedding ``z`` (the input of the classification head): each
        stage, then its adapter (``train.trainable=adapters``: :mod:`fedshift.models.peft`),
        then its hook."""
        adapters = cast("nn.ModuleDict | None", self._modules.get("adapters"))
        for name, stage in self.stages.items():
            x = stage(x)
            if adapters is not None and name in adapters:
                x = adapters[name](x)
            hook = self.stage_hooks.get(name)
            if hook is not None:
                x = hook(x)
        return self.embed(torch.flatten(self.before_flatten(x), 1))

    def before_flatten(self, x: torch.Tensor) -> torch.Tensor:
        """Between the last stage (and its hook) and the flatten: identity by default;
        AlexNet's adaptive 6x6 average pool (after FedFA's last FFA layer on pool5)."""
        return x

    def head(self, z: torch.Tensor) -> torch.Tensor:
        """Embedding -> class logits."""
        return self.classifier(z)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))

    def bn_layer_names(self) -> list[str]:
        """Qualified names of every batch-norm layer (their tensors are the "BN tensors")."""
        return [
            name
            for name, m in self.named_modules()
            if isinstance(m, nn.modules.batchnorm._BatchNorm)
        ]
