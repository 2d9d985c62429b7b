"""benchmarks/suite_cost.py: the suite's CPU per test, and the machine's."""

from __future__ import annotations

import json
import subprocess
import sys

from conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
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


def test_costly_tests_are_those_at_or_over_the_threshold(tmp_path):
    """--write-costly's file: the tests of COSTLY_CPU_S or more (worker + reaped), by node
    id, with the command that measured them; written whole (no .tmp left)."""
    at = suite_cost.COSTLY_CPU_S
    rows = [
        {"id": "tests/a.py::under", "self": at / 2, "children": at / 4, "wall": 9.0},
        {"id": "tests/a.py::at", "self": at, "children": 0.0, "wall": 0.1},
        {"id": "tests/b.py::kids", "self": 0.0, "children": 2 * at, "wall": 1.0},
    ]
    assert suite_cost.costly(rows) == {"tests/a.py::at": round(at, 2),
                                       "tests/b.py::kids": round(2 * at, 2)}  # fmt: skip
    path = tmp_path / "costly.json"
    assert suite_cost.write_costly(path, rows, ["-m", "not process"]) == 2
    doc = json.loads(path.read_text())
    assert doc["threshold_cpu_s"] == at and list(doc["tests"]) == ["tests/a.py::at",
                                                                   "tests/b.py::kids"]  # fmt: skip
    assert doc["command"] == (
        f"python benchmarks/suite_cost.py -m 'not process' --write-costly {path}"
    )
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
    assert json.loads((tmp_path / "costly.json").read_text())["tests"] == {}  # ~0 CPU s
    (row,) = [json.loads(line) for line in kept.read_text().splitlines()]
    assert row["id"] == "tests/test_suite_cost.py::test_report_totals_and_orders_by_cpu"
    assert row["self"] >= 0 and row["children"] >= 0 and row["wall"] > 0
    assert "1 tests in" in out.stdout and row["id"] in out.stdout
