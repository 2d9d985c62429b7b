"""Centralised training on the pooled data of all clients (the papers' "All" oracle).

One model is trained on the union of every client's training split (a round is one pass of
local work over the pool) and evaluated on each client's validation and test split. It is an
upper reference, not a federated method: no data would be pooled in a real federation, so
the ledger records no traffic."""

from __future__ import annotations

from fedshift.algorithms.fedavg import FedAvg
from fedshift.core.federation import ClientData, Federation


class Centralised(FedAvg[None]):
    """Pooled-data oracle."""

    name = "central"
    Params = None
    communicates = False

    @classmethod
    def training_data(cls, federation: Federation) -> list[ClientData]:
        return [federation.pooled()]
