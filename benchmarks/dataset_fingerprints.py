"""Fingerprints of every built-in dataset that loads offline: what moving the datasets onto
their contract (issue 30) must not move. Each is loaded with small settings (``toyshift``,
``toyseg``; ``digits``, ``brain-mri`` and ``fashion-mnist`` from the cache or the installed
packages, skipped when absent; ``pacs``, ``officehome``, ``folders``, ``segfolders`` and
``arrays`` from trees generated in a scratch folder) and every client's images and labels
are hashed with the class list, the client names, the input shape and the task.

    python benchmarks/dataset_fingerprints.py --out before.json            # on the old code
    python benchmarks/dataset_fingerprints.py --out after.json --compare before.json

``--compare`` prints every dataset whose fingerprint differs and exits 1 if any did (or if
one was fingerprinted before but not now). Compare files made on one machine.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from loader_fingerprints import (  # noqa: E402
    OFFICEHOME,
    PACS,
    _digest,
    make_tree,
    write_and_compare,
)

SMALL = {"train_size": 12, "val_size": 6, "test_size": 6}


def _segfolders_tree(root: Path) -> Path:
    """Two sites of PNG images with 3-valued masks."""
    from PIL import Image

    for s, site in enumerate(("siteA", "siteB")):
        for k in range(6):
            rng = np.random.default_rng([s, k])
            img = rng.integers(0, 256, size=(20, 20, 3), dtype=np.uint8)
            mask = (rng.integers(0, 3, size=(20, 20)) * 100).astype(np.uint8)
            for sub, arr in (("images", img), ("masks", mask)):
                (root / site / sub).mkdir(parents=True, exist_ok=True)
                Image.fromarray(arr).save(root / site / sub / f"case{k}.png")
    return root


def _arrays_tree(root: Path, task: str) -> Path:
    """Two sites as ``<site>.npz`` (x NHWC uint8, y)."""
    root.mkdir(parents=True)
    for s, site in enumerate(("north", "south")):
        rng = np.random.default_rng([7, s])
        x = rng.integers(0, 256, size=(15, 8, 8, 3), dtype=np.uint8)
        shape = (15,) if task == "classification" else (15, 8, 8)
        y = rng.integers(0, 3, size=shape)
        np.savez(root / f"{site}.npz", x=x, y=y)
    return root


def cases(base: Path) -> dict[str, dict]:
    """Every dataset section fingerprinted, by a readable key."""
    cache = str(base / "cache")
    out: dict[str, dict] = {
        "toyshift": {"name": "toyshift"},
        "toyshift seed=2": {"name": "toyshift", "seed": 2, "clients": 4, "classes": 5},
        "toyseg": {"name": "toyseg", "size": 16},
        "digits": {"name": "digits", **SMALL},
        "brain-mri": {"name": "brain-mri", "sites": 3, "size": 32},
        "fashion-mnist": {"name": "fashion-mnist", **SMALL},
    }
    for name, domains in (("pacs", PACS), ("officehome", OFFICEHOME)):
        root = make_tree(base / name, domains)
        out[name] = {"name": name, "root": str(root), "size": 8, "cache_dir": cache}
    folders = make_tree(base / "folders", ["site1", "site2"])
    out["folders"] = {"name": "folders", "root": str(folders), "size": 8, "cache": False}
    seg = _segfolders_tree(base / "segfolders")
    out["segfolders"] = {"name": "segfolders", "root": str(seg), "size": 16}
    for task in ("classification", "segmentation"):
        root = _arrays_tree(base / f"arrays-{task}", task)
        out[f"arrays task={task}"] = {"name": "arrays", "root": str(root), "task": task}
    return out


def fingerprint(section: dict) -> dict:
    from fedshift.data import load_dataset

    fed = load_dataset(section)
    parts = {
        f"{c.name}/{s}": _digest(c.split(s).x.numpy(), c.split(s).y.numpy())
        for c in fed.clients
        for s in ("train", "val", "test")
    }
    return {
        "clients": fed.client_names,
        "classes": fed.classes,
        "shape": list(fed.input_shape),
        "task": fed.task,
        "arrays": parts,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--compare", default=None)
    args = parser.parse_args(argv)
    import torch

    from fedshift.core.errors import FedshiftError

    torch.set_num_threads(1)
    results: dict = {}
    skipped: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        for key, section in cases(Path(tmp)).items():
            try:
                results[key] = fingerprint(section)
            except FedshiftError as e:  # data not on this machine (a cache, a package)
                skipped[key] = str(e).split("\n")[0][:160]
    for key, why in skipped.items():
        print(f"skipped {key}: {why}")
    return write_and_compare(results, args.out, args.compare, "datasets")

if __name__ == "__main__":
    sys.exit(main())
