"""The papers' claims as data, evaluated against committed results by one rubric.

``claims/<paper>.yaml`` lists a paper's claims: where the paper makes it (table, figure),
its statement and numbers, the suite on the paper's data, the offline stand-in (suite,
command, the ``results/`` folders its runs are committed in), the metric the paper uses and
the comparisons that test it. :func:`evaluate` reads those files and the runs under
``results/`` (each run: ``config.yaml``, ``summary.json``, ``metrics.jsonl``) and gives every
claim its numbers and a verdict by :mod:`fedshift.claims.rubric`; :mod:`fedshift.claims.ledger`
writes docs/CLAIMS.md and the per-paper pages from the result. Nothing here runs a model.

A claim's ``kind``: ``claim`` (counted: a verdict by the rubric), ``design`` (a test of
fedshift's own reading of an equation, named by ``test``), ``accounting`` (bytes on the
wire, read from the runs' ledgers), ``qualitative`` (a figure, by eye). Only ``claim`` rows
are counted as reproductions.
"""

from __future__ import annotations

import json
import math
import statistics
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from fedshift.claims import rubric
from fedshift.claims.commits import run_commit
from fedshift.claims.metrics import (
    CURVE_METRICS,
    METRIC_WORDS,
    METRICS,
    at_selected_round,
    curve,
    metric_value,
    metric_words,
)
from fedshift.claims.scope import expand_scope, uncompared
from fedshift.claims.spec import (
    ClaimsError,
    ClaimSpec,
    CompareSpec,
    PaperSpec,
    Selector,
    load_paper,
)
from fedshift.eval.summary import check_scores, read_metric_rows

__all__ = [
    "CURVE_METRICS",
    "METRICS",
    "METRIC_WORDS",
    "ClaimResult",
    "CompareResult",
    "PaperResult",
    "ResultRun",
    "Results",
    "at_selected_round",
    "comm_numbers",
    "evaluate",
    "evaluate_claim",
    "expand_scope",
    "fmt_p",
    "load_papers",
    "metric_value",
    "metric_words",
    "uncompared",
    "unknown_commits",
]


# --------------------------------------------------------------------------- the results
@dataclass
class ResultRun:
    """One committed run: its folder, resolved config and summary."""

    path: Path
    cfg: dict
    summary: dict
    _rows: list[dict] | None = field(default=None, repr=False)
    _convergence: rubric.Convergence | None = field(default=None, repr=False)

    @property
    def seed(self) -> int:
        return int(self.cfg["seed"])

    @property
    def rows(self) -> list[dict]:
        if self._rows is None:  # checked: scores finite and in range, rounds whole
            self._rows = read_metric_rows(self.path / "metrics.jsonl")
        return self._rows

    @property
    def convergence(self) -> rubric.Convergence:
        """Whether the run had converged (:func:`fedshift.claims.rubric.convergence`: its
        selected round, its validation curve's end, or early stopping)."""
        if self._convergence is None:
            s = self.summary
            if "best_round" not in s or "rounds" not in s:
                raise ClaimsError(
                    f"{self.path / 'summary.json'}: no best_round / rounds, so its convergence "
                    "cannot be judged; collect the run again with this fedshift"
                )
            self._convergence = rubric.convergence(
                int(s["rounds"]),
                int(s["best_round"]),
                curve(self, "val"),
                s.get("stop_reason"),
                s.get("stopped_at"),
            )
        return self._convergence


