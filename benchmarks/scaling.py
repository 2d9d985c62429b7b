"""Scaling: the same FedAvg work through a hand-written loop, fedshift sequential, fedshift
with a pool of worker processes (``run.workers``) and Flower's simulation engine, in one run.

Two set-ups: 5 clients (``digits``, ``cnn``) and 100 small clients (``fashion-mnist`` split
by a Dirichlet(0.5) partition, ``cnn``). Per set-up and way of running, the seconds per round
of the training loop (local work, aggregation, the last round's evaluation; data loading and
process start-up excluded: the hand-written loop's data is loaded before its clock starts,
fedshift's and Flower's ``wall_s`` counts the round loop only), and fedshift ``--workers 2``'s
speed-up over each other way. The sequential and pooled fedshift runs at one thread must give
identical ``metrics.jsonl`` rows (tolerance 0); the script says whether they do.

    python benchmarks/scaling.py                    # both set-ups, Flower included (~10 min)
    python benchmarks/scaling.py --setups digits --rounds 3 --no-flower

Warm-up: this process runs a one-round fedshift run before anything is timed (imports, the
data cache, oneDNN's kernels for the run's batch shapes, created on first use per shape); the
pool is measured the same way, started and warmed by a one-round run first (a long run pays
this once). The cold row is a pool started by the measured run itself: its first round
creates every worker's kernels (about 1 s per worker on the 100-client set-up).

Threads: the hand-written loop with 1 and with 2 torch threads; fedshift sequential with 1
and 2 (``run.threads``); the pool with 2 workers of 1 thread each; Flower's Ray simulation
with one CPU per client (2 clients at a time on 2 cores) and 1 torch thread per client.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))

from engine_overhead import hand_written_fedavg  # noqa: E402

from fedshift.catalog import resolve  # noqa: E402
from fedshift.core.config import load_config  # noqa: E402
from fedshift.data import load_dataset  # noqa: E402
from fedshift.runtime.pool.transport import WorkerPool  # noqa: E402
from fedshift.runtime.simulation import run_experiment  # noqa: E402

SETUPS = {
    "digits": ["dataset.name=digits"],
    "fashion100": [
        "dataset.name=fashion-mnist",
        "partition.name=dirichlet",
        "partition.clients=100",
        "partition.alpha=0.5",
    ],
}
POOL = "fedshift --workers 2 (1 thread each)"
COLD = "fedshift --workers 2, pool started by the run (cold)"
COMMON = ["model.name=cnn", "algorithm.name=fedavg", "name=scaling", "checkpoint.every=0"]


def config(setup: str, rounds: int, *extra: str):
    over = [*SETUPS[setup], *COMMON, f"train.rounds={rounds}", f"eval.every={rounds}", *extra]
    return resolve(load_config(None, over))


def hand(setup: str, rounds: int, threads: int) -> float:
    """Seconds per round of the hand-written loop (data loaded before the clock starts)."""
    cfg = config(setup, rounds)
    fed = load_dataset(cfg.dataset, cfg.partition)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        _, dt = hand_written_fedavg(cfg, fed)
    finally:
        torch.set_num_threads(before)
    return dt / rounds


def fedshift(
    setup: str, rounds: int, out: Path, workers: int, threads: int, pool=None
) -> tuple[float, str]:
    """Seconds per round of fedshift's round loop, and its metrics.jsonl text; ``pool``: a
    running :class:`WorkerPool` the run uses (else ``workers`` processes started by it)."""
    cfg = config(setup, rounds, f"run.workers={workers}", f"run.threads={threads}")
    res = run_experiment(cfg, run_dir=out, progress=False, pool=pool)
    return res.summary["wall_s"] / rounds, (out / "metrics.jsonl").read_text()


def flower(setup: str, rounds: int, out: Path) -> float:
    """Seconds per round of the same run on Flower's Ray simulation engine."""
    from fedshift.flower.simulate import simulate

    cfg = config(setup, rounds, "run.threads=1")
    res = simulate(cfg, run_dir=out, engine="ray", cpus_per_client=1.0, progress=False)
    return res.summary["wall_s"] / rounds


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--setups", default="digits,fashion100", help="comma-separated")
    ap.add_argument("--rounds", type=int, default=5, help="rounds per measurement")
    ap.add_argument("--no-flower", action="store_true", help="skip Flower's simulation")
    ap.add_argument("--json", help="also write the measurements here")
    args = ap.parse_args()
    results: dict[str, dict[str, float]] = {}
    identical: dict[str, bool] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for setup in args.setups.split(","):
            if setup not in SETUPS:
                raise SystemExit(f"unknown set-up {setup!r}; choose from {', '.join(SETUPS)}")
            r = results[setup] = {}
            t = Path(tmp) / setup
            print(f"{setup}: warm-up...", file=sys.stderr, flush=True)
            fedshift(setup, 1, t / "warm", 1, 1)  # data cache, imports
            for threads in (1, 2):
                label = f"hand-written, {threads} thread{'s' if threads > 1 else ''}"
                print(f"{setup}: {label}...", file=sys.stderr, flush=True)
                r[label] = hand(setup, args.rounds, threads)
            runs = {}
            for label, workers, threads in (
                ("fedshift sequential, 1 thread", 1, 1),
                ("fedshift sequential, 2 threads", 1, 2),
            ):
                print(f"{setup}: {label}...", file=sys.stderr, flush=True)
                out = t / f"w{workers}t{threads}"
                r[label], runs[(workers, threads)] = fedshift(
                    setup, args.rounds, out, workers, threads
                )
            # the pool warmed up as this process was (a one-round run: each worker's data
            # cache and oneDNN's kernels for the run's batch shapes), then measured
            print(f"{setup}: {POOL}...", file=sys.stderr, flush=True)
            with WorkerPool(2) as pool:
                fedshift(setup, 1, t / "warm-pool", 2, 1, pool=pool)
                r[POOL], runs[(2, 1)] = fedshift(setup, args.rounds, t / "w2t1", 2, 1, pool=pool)
            print(f"{setup}: {COLD}...", file=sys.stderr, flush=True)
            r[COLD], _ = fedshift(setup, args.rounds, t / "w2t1-cold", 2, 1)
            identical[setup] = runs[(1, 1)] == runs[(2, 1)]
            if not args.no_flower:
                print(f"{setup}: Flower simulation...", file=sys.stderr, flush=True)
                r["Flower 1.41 simulation (Ray)"] = flower(setup, args.rounds, t / "flower")
    pool = POOL
    print(f"\nseconds per round, {args.rounds} rounds, {torch.get_num_threads()}-thread host\n")
    print("| way of running | " + " | ".join(results) + " |")
    print("|---|" + "---|" * len(results))
    labels = list(dict.fromkeys(k for r in results.values() for k in r))
    for label in labels:
        cells = []
        for r in results.values():
            if label not in r:
                cells.append("-")
                continue
            ratio = r[label] / r[pool]
            cells.append(f"{r[label]:.3f} ({ratio:.2f}x of pool's time)")
        print(f"| {label} | " + " | ".join(cells) + " |")
    for setup, same in identical.items():
        print(f"{setup}: sequential (1 thread) vs --workers 2 metrics.jsonl identical: {same}")
    if args.json:
        Path(args.json).write_text(json.dumps({"per_round_s": results, "identical": identical}))
    return 0 if all(identical.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
