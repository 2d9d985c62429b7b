"""Plain-text result tables (per-client test scores, mean, and mean ± std over seeds).

Cells are the run's primary metric (``summary["metric"]``: accuracy, or foreground Dice for
segmentation) unless a table is asked for another one (``metric="dice_all"``: mean Dice
including background); :func:`metric_caption` names what a table shows."""

from __future__ import annotations

import statistics
from collections import defaultdict

from fedshift.catalog import registry_for
from fedshift.eval.stats import mean_std, paired_ttest


def _fmt(x: float) -> str:
    return f"{100 * x:.2f}"


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
    rows = []
    for s in summaries:
        mb = (s["bytes_up"] + s["bytes_down"]) / 1e6
        sc = scores(s, metric)
        rows.append(
            [
                s["algorithm"],
                str(s["seed"]),
                s["evaluated_model"],
                *(_fmt(sc["test_per_client"][c]) for c in clients),
                _fmt(sc["test_mean"]),
                str(s["best_round"]),
                f"{mb:.1f}",
            ]
        )
    return grid(header, rows)


def group_key(s: dict) -> str:
    return s.get("label") or s["algorithm"]


def seeds_table(summaries: list[dict], metric: str | None = None) -> str | None:
    """Mean ± std over seeds per algorithm (per client and mean), when any has >1 seed."""
    groups: dict[str, list[dict]] = defaultdict(list)
    for s in summaries:
        groups[group_key(s)].append(s)
    if all(len(g) < 2 for g in groups.values()):
        return None
    clients = summaries[0]["clients"]
    header = ["algorithm", "seeds", *clients, "mean ± std"]
    rows = []
    for name, g in groups.items():
        cells = []
        for c in clients:
            cells.append(_fmt(statistics.mean(scores(s, metric)["test_per_client"][c] for s in g)))
        means = [scores(s, metric)["test_mean"] for s in g]
        rows.append([name, str(len(g)), *cells, mean_std_cell(means)])
    return grid(header, rows)


def component_defaults(section: dict, kind: str) -> dict:
    """The default keys of the component a config section names (``{}``: it has none)."""
    import dataclasses

    entry = registry_for(kind).entry(section["name"])
    return dataclasses.asdict(entry.params()) if entry.params is not None else {}


def _changed(section: dict, kind: str, recorded: dict | None = None) -> str:
    """``k=v`` for the keys of a resolved component section that differ from its defaults:
    those the run recorded in its summary (``defaults``), so that a plug-in's run reports
    without the plug-in; else (summaries written before) the registry's."""
    if recorded is None:
        recorded = component_defaults(section, kind)
    diff = [f"{k}={v}" for k, v in section.items() if k != "name" and recorded.get(k) != v]
    return ",".join(diff)


def flow_label(s: dict) -> str:
    """How a run differs from its algorithm's plain form (FedRDN's Table 1 "flows"): ``base``,
    or non-default algorithm keys and augments, e.g. ``+fedrdn``, ``ffa(variant=fedfa-r)``,
    ``perturbation=False``. An algorithm's own (implied) augment with default keys is base."""
    parts = []
    recorded = s.get("defaults") or {}
    algo = s.get("algorithm_config")
    if algo:
        changed = _changed(algo, "algorithm", recorded.get("algorithm"))
        if changed:
            parts.append(changed)
    implied = set(s.get("implied", []))
    for a in s.get("augment", []):
        own = recorded.get("augment", {}).get(a["name"])
        changed = _changed(a, "augment", own) if len(a) > 1 else ""
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


def base_flow(flow: str) -> str:
    """The flow a row's Δ is taken against: the same flow without its last added augment
    (``mu=0.001 +fedrdn`` -> ``mu=0.001``, ``+flip_rotate +fedrdn`` -> ``+flip_rotate``:
    FedRDN's Table 1 compares a flow with the same algorithm settings and base augmentation
    without it), ``base`` when nothing remains or no augment was added."""
    tokens = flow.split(" ")
    if not tokens[-1].startswith("+"):  # no added augment last: an algorithm variant
        return "base"
    return " ".join(tokens[:-1]) or "base"


