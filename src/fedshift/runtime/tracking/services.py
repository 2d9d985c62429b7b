"""Weights & Biases and MLflow trackers: ``track=[wandb]`` and ``track=[mlflow]``.

Both log the scalars TensorBoard gets (:func:`~fedshift.runtime.tracking.trackers.round_scalars`:
per round ``train_loss/mean`` and ``train_loss/<client>``, ``bytes/up`` and ``bytes/down``, and at
evaluated rounds ``<kind>/<split>_<metric>/<client>`` and ``.../mean``), at step = the round,
on this machine. Neither package is imported before a run opens its tracker (``fedshift
--help`` stays instant); :meth:`check` only looks them up and names the fix
(``pip install 'fedshift[wandb]'``, ``pip install 'fedshift[mlflow]'``).

When a round is logged
    Once it is durable: when the checkpoint that holds it is written (every
    ``checkpoint.every`` rounds or ``checkpoint.minutes`` minutes, at the last round, and when
    SIGINT / SIGTERM stops the run), with those signals held off until the tracker is done,
    as for the checkpoint write (:meth:`~fedshift.runtime.tracking.trackers.Tracker.checkpointed`).
    TensorBoard logs every round at once and, on resume, drops the rounds after the checkpoint
    with ``purge_step``; neither service can drop a logged step (MLflow metric histories are
    append-only, a W&B offline run is an append-only file per process), so these trackers
    never log a round that a resume would run again: a resumed run starts after its
    checkpoint, which holds every round they logged, and every round appears exactly once.
    The price: they lag the run by up to one checkpoint interval (rounds after the last
    checkpoint of a run that stops are logged by its resume). A process killed outright
    (SIGKILL, power loss) between writing a checkpoint and logging its rounds loses those
    rounds; its resume says so in ``run.log`` (a warning) and records them under ``missing``
    in the tracker's ``run.json``; so does a resume that adds the tracker to a run (``track``
    may change on resume): it logs from the round it resumes at.

``<run_dir>/mlflow/`` (:class:`MlflowTracker`)
    ``mlflow.db``, a SQLite MLflow store (MLflow 3.13 on refuses ``file:`` stores unless
    ``MLFLOW_ALLOW_FILE_STORE`` is set: SQLite is its local store; it needs ``sqlalchemy``
    and ``alembic``, both in the extra), and ``run.json`` (the MLflow run id, the last round
    logged). One MLflow run per run directory, in the experiment named after the config's
    ``name``; run name = the run directory's name; params = the resolved config, flattened
    (``train.rounds``; values over 500 characters cut), as the run started (MLflow params
    are immutable; ``config.yaml`` is the run's config); tag ``fedshift.run_dir``. A resume
    reopens the same run (status ``RUNNING``, then ``FINISHED``, or ``KILLED`` when the run
    stops before its last round). Metric keys keep the tags, characters MLflow refuses
    replaced by ``_``. Nothing is read from ``MLFLOW_TRACKING_URI``: the store is always the
    run directory's, and MLflow's usage telemetry is switched off
    (``MLFLOW_DISABLE_TELEMETRY=true`` unless set). See it with ``mlflow ui
    --backend-store-uri sqlite:///<run_dir>/mlflow/mlflow.db`` (the full ``mlflow`` package).

``<run_dir>/wandb/`` (:class:`WandbTracker`)
    A W&B run in offline mode, always, unless ``WANDB_MODE`` is set in the environment (then
    W&B does what it says): nothing goes to a server; ``WANDB_ERROR_REPORTING=false`` unless
    set. Each process that runs rounds (the run, each resume) writes one offline segment,
    ``wandb/offline-run-<time>-<id>/``, of the same W&B run id (``resume="allow"``): the
    segments hold disjoint rounds, in order (``run.json`` lists them: folder and rounds);
    ``wandb sync <run_dir>/wandb/offline-run-*`` uploads them, oldest first, as one run.
    Project = the config's ``name`` (or ``WANDB_PROJECT``) when the run starts (kept in
    ``run.json`` for its resumes), run name = the run directory's name, config = the
    resolved config. No console capture, no system metrics, no git or
    code saving. W&B writes a segment's file in 32 KiB blocks and completes it when the
    process finishes the run (a normal end, an error, SIGINT / SIGTERM): a process killed
    outright leaves its segment cut, so ``run.json`` counts a segment's rounds as logged only
    once it is finished, and the resume warns about the rounds the cut segment may lack.
"""

