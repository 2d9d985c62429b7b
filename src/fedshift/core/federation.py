"""In-memory federated datasets: one :class:`ClientData` per client (domain).

These are the types the dataset contract (:mod:`fedshift.core.datasets`) and the algorithm
contract (:mod:`fedshift.core.contract`) name, so they live in core, where every loader
imports them from.

Images are float tensors in ``[0, 1]`` of shape ``(N, C, H, W)`` once a benchmark is built,
or, for data read from image files, :class:`~fedshift.core.images.ByteImages`: the stored
uint8 bytes (in memory, in the decode cache's file, or on the GPU) that index as the same
float tensor, converted per batch. Nothing on the training hot path decodes files or runs
per-sample Python code.
Normalisation is *not* baked in: it is part of the input pipeline (see
:mod:`fedshift.runtime.inputs`) so that input-level methods (FedRDN, amplitude
normalisation) see raw images.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from fedshift.core.images import ByteImages, cat_images
from fedshift.core.seeding import generator

SPLITS = ("train", "val", "test")
#: what a federation's labels are: one class per image, or one class per pixel
TASKS = ("classification", "segmentation")


@dataclass
class Split:
    """One split of one client: images ``x`` (float, [0, 1], ``(N, C, H, W)``; or their uint8
    bytes as :class:`~fedshift.core.images.ByteImages`, which index as that float tensor) and
    int64 labels ``y``: ``(N,)`` class indices, or ``(N, H, W)`` label maps for segmentation."""

    x: torch.Tensor | ByteImages
    y: torch.Tensor

    def __post_init__(self) -> None:
        if self.x.shape[0] != self.y.shape[0]:
            raise ValueError(f"split has {self.x.shape[0]} images but {self.y.shape[0]} labels")

    def __len__(self) -> int:
        return int(self.y.shape[0])


@dataclass
class ClientData:
    """The data one client holds: a train, a validation and a test split."""

    name: str
    train: Split
    val: Split
    test: Split

    def split(self, name: str) -> Split:
        if name not in SPLITS:
            raise KeyError(f"unknown split {name!r}; valid: {', '.join(SPLITS)}")
        return getattr(self, name)


@dataclass
class Federation:
    """A federated benchmark: named clients sharing one label space.

    ``task`` is ``classification`` (``y`` holds one class per image) or ``segmentation``
    (``y`` holds one class per pixel, ``classes[0]`` is the background)."""

    name: str
    clients: list[ClientData]
    classes: list[str]
    input_shape: tuple[int, int, int]
    info: dict = field(default_factory=dict)
    task: str = "classification"

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise ValueError(f"Federation.task must be one of {TASKS}, got {self.task!r}")

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @property
    def client_names(self) -> list[str]:
        return [c.name for c in self.clients]

    def client(self, name: str) -> ClientData:
        for c in self.clients:
            if c.name == name:
                return c
        raise KeyError(f"no client {name!r}; clients: {', '.join(self.client_names)}")

    def pooled(self, name: str = "pooled") -> ClientData:
        """All clients' splits concatenated (the centralised "All" oracle trains on this)."""

        def cat(split: str) -> Split:
            parts = [c.split(split) for c in self.clients]
            return Split(cat_images([p.x for p in parts]), torch.cat([p.y for p in parts]))

        return ClientData(name, cat("train"), cat("val"), cat("test"))

    def with_train_fraction(self, fraction: float, seed: int = 0) -> Federation:
        """Each client keeps ``fraction`` of its training split (validation and test
        untouched): per class for classification (at least one example of every class it
        has), uniformly for segmentation; drawn from ``seed`` and the client's name only."""
        if fraction >= 1:
            return self
        clients = []
        for c in self.clients:
            y = c.train.y
            g = generator(seed, "data_fraction", c.name)
            if self.task == "classification":
                keep = []
                for cls in torch.unique(y):
                    idx = torch.nonzero(y == cls).flatten()
                    n = max(1, round(fraction * len(idx)))
                    keep.append(idx[torch.randperm(len(idx), generator=g)[:n]])
                idx = torch.sort(torch.cat(keep)).values
            else:
                n = max(1, round(fraction * len(y)))
                idx = torch.sort(torch.randperm(len(y), generator=g)[:n]).values
            train = Split(c.train.x.index_select(0, idx), y[idx])
            clients.append(ClientData(c.name, train, c.val, c.test))
        info = {**self.info, "data_fraction": fraction}
        return Federation(self.name, clients, self.classes, self.input_shape, info, self.task)

    def storage(self) -> dict[str, dict[str, int]]:
        """How the images are kept, per kind: ``float32`` tensors, or uint8
        :class:`~fedshift.core.images.ByteImages` in ``memory``, read per batch from a
        ``file`` or on a GPU (``device``); the number of splits and bytes of each."""
        out: dict[str, dict[str, int]] = {}
        for c in self.clients:
            for s in SPLITS:
                x = c.split(s).x
                kind = x.storage if isinstance(x, ByteImages) else "float32"
                row = out.setdefault(kind, {"splits": 0, "bytes": 0})
                row["splits"] += 1
                row["bytes"] += x.element_size() * x.nelement()
        return out

    def counts(self) -> dict[str, dict[str, int]]:
        """Per-client example counts per split."""
        return {c.name: {s: len(c.split(s)) for s in SPLITS} for c in self.clients}
