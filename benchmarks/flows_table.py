"""Print FedRDN-Table-1-shaped tables from finished runs.

    python benchmarks/flows_table.py runs/table1 [more run roots...] [--md OUT.md]
                                     [--reference fedavg/+fedrdn] [--by KEY]

Every ``summary.json`` below the given folders is read; runs are grouped into flows (the runs
of one config over seeds, :func:`fedshift.eval.tables.group_flows`, as ``fedshift report``
does: runs that differ in any other key are rows of their own, labelled with the keys);
per-client test scores are averaged over the row's seeds; the average is given as
mean ± std over seeds with its change against the algorithm's base flow and the paired t-test
p-value (pairs matched by seed). Model selection: best mean validation primary metric (never
test). ``--by federation.data_fraction`` (any dotted config key) gives one table per value of
that key, read from each run's ``config.yaml``. Segmentation runs get two tables, each
labelled: foreground Dice (the selection metric) and mean Dice including background (the
number FedFA's and HarmoFL's code report).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from fedshift.core.config_tree import lookup
from fedshift.eval.summary import load_summaries, selection_rule
from fedshift.eval.tables import comm_table, flows_table, metric_caption, run_config


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("roots", nargs="+", type=Path)
    ap.add_argument("--md", type=Path, help="also write the table to this Markdown file")
    ap.add_argument(
        "--reference",
        help="ALGO or ALGO/FLOW: add the paired t-test p-value of every row against that row "
        "(FedRDN's Tables 7-8: e.g. 'fedavg/+fedrdn')",
    )
    ap.add_argument(
        "--by",
        help="dotted config key: one table per value (e.g. federation.data_fraction)",
    )
    args = ap.parse_args()
    summaries = load_summaries(args.roots)
    if not summaries:
        print("no summary.json found", file=sys.stderr)
        return 1
    if not args.by:
        text = tables(summaries, args.reference)
    else:
        groups: dict[str, list[dict]] = {}
        for s in summaries:
            groups.setdefault(str(lookup(run_config(s) or {}, args.by)), []).append(s)
        text = "\n\n".join(
            f"### {args.by} = {value}\n\n{tables(group, args.reference)}"
            for value, group in sorted(groups.items())
        )
    print(text)
    if args.md:
        args.md.write_text(text + "\n")
    return 0


def tables(summaries: list[dict], reference: str | None) -> str:
    """The flows table of every metric (captioned) and the communication table."""
    seeds = len({s["seed"] for s in summaries})
    first = summaries[0]
    rule = selection_rule(first.get("metric_label", "accuracy"))
    parts = []
    for metric in [None, *first.get("metrics", {})]:
        table = flows_table(summaries, metric, reference)
        shown = "" if metric is None else " (taken at the round selected as stated)"
        caption = metric_caption(summaries, metric)
        note = f"{caption}, {seeds} seeds{shown}. Model selection: {rule}."
        parts.append(f"{table}\n{note}")
    parts.append(comm_table(summaries))
    return "\n\n".join(parts)


if __name__ == "__main__":
    sys.exit(main())
