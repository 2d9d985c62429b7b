"""``toyshift``: a tiny synthetic feature-shift benchmark for tests and smoke runs.

Each class is a fixed random low-frequency pattern; each client sees every class through its
own colour transform (per-channel gain and offset) and noise level, so P(x) differs across
clients while P(y|x) is shared. Generated in memory from the data seed in milliseconds.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from fedshift.data.base import ClientData, Federation, Split
from fedshift.errors import DataError


@dataclass
class ToyParams:
    clients: int = 3
    classes: int = 10
    train_size: int = 60
    val_size: int = 20
    test_size: int = 20
    seed: int = 0


def load_toy(p: ToyParams) -> Federation:
    for key in ("clients", "classes", "train_size", "val_size", "test_size"):
        if getattr(p, key) < 1:
            raise DataError(f"config key 'dataset.{key}' must be >= 1")
    g = torch.Generator().manual_seed(p.seed)
    protos = F.interpolate(torch.rand(p.classes, 3, 7, 7, generator=g), size=28, mode="bilinear")
    clients = []
    for c in range(p.clients):
        gain = 0.5 + torch.rand(1, 3, 1, 1, generator=g)
        offset = 0.3 * torch.rand(1, 3, 1, 1, generator=g)
        noise = 0.05 + 0.1 * c / max(p.clients - 1, 1)

        def make(n: int, gain=gain, offset=offset, noise=noise) -> Split:
            y = torch.arange(n) % p.classes
            x = protos[y] * gain + offset + noise * torch.randn(n, 3, 28, 28, generator=g)
            return Split(x.clamp(0, 1), y.long())

        clients.append(
            ClientData(f"client{c}", make(p.train_size), make(p.val_size), make(p.test_size))
        )
    return Federation(
        "toyshift", clients, [str(i) for i in range(p.classes)], (3, 28, 28), {"synthetic": True}
    )
