"""Engine overhead: the same FedAvg work through fedshift and through a minimal hand-written
PyTorch loop, timed in one process, alternating, after a warm-up.

Both do, per round and client: load the global weights, one local epoch of SGD over the same
mini-batches (same derived seeds, so the same permutations), copy the weights out; then a
sample-weighted average; and at the end an evaluation of every client's val and test split.
fedshift additionally runs its ledger, non-finite checks, metrics file, checkpoint, summary and
convergence plot: that is the overhead measured. The script also reports how far the two
final models are apart (they should agree to float rounding).

    python benchmarks/engine_overhead.py                # digits, cnn, 8 rounds, 5 repeats
    python benchmarks/engine_overhead.py --dataset toyshift --rounds 3 --repeats 1
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from fedshift.catalog import resolve
from fedshift.core.config import load_config
from fedshift.core.context import Normalize
from fedshift.core.seeding import generator, seed_global
from fedshift.data import load_dataset
from fedshift.models import build_model
from fedshift.runtime.rundir.checkpoint_io import read_checkpoint
from fedshift.runtime.simulation import run_experiment


def hand_written_fedavg(cfg, fed) -> tuple[dict, float]:
    """FedAvg as one would write it by hand: a plain loop over rounds, clients, batches."""
    t0 = time.perf_counter()
    seed_global(cfg.seed, "init")
    model = build_model(cfg.model, fed.num_classes, fed.input_shape)
    norm = Normalize(cfg.input, fed.input_shape[0], torch.device("cpu"))
    global_w = {k: v.clone() for k, v in model.state_dict().items()}
    bs = cfg.train.batch_size
    for rnd in range(1, cfg.train.rounds + 1):
        results = []
        for c in fed.clients:
            model.load_state_dict(global_w)
            model.train()
            opt = torch.optim.SGD(model.parameters(), lr=cfg.train.lr)
            g = generator(cfg.seed, "batches", rnd, c.name)
            x_all, y_all = c.train.x, c.train.y
            n = len(y_all)
            perm = torch.randperm(n, generator=g)
            for s in range(0, n, bs):
                idx = perm[s : s + bs]
                if idx.numel() < 2:
                    continue
                opt.zero_grad(set_to_none=True)
                loss = F.cross_entropy(model(norm(x_all[idx])), y_all[idx])
                loss.backward()
                opt.step()
            results.append((n, {k: v.detach().clone() for k, v in model.state_dict().items()}))
        total = sum(n for n, _ in results)
        new = {}
        for k, ref in global_w.items():
            acc = torch.zeros(
                ref.shape, dtype=ref.dtype if ref.is_floating_point() else torch.float64
            )
            for n, w in results:
                acc.add_(w[k].to(acc.dtype), alpha=n / total)
            new[k] = acc if ref.is_floating_point() else acc.round().to(ref.dtype)
        global_w = new
    model.load_state_dict(global_w)
    model.eval()
    accs = {}
    with torch.no_grad():
        for c in fed.clients:
            for split in ("val", "test"):
                sp = c.split(split)
                correct = 0
                for s in range(0, len(sp), cfg.eval.batch_size):
                    out = model(norm(sp.x[s : s + cfg.eval.batch_size]))
                    correct += int((out.argmax(1) == sp.y[s : s + cfg.eval.batch_size]).sum())
                accs[(c.name, split)] = correct / len(sp)
    return {"weights": global_w, "accs": accs}, time.perf_counter() - t0


def fedshift_fedavg(cfg, fed, out: Path) -> tuple[dict, float]:
    t0 = time.perf_counter()
    res = run_experiment(cfg, run_dir=out, federation=fed, progress=False)
    dt = time.perf_counter() - t0
    w = read_checkpoint(out / "checkpoint.pt")["server"]["weights"]
    return {"weights": w, "summary": res.summary}, dt


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dataset", default="digits")
    ap.add_argument("--model", default="cnn")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    over = [
        f"dataset.name={args.dataset}",
        f"model.name={args.model}",
        "algorithm.name=fedavg",
        f"train.rounds={args.rounds}",
        f"eval.every={args.rounds}",
        "name=overhead",
        # the same torch threads as the hand-written loop (fedshift sets run.threads, default 1)
        f"run.threads={torch.get_num_threads()}",
    ]
    cfg = resolve(load_config(None, over))
    fed = load_dataset(cfg.dataset)
    print(
        f"threads={torch.get_num_threads()} dataset={args.dataset} model={args.model} "
        f"rounds={args.rounds} clients={len(fed.clients)}",
        flush=True,
    )
    with tempfile.TemporaryDirectory() as tmp:
        warm = resolve(load_config(None, [*over[:3], "train.rounds=1", "eval.every=1", over[-1]]))
        hand_written_fedavg(warm, fed)
        fedshift_fedavg(warm, fed, Path(tmp) / "warm")
        t_hand, t_fs = [], []
        for i in range(args.repeats):
            h, dt_h = hand_written_fedavg(cfg, fed)
            f, dt_f = fedshift_fedavg(cfg, fed, Path(tmp) / f"r{i}")
            t_hand.append(dt_h)
            t_fs.append(dt_f)
            print(
                f"repeat {i + 1}: hand-written {dt_h:.2f} s, fedshift {dt_f:.2f} s, "
                f"ratio {dt_f / dt_h:.3f}",
                flush=True,
            )
    diff = max(
        float((h["weights"][k].float() - f["weights"][k].float()).abs().max()) for k in h["weights"]
    )
    hand_test = statistics.mean(v for (_, s), v in h["accs"].items() if s == "test")
    print(
        f"max |w_fedshift - w_hand| = {diff:.2e}; mean test acc: fedshift "
        f"{f['summary']['final_test_mean']:.4f}, hand-written {hand_test:.4f}"
    )
    # Timings on a shared 2-core machine jitter by several percent between repeats; the
    # minimum is each side's least-disturbed run, the paired median is robust to outliers.
    paired = statistics.median(f / h for f, h in zip(t_fs, t_hand, strict=True))
    print(
        f"min: hand-written {min(t_hand):.2f} s, fedshift {min(t_fs):.2f} s; "
        f"median of paired ratios {paired:.3f}"
    )
    print(f"ratio of minimum times = {min(t_fs) / min(t_hand):.3f}")
    print(f"overhead ratio fedshift/hand-written = {paired:.3f} (median of paired repeats)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
