"""FedAvg (McMahan et al., AISTATS 2017, Algorithm 1).

FedAvg: each sampled client k starts from the global weights w_t, runs local SGD on its data
and returns w_{t+1}^k; the server sets w_{t+1} = sum_k (n_k / n) w_{t+1}^k (sample-size
weights, ``paper_weighting = "samples"``; ``federation.weighting=uniform`` gives 1/K as FedBN's
code does).

With ``bn_policy`` other than ``global`` the BN tensors named by the policy stay on the
client (see :func:`fedshift.algorithms.base.bn_keys`); FedBN is that with ``local``.

Written in two halves (:mod:`fedshift.algorithms.halves`): :class:`FedAvgClient` (the local
update) and :class:`FedAvgServer` (the weighted mean), joined by :class:`FedAvg`.
"""

from __future__ import annotations

from typing import ClassVar

from fedshift.algorithms.base import ParamsT, Reply, State, Weighting
from fedshift.algorithms.halves import ClientHalf, ServerHalf
from fedshift.core.context import ClientContext
from fedshift.core.disclosure import sums_only
from fedshift.core.payload import Payload


class FedAvgClient(ClientHalf[ParamsT]):
    """FedAvg's client half: local steps from the received shared tensors."""

    name = "fedavg"
    paper_weighting: ClassVar[Weighting] = "samples"  # Alg. 1: w_{t+1} = sum_k (n_k / n) w_{t+1}^k

    def local_update(self, ctx: ClientContext, down: Payload, state: State) -> Payload:
        self.load_client_model(ctx, down["weights"], state)
        steps, loss = self.local_train(ctx, state)
        self.keep_local(ctx, state)
        return self.reply(ctx, state, steps, loss)


class FedAvgServer(ServerHalf[ParamsT]):
    """FedAvg's server half: the weighted mean of the replied shared tensors."""

    @sums_only("weights")  # the weighted mean only: secure aggregation can hide each site
    def aggregate(self, server: State, rnd: int, replies: list[Reply]) -> None:
        self.aggregate_declared(server, replies)  # weights <- the replies' weighted mean


class FedAvg(FedAvgServer[ParamsT], FedAvgClient[ParamsT]):
    """Federated averaging of model weights.

    Both halves: :class:`FedAvgServer` and :class:`FedAvgClient`."""

    client_half = FedAvgClient
