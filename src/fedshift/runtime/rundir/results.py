"""A run's files: its directory name, ``metrics.jsonl`` (``metrics.csv`` and ``run.log``:
:mod:`fedshift.runtime.tracking.trackers`, :mod:`fedshift.core.logs`), and at the end
``summary.json``, ``ledger.json`` and ``convergence.png``. Result files are replaced atomically
(written to a temporary file, then renamed), so a reader never sees half of one."""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

from fedshift.core.config import RunConfig
from fedshift.core.errors import FedshiftError
from fedshift.core.files import open_append, write_text_atomic
from fedshift.core.identity import EXECUTION_KEYS, flatten, number_config
from fedshift.core.rows import MetricRow
from fedshift.eval.plots import plot_convergence
from fedshift.eval.summary import RunRecord
from fedshift.runtime.hooks import Hook
from fedshift.runtime.rundir.ownership import (
    EXISTS,
    LOCK_FILE,
    RunDirExists,
    check_clearable,
    claim_run_dir,
    hold_run,
    is_empty,
)


@dataclass(frozen=True)
class RunResult:
    """A run that finished: its directory and ``summary.json``'s content."""

    run_dir: Path
    summary: dict


def new_run_dir(cfg: RunConfig, out: str | Path | None = None, exists: str = "new") -> Path:
    """A new, empty directory ``<out>/<name>/<run_dir_name(cfg)>``, with ``-2``, ``-3``... if
    taken; created here, atomically, so two runs started together never get the same one
    (:func:`~fedshift.runtime.rundir.ownership.claim_run_dir`, whose ``exists`` says what a taken
    name does instead: ``error`` or ``overwrite``)."""
    root = Path(out or cfg.out) / cfg.name
    return claim_run_dir(root, run_dir_name(cfg), exists)


def run_dir_base(cfg: RunConfig) -> str:
    """``<algorithm>-<dataset>-seed<seed>``: the head of a suite cell's folder name (``fedshift
    bench`` appends the cell's config digest); a plug-in's ``module:Class`` algorithm name has
    its colon as a dot (not allowed on Windows)."""
    return f"{_algo(cfg)}-{cfg.dataset.name}-seed{cfg.seed}"


def _algo(cfg: RunConfig) -> str:
    return cfg.algorithm.name.replace(":", ".")


#: the longest readable part of a run directory's name (the digest keeps names unique)
MAX_READABLE = 80


def run_dir_name(cfg: RunConfig) -> str:
    """A run's folder name: ``<algorithm>-<dataset>[-<key=value>...]-seed<seed>-<digest>``.

    The ``key=value`` parts are what sets the run apart from the defaults
    (:func:`config_changes`: ``fedavg-digits-train.lr=0.1-seed0-1a2b3c4d5e``), cut to
    :data:`MAX_READABLE` characters (``+N`` says how many more keys differ); the digest
    (:func:`run_digest`) covers every key that changes a number, so runs of different configs
    never share a name, and the runs of one config that differ only in the seed share their
    digest. Suite cells keep their own names (``fedshift.bench``)."""
    tokens = [f"{k}={_name_value(v)}" for k, v in config_changes(cfg)]
    shown: list[str] = []
    for i, t in enumerate(tokens):
        if len("-".join([*shown, t])) > MAX_READABLE:
            shown.append(f"+{len(tokens) - i}")
            break
        shown.append(t)
    parts = [_algo(cfg), cfg.dataset.name, *shown, f"seed{cfg.seed}", run_digest(cfg)]
    return "-".join(parts)


def run_digest(cfg: RunConfig) -> str:
    """A digest of the run's config that decides its numbers
    (:func:`~fedshift.core.identity.number_config`) without its seed and ``train.rounds`` (a
    run extended to more rounds with ``--resume`` stays the same run, in the same folder)."""
    d = number_config(cfg.to_dict())
    d.pop("seed", None)
    d.get("train", {}).pop("rounds", None)
    blob = json.dumps(d, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:10]


