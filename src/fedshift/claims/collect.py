"""Copy finished suite cells and protocol outputs into ``results/`` (what the claims ledger is
computed from): per cell ``config.yaml``, ``summary.json``, ``metrics.jsonl`` and
``cell.json``, never checkpoints or models; per protocol folder its ``*.json``, ``*.md`` and
``*.yaml`` (and its figures, ``*.png``). Each results folder gets a ``source.json``: the
command that made it, the machine its runs recorded in their provenance (``machines``,
every one, when a suite resumed on another machine; runs without one: the machine collecting,
:func:`fedshift.core.machine.machine`) and the fedshift commit(s) its runs recorded. A
protocol folder's ``source.json`` takes the same from the ``provenance`` its output files
record (:func:`fedshift.protocols.common.output_provenance`); an output that records none
(written before issue 50) gets ``commit: null`` and a ``commit_unknown`` note, never a
guessed commit."""

from __future__ import annotations

import json
import os
from pathlib import Path

from fedshift.core.errors import FedshiftError
from fedshift.core.files import (
    check_regular,
    child_path,
    copy_regular,
    ensure_dir,
    remove_tree,
    write_text_atomic,
)
from fedshift.core.machine import machine
from fedshift.eval.cells import check_cell

#: what a committed cell keeps (checkpoints and models stay in the run directory)
CELL_FILES = ("cell.json", "config.yaml", "summary.json", "metrics.jsonl")
PROTOCOL_SUFFIXES = (".json", ".md", ".yaml", ".png")
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


#: ``source.json``'s note when a protocol's output recorded no commit
UNKNOWN_COMMIT = (
    "the protocol's output records no fedshift commit (written before protocol outputs "
    "recorded their provenance); not guessed"
)


def _source(
    command: str,
    summaries: list[Path],
    protocol_files: list[Path] | None = None,
    extra: dict | None = None,
) -> str:
    provenances = _provenances(summaries)
    if protocol_files is not None:  # a protocol's output: the provenance its JSON records
        provenances = _provenances([f for f in protocol_files if f.suffix == ".json"])
    commits = _commits(provenances)
    machines = _machines(provenances) or [machine()]
    data: dict = {
        "command": command,
        "machine": machines[0],
        "commit": commits[0] if len(commits) == 1 else commits,
    }
    if protocol_files is not None and not commits:
        data["commit"] = None
        data["commit_unknown"] = UNKNOWN_COMMIT
    if len(machines) > 1:  # a suite resumed on another machine: its cells say which
        data["machines"] = machines
    data.update(extra or {})
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


def _checked(files: list[Path]) -> list[Path]:
    """``files``, each refused (:class:`~fedshift.core.files.UnsafePathError` naming it) when
    it is a symbolic link or not a regular file: a received suite's ``config.yaml`` that
    links to a private file must not be copied into ``results/``, ready to commit."""
    for f in files:
        check_regular(f, "copies into results/", missing_ok=False)
    return files


def _fresh(dest: Path, root: Path) -> None:
    """Empty ``dest`` (a folder inside ``root``) for new content: a real folder there is
    removed (never a link, never ``root`` itself or anything outside it)."""
    if dest.exists() or dest.is_symlink():
        remove_tree(dest, root)


def _folder_name(src: Path, name: str | None) -> str:
    """The results folder's name: ``name``, or the suite folder's own name (``.`` is the
    folder it stands for, not an empty name)."""
    return name if name is not None else src.resolve().name


#: where ``collect --partial`` puts the finished cells of suites still running (the ledger
#: and the result pages read no ``_``-prefixed folder)
INCOMPLETE = "_incomplete"


def unfinished_cells(src: Path) -> list[str]:
    """The cell folders of the suite folder ``src`` without a summary (started, not done)."""
    return sorted(
        p.name for p in Path(src).iterdir() if p.is_dir() and not (p / "summary.json").is_file()
    )


