"""A run's checkpoints: part of the round loop (:class:`~fedshift.runtime.loop.RoundLoop`'s
``checkpoints``), not one of its hooks.

:class:`Checkpointing` says when ``checkpoint.pt`` is written (every ``checkpoint.every``
rounds or ``checkpoint.minutes`` minutes, whichever comes first, the last round, an early
stop: the loop asks after every whole round, once its hooks have seen it, and writes at once
after a signal) and writes it, and ``selected.pt``, atomically in the one format of saved
state (:mod:`fedshift.runtime.rundir.checkpoint_io`) with SIGINT / SIGTERM held off until
the hooks have logged the rounds it made durable. :func:`restore` reads it back into the
loop (a resumed run), :func:`extended` is what a resumed run continued to more rounds
(``train.rounds``) keeps. What the state holds is the loop's
(:meth:`~fedshift.runtime.loop.RoundLoop.state_dict`); results never depend on when it is
written.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedshift.core.config import RunConfig, dump_config
from fedshift.core.errors import ConfigError
from fedshift.core.rows import MetricRow
from fedshift.core.seeding import set_rng_state
from fedshift.runtime.rundir.checkpoint_io import (
    CHECKPOINT,
    read_run_state,
    write_checkpoint,
    write_failed,
)

if TYPE_CHECKING:
    from fedshift.runtime.hooks import Hooks
    from fedshift.runtime.loop import RoundLoop
    from fedshift.runtime.stopping import SignalGate
    from fedshift.runtime.transport import RunIdentity

__all__ = ["Checkpointing", "extended", "restore"]

log = logging.getLogger("fedshift.runtime")


class Checkpointing:
    """When and how a run's state files are written (module docstring): the run's
    ``run_dir``, its signal ``gate`` and its ``identity`` (whose ``checkpointed`` round it
    keeps)."""

    def __init__(self, run_dir: str | Path, gate: SignalGate, identity: RunIdentity) -> None:
        self.run_dir, self.gate, self.identity = Path(run_dir), gate, identity
        self._last_save = time.monotonic()

    def start(self) -> None:
        """The run starts (or continues): ``checkpoint.minutes`` count from now."""
        self._last_save = time.monotonic()

    def due(self, rnd: int, cfg: RunConfig, stopped: bool) -> bool:
        """Whether ``checkpoint.pt`` is written after whole round ``rnd`` (``stopped``: the
        run stops early after it)."""
        ck, rounds = cfg.checkpoint, cfg.train.rounds
        if rnd == rounds or stopped or (ck.every and rnd % ck.every == 0):
            return True
        return bool(ck.minutes) and time.monotonic() - self._last_save >= 60 * ck.minutes

    def write(self, obj: dict, name: str) -> None:
        """``obj`` to ``name`` in the run directory with SIGINT / SIGTERM held off."""
        with self.gate.held():
            self._write(obj, name)

    def save(self, state: dict, hooks: Hooks) -> None:
        """``checkpoint.pt``: ``state``, the run's after its round ``state["round"]``; then,
        signals still held off, ``hooks`` log the rounds it made durable."""
        rnd = int(state["round"])
        with self.gate.held():
            self._write(state, CHECKPOINT)
            self.identity.checkpointed = rnd
            hooks.checkpointed(rnd)
            self._last_save = time.monotonic()
        log.info("checkpoint: round %d saved", rnd)

    def _write(self, obj: dict, name: str) -> None:
        try:
            write_checkpoint(obj, self.run_dir / name)
        except OSError as e:  # disk full, read-only: the previous file is intact
            raise write_failed(e, self.run_dir, name, self.identity.checkpointed) from None

    def read(self, like: tuple, device: Any) -> dict:
        """``checkpoint.pt`` read back (checked against ``like``: the run's initial server
        and client state, their keys, shapes and dtypes), its tensors on ``device``."""
        return read_run_state(self.run_dir, CHECKPOINT, map_location=device, like=like)


def extended(
    cfg: RunConfig,
    records: list[MetricRow],
    last_round: int,
    depends_on_rounds: bool,
    run_dir: Path,
    rounds: int,
) -> tuple[RunConfig, list[MetricRow]]:
    """A run resumed after round ``last_round`` continued to ``rounds`` (``train.rounds``):
    its config (written to ``config.yaml``) and the metric rows it keeps, so that it ends as
    a run of ``rounds`` from the start would. Shortening, or extending a method whose local
    work depends on the total rounds (``depends_on_rounds``), is a :class:`ConfigError`."""
    if rounds < last_round:
        raise ConfigError(
            f"train.rounds={rounds}: the run in {run_dir} already trained "
            f"{last_round} rounds; a run can be extended, not shortened"
        )
    if rounds != cfg.train.rounds and depends_on_rounds:
        raise ConfigError(
            f"train.rounds={rounds}: {cfg.algorithm.name}'s local work depends on "
            f"the run's total rounds ({cfg.train.rounds}: a ramp-up schedule), so the "
            "extended run would not equal a run of that many rounds from the start; "
            "start a new run instead"
        )
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, rounds=rounds))
    every = cfg.eval.every
    # the old last round was evaluated because it was last: a run of ``rounds`` from the
    # start does not evaluate it, so neither may its extension select it
    records = [r for r in records if r["round"] % every == 0 or r["round"] == rounds]
    dump_config(cfg, run_dir / "config.yaml")
    return cfg, records


def restore(run: RoundLoop) -> dict:
    """Load ``run``'s ``checkpoint.pt`` into it: the run continues after the checkpoint's
    round, its clients told which of them worked until then (returns the checkpoint's dict)."""
    like = (run.server, run.transport.state_dict())  # its keys, shapes, dtypes to match
    ck = run.checkpoints.read(like, run.device)
    run.last_round = int(ck["round"])
    run.server = ck["server"]
    run.transport.load_state_dict(ck["clients"])
    run.ledger.load_state_dict(ck["ledger"])
    run.records = ck["records"]
    run.wall_before = float(ck["wall_s"])
    set_rng_state(ck["rng"])
    run.identity.key = ck.get("run_key") or run.identity.key
    run.setup_complete = True  # checkpoints are written after the setup exchange
    run.identity.resume_from = run.last_round
    run.identity.checkpointed = run.last_round
    run.identity.worked = _worked_until(run, run.last_round)
    return ck


def _worked_until(run: RoundLoop, rnd: int) -> set[str]:
    """The clients whose state changed in rounds 0..``rnd`` (set-up, or sampled)."""
    took_part = run.algo.needs_setup and run.setup_complete  # every client, round 0
    worked = set(run.fed.client_names) if took_part else set()
    for r in range(1, rnd + 1):
        worked.update(run.sample(r))
    return worked
