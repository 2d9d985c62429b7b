"""A run's files: its directory name, ``metrics.jsonl`` (``metrics.csv`` and ``run.log``:
:mod:`fedshift.runtime.track`, :mod:`fedshift.core.logs`), and at the end ``summary.json``,
``ledger.json`` and ``convergence.png``. Result files are replaced atomically (written to a
temporary file, then renamed), so a reader never sees half of one."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from fedshift.core.config import RunConfig
from fedshift.core.files import write_text_atomic
from fedshift.eval.plots import plot_convergence
from fedshift.eval.summary import summarize
from fedshift.runtime.rundir import claim_run_dir
from fedshift.runtime.track import utc_now


@dataclass
class RunResult:
    run_dir: Path
    summary: dict


def new_run_dir(cfg: RunConfig, out: str | Path | None = None, exists: str = "new") -> Path:
    """A new, empty directory ``<out>/<name>/<algorithm>-<dataset>-seed<seed>``, with
    ``-2``, ``-3``... if taken; created here, atomically, so two runs started together never
    get the same one (:func:`~fedshift.runtime.rundir.claim_run_dir`, whose ``exists`` says
    what a taken name does instead: ``error`` or ``overwrite``)."""
    root = Path(out or cfg.out) / cfg.name
    return claim_run_dir(root, run_dir_base(cfg), exists)


def run_dir_base(cfg: RunConfig) -> str:
    """A run's folder name, ``<algorithm>-<dataset>-seed<seed>``; a plug-in's
    ``module:Class`` algorithm name has its colon as a dot (not allowed on Windows)."""
    algo = cfg.algorithm["name"].replace(":", ".")
    return f"{algo}-{cfg.dataset['name']}-seed{cfg.seed}"


def write_metrics(run_dir: Path, rows: list[dict], append: bool = False) -> None:
    """``metrics.jsonl``: one line per evaluated (round, client). Appending adds whole lines;
    a rewrite (on resume, from the checkpoint's rows) replaces the file atomically."""
    text = "".join(json.dumps(r) + "\n" for r in rows)
    path = Path(run_dir) / "metrics.jsonl"
    if append:
        with open(path, "a") as f:
            f.write(text)
    else:
        write_text_atomic(path, text)


def finish_run(run, label: str, extra: dict | None = None) -> dict:
    """Write ``summary.json`` (+ ``extra`` keys), ``ledger.json`` and ``convergence.png`` of
    a finished run (a :class:`~fedshift.runtime.loop.RoundLoop`). ``summary["provenance"]``
    records what produced the run (:func:`fedshift.runtime.track.provenance`), with its end
    time; it is not a result."""
    summary = summarize(run)
    summary.update(extra or {})
    if getattr(run, "provenance", None) is not None:
        summary["provenance"] = {**run.provenance, "end": utc_now()}
    run_dir = Path(run.run_dir)
    write_text_atomic(run_dir / "summary.json", json.dumps(summary, indent=2) + "\n")
    ledger = run.ledger
    data = {
        "by_record": ledger.by_record(),
        "by_round": {str(k): v for k, v in ledger.by_round().items()},
        "total": {"up": ledger.total("up"), "down": ledger.total("down")},
    }
    write_text_atomic(run_dir / "ledger.json", json.dumps(data, indent=2) + "\n")
    metric = run.task.primary
    plot_convergence(
        run.records, run.kinds, run_dir / "convergence.png", label, metric.name, metric.label
    )
    return summary
