"""FedProx (Li et al., "Federated Optimization in Heterogeneous Networks", MLSys 2020)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal, TypeVar

import torch

from fedshift.algorithms.base import FLParams, State, Weighting
from fedshift.algorithms.fedavg import FedAvg, FedAvgClient
from fedshift.core.bounds import bounded
from fedshift.core.context import ClientContext
from fedshift.core.payload import Payload

#: ``ctx.scratch`` key of the round's anchor w_t (the received shared trainable tensors)
ANCHOR = "fedprox/anchor"


@dataclass
class FedProxParams(FLParams):
    mu: float = bounded(0.01, ge=0)
    # "paper": mu/2 * ||w - w_t||^2 (Li et al. 2020, Eq. 2; FedBN's digits code);
    # "sqrt": mu/2 * ||w - w_t|| (FedBN's Office/DomainNet code takes a square root).
    form: Literal["paper", "sqrt"] = "paper"


#: FedProx's Params or a subclass's extension of it (FedNova, the FedAvg-or-FedProx clients)
ProxParamsT = TypeVar("ProxParamsT", bound=FedProxParams)


class FedProxClient(FedAvgClient[ProxParamsT]):
    """FedProx's client half (Li et al., MLSys 2020): FedAvg's local update whose objective
    adds the proximal term h_k(w; w_t) = F_k(w) + mu/2 ||w - w_t||^2 (Eq. 2), over the
    shared trainable tensors. The server half is FedAvg's (the weighted mean)."""

    name = "fedprox"
    #: Sec. 5.1: devices are sampled uniformly and their updates averaged with weights
    #: proportional to their number of local data points, as in FedAvg
    paper_weighting: ClassVar[Weighting] = "samples"
    Params = FedProxParams

    def local_update(self, ctx: ClientContext, down: Payload, state: State) -> Payload:
        ctx.scratch[ANCHOR] = {
            k: down["weights"][k].detach().to(ctx.device) for k in self.shared_param_keys
        }
        try:
            return super().local_update(ctx, down, state)
        finally:
            del ctx.scratch[ANCHOR]

    def penalty(self, ctx: ClientContext) -> torch.Tensor | None:
        """mu/2 ||w - w_t||^2 over the shared trainable tensors (w_t: ``ctx.scratch``'s
        anchor), or mu/2 ||w - w_t|| with ``form=sqrt``."""
        if self.params.mu == 0:
            return None
        params = dict(ctx.model.named_parameters())
        sq = sum(((params[k] - w0) ** 2).sum() for k, w0 in ctx.scratch[ANCHOR].items())
        if self.params.form == "sqrt":
            sq = sq.sqrt()
        return 0.5 * self.params.mu * sq


class FedProx(FedAvg[ProxParamsT], FedProxClient[ProxParamsT]):
    """FedProx (Li et al., MLSys 2020): FedAvg whose local objective adds the proximal term
    h_k(w; w_t) = F_k(w) + mu/2 ||w - w_t||^2 (Eq. 2), over the shared trainable tensors.

    Both halves: FedAvg's server half and :class:`FedProxClient`."""

    client_half = FedProxClient
