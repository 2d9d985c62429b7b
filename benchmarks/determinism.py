"""Determinism and kill/resume check through the real command line.

Runs the same config twice, and a third time killed with SIGKILL once its first checkpoint is
on disk, then resumed with ``fedshift run --resume``. Prints whether the metrics of the three
``summary.json`` files (everything but wall time and the run directory) and the three
``metrics.jsonl`` files are identical.

    python benchmarks/determinism.py                      # FedBN on digits, 12 rounds
    python benchmarks/determinism.py algorithm.name=scaffold train.rounds=8
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DEFAULTS = [
    "algorithm.name=fedbn",
    "train.rounds=12",
    "checkpoint.every=4",
    "train.momentum=0.5",
    "train.optimizer_state=persist",
    "name=det",
]
#: summary keys that describe the process, not the results: wall time, where and when it ran
#: (provenance: host, command line, start and end time, resumed_from)
VOLATILE = {"wall_s", "run_dir", "provenance"}


def fedshift(*args: str) -> list[str]:
    return [sys.executable, "-m", "fedshift.cli", *args]


def run(out: Path, overrides: list[str]) -> Path:
    subprocess.run(
        fedshift("run", *overrides, "--out", str(out), "--quiet"),
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return next((out / "det").iterdir())


def killed_then_resumed(out: Path, overrides: list[str]) -> tuple[Path, int]:
    proc = subprocess.Popen(
        fedshift("run", *overrides, "--out", str(out), "--quiet"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    run_dir = None
    while proc.poll() is None:
        hits = list(out.glob("det/*/checkpoint.pt"))
        if hits:
            run_dir = hits[0].parent
            time.sleep(1.0)  # let it get into the next rounds, then kill it hard
            os.kill(proc.pid, signal.SIGKILL)
            break
        time.sleep(0.05)
    proc.wait()
    if run_dir is None or proc.returncode != -signal.SIGKILL:
        raise SystemExit("the run finished before it could be killed; use more rounds")
    rows_at_kill = len((run_dir / "metrics.jsonl").read_text().splitlines())
    subprocess.run(
        fedshift("run", "--resume", str(run_dir), "--quiet"), check=True, stdout=subprocess.DEVNULL
    )
    return run_dir, rows_at_kill


def metrics(run_dir: Path) -> tuple[dict, str]:
    s = json.loads((run_dir / "summary.json").read_text())
    return {k: v for k, v in s.items() if k not in VOLATILE}, (
        run_dir / "metrics.jsonl"
    ).read_text()


def main() -> int:
    overrides = [*DEFAULTS, *sys.argv[1:]]
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        a = metrics(run(t / "a", overrides))
        b = metrics(run(t / "b", overrides))
        c_dir, rows_at_kill = killed_then_resumed(t / "c", overrides)
        c = metrics(c_dir)
    print(f"config: {' '.join(overrides)}")
    print(f"killed with SIGKILL after {rows_at_kill} metric rows had been written, then resumed")
    print(
        f"run 1 vs run 2 identical summary metrics: {a[0] == b[0]}; metrics.jsonl: {a[1] == b[1]}"
    )
    print(
        f"run 1 vs killed+resumed summary metrics:  {a[0] == c[0]}; metrics.jsonl: {a[1] == c[1]}"
    )
    print(f"test_mean: {a[0]['test_mean']:.6f} / {b[0]['test_mean']:.6f} / {c[0]['test_mean']:.6f}")
    ok = a == b and a == c
    print("DETERMINISTIC" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
