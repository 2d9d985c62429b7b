"""Scripted faults against real ``fedshift`` processes: is anything lost, mixed or wrong?

Every fault runs the real command line on a small config (FedAvg on ``toyshift``, 30 rounds,
a checkpoint every 3 rounds, evaluation every round) and recovers the way a user would
(``fedshift run --resume DIR``). A recovered run is compared with one uninterrupted run of the
same config: its ``summary.json`` (everything but wall time and the run directory) and every
row of its ``metrics.jsonl``.

Faults:

* ``kill -9``: SIGKILL at a random round (``--kills`` times; a random extra delay lands some
  kills mid-round or mid-checkpoint), then resume;
* ``SIGINT`` / ``SIGTERM``: the run saves its last whole round and exits 130 / 143, then
  resume;
* ``disk full``: the run's ``--out`` on a tmpfs too small for a second checkpoint (root only;
  skipped otherwise): the run must stop with ``fedshift: error:`` (no traceback), keep its
  previous checkpoint, and resume once the tmpfs is grown;
* ``concurrent``: two identical ``fedshift run --new`` started together (two directories,
  both right), two ``--resume`` of one stopped run (one runs, the other is refused), two
  ``fedshift bench`` of one suite (one runs, the other is refused; no cell runs twice).

Columns: faults injected, runs recovered (the recovery command succeeded and the run has its
results), results identical to the uninterrupted run, data lost (a recovered run whose
metric rows are missing, doubled or different, or a run with no results at all). Exit status
1 if any data was lost or any result differs.

A second table (``--part inputs``; :mod:`unsafe_inputs`) feeds the commands unsafe inputs
(issue 28): symbolic links and foreign folders where a run directory goes, plug-in names in
run directories and suites from elsewhere, SIGINT / SIGTERM to a simulation on Ray,
checkpoints, ``selected.pt`` and ``summary.json`` with wrong content, sizes that cannot fit
in memory, CSV formulas; and issue 48's content cases (:mod:`content_inputs`: a decode cache
altered, checkpoints that do not fit the run, scores out of range, a forged committed cell).
Its columns: cases, handled as intended, tracebacks, files outside ``--out`` lost, code run
unasked; exit status 1 unless the last two are 0 and every case is
as intended.

    python benchmarks/faults.py                 # 20 kills, ~4 minutes on 2 cores
    python benchmarks/faults.py --kills 5 --seed 1
    python benchmarks/faults.py --part inputs   # the unsafe inputs only, ~9 minutes
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

NAME = "faults"
ROUNDS = 30
BASE = [
    "dataset.name=toyshift",
    "model.name=lenet5",
    "train.batch_size=16",
    f"train.rounds={ROUNDS}",
    "checkpoint.every=3",
    f"name={NAME}",
]
SUITE = f"""\
name: {NAME}-suite
dataset: {{name: toyshift}}
model: {{name: lenet5}}
train: {{rounds: 8, batch_size: 16}}
sweep:
  algorithm.name: [fedavg, fedprox]
  seed: [0, 1]
"""
VOLATILE = {"wall_s", "run_dir", "label"}
#: one torch thread everywhere: results compared bit for bit need the same thread count
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def fedshift(*args: str) -> list[str]:
    return [sys.executable, "-m", "fedshift", *args, "--quiet"]


@dataclass
class Tally:
    """One kind of fault: how many were injected and how their runs ended."""

    injected: int = 0
    recovered: int = 0
    identical: int = 0
    lost: int = 0
    notes: list[str] = field(default_factory=list)
    #: rounds already in metrics.jsonl when each signal was sent
    at: list[int] = field(default_factory=list)

    def add(self, recovered: bool, identical: bool, lost: bool, note: str = "") -> None:
        self.injected += 1
        self.recovered += recovered
        self.identical += identical
        self.lost += lost
        if note:
            self.notes.append(note)


@dataclass
class Outcome:
    summary: dict | None
    rows: list[str]


def outcome(run_dir: Path) -> Outcome:
    """A run directory's results (``None`` summary when it has none or it is unreadable)."""
    try:
        s = json.loads((run_dir / "summary.json").read_text())
        summary = {k: v for k, v in s.items() if k not in VOLATILE}
    except (OSError, ValueError):
        summary = None
    try:
        rows = (run_dir / "metrics.jsonl").read_text().splitlines()
    except OSError:
        rows = []
    return Outcome(summary, rows)


