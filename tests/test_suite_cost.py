"""benchmarks/suite_cost.py: the suite's CPU per test, and the machine's."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
import fast_tier  # noqa: E402
import suite_cost  # noqa: E402


def test_report_totals_and_orders_by_cpu():
    rows = [
        {"id": "tests/a.py::t1", "self": 1.0, "children": 0.0, "wall": 2.0},
        {"id": "tests/a.py::t2", "self": 0.5, "children": 4.0, "wall": 5.0},
        {"id": "tests/b.py::t3", "self": 3.0, "children": 0.0, "wall": 3.0},
    ]
    text = suite_cost.report(rows, wall=10.0, busy=12.0)
    assert text.startswith("3 tests in 10 s wall; CPU charged to tests: 8 s (4 in the pytest")
    assert "machine busy: 12 CPU s" in text and "not charged to any test: 4 s" in text
    files = [ln.split()[-1] for ln in text.splitlines() if ln.strip().endswith(".py")]
    assert files == ["tests/a.py", "tests/b.py"]  # 5.5 s, then 3 s
    tests = [ln.split()[-1] for ln in text.splitlines() if "::" in ln]
    assert tests == ["tests/a.py::t2", "tests/b.py::t3", "tests/a.py::t1"]


def test_the_fast_tier_keeps_cheap_tests_and_costly_ones_for_lines_only_they_run():
    """fast_tier.select: tests under the threshold stay, and FAST ones whatever they cost;
    FULL ones are never kept; of the costly ones, the most new lines per CPU second first,
    within the budget; one adding no line is left out whatever it costs."""
    at = fast_tier.COSTLY_CPU_S
    cpu = {"cheap": at / 2, "fast": 9 * at, "full": at / 2, "a": at, "b": 4 * at,
           "c": at, "d": 2 * at}  # fmt: skip
    lines = {"cheap": {("x.py", 1)}, "fast": {("x.py", 2)}, "full": {("x.py", 9)},
             "a": {("x.py", 3), ("x.py", 4)}, "b": {("x.py", 5), ("x.py", 6), ("x.py", 7)},
             "c": {("x.py", 1), ("x.py", 2)}, "d": {("x.py", 3)}}  # fmt: skip
    fast, full = (lambda t: t == "fast"), (lambda t: t == "full")
    left_out, kept = fast_tier.select(cpu, lines, fast, full, budget=at)
    assert kept == {"a": {"cpu_s": round(at, 2), "lines": 2}}  # 2 lines / at beats 3 / 4 at
    assert left_out == {t: round(cpu[t], 2) for t in ("b", "c", "d")}
    left_out, kept = fast_tier.select(cpu, lines, fast, full, budget=5 * at)
    assert list(kept) == ["a", "b"] and kept["b"]["lines"] == 3  # d: its line is a's
    assert left_out == {t: round(cpu[t], 2) for t in ("c", "d")}


def test_costly_file_is_written_whole_with_the_command(tmp_path):
    at = fast_tier.COSTLY_CPU_S
    rows = [{"id": "tests/a.py::t", "self": at, "children": at, "wall": 1.0},
            {"id": "tests/a.py::u", "self": 0.0, "children": 0.0, "wall": 1.0}]  # fmt: skip
    path = tmp_path / "costly.json"
    doc = fast_tier.write_costly(path, rows, {"tests/a.py::u": {("a.py", 1)}}, ["-m", "not x"])
    assert json.loads(path.read_text()) == doc
    assert doc["tests"] == {"tests/a.py::t": round(2 * at, 2)} and doc["kept"] == {}
    assert doc["command"] == f"python benchmarks/suite_cost.py -m 'not x' --write-costly {path}"
    assert doc["lines"] == {"in_process_tests": 1, "make_check": 1, "make_check_cpu_s": 0.0}
    assert [p.name for p in tmp_path.iterdir()] == ["costly.json"]


def test_the_script_charges_each_test_its_cpu(tmp_path):
    """The script runs pytest with itself as a plug-in; each test's row is kept."""
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks/suite_cost.py"), "--keep", str(tmp_path),
         "tests/test_suite_cost.py::test_report_totals_and_orders_by_cpu", "-n", "0",
         "-p", "no:cacheprovider", "--write-costly", str(tmp_path / "costly.json")],
        capture_output=True, text=True, cwd=ROOT, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    (kept,) = tmp_path.glob("*.jsonl")
    # the coverage pass ran too: the test's lines of fedshift (report() imports none)
    costly = json.loads((tmp_path / "costly.json").read_text())
    assert costly["tests"] == {} and costly["lines"]["make_check"] >= 0  # ~0 CPU s
    (row,) = [json.loads(line) for line in kept.read_text().splitlines()]
    assert row["id"] == "tests/test_suite_cost.py::test_report_totals_and_orders_by_cpu"
    assert row["self"] >= 0 and row["children"] >= 0 and row["wall"] > 0
    assert "1 tests in" in out.stdout and row["id"] in out.stdout


#: two tests: the first starts a process that burns 0.3 CPU s and exits unreaped (waitid
#: with WNOWAIT), the second reaps it (as a later ``Popen`` would, subprocess's clean-up)
UNREAPED = """
import os, subprocess, sys
BURN = "import time\\nwhile time.process_time() < 0.3: pass"
procs = []

def test_starts_a_process_nobody_waits_for():
    procs.append(subprocess.Popen([sys.executable, "-c", BURN]))
    os.waitid(os.P_PID, procs[0].pid, os.WEXITED | os.WNOWAIT)

def test_reaps_it():
    procs[0].wait()
"""


def test_a_process_reaped_in_a_later_test_is_charged_to_the_test_it_ran_in(tmp_path):
    (tmp_path / "test_unreaped.py").write_text(UNREAPED)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")  # not the suite's options
    rows_dir = tmp_path / "rows"
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks/suite_cost.py"), "--keep", str(rows_dir),
         str(tmp_path / "test_unreaped.py"), "-c", str(tmp_path / "pytest.ini"),
         "--rootdir", str(tmp_path), "-p", "no:cacheprovider"],
        capture_output=True, text=True, cwd=ROOT, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    started, reaped = suite_cost.read_rows(rows_dir)
    assert started["id"].endswith("nobody_waits_for") and reaped["id"].endswith("reaps_it")
    # /proc gives CPU in clock ticks, truncated (under one tick each for a process's user
    # and system time and its children's two; 1/100 s at 100 Hz)
    tick = 1 / os.sysconf("SC_CLK_TCK")
    assert started["children"] >= 0.3 - 4 * tick  # at least the 0.3 s it burnt
    # reaping adds all of the process's CPU to the worker's children's: the part already
    # charged is taken off (the reaping test was charged all of it before)
    assert abs(reaped["children"]) <= 4 * tick, (started, reaped)
