"""Rounds to reach accuracy thresholds as the number of clients grows, DisTrans's Table 5
(``fedshift protocol rounds RUN_ROOT... --thresholds``): the first evaluated round at which
the mean score over clients reaches each threshold, read from the runs' ``metrics.jsonl``.
"""

from __future__ import annotations

import json
import math
import statistics
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

from tqdm.auto import tqdm

from fedshift.core.errors import FedshiftError
from fedshift.eval.summary import read_metric_rows, read_summary
from fedshift.eval.tables import grid, group_flows
from fedshift.protocols.common import (
    DASH,
    MISSING,
    ProtocolResult,
    lookup_or_missing,
    output_dir,
    save_outputs,
)


def parse_thresholds(text: str | Iterable[float]) -> list[float]:
    """``"0.6,0.7,0.8"`` -> ``[0.6, 0.7, 0.8]``: fractions in (0, 1], each once."""
    items = [t.strip() for t in text.split(",")] if isinstance(text, str) else list(text)
    out = []
    for t in items:
        try:
            v = float(t)
        except (TypeError, ValueError):
            raise FedshiftError(
                f"--thresholds: {t!r} is not a number; give fractions such as 0.6,0.7,0.8"
            ) from None
        if not 0 < v <= 1 or math.isnan(v):
            raise FedshiftError(
                f"--thresholds: {t} is outside (0, 1]; thresholds are fractions of the metric "
                "(0.8 = 80 %)"
            )
        if v in out:
            raise FedshiftError(f"--thresholds: {t} is listed twice")
        out.append(v)
    if not out:
        raise FedshiftError("--thresholds: give at least one threshold, e.g. 0.6,0.7,0.8")
    return out


def _find_runs(roots: Iterable[str | Path]) -> list[Path]:
    found: list[Path] = []
    roots = list(roots)
    if not roots:
        raise FedshiftError("rounds: give at least one run directory or folder of runs")
    for root in roots:
        root = Path(root)
        if not root.exists():
            raise FedshiftError(f"{root} does not exist")
        found += sorted(p.parent for p in root.rglob("summary.json"))
    if not found:
        raise FedshiftError(f"no finished runs (summary.json) below {', '.join(map(str, roots))}")
    return list(dict.fromkeys(found))


def first_round_reaching(curve: dict[int, float], threshold: float) -> int | None:
    """The first evaluated round whose value reaches ``threshold`` (None if none does)."""
    for rnd in sorted(curve):
        if curve[rnd] >= threshold:
            return rnd
    return None


def mean_curve(rows: list[dict], kind: str, key: str) -> dict[int, float]:
    """Round -> mean over the (non-held-out) clients of ``row[kind][key]``."""
    by_round: dict[int, list[float]] = defaultdict(list)
    for r in rows:
        if kind in r and not r.get("holdout"):
            by_round[int(r["round"])].append(r[kind][key])
    return {rnd: statistics.fmean(v) for rnd, v in sorted(by_round.items())}


def rounds_to_threshold(
    roots: Iterable[str | Path],
    thresholds: str | Iterable[float],
    split: str = "test",
    by: str = "partition.clients",
    out: str | Path | None = None,
    progress: bool = True,
) -> ProtocolResult:
    """Rounds needed to reach accuracy thresholds (DisTrans's Table 5).

    For every finished run below ``roots`` (a folder with ``summary.json``, ``config.yaml``
    and ``metrics.jsonl``): the mean over clients (held-out clients excluded) of the ``split``
    primary metric of the evaluated model kind at each evaluated round, and the first round
    at which it reaches each threshold. Rows: (algorithm, flow, value of ``by`` in the run's
    ``config.yaml``; for the default ``partition.clients`` a dataset's own clients are
    counted when the partition has no such key); cells: mean over the seeds that reached the
    threshold, with how many of the seeds did (``—`` if none)."""
    if split not in ("val", "test"):
        raise FedshiftError(f"--split {split!r}: choose val or test")
    ths = parse_thresholds(thresholds)
    runs = _find_runs(roots)
    per_run, summaries = [], []
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for d in tqdm(runs, desc="rounds", disable=not progress, leave=False):
        s, rec = _read_run(d, by, split, ths)
        summaries.append(s)
        per_run.append(rec)
    # rows: the runs of one config over seeds, the --by key apart (its own column; for a
    # partition key the whole partition, which decides the clients the column counts)
    group_flows(summaries, shown=("partition",) if by.startswith("partition.") else (by,))
    for s, rec in zip(summaries, per_run, strict=True):
        rec["flow"] = s["_flow"].label
        groups[(s["algorithm"], rec["flow"], json.dumps(rec["by"], default=str))].append(rec)
    first = per_run[0]
    label = _metric_label(runs[0], first["metric"])
    header = ["algorithm", "flow", by, "seeds", *(f"≥ {100 * t:g}%" for t in ths)]
    table, rows_out = _threshold_rows(groups, ths)
    caption = f"Rounds to reach a mean {split} {label} (over clients) by {by}"
    note = (
        f"First evaluated round whose mean {split} {label} over clients (the evaluated model; "
        "held-out clients excluded) reaches the threshold; mean over the seeds that reached it "
        f"(reached/seeds); {DASH}: no seed reached it within its rounds."
    )
    text = f"{caption}:\n\n{grid(header, table)}\n\n_{note}_"
    data = {
        "protocol": "rounds",
        "split": split,
        "by": by,
        "thresholds": ths,
        "metric": first["metric"],
        "rows": rows_out,
        "runs": per_run,
    }
    outp = output_dir(out, "rounds")
    files = save_outputs(outp, "rounds", "Rounds to reach a threshold", text, data)
    return ProtocolResult("rounds", text, data, files)


