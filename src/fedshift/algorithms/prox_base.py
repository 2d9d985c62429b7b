"""A local trainer to choose for server-side rules that their papers apply on top of another
algorithm (FedDG-GA, Zhang et al. CVPR 2023, ships its weight adjustment on FedAvg and FedProx;
FedHEAL, Chen et al. CVPR 2024, is a switch on top of FedAvg): ``base=fedavg`` runs FedAvg's
local update (plain local objective), ``base=fedprox`` FedProx's (the proximal term
mu/2 ||w - w_t||^2, Li et al. 2020, Eq. 2, with FedProx's ``mu`` and ``form``, which are read
only with ``base=fedprox``).

The server rule subclasses :class:`FedAvgOrProxClient` and wraps ``local_update`` /
``aggregate``; the local objective is the chosen base's, unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Literal, TypeVar

import torch

from fedshift.algorithms.base import State
from fedshift.algorithms.fedavg import FedAvg
from fedshift.algorithms.fedprox import FedProx, FedProxParams
from fedshift.core.config import TrainConfig
from fedshift.core.context import ClientContext
from fedshift.core.errors import ConfigError
from fedshift.core.payload import Payload


@dataclass
class ProxBaseParams(FedProxParams):
    #: the local trainer under the server rule: FedAvg's or FedProx's local objective
    base: Literal["fedavg", "fedprox"] = "fedavg"


#: ProxBaseParams or a subclass's extension of it (FedDG-GA, FedHEAL)
ProxBaseParamsT = TypeVar("ProxBaseParamsT", bound=ProxBaseParams)


class FedAvgOrProxClient(FedProx[ProxBaseParamsT]):
    """FedAvg's or FedProx's client update, chosen by ``params.base``."""

    Params = ProxBaseParams

    @classmethod
    def check(cls, params: ProxBaseParams, train: TrainConfig) -> None:
        """FedProx's keys changed from their defaults under ``base=fedavg`` would be silently
        unused: refuse them."""
        if params.base == "fedprox":
            return
        defaults = {f.name: f.default for f in fields(FedProxParams)}
        changed = [k for k in ("mu", "form") if getattr(params, k) != defaults[k]]
        if changed:
            keys = ", ".join(f"algorithm.{k}" for k in changed)
            raise ConfigError(
                f"algorithm '{cls.name}': FedProx's keys ({keys}) are read only with "
                "algorithm.base=fedprox (the default base is fedavg): set "
                "algorithm.base=fedprox or drop them"
            )

    def local_update(self, ctx: ClientContext, down: Payload, state: State) -> Payload:
        if self.params.base == "fedprox":
            return super().local_update(ctx, down, state)
        return FedAvg.local_update(self, ctx, down, state)

    def penalty(self, ctx: ClientContext) -> torch.Tensor | None:
        return super().penalty(ctx) if self.params.base == "fedprox" else None
