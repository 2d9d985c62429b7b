"""Run summaries: model selection on the mean validation primary metric (accuracy, or
foreground Dice for segmentation), then test at that round, for every metric of the task."""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, cast

from fedshift.core.config import RunConfig
from fedshift.core.errors import FedshiftError
from fedshift.core.payload import Ledger
from fedshift.core.rows import MetricRow, as_kind
from fedshift.core.tasks import TASKS, Task

SELECTION_RULE = (
    "round with the best mean validation accuracy over clients (earliest on ties); "
    "test accuracy reported at that round"
)


def selection_rule(label: str = "accuracy") -> str:
    """The model-selection rule in words, for the metric called ``label``."""
    return SELECTION_RULE.replace("accuracy", label)


def _rounds_of(records: list[MetricRow], kind: str) -> dict[int, list[MetricRow]]:
    by_round: dict[int, list[MetricRow]] = defaultdict(list)
    for r in records:
        if kind in r:
            by_round[r["round"]].append(r)
    return by_round


def val_curve(records: list[MetricRow], kind: str, metric: str = "acc") -> dict[int, float]:
    """The validation curve model selection reads: per evaluated round (ascending), the mean
    validation ``metric`` of the ``kind`` model over the clients that train (rows flagged
    ``holdout`` left out)."""
    k = as_kind(kind)
    curve = {}
    for rnd, rows in sorted(_rounds_of(records, kind).items()):
        scored = [r[k][f"val_{metric}"] for r in rows if not r.get("holdout")]
        curve[rnd] = sum(scored) / len(scored)
    return curve


def select_round(
    records: list[MetricRow], kind: str, metric: str = "acc", others: tuple[str, ...] = ()
) -> dict[str, Any]:
    """Model selection for one model kind (``global`` or ``personal``) over metric rows: the
    round with the best mean validation ``metric``; each block also reports the ``others``
    metrics at its round under ``block["metrics"]``.

    Rows flagged ``holdout`` (clients that never trained: leave-one-client-out) take no part in
    the selection or the means; their test scores are reported apart as ``target_test_mean``
    / ``target_per_client`` (and stay in ``test_per_client``)."""
    k = as_kind(kind)
    by_round = _rounds_of(records, kind)
    if not by_round:
        raise ValueError(f"no evaluated rounds for the {kind} model")

    def mean(rows: list[MetricRow], key: str) -> float:
        rows = [r for r in rows if not r.get("holdout")]
        return sum(r[k][key] for r in rows) / len(rows)

    curve = val_curve(records, kind, metric)
    best = max(curve, key=lambda rnd: (curve[rnd], -rnd))
    last = max(by_round)

    def scores(rows: list[MetricRow], m: str) -> dict[str, Any]:
        return {
            "val_mean": mean(rows, f"val_{m}"),
            "test_mean": mean(rows, f"test_{m}"),
            "val_per_client": {r["client"]: r[k][f"val_{m}"] for r in rows},
            "test_per_client": {r["client"]: r[k][f"test_{m}"] for r in rows},
        }

    def block(rnd: int) -> dict[str, Any]:
        rows = by_round[rnd]
        out = {"round": rnd, **scores(rows, metric)}
        targets = [r for r in rows if r.get("holdout")]
        if targets:
            out["target_per_client"] = {r["client"]: r[k][f"test_{metric}"] for r in targets}
            out["target_test_mean"] = sum(out["target_per_client"].values()) / len(targets)
        if others:
            out["metrics"] = {m: scores(rows, m) for m in others}
        return out

    return {"best": block(best), "final": block(last)}


