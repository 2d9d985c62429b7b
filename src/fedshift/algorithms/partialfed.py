"""PartialFed-Fix (Sun, Huo, Yang, Bai, "PartialFed: Cross-Domain Personalized Federated
Learning via Partial Initialization", NeurIPS 2021).

PartialFed changes only how a client *initialises* its model at the start of a round: instead
of loading the whole global model, it loads a subset of the global model's parameters and
takes the rest from its own local model of the previous round (partial initialisation). It then
trains locally and uploads the whole model; the server averages everything, as FedAvg does.

* Round start, client i: w_i <- A_i(w_global, w_i^prev): the tensors of the layers named in
  ``local_layers`` come from w_i^prev, all others from w_global. In its first round a client has
  no previous model and loads the global model entirely.
* Local training and the upload ("weights", every shared tensor) are FedAvg's; the server's
  average is the global model (evaluated as ``global``).
* Each client's personalised model is its whole model after its last local update (kept in its
  state, never sent; evaluated as ``personal``).

``local_layers`` (the fixed loading strategy, PartialFed-Fix) is a list of

* ``"bn"``: every batch-norm layer (all of its tensors: affine parameters, running mean and
  variance, counter), found through ``FedModel.bn_layer_names``;
* a stage name of the model (``conv1``, ...): that stage's tensors (``stages.<name>.*``);
* any other module path of the model (``classifier``, ``embed``, ``embed.fc2``, ...): the
  tensors under it.

The default ``["bn", "classifier"]`` follows the paper's findings on hand-designed strategies:
initialising the BN layers locally helps, and so does keeping the top of the network (the
classifier) local while loading the lower, shared feature layers from the global model. (The
exact layer lists of the paper's PartialFed-Fix tables were not available to check; set
``local_layers`` to the strategy you need.)

**PartialFed-Adaptive** (the paper's learned per-client, per-layer loading strategy) is NOT
implemented: only the fixed strategy is.

``bn_policy`` composes with it: tensors the policy keeps local (FedBN) are never sent at all,
and ``local_layers`` then chooses among the shared tensors.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fedshift.algorithms import register
from fedshift.algorithms.base import FLParams, State, bn_keys, clone, subset
from fedshift.algorithms.fedavg import FedAvg
from fedshift.config import FederationConfig, TrainConfig
from fedshift.engine.context import ClientContext
from fedshift.engine.payload import Payload, Tensors
from fedshift.errors import ConfigError
from fedshift.models.base import FedModel


@dataclass
class PartialFedParams(FLParams):
    # layers initialised from the client's previous local model: "bn", stage names, module paths
    local_layers: list[str] = field(default_factory=lambda: ["bn", "classifier"])


def resolve_layer_keys(model: FedModel, names: list[str]) -> list[str]:
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
                f"config key 'algorithm.local_layers': {name!r} selects no tensor of model "
                f"{type(model).__name__}; use 'bn', a stage ({', '.join(model.stage_names)}) "
                "or a module path such as 'classifier' or 'embed'"
            )
        chosen.update(found)
    return [k for k in keys if k in chosen]


@register
class PartialFed(FedAvg):
    """FedAvg with partial initialisation from the client's previous local model (Fix)."""

    name = "partialfed"
    Params = PartialFedParams

    @classmethod
    def check(cls, params: Any, train: TrainConfig) -> None:
        if not params.local_layers:
            raise ConfigError(
                "config key 'algorithm.local_layers' is empty: PartialFed would be FedAvg; "
                "name the layers to initialise locally (e.g. [bn, classifier])"
            )

    def __init__(
        self,
        params: Any,
        train: TrainConfig,
        federation: FederationConfig,
        model: FedModel,
        num_clients: int,
    ) -> None:
        super().__init__(params, train, federation, model, num_clients)
        shared = set(self.shared_keys)
        #: shared keys that a client initialises from its own previous model
        self.partial_keys: list[str] = [
            k for k in resolve_layer_keys(model, list(params.local_layers)) if k in shared
        ]

    @property
    def has_personal_model(self) -> bool:
        return True

    def init_client(self, cid: str, model: FedModel) -> State:
        state = super().init_client(cid, model)
        state["model"] = None  # the client's whole model after its last local update
        return state

    def local_update(self, ctx: ClientContext, down: Payload, state: State) -> Payload:
        prev = state.get("model")
        if prev is not None:  # partial initialisation A_i(w_global, w_i^prev)
            down = Payload(
                {**down.records, "weights": {**down["weights"], **subset(prev, self.partial_keys)}},
                num_examples=down.num_examples,
                metrics=down.metrics,
                config=down.config,
            )
        up = super().local_update(ctx, down, state)
        state["model"] = clone(ctx.model.state_dict())
        return up

    def personal_weights(self, server: State, state: State) -> Tensors | None:
        if state.get("model") is None:  # not trained yet: the model it would start from
            return {**subset(server["weights"], self.shared_keys), **state["local"]}
        return state["model"]
