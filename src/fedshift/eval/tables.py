"""Plain-text result tables (per-client test scores, mean, and mean ± std over seeds).

Cells are the run's primary metric (``summary["metric"]``: accuracy, or foreground Dice for
segmentation) unless a table is asked for another one (``metric="dice_all"``: mean Dice
including background); :func:`metric_caption` names what a table shows."""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedshift.catalog import registry_for
from fedshift.core.config import load_yaml
from fedshift.core.errors import ConfigError, FedshiftError
from fedshift.core.identity import ONLY_WITH, flatten, number_config
from fedshift.core.logs import logged_warnings
from fedshift.eval.domains import domain_columns, domain_view
from fedshift.eval.stats import mean_std, paired_ttest


def _fmt(x: float) -> str:
    return f"{100 * x:.2f}"


def _client_mean(blocks: list[dict], client: str) -> str:
    """Client ``client``'s mean test score (%) over score blocks; a dash where no block has
    one (a held-out site the run does not score: ``fedshift protocol new-site`` does)."""
    vals = [b["test_per_client"][client] for b in blocks if client in b["test_per_client"]]
    return _fmt(statistics.mean(vals)) if vals else "—"


def mean_std_cell(values: list[float]) -> str:
    """``mean ± std`` over seeds in %, ``mean ± n/a`` for one value (one seed has no
    spread to show: ``± 0.00`` would claim one)."""
    m, sd = mean_std(values)
    return f"{_fmt(m)} ± {_fmt(sd) if len(values) > 1 else 'n/a'}"


def grid(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]

    def line(cells: list[str]) -> str:
        padded = (c.ljust(w) for c, w in zip(cells, widths, strict=True))
        return "| " + " | ".join(padded) + " |"

    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(header), sep, *(line(r) for r in rows)])


def scores(s: dict, metric: str | None = None) -> dict:
    """The ``test_mean`` / ``test_per_client`` (and val) block of a summary for ``metric``
    (None: the run's primary metric, which model selection used)."""
    if metric is None or metric == s.get("metric", "acc"):
        return s
    extra = s.get("metrics", {})
    if metric not in extra:
        have = [s.get("metric", "acc"), *extra]
        raise ValueError(f"run {s.get('run_dir')} has no metric {metric!r} (it has {have})")
    return extra[metric]


def metric_caption(summaries: list[dict], metric: str | None = None) -> str:
    """``Test accuracy (%)`` / ``Test foreground Dice (%)``... for a table's note."""
    s = summaries[0]
    name = metric or s.get("metric", "acc")
    label = s.get("metric_labels", {}).get(name, "accuracy" if name == "acc" else name)
    return f"Test {label} (%)"


def runs_table(summaries: list[dict], metric: str | None = None) -> str:
    """One row per run: per-client test score (%) at the selected round, and the mean."""
    clients = summaries[0]["clients"]
    header = ["algorithm", "seed", "model", *clients, "mean", "best rnd", "MB up+down"]
    # each run under its flow's name (algorithm + augments + what else tells runs apart, as
    # the mean-over-seeds table names them): two runs of one algorithm stay distinguishable
    flow = {id(s): f.name for f, g in group_flows(summaries).items() for s in g}
    rows = []
    for s in summaries:
        mb = (s["bytes_up"] + s["bytes_down"]) / 1e6
        sc = scores(s, metric)
        rows.append(
            [
                flow.get(id(s), s["algorithm"]),
                str(s["seed"]),
                s["evaluated_model"],
                *(_client_mean([sc], c) for c in clients),
                _fmt(sc["test_mean"]),
                str(s["best_round"]),
                f"{mb:.1f}",
            ]
        )
    return grid(header, rows)


def seeds_table(summaries: list[dict], metric: str | None = None) -> str | None:
    """Mean ± std over seeds per flow (:func:`group_flows`: per client and mean), when any
    has more than one seed."""
    groups = {f.name: g for f, g in group_flows(summaries).items()}
    if all(len(g) < 2 for g in groups.values()):
        return None
    clients = summaries[0]["clients"]
    header = ["algorithm", "seeds", *clients, "mean ± std"]
    rows = []
    for name, g in groups.items():
        cells = []
        for c in clients:
            cells.append(_client_mean([scores(s, metric) for s in g], c))
        means = [scores(s, metric)["test_mean"] for s in g]
        rows.append([name, str(len(g)), *cells, mean_std_cell(means)])
    return grid(header, rows)