def build_summary(
    records: list[MetricRow],
    kinds: list[str],
    meta: dict[str, Any],
    ledger_totals: dict[str, int],
    bytes_by_record: dict[str, dict[str, int]],
    wall_s: float,
    task: str = "classification",
) -> dict[str, Any]:
    metrics = TASKS[task].metrics
    names = tuple(m.name for m in metrics if m.name != "loss")
    primary_metric = metrics[0]
    models = {kind: select_round(records, kind, primary_metric.name, names[1:]) for kind in kinds}
    primary = kinds[0]
    best = models[primary]["best"]
    return {
        **meta,
        "task": task,
        # what val_mean / test_mean / *_per_client measure; "metrics" has the others
        "metric": primary_metric.name,
        "metric_label": primary_metric.label,
        "metric_labels": {m.name: m.label for m in metrics},
        "evaluated_model": primary,
        "model_selection": f"{selection_rule(primary_metric.label)} ({primary} model)",
        "best_round": best["round"],
        "val_mean": best["val_mean"],
        "test_mean": best["test_mean"],
        "test_per_client": best["test_per_client"],
        "val_per_client": best["val_per_client"],
        "final_test_mean": models[primary]["final"]["test_mean"],
        # leave-one-client-out: the held-out clients' test score at the selected round
        "holdout": list(meta.get("holdout", [])),
        "target_test_mean": best.get("target_test_mean"),
        "target_per_client": best.get("target_per_client"),
        "metrics": best.get("metrics", {}),
        "models": models,
        "bytes_up": ledger_totals.get("up", 0),
        "bytes_down": ledger_totals.get("down", 0),
        "bytes_by_record": bytes_by_record,
        "wall_s": wall_s,
    }


@dataclass(frozen=True)
class RunRecord:
    """A finished run, as the round loop fills it at the end
    (:func:`~fedshift.runtime.lifecycle.run_record`): everything ``summary.json``,
    ``ledger.json`` and ``convergence.png`` are written from (:attr:`summary`,
    :class:`~fedshift.runtime.rundir.results.ResultFiles`)."""

    config: RunConfig
    run_dir: Path
    #: the progress label (``fedavg s0``), the title of ``convergence.png``
    label: str
    task: Task
    #: the model kinds evaluated, primary first
    kinds: list[str]
    clients: list[str]
    #: the augments the algorithm implies
    implied: list[str]
    #: label-distribution heterogeneity of the clients (DisTrans's DH, Eq. 3-4), when known
    dh: float | None
    #: the aggregation weighting the algorithm used (``federation.weighting``, ``auto``
    #: resolved)
    weighting: str
    model_params: int
    model_bytes: int
    #: the metric rows of every evaluated round (``metrics.jsonl``)
    records: list[MetricRow]
    ledger: Ledger
    #: seconds of training, over every part of a resumed run
    wall_s: float
    #: what the transport reports (``summary["runtime"]``), when it reports anything
    runtime: dict | None = None
    #: what produced the run, with its end time
    #: (:func:`fedshift.runtime.tracking.trackers.provenance`)
    provenance: dict | None = None
    #: each client's training examples per source domain (``partition.name=domains``)
    domain_mix: dict | None = None
    #: the last round the run trained (``train.rounds`` unless early stopping ended it)
    stopped_at: int | None = None
    #: where ``train.patience`` stopped the run (:class:`~fedshift.eval.early_stop.Stop`)
    stop: Any = None
    #: with ``train.trainable`` other than ``all``: what trained and stayed frozen (Frozen.report)
    trainable: dict | None = None
    #: the privacy budget and what the run spent (``privacy.epsilon``:
    #: :meth:`fedshift.runtime.privacy.Plan.summary`), or None
    privacy: dict | None = None

    @cached_property
    def summary(self) -> dict[str, Any]:
        """The content of ``summary.json``: model selection and test at the selected round
        (:func:`build_summary`), what ran, the bytes, ``runtime`` and ``provenance``."""
        cfg = self.config
        meta = {
            "algorithm": cfg.algorithm.name,
            "dataset": cfg.dataset.name,
            "model": cfg.model.name,
            "algorithm_config": cfg.algorithm.to_dict(),
            "augment": [a.to_dict() for a in cfg.augment],
            "implied": list(self.implied),
            # the components' default keys, so a report labels what a run changed without
            # importing the components (a plug-in's module need not be importable there)
            "defaults": {
                "algorithm": cfg.algorithm.defaults(),
                "augment": {a.name: a.defaults() for a in cfg.augment},
            },
            "partition": cfg.partition.to_dict(),
            "dh": self.dh,
            "seed": cfg.seed,
            "weighting": self.weighting,
            "holdout": list(cfg.federation.holdout),
            "data_fraction": cfg.federation.data_fraction,
            "rounds": cfg.train.rounds,
            # where the run ended and why: "patience" (early stopping) or "rounds" (all run)
            "stopped_at": cfg.train.rounds if self.stopped_at is None else self.stopped_at,
            "stop_reason": "rounds" if self.stop is None else "patience",
            "clients": self.clients,
            "model_params": self.model_params,
            "model_bytes": self.model_bytes,
            "run_dir": str(self.run_dir),
            # the resolved config (config.yaml's content): reports group runs by it, seeds
            # apart
            "config": cfg.to_dict(),
        }
        if cfg.model.extras.get("weights"):  # pretrained weights: the file, SHA-256, skipped keys
            meta["model_weights"] = cfg.model.extras
        if self.trainable is not None:  # a part of the model trained, the rest frozen
            meta["trainable"] = self.trainable
        if self.domain_mix is not None:  # clients drawn from domains: each one's mix
            meta["domain_mix"] = self.domain_mix
        ledger = self.ledger
        totals = {"up": ledger.total("up"), "down": ledger.total("down")}
        setup = ledger.by_round().get(0, {})
        meta["bytes_setup"] = sum(setup.values())
        meta["bytes_setup_by_direction"] = setup
        out = build_summary(
            self.records,
            self.kinds,
            meta,
            totals,
            ledger.by_record(),
            round(self.wall_s, 3),
            self.task.name,
        )
        if self.runtime:
            out["runtime"] = self.runtime
        if self.provenance is not None:
            out["provenance"] = self.provenance
        if self.privacy is not None:
            out["privacy"] = self.privacy
        return out


