"""The claims ledger's rubric: one rule that turns paired per-seed results into a verdict.

Every paper claim the ledger counts is a set of *comparisons* between two groups of runs
(``a`` against ``b``) on the metric the paper uses, paired by seed. Each comparison has an
expectation (``greater``: a > b, ``less``: a < b, ``equal``: |a - b| < margin) and gets one
verdict by :func:`judge`; a claim's verdict combines its comparisons' by :func:`combine`.
:data:`RUBRIC` is the same rule in words, printed at the top of docs/CLAIMS.md.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Literal

from scipy import stats as _st

#: significance level of every test
ALPHA = 0.05
#: fewest paired seeds for a comparison to count as a reproduction
MIN_SEEDS = 3
#: the margin of an ``equal`` expectation when its claim names none (metric units: 1 point)
DEFAULT_MARGIN = 0.01

Expect = Literal["greater", "less", "equal"]
EXPECTS: tuple[str, ...] = ("greater", "less", "equal")

REPRODUCES = "reproduces"
IN_DIRECTION = "in direction"
NO = "no"
NOT_MEASURED = "not measured"
NOT_RUNNABLE = "not runnable offline"
#: every verdict a counted claim can get, in the order the summary table shows them
VERDICTS: tuple[str, ...] = (REPRODUCES, IN_DIRECTION, NO, NOT_MEASURED, NOT_RUNNABLE)

RUBRIC = f"""\
**The rubric** (one rule for every counted claim; `src/fedshift/eval/rubric.py`). A claim is
a set of comparisons between two groups of runs, `a` and `b`, on the metric the paper uses,
paired by seed (d = a - b per seed; n seeds that both have). Each comparison expects
`a > b`, `a < b`, or `a = b` within a stated margin m (default {100 * DEFAULT_MARGIN:g} point).
- **reproduces**: for `a > b` / `a < b`, the mean of d has the expected sign and the
  two-sided paired t-test gives p < {ALPHA} over n >= {MIN_SEEDS} seeds; for `a = b`, both
  one-sided paired t-tests of the equivalence test (TOST: d > -m, d < m) give p < {ALPHA}
  over n >= {MIN_SEEDS} seeds.
- **in direction**: the expected sign (or |mean d| < m), without that significance (or with
  fewer than {MIN_SEEDS} seeds).
- **no**: the opposite sign (a significant contrary result included), or |mean d| >= m for
  `a = b`.
- A claim **reproduces** when every one of its comparisons reproduces, is **no** when any
  comparison is no (even while others are not measured: they cannot undo it), is **not
  measured** when, short of a no, a comparison lacks results, and **in direction** otherwise.
  No correction for multiple comparisons.
- **not measured**: the stand-in runs offline but its results are not in `results/` (the
  command is given); **not runnable offline**: it needs data no package ships (named).
- Design checks (a test of fedshift's own reading of an equation), accounting rows (bytes
  on the wire) and qualitative figures are listed apart and never counted as reproductions.
"""


@dataclass(frozen=True)
class Comparison:
    """One comparison's numbers and verdict (metric units; ``p``: the test the verdict used,
    two-sided paired t-test for greater/less, the TOST's larger one-sided p for equal)."""

    n: int
    mean: float
    std: float
    p: float | None
    verdict: str


def _paired_p(diffs: list[float], alternative: str, shift: float = 0.0) -> float | None:
    """p-value of the paired t-test of ``diffs - shift`` against 0 (``two-sided``, ``greater``
    or ``less``); ``None`` with fewer than two pairs. Differences that are all equal have no
    spread: their p is 0 when the alternative holds for them, else 1."""
    if len(diffs) < 2:
        return None
    d = [x - shift for x in diffs]
    if all(x == d[0] for x in d):
        holds = {"two-sided": d[0] != 0, "greater": d[0] > 0, "less": d[0] < 0}[alternative]
        return 0.0 if holds else 1.0
    return float(_st.ttest_1samp(d, 0.0, alternative=alternative).pvalue)


def judge(diffs: list[float], expect: str, margin: float = DEFAULT_MARGIN) -> Comparison:
    """The verdict of one comparison from its per-seed differences ``diffs`` (a - b)."""
    if expect not in EXPECTS:
        raise ValueError(f"expect must be one of {EXPECTS}, got {expect!r}")
    n = len(diffs)
    if n == 0:
        return Comparison(0, math.nan, math.nan, None, NOT_MEASURED)
    mean = statistics.fmean(diffs)
    std = statistics.stdev(diffs) if n > 1 else 0.0
    if expect == "equal":
        lower = _paired_p(diffs, "greater", -margin)
        upper = _paired_p(diffs, "less", margin)
        p = None if lower is None or upper is None else max(lower, upper)
        if abs(mean) >= margin:
            verdict = NO
        elif n >= MIN_SEEDS and p is not None and p < ALPHA:
            verdict = REPRODUCES
        else:
            verdict = IN_DIRECTION
        return Comparison(n, mean, std, p, verdict)
    p = _paired_p(diffs, "two-sided")
    right = mean > 0 if expect == "greater" else mean < 0
    if not right:
        verdict = NO
    elif n >= MIN_SEEDS and p is not None and p < ALPHA:
        verdict = REPRODUCES
    else:
        verdict = IN_DIRECTION
    return Comparison(n, mean, std, p, verdict)


def combine(verdicts: list[str]) -> str:
    """A claim's verdict from its comparisons' (:data:`RUBRIC`)."""
    if NO in verdicts:  # every comparison must hold: one "no" decides, measured or not
        return NO
    if not verdicts or NOT_MEASURED in verdicts:
        return NOT_MEASURED
    if all(v == REPRODUCES for v in verdicts):
        return REPRODUCES
    return IN_DIRECTION