def judge(got: Outcome, want: Outcome) -> tuple[bool, bool, bool]:
    """(recovered, identical, data lost) of a run against the uninterrupted one."""
    recovered = got.summary is not None
    identical = recovered and got.summary == want.summary and got.rows == want.rows
    lost = not recovered or got.rows != want.rows
    return recovered, identical, lost


def start(out: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        fedshift("run", *BASE, *extra, "--out", str(out)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
    )


def resume(run_dir: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        fedshift("run", "--resume", str(run_dir)), capture_output=True, text=True, env=ENV
    )


def run_dir_of(out: Path) -> Path:
    """The directory `fedshift run` gives the BASE config under ``out``."""
    from fedshift.catalog import resolve
    from fedshift.core.config import load_config
    from fedshift.runtime.rundir.results import run_dir_name

    return out / NAME / run_dir_name(resolve(load_config(None, BASE)))


def rounds_done(run_dir: Path) -> int:
    try:
        lines = (run_dir / "metrics.jsonl").read_text().splitlines()
        return json.loads(lines[-1])["round"] if lines else 0
    except (OSError, ValueError, KeyError):
        return 0


def stop_at(proc: subprocess.Popen, run_dir: Path, target: int, sig: int, delay: float) -> int:
    """Send ``sig`` once ``target`` rounds are in metrics.jsonl (plus ``delay`` s); returns
    the rounds done when it was sent (-1: the run finished first)."""
    while proc.poll() is None:
        done = rounds_done(run_dir)
        if done >= target:
            time.sleep(delay)
            done = rounds_done(run_dir)
            os.kill(proc.pid, sig)
            proc.wait()
            return done
        time.sleep(0.005)
    return -1


def interrupted(
    tmp: Path, want: Outcome, sig: int, n: int, rng: random.Random, tally: Tally
) -> None:
    code = {signal.SIGKILL: -signal.SIGKILL, signal.SIGINT: 130, signal.SIGTERM: 143}[sig]
    for i in range(n):
        out = tmp / f"{sig.name}-{i}"
        target, delay = rng.randint(1, ROUNDS - 2), rng.uniform(0, 0.15)
        proc = start(out)
        at = stop_at(proc, run_dir_of(out), target, sig, delay)
        err = proc.stderr.read() if proc.stderr else ""
        tally.at.append(at)
        if at < 0 or proc.returncode != code:
            note = f"#{i}: exit {proc.returncode} at round {at}: {err[-300:]}"
            tally.add(False, False, True, note)
            continue
        res = resume(run_dir_of(out))
        note = "" if res.returncode == 0 else f"#{i}: resume exit {res.returncode}: "
        note += res.stderr[-300:] if note else ""
        tally.add(*judge(outcome(run_dir_of(out)), want), note)
        shutil.rmtree(out, ignore_errors=True)


def disk_full(tmp: Path, want: Outcome, ckpt_bytes: int, tally: Tally) -> str | None:
    """Run on a tmpfs with room for about one checkpoint; grow it and resume."""
    if os.geteuid() != 0 or not shutil.which("mount"):
        return "skipped: needs root to mount a tmpfs"
    mnt = tmp / "tmpfs"
    mnt.mkdir()
    size = int(1.6 * ckpt_bytes) + 200_000  # selected.pt + metrics + a checkpoint, not two
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)])
    if r.returncode != 0:
        return "skipped: mount -t tmpfs failed"
    try:
        proc = start(mnt)
        _, err = proc.communicate()
        full = proc.returncode == 2 and "fedshift: error:" in err and "Traceback" not in err
        run_dir = run_dir_of(mnt)
        note = "" if full else f"exit {proc.returncode}, stderr: {err[-400:]}"
        had = (run_dir / "checkpoint.pt").is_file()
        subprocess.run(["mount", "-o", "remount,size=64m", str(mnt)], check=True)
        res = resume(run_dir)
        if res.returncode != 0:
            note += f" resume exit {res.returncode}: {res.stderr[-300:]}"
        recovered, identical, lost = judge(outcome(run_dir), want)
        tally.add(recovered and full, identical, lost, note)
        return None if had else "note: the disk filled before the first checkpoint"
    finally:
        subprocess.run(["umount", "-l", str(mnt)])


