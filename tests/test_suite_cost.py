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


def test_the_script_charges_each_test_its_cpu(tmp_path):
    """The script runs pytest with itself as a plug-in; each test's row is kept."""
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks/suite_cost.py"), "--keep", str(tmp_path),
         "tests/test_suite_cost.py::test_report_totals_and_orders_by_cpu", "-n", "0",
         "-p", "no:cacheprovider"],
        capture_output=True, text=True, cwd=ROOT, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    (kept,) = tmp_path.glob("*.jsonl")
    (row,) = [json.loads(line) for line in kept.read_text().splitlines()]
    assert row["id"] == "tests/test_suite_cost.py::test_report_totals_and_orders_by_cpu"
    assert row["self"] >= 0 and row["children"] >= 0 and row["wall"] > 0
    assert "1 tests in" in out.stdout and row["id"] in out.stdout