def _read_run(d: Path, by: str, split: str, ths: list[float]) -> tuple[dict, dict]:
    """A finished run's summary (with ``_dir`` and ``_config``) and its record: the value of
    ``by``, the mean curve over clients and the first round reaching each threshold."""
    from fedshift.core.config import load_yaml

    for f in ("config.yaml", "metrics.jsonl"):
        if not (d / f).is_file():
            raise FedshiftError(f"{d} has a summary.json but no {f}: not a fedshift run")
    s = read_summary(d / "summary.json")
    cfg = load_yaml(d / "config.yaml")
    value = lookup_or_missing(cfg, by)
    if value is MISSING:
        if by != "partition.clients":
            raise FedshiftError(
                f"{d}/config.yaml has no key '{by}'; choose an existing --by key "
                "(e.g. partition.clients, train.local_epochs)"
            )
        value = len(s["clients"])  # the dataset's own clients (partition none)
    rows = metric_rows(d)
    kind, metric = s["evaluated_model"], s.get("metric", "acc")
    try:
        curve = mean_curve(rows, kind, f"{split}_{metric}")
    except KeyError as e:
        raise FedshiftError(f"{d}/metrics.jsonl: a {kind} row lacks {e}") from None
    if not curve:
        raise FedshiftError(f"{d}/metrics.jsonl has no evaluated rounds of the {kind} model")
    s["_dir"], s["_config"] = str(d), cfg
    rec = {
        "run_dir": str(d),
        "algorithm": s["algorithm"],
        "by": value,
        "seed": s["seed"],
        "kind": kind,
        "metric": metric,
        "curve": curve,
        "first_round": {t: first_round_reaching(curve, t) for t in ths},
    }
    return s, rec


def metric_rows(d: Path) -> list[dict]:
    """The rows of a run's ``metrics.jsonl``, each checked (scores finite and in range:
    :func:`~fedshift.eval.summary.read_metric_rows`)."""
    return read_metric_rows(d / "metrics.jsonl")


def _group_order(k: tuple) -> tuple:
    """Rows by algorithm, base flow first, then by the ``--by`` value (numbers in order)."""
    v = json.loads(k[2])
    num = isinstance(v, int | float) and not isinstance(v, bool)
    return (k[0], k[1] != "base", k[1], not num, v if num else 0, str(v))


def _threshold_rows(
    groups: dict[tuple, list[dict]], ths: list[float]
) -> tuple[list[list[str]], list[dict]]:
    """The table's rows and their numbers: per threshold, the mean first round over the
    seeds that reached it and how many did."""
    table, rows_out = [], []
    for k in sorted(groups, key=_group_order):
        recs = groups[k]
        cells, cols = [], {}
        for t in ths:
            got = [r["first_round"][t] for r in recs if r["first_round"][t] is not None]
            m = statistics.fmean(got) if got else None
            cols[str(t)] = {"mean": m, "reached": len(got), "of": len(recs), "rounds": got}
            txt = DASH if m is None else (f"{m:.0f}" if float(m).is_integer() else f"{m:.1f}")
            cells.append(f"{txt} ({len(got)}/{len(recs)})")
        table.append([k[0], k[1], str(json.loads(k[2])), str(len(recs)), *cells])
        rows_out.append(
            {
                "algorithm": k[0],
                "flow": k[1],
                "by": json.loads(k[2]),
                "seeds": sorted(r["seed"] for r in recs),
                "thresholds": cols,
            }
        )
    return table, rows_out


def _metric_label(run_dir: Path, metric: str) -> str:
    s = read_summary(run_dir / "summary.json")
    return s.get("metric_labels", {}).get(metric, "accuracy" if metric == "acc" else metric)
