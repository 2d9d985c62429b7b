"""Convergence plots (PNG, matplotlib's Agg backend: no display needed)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from fedshift.core.files import atomic_output  # noqa: E402


def plot_convergence(
    records: list[dict],
    kinds: list[str],
    out: Path,
    title: str,
    metric: str = "acc",
    label: str = "accuracy",
) -> Path:
    """Left: mean val/test ``metric`` (called ``label``) per round for each model kind.
    Right: per-client test ``metric`` of the primary kind."""
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for kind in kinds:
        rounds: dict[int, list[dict]] = defaultdict(list)
        for r in records:
            if kind in r:
                rounds[r["round"]].append(r[kind])
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
        if primary in r:
            per_client[r["client"]].append((r["round"], r[primary][f"test_{metric}"]))
    for client, pts in per_client.items():
        pts.sort()
        ax2.plot([p[0] for p in pts], [p[1] for p in pts], label=client)
    ax2.set_xlabel("round")
    ax2.set_title(f"test {label} per client ({primary} model)")
    ax2.grid(alpha=0.3)
    ax2.legend(fontsize=8)
    fig.tight_layout()
    with atomic_output(out) as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)
    return out
