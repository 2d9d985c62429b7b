"""Unsafe inputs against real ``fedshift`` processes (issue 28): does a command delete a file
outside its ``--out``, run code nobody asked for, ignore a signal, or answer with a traceback?

Run by ``benchmarks/faults.py`` (``--part inputs``, or with everything else). Every case
builds its inputs in a temporary folder, runs the real command line (``python -m fedshift``
in that folder: the way that puts the folder on Python's path, the worst case for a module
lying there) and then looks at the files:

* **files outside --out lost**: victim files (a ``thesis.tex`` in a folder of the user's)
  that are gone or changed after the command;
* **code run unasked**: imports of a module that writes a marker file when imported, by a
  command that was not told ``--allow-plugins``;
* **as intended**: the command ended as it should (a refusal with exit 2 and one
  ``fedshift: error:`` line naming the file or key; a stop with 130 / 143; or success where
  the user said yes);
* **tracebacks**: a Python traceback (or Ray's C++ stack dump) on the terminal.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import yaml

TOY = ["dataset.name=toyshift", "model.name=lenet5", "train.batch_size=16", "name=x"]
CRASH = ("Traceback (most recent call last)", "SIGTERM received", "logging.cc", "Aborted")
PLUGIN = """\
from pathlib import Path
with open(Path(__file__).with_name("marker.txt"), "a") as f:
    f.write("imported\\n")
from fedshift.algorithms.fedavg import FedAvg

class Algo(FedAvg):
    pass
"""


@dataclass
class Result:
    intended: bool
    traceback: bool = False
    lost: int = 0
    ran: int = 0
    note: str = ""


@dataclass
class Row:
    item: str
    cases: int = 0
    intended: int = 0
    tracebacks: int = 0
    lost: int = 0
    ran: int = 0
    notes: list[str] = field(default_factory=list)


def env() -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if k != "FEDSHIFT_ALLOW_PLUGINS"}
    return {**e, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def fedshift(cwd: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "fedshift", *args], cwd=cwd, env=env(), capture_output=True,
        text=True, timeout=timeout,
    )  # fmt: skip


def refused(res: subprocess.CompletedProcess, *words: str) -> bool:
    """Exit 2 with one ``fedshift: error:`` line holding every word."""
    err = res.stderr.strip().splitlines()
    last = err[-1] if err else ""
    return (
        res.returncode == 2
        and last.startswith("fedshift: error:")
        and all(w in last for w in words)
    )


def crashed(res: subprocess.CompletedProcess | str) -> bool:
    text = res if isinstance(res, str) else res.stdout + res.stderr
    return any(c in text for c in CRASH)


# ---------------------------------------------------------------------------- victims
def victim(tmp: Path) -> Path:
    """A folder of the user's, outside any --out: thesis.tex, a config.yaml, a run.lock."""
    folder = tmp / "home" / "thesis"
    folder.mkdir(parents=True)
    (folder / "thesis.tex").write_text("years of work\n")
    (folder / "config.yaml").write_text("name: thesis\nseed: 0\n")
    (folder / "run.lock").write_text("")
    return folder


def lost(folder: Path) -> int:
    want = {"thesis.tex": "years of work\n", "config.yaml": "name: thesis\nseed: 0\n"}
    return sum(
        1
        for n, text in want.items()
        if not (folder / n).is_file() or (folder / n).read_text() != text
    )


def imports(folder: Path) -> int:
    marker = folder / "marker.txt"
    return len(marker.read_text().splitlines()) if marker.is_file() else 0


# ---------------------------------------------------------------------------- item 1
def toy_dir(tmp: Path, *over: str) -> Path:
    """Where ``fedshift run *TOY *over --out runs`` puts its run in ``tmp`` (its name carries
    the overrides and the config's digest)."""
    code = (
        "import sys; from fedshift.catalog import resolve; "
        "from fedshift.core.config import load_config; "
        "from fedshift.runtime.rundir.results import run_dir_name; "
        "print(run_dir_name(resolve(load_config(None, sys.argv[1:]))))"
    )
    out = subprocess.run([sys.executable, "-c", code, *TOY, *over], cwd=tmp, env=env(),
                         capture_output=True, text=True, check=True)  # fmt: skip
    return tmp / "runs" / "x" / out.stdout.strip()


