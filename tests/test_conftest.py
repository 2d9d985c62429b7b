"""The suite's own reporting: a nearly full disk is named where a failing run ends."""

from __future__ import annotations

import os
import shutil
from collections import namedtuple
from pathlib import Path
from types import SimpleNamespace

import conftest
import pytest
import torch
from conftest import LOW_DISK, low_disk, pytest_terminal_summary

Usage = namedtuple("Usage", "total used free")


class Reporter:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def write_line(self, line: str, **markup) -> None:
        self.lines.append(line)


def test_a_nearly_full_disk_is_named_after_failures(monkeypatch, tmp_path):
    free = {str(tmp_path / "full"): 193 * 2**20, str(tmp_path / "roomy"): 50 * 2**30}
    for folder in free:
        Path(folder).mkdir()
    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(0, 0, free[str(path)]))
    devices = {str(tmp_path / "full"): 1, str(tmp_path / "roomy"): 2}
    real_stat = os.stat
    monkeypatch.setattr(
        os,
        "stat",
        lambda p, **kw: (
            SimpleNamespace(st_dev=devices[str(p)]) if str(p) in devices else real_stat(p, **kw)
        ),
    )
    lines = low_disk({"temporary folder": str(tmp_path / "full"), "x": str(tmp_path / "roomy")})
    assert len(lines) == 1
    assert "193 MiB free in the temporary folder" in lines[0] and "not the code" in lines[0]

    monkeypatch.setattr(conftest.tempfile, "gettempdir", lambda: str(tmp_path / "full"))
    monkeypatch.setattr(conftest, "ROOT", tmp_path / "roomy")
    failed, passed = Reporter(), Reporter()
    pytest_terminal_summary(failed, 1, None)
    pytest_terminal_summary(passed, 0, None)
    assert failed.lines == lines and passed.lines == []  # said only where tests failed


def test_one_line_per_file_system(monkeypatch, tmp_path):
    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(0, 0, 0))
    (tmp_path / "a").mkdir()
    lines = low_disk({"temporary folder": str(tmp_path), "repository's disk": str(tmp_path / "a")})
    assert len(lines) == 1 and "temporary folder" in lines[0]  # the same disk: named once


def test_a_disk_with_room_or_a_folder_gone_says_nothing(monkeypatch, tmp_path):
    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(0, 0, LOW_DISK))
    assert low_disk({"temporary folder": str(tmp_path)}) == []
    monkeypatch.undo()
    assert low_disk({"temporary folder": str(tmp_path / "gone")}) == []


def test_groups_are_files_and_no_module_asks_for_an_ignored_xdist_group():
    """A module whose tests share an expensive module fixture is kept on one worker only by
    conftest.GROUPS: an ``xdist_group`` mark is dropped by pytest >= 9.2 (conftest's
    scheduler), so a module marked so was split over the workers and each of them built its
    fixture (test_predictor.py: every algorithm trained and exported, once per worker)."""
    root = Path(conftest.ROOT)
    for prefix in conftest.GROUPS:
        assert (root / prefix).is_file(), f"conftest.GROUPS names {prefix}, not a file"
    marked = [
        str(f.relative_to(root))
        for f in sorted((root / "tests").rglob("test_*.py"))
        if f.name != Path(__file__).name and "mark.xdist_group" in f.read_text(encoding="utf-8")
    ]
    assert not marked, f"{marked}: list these in conftest.GROUPS (xdist_group is ignored)"


def test_process_and_full_name_tests_that_exist():
    """Every node id prefix of conftest.PROCESS, FULL and FAST, and every node id of
    tests/costly.json, names a test file, and test functions defined in it where it names
    some (a prefix of their names): a renamed test left there would silently move into
    ``make check`` (PROCESS: a fresh interpreter or a Flower deployment in the everyday
    loop). No test is in both PROCESS and FULL."""
    import re

    root = Path(conftest.ROOT)
    for listed in (conftest.PROCESS, conftest.FULL, conftest.FAST, tuple(conftest.COSTLY)):
        for prefix in listed:
            path, _, name = prefix.partition("::")
            assert (root / path).is_file(), f"{prefix}: no file {path}"
            function = name.split("[", 1)[0]
            text = (root / path).read_text(encoding="utf-8")
            assert not function or re.search(rf"^def {re.escape(function)}", text, re.M), (
                f"{prefix}: {path} defines no test {function}"
            )
    both = [f for f in conftest.FULL if f.startswith(conftest.PROCESS)]
    both += [p for p in conftest.PROCESS if p.startswith(conftest.FULL)]
    assert not both, f"in both conftest.PROCESS and conftest.FULL: {both}"


