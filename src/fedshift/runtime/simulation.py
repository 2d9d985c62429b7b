"""The single-machine run: the round loop over the in-process transport, and the entry points
``run_experiment`` / ``resume_experiment`` / ``load_finished``.

:class:`Simulation` is :class:`~fedshift.runtime.loop.RoundLoop` with every client in this
process (:class:`~fedshift.runtime.native.InProcessTransport`); it exposes the clients'
state as ``states`` for protocols, figures and tests that look inside a run.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

from fedshift.catalog import resolve
from fedshift.core.config import RunConfig, load_yaml
from fedshift.core.errors import ConfigError, FedshiftError
from fedshift.data.base import Federation
from fedshift.runtime.loop import (
    CHECKPOINT,
    SELECTED,
    LoopOptions,
    RoundLoop,
    RunInterrupted,
    RunSignal,
)
from fedshift.runtime.native import InProcessTransport
from fedshift.runtime.results import RunResult, new_run_dir

__all__ = [
    "CHECKPOINT",
    "SELECTED",
    "RunInterrupted",
    "RunResult",
    "RunSignal",
    "Simulation",
    "load_finished",
    "new_run_dir",
    "resume_experiment",
    "run_experiment",
    "saved_config",
]

#: what ``load_finished`` can rebuild: the model selected on validation, or the last one
WEIGHTS = ("selected", "last")


class Simulation(RoundLoop):
    """One run with every client in this process (see the module docstring)."""

    def __init__(
        self,
        cfg: RunConfig,
        run_dir: str | Path,
        federation: Federation | None = None,
        progress: bool = True,
        options: LoopOptions | None = None,
    ) -> None:
        super().__init__(cfg, run_dir, InProcessTransport(federation), progress, options)

    @property
    def states(self) -> dict[str, dict]:
        """Every client's state (held-out clients included), by client name."""
        return self.transport.state_dict()  # type: ignore[return-value]

    @states.setter
    def states(self, value: dict[str, dict]) -> None:
        self.transport.load_state_dict(value)


def run_experiment(
    cfg: RunConfig,
    out: str | Path | None = None,
    run_dir: Path | None = None,
    federation: Federation | None = None,
    progress: bool = True,
    stop_after: int | None = None,
) -> RunResult:
    """Run one resolved config to the end; returns the run directory and its summary.
    Without ``run_dir``, a new directory is claimed (:func:`new_run_dir`), and removed again
    if the run cannot even be built (it is still empty then)."""
    claimed = run_dir is None
    run_dir = run_dir or new_run_dir(cfg, out)
    try:
        sim = Simulation(cfg, run_dir, federation, progress)
    except BaseException:
        if claimed:
            with contextlib.suppress(OSError):
                run_dir.rmdir()  # only if empty
        raise
    return sim.run(stop_after=stop_after)


def saved_config(run_dir: str | Path) -> RunConfig:
    """The resolved config a run directory was started with (``config.yaml``)."""
    path = Path(run_dir) / "config.yaml"
    if not path.is_file():
        raise FedshiftError(f"{run_dir} is not a fedshift run directory (no config.yaml)")
    return resolve(load_yaml(path), source=str(path))


def resume_experiment(
    run_dir: str | Path,
    federation: Federation | None = None,
    progress: bool = True,
    stop_after: int | None = None,
    rounds: int | None = None,
) -> RunResult:
    """Continue a run from its last checkpoint with its saved config; a run killed before
    its first checkpoint starts again. ``rounds``: extend the run (finished or not) to that
    many rounds; the result equals a run of ``rounds`` from the start."""
    cfg = saved_config(run_dir)
    sim = Simulation(cfg, run_dir, federation, progress)
    return sim.run(resume=True, stop_after=stop_after, rounds=rounds)


def load_finished(
    run_dir: str | Path, federation: Federation | None = None, weights: str = "selected"
) -> Simulation:
    """A run rebuilt from its ``config.yaml`` and saved state, ready to evaluate (pictures,
    cross-site matrices, features): the federation, the model, the algorithm and every
    client's state at the round ``weights`` names, ``selected`` (the round model selection
    picked on validation, the one the run's tables report: default) or ``last``."""
    if weights not in WEIGHTS:
        raise ConfigError(f"weights must be one of {WEIGHTS}, got {weights!r}")
    run_dir = Path(run_dir)
    if not (run_dir / CHECKPOINT).is_file():
        raise FedshiftError(
            f"{run_dir} is not a finished fedshift run (it needs config.yaml and {CHECKPOINT})"
        )
    sim = Simulation(saved_config(run_dir), run_dir, federation, progress=False)
    sim.load_checkpoint()
    if weights == "last":
        return sim
    summary_path = run_dir / "summary.json"
    if not summary_path.is_file():
        raise FedshiftError(
            f"{run_dir} has not finished (no summary.json), so no round is selected yet; "
            "use the last weights (--weights last) or finish it (fedshift run --resume)"
        )
    best = int(json.loads(summary_path.read_text())["best_round"])
    if best == sim.last_round:
        return sim
    if not (run_dir / SELECTED).is_file():
        raise FedshiftError(
            f"{run_dir} selected round {best} but has no {SELECTED} (a run made before "
            "fedshift kept the selected state); use its last weights with --weights last"
        )
    ck = sim.load_checkpoint(SELECTED)
    if int(ck["round"]) != best:
        raise FedshiftError(
            f"{run_dir / SELECTED} holds round {ck['round']} but summary.json selected round "
            f"{best}; the run directory is inconsistent (rerun it, or use --weights last)"
        )
    return sim
