"""FedNova (Wang et al., "Tackling the Objective Inconsistency Problem in Heterogeneous
Federated Optimization", NeurIPS 2020): normalised averaging.

Client i runs tau_i local steps; its cumulative update is w_t - y_i = eta * G_i a_i, where
a_i weighs the tau_i gradients (all ones for plain SGD). It sends the *normalised* gradient
d_i = (w_t - y_i) / (eta * ||a_i||_1) and ||a_i||_1. The server removes the bias towards clients
that took more steps by rescaling with the effective step count:
  tau_eff = sum_i p_i ||a_i||_1,    w_{t+1} = w_t - tau_eff * eta * sum_i p_i d_i.
||a_i||_1 is tau for plain SGD; [tau - rho (1 - rho^tau) / (1 - rho)] / (1 - rho) with
momentum rho; [1 - (1 - eta mu)^tau] / (eta mu) with a proximal term mu (Sec. 4 and App. of
the paper). Buffers (BN running statistics) are plainly averaged.
"""

from __future__ import annotations

from dataclasses import dataclass

from fedshift.algorithms.base import Reply, State, require_sgd
from fedshift.algorithms.fedprox import FedProx, FedProxParams
from fedshift.algorithms.state import StateVar, replaced
from fedshift.algorithms.tensors import subset
from fedshift.core.bounds import bounded
from fedshift.core.config import TrainConfig
from fedshift.core.context import ClientContext
from fedshift.core.disclosure import UP, Disclosure, Kind, Over, To, When, fixed, tensor_bytes
from fedshift.core.errors import ConfigError
from fedshift.core.payload import Payload
from fedshift.models.base import FedModel


@dataclass
class FedNovaParams(FedProxParams):
    mu: float = bounded(0.0, ge=0)  # optional proximal term (FedNova on top of FedProx)


def a_norm(tau: int, lr: float, momentum: float = 0.0, mu: float = 0.0) -> float:
    """||a_i||_1 for tau local SGD steps with the given momentum or proximal coefficient."""
    if momentum > 0:
        rho = momentum
        return (tau - rho * (1 - rho**tau) / (1 - rho)) / (1 - rho)
    if mu > 0:
        q = 1 - lr * mu
        return (1 - q**tau) / (lr * mu)
    return float(tau)


class FedNova(FedProx[FedNovaParams]):
    """Normalised averaging of local updates."""

    name = "fednova"
    paper_weighting = "samples"  # Wang et al. 2020, Eq. 6-7: p_i = n_i / n
    Params = FedNovaParams

    @classmethod
    def check(cls, params: FedNovaParams, train: TrainConfig) -> None:
        require_sgd("fednova", "normalises SGD updates", train)
        if params.mu > 0 and train.momentum > 0:
            raise ConfigError(
                "algorithm 'fednova': algorithm.mu > 0 together with train.momentum > 0 is not "
                "supported (||a_i||_1 is implemented for one of them); set one to 0"
            )

    def disclosures(self, model: FedModel) -> list[Disclosure]:
        state = model.state_dict()
        return [
            self.down_weights(model, carries=("normalized_grad", "buffers")),
            Disclosure("normalized_grad", UP, Kind.UPDATE, When.ROUND,
                       fixed(tensor_bytes(state, self.shared_param_keys)),
                       "the site's normalised update (x - y) / (lr a_i)", to=To.AGGREGATE),
            Disclosure("buffers", UP, Kind.STATISTIC, When.ROUND,
                       fixed(tensor_bytes(state, self.shared_buffer_keys)),
                       "the shared buffers: BatchNorm running means/variances of the site's "
                       "batches (empty without BatchNorm)", to=To.AGGREGATE, over=Over.BATCH),
        ]  # fmt: skip

    def local_update(self, ctx: ClientContext, down: Payload, state: State) -> Payload:
        start = down["weights"]
        up = super().local_update(ctx, down, state)
        tau = int(up.metrics["steps"])
        if tau == 0:
            raise ValueError(f"client {ctx.cid} took no local step")
        norm = a_norm(tau, self.train.lr, self.train.momentum, self.params.mu)
        y = up["weights"]
        scale = 1.0 / (self.train.lr * norm)
        d = {k: (start[k].to(y[k].device) - y[k]) * scale for k in self.shared_param_keys}
        return Payload(
            {"normalized_grad": d, "buffers": subset(y, self.shared_buffer_keys)},
            num_examples=up.num_examples,
            metrics=up.metrics,
            config={"a_norm": norm},
        )

    def server_vars(self) -> list[StateVar]:
        """``weights``: the normalised-gradient step (its buffers: the replies' mean)."""
        return replaced(super().server_vars(), "weights", reduce="none")

    def aggregate(self, server: State, rnd: int, replies: list[Reply]) -> None:
        w = [self.reply_weight(p) for _, p in replies]
        total = sum(w)
        p_i = [x / total for x in w]
        tau_eff = sum(p * float(r.config["a_norm"]) for p, (_, r) in zip(p_i, replies, strict=True))
        weights = server["weights"]
        for k in self.shared_param_keys:
            step = sum(p * r["normalized_grad"][k] for p, (_, r) in zip(p_i, replies, strict=True))
            weights[k] = weights[k] - tau_eff * self.train.lr * step
        if self.shared_buffer_keys:
            weights.update(self.average_record(replies, "buffers"))
