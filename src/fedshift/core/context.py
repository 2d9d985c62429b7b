"""What a client sees while it trains: its data, the working model, its RNG, the settings.

The engine builds one :class:`ClientContext` per (round, client). Algorithms only talk to the
context, so the same algorithm code runs in the native simulator and on Flower.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from fedshift.core.contract_errors import expect
from fedshift.core.tasks import Classification, Task

if TYPE_CHECKING:  # types only: core imports nothing above it
    from fedshift.core.config import InputConfig, TrainConfig
    from fedshift.core.dpsgd import ExampleMechanism
    from fedshift.core.federation import ClientData, Split
    from fedshift.core.model import FedModel


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


class Resize:
    """The input pipeline's step before ``Normalize`` (``input.size``): a batch ``(N, C, h,
    w)`` resized to ``(N, C, H, W)`` by bilinear interpolation
    (``torch.nn.functional.interpolate(mode="bilinear", align_corners=False)``, no
    antialiasing: meant for upsampling small images to a backbone's input); a batch already
    of that size passes unchanged."""

    def __init__(self, size: list[int] | tuple[int, ...]) -> None:
        self.size = (int(size[0]), int(size[1]))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if tuple(x.shape[-2:]) == self.size:
            return x
        return F.interpolate(x, size=self.size, mode="bilinear", align_corners=False)


def model_input_shape(
    input_shape: tuple[int, ...], size: list[int] | tuple[int, ...] | None
) -> tuple[int, int, int]:
    """The shape the model sees: the dataset's ``(C, H, W)`` with ``(H, W)`` replaced by
    ``input.size`` where it is set (:class:`Resize`)."""
    c, h, w = (int(s) for s in input_shape)
    if size is None:
        return (c, h, w)
    return (c, int(size[0]), int(size[1]))


def aug_key(augment: Any) -> str:
    """Where an augment keeps its state inside a client's (or the server's) state dict."""
    return f"aug/{augment.name}"


class InputPipeline:
    """Raw images in [0, 1] -> each augment's ``train_batch`` / ``eval_batch`` in config order
    -> the resize to ``input.size`` (:class:`Resize`; ``resize`` None: none) -> ``(x - mean) /
    std``, skipped when an augment normalises itself (FedRDN does). The augments see the
    dataset's images (their statistics, amplitude spectra... are of those), the model the
    resized ones."""

    def __init__(
        self,
        augments: list,
        normalize: Callable[[torch.Tensor], torch.Tensor],
        resize: Resize | None = None,
    ) -> None:
        self.augments = list(augments)
        self.normalize = None if any(a.normalizes for a in self.augments) else normalize
        self.resize = resize

    def _finish(self, x: torch.Tensor) -> torch.Tensor:
        if self.resize is not None:
            x = self.resize(x)
        return self.normalize(x) if self.normalize else x

    def train(
        self, x: torch.Tensor, y: torch.Tensor, state: dict | None, g: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        for a in self.augments:
            out = a.train_batch(x, y, state[aug_key(a)], g)  # type: ignore[index]
            if not _batch(out):
                _broken(out, a, "train_batch", "a tuple (x, y) of tensors of one batch size")
            x, y = out
        return self._finish(x), y

    def eval(self, x: torch.Tensor, state: dict | None) -> torch.Tensor:
        for a in self.augments:
            out = a.eval_batch(x, state[aug_key(a)])  # type: ignore[index]
            if not (isinstance(out, torch.Tensor) and out.shape == x.shape):
                _broken(out, a, "eval_batch", f"a tensor of the batch's shape {tuple(x.shape)}")
            x = out
        return self._finish(x)


def round_steps(n: int, train: TrainConfig) -> int:
    """Mini-batch steps of one round's local work at a client of ``n`` training examples:
    ``train.local_steps``, or ``local_epochs`` x the batches of an epoch (a trailing batch
    of one example is skipped when ``batch_size`` is above 1, as :meth:`ClientContext.batches`
    does)."""
    if train.local_steps is not None:
        return train.local_steps
    full, rest = divmod(n, train.batch_size)
    return train.local_epochs * (full + (1 if rest > 1 else 0))


def _batch(out: Any) -> bool:
    return (
        isinstance(out, tuple)
        and len(out) == 2
        and all(isinstance(t, torch.Tensor) for t in out)
        and out[0].shape[:1] == out[1].shape[:1]
    )


def _broken(value: Any, owner: object, hook: str, want: str) -> None:
    """An augment's hook broke the contract: the error."""
    expect(value, lambda v: False, owner, hook, want)


@dataclass
class ClientContext:
    """One client's round: built by the runtime for every (round, client) and handed to
    ``local_update``, which passes it on to the local loop and its hooks (``loss``,
    ``penalty``, ``before_step``).

    ``scratch`` holds the values an algorithm computes at the start of its local update and
    its hooks read during the round (FedProx's anchor, SCAFFOLD's gradient correction, MOON's
    frozen models, ...). They belong to this (client, round) only: never to the algorithm
    object (which several clients' rounds may share at once), never kept in the client state,
    checkpointed or sent. Each algorithm uses its own keys (``"<algorithm>/<name>"``)."""

    cid: str
    round: int
    data: ClientData
    model: FedModel
    train: TrainConfig
    pipeline: InputPipeline
    generator: torch.Generator
    device: torch.device
    state: dict | None = None  # the client's state (augments read theirs from it)
    task: Task = field(default_factory=Classification)  # the loss (and metrics) of the data
    #: per-round working values of the algorithm (see the class docstring)
    scratch: dict[str, Any] = field(default_factory=dict)
    #: ``privacy.updates=example``: the site's DP-SGD (:mod:`fedshift.core.dpsgd`), which the
    #: default local step applies (:func:`fedshift.algorithms.dp_sgd.dp_sgd_steps`); None: off
    dpsgd: ExampleMechanism | None = None

    @property
    def num_train(self) -> int:
        return len(self.data.train)

    def steps_per_epoch(self) -> int:
        n, bs = self.num_train, self.train.batch_size
        full, rest = divmod(n, bs)
        return full + (1 if rest > 1 else 0)

    def planned_steps(self) -> int:
        """Mini-batch steps of one round's local work (``local_steps`` or epochs x batches)."""
        return round_steps(self.num_train, self.train)

    def batches(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """The round's training batches, through the input pipeline and on the device.

        Each epoch is a fresh permutation drawn from the client's generator. A trailing batch
        of a single example is skipped when the batch size is above 1 (BatchNorm cannot train
        on it); ``steps_per_epoch`` counts the same way. With ``train.batch_size=1`` every
        batch is one example (FedWon's normalisation-free models train so; a model with
        BatchNorm1d raises PyTorch's error).
        """
        split: Split = self.data.train
        n, bs = len(split), self.train.batch_size
        todo = self.planned_steps()
        while todo > 0:
            # drawn on the (CPU) generator, then moved once per epoch to where the data lives
            # (a GPU when it is resident there): no index copy per batch
            perm = torch.randperm(n, generator=self.generator).to(split.x.device)
            for start in range(0, n, bs):
                idx = perm[start : start + bs]
                if idx.numel() < 2 and n > 1 and bs > 1:
                    continue
                x = split.x[idx].to(self.device, non_blocking=True)
                y = split.y[idx].to(self.device, non_blocking=True)
                yield self.pipeline.train(x, y, self.state, self.generator)
                todo -= 1
                if todo == 0:
                    return
