"""The claims ledger's rubric: one rule that turns paired per-seed results into a verdict.

Every paper claim the ledger counts is a set of *comparisons* between two groups of runs
(``a`` against ``b``) on the metric the paper uses, paired by seed. Each comparison has an
expectation (``greater``: a > b, ``less``: a < b, ``equal``: |a - b| < margin) and gets one
verdict by :func:`judge`; a claim's verdict combines its comparisons' by :func:`combine`.
:data:`RUBRIC` is the same rule in words, printed at the top of docs/CLAIMS.md.

Convergence (issue 50). A comparison of models that were still improving compares them
mid-training, so a run is first checked by :func:`convergence`: it is *not converged* when
the round model selection picked lies in the last :data:`LAST_SHARE` (10 %) of its rounds,
or when its validation curve still rises: over its last :data:`SLOPE_POINTS` (5) evaluated
rounds, the least-squares slope of the mean validation score against the round is positive
with a one-sided p < :data:`ALPHA` (the t-test of the regression slope, n - 2 degrees of
freedom). Why that test: a slope over the last few evaluations asks "is it still going up at
the end", which a selected round early enough can hide (a noisy curve whose best point fell
earlier by chance while the trend is still up); one-sided, because a falling or flat curve
is what a finished run shows; significance, so that round-to-round noise on a plateau does
not count as rising; five points (three degrees of freedom) are the fewest that give the
test any power while staying at the end of a 10- to 30-evaluation curve. A run stopped by
early stopping (``summary.json``: ``stop_reason`` ``patience``, ``stopped_at``) has shown no
improvement for its patience window and counts as converged whatever the two tests say.
A comparison whose runs include one that is not converged gets :data:`NOT_CONVERGED`
("not converged at N rounds") instead of a win or a loss.
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

#: a run whose selected round lies in this last share of its rounds is not converged
LAST_SHARE = 0.10
#: the last evaluated rounds whose validation slope is tested
SLOPE_POINTS = 5

REPRODUCES = "reproduces"
IN_DIRECTION = "in direction"
#: the expected direction not shown: the other sign (or an exact tie) without significance
NOT_SHOWN = "not shown"
#: significantly the other way
CONTRARY = "contrary"
#: a comparison of runs still improving (shown as "not converged at N rounds")
NOT_CONVERGED = "not converged"
NOT_MEASURED = "not measured"
NOT_RUNNABLE = "not runnable offline"
#: every verdict a counted claim can get, in the order the summary table shows them
VERDICTS: tuple[str, ...] = (
    REPRODUCES,
    IN_DIRECTION,
    NOT_SHOWN,
    CONTRARY,
    NOT_CONVERGED,
    NOT_MEASURED,
    NOT_RUNNABLE,
)

RUBRIC = f"""\
**The rubric** (one rule for every counted claim; `src/fedshift/claims/rubric.py`). A claim is
a set of comparisons between two groups of runs, `a` and `b`, on the metric the paper uses,
paired by seed (d = a - b per seed; n seeds that both have). Each comparison expects
`a > b`, `a < b`, or `a = b` within a stated margin m (default {100 * DEFAULT_MARGIN:g} point).

**Converged runs first.** A run is *not converged* when the round model selection picked
lies in the last {100 * LAST_SHARE:g} % of its rounds, or when its validation curve still
rises: over its last {SLOPE_POINTS} evaluated rounds, the least-squares slope of the mean
validation score against the round is positive with a one-sided p < {ALPHA} (t-test of the
slope, n - 2 degrees of freedom: a trend, not one lucky evaluation; one-sided, since a flat
or falling end is what a finished run shows; {SLOPE_POINTS} points, three degrees of
freedom, are the fewest with any power while staying at the curve's end; it catches a run
whose best point fell earlier by chance while the trend still climbs). A run that early
stopping ended (`stopped_at` and `stop_reason: patience` in its summary.json) is
converged. Both tests apply to metrics read at the selected round (test score, held-out
site, protocols on the selected model); a curve read at a fixed round (`test_at`, `val_at`,
drops of a curve) is a claim about that round, and an attack on what a site sends
(`privacy`) is not a model's score: records computed from images before training do not
depend on it, and the weights attack measures the model as trained.

Each comparison gets one verdict:
- **not converged at N rounds**: a run of either group (of the paired seeds) is not
  converged; its N rounds were too few to call a win or a loss, whatever the numbers say
  (they are shown, with the verdict they would give "as measured", which is not counted).
- **reproduces**: for `a > b` / `a < b`, the mean of d has the expected sign and the
  two-sided paired t-test gives p < {ALPHA} over n >= {MIN_SEEDS} seeds; for `a = b`, both
  one-sided paired t-tests of the equivalence test (TOST: d > -m, d < m) give p < {ALPHA}
  over n >= {MIN_SEEDS} seeds.
- **in direction**: the expected sign (or |mean d| < m for `a = b`), without that
  significance (or with fewer than {MIN_SEEDS} seeds).
- **contrary**: significantly the other way: the opposite sign with the two-sided paired
  t-test's p < {ALPHA} over n >= {MIN_SEEDS} seeds; for `a = b`, |mean d| >= m and the
  one-sided t-test that d lies beyond that margin (d > m, or d < -m) gives p < {ALPHA}.
- **not shown**: the expected direction is not shown and the other is not significant: the
  opposite sign (or an exact tie, mean d = 0) without that significance; for `a = b`,
  |mean d| >= m without it.
