"""From scratch or from ImageNet, and how much of the model to train: EfficientNet-Lite0
(``model.pretrained=true``, the ``fedshift[pretrained]`` extra) on a folders federation of
three sites with planted scanner shifts (``benchmarks/make_sites.py``), FedAvg, every
``train.trainable`` mode, three seeds.

Per variant: the mean test accuracy over the sites at the selected round (mean and range
over seeds), the bytes a site sends per round, and the seconds per round; the head-only
variant once more with the cached trunk off (``train.trunk_cache=false``) for the time it
saves. Writes ``OUT/pretrained.json``, ``OUT/pretrained.md`` (the table) and
``OUT/pretrained.png`` (accuracy against bytes per round), and prints the table.

    # the committed table (~17 min on one core):
    python benchmarks/pretrained.py --out results/benchmarks/pretrained_sites \
        --seeds 3 --rounds 10 --images 40
    python benchmarks/pretrained.py --out /tmp/p --seeds 1 --rounds 2 --images 10   # a try

Not measured here (issue 54 item 5 asks for them too): ``digits`` upsampled to the
backbone's input (fedshift has no input-resize step yet; digits are 28x28 and
EfficientNet-Lite0 needs at least 32x32), and the leave-one-out / new-site protocols.
"""

from __future__ import annotations

import argparse
import json
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


def run_one(root: Path, side: int, rounds: int, seed: int, over: tuple[str, ...], out: Path):
    cfg = resolve(load_config(None, [
        "dataset.name=folders", f"dataset.root={root}", f"dataset.size={side}",
        "model.name=efficientnet_lite0", "input.mean=[0]", "input.std=[1]",
        "algorithm.name=fedavg", f"train.rounds={rounds}", "train.batch_size=16",
        "train.lr=0.01", f"seed={seed}", "name=pretrained", "run.threads=1", *over,
    ]))  # fmt: skip
    t0 = time.perf_counter()
    summary = run_experiment(cfg, run_dir=out, progress=False).summary
    wall = time.perf_counter() - t0
    return {
        "test": summary["test_mean"],
        "best_round": summary["best_round"],
        "bytes_up_per_round_per_site": summary["bytes_up"] / rounds / len(summary["clients"]),
        "s_per_round": summary["wall_s"] / rounds,
        "wall_s": wall,
        "trainable": summary.get("trainable"),
    }


def table(rows: list[dict]) -> str:
    lines = [
        "| variant | test accuracy (mean, min-max over seeds) | bytes a site sends a round | "
        "s a round |",
        "|---|---|---|---|",
    ]
    for r in rows:
        if "refused" in r:
            lines.append(f"| {r['label']} | refused: {r['refused']} | | |")
            continue
        accs = r["test"]
        lines.append(
            f"| {r['label']} | {100 * statistics.mean(accs):.1f} "
            f"({100 * min(accs):.1f}-{100 * max(accs):.1f}) | "
            f"{r['bytes']:,.0f} | {statistics.median(r['s_per_round']):.2f} |"
        )
    return "\n".join(lines)


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for r in rows:
        if "recomputed" in r["label"] or "refused" in r:
            continue
        acc = [100 * a for a in r["test"]]
        ax.errorbar(r["bytes"], statistics.mean(acc),
                    yerr=[[statistics.mean(acc) - min(acc)], [max(acc) - statistics.mean(acc)]],
                    fmt="o", capsize=3)  # fmt: skip
        ax.annotate(r["label"], (r["bytes"], statistics.mean(acc)), fontsize=7,
                    xytext=(4, 4), textcoords="offset points")  # fmt: skip
    ax.set_xscale("log")
    ax.set_xlabel("bytes a site sends per round (log)")
    ax.set_ylabel("mean test accuracy over sites (%)")
    ax.set_title("EfficientNet-Lite0 on three shifted sites, FedAvg")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="folder for the json, md and png")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--images", type=int, default=60, help="images per site and class")
    ap.add_argument("--side", type=int, default=64, help="image side in pixels")
    args = ap.parse_args()
    torch.set_num_threads(1)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        root = make_sites(Path(tmp) / "sites", args.images, args.side, seed=0)
        for label, over in VARIANTS:
            try:
                runs = [
                    run_one(root, args.side, args.rounds, seed, over,
                            Path(tmp) / f"{label}-{seed}")  # fmt: skip
                    for seed in range(args.seeds)
                ]
            except ConfigError as e:  # a mode this model cannot train: its reason, in the table
                rows.append({"label": label, "overrides": list(over), "refused": str(e)})
                print(f"{label}: refused: {e}", flush=True)
                continue
            row = {
                "label": label,
                "overrides": list(over),
                "test": [r["test"] for r in runs],
                "best_round": [r["best_round"] for r in runs],
                "bytes": runs[0]["bytes_up_per_round_per_site"],
                "s_per_round": [r["s_per_round"] for r in runs],
                "trainable": runs[0]["trainable"],
            }
            rows.append(row)
            print(f"{label}: test {[round(100 * a, 1) for a in row['test']]}, "
                  f"{row['bytes']:,.0f} B/round, "
                  f"{statistics.median(row['s_per_round']):.2f} s/round", flush=True)  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    command = "python benchmarks/pretrained.py " + " ".join(sys.argv[1:])
    meta = {"command": command, "seeds": args.seeds, "rounds": args.rounds,
            "images_per_site_and_class": args.images, "side": args.side,
            "torch": torch.__version__, "threads": 1, "rows": rows}  # fmt: skip
    write_text_atomic(args.out / "pretrained.json", json.dumps(meta, indent=2) + "\n")
    text = table(rows)
    write_text_atomic(args.out / "pretrained.md", f"`{command}`\n\n{text}\n")
    plot(rows, args.out / "pretrained.png")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
