"""The papers' claims as data, evaluated against committed results by one rubric.

``claims/<paper>.yaml`` lists a paper's claims: where the paper makes it (table, figure),
its statement and numbers, the suite on the paper's data, the offline stand-in (suite,
command, the ``results/`` folders its runs are committed in), the metric the paper uses and
the comparisons that test it. :func:`evaluate` reads those files and the runs under
``results/`` (each run: ``config.yaml``, ``summary.json``, ``metrics.jsonl``) and gives every
claim its numbers and a verdict by :mod:`fedshift.eval.rubric`; :mod:`fedshift.eval.ledger`
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
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from fedshift.eval import rubric
from fedshift.eval.claim_spec import (
    ClaimsError,
    ClaimSpec,
    CompareSpec,
    PaperSpec,
    Selector,
    load_paper,
)
from fedshift.eval.domains import domain_scores
from fedshift.eval.summary import check_scores, read_metric_rows


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
        """Whether the run had converged (:func:`fedshift.eval.rubric.convergence`: its
        selected round, its validation curve's end, or early stopping)."""
        if self._convergence is None:
            s = self.summary
            if "best_round" not in s or "rounds" not in s:
                raise ClaimsError(
                    f"{self.path / 'summary.json'}: no best_round / rounds, so its convergence "
                    "cannot be judged; collect the run again with this fedshift"
                )
            self._convergence = rubric.convergence(
                int(s["rounds"]), int(s["best_round"]), _curve(self, "val"), s.get("stop_reason")
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


# ----------------------------------------------------------------------------- metrics
def _curve(run: ResultRun, split: str = "val") -> dict[int, float]:
    """The mean ``split`` (val / test) primary metric over training clients, per evaluated
    round, of the model the run evaluates."""
    kind = run.summary.get("evaluated_model", "global")
    metric = run.summary.get("metric", "acc")
    by: dict[int, list[float]] = defaultdict(list)
    for r in run.rows:
        if kind in r and not r.get("holdout"):
            by[int(r["round"])].append(float(r[kind][f"{split}_{metric}"]))
    return {k: statistics.fmean(v) for k, v in sorted(by.items())}


def _at(split: str) -> Callable[[ResultRun, str, Path | None], float]:
    def at(run: ResultRun, arg: str, protocol: Path | None) -> float:
        curve = _curve(run, split)
        rnd = int(arg)
        if rnd not in curve:
            raise ClaimsError(f"{run.path}: round {rnd} was not evaluated (rounds {list(curve)})")
        return curve[rnd]

    return at


def _drops(split: str) -> Callable[[ResultRun, str, Path | None], float]:
    def drops(run: ResultRun, arg: str, protocol: Path | None) -> float:
        vals = list(_curve(run, split).values())
        return sum(max(0.0, a - b) for a, b in zip(vals, vals[1:], strict=False))

    return drops


def _test(run: ResultRun, arg: str, protocol: Path | None) -> float:
    s = run.summary
    if not arg:
        return float(s["test_mean"])
    if arg in s.get("test_per_client", {}):
        return float(s["test_per_client"][arg])
    if arg in s.get("metrics", {}):
        return float(s["metrics"][arg]["test_mean"])
    raise ClaimsError(f"{run.path}: no client or metric {arg!r} in its summary")


def _target(run: ResultRun, arg: str, protocol: Path | None) -> float:
    v = run.summary.get("target_test_mean")
    if v is None:
        raise ClaimsError(f"{run.path}: no held-out client (target_test_mean)")
    return float(v)


def _per_domain(run: ResultRun) -> list[float]:
    """Per domain, the mean test score of the clients that hold mostly that domain
    (:func:`domain_scores`), held-out clients left out."""
    scores = domain_scores(run.summary)
    if scores is None:
        raise ClaimsError(f"{run.path}: no domain_mix in its summary (partition.name=domains)")
    return list(scores.values())


def _domain_mean(run: ResultRun, arg: str, protocol: Path | None) -> float:
    return statistics.fmean(_per_domain(run))


def _domain_std(run: ResultRun, arg: str, protocol: Path | None) -> float:
    return statistics.pstdev(_per_domain(run))


def _protocol_dir(run: ResultRun, protocol: Path | None) -> Path:
    if protocol is None:
        raise ClaimsError(f"this metric needs the claim's stand_in.protocol folder ({run.path})")
    return protocol


def _cross_site(run: ResultRun, arg: str, protocol: Path | None) -> float:
    p = _protocol_dir(run, protocol) / run.path.name / "cross-site.json"
    try:
        data = json.loads(p.read_text())
    except (OSError, ValueError) as e:
        raise ClaimsError(f"{p}: {e}") from None
    metric = data.get("metric", "acc")
    return float(data["stats"][metric][arg or "off_diagonal_mean"])


def _run_entry(run: ResultRun, protocol: Path | None, name: str) -> tuple[Path, dict]:
    """The protocol file ``name``'s ``runs`` entry of ``run`` (matched by folder name)."""
    p = _protocol_dir(run, protocol) / name
    try:
        data = json.loads(p.read_text())
    except (OSError, ValueError) as e:
        raise ClaimsError(f"{p}: {e}") from None
    for key, entry in data["runs"].items():
        if Path(key).name == run.path.name:
            return p, entry
    raise ClaimsError(f"{p}: no entry for run {run.path.name}")


def _head_finetune(run: ResultRun, arg: str, protocol: Path | None) -> float:
    _, per_client = _run_entry(run, protocol, "head-finetune.json")
    return statistics.fmean(v[arg] for v in per_client.values())


def _new_site(run: ResultRun, arg: str, protocol: Path | None) -> float:
    """The held-out site's score after the new-site variant ``arg`` (``global``, ``adabn``,
    ``finetune-10``, ...; :mod:`fedshift.protocols.new_site`), from the protocol's
    ``new-site.json``."""
    p, entry = _run_entry(run, protocol, "new-site.json")
    if arg not in entry["scores"]:
        raise ClaimsError(f"{p}: no variant {arg!r}; it has {sorted(entry['scores'])}")
    value = entry["scores"][arg]
    if value is None:
        why = entry.get("reasons", {}).get(arg, "not applicable")
        raise ClaimsError(f"{p}: {arg!r} does not apply to {run.path.name}: {why}")
    return float(value)


#: metric name (before ``:``) -> value of one run; the part after ``:`` is the argument
METRICS: dict[str, Callable[[ResultRun, str, Path | None], float]] = {
    "test": _test,
    "target": _target,
    "val_at": _at("val"),
    "val_drops": _drops("val"),
    "test_at": _at("test"),
    "test_drops": _drops("test"),
    "cross_site": _cross_site,
    "head_finetune": _head_finetune,
    "domain_mean": _domain_mean,
    "domain_std": _domain_std,
    "new_site": _new_site,
}

METRIC_WORDS = {
    "test": "test score at the selected round (mean over clients)",
    "target": "held-out client's test score at the selected round",
    "val_at": "mean validation score at round {arg}",
    "val_drops": "summed round-to-round drops of the mean validation curve",
    "test_at": "mean test score at round {arg}",
    "test_drops": "summed round-to-round drops of the mean test curve",
    "cross_site": "local models on the other clients' test data (off-diagonal mean)",
    "head_finetune": "test score {arg} retraining the head (mean over clients)",
    "domain_mean": "mean over domains of the per-domain test score (clients by main domain)",
    "domain_std": "std over domains of the per-domain test score (FedHEAL's fairness)",
    "new_site": "held-out site's test score after the new-site variant {arg}",
}


#: metrics read at a fixed round of a curve, not at the selected round: a claim about that
#: round, which the convergence rule does not apply to (:data:`fedshift.eval.rubric.RUBRIC`)
CURVE_METRICS = ("val_at", "val_drops", "test_at", "test_drops")


def at_selected_round(metric: str) -> bool:
    """Whether ``metric`` reads the run's model at its selected round (so the run must have
    converged for a comparison of it to count)."""
    return metric.partition(":")[0] not in CURVE_METRICS


def metric_value(run: ResultRun, metric: str, protocol: Path | None = None) -> float:
    name, _, arg = metric.partition(":")
    if name not in METRICS:
        raise ClaimsError(f"unknown metric {metric!r}; valid: {sorted(METRICS)}")
    return METRICS[name](run, arg, protocol)


def metric_words(metric: str) -> str:
    name, _, arg = metric.partition(":")
    text = METRIC_WORDS.get(name, metric)
    if name == "test" and arg:
        return f"test score of {arg} at the selected round"
    if name == "head_finetune":
        return text.format(arg={"before": "before", "after": "after"}.get(arg, arg))
    return text.format(arg=arg)


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
    for c in spec.compare:
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
    return ClaimResult(spec, verdict, comps, _rounds(runs), source, acct, bool(runs))


@dataclass
class PaperResult:
    spec: PaperSpec
    claims: list[ClaimResult]

    def counts(self) -> dict[str, int]:
        out = {v: 0 for v in rubric.VERDICTS}
        for c in self.claims:
            if c.verdict is not None:
                out[c.verdict] += 1
        return out


def load_papers(claims_dir: Path) -> list[PaperSpec]:
    # the five papers first, then the baselines' own claims
    files = sorted(Path(claims_dir).glob("*.yaml"), key=lambda f: (f.stem == "baselines", f.stem))
    if not files:
        raise ClaimsError(f"no claims files (*.yaml) in {claims_dir}")
    return [load_paper(f) for f in files]


def evaluate(claims_dir: Path, results_root: Path) -> list[PaperResult]:
    """Every paper's claims with their numbers and verdicts (:class:`ClaimsError` on a claims
    file that does not fit the results)."""
    results = Results(results_root)
    out = []
    for spec in load_papers(claims_dir):
        where = f"{claims_dir}/{spec.key}.yaml"
        out.append(PaperResult(spec, [evaluate_claim(c, results, where) for c in spec.claims]))
    return out


def fmt_p(p: float | None) -> str:
    if p is None or (isinstance(p, float) and math.isnan(p)):
        return "—"
    return "< 0.001" if p < 0.001 else f"{p:.3f}"