from __future__ import annotations

import importlib.metadata
import json
import logging
import os
import re
import time
import uuid
import warnings
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar, Literal

from fedshift.core.errors import ConfigError, FedshiftError
from fedshift.core.files import ensure_dir, read_json, write_text_atomic
from fedshift.core.rows import MetricRow
from fedshift.core.searchpath import find_optional
from fedshift.runtime.hooks import RoundRecord
from fedshift.runtime.tracking.trackers import Tracker, flatten_row, round_scalars

__all__ = ["DurableTracker", "MlflowTracker", "WandbTracker", "wandb_mode"]

log = logging.getLogger("fedshift.runtime.tracking")

#: the tracker's state in its folder: backend run id, last round logged, what is missing
STATE = "run.json"
#: the oldest wandb with ``reinit="create_new"`` (a run of its own, never the caller's)
WANDB_MIN = (0, 19, 10)
#: MLflow params longer than this are cut (MLflow 3 takes 6000 characters, older ones 500)
PARAM_MAX = 500

#: one round waiting for its checkpoint: (round, time it was logged, scalars)
Pending = tuple[int, float, dict[str, float]]


def _not_installed(modules: Sequence[str]) -> list[str]:
    # a wandb.py in the folder `python -m fedshift` ran from is not wandb (core/searchpath)
    return [m for m in modules if find_optional(m) is None]


def _package_error(tracker: str, problem: str) -> ConfigError:
    return ConfigError(
        f"config key 'track': {tracker} is asked for but {problem}; "
        f"pip install 'fedshift[{tracker}]' (or remove {tracker} from track)"
    )


def _version_tuple(version: str) -> tuple[int, ...]:
    parts = []
    for p in version.split(".")[:3]:
        digits = re.match(r"\d+", p)
        parts.append(int(digits.group()) if digits else 0)
    return tuple(parts)


def _experiment_name(tracker: Tracker) -> str:
    """The config's ``name``, else the folder above the run directory."""
    name = (tracker.config or {}).get("name")
    return str(name) if name else (tracker.run_dir.resolve().parent.name or "fedshift")


@contextmanager
def _quiet(*names: str) -> Iterator[None]:
    """Loggers ``names`` at WARNING for a while, and no deprecation warnings (MLflow announces
    creating its tables, and its SQLAlchemy models use options SQLAlchemy 2.1 deprecates)."""
    loggers = [logging.getLogger(n) for n in names]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


