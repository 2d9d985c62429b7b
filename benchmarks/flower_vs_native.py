"""The same run natively and on Flower's simulation engine: equal numbers, and the wall-clock.

    python benchmarks/flower_vs_native.py [-c CONFIG] [key=value ...] [--engines ray in-process]

Runs the config with `fedshift run`'s engine, then with `fedshift flower simulate` on each
engine, checks that the metric rows and the ledger are identical (tolerance 0), and prints the
wall-clock of each and its ratio to native. Wall-clock = the whole call (data loading, Ray
start-up, writing the run folder), measured here, not the summary's `wall_s`.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

import torch

from fedshift.catalog import resolve
from fedshift.core.config import load_config
from fedshift.flower.simulate import simulate
from fedshift.runtime.simulation import run_experiment


def rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def max_abs_diff(a: list[dict], b: list[dict]) -> float:
    """Largest absolute difference between two metric-row lists (inf if shapes differ)."""
    if len(a) != len(b):
        return float("inf")
    worst = 0.0
    for x, y in zip(a, b, strict=True):
        for kind in ("global", "personal"):
            if (kind in x) != (kind in y):
                return float("inf")
            for k, v in x.get(kind, {}).items():
                worst = max(worst, abs(v - y[kind][k]))
    return worst


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("-c", "--config")
    p.add_argument("overrides", nargs="*")
    p.add_argument("--engines", nargs="+", default=["ray", "in-process"])
    p.add_argument("--threads", type=int, default=1, help="torch threads (native and in-process)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    cfg = resolve(load_config(args.config, args.overrides), args.config or "defaults")
    tmp = Path(tempfile.mkdtemp(prefix="flower-vs-native-"))
    try:
        # warm-up (imports, first-op initialisation, the data in the page cache), untimed
        warm = resolve(load_config(args.config, [*args.overrides, "train.rounds=1"]), "warm-up")
        run_experiment(warm, run_dir=tmp / "warm-up", progress=False)
        t0 = time.perf_counter()
        native = run_experiment(cfg, run_dir=tmp / "native", progress=False)
        t_native = time.perf_counter() - t0
        ref = rows(native.run_dir)
        ledger = json.loads((native.run_dir / "ledger.json").read_text())
        metric = native.summary["metric"]
        print(f"config: {args.config or 'defaults'} {' '.join(args.overrides)}")
        print(f"{'engine':<22}{'wall s':>9}{'ratio':>8}{'test ' + metric:>12}{'max |diff|':>12}"
              f"{'ledger':>8}")  # fmt: skip
        print(f"{'native':<22}{t_native:9.1f}{1.0:8.2f}{100 * native.summary['test_mean']:12.2f}"
              f"{0.0:12.1e}{'-':>8}")  # fmt: skip
        for engine in args.engines:
            t0 = time.perf_counter()
            res = simulate(cfg, run_dir=tmp / engine, engine=engine, progress=False)
            wall = time.perf_counter() - t0
            diff = max_abs_diff(ref, rows(res.run_dir))
            same = json.loads((res.run_dir / "ledger.json").read_text()) == ledger
            print(f"{'flower ' + engine:<22}{wall:9.1f}{wall / t_native:8.2f}"
                  f"{100 * res.summary['test_mean']:12.2f}{diff:12.1e}"
                  f"{'equal' if same else 'DIFF':>8}")  # fmt: skip
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
