"""PartialFed (Sun, Huo, Yang, Bai, "PartialFed: Cross-Domain Personalized Federated Learning
via Partial Initialization", NeurIPS 2021): PartialFed-Fix and PartialFed-Adaptive.

A client starts each round from a partial initialisation ``w_i <- A_i(w_global, w_i^prev)``,
layer by layer, then trains and uploads as FedAvg does; its personal model is its whole model
after its last update. ``strategy=fix``: the layers ``local_layers`` come from ``w_i^prev``;
``strategy=adaptive``: a per-client, per-layer gate learned through a relaxed binary choice
(straight-through on the round's first mini-batch; fedshift's relaxation, the paper's text
not being available). docs/METHODS.md ("Implementation notes per method") has the details.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch

from fedshift.algorithms.base import FLParams, State
from fedshift.algorithms.bn import bn_keys
from fedshift.algorithms.fedavg import FedAvg
from fedshift.algorithms.state import StateVar, client_var
from fedshift.algorithms.tensors import clone, subset
from fedshift.core.bounds import bounded
from fedshift.core.config import TrainConfig
from fedshift.core.context import ClientContext
from fedshift.core.errors import ConfigError
from fedshift.core.payload import Payload, Tensors
from fedshift.models.base import FedModel

#: ``ctx.scratch`` key of PartialFed-Adaptive's gate update armed for the round's first step
#: (the round's soft gates and the per-layer differences w_global - w_prev)
PENDING_GATES = "partialfed/pending"


@dataclass
class PartialFedParams(FLParams):
    # layers initialised from the client's previous local model: "bn", stage names, module paths
    local_layers: list[str] = field(default_factory=lambda: ["bn", "classifier"])
    # "fix": PartialFed-Fix (local_layers); "adaptive": PartialFed-Adaptive (learned gates)
    strategy: Literal["fix", "adaptive"] = "fix"
    # adaptive: step size of the per-layer gate logits, and the Gumbel-softmax temperature
    strategy_lr: float = bounded(10.0, ge=0)
    temperature: float = bounded(1.0, gt=0)


def resolve_layer_keys(
    model: FedModel, names: list[str], key: str = "algorithm.local_layers"
) -> list[str]:
    """State-dict keys of ``model`` selected by ``names`` (see the module docstring), in
    state-dict order. Raises ConfigError for a name that selects nothing."""
    keys = list(model.state_dict())
    chosen: set[str] = set()
    for name in names:
        if name == "bn":
            found = bn_keys(model, "local")
        else:
            prefix = f"stages.{name}" if name in model.stage_names else name
            found = [k for k in keys if k == prefix or k.startswith(prefix + ".")]
        if not found:
            raise ConfigError(
                f"config key '{key}': {name!r} selects no tensor of model "
                f"{type(model).__name__}; use 'bn', a stage ({', '.join(model.stage_names)}) "
                "or a module path such as 'classifier' or 'embed'"
            )
        chosen.update(found)
    return [k for k in keys if k in chosen]


def layer_units(model: FedModel, keys: list[str]) -> dict[str, list[str]]:
    """``keys`` grouped by the module that owns them (``stages.conv1.bn.weight`` ->
    ``stages.conv1.bn``), in state-dict order: PartialFed-Adaptive's gated layers."""
    units: dict[str, list[str]] = {}
    for k in keys:
        units.setdefault(k.rpartition(".")[0], []).append(k)
    return units