#: the results' config.yaml files (written by fedshift's safe_dump, thousands of them):
#: libyaml's safe loader where PyYAML has it (the same plain values, ~10x faster), else
#: PyYAML's pure-Python one
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class Results:
    """The runs under a ``results/`` root, read once per folder."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self._folders: dict[str, list[ResultRun]] = {}

    def runs(self, folder: str) -> list[ResultRun]:
        if folder not in self._folders:
            base = self.root / folder
            found = []
            for s in sorted(base.rglob("summary.json")) if base.is_dir() else []:
                if not (s.parent / "config.yaml").is_file():
                    continue
                try:
                    cfg = yaml.load((s.parent / "config.yaml").read_text(), Loader=_LOADER)
                    summary = json.loads(s.read_text())
                except (OSError, ValueError, yaml.YAMLError) as e:
                    raise ClaimsError(f"{s.parent}: unreadable result ({e})") from None
                check_scores(summary, s)  # every score finite and in range: or one error
                found.append(ResultRun(s.parent, cfg, summary))
            self._folders[folder] = found
        return self._folders[folder]

    def source(self, folder: str) -> dict | None:
        """``results/<folder>/source.json``: the command and machine that produced it."""
        top = folder.split("/")[0]
        p = self.root / top / "source.json"
        try:
            return json.loads(p.read_text())
        except (OSError, ValueError):
            return None


# -------------------------------------------------------------------------- evaluation
@dataclass
class Group:
    """The runs a selector picks, one value per seed (``runs``: the runs of each seed)."""

    label: str
    values: dict[int, float]
    runs: dict[int, list[ResultRun]] = field(default_factory=dict)

    def cell(self) -> str:
        if not self.values:
            return "—"
        vals = list(self.values.values())
        m = statistics.fmean(vals)
        sd = f"{100 * statistics.stdev(vals):.2f}" if len(vals) > 1 else "n/a"
        return f"{100 * m:.2f} ± {sd}"


@dataclass
class CompareResult:
    spec: CompareSpec
    a: Group
    b: Group
    result: rubric.Comparison
    #: the paired seeds' runs whose convergence was judged (empty for a curve metric)
    judged: list[ResultRun] = field(default_factory=list)

    def converged_text(self) -> str:
        """``4/6``: converged runs of those judged, ``—`` for a curve metric."""
        if not self.judged:
            return "—"
        ok = sum(1 for r in self.judged if r.convergence.converged)
        return f"{ok}/{len(self.judged)}"


@dataclass
class ClaimResult:
    spec: ClaimSpec
    verdict: str | None  # None for rows that are not counted
    comparisons: list[CompareResult]
    rounds: int | None
    source: dict | None
    accounting: list[tuple[str, str]]
    #: whether any run of the stand-in is in results/
    measured: bool = False
    #: runs in the claim's reach that no comparison uses (:func:`uncompared`)
    uncompared: list[str] = field(default_factory=list)
    #: rows of other claims files that re-measure this claim (listed under it, not counted)
    retested_by: list[tuple[PaperSpec, ClaimResult]] = field(default_factory=list)
    #: the commit each run recorded (None: not recorded)
    commits: list[str | None] = field(default_factory=list)
    #: (runs, of all runs, the commits) run at a commit the repository does not hold
    unknown_commits: tuple[int, int, list[str]] | None = None

    @property
    def counted(self) -> bool:
        """A counted claim's row: a verdict, and not a re-test of a claim counted elsewhere."""
        return self.verdict is not None and self.spec.retests is None

    def verdict_text(self) -> str:
        """The verdict as the pages show it: ``not converged at N rounds`` names the most
        rounds a not-converged run of its comparisons ran."""
        if self.verdict != rubric.NOT_CONVERGED:
            return self.verdict or ""
        late = [c.result.rounds or 0 for c in self.comparisons]
        measured = rubric.combine(
            [c.result.as_measured or c.result.verdict for c in self.comparisons]
        )
        return rubric.verdict_text(self.verdict, max(late) or None, measured)


def _group(
    runs: list[ResultRun],
    sel: Selector,
    metric: str,
    mean_over: str | None,
    protocol: Path | None,
    where: str,
) -> Group:
    by_seed: dict[int, list[ResultRun]] = defaultdict(list)
    for r in runs:
        if sel.matches(r.cfg, r.summary):
            by_seed[r.seed].append(r)
    values: dict[int, float] = {}
    sizes = set()
    for seed, rs in sorted(by_seed.items()):
        if len(rs) > 1 and not mean_over:
            names = ", ".join(r.path.name for r in rs)
            raise ClaimsError(
                f"{where}: selector {sel.label()} matches {len(rs)} runs of seed {seed} "
                f"({names}); add keys to tell them apart, or mean_over"
            )
        sizes.add(len(rs))
        values[seed] = statistics.fmean(metric_value(r, metric, protocol) for r in rs)
    if mean_over and len(sizes) > 1:
        raise ClaimsError(f"{where}: {sel.label()} has unequal numbers of runs per seed")
    return Group(sel.label(), values, dict(by_seed))


def _rounds(runs: list[ResultRun]) -> int | None:
    rounds = {int(r.summary.get("rounds", 0)) for r in runs}
    return max(rounds) if rounds else None


def _accounting(
    runs: list[ResultRun], items: tuple[dict, ...], where: str
) -> list[tuple[str, str]]:
    out = []
    for i, item in enumerate(items):
        sel = Selector.of(item.get("select"), f"{where} accounting[{i}]")
        match = [r for r in runs if sel.matches(r.cfg, r.summary)]
        if not match:
            out.append((str(item.get("label", sel.label())), "not measured"))
            continue
        r = sorted(match, key=lambda x: x.seed)[0]
        out.append((str(item.get("label", sel.label())), _bytes_text(r)))
    return out


def _kb(n: float) -> str:
    return f"{n / 1e6:.2f} MB" if n >= 1e6 else f"{n / 1e3:.2f} KB"


def comm_numbers(s: dict) -> dict[str, float]:
    """Bytes per training client: ``up`` / ``down`` per round (the setup exchange of round 0
    apart), ``setup_up`` / ``setup_down`` once, and the model's size."""
    clients = max(1, len(s.get("clients", [])) - len(s.get("holdout", []) or []))
    rounds = max(1, int(s.get("rounds", 1)))
    setup = s.get("bytes_setup_by_direction", {})
    return {
        "up": (s.get("bytes_up", 0) - setup.get("up", 0)) / clients / rounds,
        "down": (s.get("bytes_down", 0) - setup.get("down", 0)) / clients / rounds,
        "setup_up": setup.get("up", 0) / clients,
        "setup_down": setup.get("down", 0) / clients,
        "model": s.get("model_bytes", 0),
    }


