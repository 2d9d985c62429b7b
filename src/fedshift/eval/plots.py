"""Convergence plots (PNG, matplotlib's Agg backend: no display needed).

Every run draws one at its end, so the figure is built without pyplot's global state (a
``Figure`` of its own, safe in threads) and with fixed margins: ``tight_layout`` measured every
tick label again and was about half of a short run's plotting time."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING

from fedshift.core.files import atomic_output
from fedshift.core.rows import MetricRow, ModelScores, scores_of

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def plot_convergence(
    records: list[MetricRow],
    kinds: list[str],
    out: Path,
    title: str,
    metric: str = "acc",
    label: str = "accuracy",
) -> Path:
    """Left: mean val/test ``metric`` (called ``label``) per round for each model kind.
    Right: per-client test ``metric`` of the primary kind."""
    # imported here: pool workers and Flower clients import the run's modules but never plot
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 4))
    ax1, ax2 = fig.subplots(1, 2)
    for kind in kinds:
        rounds: dict[int, list[ModelScores]] = defaultdict(list)
        for r in records:
            scores = scores_of(r, kind)
            if scores is not None:
                rounds[r["round"]].append(scores)
        xs = sorted(rounds)
        for split, style in (("val", "--"), ("test", "-")):
            ys = [sum(m[f"{split}_{metric}"] for m in rounds[x]) / len(rounds[x]) for x in xs]
            ax1.plot(xs, ys, style, label=f"{kind} {split} (mean)")
    ax1.set_xlabel("round")
    ax1.set_ylabel(label)
    ax1.set_title(f"{title}: mean over clients")
    ax1.grid(alpha=0.3)
    ax1.legend(fontsize=8)
    primary = kinds[0]
    per_client: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for r in records:
        scores = scores_of(r, primary)
        if scores is not None:
            per_client[r["client"]].append((r["round"], scores[f"test_{metric}"]))
    for client, pts in per_client.items():
        pts.sort()
        ax2.plot([p[0] for p in pts], [p[1] for p in pts], label=client)
    ax2.set_xlabel("round")
    ax2.set_title(f"test {label} per client ({primary} model)")
    ax2.grid(alpha=0.3)
    ax2.legend(fontsize=8)
    # fixed margins (inches / figure size): room for the y label and the tick labels
    fig.subplots_adjust(left=0.06, right=0.99, bottom=0.12, top=0.92, wspace=0.12)
    with atomic_output(out) as tmp:
        render_png(fig, tmp)
    return out


def render_png(fig: Figure, path: Path) -> None:
    """``fig`` drawn and written to ``path`` as PNG: nine tenths of a convergence plot's
    time (the test suite's runs that never look at the picture replace it,
    tests/conftest.py)."""
    fig.savefig(path, format="png", dpi=110)
