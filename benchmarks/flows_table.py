"""Print FedRDN-Table-1-shaped tables from finished runs.

    python benchmarks/flows_table.py runs/table1 [more run roots...] [--md OUT.md]

Every ``summary.json`` below the given folders is read; runs are grouped by (algorithm,
augment flow); per-client test accuracy is averaged over seeds; the average is given as
mean ± std over seeds with its change against the algorithm's base flow and the paired t-test
p-value (pairs matched by seed). Model selection: best mean validation accuracy (never test).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from fedshift.eval.summary import SELECTION_RULE, load_summaries
from fedshift.eval.tables import comm_table, flows_table


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("roots", nargs="+", type=Path)
    ap.add_argument("--md", type=Path, help="also write the table to this Markdown file")
    args = ap.parse_args()
    summaries = load_summaries(args.roots)
    if not summaries:
        print("no summary.json found", file=sys.stderr)
        return 1
    table = flows_table(summaries)
    seeds = len({s["seed"] for s in summaries})
    note = f"Test accuracy (%), {seeds} seeds. Model selection: {SELECTION_RULE}."
    comm = comm_table(summaries)
    print(table)
    print(note)
    print()
    print(comm)
    if args.md:
        args.md.write_text(f"{table}\n\n{note}\n\n{comm}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
