"""What the protocols share: :class:`ProtocolResult`, the number formats of their tables,
the output folder and its ``<name>.md`` / ``<name>.json`` files, run labels, loading a
finished run (:func:`load_run`) and running a config's grid as a cached bench suite.

Every protocol writes a Markdown table (``<name>.md``), the numbers behind it
(``<name>.json``) and, where it draws one, a figure (``<name>.png``) into its output folder
(default ``./protocol-<name>``). Runs are rebuilt with
:func:`fedshift.runtime.simulation.load_finished` (by default at the round model selection
picked, ``selected.pt``; ``weights="last"``: the final round) or read from their
``metrics.jsonl`` / ``summary.json``; suites run through :func:`fedshift.bench.run_suite`, so
cells are cached by config digest and never run twice.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from fedshift.core.config_tree import lookup
from fedshift.core.errors import FedshiftError
from fedshift.core.files import write_text_atomic
from fedshift.eval.order import natural_key
from fedshift.eval.tables import (
    flow_label,
    group_flows,
    mean_std_cell,
    short_value,
)

#: ``cross-site --pipeline``: whose input-pipeline state the data goes through
PIPELINES = ("data", "model")
#: the splits a protocol can evaluate on
SPLITS = ("train", "val", "test")
#: the model kinds a run evaluates
KINDS = ("personal", "global")
#: ``cross-site --kind``: the evaluated kinds plus ``local`` (FedRDN's Table 3)
CROSS_SITE_KINDS = (*KINDS, "local")
DASH = "—"
MISSING = object()


@dataclass
class ProtocolResult:
    """What a protocol produced: the printed text (caption, table, notes), the numbers and
    the files written (``md``, ``json``, ``png``, ``suite``)."""

    name: str
    text: str
    data: dict[str, Any]
    files: dict[str, Path] = field(default_factory=dict)


def percent(x: float | None) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return DASH
    return f"{100 * x:.2f}"


def mean_std_text(values: list[float]) -> str:
    """``mean ± std`` in % (``± n/a`` for one seed: :func:`fedshift.eval.tables.mean_std_cell`);
    a dash for none or NaN."""
    if not values or any(isinstance(v, float) and math.isnan(v) for v in values):
        return DASH
    return mean_std_cell(values)


def _jsonable(x: Any) -> Any:
    """NaN -> null, paths -> strings, tuples -> lists, recursively (strict JSON)."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_jsonable(v) for v in x]
    if isinstance(x, Path):
        return str(x)
    return x


def output_dir(out: str | Path | None, name: str) -> Path:
    path = Path(out) if out is not None else Path(f"protocol-{name}")
    if path.exists() and not path.is_dir():
        raise FedshiftError(f"--out {path} exists and is not a folder; choose another path")
    path.mkdir(parents=True, exist_ok=True)
    return path


def output_provenance() -> dict[str, Any]:
    """What made a protocol's output, as a run's ``summary.json`` records it: the git state
    of the fedshift source (commit, dirty; None outside a git checkout), the command line
    and the machine (no host or time: the same command on the same checkout writes the same
    bytes). ``fedshift claims collect --protocol`` reads it into the results folder's
    ``source.json``."""
    import sys

    import fedshift
    from fedshift.core.machine import machine
    from fedshift.runtime.tracking.trackers import git_state

    return {
        "git": git_state(Path(fedshift.__file__).parent),
        "command": list(sys.argv),
        "machine": machine(),
    }


def save_outputs(out: Path, name: str, title: str, text: str, data: dict) -> dict[str, Path]:
    """``<name>.md`` (the title and ``text``) and ``<name>.json`` (``data`` with the
    output's ``provenance``: :func:`output_provenance`) in ``out``."""
    md, js = out / f"{name}.md", out / f"{name}.json"
    write_text_atomic(md, f"# {title}\n\n{text}\n")
    payload = {**_jsonable(data), "provenance": output_provenance()}
    write_text_atomic(js, json.dumps(payload, indent=2) + "\n")
    return {"md": md, "json": js}


def lookup_or_missing(tree: dict, dotted: str) -> Any:
    return lookup(tree, dotted, MISSING)


def run_meta(sim) -> dict[str, Any]:
    """The summary-like fields :func:`flow_label` reads, from a rebuilt run."""
    return {
        "algorithm": sim.cfg.algorithm.name,
        "algorithm_config": sim.cfg.algorithm.to_dict(),
        "augment": [a.to_dict() for a in sim.cfg.augment],
        "implied": list(sim.implied),
    }


