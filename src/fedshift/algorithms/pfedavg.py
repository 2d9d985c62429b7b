"""FedAvg + local fine-tuning ("FedAvg+FT"), the personalisation baseline of the DisTrans and
FRAug comparisons: FedAvg training, and each client's personal model is the global model it
received fine-tuned on its own training split.

Within a round, client i receives the global model w_{t-1} (the aggregate of round t-1;
w_0 is the initialisation) and

1. runs FedAvg's local update from w_{t-1} and uploads the result, exactly as ``fedavg`` does
   (the same batches, the same upload: the global models of the two runs are identical);
2. then, from w_{t-1} again, fine-tunes a copy for ``finetune_epochs`` epochs on its training
   split with step size ``finetune_lr`` (default ``train.lr``; ``train.optimizer``, momentum
   and weight decay as in training, a fresh optimizer) and keeps it in its state as its
   personal model. The copy is never sent: fine-tuning costs compute only, and the ledger
   equals FedAvg's.

Which round a personal model comes from: the personal model evaluated at round t is
FT(w_{t-1}), the global model received at the start of round t fine-tuned, while the global
model evaluated at round t is w_t. (An algorithm cannot train inside evaluation, so the
fine-tuning of w_t happens when the client receives it, in round t+1.) A client that has not
been sampled yet is evaluated with the current global model (no fine-tuning). The
fine-tuning batches continue the client's round generator after FedAvg's local batches, so
they never change the uploaded weights.

With ``bn_policy`` other than ``global`` the client's local BN tensors are part of what it
starts from (and of what it fine-tunes).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from fedshift.algorithms.base import FLParams, State
from fedshift.algorithms.fedavg import FedAvg
from fedshift.algorithms.local_train import build_optimizer
from fedshift.algorithms.state import StateVar, client_var
from fedshift.algorithms.tensors import clone, subset
from fedshift.core.bounds import bounded
from fedshift.core.context import ClientContext
from fedshift.core.payload import Payload, Tensors


@dataclass
class PFedAvgParams(FLParams):
    # epochs of local fine-tuning of the received global model
    finetune_epochs: int = bounded(1, ge=0)
    finetune_lr: float | None = bounded(None, gt=0)  # step size of the fine-tuning (None: train.lr)


class FedAvgFT(FedAvg[PFedAvgParams]):
    """FedAvg, evaluated per client after local fine-tuning of the received global model."""

    name = "pfedavg"
    Params = PFedAvgParams

    @property
    def has_personal_model(self) -> bool:
        return True

    def client_vars(self) -> list[StateVar]:
        return [
            *super().client_vars(),
            client_var("personal", None, doc="FT(received global model), full state dict"),
        ]

    def local_update(self, ctx: ClientContext, down: Payload, state: State) -> Payload:
        received = self.frozen.complete({**down["weights"], **clone(state["local"])})
        up = super().local_update(ctx, down, state)  # FedAvg's update and upload
        trained = clone(ctx.model.state_dict())
        ctx.model.load_state_dict(received, strict=True)
        steps = self.finetune(ctx)
        state["personal"] = clone(ctx.model.state_dict())
        ctx.model.load_state_dict(trained, strict=True)  # augments' replies see the trained model
        up.metrics["finetune_steps"] = steps
        return up

    def finetune(self, ctx: ClientContext) -> int:
        """Fine-tune the working model for ``finetune_epochs`` epochs; returns the steps."""
        p, t = self.params, self.train
        if p.finetune_epochs == 0:
            return 0
        lr = t.lr if p.finetune_lr is None else p.finetune_lr
        ft = dataclasses.replace(
            ctx,
            train=dataclasses.replace(t, local_epochs=p.finetune_epochs, local_steps=None, lr=lr),
        )
        model = ctx.model
        model.train()
        opt = build_optimizer(self.trainable(ft), ft.train)
        steps = 0
        for x, y in ft.batches():
            opt.zero_grad(set_to_none=True)
            self.loss(ft, x, y).backward()
            opt.step()
            steps += 1
        return steps

    def personal_weights(self, server: State, state: State) -> Tensors | None:
        if state.get("personal") is None:  # not sampled yet: the current global model
            return {**subset(server["weights"], self.shared_keys), **state["local"]}
        return state["personal"]
