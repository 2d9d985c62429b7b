"""FedDG-GA (Zhang, Xu, Yao, Zhang, Tian, Wang; "Federated Domain Generalization with
Generalization Adjustment", CVPR 2023): a server rule that adjusts the aggregation weights
of the source clients every round so that the variance of their generalisation gaps shrinks.

Source of each element. The paper text was not obtainable offline (no arXiv/HTML copy in the
search corpus), so equation numbers are unverified and every element below is taken from the
released code, https://github.com/MediaBrain-SJTU/FedDG-GA: ``utils/weight_adjust.py``
(``refine_weight_dict_by_GA``, ``weight_clip``) and ``algorithms/fedavg/train_pacs_GA.py``
(the round loop).

Per round r with aggregation weights a_k (sum 1; start: the run's weighting, 1/K in the code):

1. client k trains; ``before_k`` = the metric of its local model on its validation split;
2. the server aggregates w = sum_k a_k w_k; ``after_k`` = the metric of w on k's validation
   split; the generalisation gap is G_k = after_k - before_k;
3. a_k <- a_k + s * d_r / K * G~_k with G~_k = G_k / max_j |G_j| (``gap=code``, the released
   code) or G~_k = (G_k - mean G) / max_j |G_j - mean G| (``gap=centred``, the form of the
   paper as we recall it — unverified); s = -1 for ``fair=acc`` (a site whose accuracy drops
   under averaging gains weight; on segmentation the score is the foreground Dice, the task's
   model-selection metric, as the released code has no segmentation loop), +1 for
   ``fair=loss``; the code's factor 1/3 is 1/K for its
   K = 3 PACS source sites;
4. a_k <- clip(a_k, 0, 1), then a_k <- a_k / sum_j a_j;
5. step size decays linearly over the R = ``train.rounds`` rounds: d_r = step (R - r + 1) / R
   for the gap of round r = 1..R (``decay=linear``: step at the first gap); the code's loop
   index starts at 0 and it uses step - (i - 1) step / R, i.e. d_r = step (R - r + 2) / R
   (``decay=code``: step (1 + 1/R) at the first gap).

Payload protocol (how the extra round trip is carried). Step 2 needs the aggregated model on
every client's validation split, which is a second message in the official single-process
loop. Here the reply of round r + 1 carries it: each client first scores the global model it
receives (the aggregate of round r) on its validation split, then trains and scores its local
model. The server keeps round r's ``before_k`` in its state; at round r + 1 it forms round r's
gaps, adjusts the weights (steps 3-5) and aggregates round r + 1 with them. The sequence of
aggregation weights is the same as the official loop's; the last round's gaps are never
formed (no later round uses them). The adjustment needs every source client every round
(``federation.sample_fraction=1``), as the paper runs it.

Composition: ``base=fedavg`` (default) or ``base=fedprox`` (the paper's FedAvg+GA and
FedProx+GA); SCAFFOLD+GA is not offered (SCAFFOLD's reply is a delta plus controls whose
average is uniform by construction). Model selection by weighted validation accuracy (the
code's) is not reproduced: fedshift's own model selection applies.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from fedshift.algorithms.base import Reply, State
from fedshift.algorithms.prox_base import FedAvgOrProxClient, ProxBaseParams
from fedshift.algorithms.state import StateVar, replaced, server_var
from fedshift.algorithms.tensors import weighted_average
from fedshift.core.bounds import bounded
from fedshift.core.context import ClientContext
from fedshift.core.errors import ConfigError
from fedshift.core.payload import Payload
from fedshift.models.base import FedModel

#: reply metrics: the received global model's and the trained local model's validation score
GLOBAL_SCORE = "ga/global_val"
LOCAL_SCORE = "ga/local_val"


@dataclass
class FedDGGAParams(ProxBaseParams):
    step_size: float = bounded(0.2, gt=0, le=1)  # d in step 3 (train_pacs_GA.py default 0.2)
    # the metric whose gap is balanced: the task's score (the code's default: accuracy; on
    # segmentation the foreground Dice, the task's model-selection metric) or the loss
    fair: Literal["acc", "loss"] = "acc"
    # "code": G_k / max|G| (released code); "centred": (G_k - mean) / max|G - mean|
    gap: Literal["code", "centred"] = "code"
    # "linear": d_r = step (R - r + 1) / R; "code": the released loop's off-by-one, (R - r + 2) / R
    decay: Literal["linear", "code"] = "linear"


def step_size(step: float, rnd: int, rounds: int, decay: str = "linear") -> float:
    """d_r of the gap of round ``rnd`` (1-based) in a run of ``rounds`` rounds (step 5)."""
    shift = 1 if decay == "linear" else 2
    return step * (rounds - rnd + shift) / rounds


def adjust_weights(
    weights: dict[str, float],
    gaps: dict[str, float],
    step: float,
    fair: str = "acc",
    centred: bool = False,
) -> dict[str, float]:
    """Steps 3-4: the weights after one generalisation adjustment with the gaps
    G_k = after_k - before_k of the clients in ``gaps`` (K = their number) and step size d_r
    = ``step``; every weight is then clipped to [0, 1] and all are renormalised to sum 1.
    All gaps equal (max |G~| = 0, where the code divides by zero) leaves the weights as they
    are before the clip."""
    out = dict(weights)
    g = dict(gaps)
    if centred:
        mean = sum(g.values()) / len(g)
        g = {k: v - mean for k, v in g.items()}
    top = max(abs(v) for v in g.values())
    sign = -1.0 if fair == "acc" else 1.0
    if top > 0:
        for k, v in g.items():
            out[k] += sign * (v / top) * step / len(g)
    out = {k: min(max(v, 0.0), 1.0) for k, v in out.items()}
    total = sum(out.values())
    if total <= 0:  # every weight clipped to 0: nothing left to renormalise; start over equal
        return {k: 1.0 / len(out) for k in out}
    return {k: v / total for k, v in out.items()}


class FedDGGA(FedAvgOrProxClient[FedDGGAParams]):
    """FedAvg (or FedProx) whose aggregation weights follow the generalisation adjustment."""

    name = "feddg_ga"
    trunk_cache_refusal = "scores the model on the client's validation images in its local update"
    Params = FedDGGAParams
    paper_weighting = "uniform"  # train_pacs_GA.py: every site starts at weight 1/K
    depends_on_rounds = True  # the step size decays over train.rounds (step 5)

    def setup(self, model: FedModel) -> None:
        if self.federation.sample_fraction != 1:
            raise ConfigError(
                "algorithm 'feddg_ga' adjusts the weights of every source client each round "
                "from their generalisation gaps: set federation.sample_fraction=1 (got "
                f"{self.federation.sample_fraction})"
            )

    def server_vars(self) -> list[StateVar]:
        return [
            *replaced(super().server_vars(), "weights", reduce="none"),  # the a_k-weighted mean
            server_var("ga", {"weights": {}, "local_score": {}, "local_round": {}},
                       doc="a_k, and each client's local-model score with the round it was "
                       "measured in"),
        ]  # fmt: skip

    def _val_score(self, ctx: ClientContext) -> float:
        """The working model's ``fair`` metric on the client's validation split: for ``acc``
        the task's score (accuracy; foreground Dice on segmentation), else the loss."""
        split = ctx.data.val
        if len(split) == 0:
            raise ConfigError(
                f"algorithm 'feddg_ga' scores models on each client's validation split, but "
                f"client {ctx.cid!r} has none: give the dataset a validation split"
            )
        res = ctx.task.evaluate(
            ctx.model,
            split,
            lambda x: ctx.pipeline.eval(x, ctx.state),
            self.train.batch_size,
            ctx.device,
        )
        key = ctx.task.primary.name if self.params.fair == "acc" else "loss"
        return float(res[key])

    def local_update(self, ctx: ClientContext, down: Payload, state: State) -> Payload:
        received = None
        if ctx.round > 1:  # round 1 receives the initial model: no gap to close
            self.load_client_model(ctx, down["weights"], state)
            received = self._val_score(ctx)  # after_k of the previous round
        up = super().local_update(ctx, down, state)
        up.metrics[LOCAL_SCORE] = self._val_score(ctx)  # before_k of this round
        if received is not None:
            up.metrics[GLOBAL_SCORE] = received
        return up

    def aggregate(self, server: State, rnd: int, replies: list[Reply]) -> None:
        ga = server["ga"]
        weights: dict[str, float] = ga["weights"]
        if not weights:  # first round: the run's weighting, normalised (1/K by default)
            total = sum(self.reply_weight(p) for _, p in replies)
            weights.update({cid: self.reply_weight(p) / total for cid, p in replies})
        for cid, _ in replies:  # a client first heard of later starts at 1/N
            weights.setdefault(cid, 1.0 / self.num_clients)
        gaps = {
            cid: p.metrics[GLOBAL_SCORE] - ga["local_score"][cid]
            for cid, p in replies
            if GLOBAL_SCORE in p.metrics and ga["local_round"].get(cid) == rnd - 1
        }
        if gaps:
            bad = [c for c, v in gaps.items() if not math.isfinite(v)]
            if bad:
                raise ValueError(f"feddg_ga: non-finite validation gap for clients {bad}")
            d = step_size(self.params.step_size, rnd - 1, self.train.rounds, self.params.decay)
            ga["weights"] = weights = adjust_weights(
                weights, gaps, d, self.params.fair, self.params.gap == "centred"
            )
        for cid, p in replies:
            ga["local_score"][cid] = float(p.metrics[LOCAL_SCORE])
            ga["local_round"][cid] = rnd
        items = [(weights[cid], p["weights"]) for cid, p in replies]
        if sum(w for w, _ in items) <= 0:  # the adjustment zeroed every replying client
            items = [(1.0, p["weights"]) for _, p in replies]
        server["weights"].update(weighted_average(items))