def overwrite_link(tmp: Path) -> Result:
    v = victim(tmp)
    link = toy_dir(tmp)
    link.parent.mkdir(parents=True)
    link.symlink_to(v, target_is_directory=True)
    res = fedshift(tmp, "run", *TOY, "train.rounds=1", "--out", "runs", "--overwrite", "--quiet")
    return Result(refused(res, "symbolic link"), crashed(res), lost(v))


def overwrite_foreign(tmp: Path) -> Result:
    run_dir = toy_dir(tmp)
    run_dir.parent.mkdir(parents=True)
    v = victim(tmp)
    shutil.move(v, run_dir)
    res = fedshift(tmp, "run", *TOY, "train.rounds=1", "--out", "runs", "--overwrite", "--quiet")
    return Result(refused(res, "not a fedshift run directory"), crashed(res), lost(run_dir))


def _suite(tmp: Path, **extra: object) -> Path:
    raw = {"name": "s", "dataset": {"name": "toyshift"}, "model": {"name": "lenet5"},
           "train": {"rounds": 1, "batch_size": 16}, **extra}  # fmt: skip
    path = tmp / "suite.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _cell_dir(tmp: Path, suite: Path) -> Path:
    code = (
        "import sys; from fedshift.bench import plan; "
        "print(plan(sys.argv[1], out='runs')[0].run_dir)"
    )
    out = subprocess.run([sys.executable, "-c", code, str(suite)], cwd=tmp, env=env(),
                         capture_output=True, text=True, check=True)  # fmt: skip
    return tmp / out.stdout.strip()


def bench_link(tmp: Path) -> Result:
    suite = _suite(tmp)
    cell = _cell_dir(tmp, suite)
    v = victim(tmp)
    cell.parent.mkdir(parents=True)
    cell.symlink_to(v, target_is_directory=True)
    res = fedshift(tmp, "bench", str(suite), "--out", "runs", "--workers", "1", "--quiet")
    return Result(refused(res, "symbolic link"), crashed(res.stderr), lost(v))


def flower_link(tmp: Path) -> Result:
    v = victim(tmp)
    link = toy_dir(tmp)
    link.parent.mkdir(parents=True)
    link.symlink_to(v, target_is_directory=True)
    res = fedshift(tmp, "flower", "simulate", *TOY, "train.rounds=1", "--out", "runs",
                   "--engine", "in-process", "--overwrite", "--quiet")  # fmt: skip
    return Result(refused(res, "symbolic link"), crashed(res), lost(v))


# ---------------------------------------------------------------------------- item 2
def received_run(tmp: Path) -> Path:
    """A finished run whose config.yaml names ``evilmod:Algo``, next to evilmod.py (made by
    its author, who named it on the command line); the marker reset, as just received."""
    (tmp / "evilmod.py").write_text(PLUGIN)
    res = fedshift(tmp, "run", *TOY, "train.rounds=2", "algorithm.name=evilmod:Algo",
                   "--out", "runs", "--quiet")  # fmt: skip
    if res.returncode != 0:
        raise RuntimeError(f"the author's run failed: {res.stderr[-500:]}")
    (tmp / "marker.txt").unlink()
    return next((tmp / "runs" / "x").iterdir())  # the only run there


def plugin_case(*args: str) -> Callable[[Path], Result]:
    def case(tmp: Path) -> Result:
        run_dir = received_run(tmp)
        argv = [a.replace("RUN", str(run_dir)) for a in args]
        res = fedshift(tmp, *argv)
        return Result(refused(res, "names plug-in code", "evilmod"), crashed(res), 0, imports(tmp))

    return case


def suite_plugin(tmp: Path) -> Result:
    (tmp / "evilmod.py").write_text(PLUGIN)
    suite = _suite(tmp, sweep={"algorithm.name": ["fedavg", "evilmod:Algo"]})
    res = fedshift(tmp, "bench", str(suite), "--out", "runs", "--workers", "1", "--quiet")
    return Result(refused(res, "names plug-in code"), crashed(res), 0, imports(tmp))


