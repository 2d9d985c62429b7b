"""Where the test suite's time goes: per-test CPU, the machine's CPU, and what runs out of
sight.

CI runs `make test` on 2 cores and the suite must stay under 15 minutes; on 2 cores it is
CPU-bound (both cores busy from start to end), so what to cut is measured in CPU seconds,
not in pytest's ``--durations`` (a test's wall time there is mostly other workers' CPU).
This script runs pytest (any arguments; by default the whole suite as ``make test``'s
first pass runs it, pytest-xdist included) with itself as a plug-in that records, for every
test, the CPU of its worker process and of that worker's child processes during the test
(CLI runs, pool workers, SuperNodes and the ClientApps they reaped; below), and reads
the machine's busy CPU (Linux ``/proc/stat``) before and after pytest. It prints the totals,
the files and the tests that cost most, and the CPU no test accounts for: processes whose
CPU never reaches a worker's child (orphans: Ray's daemons and actors, the processes of a
killed SuperNode) and pytest-xdist's own collection and scheduling.

Run it on an otherwise idle machine (the machine's CPU counts every process)::

    python benchmarks/suite_cost.py                         # the whole suite (~15 min on 2 cores)
    python benchmarks/suite_cost.py tests/flower -n 0       # any pytest arguments
    python benchmarks/suite_cost.py -m "not process" --write-costly tests/costly.json

The last one measures the in-process tests twice, their CPU, then (coverage.py) the lines
of fedshift each runs, and rewrites ``tests/costly.json``: the tests ``make check`` leaves
out (tests/conftest.py; how they are chosen: ``benchmarks/fast_tier.py``).

The per-test rows are kept as JSON lines in ``--keep DIR`` (its old rows are removed
first; default: a temporary folder, removed). A worker's child processes are charged to the
tests during which they ran, whenever they are reaped: at the end of each test the CPU of
every child still there (running, or exited and not yet reaped: a ``Popen`` nobody waited
for is reaped by the next ``Popen``, in a later test) is read from ``/proc`` and charged,
and what was charged so far is taken off when the process is reaped (the kernel then adds
all of it to the worker's children's CPU). A module fixture's processes (a Flower
deployment, a worker pool) count at each test they served. Grandchildren count when their
parent reaps them.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import pytest

#: the folder the plug-in writes its rows to (one JSON-lines file per pytest process)
OUT_ENV = "SUITE_COST_DIR"
#: the folder the plug-in writes its coverage data to (``--write-costly``'s second pass)
COV_ENV = "SUITE_COST_COVERAGE"
_COVERAGE = None
ROOT = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------ the plug-in (in pytest)
def _cpu() -> tuple[float, float]:
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime, kids.ru_utime + kids.ru_stime


def children_cpu(parent: int) -> dict[int, float]:
    """CPU seconds of each child process of ``parent`` not yet reaped (running or exited),
    with the children it reaped itself: what reaping it will add to ``parent``'s
    RUSAGE_CHILDREN. Empty without Linux's ``/proc``."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[int, float] = {}
    for entry in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = entry.read_text()
        except OSError:  # gone meanwhile
            continue
        # after the command name (in parentheses, may hold spaces): state, ppid, ...; utime
        # stime cutime cstime are fields 14-17 of proc(5), 12-15 after the name
        fields = text[text.rindex(")") + 2 :].split()
        if int(fields[1]) == parent:
            out[int(entry.parent.name)] = sum(int(v) for v in fields[11:15]) / tick
    return out


#: CPU already charged to a test, per child process of this worker not yet reaped
_CHARGED: dict[int, float] = {}


def _children_charge(kids0: float, kids1: float) -> float:
    """The CPU of this worker's child processes during one test: what reaping added
    (``kids1 - kids0``) less what earlier tests were charged for the processes reaped, plus
    what the children still here used since they were last read."""
    now = children_cpu(os.getpid())
    reaped = sum(_CHARGED.pop(pid) for pid in list(_CHARGED) if pid not in now)
    grown = sum(cpu - _CHARGED.get(pid, 0.0) for pid, cpu in now.items())
    _CHARGED.update(now)
    return kids1 - kids0 - reaped + grown


def _start_coverage() -> None:
    """With ``$SUITE_COST_COVERAGE`` set (the coverage pass of ``--write-costly``): measure
    which lines of fedshift each test runs in this process (coverage.py, one context per
    test), from its first test on (xdist's controller runs none and measures nothing),
    saved in that folder when pytest ends."""
    global _COVERAGE
    import coverage

    _COVERAGE = coverage.Coverage(data_file=str(Path(os.environ[COV_ENV]) / "cov"),
                                  data_suffix=True, source_pkgs=["fedshift"],
                                  config_file=False)  # fmt: skip
    _COVERAGE.start()


