"""HarmoFL (Jiang, Wang & Dou, "HarmoFL: Harmonizing Local and Global Drifts in Federated
Learning on Heterogeneous Medical Images", AAAI 2022, Sec. 3, Alg. 1).

HarmoFL = FedAvg + amplitude normalisation of the inputs + weight perturbation of the local
steps:

* amplitude normalisation (Sec. 3.2, Eq. 2-4; Alg. 1 lines 7-9 and 17): the ``ampnorm``
  augment, implied by this algorithm (:mod:`fedshift.augment.ampnorm`: running mean amplitude
  per client in round 1 started at zero (Eq. 3; ``init`` option), averaged once by the server
  (1/N, Alg. 1 line 17), then every image is rebuilt from the global amplitude and its own
  phase; held-out clients get the global amplitude too). Its released-code variant is chosen
  on the augment: ``augment: [{name: ampnorm, amplitude: released}]``.
* weight perturbation (Sec. 3.3, Eq. 6-7; Alg. 1 lines 10-12): delta_k = alpha * g / ||g||_2
  with one norm over all parameters (Eq. 6), and the gradient at theta + delta_k is applied at
  theta by the base optimiser (Eq. 7; ``train.optimizer``). This is the shared SAM mechanism,
  :meth:`fedshift.algorithms.base.Algorithm.sam_second_pass`, switched on with ``sam_rho``.
  ``rho`` is the paper's alpha = 5e-2 (Sec. 4.1; the released code's ``--alpha``).
* aggregation (Alg. 1 line 16, eta_g = 1): theta <- sum_i p_i theta_i. The paper leaves p_i
  open but truncates every client to the smallest one (Sec. 4.1) for its classification and
  prostate tasks, so p_i = 1/N; the released code uses uniform ``client_weights``.
  ``paper_weighting = "uniform"`` (``federation.weighting: auto``); the suites set it.

Ablations (the paper's appendix Tables 4-6): ``perturbation=false`` keeps amplitude
normalisation only (plain local steps); ``amplitude_norm=false`` keeps weight perturbation
only (no augment implied; then this is FedSAM).

The released models use BatchNorm with ``affine=False, track_running_stats=False``
everywhere (``model.bn=harmofl`` for the U-Net and DenseNet); fedshift's digits models keep
their own BN layers. The released code selects the model by the server model's mean
validation score, which is what fedshift does for every algorithm with a global model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from fedshift.algorithms.base import FLParams, Weighting
from fedshift.algorithms.fedavg import FedAvg
from fedshift.core.bounds import bounded
from fedshift.core.config import TrainConfig
from fedshift.core.errors import ConfigError
from fedshift.models.base import FedModel


@dataclass
class HarmoFLParams(FLParams):
    # alpha of Eq. 6, the perturbation radius (Sec. 4.1: 5e-2; released code: --alpha 0.05)
    rho: float = bounded(0.05, ge=0)
    # weight perturbation on (Eq. 6-7); false: plain local steps (ablation)
    perturbation: bool = True
    # amplitude normalisation on (implies the ``ampnorm`` augment); false: ablation
    amplitude_norm: bool = True


class HarmoFL(FedAvg[HarmoFLParams]):
    """FedAvg + amplitude normalisation (ampnorm augment) + weight-perturbed (SAM) local steps."""

    name = "harmofl"
    Params = HarmoFLParams
    #: Alg. 1 line 16 with the equal-sized (truncated) clients of Sec. 4.1: p_i = 1/N
    paper_weighting: ClassVar[Weighting] = "uniform"

    def setup(self, model: FedModel) -> None:
        self.sam_rho = self.params.rho if self.params.perturbation else None

    @classmethod
    def check(cls, params: HarmoFLParams, train: TrainConfig) -> None:
        if params.perturbation and params.rho <= 0:
            raise ConfigError(
                f"config key 'algorithm.rho' must be > 0 with weight perturbation on "
                f"(got {params.rho}); set algorithm.perturbation=false to switch it off"
            )

    @classmethod
    def implied_augments(cls, params: HarmoFLParams) -> list[str]:
        return ["ampnorm"] if params.amplitude_norm else []