def allowed_plugin(tmp: Path) -> Result:
    """The user's yes: --allow-plugins imports it (counted as asked, not as unasked)."""
    run_dir = received_run(tmp)
    res = fedshift(tmp, "protocol", "cross-site", str(run_dir), "--out", "cs", "--quiet",
                   "--allow-plugins")  # fmt: skip
    return Result(res.returncode == 0 and imports(tmp) == 1, crashed(res), 0, 0)


def exiting_module(tmp: Path) -> Result:
    (tmp / "exitmod.py").write_text("import sys\nsys.exit(0)\n")
    res = fedshift(tmp, "run", *TOY, "train.rounds=1", "algorithm.name=exitmod:Algo",
                   "--out", "runs", "--quiet")  # fmt: skip
    return Result(refused(res, "exitmod", "sys.exit(0)"), crashed(res))


def shadowing_module(tmp: Path) -> Result:
    (tmp / "yaml.py").write_text(PLUGIN.split("from fedshift")[0])
    res = fedshift(tmp, "config", "show", *TOY)
    return Result(res.returncode == 0 and "dataset:" in res.stdout, crashed(res), 0, imports(tmp))


# ---------------------------------------------------------------------------- item 3
def ray_signal(sig: signal.Signals) -> Callable[[Path], Result]:
    def case(tmp: Path) -> Result:
        run_dir = toy_dir(tmp)
        proc = subprocess.Popen(
            [sys.executable, "-m", "fedshift", "flower", "simulate", *TOY, "train.rounds=12",
             "checkpoint.every=0", "checkpoint.minutes=0", "--out", "runs", "--quiet"],
            cwd=tmp, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        deadline = time.monotonic() + 600
        while (
            not (run_dir / "metrics.jsonl").is_file()
            or not (run_dir / "metrics.jsonl").read_text().strip()
        ):
            if proc.poll() is not None or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        proc.send_signal(sig)
        try:
            out, _ = proc.communicate(timeout=300)
        except subprocess.TimeoutExpired:  # the signal did not stop it: a hang
            proc.kill()
            out, _ = proc.communicate()
            return Result(False, crashed(out), note=f"still running 300 s after {sig.name}")
        code = 128 + int(sig)
        saved = (run_dir / "checkpoint.pt").is_file()
        ok = proc.returncode == code and saved and "flower simulate --resume" in out
        note = "" if ok else f"exit {proc.returncode}: {out[-300:]}"
        return Result(ok, crashed(out), note=note)

    return case


def wrong_engine(tmp: Path) -> Result:
    res = fedshift(tmp, "run", *TOY, "train.rounds=1", "--out", "runs", "--quiet")
    res = fedshift(tmp, "flower", "simulate", "--resume", str(toy_dir(tmp)))
    return Result(refused(res, "written by a native run"), crashed(res))


# ---------------------------------------------------------------------------- items 4-6
def finished(tmp: Path) -> Path:
    res = fedshift(tmp, "run", *TOY, "train.rounds=2", "checkpoint.every=1", "--out", "runs",
                   "--quiet")  # fmt: skip
    if res.returncode != 0:
        raise RuntimeError(res.stderr[-500:])
    [run_dir] = (tmp / "runs" / "x").iterdir()  # fedavg-toyshift-...-seed0-<digest>
    return run_dir


EDIT_CHECKPOINT = textwrap.dedent(
    """
    import sys
    from fedshift.runtime.rundir.checkpoint_io import read_checkpoint, write_checkpoint
    path, how = sys.argv[1], sys.argv[2]
    ck = read_checkpoint(path)
    if how == "round":
        ck["round"] = -1
    else:
        ck.pop("server")
    write_checkpoint(ck, path)
    """
)


def checkpoint_case(how: str) -> Callable[[Path], Result]:
    def case(tmp: Path) -> Result:
        run_dir = finished(tmp)
        subprocess.run([sys.executable, "-c", EDIT_CHECKPOINT, str(run_dir / "checkpoint.pt"),
                        how], env=env(), check=True)  # fmt: skip
        res = fedshift(tmp, "run", "--resume", str(run_dir), "train.rounds=3", "--quiet")
        field = "round" if how == "round" else "server"
        return Result(refused(res, "checkpoint.pt", f"field '{field}'"), crashed(res))

    return case


def selected_copied(tmp: Path) -> Result:
    for name in ("a", "b"):
        (tmp / name).mkdir()
    a = finished(tmp / "a")
    b = finished(tmp / "b")
    shutil.copy(b / "selected.pt", a / "selected.pt")
    code = textwrap.dedent(
        """
        import sys
        from fedshift.runtime.rundir.checkpoint_io import read_run_state
        from fedshift.runtime.rundir.saved import read_selected
        from fedshift.runtime.simulation import saved_config
        key = read_run_state(sys.argv[1])["run_key"]
        try:
            read_selected(sys.argv[1], saved_config(sys.argv[1]), key)
        except Exception as e:
            print(type(e).__name__, e)
        """
    )
    res = subprocess.run([sys.executable, "-c", code, str(a)], env=env(), capture_output=True,
                         text=True)  # fmt: skip
    return Result("belongs to another run" in res.stdout, crashed(res))


def summary_edited(command: str) -> Callable[[Path], Result]:
    def case(tmp: Path) -> Result:
        run_dir = finished(tmp)
        path = run_dir / "summary.json"
        s = json.loads(path.read_text())
        s["best_round"] = "three"
        path.write_text(json.dumps(s))
        if command == "report":
            res = fedshift(tmp, "report", "runs", "--out", "rep")
        else:
            res = fedshift(tmp, "protocol", "cross-site", str(run_dir), "--out", "cs", "--quiet")
        return Result(refused(res, "summary.json", "best_round"), crashed(res))

    return case


def config_case(*over: str, words: tuple[str, ...]) -> Callable[[Path], Result]:
    def case(tmp: Path) -> Result:
        res = fedshift(tmp, "run", *TOY, "train.rounds=1", *over, "--out", "runs", "--quiet")
        return Result(refused(res, *words), crashed(res))

    return case


def empty_weights(tmp: Path) -> Result:
    (tmp / "w.pt").write_bytes(b"")
    return config_case("model.weights=w.pt", words=("is empty",))(tmp)


def broken_plugin(tmp: Path) -> Result:
    (tmp / "badmod.py").write_text(
        "from fedshift.algorithms.fedavg import FedAvg\n\n"
        "class Algo(FedAvg):\n    def loss(self, ctx, x, y):\n        pass\n"
    )
    return config_case("algorithm.name=badmod:Algo", words=("loss returned None",))(tmp)


def formula_csv(tmp: Path) -> Result:
    run_dir = finished(tmp)
    path = run_dir / "summary.json"
    s = json.loads(path.read_text())
    evil = '=HYPERLINK("http://x","y")'
    first = s["clients"][0]
    s["clients"][0] = evil
    for key in ("test_per_client", "val_per_client"):
        s[key][evil] = s[key].pop(first)
    path.write_text(json.dumps(s))
    res = fedshift(tmp, "report", "runs", "--out", "rep")
    text = (tmp / "rep" / "report.csv").read_text() if res.returncode == 0 else ""
    return Result(res.returncode == 0 and "'=HYPERLINK" in text and "\n=" not in text,
                  crashed(res))  # fmt: skip


# ---------------------------------------------------------------------------- issue 48
def thesis(tmp: Path) -> Path:
    """The user's file a planted link points to."""
    path = tmp / "home" / "thesis.tex"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("years of work\n")
    return path


def changed(path: Path) -> int:
    return int(not path.is_file() or path.read_text() != "years of work\n")


def stopped_run(tmp: Path) -> Path:
    """A finished run of 1 round (the cases extend it to 2 with ``--resume``)."""
    res = fedshift(tmp, "run", *TOY, "train.rounds=1", "--out", "runs", "--quiet")
    if res.returncode != 0:
        raise RuntimeError(f"the run failed: {res.stderr[-500:]}")
    return next((tmp / "runs" / "x").iterdir())


def resume_link(name: str) -> Callable[[Path], Result]:
    """``run --resume`` (extending by a round) of a run directory with ``name`` a link."""

    def case(tmp: Path) -> Result:
        run_dir = stopped_run(tmp)
        v = thesis(tmp)
        (run_dir / name).unlink(missing_ok=True)
        (run_dir / name).symlink_to(v)
        res = fedshift(tmp, "run", "--resume", str(run_dir), "train.rounds=2", "--quiet")
        return Result(refused(res, "symbolic link", name), crashed(res), changed(v))

    return case


def bench_manifest_link(tmp: Path) -> Result:
    suite = _suite(tmp)
    v = thesis(tmp)
    (tmp / "runs" / "s").mkdir(parents=True)
    (tmp / "runs" / "s" / "bench.json").symlink_to(v)
    res = fedshift(tmp, "bench", str(suite), "--out", "runs", "--workers", "1", "--quiet")
    return Result(refused(res, "symbolic link", "bench.json"), crashed(res), changed(v))


def _collected_suite(tmp: Path) -> Path:
    suite = _suite(tmp)
    res = fedshift(tmp, "bench", str(suite), "--out", "runs", "--workers", "1", "--quiet")
    if res.returncode != 0:
        raise RuntimeError(f"the suite failed: {res.stderr[-500:]}")
    (tmp / "repo" / "results" / "old").mkdir(parents=True)
    (tmp / "repo" / "results" / "old" / "source.json").write_text("{}\n")
    (tmp / "repo" / "notes.tex").write_text("years of work\n")
    return tmp / "runs" / "s"


def _repo_lost(tmp: Path) -> int:
    return changed(tmp / "repo" / "notes.tex") + int(
        not (tmp / "repo" / "results" / "old" / "source.json").is_file()
    )


def collect_name(*extra: str, cwd_suite: bool = False) -> Callable[[Path], Result]:
    """``claims collect`` with a ``--name`` / ``--protocol`` that escapes results/ (or '.'
    from inside the suite folder, which must collect under the folder's own name)."""

    def case(tmp: Path) -> Result:
        folder = _collected_suite(tmp)
        args = [a.replace("ABS", str(tmp / "repo")) for a in extra]
        results = str(tmp / "repo" / "results")
        src, where = (".", folder) if cwd_suite else (str(folder), tmp)
        res = fedshift(where, "claims", "collect", src, "--command", "x", "--results",
                       results, *args)  # fmt: skip
        ok = (
            res.returncode == 0 and (tmp / "repo" / "results" / "s" / "source.json").is_file()
            if cwd_suite
            else refused(res)
        )
        return Result(ok, crashed(res), _repo_lost(tmp))

    return case


def collect_linked(tmp: Path) -> Result:
    """A received suite whose cell's config.yaml links to ~/.ssh/id_rsa: not copied."""
    folder = _collected_suite(tmp)
    key = tmp / "home" / ".ssh" / "id_rsa"
    key.parent.mkdir(parents=True)
    key.write_text("PRIVATE KEY\n")
    cell = next(p for p in folder.iterdir() if p.is_dir())
    (cell / "config.yaml").unlink()
    (cell / "config.yaml").symlink_to(key)
    res = fedshift(tmp, "claims", "collect", str(folder), "--command", "x", "--results",
                   str(tmp / "repo" / "results"))  # fmt: skip
    copied = any(
        "PRIVATE" in p.read_text() for p in (tmp / "repo").rglob("*") if p.is_file()
    )
    return Result(refused(res, "symbolic link") and not copied, crashed(res), _repo_lost(tmp))


def report_fifo(tmp: Path) -> Result:
    """A summary.json that is a FIFO: refused by type, never a hang."""
    run_dir = stopped_run(tmp)
    (run_dir / "summary.json").unlink()
    os.mkfifo(run_dir / "summary.json")
    try:
        res = fedshift(tmp, "report", "runs", "--out", "rep", timeout=60)
    except subprocess.TimeoutExpired:
        return Result(False, note="hung")
    return Result(refused(res, "FIFO"), crashed(res))


# items 3 (the dataset contract), 4 (read-only commands, the current folder) and 6
# (estimates before allocation, files refused by type)
BROKEN_DATASET = """\
from dataclasses import dataclass
import sys
import torch
from fedshift.core.federation import ClientData, Federation, Split

@dataclass
class P:
    fault: str = "none"

class Data:
    name = "broken"
    Params = P
    task = "classification"

    @staticmethod
    def load(p):
        if p.fault == "exit":
            sys.exit(0)
        def split(y):
            return Split(torch.rand(len(y), 3, 28, 28), y)
        y = torch.arange(12) % 3
        bad = {"range": y + 2, "float": y.float()}.get(p.fault, y)
        clients = [ClientData(n, split(bad), split(y), split(y)) for n in ("a", "b")]
        if p.fault == "names":
            clients[1].name = "a"
        return Federation("broken", clients, ["h", "v", "d"], (3, 28, 28))
"""


def dataset_contract(fault: str, *words: str) -> Callable[[Path], Result]:
    def case(tmp: Path) -> Result:
        (tmp / "brokendata.py").write_text(BROKEN_DATASET)
        res = fedshift(tmp, "run", "dataset.name=brokendata:Data", f"dataset.fault={fault}",
                       "model.name=cnn", "train.rounds=1", "--out", "runs", "--quiet")  # fmt: skip
        left = [p for p in (tmp / "runs").rglob("*") if p.is_file()]  # none: nothing ran
        ok = refused(res, "brokendata:Data.load", *words) and not left
        return Result(ok, crashed(res), note="" if ok else res.stderr[-300:])

    return case


def received_config(tmp: Path) -> Path:
    (tmp / "evilmod.py").write_text(PLUGIN)
    raw = {"dataset": {"name": "toyshift"}, "algorithm": {"name": "evilmod:Algo"},
           "model": {"name": "lenet5"}, "train": {"rounds": 1, "batch_size": 16}}  # fmt: skip
    path = tmp / "received.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def config_show_plugin(tmp: Path) -> Result:
    res = fedshift(tmp, "config", "show", "-c", str(received_config(tmp)))
    ok = res.returncode == 0 and res.stdout.startswith("# not imported: algorithm.name")
    return Result(ok, crashed(res), 0, imports(tmp))


def data_check_plugin(tmp: Path) -> Result:
    res = fedshift(tmp, "data", "check", "-c", str(received_config(tmp)), "--out", "dc")
    return Result(refused(res, "names plug-in code", "--allow-plugins"), crashed(res), 0,
                  imports(tmp))  # fmt: skip


def report_plugin(tmp: Path) -> Result:
    """A received run whose summary.json records no defaults (an older fedshift's)."""
    received_run(tmp)
    (path,) = (tmp / "runs").rglob("summary.json")
    s = json.loads(path.read_text())
    s.pop("defaults", None)
    path.write_text(json.dumps(s))
    res = fedshift(tmp, "report", "runs", "--out", "rep")
    return Result(res.returncode == 0 and "only reads" in res.stderr, crashed(res), 0,
                  imports(tmp))  # fmt: skip


def list_dist_info(tmp: Path) -> Result:
    info = tmp / "evil-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: evil\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[fedshift.algorithms]\nsneaky = evilmod:Algo\n")
    (tmp / "evilmod.py").write_text(PLUGIN)
    res = fedshift(tmp, "list")
    return Result(res.returncode == 0 and "sneaky" not in res.stdout, crashed(res), 0,
                  imports(tmp))  # fmt: skip