def load_summaries(roots) -> list[dict[str, Any]]:
    """Every ``summary.json`` below the given folders, in path order, each checked
    (:func:`read_summary`) and with ``_dir`` = its folder (where the run's ``config.yaml``
    is)."""
    return [
        {**read_summary(p), "_dir": str(p.parent)}
        for r in roots
        for p in sorted(Path(r).rglob("summary.json"))
    ]


# ---------------------------------------------------------------------------- schema
def _finite(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _whole(v: Any, low: int = 0) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= low


def _scores(v: Any) -> bool:
    return isinstance(v, dict) and all(isinstance(k, str) and _finite(x) for k, x in v.items())


def _text(v: Any) -> bool:
    return isinstance(v, str) and v != ""


#: field -> (what it must be, check): the fields of ``summary.json`` that reports, tables
#: and protocols read (:func:`check_summary`); optional ones may be missing or null
SUMMARY_FIELDS: dict[str, tuple[str, Any]] = {
    "algorithm": ("a name (text)", _text),
    "dataset": ("a name (text)", _text),
    "model": ("a name (text)", _text),
    "seed": ("a whole number >= 0", _whole),
    "rounds": ("a whole number >= 1", lambda v: _whole(v, 1)),
    "clients": (
        "a non-empty list of client names",
        lambda v: isinstance(v, list) and v != [] and all(_text(c) for c in v),
    ),
    "metric": ("a metric name (text)", _text),
    "evaluated_model": ("'global' or 'personal'", lambda v: v in ("global", "personal")),
    "best_round": ("a whole number >= 0", _whole),
    "val_mean": ("a finite number", _finite),
    "test_mean": ("a finite number", _finite),
    "test_per_client": ("a mapping of client names to finite numbers", _scores),
    "val_per_client": ("a mapping of client names to finite numbers", _scores),
    "bytes_up": ("a whole number of bytes >= 0", _whole),
    "bytes_down": ("a whole number of bytes >= 0", _whole),
}
#: optional fields (missing or null is fine)
SUMMARY_OPTIONAL: dict[str, tuple[str, Any]] = {
    "final_test_mean": ("a finite number", _finite),
    "metrics": (
        "a mapping of metric names to score blocks",
        lambda v: isinstance(v, dict) and all(isinstance(b, dict) for b in v.values()),
    ),
    "metric_labels": ("a mapping of metric names to labels", lambda v: isinstance(v, dict)),
    "algorithm_config": ("a mapping (the algorithm's keys)", lambda v: isinstance(v, dict)),
    "partition": ("a mapping (the partition's keys)", lambda v: isinstance(v, dict)),
    "augment": ("a list of augments", lambda v: isinstance(v, list)),
    "defaults": ("a mapping", lambda v: isinstance(v, dict)),
    "holdout": ("a list of client names", lambda v: isinstance(v, list)),
    "target_test_mean": ("a finite number", _finite),
    "bytes_by_record": ("a mapping", lambda v: isinstance(v, dict)),
    "bytes_setup": ("a whole number of bytes >= 0", _whole),
    "wall_s": ("a number of seconds >= 0", lambda v: _finite(v) and v >= 0),
    "label": ("text", lambda v: isinstance(v, str)),
    "stopped_at": ("a whole number >= 1", lambda v: _whole(v, 1)),
    "stop_reason": ("'patience' or 'rounds'", lambda v: v in ("patience", "rounds")),
}


def check_summary(s: Any, path: Any) -> dict[str, Any]:
    """``s`` (the content of the ``summary.json`` at ``path``) has the fields fedshift writes,
    of the right types and consistent (the selected round within the run's rounds, a score
    for every client): one :class:`~fedshift.core.errors.FedshiftError` names the file and
    the first field that is not. Returns ``s``."""
    end = (
        "; it was not written by fedshift or was edited. Write it again from the run's "
        f"checkpoint (fedshift run --resume {Path(str(path)).parent}), or leave that run out"
    )

    def bad(field: str, want: str, got: Any) -> FedshiftError:
        shown = type(got).__name__ if isinstance(got, dict | list) else repr(got)[:60]
        return FedshiftError(f"{path}: field {field!r} must be {want}, got {shown}{end}")

    if not isinstance(s, dict):
        raise FedshiftError(f"{path}: expected a JSON object, got {type(s).__name__}{end}")
    for field, (want, ok) in SUMMARY_FIELDS.items():
        if field not in s:
            raise FedshiftError(f"{path}: field {field!r} is missing{end}")
        if not ok(s[field]):
            raise bad(field, want, s[field])
    for field, (want, ok) in SUMMARY_OPTIONAL.items():
        if s.get(field) is not None and not ok(s[field]):
            raise bad(field, want, s[field])
    if s["best_round"] > s["rounds"]:
        raise bad("best_round", f"at most the run's rounds ({s['rounds']})", s["best_round"])
    # held-out sites of an algorithm with client-local tensors are not scored by the run
    # (FedBN, FRAug, DisTrans: `fedshift protocol new-site` scores them)
    unscored = set(s.get("holdout") or []) if s.get("target_test_mean") is None else set()
    for field in ("test_per_client", "val_per_client"):
        missing = [c for c in s["clients"] if c not in s[field] and c not in unscored]
        if missing:
            raise bad(field, f"a score for every client (none for {missing[0]!r})", s[field])
    check_scores(s, path, end)
    return s


def check_scores(s: Any, path: Any, end: str = "") -> dict[str, Any]:
    """Every score of the summary ``s`` (read from ``path``) that is there is a finite number
    in its metric's range (:func:`metric_range`: accuracy and Dice in [0, 1]): the means,
    the per-client scores, the other metrics' blocks and the ``models`` blocks. A
    :class:`~fedshift.core.errors.FedshiftError` names the file and the dotted field; what
    the claims ledger reads is checked this way. Returns ``s``."""
    end = end or "; it was not written by fedshift or was edited"
    if not isinstance(s, dict):
        raise FedshiftError(f"{path}: expected a JSON object, got {type(s).__name__}{end}")
    found = _out_of_range(s)
    if found is not None:
        field, metric, value = found
        want = metric_range(metric)[2]
        raise FedshiftError(f"{path}: field {field!r} must be {want}, got {value!r}{end}")
    return s


# ---------------------------------------------------------------------------- value ranges
#: metrics stored as fractions: accuracy and Dice are in [0, 1] in summary.json and
#: metrics.jsonl (tables print them as percent); a value of 5.0 (500 %) is not a score
FRACTION_METRICS = ("acc", "dice", "dice_all")


def metric_range(metric: str) -> tuple[float, float, str]:
    """``(low, high, in words)`` of a stored value of ``metric`` (any other metric: finite)."""
    if metric in FRACTION_METRICS:
        return 0.0, 1.0, "a finite number in [0, 1] (fedshift stores fractions, not percent)"
    if metric == "loss":
        return 0.0, math.inf, "a finite number >= 0"
    return -math.inf, math.inf, "a finite number"


def in_range(value: Any, metric: str) -> bool:
    """``value`` is a finite number within :func:`metric_range` of ``metric``."""
    low, high, _ = metric_range(metric)
    return _finite(value) and low <= value <= high


#: the score fields of a block (the summary itself, ``metrics.<m>``, ``models.<kind>.best``)
_MEANS = ("val_mean", "test_mean", "final_test_mean", "target_test_mean")
_PER_CLIENT = ("val_per_client", "test_per_client", "target_per_client")


def _block_out_of_range(block: dict, metric: str, prefix: str) -> tuple[str, str, Any] | None:
    for field in _MEANS:
        v = block.get(field)
        if v is not None and not in_range(v, metric):
            return f"{prefix}{field}", metric, v
    for field in _PER_CLIENT:
        per = block.get(field)
        for client, v in per.items() if isinstance(per, dict) else ():
            if not in_range(v, metric):
                return f"{prefix}{field}.{client}", metric, v
    others = block.get("metrics")
    for m, sub in others.items() if isinstance(others, dict) else ():
        if isinstance(sub, dict):
            found = _block_out_of_range(sub, m, f"{prefix}metrics.{m}.")
            if found is not None:
                return found
    return None


def _out_of_range(s: dict) -> tuple[str, str, Any] | None:
    """The first score of a summary outside its metric's range: ``(field, metric, value)``
    (``field`` dotted: ``test_per_client.site1``, ``metrics.dice_all.test_mean``,
    ``models.global.best.val_mean``), or None."""
    metric = s.get("metric", "acc")
    found = _block_out_of_range(s, metric, "")
    models = s.get("models")
    for kind, sel in models.items() if isinstance(models, dict) else ():
        for which in ("best", "final"):
            block = sel.get(which) if isinstance(sel, dict) else None
            if found is None and isinstance(block, dict):
                found = _block_out_of_range(block, metric, f"models.{kind}.{which}.")
    return found


def check_metric_row(row: Any, path: Any, line: int) -> MetricRow:
    """One row of a run's ``metrics.jsonl`` (line ``line`` of ``path``) as fedshift writes
    it: a ``round`` (whole, >= 0), a ``client`` name, and per evaluated model (``global`` /
    ``personal``) scores that are finite and in their metric's range (accuracy and Dice in
    [0, 1]). A :class:`~fedshift.core.errors.FedshiftError` names the file, line and key.
    Returns ``row``."""
    where = f"{path}, line {line}"
    end = "; it was not written by fedshift or was edited"
    if not isinstance(row, dict):
        raise FedshiftError(f"{where}: expected a JSON object, got {type(row).__name__}{end}")
    if not _whole(row.get("round")):
        raise FedshiftError(f"{where}: key 'round' must be a whole number >= 0{end}")
    if not _text(row.get("client")):
        raise FedshiftError(f"{where}: key 'client' must be a client name{end}")
    for kind in ("global", "personal"):
        scores = row.get(kind)
        if scores is None:
            continue
        if not isinstance(scores, dict):
            raise FedshiftError(f"{where}: key {kind!r} must be a mapping of scores{end}")
        for key, v in scores.items():
            metric = str(key).partition("_")[2]
            if not in_range(v, metric):
                want = metric_range(metric)[2]
                raise FedshiftError(f"{where}: key '{kind}.{key}' must be {want}, got {v!r}{end}")
    tl = row.get("train_loss")
    if tl is not None and not _finite(tl):
        raise FedshiftError(f"{where}: key 'train_loss' must be a finite number, got {tl!r}{end}")
    return cast(MetricRow, row)  # checked above: its keys as a MetricRow holds them


def read_metric_rows(path: Any) -> list[MetricRow]:
    """The rows of a ``metrics.jsonl``, each checked (:func:`check_metric_row`); a line that
    is not JSON is an error naming the file and line."""
    import json

    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise FedshiftError(f"cannot read {path} ({e})") from None
    rows = []
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as e:
            raise FedshiftError(f"{path}, line {i}: not JSON ({e})") from None
        rows.append(check_metric_row(row, path, i))
    return rows


def read_summary(path: Any) -> dict[str, Any]:
    """A ``summary.json`` read (:func:`~fedshift.core.files.read_json`: an unreadable file
    is an error naming it) and checked (:func:`check_summary`)."""
    from fedshift.core.files import read_json

    return check_summary(read_json(path), path)
