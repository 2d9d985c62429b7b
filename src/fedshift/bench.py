"""Experiment suites: a grid of runs with cached cells, parallel workers and one progress bar.

A suite file is an ordinary run config whose ``sweep`` grid spans any config keys (dataset,
partition, algorithm, augment, seed, ...). ``fedshift bench SUITE.yaml`` expands the grid,
validates every cell before running any, and gives each cell a stable directory
``<out>/<name>/<algorithm>-<dataset>-seed<k>-<hash>`` where ``hash`` is a digest of the
cell's resolved config. A cell whose directory holds a ``summary.json`` with the same digest is
done and is never run again; a cell killed midway continues from its last checkpoint
(``checkpoint.every``); anything else starts afresh. ``bench.json`` in the suite folder lists
every cell with what happened to it in this invocation (``ran``, ``resumed``, ``cached``).

Independent cells run in ``workers`` processes (default: one per two cores, at most the
number of pending cells), each with ``torch`` limited to ``cores // workers`` threads, so
results do not depend on how many workers ran them (every random stream is derived from the
config's seed; see :mod:`fedshift.core.seeding`).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from fedshift.catalog import resolve
from fedshift.core.config import RunConfig, expand_sweep, load_config, lookup
from fedshift.core.errors import FedshiftError

CELL_FILE = "cell.json"
MANIFEST = "bench.json"


@dataclass
class Cell:
    """One run of a suite: its resolved config, label and directory."""

    cfg: RunConfig
    label: str
    run_dir: Path
    digest: str


def config_digest(cfg: RunConfig) -> str:
    """A digest of everything that changes a run's numbers (not its name or output folder)."""
    d = cfg.to_dict()
    for k in ("name", "out", "sweep"):
        d.pop(k, None)
    # when a run saves its state does not change its results (the empty section keeps the
    # digests of suites cached before checkpoint.minutes existed)
    d["checkpoint"] = {}
    blob = json.dumps(d, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:10]


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


def plan(
    suite: str | Path, overrides: list[str] | None = None, out: str | None = None
) -> list[Cell]:
    """Expand and validate a suite into cells (nothing runs)."""
    source = str(suite)
    raw = load_config(suite, overrides)
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
        extra = [f"{k}={_fmt(lookup(one, k))}" for k in keys if k not in skip]
        head = _fmt(one["algorithm"]) if "algorithm" in keys else cfg.algorithm["name"]
        label = " ".join([head, *extra])
        base = f"{cfg.algorithm['name']}-{cfg.dataset['name']}-seed{cfg.seed}-{digest}"
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


def cell_status(cell: Cell) -> str:
    """``done`` (summary with this digest), ``partial`` (checkpoint to resume) or ``new``."""
    meta = cell.run_dir / CELL_FILE
    if not meta.is_file():
        return "new"
    try:
        digest = json.loads(meta.read_text()).get("digest")
    except json.JSONDecodeError:
        return "new"
    if digest != cell.digest:
        return "new"
    if (cell.run_dir / "summary.json").is_file():
        return "done"
    if (cell.run_dir / "checkpoint.pt").is_file():
        return "partial"
    return "new"


def _run_cell(cfg_dict: dict, run_dir: str, digest: str, label: str, threads: int) -> dict:
    """Worker entry point (a separate process): run or resume one cell."""
    import torch

    from fedshift.runtime.simulation import Simulation

    torch.set_num_threads(max(1, threads))
    cfg = resolve(cfg_dict, source=f"{run_dir}/config.yaml")
    path = Path(run_dir)
    status = cell_status(Cell(cfg, label, path, digest))
    if status == "new" and path.exists():
        shutil.rmtree(path)  # a stale or foreign directory: start clean
    path.mkdir(parents=True, exist_ok=True)
    (path / CELL_FILE).write_text(json.dumps({"digest": digest, "label": label}) + "\n")
    result = Simulation(cfg, path, progress=False).run(resume=status == "partial")
    summary = dict(result.summary)
    summary["label"] = label
    (path / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return {"status": "resumed" if status == "partial" else "ran", "summary": summary}


def default_workers(pending: int) -> int:
    cores = os.cpu_count() or 1
    return max(1, min(pending, cores // 2 or 1))


def run_suite(
    suite: str | Path,
    overrides: list[str] | None = None,
    out: str | None = None,
    workers: int | None = None,
    progress: bool = True,
    threads: int | None = None,
) -> list[dict]:
    """Run every cell of a suite that is not done yet; returns all cells' summaries.
    ``threads``: torch threads per worker (default ``cores // workers``)."""
    cells = plan(suite, overrides, out)
    todo = [c for c in cells if cell_status(c) != "done"]
    n_workers = workers or default_workers(len(todo))
    threads = threads or max(1, (os.cpu_count() or 1) // n_workers)
    events: dict[str, str] = {str(c.run_dir): "cached" for c in cells if c not in todo}
    bar = tqdm(
        total=len(cells),
        initial=len(cells) - len(todo),
        desc=f"suite {cells[0].cfg.name}" if cells else "suite",
        disable=not progress,
        dynamic_ncols=True,
    )
    errors: list[str] = []
    args = [(c.cfg.to_dict(), str(c.run_dir), c.digest, c.label, threads) for c in todo]
    if n_workers == 1:
        import torch

        before = torch.get_num_threads()  # the cells run here: leave the caller's setting
        try:
            for c, a in zip(todo, args, strict=True):
                res = _run_cell(*a)
                events[str(c.run_dir)] = res["status"]
                bar.update(1)
                bar.set_postfix_str(c.label[:40])
        finally:
            torch.set_num_threads(before)
    elif todo:
        import multiprocessing as mp

        with ProcessPoolExecutor(n_workers, mp_context=mp.get_context("spawn")) as pool:
            futs = {pool.submit(_run_cell, *a): c for c, a in zip(todo, args, strict=True)}
            for fut in as_completed(futs):
                c = futs[fut]
                try:
                    events[str(c.run_dir)] = fut.result()["status"]
                except Exception as e:  # noqa: BLE001 - report every failed cell at the end
                    events[str(c.run_dir)] = "failed"
                    errors.append(f"{c.label} ({c.run_dir}): {e}")
                bar.update(1)
                bar.set_postfix_str(c.label[:40])
    bar.close()
    manifest = [
        {
            "label": c.label,
            "run_dir": str(c.run_dir),
            "digest": c.digest,
            "status": events.get(str(c.run_dir), "?"),
        }
        for c in cells
    ]
    if cells:
        root = Path(cells[0].cfg.out) / cells[0].cfg.name
        root.mkdir(parents=True, exist_ok=True)
        (root / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    if errors:
        raise FedshiftError("cells failed (the others are kept):\n  " + "\n  ".join(errors))
    summaries = []
    for c in cells:
        s = json.loads((c.run_dir / "summary.json").read_text())
        s["label"] = c.label
        summaries.append(s)
    return summaries
