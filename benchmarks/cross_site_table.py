"""FedRDN's Table 3 from `fedshift protocol cross-site` outputs: one row per flow, over seeds.

Reads every ``cross-site.json`` under the given folders, groups them by flow (the run's
augment list) and seed, and prints, per flow, the mean diagonal (own data) and off-diagonal
(other clients' data) score with its std over seeds, the paired t-test of the off-diagonal
means against the reference flow, and in how many (source, target) pairs the flow's
seed-averaged score beats the reference's. ``--png`` also draws the seed-averaged matrices
side by side.

    for d in runs/fedrdn_table3_digits/*/; do
      fedshift protocol cross-site "$d" --kind local --out "protocol-cross-site/$(basename "$d")"
    done
    python benchmarks/cross_site_table.py protocol-cross-site --reference base --png xsite.png
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path

from fedshift.eval.stats import mean_std, paired_ttest
from fedshift.eval.tables import grid


def load(roots: list[str]) -> tuple[dict[str, dict[int, dict]], list[str]]:
    by: dict[str, dict[int, dict]] = {}
    clients: list[str] = []
    for root in roots:
        for f in sorted(Path(root).rglob("cross-site.json")):
            d = json.loads(f.read_text())
            m = re.search(r"seed(\d+)", Path(d["run_dir"]).name)
            if m is None:
                sys.exit(f"{f}: cannot read the seed from run_dir {d['run_dir']!r}")
            flow = f"{d['algorithm']}/{d['flow'] or 'base'}"
            by.setdefault(flow, {})[int(m.group(1))] = d
            clients = d["clients"]
    if not by:
        sys.exit(f"no cross-site.json under {', '.join(roots)}")
    return by, clients


def mean_matrix(runs: dict[int, dict]) -> list[list[float]]:
    mats = [r["matrices"][r["metric"]] for r in runs.values()]
    n = len(mats[0])
    return [[100 * statistics.fmean(m[i][j] for m in mats) for j in range(n)] for i in range(n)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("roots", nargs="+", help="folders holding cross-site outputs")
    ap.add_argument("--reference", default="base", help="flow (or ALGO/FLOW) to test against")
    ap.add_argument("--png", help="also draw the seed-averaged matrices to this file")
    args = ap.parse_args()
    by, clients = load(args.roots)
    ref = next((k for k in by if k == args.reference or k.endswith("/" + args.reference)), None)
    if ref is None:
        sys.exit(f"--reference {args.reference!r} is not among the flows: {', '.join(by)}")

    def stat(runs: dict[int, dict], key: str) -> dict[int, float]:
        return {s: 100 * r["stats"][r["metric"]][key] for s, r in runs.items()}

    ref_off = stat(by[ref], "off_diagonal_mean")
    ref_mat = mean_matrix(by[ref])
    n = len(clients)
    rows = []
    for flow in sorted(by):
        off, diag = stat(by[flow], "off_diagonal_mean"), stat(by[flow], "diagonal_mean")
        mean, sd = mean_std(list(off.values()))
        pv = None if flow == ref else paired_ttest(off, ref_off)
        p = "" if pv is None else f"{pv:.3f}"
        mat = mean_matrix(by[flow])
        wins = sum(mat[i][j] > ref_mat[i][j] for i in range(n) for j in range(n) if i != j)
        rows.append(
            [
                flow,
                str(len(off)),
                f"{statistics.fmean(diag.values()):.2f}",
                f"{mean:.2f} ± {sd:.2f}",
                p,
                "" if flow == ref else f"{wins}/{n * (n - 1)}",
            ]
        )
    header = ["flow", "seeds", "own data", "other clients' data", f"p vs {ref}", "pairs won"]
    print(grid(header, rows))
    print(
        "\nLocal models' test accuracy (%): own data = diagonal mean, other clients' data = "
        "off-diagonal mean (std over seeds); p: paired t-test of the off-diagonal means; pairs "
        f"won: (source, target) pairs where the seed-averaged score beats {ref}'s."
    )
    if args.png:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        flows = sorted(by)
        fig, axes = plt.subplots(
            1, len(flows), figsize=(3.6 * len(flows), 4.0), layout="constrained"
        )
        for ax, flow in zip(list(getattr(axes, "flat", [axes])), flows, strict=True):
            mat = mean_matrix(by[flow])
            ax.imshow(mat, vmin=0, vmax=100, cmap="viridis")
            for i in range(n):
                for j in range(n):
                    colour = "white" if mat[i][j] < 60 else "black"
                    ax.text(
                        j, i, f"{mat[i][j]:.0f}", ha="center", va="center", fontsize=8, color=colour
                    )
            ax.set_xticks(range(n), clients, rotation=45, ha="right", fontsize=8)
            ax.set_yticks(range(n), clients, fontsize=8)
            off_mean = statistics.fmean(stat(by[flow], "off_diagonal_mean").values())
            ax.set_title(f"{flow}\noff-diagonal mean {off_mean:.1f}", fontsize=9)
        fig.supxlabel("test data of client", fontsize=9)
        fig.supylabel("local model of client", fontsize=9)
        fig.savefig(args.png, dpi=130)
        print(f"png: {args.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
