"""Statistics over seeds: mean ± std and the paired t-test (pairs matched by seed)."""

from __future__ import annotations

import math
import statistics

from scipy import stats as _st


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
    return float(_st.ttest_rel(da, db).pvalue)
