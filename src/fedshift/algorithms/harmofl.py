"""HarmoFL (Jiang, Wang & Dou, "HarmoFL: Harmonizing Local and Global Drifts in Federated
Learning on Heterogeneous Medical Images", AAAI 2022).

HarmoFL = FedAvg + amplitude normalisation of the inputs + weight perturbation of the local
steps:

* amplitude normalisation (Eq. 2-4): the ``ampnorm`` augment, implied by this algorithm
  (:mod:`fedshift.augment.ampnorm`: running mean amplitude per client in round 1, averaged
  once by the server, then every image is rebuilt from the global amplitude and its own
  phase). Its released-code variant is chosen on the augment:
  ``augment: [{name: ampnorm, amplitude: released}]``.
* weight perturbation (Eq. 6-7): epsilon = rho * g / ||g|| with one norm over all
  parameters; the gradient at w + epsilon is applied at w by the base optimiser
  (``train.optimizer``). This is the shared SAM mechanism,
  :meth:`fedshift.algorithms.base.Algorithm.sam_second_pass`, switched on with ``sam_rho``.
  rho = 0.05 (the released code's ``--alpha``).

Ablations (the paper's appendix Tables 4-6): ``perturbation=false`` keeps amplitude
normalisation only (plain local steps); ``amplitude_norm=false`` keeps weight perturbation
only (no augment implied; then this is FedSAM).

The released models use BatchNorm with ``affine=False, track_running_stats=False``
everywhere; fedshift's models keep their own BN layers (not required to reproduce the method).
The released code selects the model by the server model's mean validation score, which is
what fedshift does for every algorithm with a global model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fedshift.algorithms import register
from fedshift.algorithms.base import FLParams
from fedshift.algorithms.fedavg import FedAvg
from fedshift.config import TrainConfig
from fedshift.errors import ConfigError


@dataclass
class HarmoFLParams(FLParams):
    # perturbation radius of Eq. 6 (released code: --alpha 0.05)
    rho: float = 0.05
    # weight perturbation on (Eq. 6-7); false: plain local steps (ablation)
    perturbation: bool = True
    # amplitude normalisation on (implies the ``ampnorm`` augment); false: ablation
    amplitude_norm: bool = True


@register
class HarmoFL(FedAvg):
    """FedAvg + amplitude normalisation (ampnorm augment) + weight-perturbed (SAM) local steps."""

    name = "harmofl"
    Params = HarmoFLParams

    def __init__(self, params: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(params, *args, **kwargs)
        self.sam_rho = params.rho if params.perturbation else None

    @classmethod
    def check(cls, params: Any, train: TrainConfig) -> None:
        if params.perturbation and params.rho <= 0:
            raise ConfigError(
                f"config key 'algorithm.rho' must be > 0 with weight perturbation on "
                f"(got {params.rho}); set algorithm.perturbation=false to switch it off"
            )

    @classmethod
    def implied_augments(cls, params: Any) -> list[str]:
        return ["ampnorm"] if params.amplitude_norm else []