def run_label(meta: dict) -> str:
    """``fedavg``, ``fedavg +fedrdn``... (the algorithm and its flow when not ``base``)."""
    flow = flow_label(meta)
    return meta["algorithm"] + ("" if flow == "base" else f" {flow}")


def load_run(run_dir: str | Path, weights: str = "selected"):
    """A finished run rebuilt from its config and saved state (``load_finished``) at the
    round ``weights`` names: ``selected`` (the round model selection picked on validation,
    whose scores the run's tables report; default) or ``last``. Checks first that the folder
    holds a finished run (``config.yaml``, ``checkpoint.pt`` and the final ``summary.json``)."""
    from fedshift.runtime.rundir.checkpoint_io import CHECKPOINT
    from fedshift.runtime.simulation import load_finished

    path = Path(run_dir)
    if not path.is_dir():
        raise FedshiftError(f"{path} does not exist or is not a folder; give a run directory")
    missing = [f for f in ("config.yaml", CHECKPOINT, "summary.json") if not (path / f).is_file()]
    taken = _committed_from(path)
    if missing and taken:
        raise FedshiftError(
            f"{path} was taken from the committed results ({taken}): it holds the run's "
            "numbers but not its model; run its suite again with `fedshift bench SUITE "
            "--fresh` (or protocol ... --fresh) to train it here"
        )
    if missing:
        hint = (
            "the run did not finish; continue it with 'fedshift run --resume " + str(path) + "'"
            if missing == ["summary.json"]
            else "give the folder of one run (it holds config.yaml, checkpoint.pt, summary.json)"
        )
        raise FedshiftError(
            f"{path} is not a finished fedshift run (no {', '.join(missing)}): {hint}"
        )
    return load_finished(path, weights=weights)


def _committed_from(path: Path) -> str | None:
    """The results/ folder a bench cell was copied from (``cell.json``), or None."""
    try:
        meta = json.loads((path / "cell.json").read_text())
    except (OSError, ValueError):
        return None
    return meta.get("committed") if isinstance(meta, dict) else None


def setting_keys(raw: dict, exclude: Iterable[str] = ()) -> list[str]:
    """The config's own sweep keys that the (algorithm, flow) label does not already say and
    that seeds do not average over: they become a ``setting`` column. A ``cell`` list counts
    as the dotted keys its mappings set (never the word "cell")."""
    skip = set(exclude)
    keys: list[str] = []
    for k, v in (raw.get("sweep") or {}).items():
        # a ``cell`` list sets several dotted keys together: its keys, not the word "cell"
        cells = v if k == "cell" and isinstance(v, list) else [{k: None}]
        for dk in (dk for c in cells if isinstance(c, dict) for dk in c):
            if dk not in keys:  # each key once, however many cells set it
                keys.append(dk)
    return [
        k
        for k in keys
        if k != "seed"
        and k not in skip
        and not k.startswith("algorithm")
        and not k.startswith("augment")
    ]


def label_rows(summaries: list[dict], columns: Iterable[str] = ()) -> None:
    """Group the runs of a protocol's table into rows (:func:`~fedshift.eval.tables.
    group_flows`, as every table of fedshift): the keys of the ``setting`` column
    (:func:`with_settings`) and the table's own ``columns`` are left out of the flow labels;
    any other key in which the runs differ makes rows of its own."""
    shown = tuple(summaries[0].get("_shown", ())) if summaries else ()
    group_flows(summaries, shown=(*shown, *columns))


def site_columns(summaries: list[dict]) -> list[str]:
    """The keys a leave-one-out protocol sets per held-out site, which its tables show as
    columns, never as rows: ``federation.holdout`` and, over a dealt federation, the
    ``partition.keep`` that keeps the held-out domain whole (:func:`~fedshift.protocols.loco.
    loco_grid` sets the two together; a ``keep`` of the user's own stays a row key)."""
    keep = [lookup_or_missing(s.get("_cfg", {}), "partition.keep") for s in summaries]
    held = [s.get("holdout") or lookup_or_missing(s.get("_cfg", {}), "federation.holdout")
            for s in summaries]  # fmt: skip
    dealt = any(k not in (MISSING, None) for k in keep) and all(
        k in (MISSING, None) or list(k) == list(h) for k, h in zip(keep, held, strict=True)
    )
    return ["federation.holdout", *(["partition.keep"] if dealt else [])]