MAKE_FILES = textwrap.dedent(
    """
    import gzip, io, os, struct, sys, zipfile
    import numpy as np
    kind, root = sys.argv[1], sys.argv[2]
    os.makedirs(root, exist_ok=True)
    y = np.arange(30) % 3
    if kind == "npz-bomb":  # a few kB claiming 3 TB
        head = io.BytesIO()
        np.lib.format.write_array_header_1_0(
            head, {"descr": "|u1", "fortran_order": False, "shape": (10**6, 3, 1000, 1000)})
        with zipfile.ZipFile(f"{root}/a.npz", "w", zipfile.ZIP_DEFLATED) as z:
            z.writestr("x.npy", head.getvalue() + bytes(4096))
            b = io.BytesIO(); np.save(b, y); z.writestr("y.npy", b.getvalue())
    elif kind == "npy-fifo":
        os.makedirs(f"{root}/a", exist_ok=True)
        np.save(f"{root}/a/y.npy", y)
        os.mkfifo(f"{root}/a/x.npy")
    elif kind == "label":
        y[3] = 10**12
        np.savez(f"{root}/a.npz", x=np.zeros((30, 8, 8), np.uint8), y=y)
    elif kind == "nifti-bomb":  # a .nii.gz whose header claims 30000^3 int16 voxels
        import nibabel
        buf = io.BytesIO()
        img = nibabel.Nifti1Image(np.zeros((4, 4, 4), np.int16), np.eye(4))
        img.to_file_map({"image": nibabel.FileHolder(fileobj=buf)})
        raw = bytearray(buf.getvalue())
        struct.pack_into("<8h", raw, 40, 3, 30000, 30000, 30000, 1, 1, 1, 1)
        for sub in ("images", "masks"):
            os.makedirs(f"{root}/s1/{sub}", exist_ok=True)
            for i in range(5):
                with open(f"{root}/s1/{sub}/case{i}.nii.gz", "wb") as f:
                    f.write(gzip.compress(bytes(raw)))
    elif kind == "folders":
        from PIL import Image
        for site in ("s1", "s2"):
            for c in ("a", "b"):
                os.makedirs(f"{root}/{site}/{c}", exist_ok=True)
                for i in range(6):
                    Image.new("RGB", (8, 8), (40 * i, 0, 0)).save(f"{root}/{site}/{c}/{i}.png")
    """
)


