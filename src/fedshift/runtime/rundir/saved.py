"""A finished run rebuilt from its saved state: :class:`SavedRun`, what
:func:`fedshift.runtime.simulation.load_finished`, the protocols' ``load_run`` and the Python
API's :meth:`fedshift.LoadedRun.rebuild <fedshift.api.LoadedRun.rebuild>` return.

It holds the run's experiment (federation, model, algorithm, input pipeline, task: built
from ``config.yaml`` as the run built it) and the server and client state of one round: the
round model selection picked (``selected.pt``, or ``checkpoint.pt`` when that round is the
last) or the last one. Nothing in it runs rounds; :meth:`SavedRun.local_update` computes one
client's local update of a further round without changing the saved state.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar, overload

import torch

from fedshift.core.config import RunConfig
from fedshift.core.errors import FedshiftError
from fedshift.core.payload import Payload
from fedshift.runtime.client import check_reply, train_client
from fedshift.runtime.experiment import Experiment
from fedshift.runtime.rundir.checkpoint_io import SELECTED, check_selected, read_run_state

__all__ = ["SavedRun", "read_selected"]


def read_selected(
    run_dir: str | Path,
    cfg: RunConfig,
    run_key: str,
    device: str | torch.device = "cpu",
    like: tuple | None = None,
) -> dict:
    """``selected.pt`` of ``run_dir``, read without running code and checked to belong to
    the run whose ``checkpoint.pt`` holds ``run_key`` and whose config is ``cfg`` (a file
    copied from another run is refused:
    :func:`~fedshift.runtime.rundir.checkpoint_io.check_selected`); with ``like`` (the run's
    initial server and client state), its keys, shapes and dtypes checked against them
    (:func:`~fedshift.runtime.rundir.checkpoint_io.check_like`)."""
    state = read_run_state(run_dir, SELECTED, map_location=device, like=like)
    check_selected(state, Path(run_dir) / SELECTED, run_key, cfg.to_dict())
    return state


T = TypeVar("T")


class _FromExperiment(Generic[T]):
    """A read-only attribute of :class:`SavedRun`: its experiment's attribute of the same
    name (``saved.fed`` is ``saved.exp.fed``)."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> _FromExperiment[T]: ...

    @overload
    def __get__(self, obj: SavedRun, owner: type | None = None) -> T: ...

    def __get__(self, obj: SavedRun | None, owner: type | None = None) -> Any:
        return self if obj is None else getattr(obj.exp, self.name)


@dataclass(frozen=True)
class SavedRun:
    """A finished run's experiment and its state at one round (module docstring)."""

    run_dir: Path
    #: the run's resolved config (``config.yaml``)
    cfg: RunConfig
    #: which state: ``selected`` (the round model selection picked on validation) or ``last``
    weights: str
    #: the round whose state this is
    round: int
    exp: Experiment
    #: the server state of that round
    server: dict
    #: every client's state of that round (held-out clients included), by client name
    states: dict[str, dict]

    # the experiment's members, read through to ``exp``
    fed = _FromExperiment[Any]()
    #: the run's working model (load weights into it: :meth:`weights_for`)
    model = _FromExperiment[Any]()
    algo = _FromExperiment[Any]()
    task = _FromExperiment[Any]()
    pipeline = _FromExperiment[Any]()
    device = _FromExperiment[torch.device]()
    #: the model kinds the run evaluates, primary first (``personal`` / ``global``)
    kinds = _FromExperiment[list[str]]()
    train_clients = _FromExperiment[Any]()
    implied = _FromExperiment[list[str]]()

    def weights_for(self, client: str, kind: str | None = None) -> dict[str, torch.Tensor]:
        """The state dict of ``client``'s model of ``kind`` (``personal`` / ``global``;
        default: the kind the run's tables evaluate)."""
        kind = kind or self.kinds[0]
        if kind not in self.kinds:
            raise FedshiftError(f"this run has no {kind} model (it has {self.kinds})")
        if kind == "global":
            return self.algo.global_weights(self.server)
        return self.algo.personal_weights(self.server, self.states[client])

    def local_update(self, rnd: int, client: str) -> dict[str, torch.Tensor]:
        """``client``'s model after its local update of round ``rnd`` from the saved server
        state's broadcast (the algorithm's own local training, with the run's augments and
        seeded batches), as a fresh state dict; the working model is left at those weights.
        The saved client state is not changed (the update works on a copy)."""
        self.local_reply(rnd, client)
        return {k: v.detach().clone() for k, v in self.exp.model.state_dict().items()}

    def local_reply(self, rnd: int, client: str) -> Payload:
        """What ``client`` sends after its local update of round ``rnd`` (as
        :meth:`local_update`): the payload the server would receive, every record in it."""
        exp = self.exp
        state = copy.deepcopy(self.states[client])
        down = self.algo.broadcast(self.server, rnd, client)
        up = train_client(exp, exp.seed, client, exp.train_clients[client], rnd, down, state)
        check_reply(rnd, client, up)
        return up
