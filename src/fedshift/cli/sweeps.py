"""``fedshift run``'s runs: where each goes (and what happens when its directory is taken),
one after another or ``--jobs N`` at a time.

Run directories: ``<out>/<name>/<algorithm>-<dataset>[-<key=value>...]-seed<seed>-<digest>``
(:func:`~fedshift.runtime.rundir.results.run_dir_name`: what sets the run apart from the defaults,
and a digest of its config), so the runs of a sweep never share one. When a run's directory
exists already, ``fedshift run`` stops before running anything and names each such directory
with what it holds and how its ``config.yaml`` differs from the new config
(:class:`~fedshift.runtime.rundir.ownership.RunDirExists`), offering ``fedshift run --resume DIR``,
``--overwrite`` (the old run is deleted, holding its lock, just before the new one starts in
it) and ``--new`` (the next free ``-2``, ``-3``...).

``--jobs N`` runs a sweep's runs in N worker processes (:mod:`fedshift.runtime.parallel`,
as ``fedshift bench`` does), each with the config's ``run.threads`` torch threads, so the
results equal a sequential run's; jobs x ``run.workers`` x ``run.threads`` must fit in the
usable cores (:func:`~fedshift.runtime.cores.share_cores`). Progress: the rounds and ETA of
every running run and of the sweep (:class:`~fedshift.runtime.progress.CellProgress`).
"""

from __future__ import annotations

import json
import signal
import sys
from dataclasses import dataclass
from pathlib import Path

from fedshift.core.config import RunConfig
from fedshift.core.errors import FedshiftError
from fedshift.runtime.rundir.ownership import clear_run_dir, hold_run
from fedshift.runtime.rundir.results import claim_dirs, planned_dirs, release
from fedshift.runtime.stopping import RunSignal

__all__ = ["SweepStopped", "claim_dirs", "planned_dirs", "run_sweep"]


@dataclass
class _Job:
    cfg: RunConfig
    run_dir: Path
    label: str


class SweepStopped(RunSignal):  # noqa: N818 - a signal, like RunSignal
    """SIGINT / SIGTERM stopped ``fedshift run --jobs``; each running run saved its last
    whole round."""

    def __init__(self, signum: int, stopped: list[Path]) -> None:
        self.signum = signum
        self.run_dir = stopped[0] if stopped else Path()
        self.saved_round = None
        name = signal.Signals(signum).name
        how = "; ".join(f"fedshift run --resume {p}" for p in stopped) or "nothing to resume"
        BaseException.__init__(
            self,
            f"{name}: sweep stopped, each running run saved its last whole round; continue "
            f"them with: {how} (`fedshift bench` keeps a suite's finished cells and "
            "continues the rest by itself)",
        )


def run_sweep(
    cfgs: list[RunConfig],
    labels: list[str],
    dirs: list[Path],
    overwrite: bool,
    jobs: int | str,
    progress: bool,
) -> list[dict]:
    """Run every config into its claimed directory (``overwrite``: emptied first, holding its
    lock), one after another or ``jobs`` at a time; returns their summaries, ``label`` set.
    Directories left unused (a run that never started) are removed."""
    try:
        if jobs == 1 or len(cfgs) == 1:
            return _sequential(cfgs, labels, dirs, overwrite, progress)
        return _parallel(
            [_Job(*x) for x in zip(cfgs, dirs, labels, strict=True)], overwrite, jobs, progress
        )
    finally:
        release(dirs)


def _sequential(
    cfgs: list[RunConfig], labels: list[str], dirs: list[Path], overwrite: bool, progress: bool
) -> list[dict]:
    from fedshift.runtime.simulation import run_experiment

    summaries = []
    for i, (cfg, label, path) in enumerate(zip(cfgs, labels, dirs, strict=True), 1):
        if len(cfgs) > 1 and progress:
            print(f"[{i}/{len(cfgs)}] {cfg.algorithm.name} seed={cfg.seed}", file=sys.stderr)
        with hold_run(path):
            if overwrite:
                clear_run_dir(path)
            result = run_experiment(cfg, run_dir=path, progress=progress)
        result.summary["label"] = label
        summaries.append(result.summary)
    return summaries


def _jobs(jobs: int | str, todo: list[_Job]) -> int:
    """The number of runs at a time: ``jobs`` (``auto``: as many as fit in the cores), at
    most one per run; refused when jobs x run.workers x run.threads exceed the cores."""
    from fedshift.runtime.cores import resolve_workers, usable_cores

    cores = usable_cores()
    need = max(
        (1 if j.cfg.run.workers == "auto" else resolve_workers(j.cfg.run.workers))
        * j.cfg.run.threads
        for j in todo
    )
    if jobs == "auto":
        return max(1, min(len(todo), cores // need))
    n = min(int(jobs), len(todo))
    if n * need > cores:
        raise FedshiftError(
            f"--jobs {n} x {need} cores per run (its run.workers x run.threads) needs "
            f"{n * need} cores but this machine has {cores}: use --jobs {max(1, cores // need)} "
            "(or fewer run.workers / run.threads; run.workers=auto shares what the jobs leave)"
        )
    return n


def _parallel(todo: list[_Job], overwrite: bool, jobs: int | str, progress: bool) -> list[dict]:
    """The runs in worker processes, through the grid runner ``fedshift bench`` uses
    (:func:`fedshift.runtime.parallel.run_grid`)."""
    from fedshift.runtime.cores import share_cores
    from fedshift.runtime.parallel import Stopped, run_grid, run_job

    n_jobs, cell_workers = share_cores(todo, _jobs(jobs, todo))
    keys = [str(j.run_dir) for j in todo]
    rows = [(str(j.run_dir), f"{j.label} s{j.cfg.seed}", j.cfg.train.rounds) for j in todo]
    args = {
        k: (j.cfg.to_dict(), k, cell_workers[k], overwrite) for k, j in zip(keys, todo, strict=True)
    }
    try:
        early = {k for k, j in zip(keys, todo, strict=True) if j.cfg.train.patience}
        failed = run_grid(
            f"sweep {todo[0].cfg.name}", rows, run_job, args, n_jobs, progress, stops_early=early
        )
    except Stopped as stop:
        stopped = [j.run_dir for j in todo if _unfinished(j.run_dir)]
        raise SweepStopped(stop.signum, stopped) from None
    errors = [f"{key}: {why}" for key, why in failed.items()]
    if errors:
        raise FedshiftError(
            f"{len(errors)} of {len(todo)} runs failed (the others are kept):\n  "
            + "\n  ".join(errors)
        )
    summaries = []
    for j in todo:
        summary = json.loads((j.run_dir / "summary.json").read_text())
        summary["label"] = j.label
        summaries.append(summary)
    return summaries


def _unfinished(path: Path) -> bool:
    return (path / "config.yaml").is_file() and not (path / "summary.json").is_file()