def test_full_and_process_tests_are_marked():
    """conftest marks a FULL test ``full`` (``make check``'s -m "not process and not full"
    leaves it out) and a PROCESS test ``process``, a parametrized one by its prefix, and no
    other test either."""

    class Item:
        def __init__(self, nodeid: str) -> None:
            self.nodeid, self.function, self.marks = nodeid, None, []

        def get_closest_marker(self, name: str):
            return next((m for m in self.marks if m.name == name), None)

        def add_marker(self, mark) -> None:
            self.marks.append(mark.mark)

    full = conftest.FULL[0] + "[README.md]"
    process = conftest.PROCESS[0] + "::test_supernodes_match_native"
    other = "tests/test_docs.py::test_every_doc_command_is_marked"
    costly = next(t for t in conftest.COSTLY if not t.startswith(conftest.FULL))
    items = [Item(other), Item(full), Item(process), Item(costly)]
    conftest.pytest_collection_modifyitems(None, items)
    marks = {i.nodeid: {m.name for m in i.marks} for i in items}
    want = {full: {"full"}, process: {"process"}, other: set(), costly: {"full"}}
    assert marks == want


def test_fast_tests_stay_in_make_check_whatever_they_cost(monkeypatch):
    """A FAST test (the same-run matrix's resume way) measured costly is not marked full; a
    costly test is; a test measured under the threshold or never measured is not."""
    fast = conftest.FAST[0] + "algorithm.name=fedavg]"
    costly = "tests/x/test_x.py::test_slow"
    monkeypatch.setattr(conftest, "COSTLY", {fast: 9.0, costly: 9.0})
    assert not conftest.is_full(fast)
    assert conftest.is_full(costly)
    assert not conftest.is_full("tests/x/test_x.py::test_new")
    assert conftest.is_full(conftest.FULL[0] + "[README.md]")


def test_runs_write_an_unrendered_convergence_png(tmp_path):
    """A run's convergence.png in a test not marked ``png``: the figure built, 1x1 written."""
    from conftest import UNRENDERED_PNG, toy_cfg

    from fedshift.runtime.simulation import run_experiment

    run_experiment(toy_cfg("train.local_steps=1", rounds=1), run_dir=tmp_path / "r", progress=False)
    assert (tmp_path / "r" / "convergence.png").read_bytes() == UNRENDERED_PNG


@pytest.mark.png
def test_a_png_marked_test_draws_the_picture(tmp_path):
    from fedshift.eval import plots

    assert plots.render_png is conftest._REAL_RENDER_PNG
    rows = [{"round": 1, "client": "a", "global": {"val_acc": 0.5, "test_acc": 0.4}}]
    plots.plot_convergence(rows, ["global"], tmp_path / "c.png", "t")  # type: ignore[list-item]
    assert (tmp_path / "c.png").stat().st_size > 1000


@pytest.mark.same_kernels  # its approx is a sample for the rule, never run
def test_float_comparisons_are_numerics_unless_both_sides_share_kernels():
    """``approx`` in a test's code (a comprehension or function inside it too) marks it
    ``numerics`` (compared again on the portable kernels); ``same_kernels`` (both sides
    computed alike) leaves it out of that pass; a docstring naming ``approx(`` does not."""

    def compares():
        assert pytest.approx(0.3) == 0.1 + 0.2

    def compares_inside():
        assert all(torch.allclose(x, x) for x in [torch.ones(1)])

    def names_it():
        """Not pytest.approx(...): exact."""
        assert 0.5 + 0.25 == 0.75

    def item(fn=compares, *marks: str) -> SimpleNamespace:
        return SimpleNamespace(
            function=fn, get_closest_marker=lambda name: name if name in marks else None
        )

    assert conftest._compares_floats(item())
    assert conftest._compares_floats(item(compares_inside))
    assert not conftest._compares_floats(item(names_it))
    assert not conftest._compares_floats(item(compares, "same_kernels"))
