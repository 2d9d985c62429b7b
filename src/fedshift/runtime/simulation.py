"""The single-machine run: the round loop over the in-process transport (or the pool of
worker processes, ``run.workers``), and the entry points ``run_experiment`` /
``resume_experiment`` / ``load_finished``.

:class:`Simulation` is :class:`~fedshift.runtime.loop.RoundLoop` with every client in this
process (:class:`~fedshift.runtime.native.InProcessTransport`) or in worker processes
(:class:`~fedshift.runtime.pool.transport.PoolTransport`): the registered transport
:func:`~fedshift.runtime.transports.make_transport` picks from ``run.executor`` and
``run.workers``. It exposes the clients' state as ``states`` for protocols, figures and
tests that look inside a run. Every process computing for a run uses ``run.threads`` torch threads.

A run directory's ``config.yaml`` is checked against the config its checkpoint was written
with before a resume (or a protocol) builds anything (:func:`resume_config`): a resumed run
must end as an uninterrupted run of the config it reports. A run killed before its first
checkpoint has nothing to compare with: it starts again from ``config.yaml``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path

import torch

from fedshift.catalog import resolve
from fedshift.core.config import RunConfig, load_yaml
from fedshift.core.consent import untrusted
from fedshift.core.errors import ConfigError, FedshiftError
from fedshift.core.federation import Federation
from fedshift.core.files import check_folder
from fedshift.core.identity import NOT_SET, config_diff, without_later_defaults
from fedshift.core.seeding import set_rng_state
from fedshift.eval.summary import read_summary
from fedshift.runtime.experiment import start_experiment
from fedshift.runtime.hooks import Hook
from fedshift.runtime.loop import LoopOptions, RoundLoop
from fedshift.runtime.native import InProcessTransport
from fedshift.runtime.pool.transport import WorkerPool
from fedshift.runtime.rundir.checkpoint_io import CHECKPOINT, SELECTED, read_run_state
from fedshift.runtime.rundir.results import RunResult, new_run_dir
from fedshift.runtime.rundir.saved import SavedRun, read_selected
from fedshift.runtime.transport import RunIdentity, Transport, held_client_state
from fedshift.runtime.transports import make_transport

__all__ = [
    "Simulation",
    "load_finished",
    "resume_config",
    "resume_experiment",
    "run_experiment",
    "saved_config",
    "torch_threads",
]

#: what ``load_finished`` can rebuild: the model selected on validation, or the last one
WEIGHTS = ("selected", "last")

#: config keys that may change between a run's start and its resume: they change neither
#: its numbers nor which rounds it evaluates (``train.rounds`` is checked on its own: up
#: to extend, or down to no fewer than the rounds trained)
RESUME_FREE = ("name", "out", "checkpoint.every", "checkpoint.minutes", "run.workers", "track")


class Simulation(RoundLoop):
    """One run on this machine (see the module docstring): every client in this process, or
    in the worker processes of a :class:`~fedshift.runtime.pool.transport.PoolTransport` given as
    ``transport``. Building and running happen with torch limited to ``run.threads``
    threads (the caller's setting is restored after each)."""

    def __init__(
        self,
        cfg: RunConfig,
        run_dir: str | Path,
        federation: Federation | None = None,
        progress: bool = True,
        options: LoopOptions | None = None,
        transport: Transport | None = None,
        hooks: Iterable[Hook] = (),
    ) -> None:
        with torch_threads(cfg.run.threads):
            chosen: Transport = transport or InProcessTransport(federation)
            super().__init__(cfg, run_dir, chosen, progress, options, hooks)

    def run(
        self, resume: bool = False, stop_after: int | None = None, rounds: int | None = None
    ) -> RunResult:
        if rounds is not None and self.exp.privacy is not None:  # privacy.epsilon's plan
            self.exp.privacy.check_rounds(rounds)  # covers the extension, or stops before it
        with torch_threads(self.cfg.run.threads):
            return super().run(resume, stop_after, rounds)

    @property
    def states(self) -> dict[str, dict]:
        """Every client's state (held-out clients included), by client name."""
        return self.transport.state_dict()  # type: ignore[return-value]

    @states.setter
    def states(self, value: dict[str, dict]) -> None:
        self.transport.load_state_dict(value)


@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """torch limited to ``n`` intra-op threads inside the block (``run.threads``)."""
    before = torch.get_num_threads()
    if n != before:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)


