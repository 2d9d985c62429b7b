"""DisTrans's label-skew tables (Table 1/4 shape): one column per partition with its DH
(the share of the label distribution that differs between clients), and the partition's
label in report sections."""

from __future__ import annotations

from collections import defaultdict

from fedshift.eval.stats import paired_ttest
from fedshift.eval.tables import changed_text, grid, group_flows, mean_std_cell


def partition_label(s: dict) -> str:
    """``iid``, ``classes(classes_per_client=6)``... with the run's DH, for column headers."""
    part = s.get("partition") or {"name": "none"}
    changed = changed_text(part, "partition") if part.get("name") != "none" else ""
    changed = ",".join(x for x in changed.split(",") if x and not x.startswith("clients="))
    dh = s.get("dh")
    tag = part["name"] + (f"({changed})" if changed else "")
    return f"{tag} DH={dh:.0f}%" if dh is not None else tag


def label_skew_table(summaries: list[dict], reference: str = "fedavg") -> str:
    """DisTrans's Table 1/4 shape: one row per flow (:func:`group_flows`, the partition
    apart), one column per partition
    (with its DH), cells = test accuracy mean ± std over seeds and, in brackets, the paired
    t-test p-value against the ``reference`` algorithm's base flow on the same partition."""
    groups: dict[tuple[str, str, str], dict[int, float]] = defaultdict(dict)
    dhs: dict[str, float] = {}
    for flow, runs in group_flows(summaries, shown=("partition",)).items():
        for s in runs:
            col = partition_label(s)
            dhs[col] = s.get("dh") if s.get("dh") is not None else -1.0
            groups[(flow.algorithm, flow.label, col)][s["seed"]] = s["test_mean"]
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
