"""FedSAM (Qu et al., "Generalized Federated Learning via Sharpness Aware Minimization",
ICML 2022; Caldarola et al., ECCV 2022): FedAvg whose clients use SAM as the local optimiser.

Each local step computes epsilon = rho * g / ||g|| at w, takes the gradient at w + epsilon and
applies it at w with the base optimiser (``train.optimizer``). The mechanism is shared with
HarmoFL's weight perturbation: :meth:`fedshift.algorithms.base.Algorithm.sam_second_pass`.
"""

from __future__ import annotations

from dataclasses import dataclass

from fedshift.algorithms.base import FLParams
from fedshift.algorithms.fedavg import FedAvg
from fedshift.core.bounds import bounded
from fedshift.models.base import FedModel


@dataclass
class FedSAMParams(FLParams):
    rho: float = bounded(0.05, ge=0)  # SAM's radius: epsilon = rho * g / ||g||


class FedSAM(FedAvg[FedSAMParams]):
    """FedAvg with sharpness-aware local steps."""

    name = "fedsam"
    Params = FedSAMParams

    def setup(self, model: FedModel) -> None:
        self.sam_rho = self.params.rho