def _bytes_text(run: ResultRun) -> str:
    """What one client sends and receives, per round and once, next to the model's size."""
    s = run.summary
    c = comm_numbers(s)
    recs = sorted({k for d in s.get("bytes_by_record", {}).values() for k in d})
    return (
        f"per client and round {_kb(c['up'])} up, {_kb(c['down'])} down; once (setup) "
        f"{_kb(c['setup_up'])} up, {_kb(c['setup_down'])} down; model {_kb(c['model'])}; "
        f"records: {', '.join(recs)}"
    )


def evaluate_claim(spec: ClaimSpec, results: Results, where: str) -> ClaimResult:
    where = f"{where} claim {spec.id}"
    stand = spec.stand_in
    runs: list[ResultRun] = []
    if stand is not None:
        for folder in stand.results:
            runs += results.runs(folder)
    protocol = results.root / stand.protocol if stand and stand.protocol else None
    source = results.source(stand.results[0]) if stand and stand.results else None
    comps = []
    specs = expand_scope(spec, runs)
    for c in specs:
        cw = f"{where} '{c.label}'"
        a = _group(runs, c.a, c.metric, c.mean_over, protocol, cw)
        b = _group(runs, c.b, c.metric_b, c.mean_over, protocol, cw)
        seeds = sorted(set(a.values) & set(b.values))
        diffs = [a.values[s] - b.values[s] for s in seeds]
        judged = [
            r
            for s in seeds
            for g, m in ((a, c.metric), (b, c.metric_b))
            if at_selected_round(m)
            for r in g.runs[s]
        ]
        late = [r.convergence.rounds for r in judged if not r.convergence.converged]
        result = rubric.judge(diffs, c.expect, c.margin, max(late) if late else None)
        comps.append(CompareResult(c, a, b, result, judged))
    verdict: str | None = None
    if spec.kind == "claim":
        if spec.needs:
            verdict = rubric.NOT_RUNNABLE
        else:
            verdict = rubric.combine([c.result.verdict for c in comps])
    acct = _accounting(runs, spec.accounting, where) if spec.accounting else []
    left = uncompared(runs, specs) if specs else []
    res = ClaimResult(spec, verdict, comps, _rounds(runs), source, acct, bool(runs), left)
    res.commits = [run_commit(r.summary) for r in runs]
    return res


@dataclass
class PaperResult:
    spec: PaperSpec
    claims: list[ClaimResult]

    def counts(self) -> dict[str, int]:
        """Counted claims per verdict (re-tests of claims counted elsewhere left out)."""
        out = {v: 0 for v in rubric.VERDICTS}
        for c in self.claims:
            if c.counted:
                out[str(c.verdict)] += 1
        return out


def load_papers(claims_dir: Path) -> list[PaperSpec]:
    """Every claims file: the seed papers first (``seed_paper: true``), then the others,
    the baselines' own claims last."""
    files = sorted(Path(claims_dir).glob("*.yaml"))
    if not files:
        raise ClaimsError(f"no claims files (*.yaml) in {claims_dir}")
    papers = [load_paper(f) for f in files]
    return sorted(papers, key=lambda p: (not p.seed_paper, p.key == "baselines", p.key))


def unknown_commits(
    commits: list[str | None], missing: set[str]
) -> tuple[int, int, list[str]] | None:
    """(how many of ``commits`` are in ``missing``, how many there are, which), or None when
    none is."""
    gone = [c for c in commits if c in missing]
    return (len(gone), len(commits), sorted(set(gone))) if gone else None


def evaluate(
    claims_dir: Path,
    results_root: Path,
    missing_commits: Callable[[Iterable[str]], set[str]] | None = None,
) -> list[PaperResult]:
    """Every paper's claims with their numbers and verdicts (:class:`ClaimsError` on a claims
    file that does not fit the results); ``missing_commits`` (:func:`fedshift.claims.commits.
    commit_checker`): which of the runs' commits the repository does not hold, flagged on
    the claims that hold such runs (None: nothing is said of commits)."""
    results = Results(results_root)
    out = []
    for spec in load_papers(claims_dir):
        where = f"{claims_dir}/{spec.key}.yaml"
        out.append(PaperResult(spec, [evaluate_claim(c, results, where) for c in spec.claims]))
    by_id = {f"{p.spec.key}/{c.spec.id}": c for p in out for c in p.claims}
    for p in out:
        for c in p.claims:
            if c.spec.retests is None:
                continue
            target = by_id.get(c.spec.retests)
            if target is None or not target.counted:
                raise ClaimsError(
                    f"{claims_dir}/{p.spec.key}.yaml claim {c.spec.id}: retests "
                    f"{c.spec.retests}, which is not a counted claim of claims/"
                )
            target.retested_by.append((p.spec, c))
    if missing_commits is not None:
        every = {x for p in out for c in p.claims for x in c.commits if x}
        missing = missing_commits(every)
        for p in out:
            for c in p.claims:
                c.unknown_commits = unknown_commits(c.commits, missing)
    return out


def fmt_p(p: float | None) -> str:
    if p is None or (isinstance(p, float) and math.isnan(p)):
        return "—"
    return "< 0.001" if p < 0.001 else f"{p:.3f}"
