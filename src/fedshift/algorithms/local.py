"""Local-only training: every client trains alone on its own data (the papers' "Single"
baseline). Nothing is communicated; each client's whole model is client state and is
evaluated as its personalised model. All clients start from the same seeded initialisation."""

from __future__ import annotations

from fedshift.algorithms.base import Algorithm, Reply, State
from fedshift.algorithms.state import StateVar, replaced
from fedshift.core.context import ClientContext
from fedshift.core.payload import Payload
from fedshift.models.base import FedModel


class LocalOnly(Algorithm[None]):
    """Each client alone."""

    name = "local"
    Params = None
    communicates = False

    def compute_local_keys(self, model: FedModel) -> list[str]:
        return list(model.state_dict())

    def server_vars(self) -> list[StateVar]:
        """``weights``: the initial model, never aggregated (nothing is sent)."""
        return replaced(super().server_vars(), "weights", reduce="none")

    def broadcast(self, server: State, rnd: int, cid: str) -> Payload:
        return Payload()

    def local_update(self, ctx: ClientContext, down: Payload, state: State) -> Payload:
        self.load_client_model(ctx, {}, state)
        steps, loss = self.local_train(ctx, state)
        self.keep_local(ctx, state)
        return self.reply(ctx, state, steps, loss)  # no shared tensor: no record

    def aggregate(self, server: State, rnd: int, replies: list[Reply]) -> None:
        """Nothing to aggregate."""