def component_defaults(section: dict, kind: str) -> dict:
    """The default keys of the component a config section names (``{}``: it has none, or
    it is a ``module:Class`` plug-in that may not be imported here: ``fedshift report`` only
    reads, :mod:`fedshift.core.consent`; a warning says so once, and every key is shown)."""
    import dataclasses

    from fedshift.core.consent import PluginConsentError

    try:
        entry = registry_for(kind).entry(section["name"])
    except PluginConsentError as e:
        _held_back(str(e))
        return {}
    return dataclasses.asdict(entry.params()) if entry.params is not None else {}


@functools.cache
def _held_back(message: str) -> None:
    logging.getLogger("fedshift.eval").warning("%s", message)


def changed_text(section: dict, kind: str, recorded: dict | None = None) -> str:
    """``k=v`` for the keys of a resolved component section that differ from its defaults:
    those the run recorded in its summary (``defaults``), so that a plug-in's run reports
    without the plug-in; else (summaries written before) the registry's."""
    if recorded is None:
        recorded = component_defaults(section, kind)
    diff = [f"{k}={v}" for k, v in section.items() if k != "name" and recorded.get(k) != v]
    return ",".join(diff)


def flow_label(s: dict, skip: tuple[str, ...] = ()) -> str:
    """How a run differs from its algorithm's plain form (FedRDN's Table 1 "flows"): ``base``,
    or non-default algorithm keys and augments, e.g. ``+fedrdn``, ``ffa(variant=fedfa-r)``,
    ``perturbation=False``. An algorithm's own (implied) augment with default keys is base.
    ``skip``: ``algorithm.<key>`` keys a table shows in a column of its own.

    This is the algorithm's part of a table row's label only: :func:`group_flows` adds the
    other keys in which the runs of one table differ."""
    parts = []
    recorded = s.get("defaults") or {}
    algo = s.get("algorithm_config")
    if algo:
        hidden = {k.split(".", 1)[1] for k in skip if k.startswith("algorithm.")}
        algo = {k: v for k, v in algo.items() if k not in hidden}
        changed = changed_text(algo, "algorithm", recorded.get("algorithm"))
        if changed:
            parts.append(changed)
    implied = set(s.get("implied", []))
    for a in s.get("augment", []):
        own = recorded.get("augment", {}).get(a["name"])
        changed = changed_text(a, "augment", own) if len(a) > 1 else ""
        if a["name"] in implied and not changed:
            continue
        tag = a["name"] + (f"({changed})" if changed else "")
        parts.append(tag if a["name"] in implied else "+" + tag)
    return " ".join(parts) or "base"


def _delta(d: float) -> str:
    """A change in percentage points with its direction, e.g. ``+1.25 ↑``."""
    arrow = "↑" if d > 0 else "↓" if d < 0 else "="
    return f"{d:+.2f} {arrow}"


def parse_reference(reference: str | None) -> tuple[str, str] | None:
    """``fedavg`` -> (fedavg, base); ``fedavg/+fedrdn`` -> (fedavg, +fedrdn)."""
    if not reference:
        return None
    algo, _, flow = reference.partition("/")
    return algo, flow or "base"


def short_value(v: Any) -> str:
    """A config value in a label, without spaces: ``[a,b]``, ``ffa(p=0.1)``, ``0.1``."""
    if isinstance(v, list | tuple):
        return "[" + ",".join(short_value(x) for x in v) + "]"
    if isinstance(v, dict):
        rest = ",".join(f"{k}={short_value(x)}" for k, x in v.items() if k != "name")
        return f"{v.get('name', '?')}({rest})" if rest else str(v.get("name", v))
    return str(v).replace(" ", "_")


def run_config(s: dict) -> dict | None:
    """The resolved config of the run a summary belongs to, as a nested dict: the summary's
    own ``config`` (written since fedshift records it), else the ``config.yaml`` next to it
    (``_dir`` / ``run_dir``), read as YAML data; None when neither is there."""
    for key in ("config", "_cfg", "_config"):
        if isinstance(s.get(key), dict):
            return s[key]
    for key in ("_dir", "run_dir"):
        path = Path(str(s.get(key) or "")) / "config.yaml"
        if s.get(key) and path.is_file():
            try:
                s["_config"] = load_yaml(path)
            except ConfigError:
                return None
            return s["_config"]
    return None


