"""What a client sees while it trains: its data, the working model, its RNG, the settings.

The engine builds one :class:`ClientContext` per (round, client). Algorithms only talk to the
context, so the same algorithm code runs in the native simulator and on Flower.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from fedshift.config import InputConfig, TrainConfig
from fedshift.data.base import ClientData, Split
from fedshift.models.base import FedModel


class Normalize:
    """The input pipeline's last step: ``(x - mean) / std`` per channel on a batch."""

    def __init__(self, cfg: InputConfig, channels: int, device: torch.device) -> None:
        mean, std = list(cfg.mean), list(cfg.std)
        if len(mean) == 1:
            mean, std = mean * channels, std * channels
        if len(mean) != channels:
            raise ValueError(
                f"config keys 'input.mean'/'input.std' have {len(mean)} values "
                f"but the images have {channels} channels"
            )
        self.mean = torch.tensor(mean, device=device).view(1, -1, 1, 1)
        self.std = torch.tensor(std, device=device).view(1, -1, 1, 1)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean) / self.std


@dataclass
class ClientContext:
    cid: str
    round: int
    data: ClientData
    model: FedModel
    train: TrainConfig
    normalize: Normalize
    generator: torch.Generator
    device: torch.device

    @property
    def num_train(self) -> int:
        return len(self.data.train)

    def steps_per_epoch(self) -> int:
        n, bs = self.num_train, self.train.batch_size
        full, rest = divmod(n, bs)
        return full + (1 if rest > 1 else 0)

    def planned_steps(self) -> int:
        """Mini-batch steps of one round's local work (``local_steps`` or epochs x batches)."""
        if self.train.local_steps is not None:
            return self.train.local_steps
        return self.train.local_epochs * self.steps_per_epoch()

    def batches(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """The round's training batches, normalised and on the device.

        Each epoch is a fresh permutation drawn from the client's generator. A trailing batch
        of a single example is skipped (BatchNorm cannot train on it); ``steps_per_epoch``
        counts the same way.
        """
        split: Split = self.data.train
        n, bs = len(split), self.train.batch_size
        todo = self.planned_steps()
        while todo > 0:
            perm = torch.randperm(n, generator=self.generator)
            for start in range(0, n, bs):
                idx = perm[start : start + bs]
                if idx.numel() < 2 and n > 1:
                    continue
                x = split.x[idx].to(self.device, non_blocking=True)
                y = split.y[idx].to(self.device, non_blocking=True)
                yield self.normalize(x), y
                todo -= 1
                if todo == 0:
                    return
