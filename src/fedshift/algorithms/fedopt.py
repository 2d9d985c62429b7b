"""The FedOpt family (Reddi et al., "Adaptive Federated Optimization", ICLR 2021, Algorithm 2):
FedAdam, FedYogi and FedAdagrad.

With pseudo-gradient Delta_t = avg_k(w^k) - w_t:
  m_t = beta1 m_{t-1} + (1 - beta1) Delta_t
  v_t = v_{t-1} + Delta_t^2                                        (FedAdagrad)
  v_t = v_{t-1} - (1 - beta2) Delta_t^2 sign(v_{t-1} - Delta_t^2)  (FedYogi)
  v_t = beta2 v_{t-1} + (1 - beta2) Delta_t^2                      (FedAdam)
  w_{t+1} = w_t + eta * m_t / (sqrt(v_t) + tau)
with m_{-1} = 0 and v_{-1} = tau^2 as in the paper (no bias correction).
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
class FedOptParams(FLParams):
    server_lr: float = bounded(0.01, gt=0)  # eta
    beta1: float = bounded(0.9, ge=0, lt=1)
    beta2: float = bounded(0.99, ge=0, lt=1)
    tau: float = bounded(1e-3, gt=0)  # the adaptivity (v_{-1} = tau^2, the denominator's +tau)


class FedAdamClient(FedAvgClient[FedOptParams]):
    """FedAdam's client half: FedAvg's local update (the FedOpt methods differ on the
    server only)."""

    name = "fedadam"
    #: Reddi et al., ICLR 2021, Algorithm 2: Delta_t = (1/|S|) sum_{i in S} Delta_i^t (the
    #: FedYogi / FedAdagrad client halves inherit it)
    paper_weighting = "uniform"
    Params = FedOptParams


class FedYogiClient(FedAdamClient):
    """FedYogi's client half: FedAvg's local update."""

    name = "fedyogi"


class FedAdagradClient(FedAdamClient):
    """FedAdagrad's client half: FedAvg's local update."""

    name = "fedadagrad"


class FedAdamServer(ServerOptAlgorithm[FedOptParams]):
    """The FedOpt server step: Adam's second moment (FedYogi and FedAdagrad change it)."""

    def server_vars(self) -> list[StateVar]:
        return [
            *super().server_vars(),
            server_var("m", ABSENT, doc="Adam's first moment (from the first server step)"),
            server_var("v", ABSENT, doc="the second moment (from the first server step)"),
        ]

    def second_moment(self, v: torch.Tensor, d2: torch.Tensor) -> torch.Tensor:
        b2 = self.params.beta2
        return b2 * v + (1 - b2) * d2

    def server_step(self, server: State, delta: Tensors) -> None:
        p = self.params
        m = server.setdefault("m", {k: torch.zeros_like(d) for k, d in delta.items()})
        v = server.setdefault("v", {k: torch.full_like(d, p.tau**2) for k, d in delta.items()})
        for k, d in delta.items():
            m[k] = p.beta1 * m[k] + (1 - p.beta1) * d
            v[k] = self.second_moment(v[k], d * d)
            server["weights"][k] = server["weights"][k] + p.server_lr * m[k] / (v[k].sqrt() + p.tau)


class FedYogiServer(FedAdamServer):
    """Yogi's second moment."""

    def second_moment(self, v: torch.Tensor, d2: torch.Tensor) -> torch.Tensor:
        return v - (1 - self.params.beta2) * d2 * torch.sign(v - d2)


class FedAdagradServer(FedAdamServer):
    """Adagrad's second moment."""

    def second_moment(self, v: torch.Tensor, d2: torch.Tensor) -> torch.Tensor:
        return v + d2


class FedAdam(FedAdamServer, FedAdamClient):
    """FedAvg clients, Adam on the server."""

    client_half = FedAdamClient


class FedYogi(FedYogiServer, FedYogiClient):
    """FedAvg clients, Yogi on the server."""

    client_half = FedYogiClient


class FedAdagrad(FedAdagradServer, FedAdagradClient):
    """FedAvg clients, Adagrad on the server."""

    client_half = FedAdagradClient