def _recorded_config(s: dict) -> dict:
    """What a summary written without its config says about it (older runs whose folder is
    gone): algorithm, augments, model, partition, rounds and the federation keys it kept."""
    fed = {k: s[k] for k in ("holdout", "data_fraction", "weighting") if k in s}
    cfg: dict[str, Any] = {
        "seed": s["seed"],
        "algorithm": s.get("algorithm_config") or {"name": s["algorithm"]},
        "augment": s.get("augment", []),
        "model": {"name": s.get("model", "?"), **(s.get("model_weights") or {})},
        "partition": s.get("partition") or {"name": "none"},
        "train": {"rounds": s.get("rounds")},
        "federation": fed,
    }
    if s.get("threads", 1) != 1:
        cfg["threads"] = s["threads"]
    if s.get("_setting"):  # a protocol's setting column (its keys' values), if it has one
        cfg["_setting"] = s["_setting"]
    return cfg


def _identity(s: dict, complete: bool) -> dict[str, Any]:
    """The run's keys that decide its numbers, flattened (its seed included)."""
    if complete:
        return flatten(number_config(run_config(s) or {}))
    return flatten(_recorded_config(s))


@dataclass(frozen=True)
class Flow:
    """A table row's runs: one config, any number of seeds. ``label`` is ``base`` or the
    keys that set it apart, ``context`` (keys outside the algorithm's own in which the table's
    runs differ, e.g. ``train.lr=0.1``) then ``variant`` (:func:`flow_label`'s tokens)."""

    algorithm: str
    context: tuple[str, ...]
    variant: tuple[str, ...]

    @property
    def label(self) -> str:
        return " ".join([*self.context, *self.variant]) or "base"

    @property
    def name(self) -> str:
        """The algorithm and its flow, e.g. ``fedavg train.lr=0.1 +fedrdn`` (``fedavg``)."""
        return self.algorithm + ("" if self.label == "base" else f" {self.label}")

    def bases(self) -> list[str]:
        """The labels of the rows this one's Δ is taken against, best first: the same flow
        without its last added augment (FedRDN's Table 1 compares a flow with the same
        algorithm settings and base augmentation without it), else the algorithm's base with
        the same context (``train.lr=0.1``); none for that base itself."""
        own = Flow(self.algorithm, self.context, ())
        out = []
        if self.variant and self.variant[-1].startswith("+"):
            out.append(Flow(self.algorithm, self.context, self.variant[:-1]).label)
        if self.variant:
            out.append(own.label)
        return list(dict.fromkeys(out))


