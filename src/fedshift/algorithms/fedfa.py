"""FedFA (Zhou & Konukoglu, "FedFA: Federated Feature Augmentation", ICLR 2023) as an
algorithm name: FedAvg (the paper's server rule, Eq. 1 and Algorithm 1: a uniform 1/M average
over the M clients, ``paper_weighting = "uniform"``) with the ``ffa`` augment, which
puts FFA layers after the model's conv stages and exchanges their statistics (client UP
``ffa_stats``, server DOWN ``ffa_variance``; see :mod:`fedshift.augment.ffa`).

Set the layers' parameters by listing the augment explicitly, e.g.
``augment: [{name: ffa, variant: fedfa-c}]`` or ``{name: ffa, variance: released}``. The
``ffa`` augment also composes with any other algorithm (``algorithm.name=fedprox`` +
``augment=[ffa]``) and with input-level augments such as ``fedrdn``.
"""

from __future__ import annotations

from fedshift.algorithms.base import FLParams
from fedshift.algorithms.fedavg import FedAvg


class FedFA(FedAvg[FLParams]):
    """FedAvg + federated feature augmentation (FFA layers with shared variances)."""

    name = "fedfa"
    #: Eq. 1: the server averages the clients' weights with equal weights 1/M
    paper_weighting = "uniform"

    @classmethod
    def implied_augments(cls, params: FLParams) -> list[str]:
        return ["ffa"]