- A claim takes the first of its comparisons' verdicts in this order: **contrary** (any
  comparison), **not shown**, **not converged**, **not measured** (a comparison lacks
  results), **in direction** (any), **reproduces** (every comparison). Every comparison must
  hold, so one contrary or not-shown comparison decides even while others are not converged
  or not measured. No correction for multiple comparisons.
- **not measured**: the stand-in runs offline but its results are not in `results/` (the
  command is given); **not runnable offline**: it needs data no package ships (named).
- Design checks (a test of fedshift's own reading of an equation), accounting rows (bytes
  on the wire) and qualitative figures are listed apart and never counted as reproductions.
"""


@dataclass(frozen=True)
class Comparison:
    """One comparison's numbers and verdict (metric units; ``p``: the test the verdict used,
    two-sided paired t-test for greater/less, the TOST's larger one-sided p for equal;
    ``rounds``: with :data:`NOT_CONVERGED`, the most rounds a not-converged run ran;
    ``as_measured``: then, what the numbers as they stand would give, shown beside it and
    never counted)."""

    n: int
    mean: float
    std: float
    p: float | None
    verdict: str
    rounds: int | None = None
    as_measured: str | None = None

    def text(self) -> str:
        """The verdict as the pages show it (``not converged at 30 rounds (as measured:
        in direction)``)."""
        return verdict_text(self.verdict, self.rounds, self.as_measured)


def verdict_text(verdict: str, rounds: int | None, as_measured: str | None = None) -> str:
    """``verdict`` in words: :data:`NOT_CONVERGED` names the rounds, and what the numbers
    as they stand give (``as_measured``, not a verdict: the runs were still improving)."""
    if verdict != NOT_CONVERGED:
        return verdict
    text = f"{NOT_CONVERGED} at {rounds} rounds" if rounds else NOT_CONVERGED
    return text + (f" (as measured: {as_measured})" if as_measured else "")


@dataclass(frozen=True)
class Convergence:
    """One run's convergence (:func:`convergence`): ``why`` says what failed ('' when
    converged)."""

    converged: bool
    rounds: int
    selected: int
    why: str = ""


def convergence(
    rounds: int,
    selected: int,
    val_curve: dict[int, float],
    stop_reason: str | None = None,
    stopped_at: int | None = None,
) -> Convergence:
    """Whether a run of ``rounds`` rounds whose model selection picked round ``selected``
    and whose mean validation score per evaluated round is ``val_curve`` had converged (the
    module docstring gives the rule and why). ``stopped_at`` set with ``stop_reason ==
    "patience"`` (its summary.json): early stopping ended it, converged."""
    if stopped_at is not None and stop_reason == "patience":
        return Convergence(True, rounds, selected)
    if rounds > 0 and selected > (1 - LAST_SHARE) * rounds:
        return Convergence(
            False,
            rounds,
            selected,
            f"selected round {selected} in the last {100 * LAST_SHARE:g} % of {rounds}",
        )
    pts = sorted(val_curve.items())[-SLOPE_POINTS:]
    if len(pts) >= 3:
        xs = [float(r) for r, _ in pts]
        ys = [v for _, v in pts]
        if len(set(ys)) > 1:
            fit = _st.linregress(xs, ys, alternative="greater")
            if fit.slope > 0 and fit.pvalue < ALPHA:
                return Convergence(
                    False,
                    rounds,
                    selected,
                    f"validation still rising over rounds {pts[0][0]}-{pts[-1][0]} "
                    f"(slope p = {fit.pvalue:.3f})",
                )
    return Convergence(True, rounds, selected)


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


def _significant(p: float | None, n: int) -> bool:
    return n >= MIN_SEEDS and p is not None and p < ALPHA


def judge(
    diffs: list[float],
    expect: str,
    margin: float = DEFAULT_MARGIN,
    unconverged_rounds: int | None = None,
) -> Comparison:
    """The verdict of one comparison from its per-seed differences ``diffs`` (a - b);
    ``unconverged_rounds``: set when a run of the comparison is not converged (the most
    rounds such a run ran), which makes the verdict :data:`NOT_CONVERGED`."""
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
            # beyond the margin: significantly so (contrary) or not (not shown)
            beyond = (
                _paired_p(diffs, "greater", margin)
                if mean > 0
                else _paired_p(diffs, "less", -margin)
            )
            verdict = CONTRARY if _significant(beyond, n) else NOT_SHOWN
        elif _significant(p, n):
            verdict = REPRODUCES
        else:
            verdict = IN_DIRECTION
    else:
        p = _paired_p(diffs, "two-sided")
        right = mean > 0 if expect == "greater" else mean < 0
        if right:
            verdict = REPRODUCES if _significant(p, n) else IN_DIRECTION
        elif mean != 0 and _significant(p, n):
            verdict = CONTRARY
        else:
            verdict = NOT_SHOWN
    if unconverged_rounds is not None:
        return Comparison(n, mean, std, p, NOT_CONVERGED, unconverged_rounds, verdict)
    return Comparison(n, mean, std, p, verdict)


def combine(verdicts: list[str]) -> str:
    """A claim's verdict from its comparisons' (:data:`RUBRIC`): every comparison must hold,
    so one contrary or not-shown comparison decides, measured and converged or not."""
    for v in (CONTRARY, NOT_SHOWN, NOT_CONVERGED):
        if v in verdicts:
            return v
    if not verdicts or NOT_MEASURED in verdicts:
        return NOT_MEASURED
    if all(v == REPRODUCES for v in verdicts):
        return REPRODUCES
    return IN_DIRECTION