def group_flows(summaries: list[dict], shown: tuple[str, ...] = ()) -> dict[Flow, list[dict]]:
    """The runs of one table grouped into rows: runs share a row only when their configs are
    the same but for the seed (:func:`~fedshift.core.identity.number_config`: name, output
    folder, execution and checkpoint cadence change no number). Each row's label shows the
    keys in which the table's runs differ (``fedavg train.lr=0.1``): those of the algorithm
    and augments as :func:`flow_label` writes them, any other as ``key=value``; ``shown``:
    dotted keys the table shows in columns of its own (a partition, a swept key), left out of
    labels and of the grouping. Sets ``s["_flow"]`` (the row's :class:`Flow`) on every
    summary; rows in first-seen order.

    The configs come from each summary (:func:`run_config`); when one of the runs has none,
    every run is compared on what the summaries record (:func:`_recorded_config`). Two runs
    with the same config and seed are one run twice: a :class:`FedshiftError` names both
    (and, where the configs are not recorded, says so)."""
    complete = all(run_config(s) is not None for s in summaries)
    flats = [_identity(s, complete) for s in summaries]
    seen: dict[str, dict] = {}
    for s, f in zip(summaries, flats, strict=True):
        key = json.dumps(f, sort_keys=True, default=str)
        if key in seen and complete:
            raise FedshiftError(
                f"{_where(seen[key])} and {_where(s)} are the same config and seed run twice: "
                "report one of them (give the run folders to report one by one)"
            )
        if key in seen:
            raise FedshiftError(
                f"{_where(seen[key])} and {_where(s)} look like the same config and seed run "
                "twice, but their configs are not recorded (summaries of an older fedshift, "
                "without the config.yaml of their run folder), so fedshift cannot tell them "
                "apart: report them from their run folders, or one of them"
            )
        seen[key] = s

    def column(k: str) -> bool:  # a key the table shows in a column of its own
        if k in ONLY_WITH and column(ONLY_WITH[k]):
            return True  # acts only with a shown key (model.ws_gamma with model.conv)
        return any(k == x or k.startswith(x + ".") or x.startswith(k + ".") for x in shown)

    def own(k: str) -> bool:  # keys flow_label speaks for, the seed, and the table's columns
        return k.split(".")[0] in ("algorithm", "augment", "seed", "_setting") or column(k)

    keys = list(dict.fromkeys(k for f in flats for k in f if not own(k)))
    missing = object()
    varying = [
        k for k in keys if len({json.dumps(f.get(k, missing), default=str) for f in flats}) > 1
    ]
    groups: dict[Flow, list[dict]] = {}
    identity: dict[Flow, str] = {}
    for s, f in zip(summaries, flats, strict=True):
        context = tuple(f"{k}={short_value(f[k])}" for k in varying if k in f)
        variant = tuple(t for t in flow_label(s, shown).split(" ") if t != "base")
        flow = Flow(s["algorithm"], context, variant)
        # the setting column tells rows apart itself (row keys carry it), not a digest
        rest = {k: v for k, v in f.items() if k not in ("seed", "_setting") and not column(k)}
        ident = json.dumps(rest, sort_keys=True, default=str)
        if flow in identity and identity[flow] != ident:  # labels alike, configs not
            flow = Flow(flow.algorithm, (*context, f"config={_digest(ident)}"), variant)
        identity.setdefault(flow, ident)
        groups.setdefault(flow, []).append(s)
        s["_flow"] = flow
    return groups


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:6]


def _where(s: dict) -> str:
    return str(s.get("_dir") or s.get("run_dir") or f"{s['algorithm']} seed {s['seed']}")


def row_label(s: dict) -> str:
    """A summary's row name after :func:`group_flows`: ``fedavg train.lr=0.1 +fedrdn``."""
    flow = s.get("_flow")
    return flow.name if isinstance(flow, Flow) else s["algorithm"]


def flows_rows(
    summaries: list[dict], metric: str | None = None, reference: str | None = None
) -> tuple[list[str], list[list[str]]]:
    """FedRDN's Table 1/2 shape: one row per flow (:func:`group_flows`: the runs of one config
    over seeds) with per-client test score (%, mean over the row's seeds), the average ± std
    over the same seeds, the change against the algorithm's base flow (with its direction) and
    the paired t-test p-value against it (pairs matched by seed); with ``reference``
    (``ALGO`` or ``ALGO/FLOW``) also the paired t-test p-value against that row (FedRDN's
    appendix B)."""
    groups = group_flows(summaries)
    by_label = {(f.algorithm, f.label): f for f in groups}
    ref_key = parse_reference(reference)
    if ref_key is not None and ref_key not in by_label:
        have = ", ".join(f"{a}/{f}" for a, f in sorted(by_label))
        raise ValueError(f"reference {reference!r} is not among the runs ({have})")

    def by_seed(g: list[dict]) -> dict[int, float]:
        return {s["seed"]: scores(s, metric)["test_mean"] for s in g}

    by_domain = domain_columns(summaries)  # domains dealt to several clients: one column each
    clients = by_domain or summaries[0]["clients"]
    header = ["algorithm", "flow", "seeds", *clients, "avg ± std", "Δ vs base", "p vs base"]
    if ref_key is not None:
        header.append(f"p vs {ref_key[0]}/{ref_key[1]}")
    rows = []
    for flow in sorted(groups, key=_flow_order):
        g = groups[flow]
        seeds = by_seed(g)
        m = mean_std(list(seeds.values()))[0]
        base = next((groups[by_label[(flow.algorithm, b)]] for b in flow.bases()
                     if (flow.algorithm, b) in by_label), None)  # fmt: skip
        delta, p = "", ""
        if base:
            base_seeds = by_seed(base)
            delta = _delta(100 * (m - mean_std(list(base_seeds.values()))[0]))
            pv = paired_ttest(seeds, base_seeds)
            p = "" if pv is None else f"{pv:.3f}"
        blocks = [scores(s, metric) for s in g]
        if by_domain:
            blocks = [{"test_per_client": domain_view(s, b["test_per_client"])}
                      for s, b in zip(g, blocks, strict=True)]  # fmt: skip
        cells = [_client_mean(blocks, c) for c in clients]
        row = [flow.algorithm, flow.label, str(len(g)), *cells,
               mean_std_cell(list(seeds.values())), delta, p]  # fmt: skip
        if ref_key is not None:
            pr = ""
            if (flow.algorithm, flow.label) != ref_key:
                pv = paired_ttest(seeds, by_seed(groups[by_label[ref_key]]))
                pr = "" if pv is None else f"{pv:.3f}"
            row.append(pr)
        rows.append(row)
    return header, rows