def pytest_unconfigure(config) -> None:
    if _COVERAGE is not None:
        _COVERAGE.stop()
        _COVERAGE.save()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Setup, call and teardown of one test: its worker's CPU, its children's CPU
    and its wall time, appended to this process's file; in the coverage pass, the lines it
    runs under its node id (a coverage context)."""
    if _COVERAGE is None and os.environ.get(COV_ENV):
        _start_coverage()
    if _COVERAGE is not None:
        _COVERAGE.switch_context(item.nodeid)
    out = os.environ.get(OUT_ENV)
    if not out:
        yield
        return
    # what children did outside every test (before the first one, between two) is nobody's:
    # a child that appeared is charged from here on, one reaped meanwhile is forgotten
    here = children_cpu(os.getpid())
    for pid in [p for p in _CHARGED if p not in here]:
        del _CHARGED[pid]
    for pid, cpu in here.items():
        _CHARGED.setdefault(pid, cpu)
    (self0, kids0), t0 = _cpu(), time.monotonic()
    yield
    (self1, kids1), t1 = _cpu(), time.monotonic()
    row = {"id": item.nodeid, "self": self1 - self0,
           "children": _children_charge(kids0, kids1), "wall": t1 - t0}  # fmt: skip
    with open(Path(out) / f"{os.getpid()}.jsonl", "a") as f:
        f.write(json.dumps(row) + "\n")


# ------------------------------------------------------------------ the script (outside)
def busy_seconds() -> float | None:
    """CPU seconds the whole machine has spent busy since boot (None: no /proc/stat)."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    except OSError:
        return None
    ticks = [int(v) for v in fields]
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)  # idle + iowait
    return (sum(ticks[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def read_rows(folder: Path) -> list[dict]:
    return [json.loads(line) for f in sorted(folder.glob("*.jsonl"))
            for line in f.read_text().splitlines()]  # fmt: skip


def report(rows: list[dict], wall: float, busy: float | None, top: int = 15) -> str:
    """The totals, then the files and the tests with the most CPU (worker + children)."""
    cpu = {r["id"]: r["self"] + r["children"] for r in rows}
    own = sum(r["self"] for r in rows)
    kids = sum(r["children"] for r in rows)
    lines = [f"{len(rows)} tests in {wall:.0f} s wall; CPU charged to tests: {own + kids:.0f} s "
             f"({own:.0f} in the pytest workers, {kids:.0f} in their child processes)"]  # fmt: skip
    if busy is not None:
        cores = os.cpu_count() or 1
        lines.append(
            f"machine busy: {busy:.0f} CPU s ({busy / wall:.2f} of {cores} cores on average); "
            f"not charged to any test: {busy - own - kids:.0f} s (processes no worker reaps: Ray, "
            "processes of killed SuperNodes; xdist collection and scheduling; anything else "
            "running on the machine)"
        )
    by_file: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0])
    for r in rows:
        acc = by_file[r["id"].split("::")[0]]
        acc[0] += r["self"] + r["children"]
        acc[1] += r["wall"]
        acc[2] += 1
    lines += ["", f"{'CPU s':>8} {'wall s':>8} {'tests':>6}  file (the {top} costliest)"]
    for name, (c, w, n) in sorted(by_file.items(), key=lambda kv: -kv[1][0])[:top]:
        lines.append(f"{c:8.1f} {w:8.1f} {n:6d}  {name}")
    walls = {r["id"]: r["wall"] for r in rows}
    lines += ["", f"{'CPU s':>8} {'wall s':>8}  test (the {top} costliest)"]
    for test, c in sorted(cpu.items(), key=lambda kv: -kv[1])[:top]:
        lines.append(f"{c:8.1f} {walls[test]:8.1f}  {test}")
    return "\n".join(lines)


def _option(argv: list[str], name: str) -> tuple[Path | None, list[str]]:
    """``name VALUE`` taken out of ``argv`` (the rest goes to pytest)."""
    if name not in argv:
        return None, argv
    at = argv.index(name)
    return Path(argv[at + 1]), argv[:at] + argv[at + 2 :]


def run_pytest(args: list[str], env_extra: dict[str, str]) -> int:
    """pytest with this file as a plug-in, in the repository root."""
    path = [str(ROOT / "benchmarks"), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "",
           "PYTHONPATH": os.pathsep.join(p for p in path if p), **env_extra}  # fmt: skip
    cmd = [sys.executable, "-m", "pytest", "-p", "suite_cost", *args]
    print("running:", " ".join(cmd), flush=True)
    return subprocess.run(cmd, cwd=ROOT, env=env).returncode


def main(argv: list[str]) -> int:
    keep, argv = _option(argv, "--keep")
    costly_file, argv = _option(argv, "--write-costly")
    with tempfile.TemporaryDirectory() as scratch:
        folder = keep or Path(scratch)
        folder.mkdir(parents=True, exist_ok=True)
        for old in [*folder.glob("*.jsonl"), *folder.glob("cov.*")]:
            old.unlink()
        b0, t0 = busy_seconds(), time.monotonic()
        code = run_pytest(argv, {OUT_ENV: str(folder)})
        wall, b1 = time.monotonic() - t0, busy_seconds()
        busy = b1 - b0 if b0 is not None and b1 is not None else None
        rows = read_rows(folder)
        print()
        print(report(rows, wall, busy) if rows else "no test ran")
        if costly_file is None:
            return code
        if code != 0:
            print(f"{costly_file} not written: pytest failed (exit {code})")
            return code
        # the second pass: the lines each test runs (coverage's tracing would inflate the
        # first pass's CPU figures, so they are measured apart)
        code = run_pytest(argv, {COV_ENV: str(folder)})
        if code != 0:
            print(f"{costly_file} not written: the coverage pass failed (exit {code})")
            return code
        import fast_tier

        doc = fast_tier.write_costly(costly_file, rows, fast_tier.read_lines(folder), argv)
        print(fast_tier.summary(doc, costly_file))
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