def loader_case(kind: str, dataset: str, keys: tuple[str, ...], *words: str):
    def case(tmp: Path) -> Result:
        subprocess.run([sys.executable, "-c", MAKE_FILES, kind, str(tmp / "data")], env=env(),
                       check=True)  # fmt: skip
        res = fedshift(tmp, "data", "show", dataset, f"root={tmp / 'data'}", *keys, timeout=120)
        return Result(refused(res, *words), crashed(res))

    return case


CASES_48: list[tuple[str, str, Callable[[Path], Result]]] = [
    ("48 contract", "dataset plug-in, labels out of range", dataset_contract("range", "outside")),
    ("48 contract", "dataset plug-in, float labels", dataset_contract("float", "int64")),
    ("48 contract", "dataset plug-in, a client name twice", dataset_contract("names", "twice")),
    ("48 contract", "dataset plug-in calling sys.exit(0)", dataset_contract("exit", "sys.exit")),
    ("48 read-only", "config show of a received config", config_show_plugin),
    ("48 read-only", "data check of a received config", data_check_plugin),
    ("48 read-only", "report of a received run (no defaults)", report_plugin),
    ("48 read-only", "list next to a *.dist-info", list_dist_info),
    (
        "48 estimates",
        "arrays .npz claiming 3 TB",
        loader_case("npz-bomb", "arrays", (), "needs about"),
    ),
    ("48 estimates", "arrays x.npy a FIFO", loader_case("npy-fifo", "arrays", (), "FIFO")),
    ("48 estimates", "arrays label 10^12", loader_case("label", "arrays", (), "renumber")),
    (
        "48 estimates",
        "segfolders .nii.gz claiming 108 TB",
        loader_case("nifti-bomb", "segfolders", (), "needs about"),
    ),
    (
        "48 estimates",
        "folders at dataset.size=100000",
        loader_case("folders", "folders", ("size=100000", "cache=false"), "dataset.size"),
    ),
]