def _name_value(v: object) -> str:
    if isinstance(v, list | tuple):
        return ",".join(_name_value(x) for x in v) or "none"
    if isinstance(v, bool):
        return str(v).lower()
    text = str(v)
    if isinstance(v, str) and ("/" in text or "\\" in text):
        text = Path(text).name  # a file: its name
    return _UNSAFE.sub("_", text)


#: characters a folder name keeps (no shell or Windows specials, no spaces)
_UNSAFE = re.compile(r"[^A-Za-z0-9._,+=-]")


def config_changes(cfg: RunConfig) -> list[tuple[str, object]]:
    """``(dotted key, value)`` of every key of a resolved config that decides numbers and
    differs from the defaults: the component's own keys against its defaults
    (``algorithm.mu``), another model or partition (``model``), the augments beyond the
    algorithm's own (``augment``, with their changed keys as ``augment.<name>.<key>``), the
    fixed sections' keys (``train.lr``), and the execution keys that change the last bits
    (``threads``, ``executor``...). Not the algorithm and dataset names, the seed or
    ``train.rounds`` (a run's folder names those apart or not at all)."""
    d = number_config(cfg.to_dict())
    base = number_config(RunConfig().to_dict())
    out: list[tuple[str, object]] = []
    for section in ("algorithm", "augment", "dataset", "model", "partition"):
        given, default = d.pop(section), base.pop(section)
        if section == "augment":
            out += _augment_changes(cfg)
            continue
        component = getattr(cfg, section)
        if section in ("model", "partition") and component.name != default["name"]:
            out.append((section, component.name))
        own = component.defaults()
        for k, v in given.items():
            if k != "name" and not k.endswith("_sha256") and (k not in own or own[k] != v):
                out.append((f"{section}.{k}", v))
    flat, flat_base = flatten(d), flatten(base)
    plain = flatten(RunConfig().to_dict())
    for k, v in flat.items():
        if k in ("seed", "train.rounds"):
            continue
        if k.startswith("privacy.") and k != "privacy.epsilon" and plain.get(k) == v:
            continue  # privacy.delta / privacy.clip at their defaults: the name says epsilon
        if k not in flat_base or flat_base[k] != v:
            # number_config's execution keys (threads...) are run.* keys in a config
            out.append((f"run.{k}" if k in EXECUTION_KEYS else k, v))
    return out


def _augment_changes(cfg: RunConfig) -> list[tuple[str, object]]:
    """The augments a run adds to its algorithm's own, and the changed keys of each."""
    implied = set(cfg.algorithm.factory.implied_augments(cfg.algorithm.params))
    names, changed = [], []
    for a in cfg.augment:
        own = a.defaults()
        diff = [(f"augment.{a.name}.{k}", v) for k, v in a.to_dict().items()
                if k != "name" and own.get(k) != v]  # fmt: skip
        if a.name not in implied:
            names.append(a.name)
        changed += diff
    return ([("augment", "+".join(names))] if names else []) + changed


def planned_dirs(cfgs: list[RunConfig], out: str | Path | None) -> list[Path]:
    """Each run's directory, ``<out>/<name>/<run_dir_name>``; two runs of one sweep with the
    same config and seed are refused (they would be one run twice)."""
    dirs: list[Path] = []
    for cfg in cfgs:
        path = Path(out or cfg.out) / cfg.name / run_dir_name(cfg)
        if path in dirs:
            raise FedshiftError(
                f"the sweep has the same config and seed twice ({path.name}): remove the "
                "duplicate value from the sweep"
            )
        dirs.append(path)
    return dirs


