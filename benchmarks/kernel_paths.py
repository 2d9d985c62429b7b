"""The same runs on other CPU kernel paths: how far accuracies move when float sums run in
another order (docs/RESULTS.md, "The same run on other CPU kernel paths").

    python benchmarks/kernel_paths.py [--config configs/demo.yaml] [--out DIR] [key=value ...]

Runs the config's sweep (default: `make demo`, FedAvg and FedBN, seed 0) once per kernel
path: torch's own choice for this CPU, then ``ATEN_CPU_CAPABILITY`` = avx2 and default (the
portable kernels), and with oneDNN (mkldnn) switched off. Prints each run's mean test
accuracy and the largest difference from the first path, as a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

PATHS = [
    ("this CPU's own (torch's choice)", {}, False),
    ("ATEN_CPU_CAPABILITY=avx2", {"ATEN_CPU_CAPABILITY": "avx2"}, False),
    ("ATEN_CPU_CAPABILITY=default (portable)", {"ATEN_CPU_CAPABILITY": "default"}, False),
    ("oneDNN off (torch.backends.mkldnn)", {}, True),
]

RUNNER = (
    "import sys, torch; torch.backends.mkldnn.enabled = False; "
    "from fedshift.cli import main; sys.exit(main(sys.argv[1:]))"
)


def run(config: str, out: Path, env: dict, mkldnn_off: bool, overrides: list[str]) -> dict:
    args = ["run", "-c", config, "--out", str(out), "--jobs", "2", "--quiet", *overrides]
    cmd = (
        [sys.executable, "-c", RUNNER, *args]
        if mkldnn_off
        else [sys.executable, "-m", "fedshift", *args]
    )
    subprocess.run(cmd, env={**os.environ, **env}, check=True, stdout=subprocess.DEVNULL)
    found = {}
    for s in sorted(out.rglob("summary.json")):
        summary = json.loads(s.read_text())
        found[summary["algorithm"]] = (summary["test_mean"], summary["provenance"]["machine"])
    return found


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="configs/demo.yaml")
    ap.add_argument("--out", type=Path, help="keep the runs here (default: a temporary folder)")
    ap.add_argument("overrides", nargs="*")
    a = ap.parse_args()
    root = a.out or Path(tempfile.mkdtemp(prefix="kernel-paths-"))
    rows, first = [], None
    for i, (label, env, off) in enumerate(PATHS):
        found = run(a.config, root / f"path{i}", env, off, a.overrides)
        caps = {m["capability"] for _, m in found.values()}
        scores = {k: v for k, (v, _) in found.items()}
        first = first or scores
        diff = max(abs(scores[k] - first[k]) for k in scores)
        rows.append((label, "/".join(sorted(caps)), scores, diff))
        print(f"{label}: {scores}", file=sys.stderr, flush=True)
    algos = sorted(rows[0][2])
    cpu = next(iter(found.values()))[1]["cpu"]
    print(f"CPU: {cpu}; config: {a.config} {' '.join(a.overrides)}\n")
    print("| kernel path | torch capability | " + " | ".join(algos) + " | largest difference |")
    print("|---|---|" + "---|" * len(algos) + "---|")
    for label, caps, scores, diff in rows:
        cells = " | ".join(f"{100 * scores[k]:.2f}" for k in algos)
        print(f"| {label} | {caps} | {cells} | {100 * diff:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
