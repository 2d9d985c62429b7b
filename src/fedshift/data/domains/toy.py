"""``toyshift``: a tiny synthetic feature-shift benchmark for tests and smoke runs.

Each class is a fixed random low-frequency pattern; each client sees every class through its
own colour transform (per-channel gain and offset) and noise level, so P(x) differs across
clients while P(y|x) is shared. Generated in memory from the data seed in milliseconds.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from fedshift.core.bounds import bounded
from fedshift.core.datasets import Dataset
from fedshift.core.errors import DataError
from fedshift.core.federation import ClientData, Federation, Split


@dataclass
class ToyParams:
    """The ``dataset.*`` keys of ``toyshift``."""

    clients: int = bounded(3, ge=1)
    classes: int = bounded(10, ge=1)
    train_size: int = bounded(60, ge=1)
    val_size: int = bounded(20, ge=1)
    test_size: int = bounded(20, ge=1)
    seed: int = bounded(0, ge=0)

    def client_names(self) -> list[str]:
        """The clients :func:`load_toy` makes, named without making them."""
        return [f"client{c}" for c in range(self.clients)]

    def memory_bytes(self) -> int:
        """The float32 images of every split of every client, and the two temporaries of
        the same size generating one split takes (a lower bound of what loading needs)."""
        n = self.train_size + self.val_size + self.test_size
        return 4 * 3 * 28 * 28 * (self.clients * n + 2 * max(self.train_size, n - self.train_size))


def load_toy(p: ToyParams) -> Federation:
    """The ``toyshift`` federation (module docstring), generated from ``p.seed``."""
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


@dataclass
class ToySegParams:
    """``toyseg``: per-pixel labels of random discs and boxes on a textured background."""

    clients: int = bounded(3, ge=1)
    size: int = bounded(32, ge=8)
    train_size: int = bounded(24, ge=1)
    val_size: int = bounded(8, ge=1)
    test_size: int = bounded(8, ge=1)
    seed: int = bounded(0, ge=0)

    def client_names(self) -> list[str]:
        """The clients :func:`load_toyseg` makes, named without making them."""
        return [f"client{c}" for c in range(self.clients)]

    def memory_bytes(self) -> int:
        """The float32 images and int64 label maps of every split of every client (a lower
        bound of what loading needs)."""
        n = self.train_size + self.val_size + self.test_size
        return self.clients * n * self.size * self.size * (3 * 4 + 8)


def load_toyseg(p: ToySegParams) -> Federation:
    """``toyseg``: a tiny synthetic segmentation benchmark with feature shift (tests, smoke
    runs). Each image holds one disc (class 1) and one box (class 2) at random places on a
    smooth random background; every client sees them through its own colour gain/offset,
    contrast of the shapes and noise level. Labels never depend on the client."""
    for key in ("clients", "train_size", "val_size", "test_size"):
        if getattr(p, key) < 1:
            raise DataError(f"config key 'dataset.{key}' must be >= 1")
    if p.size < 8:
        raise DataError(f"config key 'dataset.size' must be >= 8, got {p.size}")
    g = torch.Generator().manual_seed(p.seed)
    s = p.size
    coords = torch.arange(s, dtype=torch.float32)
    yy, xx = torch.meshgrid(coords, coords, indexing="ij")

    def shapes(n: int) -> torch.Tensor:
        lab = torch.zeros(n, s, s, dtype=torch.long)
        for i in range(n):
            r = s * (0.12 + 0.1 * float(torch.rand((), generator=g)))
            cy, cx = (s * (0.2 + 0.6 * torch.rand(2, generator=g))).tolist()
            h, w = (s * (0.15 + 0.15 * torch.rand(2, generator=g))).tolist()
            by, bx = (s * 0.6 * torch.rand(2, generator=g)).tolist()
            box = (yy >= by) & (yy < by + h) & (xx >= bx) & (xx < bx + w)
            lab[i][box] = 2
            lab[i][(yy - cy) ** 2 + (xx - cx) ** 2 <= r * r] = 1
        return lab

    clients = []
    for c in range(p.clients):
        gain = 0.5 + 0.5 * torch.rand(1, 3, 1, 1, generator=g)
        offset = 0.3 * torch.rand(1, 3, 1, 1, generator=g)
        contrast = 0.25 + 0.25 * float(torch.rand((), generator=g))
        noise = 0.03 + 0.07 * c / max(p.clients - 1, 1)

        def make(n: int, gain=gain, offset=offset, contrast=contrast, noise=noise) -> Split:
            lab = shapes(n)
            bg = F.interpolate(torch.rand(n, 3, 4, 4, generator=g), size=s, mode="bilinear")
            fg = torch.tensor([0.0, 1.0, -1.0])[lab].unsqueeze(1)  # disc brighter, box darker
            x = (0.5 * bg + contrast * fg) * gain + offset
            x = x + noise * torch.randn(n, 3, s, s, generator=g)
            return Split(x.clamp(0, 1), lab)

        clients.append(
            ClientData(f"client{c}", make(p.train_size), make(p.val_size), make(p.test_size))
        )
    return Federation(
        "toyseg",
        clients,
        ["background", "disc", "box"],
        (3, s, s),
        {"synthetic": True},
        task="segmentation",
    )


# fmt: off
#: this module's datasets (the dataset contract: :mod:`fedshift.core.datasets`)
TOYSHIFT_DATASET, TOYSEG_DATASET = (
    Dataset("toyshift", ToyParams, "classification", load_toy,
            "tiny synthetic feature-shift data for smoke tests"),
    Dataset("toyseg", ToySegParams, "segmentation", load_toyseg,
            "tiny synthetic segmentation data with feature shift (tests)"),
)
# fmt: on
