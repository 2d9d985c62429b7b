"""Run tracking and provenance: ``metrics.csv`` always, TensorBoard, Weights & Biases or MLflow
on request, and the ``provenance`` block of ``summary.json``.

Trackers see a run round by round (:class:`RoundRecord`: the train loss of every reply, the
evaluation rows when the round was evaluated, the bytes of the round) and never change it.
The config key ``track`` lists the optional ones (``track=[tensorboard,wandb,mlflow]``);
:class:`CsvTracker` always runs:

* ``metrics.csv`` next to ``metrics.jsonl``: the same rows (one per evaluated round and
  client), nested keys flattened (``global.val_acc``); rewritten from the checkpoint's rows
  when a run resumes, as ``metrics.jsonl`` is.
* ``tensorboard/`` (:class:`TensorBoardTracker`, ``torch.utils.tensorboard``; needs the
  ``tensorboard`` package): per round ``train_loss/mean`` and ``train_loss/<client>``,
  ``bytes/up`` and ``bytes/down``, and at evaluated rounds ``<kind>/<split>_<metric>/<client>``
  and ``.../mean`` (the mean over the training clients that replied, as model selection
  takes it). A resumed run (or one restarted from scratch) writes with ``purge_step`` at its
  first round, so the rounds logged after the checkpoint it resumes from are dropped: no
  step appears twice.
* ``wandb/`` and ``mlflow/`` (:mod:`fedshift.runtime.tracking.services`: a W&B offline run, an
  MLflow run in a SQLite store): the same scalars, each round logged once the checkpoint
  that covers it is written (:meth:`Tracker.checkpointed`), since neither can drop steps.

Adding a tracker: a :class:`Tracker` subclass (a :class:`~fedshift.runtime.hooks.Hook` of the
round loop) registered in :data:`fedshift.runtime.tracking.registry.TRACKERS` (one
``TRACKERS.add``) and its name in the ``track`` key's choices
(:class:`fedshift.core.config.RunConfig`); one that needs a package
imports it in ``open``, never at module level (``fedshift --help`` stays instant).

:func:`provenance` is what produced a run: versions, the git commit of the fedshift source,
the command line, the host, start and end time. It goes to ``summary.json["provenance"]``,
which is not a result (no test compares it, no digest includes it).
"""

from __future__ import annotations

import csv
import functools
import importlib.metadata
import io
import json
import platform
import socket
import subprocess
import sys
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ClassVar

from fedshift.core.errors import ConfigError
from fedshift.core.files import csv_safe, open_append, write_text_atomic
from fedshift.core.machine import machine
from fedshift.core.rows import MetricRow, scores_of
from fedshift.core.searchpath import find_optional
from fedshift.runtime.hooks import Hook, RoundRecord

__all__ = [
    "CsvTracker",
    "TensorBoardTracker",
    "Tracker",
    "describe_end",
    "describe_start",
    "flatten_row",
    "git_state",
    "provenance",
    "round_scalars",
    "source_git_state",
    "utc_now",
]

METRICS_CSV = "metrics.csv"
TENSORBOARD_DIR = "tensorboard"


class Tracker(Hook):
    """One destination of a run's rounds: a :class:`~fedshift.runtime.hooks.Hook` of its loop
    that sees ``open``, ``log_round``, ``checkpointed`` and ``close``. ``open`` is called once
    the run's earlier rows are known (``records``: those of the checkpoint a resumed run
    starts from; ``resumed``: the run continues after round ``last_round``, else it starts
    from round 1). ``config``: the run's resolved config
    (:meth:`~fedshift.core.config.RunConfig.to_dict`), when the caller has it."""

    #: the pip package the tracker needs (None: none)
    package: ClassVar[str | None] = None

    def __init__(self, run_dir: Path, config: dict | None = None) -> None:
        self.run_dir = Path(run_dir)
        self.config = config

    @classmethod
    def check(cls) -> None:
        """Raise :class:`ConfigError` naming the fix when the tracker cannot run here."""