CASES: list[tuple[str, str, Callable[[Path], Result]]] = [
    ("1 deletion", "run --overwrite, run dir a link to a user's folder", overwrite_link),
    ("1 deletion", "run --overwrite, a user's folder with a config.yaml", overwrite_foreign),
    ("1 deletion", "bench, cell path a link to a user's folder", bench_link),
    ("1 deletion", "flower simulate --overwrite, run dir a link", flower_link),
    (
        "2 plug-ins",
        "run --resume of a received run dir",
        plugin_case("run", "--resume", "RUN", "--quiet"),
    ),
    (
        "2 plug-ins",
        "protocol cross-site of it",
        plugin_case("protocol", "cross-site", "RUN", "--out", "cs", "--quiet"),
    ),
    (
        "2 plug-ins",
        "flower simulate --resume of it",
        plugin_case("flower", "simulate", "--resume", "RUN", "--quiet"),
    ),
    ("2 plug-ins", "bench of a suite naming a plug-in", suite_plugin),
    ("2 plug-ins", "the same with --allow-plugins (asked)", allowed_plugin),
    ("2 plug-ins", "a module calling sys.exit(0) on import", exiting_module),
    ("2 plug-ins", "python -m fedshift next to a yaml.py", shadowing_module),
    ("3 signals", "SIGINT to flower simulate on Ray", ray_signal(signal.SIGINT)),
    ("3 signals", "SIGTERM to flower simulate on Ray", ray_signal(signal.SIGTERM)),
    ("3 signals", "native run dir to flower simulate --resume", wrong_engine),
    ("4 content", "checkpoint.pt with round=-1", checkpoint_case("round")),
    ("4 content", "checkpoint.pt without 'server'", checkpoint_case("server")),
    ("4 content", "selected.pt of another run", selected_copied),
    ("4 content", "summary.json edited, report", summary_edited("report")),
    ("4 content", "summary.json edited, cross-site", summary_edited("cross-site")),
    (
        "5 errors",
        "dataset.train_size=10^12",
        config_case("dataset.train_size=1000000000000", words=("needs about",)),
    ),
    (
        "5 errors",
        "model.width=10^6",
        config_case("model.name=cnn", "model.width=1000000", words=("needs about",)),
    ),
    ("5 errors", "train.lr=1e300", config_case("train.lr=1e300", words=("float32",))),
    ("5 errors", "zero-byte model.weights", empty_weights),
    ("5 errors", "plug-in whose loss returns None", broken_plugin),
    ("6 smaller", "report.csv with a formula client name", formula_csv),
    ("7 links (48)", "run --resume, run.lock a link", resume_link("run.lock")),
    ("7 links (48)", "run --resume, metrics.jsonl a link", resume_link("metrics.jsonl")),
    ("7 links (48)", "run --resume, checkpoint.pt.tmp a link", resume_link("checkpoint.pt.tmp")),
    ("7 links (48)", "bench, bench.json a link", bench_manifest_link),
    ("7 links (48)", "claims collect --name ..", collect_name("--name", "..")),
    ("7 links (48)", "claims collect --protocol ..", collect_name("--protocol", "..")),
    ("7 links (48)", "claims collect --name /abs", collect_name("--name", "ABS")),
    ("7 links (48)", "claims collect . from inside", collect_name(cwd_suite=True)),
    ("7 links (48)", "claims collect, config.yaml a link", collect_linked),
    ("7 links (48)", "report, summary.json a FIFO", report_fifo),
]
CASES += CASES_48


