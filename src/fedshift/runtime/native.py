"""The in-process transport: every client in this process, one after another.

Client state (local BN tensors, optimiser state, SCAFFOLD's ``c_i``, augments' statistics)
lives here in plain dicts, so the round loop checkpoints it with the server state and a
resumed run continues exactly where the killed one stopped.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any, ClassVar

import torch

from fedshift.core.config import RunConfig
from fedshift.core.federation import Federation
from fedshift.core.payload import Payload
from fedshift.data import run_federation
from fedshift.runtime.client import evaluate_client, train_client
from fedshift.runtime.experiment import Experiment, init_client_state
from fedshift.runtime.transport import (
    EvalRequest,
    RunIdentity,
    Scores,
    SequentialTransport,
    held_client_state,
)


class InProcessTransport(SequentialTransport):
    """Clients in this process (see the module docstring). ``federation``: a pre-loaded
    dataset (tests, benchmarks); the config's partition and data fraction still apply."""

    name = "native"
    worker_processes: ClassVar[bool] = False

    @classmethod
    def create(
        cls, cfg: RunConfig, federation: Federation | None, workers: int, pool: Any
    ) -> InProcessTransport:
        """The transport for a run (:func:`fedshift.runtime.transports.make_transport`):
        every client in this process (``workers`` is 1, ``pool`` None)."""
        return cls(federation)

    def __init__(self, federation: Federation | None = None) -> None:
        self.preloaded = federation
        self.states: dict[str, dict] = {}
        self._undo: dict[str, dict] | None = None

    def connect(self, cfg: RunConfig) -> Federation:
        self.fed = run_federation(cfg, self.preloaded)
        return self.fed

    def attach(self, exp: Experiment, run: RunIdentity) -> None:
        self.exp = exp
        self.states = {
            cid: init_client_state(exp, exp.seed, cid, data)
            for cid, data in exp.train_clients.items()
        }
        for cid in exp.holdout:  # never trains; its augments' local state (own statistics)
            self.states[cid] = init_client_state(exp, exp.seed, cid, exp.fed.client(cid))

    # ------------------------------------------------------------------ messages
    def setup_reply(self, cids: list[str]) -> tuple[dict[str, Payload], list[str]]:
        return {cid: self.exp.algo.setup_reply(cid, self.states[cid]) for cid in cids}, []

    def setup_receive(self, downs: dict[str, Payload]) -> list[str]:
        for cid, down in downs.items():
            self.exp.algo.setup_receive(down, self.states[cid])
        return []

    def train(
        self, rnd: int, cids: list[str], down: Callable[[str], Payload]
    ) -> tuple[dict[str, Payload], list[str]]:
        exp, states = self.exp, self.states
        return {
            cid: train_client(
                exp, exp.seed, cid, exp.train_clients[cid], rnd, down(cid), states[cid]
            )
            for cid in cids
        }, []

    def evaluate(
        self, rnd: int, cids: list[str], request: EvalRequest
    ) -> tuple[dict[str, Scores], list[str]]:
        bs = self.exp.eval_batch_size
        return {
            cid: evaluate_client(
                self.exp,
                self.exp.fed.client(cid),
                self.states.get(cid),
                bs,
                request.global_weights,
                request.views.get(cid),
                request.extra.get(cid),
            )
            for cid in cids
        }, []

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict:
        return self.states

    def load_state_dict(self, state: dict | None) -> None:
        self.states = held_client_state(state)

    def begin_round(self, cids: list[str]) -> None:
        self._undo = {cid: copy.deepcopy(self.states[cid]) for cid in cids}

    def rollback(self) -> None:
        if self._undo is not None:
            self.states.update(self._undo)
            self._undo = None

    def info(self) -> dict:
        return {
            "engine": "native",
            "executor": "sequential",
            "workers": 1,
            "threads": torch.get_num_threads(),
        }

    def close(self) -> None:
        """Nothing to stop (the pool transport stops its worker processes)."""