def flows_rows(
    summaries: list[dict], metric: str | None = None, reference: str | None = None
) -> tuple[list[str], list[list[str]]]:
    """FedRDN's Table 1/2 shape: one row per (algorithm, flow) with per-client test score
    (%, mean over seeds), the average ± std over seeds, the change against the algorithm's
    base flow (with its direction) and the paired t-test p-value against it (pairs matched by
    seed); with ``reference`` (``ALGO`` or ``ALGO/FLOW``) also the paired t-test p-value
    against that row (FedRDN's appendix B)."""
    groups: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for s in summaries:
        groups[(s["algorithm"], flow_label(s))].append(s)
    ref_key = parse_reference(reference)
    if ref_key is not None and ref_key not in groups:
        have = ", ".join(f"{a}/{f}" for a, f in sorted(groups))
        raise ValueError(f"reference {reference!r} is not among the runs ({have})")

    def by_seed(g: list[dict]) -> dict[int, float]:
        return {s["seed"]: scores(s, metric)["test_mean"] for s in g}

    clients = summaries[0]["clients"]
    header = ["algorithm", "flow", "seeds", *clients, "avg ± std", "Δ vs base", "p vs base"]
    if ref_key is not None:
        header.append(f"p vs {ref_key[0]}/{ref_key[1]}")
    rows = []
    for (algo, flow), g in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1] != "base")):
        seeds = by_seed(g)
        m = mean_std(list(seeds.values()))[0]
        base = groups.get((algo, base_flow(flow))) or groups.get((algo, "base"))
        delta, p = "", ""
        if base and flow != "base":
            base_seeds = by_seed(base)
            delta = _delta(100 * (m - mean_std(list(base_seeds.values()))[0]))
            pv = paired_ttest(seeds, base_seeds)
            p = "" if pv is None else f"{pv:.3f}"
        cells = [
            _fmt(statistics.mean(scores(s, metric)["test_per_client"][c] for s in g))
            for c in clients
        ]
        row = [algo, flow, str(len(g)), *cells, mean_std_cell(list(seeds.values())), delta, p]
        if ref_key is not None:
            pr = ""
            if (algo, flow) != ref_key:
                pv = paired_ttest(seeds, by_seed(groups[ref_key]))
                pr = "" if pv is None else f"{pv:.3f}"
            row.append(pr)
        rows.append(row)
    return header, rows


def flows_table(
    summaries: list[dict], metric: str | None = None, reference: str | None = None
) -> str:
    """:func:`flows_rows` as a plain-text (Markdown) table."""
    return grid(*flows_rows(summaries, metric, reference))


def comm_rows(summaries: list[dict]) -> tuple[list[str], list[list[str]]]:
    """Communication per (algorithm, flow): bytes per client per round (up, down; the setup
    exchange of round 0 excluded and shown apart, per client) next to the model's size."""
    groups: dict[tuple[str, str], dict] = {}
    for s in summaries:
        groups.setdefault((s["algorithm"], flow_label(s)), s)
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


def partition_label(s: dict) -> str:
    """``iid``, ``classes(classes_per_client=6)``... with the run's DH, for column headers."""
    part = s.get("partition") or {"name": "none"}
    changed = _changed(part, "partition") if part.get("name") != "none" else ""
    changed = ",".join(x for x in changed.split(",") if x and not x.startswith("clients="))
    dh = s.get("dh")
    tag = part["name"] + (f"({changed})" if changed else "")
    return f"{tag} DH={dh:.0f}%" if dh is not None else tag


def label_skew_table(summaries: list[dict], reference: str = "fedavg") -> str:
    """DisTrans's Table 1/4 shape: one row per (algorithm, flow), one column per partition
    (with its DH), cells = test accuracy mean ± std over seeds and, in brackets, the paired
    t-test p-value against the ``reference`` algorithm's base flow on the same partition."""
    groups: dict[tuple[str, str, str], dict[int, float]] = defaultdict(dict)
    dhs: dict[str, float] = {}
    for s in summaries:
        col = partition_label(s)
        dhs[col] = s.get("dh") if s.get("dh") is not None else -1.0
        groups[(s["algorithm"], flow_label(s), col)][s["seed"]] = s["test_mean"]
    cols = sorted(dhs, key=lambda c: dhs[c])
    rows_keys = sorted({(a, f) for a, f, _ in groups}, key=lambda k: (k[0] != reference, k))
    rows = []
    for algo, flow in rows_keys:
        cells = []
        for col in cols:
            by_seed = groups.get((algo, flow, col))
            if not by_seed:
                cells.append("")
                continue
            cell = mean_std_cell(list(by_seed.values()))
            ref = groups.get((reference, "base", col))
            if ref and (algo, flow) != (reference, "base"):
                p = paired_ttest(by_seed, ref)
                cell += "" if p is None else f" (p={p:.3f})"
            cells.append(cell)
        rows.append([algo, flow, *cells])
    return grid(["algorithm", "flow", *cols], rows)


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