def relaxed_gates(
    alpha: torch.Tensor, temperature: float, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Binary Gumbel-softmax: soft ``s = sigmoid((alpha + log u - log(1 - u)) / temperature)``
    with u ~ U(0, 1), and the hard gate ``[s > 1/2]`` (1: load the global layer)."""
    u = torch.rand(alpha.shape, generator=gen, dtype=torch.float64).clamp(1e-12, 1 - 1e-12)
    soft = torch.sigmoid((alpha.double() + u.log() - (-u).log1p()) / temperature)
    return soft, (soft > 0.5).double()


class PartialFed(FedAvg[PartialFedParams]):
    """FedAvg with partial initialisation from the client's previous local model: a fixed
    per-layer strategy (Fix) or a learned one per client (Adaptive)."""

    name = "partialfed"
    Params = PartialFedParams

    @classmethod
    def check(cls, params: PartialFedParams, train: TrainConfig) -> None:
        if params.strategy == "adaptive":
            return
        if not params.local_layers:
            raise ConfigError(
                "config key 'algorithm.local_layers' is empty: PartialFed would be FedAvg; "
                "name the layers to initialise locally (e.g. [bn, classifier])"
            )

    def setup(self, model: FedModel) -> None:
        params = self.params
        shared = set(self.shared_keys)
        #: Fix: shared keys that a client initialises from its own previous model
        self.partial_keys: list[str] = (
            [k for k in resolve_layer_keys(model, list(params.local_layers)) if k in shared]
            if params.strategy == "fix"
            else []
        )
        #: Adaptive: the gated layers (module path -> its shared keys)
        self.units: dict[str, list[str]] = layer_units(model, self.shared_keys)

    @property
    def has_personal_model(self) -> bool:
        return True

    def client_vars(self) -> list[StateVar]:
        out = [
            *super().client_vars(),
            client_var("model", None, doc="the client's whole model after its last update"),
        ]
        if self.params.strategy == "adaptive":
            out += [
                client_var("alpha", lambda at: torch.zeros(len(self.units), dtype=torch.float64),
                           doc="the gate logits of each layer"),
                client_var("gates", None, doc="the last hard gates (1: loaded from w_global)"),
            ]  # fmt: skip
        return out

    def local_update(self, ctx: ClientContext, down: Payload, state: State) -> Payload:
        prev = state.get("model")
        if prev is not None:  # partial initialisation A_i(w_global, w_i^prev)
            if self.params.strategy == "adaptive":
                start = self._adaptive_start(ctx, down["weights"], prev, state)
            else:
                start = {**down["weights"], **subset(prev, self.partial_keys)}
            down = Payload(
                {**down.records, "weights": start},
                num_examples=down.num_examples,
                metrics=down.metrics,
                config=down.config,
            )
        try:
            up = super().local_update(ctx, down, state)
        finally:
            ctx.scratch.pop(PENDING_GATES, None)
        state["model"] = clone(ctx.model.state_dict())
        return up

    # -- PartialFed-Adaptive ----------------------------------------------------------------
    def _adaptive_start(
        self, ctx: ClientContext, glob: Tensors, prev: Tensors, state: State
    ) -> Tensors:
        """Draw the round's hard gates from the client's logits and build the initial model
        ``w_l = g_l w_global,l + (1 - g_l) w_prev,l``; arm the gate update of the first step."""
        seed = int(torch.randint(2**62, (1,), generator=ctx.generator))
        gen = torch.Generator().manual_seed(seed)
        soft, hard = relaxed_gates(state["alpha"], self.params.temperature, gen)
        start = dict(glob)
        diffs: list[dict[str, torch.Tensor]] = []
        for g, keys in zip(hard.tolist(), self.units.values(), strict=True):
            if not g:
                start.update(subset(prev, keys))
            diffs.append(
                {
                    k: (glob[k] - prev[k].to(glob[k])).to(ctx.device)
                    for k in keys
                    if glob[k].is_floating_point()
                }
            )
        state["gates"] = hard.clone()
        ctx.scratch[PENDING_GATES] = {"state": state, "soft": soft, "diffs": diffs}
        return start

    def before_step(self, ctx: ClientContext) -> None:
        """Adaptive: on the round's first step the gradient is taken at the initialised
        weights; the straight-through gate update uses it once (see the module docstring)."""
        super().before_step(ctx)
        pending = ctx.scratch.pop(PENDING_GATES, None)
        if pending is None:
            return
        grads = {n: p.grad for n, p in ctx.model.named_parameters() if p.grad is not None}
        dg = torch.tensor(
            [
                sum(
                    float((grads[k].double() * d.double()).sum())
                    for k, d in diffs.items()
                    if k in grads
                )
                for diffs in pending["diffs"]
            ],
            dtype=torch.float64,
        )
        soft = pending["soft"]
        dalpha = dg * soft * (1 - soft) / self.params.temperature
        state = pending["state"]
        state["alpha"] = state["alpha"] - self.params.strategy_lr * dalpha

    def personal_weights(self, server: State, state: State) -> Tensors | None:
        if state.get("model") is None:  # not trained yet: the model it would start from
            return {**subset(server["weights"], self.shared_keys), **state["local"]}
        return state["model"]
