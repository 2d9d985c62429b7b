"""SCAFFOLD (Karimireddy et al., "SCAFFOLD: Stochastic Controlled Averaging for Federated
Learning", ICML 2020, Algorithm 1 with option II).

Server state: global weights x and control variate c; client state: its control c_i (0 at
start, never sent). Each local step corrects the gradient with the drift estimate:
  y <- y - eta_l (g_i(y) - c_i + c)                                 (Alg. 1, line 10)
after K steps the client refreshes its control with option II:
  c_i+ = c_i - c + (x - y) / (K eta_l)                              (Alg. 1, line 12)
and sends Delta y = y - x and Delta c = c_i+ - c_i. The server applies
  x <- x + eta_g * avg(Delta y),    c <- c + (|S| / N) * mean(Delta c)   (lines 16-17)
where avg is the paper's 1/|S| mean (``paper_weighting = "uniform"``: what
``federation.weighting=auto`` resolves to; ``samples`` weights Delta y by n_k instead) and the
control mean is always uniform. Controls exist for trainable shared tensors; buffers (BN running
statistics) are sent as values and plainly averaged.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fedshift.algorithms.base import FLParams, Reply, State, require_sgd
from fedshift.algorithms.fedavg import FedAvg
from fedshift.algorithms.state import StateVar, client_var, replaced, server_var
from fedshift.algorithms.tensors import subset
from fedshift.core.bounds import bounded
from fedshift.core.config import TrainConfig
from fedshift.core.context import ClientContext
from fedshift.core.disclosure import DOWN, UP, Disclosure, Kind, Over, To, When, fixed, tensor_bytes
from fedshift.core.payload import Payload
from fedshift.models.base import FedModel

#: ``ctx.scratch`` key of the round's gradient correction c - c_i (per shared parameter)
CORRECTION = "scaffold/correction"


@dataclass
class ScaffoldParams(FLParams):
    server_lr: float = bounded(1.0, gt=0)


class Scaffold(FedAvg[ScaffoldParams]):
    """Stochastic controlled averaging."""

    name = "scaffold"
    paper_weighting = "uniform"  # Alg. 1, lines 16-17: 1/|S| sums over the sampled clients
    Params = ScaffoldParams

    @classmethod
    def check(cls, params: ScaffoldParams, train: TrainConfig) -> None:
        require_sgd("scaffold", "corrects SGD steps (option II assumes SGD)", train)

    def _zeros(self, model_state: dict) -> dict:
        return {k: torch.zeros_like(model_state[k]) for k in self.shared_param_keys}

    def server_vars(self) -> list[StateVar]:
        return [
            # x <- x + eta_g * avg(Delta y) (its buffers: the replies' mean)
            *replaced(super().server_vars(), "weights", reduce="none"),
            server_var("control", lambda at: self._zeros(at.model.state_dict()),
                       doc="the server control variate c (0 at start)"),
        ]  # fmt: skip

    def client_vars(self) -> list[StateVar]:
        return [
            *super().client_vars(),
            client_var("control", lambda at: self._zeros(at.model.state_dict()),
                       doc="the client's control variate c_i (0 at start, never sent)"),
        ]  # fmt: skip

    def disclosures(self, model: FedModel) -> list[Disclosure]:
        state = model.state_dict()
        params = fixed(tensor_bytes(state, self.shared_param_keys))
        buffers = fixed(tensor_bytes(state, self.shared_buffer_keys))
        return [
            self.down_weights(model, carries=("delta", "buffers")),
            Disclosure("control", DOWN, Kind.UPDATE, When.ROUND, params,
                       "the server control variate c (the mean of the sites' control variates)",
                       carries=("control_delta",)),
            Disclosure("delta", UP, Kind.UPDATE, When.ROUND, params,
                       "the site's model update y - x", to=To.AGGREGATE),
            Disclosure("control_delta", UP, Kind.UPDATE, When.ROUND, params,
                       "the change of the site's control variate (its mean gradient of the round)",
                       to=To.AGGREGATE),
            Disclosure("buffers", UP, Kind.STATISTIC, When.ROUND, buffers,
                       "the shared buffers: BatchNorm running means/variances of the site's "
                       "batches (empty without BatchNorm)", to=To.AGGREGATE, over=Over.BATCH),
        ]  # fmt: skip

    def broadcast(self, server: State, rnd: int, cid: str) -> Payload:
        down = super().broadcast(server, rnd, cid)
        down.records["control"] = server["control"]
        return down

    def local_update(self, ctx: ClientContext, down: Payload, state: State) -> Payload:
        x = down["weights"]
        c = down["control"]
        c_i = state["control"]
        ctx.scratch[CORRECTION] = {
            k: (c[k] - c_i[k]).to(ctx.device) for k in self.shared_param_keys
        }
        try:
            up = super().local_update(ctx, down, state)
        finally:
            del ctx.scratch[CORRECTION]
        steps = int(up.metrics["steps"])
        y = up["weights"]
        scale = 1.0 / (steps * self.train.lr)
        delta_c = {}
        for k in self.shared_param_keys:
            new_ci = c_i[k] - c[k] + (x[k] - y[k]) * scale  # option II
            delta_c[k] = new_ci - c_i[k]
            c_i[k] = new_ci
        return Payload(
            {
                "delta": {k: y[k] - x[k] for k in self.shared_param_keys},
                "control_delta": delta_c,
                "buffers": subset(y, self.shared_buffer_keys),
            },
            num_examples=up.num_examples,
            metrics=up.metrics,
        )

    def before_step(self, ctx: ClientContext) -> None:
        """Alg. 1, line 10: the gradient g_i(y) becomes g_i(y) - c_i + c."""
        correction = ctx.scratch[CORRECTION]
        for name, p in ctx.model.named_parameters():
            corr = correction.get(name)
            if corr is not None and p.grad is not None:
                p.grad.add_(corr)

    def aggregate(self, server: State, rnd: int, replies: list[Reply]) -> None:
        weights = server["weights"]
        delta = self.average_record(replies, "delta")
        for k, d in delta.items():
            weights[k] = weights[k] + self.params.server_lr * d
        mean_dc = {
            k: torch.stack([p["control_delta"][k] for _, p in replies]).mean(0)
            for k in self.shared_param_keys
        }
        frac = len(replies) / self.num_clients
        server["control"] = {k: server["control"][k] + frac * mean_dc[k] for k in mean_dc}
        if self.shared_buffer_keys:
            weights.update(self.average_record(replies, "buffers"))
