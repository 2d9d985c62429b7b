"""Data at real size: a federation far larger than memory as float32, from image folders.

Writes a generated federation of ``--sites`` sites x ``--per-site`` RGB images of
``--size`` x ``--size`` pixels as PNG files (``<root>/<site>/<class>/<i>.png``; every site
its own tint and contrast, every class its own pattern, noise on top), loads it with the
``folders`` loader (decoded once into the uint8 cache) and runs one round of FedAvg with
``--workers`` processes, sampling the resident memory of every process of the run together
(the sum of their proportional set sizes, PSS, from /proc/<pid>/smaps_rollup: shared pages
counted once). Then the same on a subset that fits in memory (``--subset`` images per site),
twice: images held in memory (``dataset.cache=false``) and read per batch from the cache file
(``FEDSHIFT_IN_MEMORY_MAX_BYTES=0``). It prints the peak memory, and the training images per
second of each round (training images of the round / the run's ``wall_s``, which covers the
round's training and its evaluation).

    python benchmarks/data_scale.py                    # 4 x 30,000 96x96: 3.3 GB uint8
    python benchmarks/data_scale.py --per-site 2000 --subset 500   # a quick look, ~2 min

Run it on an idle machine: the images-per-second figures compare runs made one after the
other. Linux only (/proc).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

CLASSES = ("circle", "stripes", "checker", "gradient")


def _pattern(cls: int, size: int) -> np.ndarray:
    yy, xx = np.mgrid[0:size, 0:size] / size
    if cls == 0:
        p = ((xx - 0.5) ** 2 + (yy - 0.5) ** 2 < 0.1).astype(float)
    elif cls == 1:
        p = (np.floor(xx * 8) % 2).astype(float)
    elif cls == 2:
        p = ((np.floor(xx * 6) + np.floor(yy * 6)) % 2).astype(float)
    else:
        p = yy
    return p


def _write_part(args: tuple[str, int, int, int, int, int]) -> int:
    from PIL import Image

    root, site, start, stop, size, seed = args
    rng = np.random.default_rng([seed, site, start])
    tint = np.array([0.6 + 0.1 * site, 0.9 - 0.1 * site, 0.7 + 0.05 * site])
    contrast = 0.5 + 0.15 * site
    for i in range(start, stop):
        cls = i % len(CLASSES)
        img = 0.5 + contrast * (_pattern(cls, size)[..., None] - 0.5) * tint
        img = img + rng.normal(0, 0.08, (size, size, 3))
        folder = Path(root) / f"site_{site}" / CLASSES[cls]
        arr = np.clip(img * 255, 0, 255).astype(np.uint8)
        Image.fromarray(arr).save(folder / f"{i:06d}.png", compress_level=1)
    return stop - start


def write_sites(root: Path, sites: int, per_site: int, size: int, workers: int) -> float:
    """The PNG folders (skipped when ``root/done.json`` says they are there); seconds."""
    marker = root / "done.json"
    want = {"sites": sites, "per_site": per_site, "size": size}
    if marker.is_file() and json.loads(marker.read_text()) == want:
        return 0.0
    start = time.perf_counter()
    for s in range(sites):
        for cls in CLASSES:
            (root / f"site_{s}" / cls).mkdir(parents=True, exist_ok=True)
    step = 2000
    parts = [
        (str(root), s, a, min(a + step, per_site), size, 0)
        for s in range(sites)
        for a in range(0, per_site, step)
    ]
    with ProcessPoolExecutor(workers) as pool:
        done = 0
        for n in pool.map(_write_part, parts):
            done += n
            print(f"\r  writing images: {done:,}/{sites * per_site:,}", end="", flush=True)
    print()
    marker.write_text(json.dumps(want))
    return time.perf_counter() - start


def _pss_kb(pid: int) -> int:
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return 0
    for line in text.splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1])
    return 0


def _tree(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            kids = Path(f"/proc/{p}/task/{p}/children").read_text().split()
        except OSError:
            kids = []
        todo.extend(int(k) for k in kids)
    return out


def run_measured(args: list[str], env: dict) -> tuple[dict, float]:
    """``fedshift run`` in a child process; its summary and the peak PSS (GB) of its tree."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "fedshift", "run", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    peak = [0]

    def sample() -> None:
        while proc.poll() is None:
            peak[0] = max(peak[0], sum(_pss_kb(p) for p in _tree(proc.pid)))
            time.sleep(0.2)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    out, _ = proc.communicate()
    t.join()
    if proc.returncode != 0:
        raise SystemExit(f"fedshift run failed ({proc.returncode}):\n{out[-3000:]}")
    lines = out.splitlines()
    run_dir = lines[lines.index("run directories:") + 1].strip()
    summary = json.loads((Path(run_dir) / "summary.json").read_text())
    return summary, peak[0] / 2**20


