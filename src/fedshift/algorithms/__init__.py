"""Federated algorithms: one module per method, each registered below by one
:meth:`~fedshift.core.registry.Registry.add` call (the style every registry uses: models,
augments, datasets)."""

from __future__ import annotations

from fedshift.algorithms.adcol import ADCOL
from fedshift.algorithms.advprop import AdvProp
from fedshift.algorithms.base import Algorithm
from fedshift.algorithms.central import Centralised
from fedshift.algorithms.distrans.algorithm import DisTrans
from fedshift.algorithms.elcfs import ELCFS
from fedshift.algorithms.fedavg import FedAvg
from fedshift.algorithms.fedavgm import FedAvgM
from fedshift.algorithms.fedaws import FedAwS
from fedshift.algorithms.fedbn import FedBN
from fedshift.algorithms.fedclip import FedCLIP
from fedshift.algorithms.feddg_ga import FedDGGA
from fedshift.algorithms.fedfa import FedFA
from fedshift.algorithms.fedheal import FedHEAL
from fedshift.algorithms.fediir import FedIIR
from fedshift.algorithms.fednova import FedNova
from fedshift.algorithms.fedopt import FedAdagrad, FedAdam, FedYogi
from fedshift.algorithms.fedproto import FedProto
from fedshift.algorithms.fedprox import FedProx
from fedshift.algorithms.fedrdn import FedRDNAlgorithm
from fedshift.algorithms.fedrobust import FedRobust
from fedshift.algorithms.fedsam import FedSAM
from fedshift.algorithms.fedsr import FedSR
from fedshift.algorithms.fedwon import FedWon
from fedshift.algorithms.fpl import FPL
from fedshift.algorithms.fraug.algorithm import FRAug
from fedshift.algorithms.harmofl import HarmoFL
from fedshift.algorithms.local import LocalOnly
from fedshift.algorithms.moon import MOON
from fedshift.algorithms.partialfed import PartialFed
from fedshift.algorithms.pfedavg import FedAvgFT
from fedshift.algorithms.pfedhn.algorithm import PFedHN
from fedshift.algorithms.pfedme import PFedMe
from fedshift.algorithms.scaffold import Scaffold
from fedshift.core.registry import Registry

ALGORITHMS: Registry[type[Algorithm]] = Registry("algorithm")
# an algorithm class carries its registry name and Params (what a plug-in class declares)
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
    AdvProp,
    DisTrans,
    FedAwS,
    FedFA,
    FedProto,
    FedRDNAlgorithm,
    FedRobust,
    FRAug,
    HarmoFL,
    MOON,
    PartialFed,
    FedAvgFT,
    PFedHN,
    PFedMe,
    FedSR,
    FedIIR,
    FedDGGA,
    FedHEAL,
    FPL,
    ADCOL,
    ELCFS,
    FedWon,
    FedCLIP,
):
    ALGORITHMS.add(_cls.name, _cls, _cls.Params)

__all__ = ["ALGORITHMS", "Algorithm"]