# ----------------------------------------------------------------------------- CSV
def flatten_row(row: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """A ``metrics.jsonl`` row with nested keys joined by dots (``global.val_acc``)."""
    out: dict[str, Any] = {}
    for k, v in row.items():
        if isinstance(v, dict):
            out.update(flatten_row(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _cell(v: Any) -> str:
    """A ``metrics.csv`` cell: text as it is (escaped against spreadsheet formulas:
    :func:`~fedshift.core.files.csv_safe`), anything else as JSON, None empty."""
    if v is None:
        return ""
    return csv_safe(v) if isinstance(v, str) else json.dumps(v)


class CsvTracker(Tracker):
    """``metrics.csv``: the rows of ``metrics.jsonl``, flattened (module docstring)."""

    def __init__(self, run_dir: Path, config: dict | None = None) -> None:
        super().__init__(run_dir, config)
        self.path = self.run_dir / METRICS_CSV
        self.records: list[dict] = []
        self.columns: list[str] = []

    def open(self, last_round: int, records: list[MetricRow], resumed: bool) -> None:
        self.records = [flatten_row(r) for r in records]
        self._rewrite()

    def log_round(self, record: RoundRecord) -> None:
        if not record.rows:
            return
        rows = [flatten_row(r) for r in record.rows]
        self.records.extend(rows)
        if any(k not in self.columns for r in rows for k in r):
            self._rewrite()  # a column appeared (a lost client): the header changes
            return
        with open_append(self.path, newline="") as f:  # never through a link
            f.write(self._lines(rows))

    def _rewrite(self) -> None:
        self.columns = _columns(self.records)
        header = self._lines([dict(zip(self.columns, self.columns, strict=True))])
        # rebuilt from the checkpoint's rows on resume, as metrics.jsonl: atomic, no fsync
        write_text_atomic(self.path, header + self._lines(self.records), durable=False)

    def _lines(self, rows: list[dict]) -> str:
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        for r in rows:
            writer.writerow([_cell(r.get(c)) for c in self.columns])
        return buf.getvalue()


def _columns(rows: Iterable[dict]) -> list[str]:
    """``round``, ``client`` first, then every other key in order of first appearance."""
    cols = {"round": None, "client": None}
    for r in rows:
        cols.update(dict.fromkeys(r))
    return list(cols)


# ----------------------------------------------------------------------------- TensorBoard
def round_scalars(record: RoundRecord) -> dict[str, float]:
    """The scalars of one round, by tag (module docstring)."""
    out: dict[str, float] = {}
    losses = record.train_loss
    if losses:
        out["train_loss/mean"] = sum(losses.values()) / len(losses)
        out.update({f"train_loss/{cid}": float(v) for cid, v in losses.items()})
    out["bytes/up"] = float(record.bytes_up)
    out["bytes/down"] = float(record.bytes_down)
    for kind in record.kinds:
        means: dict[str, list[float]] = {}
        for r in record.rows or []:
            scores = scores_of(r, kind)
            if not isinstance(scores, dict):
                continue
            for key, v in scores.items():
                out[f"{kind}/{key}/{r['client']}"] = float(v)
                if not r.get("holdout"):
                    means.setdefault(key, []).append(float(v))
        out.update({f"{kind}/{k}/mean": sum(vs) / len(vs) for k, vs in means.items()})
    return out


class TensorBoardTracker(Tracker):
    """Scalars per round in ``<run_dir>/tensorboard`` (module docstring)."""

    package = "tensorboard"

    @classmethod
    def check(cls) -> None:
        problem = None
        if find_optional("tensorboard") is None:  # not a tensorboard.py of the current folder
            problem = "the tensorboard package is not installed"
        else:
            try:
                import torch.utils.tensorboard  # noqa: F401
            except ImportError as e:  # too old, or broken
                problem = f"torch.utils.tensorboard cannot be imported ({e})"
        if problem:
            raise ConfigError(
                f"config key 'track': tensorboard is asked for but {problem}; "
                "pip install 'fedshift[tensorboard]' (or remove tensorboard from track)"
            )

    def __init__(self, run_dir: Path, config: dict | None = None) -> None:
        super().__init__(run_dir, config)
        self.writer: Any = None

    def open(self, last_round: int, records: list[MetricRow], resumed: bool) -> None:
        from torch.utils.tensorboard import SummaryWriter

        log_dir = self.run_dir / TENSORBOARD_DIR
        earlier = log_dir.is_dir() and any(log_dir.iterdir())
        # rounds logged after the checkpoint this run starts from are hidden (purged)
        purge = last_round + 1 if earlier else None
        self.writer = SummaryWriter(log_dir=str(log_dir), purge_step=purge, flush_secs=30)

    def log_round(self, record: RoundRecord) -> None:
        for tag, value in round_scalars(record).items():
            self.writer.add_scalar(tag, value, global_step=record.round)
        self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


def describe_start(run: Any, resumed: bool) -> str:
    """The ``run.log`` line that opens a run: what runs, on what, with which fedshift."""
    cfg, prov = run.cfg, run.provenance or {}
    git = prov.get("git")
    source = ""
    if git:
        source = f" (git {git['commit'][:10]}{', with local changes' if git['dirty'] else ''})"
    line = (
        f"{cfg.algorithm.name} on {cfg.dataset.name}, seed {cfg.seed}, "
        f"{cfg.train.rounds} rounds, {len(run.fed.client_names)} clients, device {run.device}; "
        f"fedshift {prov.get('fedshift')}{source}, torch {prov.get('torch')}"
    )
    return line + (f"; resuming after round {run.last_round}" if resumed else "")


def describe_end(summary: dict) -> str:
    """The ``run.log`` line that closes a finished run."""
    return (
        f"done: {summary['metric_label']} test mean {summary['test_mean']:.4f} at round "
        f"{summary['best_round']} (selected on validation), {summary['wall_s']:.1f} s of "
        "training; summary.json written"
    )


def utc_now() -> str:
    """The time now, ISO 8601, UTC, to the second (``2026-01-31T12:00:00+00:00``)."""
    return datetime.now(UTC).isoformat(timespec="seconds")


def _version(dist: str) -> str | None:
    """An installed distribution's version, read from its metadata (nothing imported)."""
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def git_state(path: Path, timeout: float = 5.0) -> dict[str, Any] | None:
    """``{"commit": sha, "dirty": bool}`` of the git checkout that tracks the files in
    ``path`` (``dirty``: tracked files changed; untracked ones are ignored), or None when
    ``path`` is not tracked by git, git is missing or does not answer within ``timeout``."""

    def git(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["git", "-C", str(path), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    try:
        # the package itself must be tracked: an installed copy inside some other repository
        # (a virtual environment in a project folder) has no commit of its own
        if git("ls-files", "--error-unmatch", "__init__.py").returncode != 0:
            return None
        head = git("rev-parse", "HEAD")
        if head.returncode != 0:
            return None
        status = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return None
    dirty = bool(status.stdout.strip()) if status.returncode == 0 else None
    return {"commit": head.stdout.strip(), "dirty": dirty}


@functools.cache
def _source_git_state() -> dict[str, Any] | None:
    import fedshift

    return git_state(Path(fedshift.__file__).parent)


def source_git_state() -> dict[str, Any] | None:
    """:func:`git_state` of the fedshift source, asked once per process: its three ``git``
    calls took ~40 ms of CPU and up to 0.1 s per run (a sweep's runs, the engine benchmark's
    repeats). The code a process runs is what it imported, so asking again later would
    describe files it does not run, not a truer state."""
    state = _source_git_state()
    return None if state is None else dict(state)


def provenance(started: str, resumed_from: int | None = None) -> dict[str, Any]:
    """What produced a run, as it starts (``end`` is added when it finishes): versions of
    fedshift, torch, numpy and flwr (from their metadata: Ray is not imported), the git
    commit of the fedshift source (None when not a git checkout), the command line, host,
    the machine (CPU model and torch's kernel path for it, cores, GPU:
    :func:`fedshift.core.machine.machine`), Python and platform, and the start time (ISO,
    UTC). ``resumed_from``: the round a resumed run continued after. The git state is the
    process's (:func:`source_git_state`)."""
    import torch

    import fedshift

    return {
        "fedshift": getattr(fedshift, "__version__", None) or _version("fedshift"),
        "torch": str(torch.__version__),
        "numpy": _version("numpy"),
        "flwr": _version("flwr"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "git": source_git_state(),
        "command": list(sys.argv),
        "host": socket.gethostname(),
        "machine": machine(),
        "start": started,
        "end": None,
        "resumed_from": resumed_from,
    }
