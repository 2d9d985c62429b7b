"""Federated algorithms: one module per method, registered by name."""

from __future__ import annotations

from fedshift.algorithms.base import Algorithm
from fedshift.algorithms.central import Centralised
from fedshift.algorithms.fedavg import FedAvg
from fedshift.algorithms.fedavgm import FedAvgM
from fedshift.algorithms.fedbn import FedBN
from fedshift.algorithms.fednova import FedNova
from fedshift.algorithms.fedopt import FedAdagrad, FedAdam, FedYogi
from fedshift.algorithms.fedprox import FedProx
from fedshift.algorithms.fedsam import FedSAM
from fedshift.algorithms.local import LocalOnly
from fedshift.algorithms.scaffold import Scaffold
from fedshift.core.registry import Registry

ALGORITHMS: Registry[type[Algorithm]] = Registry("algorithm")
for _cls in (
    FedAvg,
    FedBN,
    FedProx,
    FedAvgM,
    FedAdam,
    FedYogi,
    FedAdagrad,
    FedNova,
    Scaffold,
    LocalOnly,
    Centralised,
    FedSAM,
):
    ALGORITHMS.add(_cls.name, _cls, _cls.Params)


def register(cls: type[Algorithm]) -> type[Algorithm]:
    """Class decorator for algorithm modules imported below."""
    ALGORITHMS.add(cls.name, cls, cls.Params)
    return cls


from fedshift.algorithms import (  # noqa: E402, F401
    advprop,
    distrans,
    fedaws,
    fedfa,
    fedproto,
    fedrdn,
    fedrobust,
    fraug,
    harmofl,
    moon,
    partialfed,
    pfedavg,
    pfedhn,
    pfedme,
)

__all__ = ["ALGORITHMS", "Algorithm", "register"]
