"""Fingerprints of what a change must not move: every registered algorithm and augment (and a
few combinations) run for two rounds on tiny synthetic data, hashed (metric rows and the
summary's results), and the cell directory names (config digests) of every shipped suite.

    python benchmarks/fingerprints.py --out before.json            # on the old code
    python benchmarks/fingerprints.py --out after.json --compare before.json

``--compare`` prints every case whose fingerprint differs and every suite whose cells were
renamed, and exits 1 if any did. Runs in-process with one torch thread (bit-for-bit)."""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
TINY = (
    "dataset.name=toyshift",
    "dataset.clients=3",
    "dataset.train_size=12",
    "dataset.val_size=4",
    "dataset.test_size=4",
    "model.name=cnn",
    "model.width=4",
    "train.batch_size=4",
    "train.local_steps=2",
    "train.rounds=2",
    "eval.every=1",
)
#: the summary keys that are results (as tests/conftest.py's RESULT_KEYS)
RESULT_KEYS = (
    "best_round", "val_mean", "test_mean", "test_per_client", "val_per_client",
    "final_test_mean", "models", "metrics", "bytes_up", "bytes_down", "bytes_by_record",
    "bytes_setup", "rounds",
)  # fmt: skip


def cases() -> list[tuple[str, ...]]:
    from fedshift.algorithms import ALGORITHMS
    from fedshift.augment import AUGMENTS

    out = [(f"algorithm.name={a}",) for a in ALGORITHMS.names()]
    out += [("algorithm.name=fedavg", f"augment=[{a}]") for a in AUGMENTS.names()]
    out += [
        ("algorithm.name=scaffold", "federation.sample_fraction=0.67",
         "train.optimizer_state=persist", "train.momentum=0.9"),
        ("algorithm.name=harmofl", "federation.holdout=[client2]"),
        ("algorithm.name=fedbn", "augment=[ffa,mixstyle]"),
        ("algorithm.name=fedprox", "augment=[fedrdn,fedmix]"),
        ("algorithm.name=fedfa", "augment=[fedrdn]"),
        ("algorithm.name=fraug", "algorithm.variant=released"),
    ]  # fmt: skip
    return out


def fingerprint(over: tuple[str, ...], tmp: Path) -> str:
    from fedshift.catalog import resolve
    from fedshift.core.config import load_config
    from fedshift.core.errors import FedshiftError
    from fedshift.runtime.simulation import run_experiment

    try:
        cfg = resolve(load_config(None, [*TINY, *over, "name=fp"]), "fingerprints")
        run_dir = tmp / hashlib.sha256(" ".join(over).encode()).hexdigest()[:12]
        res = run_experiment(cfg, run_dir=run_dir, progress=False)
    except FedshiftError as e:  # a combination a config check refuses: its message
        return "refused: " + str(e).split("\n")[0][:120]
    rows = (run_dir / "metrics.jsonl").read_text()
    results = json.dumps({k: res.summary.get(k) for k in RESULT_KEYS}, sort_keys=True)
    return hashlib.sha256((rows + results).encode()).hexdigest()


def suite_cells() -> dict[str, list[str]]:
    from fedshift.bench import plan

    out = {}
    for suite in [ROOT / "configs/demo.yaml", *sorted((ROOT / "configs/suites").glob("*.yaml"))]:
        try:
            out[suite.name] = [c.run_dir.name for c in plan(suite)]
        except Exception as e:  # noqa: BLE001 - a suite that needs data on disk: its message
            out[suite.name] = [f"error: {type(e).__name__}: {str(e)[:100]}"]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--compare", type=Path, help="an earlier --out file")
    a = ap.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        runs = {" ".join(o): fingerprint(o, Path(tmp)) for o in cases()}
    data = {"runs": runs, "suites": suite_cells()}
    a.out.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    print(f"{len(runs)} run fingerprints, {len(data['suites'])} suites -> {a.out}")
    if not a.compare:
        return 0
    old = json.loads(a.compare.read_text())
    bad = [k for k in old["runs"] if k in runs and old["runs"][k] != runs[k]]
    new = sorted(set(runs) - set(old["runs"]))
    moved = [
        s for s in old["suites"] if s in data["suites"] and old["suites"][s] != data["suites"][s]
    ]
    for k in bad:
        print(f"DIFFERS  {k}: {old['runs'][k][:16]} -> {runs[k][:16]}")
    for s in moved:
        gone = sorted(set(old["suites"][s]) - set(data["suites"][s]))
        added = sorted(set(data["suites"][s]) - set(old["suites"][s]))
        print(f"CHANGED  {s}: {len(gone)} cells gone {gone[:4]}, {len(added)} new")
    print(
        f"{len(runs) - len(bad) - len(new)} identical, {len(bad)} differ, {len(new)} new cases; "
        f"{len(data['suites']) - len(moved)} suites identical, {len(moved)} renamed"
    )
    return 1 if bad or moved else 0


if __name__ == "__main__":
    sys.exit(main())
