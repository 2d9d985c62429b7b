"""One client's work, written once for every transport.

The in-process transport (:mod:`fedshift.runtime.native`) calls these functions directly; a
Flower SuperNode (:mod:`fedshift.flower.node`) calls the same ones inside its message
handlers. So a client trains, checks its reply and scores its splits the same way whether it
runs next to the server or on another machine, and both give bit-identical numbers.
"""

from __future__ import annotations

import torch

from fedshift.core.context import ClientContext
from fedshift.core.contract import State
from fedshift.core.errors import TrainingError
from fedshift.core.federation import ClientData
from fedshift.core.payload import Payload, Tensors
from fedshift.core.seeding import generator, seed_global
from fedshift.runtime.dpsgd import check_steps
from fedshift.runtime.experiment import Experiment, score_client


def train_client(
    exp: Experiment, seed: int, cid: str, data: ClientData, rnd: int, down: Payload, state: State
) -> Payload:
    """Round ``rnd`` of client ``cid``: the algorithm's ``local_update`` on ``down`` in a fresh
    :class:`ClientContext`, with every random stream derived from (seed, round, client)."""
    ctx = client_context(exp, seed, cid, data, rnd, state)
    if exp.trunk_cache is None:
        up = exp.algo.local_update(ctx, down, state)
        check_steps(ctx)  # privacy.updates=example: every step was DP-SGD's
        return up
    with exp.trunk_cache.active(ctx) as cached:  # train.trainable=head: embeddings once
        return exp.algo.local_update(cached, down, state)


def client_context(
    exp: Experiment, seed: int, cid: str, data: ClientData, rnd: int, state: State
) -> ClientContext:
    """A fresh :class:`ClientContext` for round ``rnd`` of client ``cid``, with the global RNGs
    seeded from (seed, round, client) and the batch generator derived from the same."""
    seed_global(seed, "client", rnd, cid)
    example = None if exp.privacy is None else exp.privacy.example
    return ClientContext(
        cid=cid,
        round=rnd,
        data=data,
        model=exp.model,
        train=exp.train,
        pipeline=exp.pipeline,
        generator=generator(seed, "batches", rnd, cid),
        device=exp.device,
        state=state,
        task=exp.task,
        dpsgd=None if example is None else example.mechanism(cid, seed),
    )


def check_reply(rnd: int, cid: str, up: Payload) -> None:
    """Refuse a reply holding NaN/inf (or a non-finite training loss), naming the round, the
    client and the tensor."""
    bad = up.first_non_finite()
    loss = up.metrics.get("train_loss")
    if bad is not None or (loss is not None and not torch.isfinite(torch.tensor(loss))):
        what = f"tensor {bad!r}" if bad else f"train_loss={loss}"
        raise TrainingError(
            f"round {rnd}: client {cid!r} produced a non-finite update ({what}). "
            "Lower train.lr, check the input normalisation (input.mean/std) or the data."
        )


def evaluate_client(
    exp: Experiment,
    data: ClientData,
    state: State | None,
    batch_size: int,
    global_weights: Tensors | None = None,
    view: State | None = None,
    extra: Payload | None = None,
) -> dict[str, dict[str, float]]:
    """``{"global": scores, "personal": scores}`` of one client: its val/test splits scored
    with the global weights (when the run has a global model) and with its personal model
    ``personal_weights(view, state)`` (when it keeps tensors of its own). ``extra`` holds
    what a held-out client needs before it can evaluate (its augments' ``eval_broadcast``:
    HarmoFL's global amplitude); evaluation leaves the client's training state as it was."""
    out: dict[str, dict[str, float]] = {}
    if extra is not None:
        # extra goes to held-out clients only, and every runtime gives those a state
        # (native.py, pool_worker.py: init_client_state); Optional here for the others
        exp.algo.eval_receive(extra, state)  # type: ignore[arg-type]
    if global_weights is not None:
        exp.model.load_state_dict(global_weights)
        out["global"] = score_client(exp, data, state, batch_size)
    if view is not None:
        exp.model.load_state_dict(exp.algo.personal_weights(view, state))  # type: ignore[arg-type]
        out["personal"] = score_client(exp, data, state, batch_size)
    return out
