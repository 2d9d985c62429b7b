"""FedAvgM (Hsu, Qi & Brown, "Measuring the Effects of Non-Identical Data Distribution for
Federated Visual Classification", 2019): FedAvg with server momentum.

With pseudo-gradient Delta_t = avg_k(w^k) - w_t, the server keeps a momentum buffer
v_t = beta * v_{t-1} + Delta_t and sets w_{t+1} = w_t + eta_s * v_t
(beta = ``server_momentum``, eta_s = ``server_lr``; beta = 0, eta_s = 1 is FedAvg).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fedshift.algorithms.base import FLParams, State
from fedshift.algorithms.fedavg import FedAvgClient
from fedshift.algorithms.server_opt import ServerOptAlgorithm
from fedshift.algorithms.state import ABSENT, StateVar, server_var
from fedshift.core.bounds import bounded
from fedshift.core.payload import Tensors


@dataclass
class FedAvgMParams(FLParams):
    server_lr: float = bounded(1.0, gt=0)
    server_momentum: float = bounded(0.9, ge=0, lt=1)


class FedAvgMClient(FedAvgClient[FedAvgMParams]):
    """FedAvgM's client half: FedAvg's local update (the method is its server step)."""

    name = "fedavgm"
    paper_weighting = "samples"  # Hsu et al. 2019: the FedAvg pseudo-gradient, n_k-weighted
    Params = FedAvgMParams


class FedAvgMServer(ServerOptAlgorithm[FedAvgMParams]):
    """FedAvgM's server half: momentum on the pseudo-gradient."""

    def server_vars(self) -> list[StateVar]:
        return [
            *super().server_vars(),
            server_var("momentum", ABSENT, doc="the server momentum (from the first step)"),
        ]

    def server_step(self, server: State, delta: Tensors) -> None:
        p = self.params
        v = server.setdefault("momentum", {k: torch.zeros_like(d) for k, d in delta.items()})
        for k, d in delta.items():
            v[k].mul_(p.server_momentum).add_(d)
            server["weights"][k] = server["weights"][k] + p.server_lr * v[k]


class FedAvgM(FedAvgMServer, FedAvgMClient):
    """FedAvg with server momentum."""

    client_half = FedAvgMClient