def _flow_order(flow: Flow) -> tuple:
    """Rows by algorithm, each algorithm's base (with the same context) first."""
    return (flow.algorithm, flow.context, bool(flow.variant), flow.variant)


def flows_table(
    summaries: list[dict], metric: str | None = None, reference: str | None = None
) -> str:
    """:func:`flows_rows` as a plain-text (Markdown) table."""
    return grid(*flows_rows(summaries, metric, reference))


def comm_rows(summaries: list[dict]) -> tuple[list[str], list[list[str]]]:
    """Communication per flow (:func:`group_flows`): bytes per client per round (up, down; the setup
    exchange of round 0 excluded and shown apart, per client) next to the model's size."""
    groups = {(f.algorithm, f.label): g[0] for f, g in group_flows(summaries).items()}
    header = [
        "algorithm",
        "flow",
        "model KB",
        "up KB/client/rnd",
        "down KB/client/rnd",
        "setup KB/client",
        "records",
    ]
    rows = []
    for (algo, flow), s in sorted(groups.items()):
        n, r = len(s["clients"]), s["rounds"]
        setup = s.get("bytes_setup", 0)
        by_rec = s.get("bytes_by_record", {})
        names = sorted({k for d in by_rec.values() for k in d})
        up = (s["bytes_up"] - _setup_part(s, "up")) / (n * r)
        down = (s["bytes_down"] - _setup_part(s, "down")) / (n * r)
        rows.append(
            [
                algo,
                flow,
                f"{s['model_bytes'] / 1e3:.1f}",
                f"{up / 1e3:.2f}",
                f"{down / 1e3:.2f}",
                f"{setup / n / 1e3:.2f}",
                ", ".join(names),
            ]
        )
    return header, rows


def comm_table(summaries: list[dict]) -> str:
    """:func:`comm_rows` as a plain-text (Markdown) table."""
    return grid(*comm_rows(summaries))


def _setup_part(s: dict, direction: str) -> int:
    return int(s.get("bytes_setup_by_direction", {}).get(direction, 0))


def print_tables(summaries: list[dict]) -> None:
    """Per-run and mean-over-seeds tables for the primary metric and each other metric
    (segmentation: foreground Dice, then mean Dice incl. background), each captioned."""
    for i, metric in enumerate([None, *summaries[0].get("metrics", {})]):
        caption = metric_caption(summaries, metric)
        print(("\n" if i else "") + f"{caption}, model selected on validation:")
        print(runs_table(summaries, metric))
        if not i:  # the resolved federation.weighting of each algorithm in the table
            seen = {s["algorithm"]: s.get("weighting", "?") for s in summaries}
            print("aggregation weighting: " + ", ".join(f"{a}={w}" for a, w in seen.items()))
        agg = seeds_table(summaries, metric)
        if agg:
            print(f"\nMean over seeds ({caption}):")
            print(agg)
    print_warnings(summaries)


def print_warnings(summaries: list[dict]) -> None:
    """The warnings the runs logged (their ``run.log``), once each under the tables, with the
    runs that logged them: a method's warning that scrolled past between progress bars (a
    HarmoFL zero start worth points, say) is not lost."""
    found: dict[str, list[str]] = {}
    flow = {id(s): f.name for f, g in group_flows(summaries).items() for s in g}
    for s in summaries:
        for message in logged_warnings(s.get("run_dir", "")) if s.get("run_dir") else []:
            found.setdefault(message, []).append(
                f"{flow.get(id(s), s['algorithm'])} seed {s['seed']}"
            )
    if found:
        print("\nwarnings the runs logged (each run's run.log has them):")
        for message, runs in found.items():
            print(f"- {message} [{', '.join(runs)}]")