def concurrent_runs(tmp: Path, want: Outcome, tally: Tally) -> None:
    """Two identical runs started together (``--new``: a taken directory is not an error):
    two directories, each equal to the baseline."""
    out = tmp / "two-runs"
    procs = [start(out, "--new"), start(out, "--new")]
    codes = [p.wait() for p in procs]
    dirs = sorted((out / NAME).iterdir())
    ok = codes == [0, 0] and len([d for d in dirs if d.is_dir()]) == 2
    results = [judge(outcome(d), want) for d in dirs if d.is_dir()]
    tally.add(
        ok and all(r[0] for r in results),
        ok and all(r[1] for r in results),
        not ok or any(r[2] for r in results),
        "" if ok else f"exit codes {codes}, dirs {[d.name for d in dirs]}",
    )


def concurrent_resumes(tmp: Path, want: Outcome, tally: Tally) -> None:
    """Two ``--resume`` of one stopped run: one continues, the other is refused."""
    out = tmp / "two-resumes"
    proc = start(out)
    stop_at(proc, run_dir_of(out), 5, signal.SIGINT, 0)
    cmd = fedshift("run", "--resume", str(run_dir_of(out)))
    kw = {"stdout": subprocess.DEVNULL, "stderr": subprocess.PIPE, "text": True, "env": ENV}
    procs = [subprocess.Popen(cmd, **kw), subprocess.Popen(cmd, **kw)]
    ends = [(p.wait(), p.stderr.read() if p.stderr else "") for p in procs]
    codes = sorted(c for c, _ in ends)
    refused = [e for c, e in ends if c == 2]
    ok = codes == [0, 2] and "fedshift: error:" in refused[0]
    recovered, identical, lost = judge(outcome(run_dir_of(out)), want)
    note = "" if ok else f"exit codes {codes}: {[e[-200:] for _, e in ends]}"
    tally.add(ok and recovered, ok and identical, lost, note)


def concurrent_bench(tmp: Path, tally: Tally) -> None:
    """Two ``fedshift bench`` of one suite: one runs it, the other is refused; then the
    suite equals a bench run alone."""
    suite = tmp / "suite.yaml"
    suite.write_text(SUITE)

    def bench(out: Path) -> subprocess.Popen:
        cmd = fedshift("bench", str(suite), "--workers", "1", "--out", str(out))
        return subprocess.Popen(
            cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=ENV
        )

    alone = tmp / "bench-alone"
    bench(alone).wait()
    out = tmp / "bench-two"
    procs = [bench(out), bench(out)]
    ends = [(p.wait(), p.stderr.read() if p.stderr else "") for p in procs]
    codes = sorted(c for c, _ in ends)
    ok = codes == [0, 2] and any("fedshift: error:" in e for c, e in ends if c == 2)
    cells = sorted(d.name for d in (alone / f"{NAME}-suite").iterdir() if d.is_dir())
    got = [outcome(out / f"{NAME}-suite" / c) for c in cells]
    want = [outcome(alone / f"{NAME}-suite" / c) for c in cells]
    same = [g.summary is not None and g.summary == w.summary and g.rows == w.rows
            for g, w in zip(got, want, strict=True)]  # fmt: skip
    note = "" if ok else f"exit codes {codes}: {[e[-200:] for _, e in ends]}"
    tally.add(ok and all(g.summary for g in got), ok and all(same), not all(same), note)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kills", type=int, default=20, help="kill -9 trials (default 20)")
    ap.add_argument("--signals", type=int, default=3, help="SIGINT and SIGTERM trials each")
    ap.add_argument("--seed", type=int, default=0, help="seed of the fault schedule")
    ap.add_argument("--json", help="also write the table as JSON here")
    ap.add_argument(
        "--part",
        choices=("all", "faults", "inputs"),
        default="all",
        help="faults: kills, signals, disk, concurrency; inputs: unsafe inputs (issue 28)",
    )
    ap.add_argument("--no-ray", action="store_true", help="inputs: skip the two Ray cases")
    args = ap.parse_args()
    bad = 0
    if args.part in ("all", "faults"):
        bad |= faults(args)
    if args.part in ("all", "inputs"):
        bad |= inputs(args)
    return bad


