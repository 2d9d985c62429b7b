"""Statistics over seeds: mean ± std and the paired t-test (pairs matched by seed); ranks of
methods and the rank correlation of two rankings (Kendall's tau-b).

``scipy.stats`` is imported by the two functions that use it, not with the module: it costs
about a CPU second, and every ``fedshift run`` / ``bench`` process imports this module
(through the tables it prints) while few of them compare seeds."""

from __future__ import annotations

import math
import statistics


def mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for a single value)."""
    if not values:
        return math.nan, math.nan
    return statistics.mean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def paired_ttest(a: dict[int, float], b: dict[int, float]) -> float | None:
    """Two-sided paired t-test p-value of ``a`` vs ``b`` over the seeds both have.

    ``None`` with fewer than two common seeds; 1.0 when every difference is zero."""
    seeds = sorted(set(a) & set(b))
    if len(seeds) < 2:
        return None
    da = [a[s] for s in seeds]
    db = [b[s] for s in seeds]
    diffs = [x - y for x, y in zip(da, db, strict=True)]
    if all(d == diffs[0] for d in diffs):
        return 1.0 if diffs[0] == 0 else 0.0
    from scipy import stats

    return float(stats.ttest_rel(da, db).pvalue)


def ranks(scores: dict[str, float]) -> dict[str, float]:
    """Rank of each entry, 1 = the highest score; tied scores share the mean of the ranks
    they span (two tied for first are both 1.5)."""
    order = sorted(scores, key=lambda k: -scores[k])
    out: dict[str, float] = {}
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and scores[order[j + 1]] == scores[order[i]]:
            j += 1
        for k in order[i : j + 1]:
            out[k] = (i + j) / 2 + 1
        i = j + 1
    return out


def rank_correlation(
    a: dict[str, float], b: dict[str, float]
) -> tuple[float | None, float | None, int]:
    """Kendall's tau-b between two rankings of the entries both score, its two-sided
    p-value, and how many entries that is; (None, None, n) with fewer than three entries or
    a ranking that is all ties (tau undefined)."""
    common = sorted(set(a) & set(b))
    if len(common) < 3:
        return None, None, len(common)
    xa, xb = [a[k] for k in common], [b[k] for k in common]
    if len(set(xa)) < 2 or len(set(xb)) < 2:
        return None, None, len(common)
    from scipy import stats

    r = stats.kendalltau(xa, xb)
    return float(r.statistic), float(r.pvalue), len(common)
