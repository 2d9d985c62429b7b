"""Print a DisTrans-Table-shaped grid from finished runs: algorithms x partitions (with DH).

    python benchmarks/label_skew_table.py runs/distrans_dh [--reference fedavg] [--md OUT.md]

Every ``summary.json`` below the given folders is read. Cells: test accuracy (%) mean ± std
over seeds of each run's primary model (personalised where the algorithm has one), and the
paired t-test p-value against the reference algorithm on the same partition (pairs matched by
seed). Model selection: best mean validation accuracy (never test).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from fedshift.eval.label_skew import label_skew_table
from fedshift.eval.summary import SELECTION_RULE, load_summaries


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("roots", nargs="+", type=Path)
    ap.add_argument("--reference", default="fedavg")
    ap.add_argument("--md", type=Path, help="also write the table to this Markdown file")
    args = ap.parse_args()
    summaries = load_summaries(args.roots)
    if not summaries:
        print("no summary.json found", file=sys.stderr)
        return 1
    table = label_skew_table(summaries, args.reference)
    kinds = sorted({f"{s['algorithm']}: {s['evaluated_model']}" for s in summaries})
    note = (
        f"Test accuracy (%), mean ± std over {len({s['seed'] for s in summaries})} seeds; "
        f"p: paired t-test vs {args.reference}. Evaluated model: {', '.join(kinds)}. "
        f"Model selection: {SELECTION_RULE}."
    )
    print(table)
    print(note)
    if args.md:
        args.md.write_text(f"{table}\n\n{note}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