def inputs(args: argparse.Namespace) -> int:
    """The unsafe-inputs table (:mod:`unsafe_inputs`); 1 if anything was lost or ran."""
    import unsafe_inputs

    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as name:
        log = lambda text: print(text, file=sys.stderr, flush=True)  # noqa: E731
        log("unsafe inputs:")
        rows = unsafe_inputs.run_cases(Path(name), ray=not args.no_ray, log=log)
    print(f"\nunsafe inputs against `fedshift` (issue 28), {time.perf_counter() - t0:.0f} s\n")
    print(unsafe_inputs.table(rows))
    if args.json:
        path = Path(args.json).with_suffix(".inputs.json")
        path.write_text(json.dumps({k: vars(r) for k, r in rows.items()}, indent=2) + "\n")
    total = [(r.lost, r.ran, r.cases - r.intended) for r in rows.values()]
    return 1 if any(any(t) for t in total) else 0


def faults(args: argparse.Namespace) -> int:
    """The kill / signal / disk / concurrency table; 1 if data was lost or results differ."""
    rng = random.Random(args.seed)
    table: dict[str, Tally] = {}
    skipped: dict[str, str] = {}
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        base = tmp / "baseline"
        if start(base).wait() != 0:
            raise SystemExit("the uninterrupted baseline run failed")
        want = outcome(run_dir_of(base))
        ckpt_bytes = (run_dir_of(base) / "checkpoint.pt").stat().st_size
        for label, sig, n in (
            ("kill -9", signal.SIGKILL, args.kills),
            ("SIGINT", signal.SIGINT, args.signals),
            ("SIGTERM", signal.SIGTERM, args.signals),
        ):
            print(f"{label}: {n} trials...", file=sys.stderr, flush=True)
            interrupted(tmp, want, sig, n, rng, table.setdefault(label, Tally()))
        print("disk full...", file=sys.stderr, flush=True)
        msg = disk_full(tmp, want, ckpt_bytes, table.setdefault("disk full", Tally()))
        if msg:
            skipped["disk full"] = msg
        print("concurrent starts...", file=sys.stderr, flush=True)
        concurrent_runs(tmp, want, table.setdefault("two runs at once", Tally()))
        concurrent_resumes(tmp, want, table.setdefault("two --resume at once", Tally()))
        concurrent_bench(tmp, table.setdefault("two bench at once", Tally()))
    print(f"\nfaults against `fedshift run` ({' '.join(BASE)}); seed {args.seed}, "
          f"{time.perf_counter() - t0:.0f} s\n")  # fmt: skip
    print("| fault | injected | recovered | identical to uninterrupted | data lost |")
    print("|---|---|---|---|---|")
    total = Tally()
    for label, t in table.items():
        extra = f" ({skipped[label]})" if label in skipped else ""
        print(f"| {label}{extra} | {t.injected} | {t.recovered} | {t.identical} | {t.lost} |")
        for k in ("injected", "recovered", "identical", "lost"):
            setattr(total, k, getattr(total, k) + getattr(t, k))
    print(f"| **all** | {total.injected} | {total.recovered} | {total.identical} | {total.lost} |")
    for label, t in table.items():
        if t.at:
            print(f"  {label}: signalled after rounds {sorted(t.at)}")
        for note in t.notes:
            print(f"  {label} {note.strip()}")
    if args.json:
        rows = {k: {f: getattr(t, f) for f in ("injected", "recovered", "identical", "lost")}
                for k, t in table.items()}  # fmt: skip
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")
    bad = total.lost or total.identical < total.injected
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
