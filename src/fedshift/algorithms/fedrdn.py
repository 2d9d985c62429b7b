"""FedRDN as an algorithm name: FedAvg with the ``fedrdn`` augment (the method's default
flow). FedRDN composes with any algorithm: ``augment: [fedrdn]`` on top of FedProx, FedBN,
SCAFFOLD, FedFA ... is the same plug-in (see :mod:`fedshift.augment.fedrdn`)."""

from __future__ import annotations

from fedshift.algorithms.base import FLParams
from fedshift.algorithms.fedavg import FedAvg


class FedRDNAlgorithm(FedAvg[FLParams]):
    """FedAvg + random normalisation with federation statistics."""

    name = "fedrdn"

    @classmethod
    def implied_augments(cls, params: FLParams) -> list[str]:
        return ["fedrdn"]