def claim_dirs(
    cfgs: list[RunConfig],
    out: str | Path | None,
    exists: str,
    command: str = "fedshift run",
) -> list[Path]:
    """Claim every run's directory before any runs (``exists``: ``error``, ``overwrite`` or
    ``new``, :func:`~fedshift.runtime.rundir.ownership.claim_run_dir`). With ``error``, every taken
    one is named in one :class:`~fedshift.runtime.rundir.ownership.RunDirExists`, with how its
    stored config differs from the new one (its advice names ``command``: ``fedshift run``,
    ``fedshift flower simulate``, ``fedshift.run``); ``overwrite`` deletes only run
    directories; ``new`` takes the next free ``-2``, ``-3``..."""
    if exists not in EXISTS:
        raise FedshiftError(f"exists must be one of {', '.join(EXISTS)}, got {exists!r}")
    planned = planned_dirs(cfgs, out)
    taken = [(p, c) for p, c in zip(planned, cfgs, strict=True) if p.exists() and not is_empty(p)]
    if exists == "error" and taken:
        raise RunDirExists([p for p, _ in taken], command, [c.to_dict() for _, c in taken])
    if exists == "overwrite":
        # only directories fedshift made, never through a symbolic link
        # (:func:`~fedshift.runtime.rundir.ownership.check_clearable`): one that is not stops every
        # run
        for p in planned:  # nothing is deleted unless every one of them may be
            if p.is_symlink() or (p.exists() and not is_empty(p)):
                check_clearable(p)
    claimed: list[Path] = []
    try:
        for p in planned:  # "new": the next free name, as runs claiming one by one get
            claimed.append(claim_run_dir(p.parent, p.name, exists))
    except BaseException:
        release(claimed)
        raise
    return claimed


def release(dirs: list[Path]) -> None:
    """Remove the claimed directories no run wrote into (empty but for a lock file), unless
    another process holds one (it is starting a run there)."""
    for p in dirs:
        with contextlib.suppress(OSError, FedshiftError):
            if is_empty(p):
                with hold_run(p):
                    if is_empty(p):
                        (p / LOCK_FILE).unlink(missing_ok=True)
                        p.rmdir()


def write_metrics(run_dir: Path, rows: list[MetricRow], append: bool = False) -> None:
    """``metrics.jsonl``: one line per evaluated (round, client). Appending adds whole lines;
    a rewrite (on resume, from the checkpoint's rows) replaces the file atomically, without
    an fsync: the file is rebuilt from the checkpoint whenever a run resumes, and its
    appends are never fsynced either (:mod:`fedshift.core.files`)."""
    text = "".join(json.dumps(r) + "\n" for r in rows)
    path = Path(run_dir) / "metrics.jsonl"
    if append:
        with open_append(path) as f:  # never through a link planted in a run folder
            f.write(text)
    else:
        write_text_atomic(path, text, durable=False)


class MetricsFile(Hook):
    """``metrics.jsonl``: rewritten from the checkpoint's rows when the run opens, then each
    evaluated round's rows appended."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = Path(run_dir)

    def open(self, last_round: int, records: list[MetricRow], resumed: bool) -> None:
        write_metrics(self.run_dir, records)

    def evaluated(self, rnd: int, rows: list[MetricRow]) -> None:
        write_metrics(self.run_dir, rows, append=True)


class ResultFiles(Hook):
    """At the end of a run: ``summary.json`` (:attr:`RunRecord.summary
    <fedshift.eval.summary.RunRecord.summary>`; its ``provenance`` records what produced
    the run, :func:`fedshift.runtime.tracking.trackers.provenance`, and is not a result),
    ``ledger.json`` and ``convergence.png``. ``summary.json`` is written last: its presence
    says every other result file is there (a full disk that stops the ledger or the figure
    leaves a run that resumes, never one that ``fedshift bench`` takes as finished)."""

    def end(self, record: RunRecord) -> None:
        run_dir = Path(record.run_dir)
        ledger = record.ledger
        data = {
            "by_record": ledger.by_record(),
            "by_round": {str(k): v for k, v in ledger.by_round().items()},
            "total": {"up": ledger.total("up"), "down": ledger.total("down")},
        }
        write_text_atomic(run_dir / "ledger.json", json.dumps(data, indent=2) + "\n")
        metric = record.task.primary
        plot_convergence(
            record.records,
            record.kinds,
            run_dir / "convergence.png",
            record.label,
            metric.name,
            metric.label,
        )
        write_text_atomic(run_dir / "summary.json", json.dumps(record.summary, indent=2) + "\n")
