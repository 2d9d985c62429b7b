"""Files read back with wrong content (issue 48, item 2), against real ``fedshift`` processes:
run by :mod:`unsafe_inputs` (``python benchmarks/faults.py --part inputs``) as its item
"4 content" cases.

* the decode cache of a ``folders`` set with its bytes inverted, its ``kept.npz`` index
  arrays permuted, or a split file replaced by a link to another valid array: the run must
  read the images again, say so in a warning naming the file, and give the numbers of a run
  on an untouched cache;
* a checkpoint whose header is valid but whose content does not fit the run (a tensor of
  another shape, a string for a tensor, an RNG state of the wrong size, rows of a round it
  never ran): ``fedshift run --resume`` refuses it in one line naming the file and the key;
* a ``summary.json`` with a score of 1e308, -5.0 or 500 %: ``fedshift report`` refuses it,
  naming the file and the key;
* a committed cell whose ``cell.json`` digest was rewritten to another suite cell's: ``fedshift
  bench`` runs that cell instead of taking it, and says so.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import numpy as np
import yaml
from PIL import Image
from unsafe_inputs import Result, crashed, env, fedshift, finished, refused

# ---------------------------------------------------------------------------- decode cache
FOLDERS = ["dataset.name=folders", "dataset.root=data", "dataset.size=28", "model.name=cnn",
           "model.width=4", "train.rounds=1", "train.batch_size=8", "train.local_steps=2",
           "dataset.cache_dir=cache", "name=x"]  # fmt: skip


def _tree(tmp: Path) -> None:
    """Two sites x two classes x 10 images, the class in the red channel."""
    rng = np.random.default_rng(0)
    for site in ("a", "b"):
        for c, cls in enumerate(("cat", "dog")):
            folder = tmp / "data" / site / cls
            folder.mkdir(parents=True)
            for i in range(10):
                img = rng.integers(0, 60, (28, 28, 3), dtype=np.uint8)
                img[..., 0] += 120 * c
                Image.fromarray(img).save(folder / f"{i}.png")


def _test_mean(tmp: Path, out: str) -> float:
    [path] = (tmp / out).glob("*/*/summary.json")
    return json.loads(path.read_text())["test_mean"]


def _inverted(entry: Path) -> str:
    path = entry / "train.npy"
    raw = path.read_bytes()
    start = len(raw) - 20 * 3 * 28 * 28 // 2  # the second half of the images
    path.write_bytes(raw[:start] + bytes(255 - b for b in raw[start:]))
    return "train.npy"


def _permuted(entry: Path) -> str:
    with np.load(entry / "kept.npz") as z:
        kept = {k: z[k] for k in z.files}
    kept["train"] = kept["train"][::-1].copy()
    np.savez(entry / "kept.npz", **kept)
    return "kept.npz"


def _linked(entry: Path) -> str:
    other = next(p for p in entry.parent.iterdir() if p != entry)  # the other site's entry
    (entry / "test.npy").unlink()
    (entry / "test.npy").symlink_to(other / "test.npy")
    return "test.npy"


def cache_case(alter: Callable[[Path], str]) -> Callable[[Path], Result]:
    def case(tmp: Path) -> Result:
        _tree(tmp)
        first = fedshift(tmp, "run", *FOLDERS, "--out", "runs1", "--quiet")
        if first.returncode != 0:
            raise RuntimeError(first.stderr[-500:])
        entry = sorted((tmp / "cache" / "folders").iterdir())[0]
        name = alter(entry)
        res = fedshift(tmp, "run", *FOLDERS, "--out", "runs2", "--quiet")
        said = any(name in line and "reading the images again" in line
                   for line in res.stderr.splitlines())  # fmt: skip
        same = res.returncode == 0 and _test_mean(tmp, "runs2") == _test_mean(tmp, "runs1")
        return Result(said and same, crashed(res), note="" if same else "other numbers")

    return case


# ---------------------------------------------------------------------------- checkpoints
EDIT = textwrap.dedent(
    """
    import sys, torch
    from fedshift.runtime.rundir.checkpoint_io import read_checkpoint, write_checkpoint
    path, how = sys.argv[1], sys.argv[2]
    ck = read_checkpoint(path)
    w = ck["server"]["weights"]
    first = next(iter(w))
    key = f"server/weights/{first}"
    if how == "shape":
        w[first] = torch.zeros(3)
    elif how == "string":
        w[first] = "not a tensor"
    elif how == "rng":
        ck["rng"]["torch"] = ck["rng"]["torch"][:100]
        key = "rng/torch"
    else:
        key = f"records/{len(ck['records'])}/round"
        ck["records"].append({**ck["records"][-1], "round": 9})
    write_checkpoint(ck, path)
    print(key)
    """
)


def checkpoint_content(how: str) -> Callable[[Path], Result]:
    def case(tmp: Path) -> Result:
        run_dir = finished(tmp)
        out = subprocess.run([sys.executable, "-c", EDIT, str(run_dir / "checkpoint.pt"), how],
                             env=env(), capture_output=True, text=True, check=True)  # fmt: skip
        key = out.stdout.strip()  # the key the edit made wrong
        metrics = (run_dir / "metrics.jsonl").read_text()
        res = fedshift(tmp, "run", "--resume", str(run_dir), "train.rounds=3", "--quiet")
        kept = (run_dir / "metrics.jsonl").read_text() == metrics
        return Result(refused(res, "checkpoint.pt", f"key '{key}'") and kept, crashed(res))

    return case


# ---------------------------------------------------------------------------- summaries
def summary_range(value: float) -> Callable[[Path], Result]:
    def case(tmp: Path) -> Result:
        run_dir = finished(tmp)
        path = run_dir / "summary.json"
        s = json.loads(path.read_text())
        client = s["clients"][0]
        s["test_per_client"][client] = value
        path.write_text(json.dumps(s))
        res = fedshift(tmp, "report", "runs", "--out", "rep")
        return Result(refused(res, "summary.json", f"test_per_client.{client}"), crashed(res))

    return case


# ---------------------------------------------------------------------------- cells
def forged_cell(tmp: Path) -> Result:
    """Suite s's cell committed in results/, renamed to the cell of train.lr=0.02 with its
    cell.json digest rewritten: bench with that override must run the cell, not take it."""
    suite = tmp / "suite.yaml"
    suite.write_text(yaml.safe_dump({"name": "s", "dataset": {"name": "toyshift"},
                                     "model": {"name": "lenet5"},
                                     "train": {"rounds": 1, "batch_size": 16}}))  # fmt: skip
    res = fedshift(tmp, "bench", str(suite), "--out", "runs", "--workers", "1", "--quiet")
    if res.returncode != 0:
        raise RuntimeError(res.stderr[-500:])
    code = (
        "import sys; from fedshift.bench import plan; "
        "c = plan(sys.argv[1], ['train.lr=0.02'], out='b')[0]; print(c.run_dir.name, c.digest)"
    )
    out = subprocess.run([sys.executable, "-c", code, str(suite)], cwd=tmp, env=env(),
                         capture_output=True, text=True, check=True)  # fmt: skip
    name, digest = out.stdout.split()
    [cell] = (tmp / "runs" / "s").glob("*/cell.json")
    forged = tmp / "results" / "s" / name
    forged.mkdir(parents=True)
    for f in ("config.yaml", "summary.json", "metrics.jsonl"):
        (forged / f).write_bytes((cell.parent / f).read_bytes())
    meta = {**json.loads(cell.read_text()), "digest": digest}
    (forged / "cell.json").write_text(json.dumps(meta))
    res = fedshift(tmp, "bench", str(suite), "train.lr=0.02", "--out", "b", "--workers", "1",
                   "--quiet")  # fmt: skip
    rows = json.loads((tmp / "b" / "s" / "bench.json").read_text()) if res.returncode == 0 else []
    ran = [r.get("status") for r in rows] == ["ran"]
    said = name in res.stderr and "config.yaml gives" in res.stderr
    return Result(ran and said, crashed(res))


CASES: list[tuple[str, str, Callable[[Path], Result]]] = [
    ("4 content", "decode cache with inverted bytes", cache_case(_inverted)),
    ("4 content", "decode cache with permuted kept.npz", cache_case(_permuted)),
    ("4 content", "decode cache split file linked to another", cache_case(_linked)),
    ("4 content", "checkpoint.pt tensor of another shape", checkpoint_content("shape")),
    ("4 content", "checkpoint.pt string for a tensor", checkpoint_content("string")),
    ("4 content", "checkpoint.pt RNG state cut short", checkpoint_content("rng")),
    ("4 content", "checkpoint.pt row of a future round", checkpoint_content("record")),
    ("4 content", "summary.json score 1e308, report", summary_range(1e308)),
    ("4 content", "summary.json score -5.0, report", summary_range(-5.0)),
    ("4 content", "summary.json score 500 %, report", summary_range(5.0)),
    ("4 content", "committed cell with a rewritten digest", forged_cell),
]
