"""The tables, the break-even rule and the plot of benchmarks/privacy_price.py (its module
docstring says what they mean): split from it to keep each module short."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from privacy_price import Grid

BASELINE = "fedavg"


def eps_label(eps: float) -> str:
    return "inf" if math.isinf(eps) else f"{eps:g}"


@dataclass(frozen=True)
class Comparison:
    """A method against the baseline at one epsilon, paired over seeds."""

    n: int  # common seeds
    mean_diff: float | None
    p: float | None  # one-sided paired t-test, H1: mean difference > 0
    beats: bool


def compare(method: dict[int, float], base: dict[int, float], alpha: float) -> Comparison:
    """Paired over the seeds both have: the mean difference, the one-sided paired t-test's
    p-value (every difference equal, up to float rounding: p = 0 when it is positive, 1
    otherwise) and whether the
    method beats the baseline (mean difference > 0 and p < ``alpha``)."""
    from scipy import stats

    seeds = sorted(set(method) & set(base))
    diffs = [method[s] - base[s] for s in seeds]
    if len(seeds) < 2:
        mean = diffs[0] if diffs else None
        return Comparison(len(seeds), mean, None, False)
    mean = statistics.mean(diffs)
    if statistics.pstdev(diffs) <= 1e-12 * max(1.0, abs(mean)):  # equal up to rounding
        p = 0.0 if mean > 0 else 1.0
    else:
        p = float(stats.ttest_1samp(diffs, 0.0, alternative="greater").pvalue)
    return Comparison(len(seeds), mean, p, mean > 0 and p < alpha)


def break_even(beats: dict[float, bool]) -> float | None:
    """The smallest finite epsilon at which the method beats the baseline there and at every
    larger finite epsilon of the grid; None when it does not beat it at the largest."""
    found = None
    for eps in sorted((e for e in beats if not math.isinf(e)), reverse=True):
        if not beats[eps]:
            break
        found = eps
    return found


def _scores(cells: list[dict], dataset: str, method: str, eps: float) -> dict[int, float]:
    return {c["seed"]: c["score"] for c in cells if c["dataset"] == dataset
            and c["method"] == method and c["eps"] == eps_label(eps) and "score" in c}  # fmt: skip


def analyse(cells: list[dict], grid: Grid, alpha: float) -> dict[str, Any]:
    """Per dataset and method: the comparison with FedAvg at each epsilon, the break-even
    epsilon and the refusals."""
    out: dict[str, Any] = {}
    for d in grid.datasets:
        for m in grid.methods:
            if m == BASELINE:
                continue
            comps, refused = {}, sorted({c["refused"] for c in cells if c["dataset"] == d
                                         and c["method"] == m and "refused" in c})  # fmt: skip
            for e in grid.eps:
                comps[e] = compare(_scores(cells, d, m, e), _scores(cells, d, BASELINE, e), alpha)
            beats = {e: c.beats for e, c in comps.items()}
            finite_cells = any(_scores(cells, d, m, e) for e in grid.eps if not math.isinf(e))
            out[f"{d}/{m}"] = {
                "comparisons": {eps_label(e): c.__dict__ for e, c in comps.items()},
                "break_even": break_even(beats) if finite_cells else None,
                "has_finite_cells": finite_cells,
                "refused": refused,
            }
    return out


def _pct(vals: list[float]) -> str:
    if not vals:
        return "-"
    mu = 100 * statistics.mean(vals)
    sd = 100 * statistics.stdev(vals) if len(vals) > 1 else 0.0
    return f"{mu:.1f} ± {sd:.1f}" if len(vals) > 1 else f"{mu:.1f}"


def tables(cells: list[dict], grid: Grid, analysis: dict[str, Any], alpha: float) -> str:
    """The Markdown: scores, break-even, leakage, then the refusals."""
    head = "| method | " + " | ".join(f"eps {eps_label(e)}" for e in grid.eps) + " |"
    rule = "|---|" + "---|" * len(grid.eps)
    example = grid.updates == "example"
    lines = []
    if example:
        lines += ["Weights: example-level DP-SGD (privacy.updates=example) at every finite eps; "
                  "every cell, inf included, trains the model without normalisation layers "
                  "(model.norm=none).", ""]  # fmt: skip
    for d in grid.datasets:
        metric = next((c["metric"] for c in cells if c["dataset"] == d and "metric" in c), "?")
        lines += [f"### {d}: test {metric} (%, last round, mean ± std over seeds)", "",
                  head, rule]  # fmt: skip
        for m in [BASELINE] + [x for x in grid.methods if x != BASELINE]:
            row = [_pct(list(_scores(cells, d, m, e).values())) for e in grid.eps]
            for i, e in enumerate(grid.eps):  # seeds whose model's outputs overflowed
                k = sum(1 for c in cells if c["dataset"] == d and c["method"] == m
                        and c["eps"] == eps_label(e) and "diverged" in c)  # fmt: skip
                if k:
                    row[i] = "diverged" if row[i] == "-" else f"{row[i]} ({k} diverged)"
            refused = any("refused" in c for c in cells if c["dataset"] == d and c["method"] == m)
            row = [("refused" if r == "-" and refused else r) for r in row]
            lines.append(f"| {m} | " + " | ".join(row) + " |")
        lines += ["", f"### {d}: against FedAvg at the same epsilon (paired over seeds)", "",
                  f"Mean paired difference in points, one-sided paired t-test p; **bold**: "
                  f"beats FedAvg (difference > 0, p < {alpha:g}).", "",
                  "| method | break-even eps | " + head[len("| method | "):],
                  "|---|---|" + "---|" * len(grid.eps)]  # fmt: skip
        for m in grid.methods:
            if m == BASELINE:
                continue
            a = analysis[f"{d}/{m}"]
            cols = []
            for e in grid.eps:
                c = a["comparisons"][eps_label(e)]
                if c["mean_diff"] is None:
                    cols.append("-")
                    continue
                p = "n<2" if c["p"] is None else f"p={c['p']:.3f}"
                txt = f"{100 * c['mean_diff']:+.1f} ({p})"
                cols.append(f"**{txt}**" if c["beats"] else txt)
            if not a["has_finite_cells"]:
                be = "no finite cells"
                if a["refused"]:
                    be = "refused under DP-SGD" if example else "refused under DP"
            else:
                be = "none" if a["break_even"] is None else f"{a['break_even']:g}"
            lines.append(f"| {m} | {be} | " + " | ".join(cols) + " |")
        lines += ["", f"### {d}: membership AUC of the released model (loss threshold, first "
                  "training client; 0.5 is chance)", "", head, rule]  # fmt: skip
        for m in [BASELINE] + [x for x in grid.methods if x != BASELINE]:
            row = []
            for e in grid.eps:
                v = [c["membership_auc"] for c in cells if c["dataset"] == d and c["method"] == m
                     and c["eps"] == eps_label(e) and "membership_auc" in c]  # fmt: skip
                row.append(f"{statistics.mean(v):.3f}" if v else "-")
            lines.append(f"| {m} | " + " | ".join(row) + " |")
        lines.append("")
    refusals = sorted({(c["method"], c["refused"]) for c in cells if "refused" in c})
    if refusals:
        lines += ["Refused by fedshift (not run):", ""]
        lines += [f"- {m}: {r}" for m, r in refusals]
    gone = [c for c in cells if "diverged" in c]
    if gone:
        lines += ["", "Diverged (the model's outputs held NaN/inf at an evaluation: no score; a "
                  "comparison needs a score on both sides, so `-` where FedAvg or the method "
                  "diverged for every seed):", ""]  # fmt: skip
        lines += [f"- {c['dataset']} {c['method']} eps {c['eps']} seed {c['seed']}: at round "
                  f"{c['round']}'s evaluation" for c in gone]  # fmt: skip
    return "\n".join(lines) + "\n"


def plot(cells: list[dict], grid: Grid, path: Path) -> None:
    """Score against epsilon, one line per method (mean, error bar: min-max over seeds); the
    unprotected cells at the right, at a position marked inf."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    finite = sorted(e for e in grid.eps if not math.isinf(e))
    inf_x = (finite[-1] * 2.5) if finite else 1.0
    fig, axes = plt.subplots(1, len(grid.datasets), figsize=(5.2 * len(grid.datasets), 3.8),
                             squeeze=False)  # fmt: skip
    for ax, d in zip(axes[0], grid.datasets, strict=True):
        metric = "score"
        for m in [BASELINE] + [x for x in grid.methods if x != BASELINE]:
            xs, mus, lo, hi = [], [], [], []
            for e in grid.eps:
                v = [100 * s for s in _scores(cells, d, m, e).values()]
                if v:
                    xs.append(inf_x if math.isinf(e) else e)
                    mus.append(statistics.mean(v))
                    lo.append(statistics.mean(v) - min(v))
                    hi.append(max(v) - statistics.mean(v))
            if xs:
                ax.errorbar(xs, mus, yerr=[lo, hi], marker="o", capsize=3, label=m)
        metric = next((c["metric"] for c in cells if c["dataset"] == d and "metric" in c), "")
        ax.set_xscale("log")
        ticks = finite + [inf_x]
        ax.set_xticks(ticks, [eps_label(e) for e in finite] + ["inf"])
        ax.minorticks_off()
        ax.set_xlabel("epsilon (delta 1e-5)")
        ax.set_ylabel(f"test {metric} (%), last round")
        unit = ", DP-SGD" if grid.updates == "example" else ""
        ax.set_title(f"{d}: {len(grid.seeds)} seed(s), {grid.rounds} rounds{unit}")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def leakage_table(rows: list[dict], grid: Grid) -> str:
    """The statistics' membership AUC by site size against epsilon (mean over seeds)."""
    if not rows:
        return ""
    lines = ["### Membership AUC of the protected statistics, as released (likelihood-ratio "
             "test with the noise's variance; mean over seeds; 0.5 is chance)", "",
             "| dataset | method: record | site of n | "
             + " | ".join(f"eps {eps_label(e)}" for e in grid.eps) + " |",
             "|---|---|---|" + "---|" * len(grid.eps)]  # fmt: skip
    keys = dict.fromkeys((r["dataset"], r["method"], r["record"], r["n"]) for r in rows)
    for d, m, rec, n in keys:
        cols = []
        for e in grid.eps:
            v = [r["auc"] for r in rows if (r["dataset"], r["method"], r["n"]) == (d, m, n)
                 and r["eps"] == eps_label(e)]  # fmt: skip
            cols.append(f"{statistics.mean(v):.3f}" if v else "-")
        lines.append(f"| {d} | {m}: {rec} | {n} | " + " | ".join(cols) + " |")
    return "\n".join(lines) + "\n"
