"""Which in-process tests ``make check`` leaves out (``tests/costly.json``), from a measured run.

``python benchmarks/suite_cost.py -m "not process" --write-costly tests/costly.json`` measures
every in-process test twice: its CPU (its pytest worker's and its reaped processes'), then,
under coverage.py with one context per test, the lines of fedshift it runs. The rule:

1. a test of :data:`COSTLY_CPU_S` or more is costly; the others are the fast tier, with the
   tests ``tests/conftest.py`` keeps whatever they cost (``FAST``: the same-run matrix's
   killed-and-resumed way, every algorithm and augment once) and without those it lists
   with a reason (``FULL``);
2. the lines only costly tests run are covered again, within :data:`COVERAGE_BUDGET_CPU_S`:
   greedily, the costly test that runs the most such lines per CPU second is kept in the
   fast tier, until the budget is spent or no costly test adds a line;
3. the other costly tests are written to the file: ``make check`` leaves them out, ``make
   test`` runs them.

Lines run in processes a test starts (CLI subprocesses, pool workers) are not measured.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: a test of at least this many CPU s is costly (rule 1)
COSTLY_CPU_S = 0.4
#: CPU s of costly tests the fast tier keeps for the lines only they run (rule 2)
COVERAGE_BUDGET_CPU_S = 60.0

Line = tuple[str, int]


def read_lines(folder: Path) -> dict[str, set[Line]]:
    """node id -> the (file, line) of fedshift the test ran, from the coverage data files
    the plug-in saved in ``folder`` (one per pytest process)."""
    import coverage

    lines: dict[str, set[Line]] = {}
    for path in sorted(folder.glob("cov.*")):
        data = coverage.CoverageData(basename=str(path))
        data.read()
        for name in data.measured_files():
            for line, contexts in (data.contexts_by_lineno(name) or {}).items():
                for context in contexts:
                    if context:
                        lines.setdefault(context, set()).add((name, line))
    return lines


def select(
    cpu: dict[str, float],
    lines: dict[str, set[Line]],
    always_fast: Callable[[str], bool],
    always_full: Callable[[str], bool],
    threshold: float = COSTLY_CPU_S,
    budget: float = COVERAGE_BUDGET_CPU_S,
) -> tuple[dict[str, float], dict[str, dict]]:
    """(the costly tests left out: node id -> CPU s, the costly tests kept for their lines:
    node id -> CPU s and lines added), by rules 1-3 above, in a deterministic order (ties
    by node id). The ``always_full`` tests are in neither (tests/conftest.py lists them)."""
    fast = {t for t in cpu if not always_full(t) and (cpu[t] < threshold or always_fast(t))}
    covered: set[Line] = set().union(*(lines.get(t, set()) for t in fast))
    costly = sorted(t for t in cpu if t not in fast and not always_full(t))
    candidates = list(costly)
    kept: dict[str, dict] = {}
    spent = 0.0
    while candidates:
        gains = {t: len(lines.get(t, set()) - covered) for t in candidates}
        affordable = [t for t in candidates if gains[t] and spent + cpu[t] <= budget]
        if not affordable:
            break
        best = max(affordable, key=lambda t: (gains[t] / max(cpu[t], 1e-3), t))
        kept[best] = {"cpu_s": round(cpu[best], 2), "lines": gains[best]}
        covered |= lines.get(best, set())
        spent += cpu[best]
        candidates.remove(best)
    left_out = {t: round(cpu[t], 2) for t in costly if t not in kept}
    return left_out, kept


def _covered(lines: dict[str, set[Line]], tests: Iterable[str]) -> int:
    return len(set().union(*(lines.get(t, set()) for t in tests)))


def write_costly(
    path: Path, rows: list[dict], lines: dict[str, set[Line]], argv: list[str]
) -> dict:
    """Select (:func:`select`, with tests/conftest.py's FAST and FULL) and write ``path``
    atomically: the command, the rule's constants, the lines covered, what is kept and left
    out. Returns what was written."""
    sys.path.insert(0, str(ROOT / "tests"))
    import conftest

    cpu = {r["id"]: r["self"] + r["children"] for r in rows}
    fast = lambda t: t.startswith(conftest.FAST)  # noqa: E731
    full = lambda t: t.startswith(conftest.FULL)  # noqa: E731
    left_out, kept = select(cpu, lines, fast, full)
    check = [t for t in cpu if not full(t) and t not in left_out]
    doc = {
        "about": "in-process tests `make check` leaves out (tests/conftest.py) and `make test` "
        "runs: benchmarks/fast_tier.py says how they are chosen",
        "command": "python benchmarks/suite_cost.py "
        + shlex.join([*argv, "--write-costly", str(path)]),
        "threshold_cpu_s": COSTLY_CPU_S,
        "coverage_budget_cpu_s": COVERAGE_BUDGET_CPU_S,
        "lines": {
            "in_process_tests": _covered(lines, cpu),
            "make_check": _covered(lines, check),
            "make_check_cpu_s": round(sum(cpu[t] for t in check), 1),
        },
        "kept": kept,
        "tests": left_out,
    }
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    os.replace(tmp, path)
    return doc


def summary(doc: dict, path: Path) -> str:
    n = doc["lines"]
    return (
        f"{path}: {len(doc['tests'])} tests left out of make check, {len(doc['kept'])} costly "
        f"ones kept for their lines; make check's tests run {n['make_check']} of the "
        f"{n['in_process_tests']} lines of fedshift the in-process tests run, in "
        f"{n['make_check_cpu_s']} CPU s"
    )
