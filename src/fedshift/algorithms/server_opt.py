"""Server-side optimisers over the pseudo-gradient (shared by FedAvgM and the FedOpt family).

After averaging the clients' weights, the server treats Delta_t = avg_k(w_{t+1}^k) - w_t as a
pseudo-gradient and updates w_t with its own optimiser. Only trainable parameters go through
the optimiser; buffers (BN running statistics, counters) take the plain average, since a
momentum or adaptive step on a running variance could drive it negative.

:class:`ServerOptAlgorithm` is a server half (:mod:`fedshift.algorithms.halves`): each method
joins it (with its ``server_step``) to a client half that is FedAvg's local update under the
method's own spec (name, ``Params``, weighting), so a pool worker or SuperNode builds that
client half only.
"""

from __future__ import annotations

from fedshift.algorithms.base import ParamsT, Reply, State
from fedshift.algorithms.fedavg import FedAvgServer
from fedshift.algorithms.state import StateVar, replaced
from fedshift.core.disclosure import sums_only
from fedshift.core.payload import Tensors


class ServerOptAlgorithm(FedAvgServer[ParamsT]):
    """The server half of FedAvg clients with a server optimiser; subclasses implement
    ``server_step`` on the pseudo-gradient."""

    def server_vars(self) -> list[StateVar]:
        """``weights``: updated by the server step (its buffers: the replies' mean)."""
        return replaced(super().server_vars(), "weights", reduce="none")

    @sums_only("weights")  # the server step reads the weighted mean only
    def aggregate(self, server: State, rnd: int, replies: list[Reply]) -> None:
        avg = self.average_record(replies, "weights")
        weights = server["weights"]
        delta = {k: avg[k] - weights[k] for k in self.shared_param_keys}
        self.server_step(server, delta)
        for k in self.shared_buffer_keys:
            weights[k] = avg[k]

    def server_step(self, server: State, delta: Tensors) -> None:
        raise NotImplementedError