def run_experiment(
    cfg: RunConfig,
    out: str | Path | None = None,
    run_dir: Path | None = None,
    federation: Federation | None = None,
    progress: bool = True,
    stop_after: int | None = None,
    workers: int | str | None = None,
    pool: WorkerPool | None = None,
) -> RunResult:
    """Run one resolved config to the end; returns the run directory and its summary.
    Without ``run_dir``, a new directory is claimed (:func:`new_run_dir`), and removed again
    if the run cannot even be built (it is still empty then). ``workers`` (default: the
    config's ``run.workers``) runs the clients in that many processes; ``pool``: in a
    running :class:`~fedshift.runtime.pool.transport.WorkerPool` (left running). Results do not
    depend on either (at the same ``run.threads``)."""
    claimed = run_dir is None
    run_dir = run_dir or new_run_dir(cfg, out)
    transport = make_transport(cfg, federation, workers, pool)
    try:
        try:
            sim = Simulation(cfg, run_dir, federation, progress, transport=transport)
        except BaseException:
            if claimed:
                with contextlib.suppress(OSError):
                    run_dir.rmdir()  # only if empty
            raise
        return sim.run(stop_after=stop_after)
    finally:
        transport.close()


def saved_config(run_dir: str | Path) -> RunConfig:
    """The resolved config a run directory was started with (``config.yaml``), checked
    against its checkpoint (:func:`resume_config`; no change of ``train.rounds`` either)."""
    return resume_config(run_dir, extend=False)[0]


def _yaml_config(run_dir: Path) -> RunConfig:
    """A run directory's ``config.yaml``, resolved; a plug-in it names is imported only with
    the user's yes (a run directory may come from anyone: :mod:`fedshift.core.consent`)."""
    path = run_dir / "config.yaml"
    if not path.is_file():
        raise FedshiftError(f"{run_dir} is not a fedshift run directory (no config.yaml)")
    raw = load_yaml(path)
    with untrusted(str(path), [raw]):
        return resolve(raw, source=str(path))


def resume_config(
    run_dir: str | Path, rounds: int | None = None, extend: bool = True
) -> tuple[RunConfig, int | None]:
    """The config to continue ``run_dir`` with and the rounds to extend it to (None: as it
    was started). ``config.yaml`` (plus ``rounds``, a ``train.rounds=N`` override) is compared
    with the config the run's ``checkpoint.pt`` was written with, before anything is built:

    * ``name``, ``out``, ``checkpoint.every`` / ``checkpoint.minutes``, ``run.workers`` and
      ``track`` may change (they change no number);
    * ``train.rounds`` may go up, or down to no fewer than the rounds already trained (the
      run then ends as a run of that many rounds from the start,
      :meth:`~fedshift.runtime.loop.RoundLoop.run`'s ``rounds``); only with ``extend``;
    * anything else, ``eval.every`` and ``eval.batch_size`` included (the rounds already
      evaluated were scored with the old values, so the run would equal no uninterrupted
      run), is a :class:`ConfigError` listing every changed key, old -> new, and the fix.

    A run with no checkpoint yet (killed during its first rounds) has nothing to compare
    with: it starts again from ``config.yaml``. A run directory holding a link or a special
    file (a received one) is refused first (:func:`fedshift.core.files.check_folder`)."""
    run_dir = Path(run_dir)
    if run_dir.is_dir():
        check_folder(run_dir)
    cfg = _yaml_config(run_dir)
    target = cfg.train.rounds if rounds is None else rounds
    if not (run_dir / CHECKPOINT).is_file():
        return cfg, rounds
    ck = read_run_state(run_dir, map_location="cpu")
    started, trained = ck["config"], int(ck["round"])
    where = f"{run_dir / 'config.yaml'}"
    changed = [
        f"{k}: {was} -> {now}"
        # a key added later at its "off" value is what a run started before it did
        for k, was, now in config_diff(
            without_later_defaults(started), without_later_defaults(cfg.to_dict())
        )  # fmt: skip
        if k not in (*RESUME_FREE, "train.rounds")
        # a run started before the ``run`` section existed: its threads were never recorded
        and not (k.startswith("run.") and was == NOT_SET)
    ]
    if changed:
        raise ConfigError(
            f"{where} differs from the config the run was started with (its {CHECKPOINT}): "
            f"{'; '.join(changed)}. A resumed run keeps its config (only train.rounds, name, "
            "out, checkpoint.*, run.workers and track may change): restore those keys in "
            f"config.yaml, or start a new run with the new config: fedshift run --new -c {where}"
        )
    original = int(started["train"]["rounds"])
    asked = f"train.rounds={rounds}" if rounds is not None else f"train.rounds: {target} in {where}"
    restore = f"restore train.rounds: {original} in config.yaml"
    if target < trained:
        fix = restore if rounds is None else f"ask for at least {trained} rounds"
        raise ConfigError(
            f"{asked}: the run in {run_dir} already trained {trained} rounds, and a run can be "
            f"extended, not shortened; {fix}, or start a new run"
        )
    if target != original and not extend:
        raise ConfigError(
            f"{asked}: the run was started with {original} rounds and this command cannot "
            f"change them; {restore}, or extend the run with: "
            f"fedshift run --resume {run_dir} train.rounds={target}"
        )
    changes = target != original or cfg.train.rounds != original
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, rounds=original))
    return cfg, (target if changes else None)


