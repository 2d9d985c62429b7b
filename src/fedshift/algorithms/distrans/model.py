"""DisTrans's double-input-channel model (Yuan et al., ECCV 2022, Eq. 1 and Sec. 3): one
backbone shared by the two channel inputs ``(1 - a) x + a t`` and ``(1 + a) x - a t`` (``t``
the client's offset), the two embeddings concatenated, one dense layer to the logits."""

from __future__ import annotations

import torch
from torch import nn

from fedshift.models.base import FedModel


# ----------------------------------------------------------------------------- Eq. 1
def blend(x: torch.Tensor, t: torch.Tensor, alpha: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. 1: the two channel inputs ``((1 - a) x + a t, (1 + a) x - a t)``."""
    return (1.0 - alpha) * x + alpha * t, (1.0 + alpha) * x - alpha * t


def recover(
    left: torch.Tensor, right: torch.Tensor, alpha: float
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Inverse of Eq. 1: ``x = (left + right) / 2`` and, for a > 0,
    ``t = ((1 + a) left - (1 - a) right) / (2 a)`` (None when a = 0)."""
    x = 0.5 * (left + right)
    t = ((1.0 + alpha) * left - (1.0 - alpha) * right) / (2.0 * alpha) if alpha > 0 else None
    return x, t


# ----------------------------------------------------------------------------- the model
@torch.no_grad()
def _embedding_dim(backbone: FedModel, input_shape: tuple[int, ...]) -> int:
    was_training = backbone.training
    backbone.eval()  # BN uses its running statistics: nothing is updated
    try:
        ref = next(backbone.parameters(), None)
        x = torch.zeros(2, *input_shape, device=ref.device if ref is not None else None)
        return int(backbone.features(x).shape[1])
    finally:
        backbone.train(was_training)


class DisTransModel(FedModel):
    """The double-input-channel model (one shared backbone, Eq. 1 inputs, one dense layer).

    ``features(x)`` is the concatenated embedding of both channels and ``head(z)`` the dense
    layer, so t-SNE and feature-level methods still work; ``stages`` and ``stage_hooks`` are
    the backbone's (augments insert layers there); BN layers keep their backbone names under
    ``backbone.`` in this model's state dict. The client's offset is the parameter
    ``offset`` (shape = one input).
    """

    classifier: nn.Linear  # the dense layer on both channels' embeddings

    def __init__(
        self,
        backbone: FedModel,
        num_classes: int,
        input_shape: tuple[int, ...],
        alpha: float = 0.3,
        channels: int = 2,
        offset_seed: int = 0,
    ) -> None:
        super().__init__()
        if channels not in (1, 2):
            raise ValueError(f"channels must be 1 or 2, got {channels}")
        dim = _embedding_dim(backbone, tuple(input_shape))
        if isinstance(getattr(backbone, "classifier", None), nn.Module):
            backbone.classifier = nn.Identity()  # unused: the dense layer below replaces it
        self.backbone = backbone
        self.stage_hooks = backbone.stage_hooks  # one dict: hooks added here reach the backbone
        self.alpha = float(alpha)
        self.channels = int(channels)
        self.input_shape = tuple(int(s) for s in input_shape)
        #: seed of the clients' offset-initialisation streams
        self.offset_seed = int(offset_seed)
        self.classifier = nn.Linear(self.channels * dim, num_classes)
        ref = next(backbone.parameters(), None)
        self.offset = nn.Parameter(
            torch.zeros(self.input_shape, device=ref.device if ref is not None else None)
        )

    @property
    def stages(self) -> nn.ModuleDict:  # type: ignore[override]
        return self.backbone.stages

    def channel_inputs(self, x: torch.Tensor) -> list[torch.Tensor]:
        """What the backbone sees: both channels of Eq. 1, or the left one (``channels=1``)."""
        left, right = blend(x, self.offset, self.alpha)
        return [left, right] if self.channels == 2 else [left]

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """Concatenated backbone embeddings of the channel inputs (two separate passes, as
        the released code: BN normalises each channel with its own batch statistics)."""
        return torch.cat([self.backbone.features(c) for c in self.channel_inputs(x)], dim=1)

    def head(self, z: torch.Tensor) -> torch.Tensor:
        return self.classifier(z)
