"""FedHEAL (Chen, Huang, Ye; "Fair Federated Learning under Domain Skew with Local
Consistency and Domain Diversity", CVPR 2024, arXiv 2405.16585): two server-side fairness
rules on top of a local trainer (the released code's ``--wHEAL 1`` on FedAvg).

Source of each element. The search corpus holds the paper's abstract only (equation numbers
unverified); the rules below are taken from the released code,
https://github.com/yuhangchen0/FedHEAL: ``models/fedavgheal.py`` (round loop) and
``models/utils/federated_model.py`` (``consistency_mask``, ``compute_distance``,
``get_params_diff_weights``, ``aggregate_nets_parameter``). The abstract names the two parts:
discarding unimportant parameter updates by their directional consistency (FPHL) and a fair,
domain-diversity-aware aggregation (FAEL).

Client i, after its local training (the base's local update), with the received global model
w and its trained model w_i:

1. update u_i = w - w_i, per element of every shared floating-point tensor (the code takes
   every state-dict tensor, BN running statistics included);
2. consistency mask (FPHL): the client keeps h_i, per element the fraction of its past rounds
   in which u_i >= 0. At its first round m_i = 1 and h_i = 1[u_i >= 0]; afterwards
   c_i = h_i where u_i >= 0 else 1 - h_i, m_i = 1[c_i > tau] (computed before h_i is
   updated), then h_i <- (t h_i + 1[u_i >= 0]) / (t + 1) with t its number of past rounds.
   The masked update is u~_i = m_i * u_i;
3. domain-diversity distance D_i = sum over the trainable tensors of ||u~_i||_2 (a sum of
   per-tensor norms, not one global norm; BN buffers excluded), sent as a reply metric.

Server (FAEL), with the last known distance of every client that ever replied:

4. delta_i <- (1 - beta) delta_i + beta D_i / sum_j D_j;  p_i <- p_i + delta_i (p_i starts at
   1 / (number of replies), the code's; with ``federation.weighting=samples`` at n_i / n over
   the replies); the round's weights are the p_i normalised over the replies (p_i itself
   stays unnormalised across rounds, as in the code);
5. element-wise aggregation: alpha_i = p_i m_i / sum_j p_j m_j (alpha_i = p_i where no client
   kept the element), w <- w - sum_i alpha_i u~_i.

Integer buffers (BN batch counters; the code subtracts a float update from them) are averaged
with the round's weights p. Histories count a client's own rounds; the code counts the global
round index, which is the same when every client trains every round (the paper's setting).
Composition: ``base=fedavg`` (default, the paper's) or ``base=fedprox``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fedshift.algorithms.base import Reply, State
from fedshift.algorithms.prox_base import FedAvgOrProxClient, ProxBaseParams
from fedshift.algorithms.state import StateVar, client_var, replaced, server_var
from fedshift.algorithms.tensors import subset, weighted_average
from fedshift.core.bounds import bounded
from fedshift.core.context import ClientContext
from fedshift.core.disclosure import UP, Disclosure, Kind, To, When, fixed, tensor_bytes
from fedshift.core.payload import Payload, Tensors
from fedshift.models.base import FedModel

#: reply metric: the client's diversity distance D_i (step 3)
DISTANCE = "heal/distance"


@dataclass
class FedHEALParams(ProxBaseParams):
    threshold: float = bounded(0.3, ge=0, lt=1)  # tau of step 2 (main.py --threshold)
    beta: float = bounded(0.4, ge=0, le=1)  # momentum of step 4 (main.py --beta)


def consistency_mask(
    update: Tensors, history: Tensors, rounds: int, threshold: float
) -> tuple[Tensors, Tensors]:
    """Step 2: (mask m_i, new history h_i) from this round's update ``update`` and the
    history after ``rounds`` earlier rounds (ignored when ``rounds`` is 0)."""
    mask, new = {}, {}
    for k, u in update.items():
        up = (u >= 0).to(u.dtype)
        if rounds == 0:
            mask[k] = torch.ones_like(u, dtype=torch.bool)
            new[k] = up
            continue
        h = history[k]
        mask[k] = torch.where(u >= 0, h, 1 - h) > threshold
        new[k] = (h * rounds + up) / (rounds + 1)
    return mask, new


def distance(masked: Tensors, keys: list[str]) -> float:
    """Step 3: D_i = sum_k ||u~_i[k]||_2 over the tensors ``keys``."""
    return float(sum(float(torch.linalg.vector_norm(masked[k])) for k in keys))


def momentum_weights(
    heal: State,
    distances: dict[str, float],
    cids: list[str],
    beta: float,
    start: dict[str, float] | None = None,
) -> dict[str, float]:
    """Step 4: update ``heal``'s ``delta``/``p`` for the clients ``cids`` with the last known
    ``distances`` of every client; returns the p_i of ``cids`` normalised to sum 1. A client
    seen for the first time starts at ``start[cid]`` (default 1 / len(cids), the code's)."""
    total = sum(distances.values())
    p = {}
    for cid in cids:
        share = distances[cid] / total if total > 0 else 0.0
        d = (1 - beta) * heal["delta"].get(cid, 0.0) + beta * share
        heal["delta"][cid] = d
        first = start[cid] if start is not None else 1.0 / len(cids)
        heal["p"][cid] = heal["p"].get(cid, first) + d
        p[cid] = heal["p"][cid]
    norm = sum(p.values())
    return {cid: v / norm for cid, v in p.items()}


def masked_aggregate(weights: Tensors, replies: list[tuple[float, Tensors, Tensors]]) -> Tensors:
    """Step 5: w - sum_i alpha_i u~_i per element, for ``replies`` = (p_i, u~_i, m_i)."""
    out = {}
    for k, w in weights.items():
        p = torch.tensor([r[0] for r in replies], dtype=w.dtype, device=w.device)
        p = p.view(-1, *([1] * w.dim()))
        m = torch.stack([r[2][k].to(w.dtype) for r in replies])
        pm = p * m
        total = pm.sum(0, keepdim=True)
        alpha = torch.where(total > 0, pm / total.clamp_min(torch.finfo(w.dtype).tiny), p)
        u = torch.stack([r[1][k] for r in replies])
        out[k] = w - (alpha * u).sum(0)
    return out


class FedHEAL(FedAvgOrProxClient[FedHEALParams]):
    """FedAvg (or FedProx) with consistency-masked updates and diversity-aware weights."""

    name = "fedheal"
    Params = FedHEALParams
    # HEAL's p_i (step 4) start equal (the code's 1/online_num); weighting=samples: n_i / n
    paper_weighting = "uniform"

    def setup(self, model: FedModel) -> None:
        state = model.state_dict()
        #: shared tensors that are masked and aggregated element-wise (floating point)
        self.masked_keys = [k for k in self.shared_keys if state[k].is_floating_point()]
        #: shared integer buffers (BN batch counters): averaged with the weights p
        self.count_keys = [k for k in self.shared_keys if not state[k].is_floating_point()]

    def server_vars(self) -> list[StateVar]:
        return [
            *replaced(super().server_vars(), "weights", reduce="none"),  # the masked aggregate
            server_var("heal", {"p": {}, "delta": {}, "distance": {}},
                       doc="the momentum weights p, their last change and each site's distance"),
        ]  # fmt: skip

    def client_vars(self) -> list[StateVar]:
        return [
            *super().client_vars(),
            client_var("heal", {"rounds": 0, "history": {}},
                       doc="the rounds trained and the history of update signs (the mask)"),
        ]

    def disclosures(self, model: FedModel) -> list[Disclosure]:
        state = model.state_dict()
        masked = sum(state[k].numel() for k in self.masked_keys)
        return [
            self.down_weights(model, carries=("update", "mask", "counters")),
            Disclosure("update", UP, Kind.UPDATE, When.ROUND,
                       fixed(tensor_bytes(state, self.masked_keys)),
                       "the site's masked update (global - trained, float tensors)",
                       to=To.AGGREGATE),
            Disclosure("mask", UP, Kind.UPDATE, When.ROUND, fixed(masked),
                       "the site's parameter consistency mask (one bool per float element)",
                       to=To.AGGREGATE),
            Disclosure("counters", UP, Kind.PARAMETERS, When.ROUND,
                       fixed(tensor_bytes(state, self.count_keys)),
                       "the integer tensors of the trained model (BatchNorm batch counters)",
                       to=To.AGGREGATE),
        ]  # fmt: skip

    def local_update(self, ctx: ClientContext, down: Payload, state: State) -> Payload:
        up = super().local_update(ctx, down, state)
        g, w = down["weights"], up["weights"]
        update = {k: g[k].to(w[k].device) - w[k] for k in self.masked_keys}
        heal = state["heal"]
        mask, heal["history"] = consistency_mask(
            update, heal["history"], heal["rounds"], self.params.threshold
        )
        heal["rounds"] += 1
        masked = {k: u * mask[k] for k, u in update.items()}
        up.records = {
            "update": masked,
            "mask": mask,
            "counters": subset(w, self.count_keys),
        }
        up.metrics[DISTANCE] = distance(masked, self.shared_param_keys)
        return up

    def aggregate(self, server: State, rnd: int, replies: list[Reply]) -> None:
        heal = server["heal"]
        for cid, p in replies:
            heal["distance"][cid] = float(p.metrics[DISTANCE])
        cids = [cid for cid, _ in replies]
        # p_i starts at the run's weighting over the round's replies: 1/|S| (uniform, the
        # code's 1/online_num) or n_i/n (samples)
        total = sum(self.reply_weight(p) for _, p in replies)
        start = {cid: self.reply_weight(p) / total for cid, p in replies}
        alpha = momentum_weights(heal, heal["distance"], cids, self.params.beta, start)
        weights = server["weights"]
        new = masked_aggregate(
            subset(weights, self.masked_keys),
            [(alpha[cid], p["update"], p["mask"]) for cid, p in replies],
        )
        weights.update(new)
        if self.count_keys:
            weights.update(weighted_average([(alpha[cid], p["counters"]) for cid, p in replies]))