def resume_experiment(
    run_dir: str | Path,
    federation: Federation | None = None,
    progress: bool = True,
    stop_after: int | None = None,
    rounds: int | None = None,
    workers: int | str | None = None,
    pool: WorkerPool | None = None,
) -> RunResult:
    """Continue a run from its last checkpoint with its saved config (checked by
    :func:`resume_config`: an edited ``train.rounds`` extends the run); a run killed before
    its first checkpoint starts again. ``rounds``: extend the run (finished or not) to that
    many rounds; the result equals a run of ``rounds`` from the start. ``workers`` /
    ``pool``: as for :func:`run_experiment` (a run may resume with another worker count)."""
    cfg, target = resume_config(run_dir, rounds)
    transport = make_transport(cfg, federation, workers, pool)
    try:
        sim = Simulation(cfg, run_dir, federation, progress, transport=transport)
        return sim.run(resume=True, stop_after=stop_after, rounds=target)
    finally:
        transport.close()


def load_finished(
    run_dir: str | Path, federation: Federation | None = None, weights: str = "selected"
) -> SavedRun:
    """A run rebuilt from its ``config.yaml`` and saved state, ready to evaluate (pictures,
    cross-site matrices, features): the federation, the model, the algorithm and every
    client's state at the round ``weights`` names, ``selected`` (the round model selection
    picked on validation, the one the run's tables report: default) or ``last``. The state
    is read without running code and ``selected.pt`` is checked to be this run's
    (:mod:`fedshift.runtime.rundir.checkpoint_io`)."""
    if weights not in WEIGHTS:
        raise ConfigError(f"weights must be one of {WEIGHTS}, got {weights!r}")
    run_dir = Path(run_dir)
    if not (run_dir / CHECKPOINT).is_file():
        raise FedshiftError(
            f"{run_dir} is not a finished fedshift run (it needs config.yaml and {CHECKPOINT})"
        )
    cfg = saved_config(run_dir)
    with torch_threads(cfg.run.threads):
        identity = RunIdentity(key=uuid.uuid4().hex)
        transport = InProcessTransport(federation)
        exp, server = start_experiment(cfg, transport, identity)
    like = (server, transport.state_dict())  # the keys, shapes and dtypes of this run's state
    ck = read_run_state(run_dir, CHECKPOINT, map_location=exp.device, like=like)
    set_rng_state(ck["rng"])
    state = ck if weights == "last" else _selected_state(run_dir, cfg, ck, exp.device, like)
    clients = held_client_state(state["clients"])
    return SavedRun(run_dir, cfg, weights, int(state["round"]), exp, state["server"], clients)


def _selected_state(
    run_dir: Path, cfg: RunConfig, ck: dict, device: torch.device, like: tuple
) -> dict:
    """The state of the round ``summary.json`` selected: ``checkpoint.pt``'s (``ck``) when it
    is the last round, else ``selected.pt``'s, checked to belong to this run."""
    summary_path = run_dir / "summary.json"
    if not summary_path.is_file():
        raise FedshiftError(
            f"{run_dir} has not finished (no summary.json), so no round is selected yet; "
            "use the last weights (--weights last) or finish it (fedshift run --resume)"
        )
    best = read_summary(summary_path)["best_round"]  # checked: the file and field named
    if best == int(ck["round"]):
        return ck
    if not (run_dir / SELECTED).is_file():
        raise FedshiftError(
            f"{run_dir} selected round {best} but has no {SELECTED} (a run made before "
            "fedshift kept the selected state); use its last weights with --weights last"
        )
    state = read_selected(run_dir, cfg, ck["run_key"], device, like)
    if int(state["round"]) != best:
        raise FedshiftError(
            f"{run_dir / SELECTED} holds round {state['round']} but summary.json selected "
            f"round {best}; the run directory is inconsistent (rerun it, or use --weights last)"
        )
    return state
