"""From scratch or from ImageNet, and how much of the model to train: EfficientNet-Lite0
(``model.pretrained=true``, the ``fedshift[pretrained]`` extra), FedAvg, every
``train.trainable`` mode, three seeds, on one of two federations:

* ``--dataset folders`` (default): three sites with planted scanner shifts
  (``benchmarks/make_sites.py``, ``--images`` per site and class, ``--side`` pixels);
* ``--dataset digits``: the five digits domains (28x28 RGB), ``--images`` training images
  per domain, upsampled by the input pipeline to ``--size`` x ``--size``
  (``input.size``; bilinear) for the backbone.

``--holdout NAME``: leave-one-client-out (the cells of ``fedshift protocol loco`` for that
client: ``federation.holdout=[NAME]``): NAME never trains, the round is selected on the
sources' validation accuracy and NAME's test accuracy at that round is reported beside the
sources'. ``--only 'A;B'``: only the variants labelled A and B.

Per variant: the mean test accuracy over the sites at the selected round (mean and range
over seeds), the bytes a site sends per round, and the seconds per round (this process's CPU
seconds, setup included, and the wall-clock seconds of the rounds); the head-only
variant once more with the cached trunk off (``train.trunk_cache=false``) for the time it
saves. Writes ``OUT/pretrained.json``, ``OUT/pretrained.md`` (the table) and
``OUT/pretrained.png`` (accuracy against bytes per round), and prints the table.

    # the committed tables (docs/RESULTS.md, "Pretrained"; minutes on one core):
    python benchmarks/pretrained.py --out results/benchmarks/pretrained_sites \
        --seeds 3 --rounds 10 --images 40
    python benchmarks/pretrained.py --seeds 3 --rounds 10 --images 40 \
        --only 'pretrained, lora' --out results/benchmarks/pretrained_sites_lora
    python benchmarks/pretrained.py --dataset digits --size 48 --images 20 --eval-images 20 \
        --rounds 3 --seeds 3 --jobs 8 --out results/benchmarks/pretrained_digits
    python benchmarks/pretrained.py --dataset digits --size 48 --images 20 --eval-images 20 \
        --rounds 3 --seeds 3 --jobs 7 --holdout mnistm \
        --out results/benchmarks/pretrained_digits_loo
    python benchmarks/pretrained.py --dataset digits --size 32 --images 100 --eval-images 50 \
        --rounds 5 --seeds 3 --jobs 2 --out results/benchmarks/pretrained_digits_100
    python benchmarks/pretrained.py --out /tmp/p --seeds 1 --rounds 2 --images 10   # a try
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from fedshift.catalog import resolve
from fedshift.core.config import load_config
from fedshift.core.errors import ConfigError
from fedshift.core.files import write_text_atomic
from fedshift.runtime.simulation import run_experiment

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_sites import make_sites  # noqa: E402

#: (label, overrides): from scratch, then from ImageNet training every tensor or a part
VARIANTS: list[tuple[str, tuple[str, ...]]] = [
    ("scratch, all", ("model.pretrained=false",)),
    ("pretrained, all", ("model.pretrained=true",)),
    ("pretrained, bn+head", ("model.pretrained=true", "train.trainable=bn+head")),
    ("pretrained, adapters", ("model.pretrained=true", "train.trainable=adapters")),
    ("pretrained, lora", ("model.pretrained=true", "train.trainable=lora")),
    ("pretrained, head", ("model.pretrained=true", "train.trainable=head")),
    ("pretrained, head (trunk recomputed)",
     ("model.pretrained=true", "train.trainable=head", "train.trunk_cache=false")),
]  # fmt: skip


def data_keys(args: argparse.Namespace, root: Path | None) -> list[str]:
    """The dataset's config keys (and ``input.size`` for digits) of one benchmark."""
    if args.dataset == "folders":
        return ["dataset.name=folders", f"dataset.root={root}", f"dataset.size={args.side}"]
    return [
        "dataset.name=digits", f"dataset.train_size={args.images}",
        f"dataset.val_size={args.eval_images}", f"dataset.test_size={args.eval_images}",
        f"input.size=[{args.size}, {args.size}]",
    ]  # fmt: skip


