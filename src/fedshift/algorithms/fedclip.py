"""FedCLIP (Lu, Wang, Chen, Wang & Zhang, "FedCLIP: Fast Generalization and Personalization
for CLIP in Federated Learning", IEEE Data Engineering Bulletin 2023, arXiv 2302.13485).

Only the abstract is readable offline; the rule follows the released code
(microsoft/PersonalizedFL, ``fedclip/``: ``nets/models.py`` and the training loop), read
for facts, not copied. FedCLIP keeps CLIP's image encoder frozen and trains, on each site,
an attention-based adapter (AttAI) on the encoder's image features ``I``:
``g(I) = softmax(W2 tanh(W1 I + b1) + b2)`` over the feature dimension, ``I' = I * g(I)``
(elementwise), L2-normalised and compared with the classes' text features at CLIP's logit
scale (cross-entropy over ``scale * cos(I', T_c)``); the server averages the adapters
(FedAvg), and only the adapter crosses the wire.

fedshift has no text encoder: the classifier (a linear head on ``scale * I' / ||I'||``)
stands in for CLIP's fixed text-feature prototypes, is trained with the adapter and
averaged with it. The frozen trunk is the configured backbone up to its embedding (its
classifier becomes the head): ``train.trainable=head`` (required,
:mod:`fedshift.algorithms.trainable`) freezes it, and the adapter (``attention``) trains
in every mode. With ``model.weights`` or a pretrained backbone it is FedCLIP's setting on
another encoder; from a random trunk it is a random-feature adapter baseline.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from fedshift.algorithms.base import FLParams
from fedshift.algorithms.fedavg import FedAvg
from fedshift.core.bounds import bounded
from fedshift.core.config import TrainConfig
from fedshift.core.errors import ConfigError
from fedshift.core.federation import Federation
from fedshift.models.base import FedModel


@dataclass
class FedCLIPParams(FLParams):
    # CLIP's logit scale (exp of its learned temperature, 100 in the released checkpoints):
    # the attended, normalised features are multiplied by it before the head
    logit_scale: float = bounded(100.0, gt=0)


class AttentionAdapted(FedModel):
    """A backbone (kept whole as ``base``, its classifier moved out as the head) with
    FedCLIP's attention adapter on its embedding: ``features(x) = scale * I' / ||I'||``,
    ``I' = I * attention(I)`` (module docstring). ``stages`` and ``stage_hooks`` are the
    backbone's, so stage-level augments attach as before."""

    def __init__(self, backbone: FedModel, dim: int, logit_scale: float) -> None:
        super().__init__()
        self.classifier = backbone.classifier
        backbone.classifier = nn.Identity()
        self.base = backbone
        self.stage_hooks = backbone.stage_hooks  # the same dict: hooks reach the backbone
        self.logit_scale = logit_scale
        self.attention = nn.Sequential(
            nn.Linear(dim, dim), nn.Tanh(), nn.Linear(dim, dim), nn.Softmax(dim=1)
        )

    @property
    def stages(self) -> nn.ModuleDict:  # type: ignore[override]
        return self.base.stages

    def features(self, x: torch.Tensor) -> torch.Tensor:
        z = self.base.features(x)
        return self.logit_scale * F.normalize(z * self.attention(z), dim=1)


class FedCLIP(FedAvg):
    """FedAvg of an attention adapter (and the head) on a frozen trunk."""

    name = "fedclip"
    Params = FedCLIPParams
    tasks = ("classification",)  # one feature vector per image
    #: the released code averages with the clients' data-size weights
    paper_weighting = "samples"
    requires: ClassVar[tuple[str, ...]] = ("train.trainable=head",)
    always_trained = ("attention",)

    @classmethod
    def check(cls, params: Any, train: TrainConfig) -> None:
        if train.trainable != "head":
            raise ConfigError(
                f"config key 'train.trainable': algorithm 'fedclip' trains its adapter and the "
                f"head on a frozen trunk (train.trainable=head), not {train.trainable!r}"
            )

    @classmethod
    def wrap_model(cls, params: Any, model: FedModel, federation: Federation) -> FedModel:
        head = getattr(model, "classifier", None)
        if not isinstance(head, nn.Linear):
            raise ConfigError(
                f"algorithm 'fedclip' puts its adapter on the input of a linear classifier; "
                f"model {type(model).__name__}'s classifier is {type(head).__name__}"
            )
        return AttentionAdapted(model, int(head.in_features), params.logit_scale)
