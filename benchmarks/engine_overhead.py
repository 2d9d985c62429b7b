"""Engine overhead: the same FedAvg work through fedshift and through a minimal hand-written
PyTorch loop, timed in one process, alternating, after a warm-up.

Both do, per round and client: load the global weights, one local epoch of SGD over the same
mini-batches (same derived seeds, so the same permutations), copy the weights out; then a
sample-weighted average; and at the end an evaluation of every client's val and test split.
fedshift additionally runs its ledger, non-finite checks, metrics file, checkpoint, summary and
convergence plot: that is the overhead measured. The script also reports how far the two
final models are apart (they should agree to float rounding).

Each repeat times both sides in wall-clock seconds and in CPU seconds (every thread of this
process and the child processes it waited for; not the time it waited for a core). On a
machine other processes load, the wall ratio moves by several percent between repeats; the
CPU ratio much less (it still moves with cache and memory-bandwidth contention, and with
``--threads`` above 1 it counts the threads' spin-waits too, so ``--threads 1`` is the steady
figure there). The headline figures are the medians of the paired (same repeat) ratios.

    python benchmarks/engine_overhead.py                # digits, cnn, 8 rounds, 3 repeats
    python benchmarks/engine_overhead.py --threads 1    # steadier CPU figure on a loaded machine
    python benchmarks/engine_overhead.py --profile /tmp/fs.prof   # + one profiled fedshift run
    python benchmarks/engine_overhead.py --dataset toyshift --rounds 3 --repeats 1

``--profile`` runs fedshift once more under cProfile after the timed repeats, writes the
stats to the file (``python -m pstats FILE``) and prints where the run's time went beyond
the training and the evaluation both sides do (:func:`breakdown`).
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
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


def cpu_seconds() -> float:
    """CPU seconds of this process (every thread) and of its children it waited for (the
    ``git`` calls of a run's provenance)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def cpu_timed(fn, *args) -> tuple[dict, float, float]:
    """``fn(*args)``'s result, its wall seconds (as ``fn`` measured them) and the CPU seconds
    the call took (:func:`cpu_seconds`)."""
    c0 = cpu_seconds()
    out, wall = fn(*args)
    return out, wall, cpu_seconds() - c0


#: where a fedshift run's time goes, by function: (label, module, function), ``f<-g``: ``f``
#: where ``g`` calls it. The first group is work the hand-written loop does too; the rest is
#: what only fedshift does.
SHARED = (
    ("local training (SGD steps)", "fedshift/algorithms/base.py", "local_train"),
    ("load weights into the model", "fedshift/algorithms/base.py", "load_client_model"),
    ("copy the trained weights out", "fedshift/algorithms/base.py", "reply"),
    ("aggregation (weighted mean)", "fedshift/augment/compose.py", "aggregate"),
    ("evaluation", "fedshift/runtime/loop.py", "evaluate_round"),
)
ENGINE = (
    ("run set-up (experiment, model, client state)", "fedshift/runtime/simulation.py", "__init__"),
    ("undo copy of the server state", "copy.py", "deepcopy<-train_rounds"),
    ("undo copies of the sampled clients' state", "fedshift/runtime/native.py", "begin_round"),
    ("reply checks (non-finite)", "fedshift/runtime/client.py", "check_reply"),
    ("ledger", "fedshift/core/payload.py", "record"),
    (
        "hooks per round (round line, progress)",
        "fedshift/runtime/hooks.py",
        "log_round<-train_rounds",
    ),
    (
        "hooks per evaluation (metrics.jsonl, selected.pt)",
        "fedshift/runtime/hooks.py",
        "evaluated<-_commit",
    ),
    ("checkpoint.pt", "fedshift/runtime/loop.py", "save_checkpoint"),
    ("convergence.png", "fedshift/eval/plots.py", "plot_convergence"),
    ("summary.json, ledger.json", "fedshift/core/files.py", "write_text_atomic<-end"),
    ("summary (selection, tables)", "fedshift/runtime/lifecycle.py", "run_record"),
    ("config.yaml", "fedshift/core/config.py", "dump_config"),
    ("provenance (versions, git)", "fedshift/runtime/tracking/trackers.py", "provenance"),
    ("hooks opening (metrics.jsonl, progress bar)", "fedshift/runtime/hooks.py", "open<-_run"),
)


def breakdown(stats: pstats.Stats) -> list[tuple[str, float]]:
    """(label, cumulative seconds) of :data:`SHARED` and :data:`ENGINE` in a profile of one
    fedshift run, then the whole run and what no label covers. A function listed that the
    code no longer has reads 0."""
    raw = stats.stats  # type: ignore[attr-defined]
    total = max(ct for (_, _, name), (_, _, _, ct, _) in raw.items() if name == "run_experiment")

    def cum(module: str, name: str) -> float:
        name, _, caller = name.partition("<-")
        out = 0.0
        for (f, _, n), (_, _, _, ct, callers) in raw.items():
            if n != name or not f.replace("\\", "/").endswith(module):
                continue
            out += ct if not caller else sum(c[3] for k, c in callers.items() if k[2] == caller)
        return out

    rows = [(label, cum(m, n)) for label, m, n in (*SHARED, *ENGINE)]
    return [*rows, ("other", total - sum(t for _, t in rows)), ("the whole run", total)]


def profile_run(cfg, fed, out: Path, path: Path) -> None:
    """One more fedshift run under cProfile: the stats to ``path``, the breakdown printed."""
    prof = cProfile.Profile()
    prof.enable()
    fedshift_fedavg(cfg, fed, out)
    prof.disable()
    prof.dump_stats(path)
    rows = breakdown(pstats.Stats(str(path)))
    print(f"profile of one fedshift run ({path}; cProfile inflates Python-heavy code):")
    for i, (label, t) in enumerate(rows):
        if i == len(SHARED):
            print("  fedshift only:")
        print(f"  {label:<52} {t:8.3f} s")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dataset", default="digits")
    ap.add_argument("--model", default="cnn")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--threads", type=int, default=None, help="torch threads of both sides (default: torch's)"
    )
    ap.add_argument("--profile", type=Path, default=None, help="cProfile one more fedshift run")
    args = ap.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
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
        wall: dict[str, list[float]] = {"hand": [], "fs": []}
        cpu: dict[str, list[float]] = {"hand": [], "fs": []}
        for i in range(args.repeats):
            h, wh, ch = cpu_timed(hand_written_fedavg, cfg, fed)
            f, wf, cf = cpu_timed(fedshift_fedavg, cfg, fed, Path(tmp) / f"r{i}")
            for side, w, c in (("hand", wh, ch), ("fs", wf, cf)):
                wall[side].append(w)
                cpu[side].append(c)
            print(
                f"repeat {i + 1}: hand-written {wh:.2f} s ({ch:.2f} s CPU), fedshift {wf:.2f} s "
                f"({cf:.2f} s CPU), ratio {wf / wh:.3f} (CPU {cf / ch:.3f})",
                flush=True,
            )
        if args.profile is not None:
            profile_run(cfg, fed, Path(tmp) / "profiled", args.profile)
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
    paired = statistics.median(f / h for f, h in zip(wall["fs"], wall["hand"], strict=True))
    paired_cpu = statistics.median(f / h for f, h in zip(cpu["fs"], cpu["hand"], strict=True))
    print(
        f"min: hand-written {min(wall['hand']):.2f} s ({min(cpu['hand']):.2f} s CPU), "
        f"fedshift {min(wall['fs']):.2f} s ({min(cpu['fs']):.2f} s CPU)"
    )
    print(
        f"ratio of minimum times = {min(wall['fs']) / min(wall['hand']):.3f} "
        f"(CPU {min(cpu['fs']) / min(cpu['hand']):.3f})"
    )
    print(f"CPU-time ratio fedshift/hand-written = {paired_cpu:.3f} (median of paired repeats)")
    print(f"overhead ratio fedshift/hand-written = {paired:.3f} (median of paired repeats)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
