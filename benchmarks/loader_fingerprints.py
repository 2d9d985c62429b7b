"""Fingerprints of the folder loaders' output (``pacs``, ``officehome``): what a refactoring of
their shared machinery must not move. Generates a small tree per dataset in a scratch folder
(PNG, JPEG, BMP, 8- and 16-bit TIFF, gray / RGB / RGBA / palette images of different sizes,
nested sub-folders, a non-image file, hidden files), loads it with several parameter sets
(fractions, seeds, ``max_per_split``, cache off / written / hit) and hashes every client's
images and labels, the class list and the loader's ``info`` (paths made relative).

    python benchmarks/loader_fingerprints.py --out before.json            # on the old code
    python benchmarks/loader_fingerprints.py --out after.json --compare before.json

``--compare`` prints every case whose fingerprint differs and exits 1 if any did. The images
go through the same torch resizing on the same machine, so compare files made on one machine.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

#: class -> images per domain (created in unsorted order on purpose)
COUNTS = {"giraffe": 4, "dog": 11, "elephant": 6}
PACS = ["photo", "art_painting", "cartoon", "sketch"]
OFFICEHOME = ["Art", "Clipart", "Product", "Real World"]
OFFICEHOME_CLIENTS = ["art", "clipart", "product", "real_world"]
CASES = (
    {},
    {"seed": 3},
    {"fractions": [0.5, 0.2, 0.3]},
    {"max_per_split": 3, "seed": 1},
    {"size": 12, "domains": "first-two"},
)


def _image(path: Path, k: int, d: int, c: int) -> None:
    """One generated image whose format, mode and size vary with the indices."""
    from PIL import Image

    rng = np.random.default_rng([k, d, c])
    h, w = 10 + (k % 4) * 3, 12 + (c % 3) * 5
    rgb = rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8)
    kind = (k + d + c) % 7
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == 0:
        Image.fromarray(rgb).save(path.with_suffix(".png"))
    elif kind == 1:
        Image.fromarray(rgb).save(path.with_suffix(".jpg"), quality=90)
    elif kind == 2:
        Image.fromarray(rgb[..., 0]).save(path.with_suffix(".png"))  # gray
    elif kind == 3:
        rgba = np.concatenate([rgb, rgb[..., :1]], axis=2)
        Image.fromarray(rgba).save(path.with_suffix(".png"))
    elif kind == 4:
        wide = (rgb[..., 0].astype(np.uint16) * 257).astype(np.uint16)
        Image.fromarray(wide).save(path.with_suffix(".tif"))  # 16-bit gray
    elif kind == 5:
        Image.fromarray(rgb).convert("P").save(path.with_suffix(".bmp"))
    else:
        Image.fromarray(rgb).save(path.with_suffix(".tiff"))


def make_tree(root: Path, domains: list[str]) -> Path:
    for d, domain in enumerate(domains):
        for c, (cls, n) in enumerate(COUNTS.items()):
            for k in range(n):
                sub = "nested/" if k % 5 == 4 else ""
                _image(root / domain / cls / f"{sub}img_{k:02d}", k, d, c)
        (root / domain / "dog" / "notes.txt").write_text("not an image")
        (root / domain / "dog" / ".hidden.png").write_bytes(b"x")
    return root


def _digest(*arrays) -> str:
    h = hashlib.sha256()
    for a in arrays:
        a = np.ascontiguousarray(a)
        h.update(str((a.dtype, a.shape)).encode())
        h.update(a.tobytes())
    return h.hexdigest()[:16]


def _relative(value, base: str):
    if isinstance(value, dict):
        return {k: _relative(v, base) for k, v in value.items() if k != "cache"}
    if isinstance(value, list):
        return [_relative(v, base) for v in value]
    if isinstance(value, str):
        return value.replace(base, "<tmp>")
    return value


def fingerprint(name: str, root: Path, cache: Path, case: dict, domains: list[str]) -> dict:
    from fedshift.data import load_dataset

    section = {"name": name, "root": str(root), "size": 8, "cache_dir": str(cache), **case}
    if section.get("domains") == "first-two":
        section["domains"] = domains[:2]
    out: dict = {}
    for mode in ("off", "write", "hit"):
        sec = {**section, "cache": mode != "off"}
        fed = load_dataset(sec)
        parts = {
            f"{c.name}/{s}": _digest(c.split(s).x.numpy(), c.split(s).y.numpy())
            for c in fed.clients
            for s in ("train", "val", "test")
        }
        out[mode] = {
            "clients": fed.client_names,
            "classes": fed.classes,
            "shape": list(fed.input_shape),
            "arrays": parts,
            "info": _relative(fed.info, str(root.parent)),
        }
    assert out["off"] == out["write"] == out["hit"], f"{name} {case}: the cache changed it"
    return out["off"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--compare", default=None)
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    results: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        trees = {
            "pacs": (make_tree(base / "PACS", PACS), PACS),
            "officehome": (make_tree(base / "OfficeHome", OFFICEHOME), OFFICEHOME_CLIENTS),
        }
        for name, (root, names) in trees.items():
            for i, case in enumerate(CASES):
                results[f"{name}#{i} {json.dumps(case)}"] = fingerprint(
                    name, root, base / f"cache{i}", case, names
                )
    return write_and_compare(results, args.out, args.compare, "cases")


def write_and_compare(results: dict, out: str, compare: str | None, what: str) -> int:
    """Write ``results`` to ``out`` and, with ``compare`` (an earlier output), print which
    entries differ and in which fields; 1 when any does."""
    Path(out).write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    print(f"{len(results)} {what} -> {out}")
    if not compare:
        return 0
    before = json.loads(Path(compare).read_text())
    keys = set(before) | set(results)
    differ = sorted(k for k in keys if before.get(k) != results.get(k))
    for k in differ:
        old, new = before.get(k) or {}, results.get(k) or {}
        fields = sorted(f for f in set(old) | set(new) if old.get(f) != new.get(f))
        print(f"DIFFERS: {k}: {', '.join(fields) or 'missing'}")
    print(f"{len(keys) - len(differ)} of {len(keys)} {what} identical")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