class DurableTracker(Tracker):
    """A tracker that logs a round once the checkpoint holding it is written, into one
    backend run per run directory (module docstring). Subclasses start, feed and finish the
    backend run (:meth:`_start`, :meth:`_send`, :meth:`_finish`)."""

    #: the folder in the run directory that holds the tracker's files
    folder: ClassVar[str]
    #: whether the backend has a round once :meth:`_send` returns (else: once finished)
    durable_send: ClassVar[bool] = True

    def __init__(self, run_dir: Path, config: dict | None = None) -> None:
        super().__init__(run_dir, config)
        self.dir = self.run_dir / self.folder
        self.run_id: str | None = None
        #: every round up to this one is in the backend (but those in ``missing``)
        self.logged_through = 0
        self.missing: list[list[int]] = []
        self.pending: dict[int, Pending] = {}
        self.state: dict[str, Any] = {}
        self.started = False

    # ------------------------------------------------------------------ backend
    def _start(self, run_id: str | None, resumed: bool) -> str:
        """Start the backend run, or reopen ``run_id``; return its id."""
        raise NotImplementedError

    def _send(self, rounds: list[Pending]) -> None:
        """Log ``rounds`` (in order, each with its scalars) to the backend run."""
        raise NotImplementedError

    def _finish(self, complete: bool) -> None:
        """End the backend run (``complete``: the run's last round is logged)."""
        raise NotImplementedError

    def _describe(self) -> str:
        """Where the backend run is (the ``run.log`` line of :meth:`open`)."""
        return f"run {self.run_id}"

    # ------------------------------------------------------------------ state
    def _read_state(self) -> dict[str, Any]:
        path = self.dir / STATE
        if not path.is_file():
            return {}
        try:
            state = read_json(path)
        except FedshiftError as e:
            log.warning("%s: starting a new %s run", e, self.folder)
            return {}
        return state if isinstance(state, dict) else {}

    def _write_state(self) -> None:
        self.state.update(
            run_id=self.run_id, logged_through=self.logged_through, missing=self.missing
        )
        write_text_atomic(self.dir / STATE, json.dumps(self.state, indent=1) + "\n")

    # ------------------------------------------------------------------ Tracker
    def open(self, last_round: int, records: list[MetricRow], resumed: bool) -> None:
        ensure_dir(self.dir)  # a tracker folder that is a link is not written through
        state = self._read_state()
        logged = int(state.get("logged_through") or 0)
        # a fresh start over a run that logged nothing yet (killed before its first
        # checkpoint) keeps its backend run; one over a run that logged rounds needs a new one
        if not state.get("run_id") or not (resumed or logged == 0):
            state, logged = {}, 0
        self.state = state
        self.missing = [list(m) for m in state.get("missing", [])]
        if resumed and logged < last_round:
            log.warning(
                "%s: rounds %d-%d may be missing from the %s run (a process was killed "
                "before it had logged them, or ran without this tracker)",
                self.folder,
                logged + 1,
                last_round,
                self.folder,
            )
            self.missing.append([logged + 1, last_round])
        self.logged_through = max(logged, last_round) if resumed else 0
        self.run_id = self._start(state.get("run_id"), resumed)
        self.started = True
        self._write_state()
        log.info("%s: %s; rounds logged once checkpointed", self.folder, self._describe())

    def log_round(self, record: RoundRecord) -> None:
        self.pending[record.round] = (record.round, time.time(), round_scalars(record))

    def checkpointed(self, rnd: int) -> None:
        due = [self.pending.pop(r) for r in sorted(self.pending) if r <= rnd]
        if not due or not self.started:
            return
        self._send(due)
        self.logged_through = max(self.logged_through, rnd)
        if self.durable_send:
            self._write_state()

    def close(self) -> None:
        if not self.started:
            return
        self.started = False
        rounds = (self.config or {}).get("train", {}).get("rounds")
        complete = not self.pending if rounds is None else self.logged_through >= rounds
        # rounds after the last checkpoint: a resume runs (and logs) them again
        self.pending.clear()
        self._finish(complete)
        self._write_state()


# ----------------------------------------------------------------------------- MLflow
#: characters an MLflow metric or param key may hold
_MLFLOW_KEY = re.compile(r"[^\w./\- ]")


def _param_value(v: Any) -> str:
    text = v if isinstance(v, str) else json.dumps(v)
    return text if len(text) <= PARAM_MAX else text[: PARAM_MAX - 3] + "..."


def _chunks(items: list, size: int) -> Iterator[list]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


class MlflowTracker(DurableTracker):
    """An MLflow run in ``<run_dir>/mlflow/mlflow.db`` (module docstring)."""

    package = "mlflow-skinny"
    folder = "mlflow"

    @classmethod
    def check(cls) -> None:
        missing = _not_installed(("mlflow", "sqlalchemy", "alembic"))
        if missing:
            verb = "is" if len(missing) == 1 else "are"
            raise _package_error("mlflow", f"{' and '.join(missing)} {verb} not installed")

    def __init__(self, run_dir: Path, config: dict | None = None) -> None:
        super().__init__(run_dir, config)
        self.client: Any = None

    @property
    def uri(self) -> str:
        """The tracking URI of the run directory's store (``sqlite:////abs/path``)."""
        return "sqlite:///" + (self.dir.resolve() / "mlflow.db").as_posix()

    def _start(self, run_id: str | None, resumed: bool) -> str:
        os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")  # before mlflow's import
        from mlflow.entities import Param
        from mlflow.exceptions import MlflowException
        from mlflow.tracking import MlflowClient

        with _quiet("mlflow", "alembic"):
            self.client = MlflowClient(tracking_uri=self.uri, registry_uri=self.uri)
            if run_id is not None:
                try:
                    run = self.client.get_run(run_id)
                except MlflowException:
                    run = None
                if run is not None and run.info.lifecycle_stage == "active":
                    self.client.update_run(run_id, status="RUNNING")
                    return run_id
                log.warning("mlflow: run %s is gone from %s: starting a new one", run_id, self.uri)
            name = _experiment_name(self)
            experiment = self.client.get_experiment_by_name(name)
            if experiment is not None:
                experiment_id = experiment.experiment_id
            else:
                artifacts = (self.dir / "artifacts").resolve().as_uri()
                experiment_id = self.client.create_experiment(name, artifact_location=artifacts)
            tags = {"fedshift.run_dir": str(self.run_dir.resolve())}
            run = self.client.create_run(experiment_id, run_name=self.run_dir.name, tags=tags)
        params = [
            Param(_MLFLOW_KEY.sub("_", k), _param_value(v))
            for k, v in flatten_row(self.config or {}).items()
        ]
        for chunk in _chunks(params, 100):  # MLflow's batch limit for params
            self.client.log_batch(run.info.run_id, params=chunk)
        return run.info.run_id

    def _send(self, rounds: list[Pending]) -> None:
        from mlflow.entities import Metric

        metrics = [
            Metric(key=_MLFLOW_KEY.sub("_", k), value=v, timestamp=int(t * 1000), step=rnd)
            for rnd, t, scalars in rounds
            for k, v in scalars.items()
        ]
        for chunk in _chunks(metrics, 1000):  # MLflow's batch limit for metrics
            self.client.log_batch(self.run_id, metrics=chunk)

    def _finish(self, complete: bool) -> None:
        self.client.set_terminated(self.run_id, "FINISHED" if complete else "KILLED")

    def _describe(self) -> str:
        return f"run {self.run_id} in {self.uri}"


