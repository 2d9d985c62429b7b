"""Copy finished suite cells and protocol outputs into ``results/`` (what the claims ledger is
computed from): per cell ``config.yaml``, ``summary.json``, ``metrics.jsonl`` and
``cell.json``, never checkpoints or models; per protocol folder its ``*.json``, ``*.md`` and
``*.yaml``. Each results folder gets a ``source.json``: the command that made it, the machine
its runs recorded in their provenance (``machines``, every one, when a suite resumed on
another machine; a protocol folder or runs without one: the machine collecting,
:func:`fedshift.core.machine.machine`) and the fedshift commit(s) its runs recorded."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from fedshift.core.errors import FedshiftError
from fedshift.core.files import write_text_atomic
from fedshift.core.machine import machine
from fedshift.eval.cells import check_cell

#: what a committed cell keeps (checkpoints and models stay in the run directory)
CELL_FILES = ("cell.json", "config.yaml", "summary.json", "metrics.jsonl")
PROTOCOL_SUFFIXES = (".json", ".md", ".yaml")
SOURCE = "source.json"


def _provenances(summaries: list[Path]) -> list[dict]:
    """Each readable summary's ``provenance`` (read once for the commits and the machines)."""
    found = []
    for s in summaries:
        try:
            prov = json.loads(s.read_text()).get("provenance")
        except (OSError, ValueError):
            continue
        if isinstance(prov, dict):
            found.append(prov)
    return found


def _commits(provenances: list[dict]) -> list[str]:
    found = set()
    for p in provenances:
        git = p.get("git") or {}
        if git.get("commit"):
            found.add(str(git["commit"]) + ("+dirty" if git.get("dirty") else ""))
    return sorted(found)


def _machines(provenances: list[dict]) -> list[dict]:
    """The distinct machines the runs recorded, in cell order."""
    found: list[dict] = []
    for p in provenances:
        m = p.get("machine")
        if isinstance(m, dict) and m not in found:
            found.append(m)
    return found


def _source(command: str, summaries: list[Path]) -> str:
    provenances = _provenances(summaries)
    commits = _commits(provenances)
    machines = _machines(provenances) or [machine()]
    data: dict = {
        "command": command,
        "machine": machines[0],
        "commit": commits[0] if len(commits) == 1 else commits,
    }
    if len(machines) > 1:  # a suite resumed on another machine: its cells say which
        data["machines"] = machines
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


def collect_suite(src: Path, results: Path, command: str, name: str | None = None) -> Path:
    """Every finished cell of the suite folder ``src`` into ``results/<name or src's name>``
    (replacing what that folder held)."""
    src = Path(src)
    cells = sorted(p.parent for p in src.glob("*/summary.json"))
    if not cells:
        raise FedshiftError(f"{src}: no finished cells (no */summary.json)")
    unfinished = sorted(
        p.name for p in src.iterdir() if p.is_dir() and not (p / "summary.json").is_file()
    )
    if unfinished:
        raise FedshiftError(
            f"{src}: cells without summary.json ({', '.join(unfinished)}): finish the suite "
            "first (run it again)"
        )
    for cell in cells:  # before anything is replaced: each cell is one fedshift wrote
        check_cell(cell)
    dest = Path(results) / (name or src.name)
    if dest.exists():
        shutil.rmtree(dest)
    for cell in cells:
        (dest / cell.name).mkdir(parents=True)
        for f in CELL_FILES:
            if (cell / f).is_file():
                shutil.copyfile(cell / f, dest / cell.name / f)
    write_text_atomic(dest / SOURCE, _source(command, [c / "summary.json" for c in cells]))
    return dest


def collect_protocol(src: Path, results: Path, command: str, name: str) -> Path:
    """A protocol's output folder (its tables and numbers, no figures) into
    ``results/protocols/<name>``."""
    src = Path(src)
    files = sorted(p for p in src.rglob("*") if p.is_file() and p.suffix in PROTOCOL_SUFFIXES)
    if not files:
        raise FedshiftError(f"{src}: no protocol output (*.json / *.md)")
    dest = Path(results) / "protocols" / name
    if dest.exists():
        shutil.rmtree(dest)
    for f in files:
        out = dest / f.relative_to(src)
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(f, out)
    write_text_atomic(dest / SOURCE, _source(command, []))
    return dest
