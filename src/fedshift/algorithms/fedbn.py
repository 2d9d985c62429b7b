"""FedBN (Li et al., "FedBN: Federated Learning on Non-IID Features via Local Batch
Normalization", ICLR 2021, Algorithm 1).

FedAvg whose batch-norm tensors never leave the client: the weight, bias, running mean/var
and batch counter of every BN layer are local, so the broadcast and the reply carry only the
non-BN tensors, and each client is evaluated with its own BN layers (its personalised model).
The official code selects BN tensors by the substring ``bn`` in a key; fedshift asks the model
for its BN layers instead (``FedModel.bn_layer_names``), which cannot miss a renamed layer.
A model with no such tensor (no BN, or HarmoFL's BN without affine parameters or running
statistics, ``model.bn=harmofl``) would leave nothing local and silently run FedAvg: building
the algorithm then fails (:func:`fedshift.algorithms.base.require_bn_tensors`).
"""

from __future__ import annotations

from dataclasses import dataclass

from fedshift.algorithms.base import FLParams
from fedshift.algorithms.bn import BNPolicy
from fedshift.algorithms.fedavg import FedAvg, FedAvgClient


@dataclass
class FedBNParams(FLParams):
    bn_policy: BNPolicy = "local"


class FedBNClient(FedAvgClient[FedBNParams]):
    """FedBN's client half: FedAvg's local update with every BN tensor kept local (the
    server half is FedAvg's weighted mean of the shared, non-BN tensors)."""

    name = "fedbn"
    #: Algorithm 1 averages the shared layers over the K clients with 1/K, and the released
    #: code's ``client_weights`` are uniform (shared/reference/official-code-notes.md)
    paper_weighting = "uniform"
    Params = FedBNParams


class FedBN(FedAvg[FedBNParams], FedBNClient):
    """FedAvg with every BN tensor kept local.

    Both halves: FedAvg's server half and :class:`FedBNClient`."""

    client_half = FedBNClient