def place(groups: dict, s: dict, site: str, seed: int, item: Any, protocol: str) -> None:
    """Put ``item`` (run ``s``'s result) at ``groups[row_key(s)][site][seed]``; two configs
    that read as one row would otherwise hide one another: a :class:`FedshiftError`."""
    slot = groups[row_key(s)][site]
    if seed in slot:
        raise FedshiftError(
            f"{protocol}: two runs fall in one row ({row_key(s)}) for site {site}, seed "
            f"{seed}: {s.get('run_dir')}"
        )
    slot[seed] = item


def fedavg_at_several_settings(keys: Iterable[tuple[str, str, str]]) -> bool:
    """Whether FedAvg (base flow) has rows at several settings, so that each row is tested
    against FedAvg at its own (:func:`reference_row`)."""
    return sum(k[:2] == ("fedavg", "base") for k in keys) > 1


def row_key(s: dict) -> tuple[str, str, str]:
    """(algorithm, flow, setting) of a run, after :func:`label_rows`."""
    return (s["_flow"].algorithm, s["_flow"].label, s.get("_setting", ""))


def row_order(key: tuple[str, str, str]) -> tuple:
    """Rows by algorithm, its base flow first, then flows and settings with their numbers
    compared as numbers (``partition.clients=8`` before ``=20`` before ``=80``)."""
    algo, flow, setting = key
    return (algo, flow != "base", natural_key(flow), natural_key(setting))


def split_panels(
    keys: Iterable[tuple[str, str, str]],
) -> dict[tuple[str, str, str], tuple[str, tuple[str, str, str]]]:
    """Each row key's (panel, method): the panel is the row's ``key=value`` items for the
    keys that every row's setting gives and in which the rows differ (a swept number of
    clients), the method is the row without them (algorithm, flow, its other items: FedWon's
    ``model.norm=none ...``). Without such a key every row is in the one panel ``""``. The
    setting text is ``key=value`` items without spaces (:func:`with_settings`)."""
    keys = list(keys)
    items = {k: k[2].split() for k in keys}

    def name(item: str) -> str:
        return item.split("=", 1)[0]

    common = set.intersection(*({name(i) for i in v} for v in items.values())) if keys else set()
    values: dict[str, set[str]] = {}
    for its in items.values():
        for i in its:
            values.setdefault(name(i), set()).add(i)
    panel_keys = {n for n in common if len(values[n]) > 1}
    out = {}
    for k, its in items.items():
        panel = " ".join(i for i in its if name(i) in panel_keys)
        rest = " ".join(i for i in its if name(i) not in panel_keys)
        out[k] = (panel, (k[0], k[1], rest))
    return out


def reference_row(
    key: tuple[str, str, str], keys: Iterable[tuple[str, str, str]]
) -> tuple[str, str, str] | None:
    """The row a paired test of ``key`` compares against: FedAvg (base flow) at ``key``'s
    own setting (a suite that sweeps the number of clients compares like with like), else
    the first FedAvg row; None without one. A row whose cell sets keys of its own (FedWon's
    ``partition.clients=20 model.norm=none ...``) is at the setting of the FedAvg row whose
    ``key=value`` items are all among its own, the one with the most (the setting text is
    ``key=value`` items without spaces: :func:`with_settings`)."""
    fedavg = [k for k in keys if k[:2] == ("fedavg", "base")]
    mine = set(key[2].split())
    within = [k for k in fedavg if set(k[2].split()) <= mine]
    if within:
        return max(within, key=lambda k: len(k[2].split()))  # the first of the longest
    return fedavg[0] if fedavg else None


# ============================================================================ suites
def expand_configs(raw: dict, source: str) -> list:
    from fedshift.catalog import resolve
    from fedshift.core.config_tree import expand_sweep

    return [resolve(one, source) for one in expand_sweep(raw, source)]