# ----------------------------------------------------------------------------- W&B
def wandb_mode(environ: Mapping[str, str] = os.environ) -> Literal["offline"] | None:
    """The ``mode`` for ``wandb.init``: ``"offline"``, unless the environment sets
    ``WANDB_MODE`` (None: W&B follows it)."""
    return None if environ.get("WANDB_MODE") else "offline"


class WandbTracker(DurableTracker):
    """A W&B offline run in ``<run_dir>/wandb`` (module docstring)."""

    package = "wandb"
    folder = "wandb"
    # W&B writes the offline file in blocks and completes it on finish
    durable_send = False

    @classmethod
    def check(cls) -> None:
        if _not_installed(("wandb",)):
            raise _package_error("wandb", "the wandb package is not installed")
        try:
            version = importlib.metadata.version("wandb")
        except importlib.metadata.PackageNotFoundError:
            return
        if _version_tuple(version) < WANDB_MIN:
            least = ".".join(map(str, WANDB_MIN))
            raise _package_error("wandb", f"wandb {version} is older than {least}")

    def __init__(self, run_dir: Path, config: dict | None = None) -> None:
        super().__init__(run_dir, config)
        self.run: Any = None
        self.rounds: list[int] = []  # logged by this process (its segment)

    def _start(self, run_id: str | None, resumed: bool) -> str:
        mode = wandb_mode()
        if mode == "offline":
            os.environ.setdefault("WANDB_ERROR_REPORTING", "false")  # no crash reports
        import wandb

        # a resumed run keeps its project (``name`` may change on resume): one run, one project
        project = (run_id and self.state.get("project")) or os.environ.get("WANDB_PROJECT")
        project = re.sub(r"[/\\#?%:]", "-", project or _experiment_name(self))[:128]
        self.state["project"] = project
        settings = wandb.Settings(
            console="off",
            silent=True,
            x_disable_stats=True,
            x_disable_machine_info=True,
            disable_git=True,
            save_code=False,
        )
        self.run = wandb.init(
            dir=str(self.run_dir),
            project=project,
            name=self.run_dir.name,
            id=run_id or uuid.uuid4().hex[:8],
            resume="allow",
            config=self.config,
            mode=mode,
            reinit="create_new",
            settings=settings,
        )
        self.rounds = []
        return str(self.run.id)

    def _describe(self) -> str:
        where = Path(self.run.dir).parent if getattr(self.run, "dir", None) else self.dir
        mode = wandb_mode() or os.environ.get("WANDB_MODE")
        upload = f" (upload: wandb sync {self.dir}/offline-run-*)" if mode == "offline" else ""
        return f"{mode} run {self.run_id} in {where}{upload}"

    def _send(self, rounds: list[Pending]) -> None:
        for rnd, _, scalars in rounds:
            self.run.log(scalars, step=rnd, commit=True)
            self.rounds.append(rnd)

    def _finish(self, complete: bool) -> None:
        run, self.run = self.run, None
        run.finish(exit_code=0 if complete else 1)
        segment = Path(run.dir).parent.name if getattr(run, "dir", None) else None
        rounds = [self.rounds[0], self.rounds[-1]] if self.rounds else []
        self.state.setdefault("segments", []).append({"dir": segment, "rounds": rounds})
