"""Plain-text result tables (per-client test accuracy, mean, and mean ± std over seeds)."""

from __future__ import annotations

import statistics
from collections import defaultdict


def _fmt(x: float) -> str:
    return f"{100 * x:.2f}"


def _grid(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]

    def line(cells: list[str]) -> str:
        padded = (c.ljust(w) for c, w in zip(cells, widths, strict=True))
        return "| " + " | ".join(padded) + " |"

    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(header), sep, *(line(r) for r in rows)])


def runs_table(summaries: list[dict]) -> str:
    """One row per run: per-client test accuracy (%) at the selected round, and the mean."""
    clients = summaries[0]["clients"]
    header = ["algorithm", "seed", "model", *clients, "mean", "best rnd", "MB up+down"]
    rows = []
    for s in summaries:
        mb = (s["bytes_up"] + s["bytes_down"]) / 1e6
        rows.append(
            [
                s["algorithm"],
                str(s["seed"]),
                s["evaluated_model"],
                *(_fmt(s["test_per_client"][c]) for c in clients),
                _fmt(s["test_mean"]),
                str(s["best_round"]),
                f"{mb:.1f}",
            ]
        )
    return _grid(header, rows)


def group_key(s: dict) -> str:
    return s.get("label") or s["algorithm"]


def seeds_table(summaries: list[dict]) -> str | None:
    """Mean ± std over seeds per algorithm (per client and mean), when any has >1 seed."""
    groups: dict[str, list[dict]] = defaultdict(list)
    for s in summaries:
        groups[group_key(s)].append(s)
    if all(len(g) < 2 for g in groups.values()):
        return None
    clients = summaries[0]["clients"]
    header = ["algorithm", "seeds", *clients, "mean ± std"]
    rows = []
    for name, g in groups.items():
        cells = []
        for c in clients:
            cells.append(_fmt(statistics.mean(s["test_per_client"][c] for s in g)))
        means = [s["test_mean"] for s in g]
        sd = statistics.stdev(means) if len(means) > 1 else 0.0
        rows.append([name, str(len(g)), *cells, f"{_fmt(statistics.mean(means))} ± {_fmt(sd)}"])
    return _grid(header, rows)