def run_one(keys: list[str], args: argparse.Namespace, seed: int, over: tuple[str, ...],
            out: Path) -> dict:  # fmt: skip
    holdout = [f"federation.holdout=[{args.holdout}]"] if args.holdout else []
    cfg = resolve(load_config(None, [
        *keys, *holdout,
        "model.name=efficientnet_lite0", "input.mean=[0]", "input.std=[1]",
        "algorithm.name=fedavg", f"train.rounds={args.rounds}", "train.batch_size=16",
        "train.lr=0.01", f"seed={seed}", "name=pretrained", "run.threads=1", *over,
    ]))  # fmt: skip
    t0, c0 = time.perf_counter(), time.process_time()
    summary = run_experiment(cfg, run_dir=out, progress=False).summary
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    trained = len(summary["clients"]) - len(summary.get("holdout") or [])
    return {
        "test": summary["test_mean"],
        "target": summary.get("target_test_mean"),
        "best_round": summary["best_round"],
        "bytes_up_per_round_per_site": summary["bytes_up"] / args.rounds / trained,
        "s_per_round": summary["wall_s"] / args.rounds,
        # this process's CPU seconds (one torch thread) for the whole run, setup included:
        # what the run computes, whatever else the machine runs meanwhile
        "cpu_s_per_round": cpu / args.rounds,
        "wall_s": wall,
        "trainable": summary.get("trainable"),
    }


def _task(job: tuple) -> dict:
    """One (variant, seed) run, or its refusal (a mode this model cannot train)."""
    keys, args, seed, over, out = job
    torch.set_num_threads(1)
    try:
        return run_one(keys, args, seed, over, out)
    except ConfigError as e:
        return {"refused": str(e)}


def run_all(tasks: list, keys: list[str], args: argparse.Namespace, tmp: Path) -> dict:
    """Every (label, over, seed) of ``tasks`` run (``--jobs`` at once, each a fresh process of
    one thread): ``{(label, seed): run_one's record}``."""
    jobs = [(keys, args, seed, over, tmp / f"{label}-{seed}") for label, over, seed in tasks]
    results = []

    def note(task: tuple, r: dict) -> None:
        results.append(r)
        what = r.get("refused") or f"test {100 * r['test']:.1f}, {r['cpu_s_per_round']:.2f} CPU s"
        print(f"  {task[0]}, seed {task[2]}: {what}", flush=True)

    if args.jobs <= 1:
        for task, job in zip(tasks, jobs, strict=True):
            note(task, _task(job))
    else:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(args.jobs, mp_context=ctx, max_tasks_per_child=1) as pool:
            for task, r in zip(tasks, pool.map(_task, jobs), strict=True):
                note(task, r)
    return {(label, seed): r for (label, _, seed), r in zip(tasks, results, strict=True)}


def _acc(accs: list[float]) -> str:
    return f"{100 * statistics.mean(accs):.1f} ({100 * min(accs):.1f}-{100 * max(accs):.1f})"


