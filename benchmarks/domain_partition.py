"""The client x domain shares of ``partition.name=domains`` (Bai et al., arXiv 2307.04942)
for a dataset's real domain sizes: one panel per ``lam``, a stacked bar per client of its
training examples from each domain, and the count tables on stdout.

    python benchmarks/domain_partition.py                      # digits, 10 clients
    python benchmarks/domain_partition.py --dataset brain-mri --clients 8 \\
        --out docs/img/domain-partition-brain.png

The counts are the partition's own (:func:`fedshift.data.domain_partition.domain_counts` on
each domain's number of training examples), so the figure shows exactly what a run with
``partition.name=domains partition.clients=N partition.lam=L`` trains on.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from fedshift.data import load_dataset
from fedshift.data.common.sites import numbered_clients
from fedshift.data.domain_partition import domain_counts
from fedshift.shift.figures import domain_mix_figure


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", default="digits")
    p.add_argument("--clients", type=int, default=10)
    p.add_argument("--lam", type=float, nargs="+", default=[0.0, 0.1, 0.5, 1.0])
    p.add_argument("--out", default="docs/img/domain-partition.png")
    args = p.parse_args(argv)

    fed = load_dataset({"name": args.dataset})
    domains = fed.client_names
    sizes = [len(c.train) for c in fed.clients]
    names = numbered_clients(args.clients)
    panels: dict[str, dict[str, dict[str, int]]] = {}
    for lam in args.lam:
        counts = domain_counts(sizes, args.clients, lam)
        panels[f"lam = {lam:g}"] = {
            c: {d: int(counts[i, j]) for j, d in enumerate(domains)} for i, c in enumerate(names)
        }
        print(f"lam = {lam:g}: training examples per client (rows) and domain (columns)")
        print("| client | " + " | ".join(domains) + " | total |")
        print("|---" * (len(domains) + 2) + "|")
        for i, c in enumerate(names):
            row = [str(int(v)) for v in counts[i]]
            print(f"| {c} | " + " | ".join(row) + f" | {int(counts[i].sum())} |")
        print()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    domain_mix_figure(
        panels,
        out,
        f"{args.dataset}: {args.clients} clients from {len(domains)} domains "
        "(partition.name=domains, Bai et al.)",
    )
    print(f"figure: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
