"""Experiment suites: a grid of runs with cached cells, parallel workers and live progress.

A suite file is an ordinary run config whose ``sweep`` grid spans any config keys (dataset,
partition, algorithm, augment, seed, ...); ``key=value`` overrides apply to every cell, and one
on a swept key replaces that key's sweep (:func:`~fedshift.core.config.apply_overrides`, as
for every command). ``fedshift bench SUITE.yaml`` expands the grid,
validates every cell before running any, and gives each cell a stable directory
``<out>/<name>/<algorithm>-<dataset>-seed<k>-<hash>`` where ``hash`` is a digest of the
cell's resolved config. A cell whose directory holds a readable ``summary.json`` with the same
digest is done and is never run again; a cell killed midway (or whose summary is unreadable)
continues from its last checkpoint (``checkpoint.every``); anything else starts afresh.

A cell whose finished result is committed in the repository's ``results/`` tree
(``results/<suite name>/<cell directory>/``, same digest; :mod:`fedshift.claims.collect`) is
not run either: its ``config.yaml``, ``summary.json``, ``metrics.jsonl`` and ``cell.json``
are copied into the suite folder and it counts as done (``committed``; it has no
checkpoint or model, so a protocol that needs its model runs it: ``reuse=False``,
``fedshift bench --fresh``).

``bench.json`` in the suite folder lists every cell with what happened to it in this
invocation (``cached``, ``committed``, ``ran``, ``resumed``, ``failed`` with the reason,
``interrupted``, or ``pending`` when the suite stopped first); it is rewritten, atomically,
as each cell ends. A failing cell does not stop the others: the suite runs every cell, then
fails naming the failed
ones. SIGINT / SIGTERM stop the whole suite at once, each running cell saving its last whole
round first; running the suite again continues it.

Independent cells run in ``workers`` processes (default: one per two cores, at most the
number of pending cells). Every cell runs with ``torch`` limited to its ``run.threads``
threads (default 1, with any number of workers, in-process too; ``--threads`` sets it for
every cell): float reductions split over another number of threads differ in the last bits,
and those differences grow over training, so the thread count is part of a cell's result.
Every random stream is derived from the config's seed (:mod:`fedshift.core.seeding`), so a
suite's results do not depend on ``workers``; a ``run.threads`` other than 1 enters each
cell's digest (and so its directory), and is recorded in ``cell.json`` and ``summary.json``.
A cell's own ``run.workers`` (its clients in a pool of processes,
:mod:`fedshift.runtime.pool.transport`) changes no number and is not part of its digest. Workers
exit when the ``fedshift bench`` process dies, however it dies.

No oversubscription: the suite's workers x each cell's ``run.workers`` x ``run.threads``
stays within the usable cores. The default ``workers`` shrinks to fit; a cell's
``run.workers: auto`` takes what the suite's workers leave; an explicit ``--workers`` that
does not fit with cells of ``run.workers`` > 1 is refused (``oversubscribe=True`` /
``--oversubscribe`` runs it anyway).

Progress: every running cell reports its rounds (from worker processes too,
:mod:`fedshift.runtime.parallel`), shown with its ETA and the suite's
(:mod:`fedshift.runtime.progress`): bars on a terminal, a status line a minute otherwise.

One suite folder belongs to one ``fedshift bench`` at a time (``bench.lock``), and each cell's
directory to the process running it (``run.lock``, :mod:`fedshift.runtime.rundir.ownership`): a
second invocation is refused with the name of the one running.
"""

from __future__ import annotations

import json
import logging
import signal
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedshift.catalog import resolve
from fedshift.core.config import RunConfig, load_config
from fedshift.core.config_tree import expand_sweep, lookup
from fedshift.core.errors import FedshiftError
from fedshift.core.files import check_folder
from fedshift.core.identity import number_digest
from fedshift.eval.cells import CELL_FILE, foreign_cell
from fedshift.runtime.cores import share_cores
from fedshift.runtime.parallel import RoundReport, Stopped, report, run_grid
from fedshift.runtime.progress import EVERY_S
from fedshift.runtime.rundir.ownership import (
    NotClearable,
    check_clearable,
    clear_run_dir,
    hold_lock,
    hold_run,
    is_empty,
)
from fedshift.runtime.rundir.results import run_dir_base
from fedshift.runtime.stopping import RunSignal