def table(rows: list[dict], holdout: str | None = None) -> str:
    target = [f"held-out {holdout}: test accuracy (mean, min-max over seeds)"] if holdout else []
    sources = "sources' test accuracy" if holdout else "test accuracy"
    head = ["variant", *target, f"{sources} (mean, min-max over seeds)",
            "bytes a site sends a round", "CPU s a round", "wall s a round"]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        if "refused" in r:
            lines.append(f"| {r['label']} | refused: {r['refused']} |" + " |" * (len(head) - 2))
            continue
        cells = [r["label"], *([_acc(r["target"])] if holdout else []), _acc(r["test"]),
                 f"{r['bytes']:,.0f}", f"{statistics.median(r['cpu_s_per_round']):.2f}",
                 f"{statistics.median(r['s_per_round']):.2f}"]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(rows: list[dict], path: Path, title: str, key: str = "test") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for r in rows:
        if "recomputed" in r["label"] or "refused" in r:
            continue
        acc = [100 * a for a in r[key]]
        ax.errorbar(r["bytes"], statistics.mean(acc),
                    yerr=[[statistics.mean(acc) - min(acc)], [max(acc) - statistics.mean(acc)]],
                    fmt="o", capsize=3)  # fmt: skip
        ax.annotate(r["label"], (r["bytes"], statistics.mean(acc)), fontsize=7,
                    xytext=(4, 4), textcoords="offset points")  # fmt: skip
    ax.set_xscale("log")
    ax.set_xlabel("bytes a site sends per round (log)")
    ax.set_ylabel("test accuracy (%)" if key == "target" else "mean test accuracy over sites (%)")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="folder for the json, md and png")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--dataset", choices=("folders", "digits"), default="folders")
    ap.add_argument("--images", type=int, default=60,
                    help="folders: images per site and class; digits: training images per "
                    "domain")  # fmt: skip
    ap.add_argument("--eval-images", type=int, default=100,
                    help="digits: validation and test images per domain")  # fmt: skip
    ap.add_argument("--side", type=int, default=64, help="folders: image side in pixels")
    ap.add_argument("--size", type=int, default=64, help="digits: input.size=[S, S]")
    ap.add_argument("--holdout", default=None, help="leave this client out (it never trains)")
    ap.add_argument("--only", default=None,
                    help="the variants to run: their labels separated by ';'")  # fmt: skip
    ap.add_argument("--jobs", type=int, default=1,
                    help="runs at once, each in its own process of one thread (default 1)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    variants = VARIANTS
    if args.only:
        labels = [w.strip() for w in args.only.split(";")]
        variants = [(label, o) for label, o in VARIANTS if label in labels]
    if args.holdout:  # accuracy only: the cached trunk's time is measured without a holdout
        variants = [(label, o) for label, o in variants if "recomputed" not in label]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        root = None
        if args.dataset == "folders":
            root = make_sites(Path(tmp) / "sites", args.images, args.side, seed=0)
        keys = data_keys(args, root)
        tasks = [(label, over, seed) for label, over in variants for seed in range(args.seeds)]
        done = run_all(tasks, keys, args, Path(tmp))
        for label, over in variants:
            runs = [done[(label, seed)] for seed in range(args.seeds)]
            refused = next((r["refused"] for r in runs if "refused" in r), None)
            if refused is not None:  # a mode this model cannot train: its reason, in the table
                rows.append({"label": label, "overrides": list(over), "refused": refused})
                print(f"{label}: refused: {refused}", flush=True)
                continue
            row = {
                "label": label,
                "overrides": list(over),
                "test": [r["test"] for r in runs],
                "target": [r["target"] for r in runs],
                "best_round": [r["best_round"] for r in runs],
                "bytes": runs[0]["bytes_up_per_round_per_site"],
                "s_per_round": [r["s_per_round"] for r in runs],
                "cpu_s_per_round": [r["cpu_s_per_round"] for r in runs],
                "trainable": runs[0]["trainable"],
            }
            rows.append(row)
            held = ""
            if args.holdout:
                held = f"held-out {[round(100 * a, 1) for a in row['target']]}, "
            print(f"{label}: {held}test {[round(100 * a, 1) for a in row['test']]}, "
                  f"{row['bytes']:,.0f} B/round, "
                  f"{statistics.median(row['cpu_s_per_round']):.2f} CPU s/round, "
                  f"{statistics.median(row['s_per_round']):.2f} s/round", flush=True)  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    command = "python benchmarks/pretrained.py " + shlex.join(sys.argv[1:])
    sizes = (
        {"images_per_site_and_class": args.images, "side": args.side}
        if args.dataset == "folders"
        else {"train_images_per_domain": args.images, "val_and_test_images_per_domain":
              args.eval_images, "input_size": [args.size, args.size]}
    )  # fmt: skip
    meta = {"command": command, "dataset": args.dataset, "holdout": args.holdout,
            "jobs": args.jobs, "seeds": args.seeds, "rounds": args.rounds, **sizes,
            "torch": torch.__version__, "threads": 1, "rows": rows}  # fmt: skip
    write_text_atomic(args.out / "pretrained.json", json.dumps(meta, indent=2) + "\n")
    text = table(rows, args.holdout)
    write_text_atomic(args.out / "pretrained.md", f"`{command}`\n\n{text}\n")
    where = (
        "three shifted sites" if args.dataset == "folders"
        else f"digits (5 domains, 28x28 upsampled to {args.size}x{args.size})"
    )  # fmt: skip
    title = f"EfficientNet-Lite0 on {where}, FedAvg"
    if args.holdout:
        title += f": {args.holdout} held out (never trains)"
    plot(rows, args.out / "pretrained.png", title, "target" if args.holdout else "test")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