@dataclass(frozen=True)
class SuiteOptions:
    """How a protocol that runs a config's grid as a bench suite (:func:`~fedshift.protocols.
    loco`, :func:`~fedshift.protocols.sweep`, :func:`~fedshift.protocols.head_finetune`)
    reads the config and runs the suite: one value instead of seven arguments.

    ``config``: a YAML file or a shipped config's name (None: the defaults), with the
    ``key=value`` ``overrides``; ``workers`` / ``threads``: as ``fedshift bench`` (None: its
    defaults); ``out``: the protocol's output folder (default ``./protocol-<name>``);
    ``runs_out``: where the suite's runs go (default: the config's ``out``); ``progress``:
    print the suite's progress; ``fresh``: run every cell, taking none from ``results/``
    (``fedshift bench --fresh``)."""

    config: str | Path | None = None
    overrides: tuple[str, ...] = ()
    workers: int | None = None
    threads: int | None = None
    out: str | Path | None = None
    runs_out: str | None = None
    progress: bool = True
    fresh: bool = False

    @property
    def source(self) -> str:
        """The config's name in messages."""
        return str(self.config) if self.config else "defaults"

    def load(self) -> dict:
        """The raw config, overrides applied."""
        from fedshift.core.config import load_config

        return load_config(self.config, list(self.overrides))

    def output_dir(self, name: str) -> Path:
        """The protocol's output folder (made if missing)."""
        return output_dir(self.out, name)

    def run_cells(
        self,
        raw: dict,
        suite_path: Path,
        reuse: bool | Callable[[Any, Path], bool] = True,
        after: Callable[[str], Any] | None = None,
    ) -> list[dict]:
        """Write the expanded suite ``raw`` to ``suite_path``, run it through bench (cached
        cells) and return the summaries, each with ``_cfg`` = its cell's resolved config dict.
        ``reuse``: take cells committed in ``results/`` (a protocol that loads the cells'
        models passes False, or a callable that accepts the committed cells it needs no
        model of); ``after``: bench's hook on each cell it trains
        (:func:`fedshift.bench.run_suite`)."""
        from fedshift.bench import plan, run_suite

        write_text_atomic(suite_path, yaml.safe_dump(raw, sort_keys=False))
        cells = plan(suite_path, None, self.runs_out, self.threads)
        summaries = run_suite(
            suite_path,
            None,
            out=self.runs_out,
            workers=self.workers,
            progress=self.progress,
            threads=self.threads,
            reuse=False if self.fresh else reuse,
            after=after,
        )
        for c, s in zip(cells, summaries, strict=True):
            if Path(s["run_dir"]) != c.run_dir:  # run_suite keeps plan order; never mix them
                raise FedshiftError(
                    f"suite cell {c.run_dir} returned the summary of {s['run_dir']}"
                )
            s["_cfg"] = c.cfg.to_dict()
        return summaries


def with_settings(summaries: list[dict], keys: list[str], raw: dict | None = None) -> None:
    """Each run's ``setting`` text: ``key=value`` for the ``keys`` (:func:`setting_keys`).
    A key that only a ``cell`` list of ``raw``'s sweep sets is shown for the runs of the cells
    that set it (``fedwon [model.norm=none model.conv=ws]`` beside a plain ``fedavg``, not
    every cell's keys at every run's defaults)."""
    cells = [c for c in ((raw or {}).get("sweep") or {}).get("cell") or [] if isinstance(c, dict)]
    only_cells = {k for c in cells for k in c} - {
        k for k in ((raw or {}).get("sweep") or {}) if k != "cell"
    }

    def of_cell(cfg: dict) -> set[str]:
        """The keys of the cell this run is: of the cells it matches, the one that sets the
        most keys ({fedavg} and {fedavg, model.norm: none} both match the second's run)."""
        hits = [c for c in cells if all(_same(lookup_or_missing(cfg, k), v) for k, v in c.items())]
        if not hits:
            return only_cells  # no cell matches (a config edited by hand): show them all
        return set(max(hits, key=len))

    for s in summaries:
        mine = of_cell(s["_cfg"]) if cells else set()
        shown = (
            f"{k}={short_value(lookup_or_missing(s['_cfg'], k))}"
            for k in keys
            if k not in only_cells or k in mine
        )
        s["_setting"] = " ".join(shown)
        s["_shown"] = tuple(keys)


def _same(got: Any, want: Any) -> bool:
    """A resolved config value against a cell's YAML value (lists and tuples alike, 1 and
    1.0 alike; a mapping matches when every key the cell gives has its value there, the
    rest being the resolved defaults: ``augment: [{name: cfsi, alpha: 0.02}]``)."""
    numbers = (int, float)
    if isinstance(got, numbers) and isinstance(want, numbers) and not isinstance(got, bool):
        return float(got) == float(want)
    if isinstance(got, dict) and isinstance(want, dict):
        return all(k in got and _same(got[k], v) for k, v in want.items())
    if isinstance(got, list | tuple) and isinstance(want, list | tuple):
        return len(got) == len(want) and all(_same(g, w) for g, w in zip(got, want, strict=True))
    return json.dumps(got, default=str) == json.dumps(want, default=str)