log = logging.getLogger("fedshift.bench")

MANIFEST = "bench.json"
#: held by ``fedshift bench`` in the suite folder for the whole invocation
SUITE_LOCK = "bench.lock"


@dataclass
class Cell:
    """One run of a suite: its resolved config, label and directory."""

    cfg: RunConfig
    label: str
    run_dir: Path
    digest: str


def config_digest(cfg: RunConfig, threads: int | None = None) -> str:
    """A digest of everything that changes a run's numbers (not its name or output folder,
    not how many processes run its clients): the resolved config and, when not 1, the torch
    thread count (``threads``, default: the config's ``run.threads``; 1 adds nothing, so
    digests of suites cached before threads counted stay valid)."""
    return number_digest(cfg.to_dict(), threads)


def _fmt(v: Any) -> str:
    if isinstance(v, list):  # an augment list: each with its parameters, e.g. ffa(p=0.1)
        return "+".join(_fmt(x) for x in v) if v else "-"
    if isinstance(v, dict):
        rest = ",".join(f"{k}={x}" for k, x in v.items() if k != "name")
        return f"{v.get('name', '?')}({rest})" if rest else str(v.get("name", v))
    return str(v)


def _grid_keys(grid: dict) -> list[str]:
    out: list[str] = []
    for k, values in grid.items():
        if k == "cell":
            out += [dk for v in values if isinstance(v, dict) for dk in v]
        else:
            out.append(k)
    return out


def _check_threads(threads: int | None) -> int | None:
    if threads is None:
        return None
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise FedshiftError(f"--threads must be a whole number of at least 1, got {threads!r}")
    return threads


def plan(
    suite: str | Path,
    overrides: list[str] | None = None,
    out: str | None = None,
    threads: int | None = None,
) -> list[Cell]:
    """Expand and validate a suite into cells (nothing runs); ``threads``: every cell's
    ``run.threads`` (an override before the others; default: each cell's own, 1 unless
    set), since a count other than 1 is part of each cell's digest."""
    threads = _check_threads(threads)
    source = str(suite)
    first = [] if threads is None else [f"run.threads={threads}"]
    raw = load_config(suite, [*first, *(overrides or [])])
    grid = raw.get("sweep") or {}
    raws = expand_sweep(raw, source)
    cells = []
    for one in raws:
        cfg = resolve(one, source)
        if out:
            cfg.out = out
        digest = config_digest(cfg)
        skip = ("seed", "algorithm.name", "algorithm")
        # a ``cell`` grid key stands for the dotted keys its mappings set
        keys = list(dict.fromkeys(_grid_keys(grid)))
        # a key that this cell of a ``cell`` list does not set keeps the suite's value
        extra = [
            f"{k}={_fmt(lookup(one, k))}"
            for k in keys
            if k not in skip and lookup(one, k) is not None
        ]
        head = _fmt(one["algorithm"]) if "algorithm" in keys else cfg.algorithm.name
        label = " ".join([head, *extra])
        base = f"{run_dir_base(cfg)}-{digest}"
        cells.append(Cell(cfg, label, Path(cfg.out) / cfg.name / base, digest))
    seen: dict[str, str] = {}
    for c in cells:
        if c.digest in seen:
            raise FedshiftError(
                f"{source}: cells '{seen[c.digest]}' and '{c.label}' have the same config; "
                "remove the duplicate from the sweep"
            )
        seen[c.digest] = c.label
    return cells