def collect_suite(
    src: Path, results: Path, command: str, name: str | None = None, partial: bool = False
) -> Path:
    """Every finished cell of the suite folder ``src`` into ``results/<name or src's name>``
    (replacing what that folder held). ``name`` is a plain folder name (no ``..``, ``.``,
    absolute path or separator); links and special files in the suite are refused before
    anything in ``results/`` is touched.

    ``partial``: the suite is still running (a suite longer than one machine's session):
    its finished cells go to ``results/_incomplete/<name>``, added to the cells already
    there (a cell of the same folder name is replaced), and ``source.json`` describes every
    cell the folder then holds, with ``partial``: how many are finished and how many cells
    the suite's last ``fedshift bench`` planned (its ``bench.json``). A bench given
    ``--results results/_incomplete`` (or ``$FEDSHIFT_RESULTS``) takes them instead of
    running them; once every cell is done, collect the suite without ``partial``."""
    src = Path(src)
    results = Path(results)
    root = child_path(results, INCOMPLETE, "--results") if partial else results
    dest = child_path(root, _folder_name(src, name), "--name")
    cells = sorted(p.parent for p in src.glob("*/summary.json"))
    if not cells:
        raise FedshiftError(f"{src}: no finished cells (no */summary.json)")
    unfinished = unfinished_cells(src)
    if unfinished and not partial:
        raise FedshiftError(
            f"{src}: cells without summary.json ({', '.join(unfinished)}): finish the suite "
            "first (run it again), or collect what is finished with --partial"
        )
    for cell in (c for c in cells if c.is_symlink()):  # a linked cell folder: refused
        check_regular(cell, "copies into results/", missing_ok=False)
    copies = [
        (cell / f, dest / cell.name / f)
        for cell in cells
        for f in CELL_FILES
        if (cell / f).exists() or (cell / f).is_symlink()
    ]
    _checked([a for a, _ in copies])
    for cell in cells:  # before anything is replaced: each cell is one fedshift wrote
        check_cell(cell)
    ensure_dir(root)
    if partial:  # the cells collected before stay; each one collected now is replaced whole
        for cell in cells:
            _fresh(dest / cell.name, root)
    else:
        _fresh(dest, root)
    for a, b in copies:
        ensure_dir(b.parent)
        copy_regular(a, b)
    held = sorted(p.parent for p in dest.glob("*/summary.json"))
    extra = {"partial": {"finished": len(held), "planned": _planned(src)}} if partial else None
    write_text_atomic(
        dest / SOURCE, _source(command, [c / "summary.json" for c in held], None, extra)
    )
    return dest


def _planned(src: Path) -> int | None:
    """How many cells the suite's last ``fedshift bench`` planned (its ``bench.json``, one
    row per cell), or None when it is missing or not such a list."""
    try:
        rows = json.loads((src / "bench.json").read_text())
    except (OSError, ValueError):
        return None
    return len(rows) if isinstance(rows, list) else None


def collect_protocol(src: Path, results: Path, command: str, name: str) -> Path:
    """A protocol's output folder (its tables and numbers, no figures) into
    ``results/protocols/<name>`` (``name``: a plain folder name). Links and special files in
    the output are refused before anything is touched; linked folders are not entered."""
    src = Path(src)
    root = Path(results) / "protocols"
    dest = child_path(root, name, "--protocol")
    files = []
    for folder, dirs, names in os.walk(src):  # does not descend into linked folders
        for d in dirs:
            if (Path(folder) / d).is_symlink():
                check_regular(Path(folder) / d, "copies into results/", missing_ok=False)
        files += [Path(folder) / n for n in names if Path(n).suffix in PROTOCOL_SUFFIXES]
    files = _checked(sorted(files))
    if not files:
        raise FedshiftError(f"{src}: no protocol output (*.json / *.md)")
    ensure_dir(root)
    _fresh(dest, root)
    for f in files:
        out = dest / f.relative_to(src)
        ensure_dir(out.parent)
        copy_regular(f, out)
    write_text_atomic(dest / SOURCE, _source(command, [], files))
    return dest