def train_images(root: Path, size: int, cache: Path) -> int:
    """The training images of the federation (from the decode cache the run made)."""
    os.environ["FEDSHIFT_CACHE"] = str(cache)
    from fedshift.data import load_dataset

    fed = load_dataset({"name": "folders", "root": str(root), "size": size})
    return sum(c["train"] for c in fed.counts().values())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sites", type=int, default=4)
    ap.add_argument("--per-site", type=int, default=30_000)
    ap.add_argument("--subset", type=int, default=3_000, help="images per site, in memory")
    ap.add_argument("--size", type=int, default=96)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--dir", default="data-scale", help="images, cache and runs go here")
    ap.add_argument("--model", default="resnet18", help="a model that takes size x size")
    ap.add_argument("--width", type=int, default=8, help="its model.width")
    a = ap.parse_args()
    base = Path(a.dir).resolve()
    n = a.sites * a.per_site
    side = f"{a.size}x{a.size}"
    print(
        f"{a.sites} sites x {a.per_site:,} {side} RGB images: {n * 3 * a.size**2 / 1e9:.1f} GB "
        f"as uint8, {n * 12 * a.size**2 / 1e9:.1f} GB as float32"
    )
    secs = write_sites(base / "images", a.sites, a.per_site, a.size, a.workers)
    print(f"  written in {secs:.0f} s" if secs else "  images already written")
    subset_root = base / "subset"
    write_sites(subset_root, a.sites, a.subset, a.size, a.workers)
    env = {**os.environ, "FEDSHIFT_CACHE": str(base / "cache"), "PYTHONUNBUFFERED": "1"}
    common = [
        f"dataset.size={a.size}", f"model.name={a.model}",
        f"model.width={a.width}", "algorithm.name=fedavg", "train.rounds=1",
        "--workers", str(a.workers), "--out", str(base / "runs"), "--overwrite",
    ]  # fmt: skip
    results = {}
    for name, root, extra, env_extra in (
        ("full, read per batch from the cache", base / "images", [], {}),
        ("subset, in memory", subset_root, ["dataset.cache=false"], {}),
        (
            "subset, read per batch from the cache",
            subset_root,
            [],
            {"FEDSHIFT_IN_MEMORY_MAX_BYTES": "0"},
        ),
    ):
        print(f"- {name}: decoding (first time only) and one FedAvg round ...", flush=True)
        summary, peak = run_measured(
            ["dataset.name=folders", f"dataset.root={root}", *common, *extra],
            {**env, **env_extra},
        )
        rate = train_images(root, a.size, base / "cache") / summary["wall_s"]
        results[name] = (rate, peak, summary)
        storage = summary["runtime"].get("data_storage", {})
        print(
            f"  {rate:8.1f} training images/s (wall {summary['wall_s']:.1f} s), peak memory of "
            f"all processes {peak:.2f} GB, storage {json.dumps(storage)}"
        )
    full = results["full, read per batch from the cache"][0]
    memory = results["subset, in memory"][0]
    print(f"\npeak resident memory (PSS, all processes), full set: "
          f"{results['full, read per batch from the cache'][1]:.2f} GB")
    print(f"images/s: full set read per batch {full:.1f}, subset in memory {memory:.1f}: "
          f"in-memory / full = {memory / full:.2f}x")


if __name__ == "__main__":
    main()
