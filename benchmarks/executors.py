"""The vectorised executor against the sequential one: seconds per round and the largest
metric difference, for many small clients on one device.

The same FedAvg run (``fashion-mnist`` split by a Dirichlet(0.5) partition into N clients,
``cnn``) with ``run.executor=sequential`` and ``run.executor=vmap`` on ``--device`` (default
``auto``: the GPU when there is one). vmap is meant for a GPU; on a CPU it is expected to be
slower, which is why it is never a default there.

    python benchmarks/executors.py                       # 10, 50, 100 clients, 3 rounds
    python benchmarks/executors.py --clients 100 --device cuda --rounds 5
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch

from fedshift.catalog import resolve
from fedshift.core.config import load_config
from fedshift.data import load_dataset
from fedshift.runtime.simulation import run_experiment


def config(clients: int, rounds: int, device: str, executor: str, train_size: int = 6000):
    return resolve(
        load_config(
            None,
            [
                "dataset.name=fashion-mnist",
                f"dataset.train_size={train_size}",
                "partition.name=dirichlet",
                f"partition.clients={clients}",
                "partition.alpha=0.5",
                "model.name=cnn",
                "algorithm.name=fedavg",
                "name=executors",
                "checkpoint.every=0",
                f"train.rounds={rounds}",
                f"eval.every={rounds}",
                f"device={device}",
                f"run.executor={executor}",
            ],
        )
    )


def largest_difference(a: Path, b: Path) -> float:
    """The largest absolute difference between two runs' numeric metric values."""
    rows = [
        [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()]
        for d in (a, b)
    ]
    worst = 0.0
    for ra, rb in zip(*rows, strict=True):
        for k, v in ra.items():
            if isinstance(v, float) and isinstance(rb.get(k), float):
                worst = max(worst, abs(v - rb[k]))
    return worst


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--clients", default="10,50,100", help="comma-separated client counts")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--device", default="auto")
    ap.add_argument(
        "--train-size", type=int, default=6000, help="Fashion-MNIST training examples in all"
    )
    ap.add_argument("--json", help="also write the measurements here")
    args = ap.parse_args()
    torch.set_num_threads(1)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in (int(c) for c in args.clients.split(",")):
            secs, dirs = {}, {}
            base = config(n, 1, "cpu", "sequential", args.train_size)
            fed = load_dataset(base.dataset, base.partition)
            for ex in ("sequential", "vmap"):
                print(f"{n} clients: {ex}...", file=sys.stderr, flush=True)
                cfg = config(n, 1, args.device, ex, args.train_size)
                run_experiment(cfg, Path(tmp) / f"warm{n}{ex}", federation=fed, progress=False)
                cfg = config(n, args.rounds, args.device, ex, args.train_size)
                dirs[ex] = Path(tmp) / f"{n}{ex}"
                res = run_experiment(cfg, run_dir=dirs[ex], federation=fed, progress=False)
                secs[ex] = res.summary["wall_s"] / args.rounds
                device = res.summary["runtime"]["device"]
            diff = largest_difference(dirs["sequential"], dirs["vmap"])
            rows.append(
                {"clients": n, "device": device, **secs, "speedup": secs["sequential"] /
                 secs["vmap"], "max_metric_diff": diff}
            )  # fmt: skip
    print(
        f"\nseconds per round, {args.rounds} rounds, FedAvg, cnn, fashion-mnist "
        f"({args.train_size} training examples) Dirichlet(0.5)\n"
    )
    print("| clients | device | sequential | vmap | vmap speed-up | largest metric difference |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['clients']} | {r['device']} | {r['sequential']:.3f} | {r['vmap']:.3f} | "
            f"{r['speedup']:.2f}x | {r['max_metric_diff']:.2e} |"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
