"""pFedHN's hypernetwork ``h(v_i; phi)`` (Shamsian et al., ICML 2021, Sec. 3): a learnable
embedding per client, an MLP, one linear head per tensor of the target network."""

from __future__ import annotations

from collections import OrderedDict

import torch
from torch import nn


class HyperNetwork(nn.Module):
    """``h(v_i; phi)``: embedding table -> MLP -> one linear head per target tensor."""

    def __init__(
        self,
        n_clients: int,
        embed_dim: int,
        hidden_dim: int,
        n_hidden: int,
        shapes: dict[str, torch.Size],
    ) -> None:
        super().__init__()
        self.shapes = OrderedDict((k, torch.Size(s)) for k, s in shapes.items())
        self.embeddings = nn.Embedding(n_clients, embed_dim)
        layers: list[nn.Module] = [nn.Linear(embed_dim, hidden_dim)]
        for _ in range(n_hidden):
            layers += [nn.ReLU(), nn.Linear(hidden_dim, hidden_dim)]
        self.mlp = nn.Sequential(*layers)
        self.heads = nn.ModuleDict(
            {self.head_name(k): nn.Linear(hidden_dim, s.numel()) for k, s in self.shapes.items()}
        )

    @staticmethod
    def head_name(key: str) -> str:
        return key.replace(".", "__")

    def forward(self, row: int) -> dict[str, torch.Tensor]:
        """The target network's tensors for the client whose embedding is ``row``."""
        features = self.mlp(self.embeddings.weight[row])
        return {k: self.heads[self.head_name(k)](features).view(s) for k, s in self.shapes.items()}

    def phi(self) -> list[nn.Parameter]:
        """Every parameter except the client embeddings."""
        return [p for n, p in self.named_parameters() if not n.startswith("embeddings.")]
