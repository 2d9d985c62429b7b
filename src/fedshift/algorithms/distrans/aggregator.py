"""DisTrans's offset aggregation network (Yuan et al., ECCV 2022, Sec. 4.4): the server
network mapping a client's embedding (and offset) to its aggregated offset, its inputs and
its regression on the uploaded offsets."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


# ----------------------------------------------------------------------------- NN aggregator
class OffsetAggregator(nn.Module):
    """Section 4.4's server network: (client embedding, client offset) -> aggregated offset.

    The embedding (C values) goes through an MLP (C -> hidden -> hidden). With
    ``offset_input`` the client's offset goes through a convolutional encoder (3 x 3 conv to
    ``width`` channels, ReLU, average-pooled to 4 x 4, linear to ``hidden``) and the two codes
    are concatenated; without it (the released generator) the embedding alone is the input.
    Then a linear layer to a 100-d code and the generator: transposed convolutions 1 -> 4 x 4
    (kernel 4), stride-2 doublings until the largest input side is covered, channels
    ``width * 2^k`` halving down to ``width`` and finally the input's channels -> centre crop
    to H x W -> tanh. For 3 x 64 x 64 the generator is the released one's layer shape
    (``ngf`` = 64) without its BN layers. Weights: He-uniform, biases zero (the released
    ``weights_init_uniform`` for linear layers; applied to the convolutions too).
    """

    CODE = 100

    def __init__(
        self,
        num_classes: int,
        shape: tuple[int, ...],
        hidden: int = 100,
        width: int = 64,
        offset_input: bool = False,
    ) -> None:
        super().__init__()
        c, h, w = (int(s) for s in shape)
        self.shape = (c, h, w)
        self.mlp = nn.Sequential(
            nn.Linear(num_classes, hidden), nn.ReLU(), nn.Linear(hidden, hidden)
        )
        self.encoder = (
            nn.Sequential(
                nn.Conv2d(c, width, 3, padding=1),
                nn.ReLU(),
                nn.AdaptiveAvgPool2d(4),
                nn.Flatten(),
                nn.Linear(width * 16, hidden),
            )
            if offset_input
            else None
        )
        self.fc = nn.Linear(hidden * (2 if offset_input else 1), self.CODE)
        ups = max(0, math.ceil(math.log2(max(h, w) / 4)))
        outs = [width * 2 ** (ups - 1 - i) for i in range(ups)] + [c]
        layers: list[nn.Module] = [nn.ConvTranspose2d(self.CODE, outs[0], 4, 1, 0)]
        for i in range(1, len(outs)):
            layers += [nn.ReLU(), nn.ConvTranspose2d(outs[i - 1], outs[i], 4, 2, 1)]
        self.deconv = nn.Sequential(*layers)
        self.size = 4 * 2**ups
        for m in self.modules():  # the released init for linear layers (He uniform, zero bias);
            # the same for the convolutions, which have no BN here to rescale them
            if isinstance(m, nn.Linear | nn.ConvTranspose2d | nn.Conv2d):
                nn.init.kaiming_uniform_(m.weight, nonlinearity="relu")
                assert m.bias is not None  # every layer here is built with one
                nn.init.zeros_(m.bias)

    def forward(self, e: torch.Tensor, t: torch.Tensor | None = None) -> torch.Tensor:
        """(N, C) embeddings [+ (N, c, h, w) offsets] -> (N, c, h, w) offsets in [-1, 1]."""
        code = self.mlp(e)
        if self.encoder is not None:
            if t is None:
                raise ValueError("this offset aggregator also takes the clients' offsets")
            code = torch.cat([code, self.encoder(t)], dim=1)
        out = self.deconv(self.fc(code).view(e.shape[0], self.CODE, 1, 1))
        c, h, w = self.shape
        top, left = (self.size - h) // 2, (self.size - w) // 2
        return torch.tanh(out[:, :, top : top + h, left : left + w])


def label_proportions(counts: torch.Tensor) -> torch.Tensor:
    """Label counts -> each client's own label distribution (rows sum to 1; released input)."""
    counts = counts.float()
    return counts / counts.sum(dim=-1, keepdim=True).clamp_min(1e-12)


def class_share(counts: torch.Tensor) -> torch.Tensor:
    """(clients, classes) label counts -> Section 4.4's embeddings: e_ij = the fraction of
    class j's training data that is on client i (columns sum to 1; a class nobody holds is
    0 for every client)."""
    counts = counts.float()
    return counts / counts.sum(dim=0, keepdim=True).clamp_min(1e-12)


#: one regression pair: (embedding, input offset or None, uploaded offset)
AggPair = tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]


def train_aggregator(
    agg: OffsetAggregator, pairs: list[AggPair], steps: int, lr: float
) -> list[float]:
    """Section 4.4's regression: minimise ||t_i - agg(e_i, t_in)||^2 by SGD, ``steps`` passes,
    one step per pair in the given order (hyperMACFed.py). Returns each pass's mean MSE,
    measured as it trains."""
    agg.train()
    opt = torch.optim.SGD(agg.parameters(), lr=lr)
    history = []
    for _ in range(steps):
        total = 0.0
        for e, t_in, t in pairs:
            opt.zero_grad(set_to_none=True)
            out = agg(e[None], None if t_in is None else t_in[None])[0]
            loss = F.mse_loss(out, t)
            loss.backward()
            opt.step()
            total += float(loss.detach())
        history.append(total / max(len(pairs), 1))
    return history
