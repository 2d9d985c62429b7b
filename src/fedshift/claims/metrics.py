"""The metrics a claim compares, each read from one committed run (its summary, metric rows,
or a protocol's output beside it): ``test``, ``target``, curves at a round (``val_at``,
``test_at``) and their drops, per-domain means, cross-site, head finetuning and new-site
scores (:data:`METRICS`; :mod:`fedshift.claims.evaluate` evaluates the claims with them)."""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from fedshift.claims.spec import ClaimsError
from fedshift.eval.domains import domain_scores

if TYPE_CHECKING:
    from fedshift.claims.evaluate import ResultRun


def curve(run: ResultRun, split: str = "val") -> dict[int, float]:
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
        points = curve(run, split)
        rnd = int(arg)
        if rnd not in points:
            raise ClaimsError(f"{run.path}: round {rnd} was not evaluated (rounds {list(points)})")
        return points[rnd]

    return at


def _drops(split: str) -> Callable[[ResultRun, str, Path | None], float]:
    def drops(run: ResultRun, arg: str, protocol: Path | None) -> float:
        vals = list(curve(run, split).values())
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


def _privacy(run: ResultRun, arg: str, protocol: Path | None) -> float:
    """One attack's number on ``run`` (a row of ``fedshift protocol privacy``'s table, e.g.
    ``membership AUC, weights (loss threshold)``), from the protocol's ``privacy.json``."""
    p, entry = _run_entry(run, protocol, "privacy.json")
    if arg not in entry["rows"]:
        raise ClaimsError(
            f"{p}: no attack {arg!r} for {run.path.name}; it has {sorted(entry['rows'])}"
        )
    return float(entry["rows"][arg])


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
    "privacy": _privacy,
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
    "privacy": "attack on what the site sends: {arg}",
}


#: metrics read at a fixed round of a curve, not at the selected round: a claim about that
#: round, which the convergence rule does not apply to (:data:`fedshift.claims.rubric.RUBRIC`)
CURVE_METRICS = ("val_at", "val_drops", "test_at", "test_drops")
#: metrics that are not a model's score: attacks on what a site sends (``privacy``), whose
#: records computed from images do not depend on training and whose weights attack measures
#: the model as trained; the convergence rule does not apply to them either
NOT_SCORES = ("privacy",)


def at_selected_round(metric: str) -> bool:
    """Whether ``metric`` reads the run's model score at its selected round (so the run must
    have converged for a comparison of it to count)."""
    return metric.partition(":")[0] not in (*CURVE_METRICS, *NOT_SCORES)


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