def _read_json(path: Path) -> dict | None:
    """``path``'s JSON object, or None when it is missing, empty, cut short or not an object
    (a file left by a disk that filled up, or by a crash of an older fedshift)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _checked_summary(path: Path) -> tuple[dict | None, str | None]:
    """A cell's ``summary.json`` if readable and as fedshift writes it (fields, types, scores
    in range: :func:`~fedshift.eval.summary.check_summary`), else None and why."""
    from fedshift.eval.summary import check_summary

    s = _read_json(path)
    if s is None:
        return None, f"{path} is missing or unreadable"
    try:
        return check_summary(s, path), None
    except FedshiftError as e:
        return None, str(e).split("; it was not written")[0]


def cell_problem(folder: Path, digest: str) -> str | None:
    """What makes the finished cell ``folder`` (``cell.json``, ``config.yaml``,
    ``summary.json``) not the cell of ``digest``, or None: the files must be of that config
    (:func:`foreign_cell`) and its summary as fedshift writes it (scores in range)."""
    return foreign_cell(folder, digest) or _checked_summary(folder / "summary.json")[1]


def results_root(results: str | Path | None = None) -> Path | None:
    """Where committed results are looked up: ``results``, else ``$FEDSHIFT_RESULTS``, else
    ``./results`` when that folder exists (a checkout of the repository); None: nowhere."""
    import os

    if results is not None:
        return Path(results)
    env = os.environ.get("FEDSHIFT_RESULTS")
    if env:
        return Path(env)
    here = Path("results")
    return here if here.is_dir() else None


def committed_cell(cell: Cell, root: Path | None) -> Path | None:
    """The committed copy of ``cell`` under ``root`` (same suite, directory and digest, a
    readable summary), or None."""
    if root is None:
        return None
    src = root / cell.cfg.name / cell.run_dir.name
    meta = _read_json(src / CELL_FILE)
    if meta is None or meta.get("digest") != cell.digest:
        return None
    problem = cell_problem(src, cell.digest)  # the digest recomputed from its config.yaml
    if problem is not None:
        log.warning("committed cell not taken, it runs instead: %s", problem)
        return None
    return src


def take_committed(cell: Cell, src: Path) -> None:
    """Copy a committed cell's files into its run directory, marked as taken from
    ``results/`` (it has no checkpoint: :func:`fedshift.protocols.common.load_run` says so)."""
    from fedshift.core.files import copy_regular, ensure_dir, write_text_atomic

    ensure_dir(cell.run_dir)
    for f in ("config.yaml", "metrics.jsonl"):
        if (src / f).is_file():  # a link or special file in results/ is refused, not copied
            copy_regular(src / f, cell.run_dir / f)
    summary = _read_json(src / "summary.json") or {}
    summary["run_dir"] = str(cell.run_dir)  # where it lies now (reports, protocols)
    write_text_atomic(cell.run_dir / "summary.json", json.dumps(summary, indent=2) + "\n")
    meta = _read_json(src / CELL_FILE) or {}
    meta["committed"] = str(src)
    write_text_atomic(cell.run_dir / CELL_FILE, json.dumps(meta) + "\n")


def cell_status(cell: Cell, quiet: bool = False) -> str:
    """``done`` (a readable summary, this digest, recomputed from its ``config.yaml``:
    :func:`cell_problem`), ``partial`` (a checkpoint to resume; also when the summary is
    unreadable) or ``new`` (also a cell whose files give another digest: run again, said in
    a warning unless ``quiet``)."""
    meta = _read_json(cell.run_dir / CELL_FILE)
    if meta is None or meta.get("digest") != cell.digest:
        return "new"
    if (cell.run_dir / "summary.json").is_file():
        foreign = foreign_cell(cell.run_dir, cell.digest)
        problem = foreign or _checked_summary(cell.run_dir / "summary.json")[1]
        if problem is None:
            return "done"
        if not quiet:
            log.warning("cell %s runs again: %s", cell.run_dir.name, problem)
        if foreign is not None:  # another config's files: its checkpoint is not this cell's
            return "new"
    if (cell.run_dir / "checkpoint.pt").is_file():
        return "partial"
    return "new"


def _run_cell(
    cfg_dict: dict,
    run_dir: str,
    digest: str,
    label: str,
    workers: int,
    after: Callable[[str], Any] | None = None,
) -> str:
    """Run or resume one cell (in a worker process, or in-process with one worker), its
    clients in ``workers`` processes; returns ``ran`` or ``resumed``. The cell's directory
    is locked before it is read. ``after(run_dir)``: called once the cell's summary is
    written and its lock released, in the same process (``run_suite``'s ``after``)."""
    import torch

    from fedshift.runtime.rundir.results import write_text_atomic
    from fedshift.runtime.simulation import Simulation
    from fedshift.runtime.transports import make_transport

    threads = int(cfg_dict["run"]["threads"])
    torch.set_num_threads(threads)
    path = Path(run_dir)
    if path.exists() and not is_empty(path):  # before the lock file marks it as a run
        check_clearable(path, "bench")  # a link or a folder fedshift did not make: refused
    elif path.is_symlink():
        raise NotClearable(path, "a symbolic link", "bench")
    with hold_run(path):
        cfg = resolve(cfg_dict, source=f"{run_dir}/config.yaml")
        status = cell_status(Cell(cfg, label, path, digest), quiet=True)
        if status == "new":  # a stale cell (another digest): start clean; foreign: refused
            clear_run_dir(path, "bench")
        meta = {"digest": digest, "label": label, "threads": threads}
        write_text_atomic(path / CELL_FILE, json.dumps(meta) + "\n")
        report("start", run_dir, cfg.train.rounds)
        transport = make_transport(cfg, workers=workers)
        try:
            hooks = [RoundReport(path, cfg.train.rounds)]
            sim = Simulation(cfg, path, progress=False, transport=transport, hooks=hooks)
            result = sim.run(resume=status == "partial")
        finally:
            transport.close()
        summary = dict(result.summary)
        summary["label"] = label
        summary["threads"] = threads
        write_text_atomic(path / "summary.json", json.dumps(summary, indent=2) + "\n")
    if after is not None:
        after(run_dir)
    return "resumed" if status == "partial" else "ran"


# ---------------------------------------------------------------------- the suite
class SuiteStopped(RunSignal):  # noqa: N818 - a signal, like RunSignal
    """SIGINT / SIGTERM stopped a suite; every running cell saved its last whole round."""

    def __init__(self, signum: int, root: Path, suite: str | Path) -> None:
        self.signum = signum
        self.run_dir = root
        self.saved_round = None
        name = signal.Signals(signum).name
        BaseException.__init__(
            self,
            f"{name}: suite stopped, each running cell saved its last whole round "
            f"({root / MANIFEST} says what ran); continue with: fedshift bench {suite}",
        )


class _Manifest:
    """``bench.json``: one row per cell, rewritten atomically whenever a row changes."""

    def __init__(
        self, root: Path, cells: list[Cell], todo: list[Cell], committed: list[Cell]
    ) -> None:
        self.path = root / MANIFEST
        pending = {c.run_dir for c in todo}
        taken = {c.run_dir for c in committed}
        self.rows = {
            str(c.run_dir): {
                "label": c.label,
                "run_dir": str(c.run_dir),
                "digest": c.digest,
                "threads": c.cfg.run.threads,
                "status": "pending"
                if c.run_dir in pending
                else "committed"
                if c.run_dir in taken
                else "cached",
            }
            for c in cells
        }
        self.write()

    def set(self, cell: Cell, res: dict) -> None:
        row = self.rows[str(cell.run_dir)]
        row["status"] = res["status"]
        for key in ("reason", "traceback"):
            if key in res:
                row[key] = res[key]
        self.write()

    def write(self) -> None:
        from fedshift.runtime.rundir.results import write_text_atomic

        write_text_atomic(self.path, json.dumps(list(self.rows.values()), indent=2) + "\n")


def run_suite(
    suite: str | Path,
    overrides: list[str] | None = None,
    out: str | None = None,
    workers: int | None = None,
    progress: bool = True,
    threads: int | None = None,
    oversubscribe: bool = False,
    progress_every_s: float = EVERY_S,
    reuse: bool | Callable[[Cell, Path], bool] = True,
    results: str | Path | None = None,
    after: Callable[[str], Any] | None = None,
) -> list[dict]:
    """Run every cell of a suite that is not done yet; returns all cells' summaries (plan
    order). ``threads``: every cell's ``run.threads`` (default: its own, 1 unless set).
    ``oversubscribe``: run an explicit ``workers`` even where suite workers x cell workers x
    threads exceeds the cores (module docstring). ``progress``: rounds and ETAs of the
    running cells on stderr (:class:`~fedshift.runtime.progress.CellProgress`; a status
    line every ``progress_every_s`` seconds when stderr is not a terminal). ``reuse``: take
    cells committed under ``results`` (:func:`results_root`) instead of running them; a
    callable ``reuse(cell, committed_dir)`` takes only the committed cells it accepts (a
    protocol that needs more of a run than its numbers: ``new-site`` takes a cell whose
    adaptation is kept too). ``after(run_dir)``: called in the worker process right after
    each cell it trained (not for cells taken or done before; a picklable callable where
    ``workers`` > 1), e.g. to score the fresh model before a lost machine loses it. Cells
    that fail are recorded in ``bench.json`` and the others run; then a
    :class:`FedshiftError` names the failed ones. A signal stops the suite
    (:class:`SuiteStopped`)."""
    threads = _check_threads(threads)
    if workers is not None and workers < 1:
        raise FedshiftError(f"--workers must be at least 1, got {workers}")
    cells = plan(suite, overrides, out, threads)
    if not cells:
        return []
    root = Path(cells[0].cfg.out) / cells[0].cfg.name
    advice = (
        "One suite folder takes one `fedshift bench` at a time: wait for that one to finish, "
        "or stop it (Ctrl-C or kill: its running cells save their state) and run the suite "
        "again (finished cells are kept, stopped ones resume)"
    )
    with hold_lock(root / SUITE_LOCK, f"suite folder {root}", advice):
        check_folder(root, "a suite folder")  # a planted link (bench.json...): refused first
        todo = [c for c in cells if cell_status(c) != "done"]
        committed = _take_committed(todo, reuse, results) if reuse and todo else []
        todo = [c for c in todo if c not in committed]
        n_workers, cell_workers = share_cores(todo, workers, oversubscribe)
        manifest = _Manifest(root, cells, todo, committed)
        rows = [(str(c.run_dir), f"{c.label} s{c.cfg.seed}", c.cfg.train.rounds) for c in cells]
        by_key = {str(c.run_dir): c for c in todo}
        args = {k: (c.cfg.to_dict(), k, c.digest, c.label, cell_workers[k], after)
                for k, c in by_key.items()}  # fmt: skip
        title = f"suite {cells[0].cfg.name}"
        early = {str(c.run_dir) for c in cells if c.cfg.train.patience}  # ETAs: upper bounds
        try:
            failed = run_grid(title, rows, _run_cell, args, n_workers, progress, progress_every_s,
                              lambda key, res: manifest.set(by_key[key], res), early)  # fmt: skip
        except Stopped as stop:
            raise SuiteStopped(stop.signum, root, suite) from None
    errors = [f"{by_key[k].label} ({by_key[k].run_dir}): {why}" for k, why in failed.items()]
    if errors:
        raise FedshiftError(
            f"{len(errors)} of {len(cells)} cells failed (the other cells are kept; "
            f"{root / MANIFEST} lists every cell; fix the cause and run the suite again: "
            "only unfinished cells run):\n  " + "\n  ".join(errors)
        )
    return _summaries(cells)


def _take_committed(
    todo: list[Cell], reuse: bool | Callable[[Cell, Path], bool], results: str | Path | None
) -> list[Cell]:
    """Copy into their run folders the cells of ``todo`` committed under ``results`` that
    ``reuse`` accepts (:func:`run_suite`); returns them."""
    where = results_root(results)
    committed = []
    for c in todo:
        src = committed_cell(c, where)
        if src is not None and (reuse is True or reuse(c, src)):
            with hold_run(c.run_dir):
                clear_run_dir(c.run_dir)
                take_committed(c, src)
            committed.append(c)
    return committed


def _summaries(cells: list[Cell]) -> list[dict]:
    """Every cell's summary.json (plan order), labelled with its cell's label."""
    summaries = []
    for c in cells:
        s = _checked_summary(c.run_dir / "summary.json")[0]
        if s is None:
            raise FedshiftError(f"{c.run_dir / 'summary.json'} is unreadable; run the suite again")
        s["label"] = c.label
        summaries.append(s)
    return summaries
