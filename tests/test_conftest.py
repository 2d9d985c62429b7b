"""The suite's own reporting: a nearly full disk is named where a failing run ends."""

from __future__ import annotations

import shutil
from collections import namedtuple

import conftest
from conftest import LOW_DISK, low_disk, pytest_terminal_summary

Usage = namedtuple("Usage", "total used free")


class Reporter:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def write_line(self, line: str, **markup) -> None:
        self.lines.append(line)


def test_a_nearly_full_disk_is_named_after_failures(monkeypatch, tmp_path):
    free = {str(tmp_path / "full"): 193 * 2**20, str(tmp_path / "roomy"): 50 * 2**30}
    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(0, 0, free[str(path)]))
    lines = low_disk({"temporary folder": str(tmp_path / "full"), "x": str(tmp_path / "roomy")})
    assert len(lines) == 1
    assert "193 MiB free in the temporary folder" in lines[0] and "not the code" in lines[0]

    monkeypatch.setattr(conftest.tempfile, "gettempdir", lambda: str(tmp_path / "full"))
    monkeypatch.setattr(conftest, "ROOT", tmp_path / "roomy")
    failed, passed = Reporter(), Reporter()
    pytest_terminal_summary(failed, 1, None)
    pytest_terminal_summary(passed, 0, None)
    assert failed.lines == lines and passed.lines == []  # said only where tests failed


def test_a_disk_with_room_says_nothing(monkeypatch, tmp_path):
    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(0, 0, LOW_DISK))
    assert low_disk({"temporary folder": str(tmp_path)}) == []