def all_cases() -> list[tuple[str, str, Callable[[Path], Result]]]:
    """:data:`CASES`, then issue 48's content cases (:mod:`content_inputs`, which imports this
    module's helpers) after this item's own."""
    import content_inputs

    at = max(i for i, (item, _, _) in enumerate(CASES) if item == "4 content") + 1
    return [*CASES[:at], *content_inputs.CASES, *CASES[at:]]


def run_cases(tmp: Path, ray: bool = True, log=print) -> dict[str, Row]:
    """Run every case (the Ray ones only with ``ray``); the table rows by item."""
    rows: dict[str, Row] = {}
    for i, (item, label, case) in enumerate(all_cases()):
        if not ray and "Ray" in label:
            continue
        folder = tmp / f"case{i}"
        folder.mkdir()
        log(f"  {item}: {label}...")
        try:
            r = case(folder)
        except Exception as e:  # the harness itself: counted as not as intended
            r = Result(False, note=f"{type(e).__name__}: {e}")
        row = rows.setdefault(item, Row(item))
        row.cases += 1
        row.intended += r.intended
        row.tracebacks += r.traceback
        row.lost += r.lost
        row.ran += r.ran
        if not r.intended or r.note:
            row.notes.append(f"{label}: {r.note or 'not as intended'}")
        shutil.rmtree(folder, ignore_errors=True)
    return rows


def table(rows: dict[str, Row]) -> str:
    head = ("| item | cases | as intended | tracebacks | files outside --out lost | "
            "code run unasked |\n|---|---|---|---|---|---|")  # fmt: skip
    lines = [head]
    total = Row("**all**")
    for r in rows.values():
        lines.append(
            f"| {r.item} | {r.cases} | {r.intended} | {r.tracebacks} | {r.lost} | {r.ran} |"
        )
        for k in ("cases", "intended", "tracebacks", "lost", "ran"):
            setattr(total, k, getattr(total, k) + getattr(r, k))
    lines.append(f"| **all** | {total.cases} | {total.intended} | {total.tracebacks} | "
                 f"{total.lost} | {total.ran} |")  # fmt: skip
    for r in rows.values():
        lines += [f"  {r.item}: {n}" for n in r.notes]
    return "\n".join(lines)
