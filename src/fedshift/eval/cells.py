"""What makes a suite cell's folder the cell of a config: its ``cell.json`` records the
cell's digest (:func:`fedshift.bench.config_digest`), and that digest must be what its
``config.yaml`` (and the config its ``summary.json`` records) gives again. ``fedshift bench``
(a cached or committed cell) and ``fedshift claims collect`` (a cell going into
``results/``) check it, so a cell whose ``cell.json`` was rewritten, or another suite's cell
renamed, is never taken for this one."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from fedshift.core.identity import number_digest

__all__ = ["CELL_FILE", "check_cell", "foreign_cell", "read_object"]

#: a cell's record of its digest, label and thread count
CELL_FILE = "cell.json"


def read_object(path: Path) -> dict | None:
    """``path``'s JSON object, or None when it is missing, empty, cut short or not an
    object."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def foreign_cell(folder: Path, digest: str) -> str | None:
    """Why the files of the cell ``folder`` are not of the config of ``digest``, or None: its
    ``cell.json`` must record that digest and its ``config.yaml`` (and the config its
    ``summary.json`` records, when there is one) must give it again
    (:func:`~fedshift.core.identity.number_digest`), so a cell whose ``cell.json`` was
    rewritten, or another suite's cell renamed, is not taken for this one."""
    meta = read_object(folder / CELL_FILE)
    if meta is None or meta.get("digest") != digest:
        return f"{folder / CELL_FILE} does not record the digest {digest}"
    threads = meta.get("threads")
    threads = threads if isinstance(threads, int) and not isinstance(threads, bool) else None
    try:
        loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # plain data, libyaml's if any
        cfg = yaml.load((folder / "config.yaml").read_text(), Loader=loader)
    except (OSError, ValueError, yaml.YAMLError) as e:
        return f"{folder / 'config.yaml'} is unreadable ({e})"
    got = _digest(cfg, threads)
    if got is None:
        return f"{folder / 'config.yaml'} is not a fedshift config"
    if got != digest:
        return (
            f"{folder}: its cell.json records the digest {digest}, but its config.yaml gives "
            f"{got} (the cell's files were edited, or it is another suite's cell)"
        )
    recorded = (read_object(folder / "summary.json") or {}).get("config")
    if recorded is not None and _digest(recorded, threads) != digest:
        return (
            f"{folder}: its summary.json was written by a run of another config (digest "
            f"{_digest(recorded, threads)}, not {digest})"
        )
    return None


def _digest(cfg: object, threads: int | None) -> str | None:
    """:func:`~fedshift.core.identity.number_digest` of a config read as data; None for
    something that is not a config (a list, a ``run`` section that is not a mapping)."""
    if not isinstance(cfg, dict):
        return None
    try:
        return number_digest(cfg, threads)
    except (AttributeError, TypeError, ValueError):
        return None


def check_cell(folder: Path) -> None:
    """The finished cell ``folder`` of a suite folder is one fedshift wrote, before it goes
    into ``results/``: when it has a ``cell.json`` (every cell ``fedshift bench`` runs), its
    name ends with the digest that records and its files are of that config
    (:func:`foreign_cell`); its ``summary.json``'s scores are finite and in range
    (:func:`~fedshift.eval.summary.check_scores`, what the claims ledger reads). A
    :class:`~fedshift.core.errors.FedshiftError` names the cell and what is wrong."""
    from fedshift.core.errors import FedshiftError
    from fedshift.eval.summary import check_scores

    again = "; run the suite again"
    if (folder / CELL_FILE).exists():
        meta = read_object(folder / CELL_FILE)
        digest = meta.get("digest") if meta is not None else None
        if not isinstance(digest, str):
            raise FedshiftError(f"{folder / CELL_FILE} is unreadable{again}")
        if not folder.name.endswith(f"-{digest}"):
            raise FedshiftError(
                f"{folder}: its cell.json records the digest {digest}, which its folder name "
                f"does not end with (renamed, or its cell.json rewritten){again}"
            )
        problem = foreign_cell(folder, digest)
        if problem is not None:
            raise FedshiftError(problem + again)
    path = folder / "summary.json"
    summary = read_object(path)
    if summary is None:
        raise FedshiftError(f"{path} is unreadable{again}")
    check_scores(summary, path)
