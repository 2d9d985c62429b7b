"""Listing the files under a user's data folder, safely.

:func:`list_files` walks a folder recursively in a fixed (sorted) order:

* hidden entries (a name starting with ``.``, and everything below a hidden folder) are
  ignored and not counted: ``.DS_Store``, ``.ipynb_checkpoints/``, editors' backups;
* files with one of the wanted suffixes (compared in lower case; ``.nii.gz`` counts as one
  suffix) are listed; every other regular file is *skipped*: returned in ``skipped`` so that
  the loader counts it and names it in a warning;
* symbolic links are followed (a data folder is often a link to another disk), and every
  directory is entered at most once, by its resolved path: a link that leads back to a
  folder already entered (a symlink loop, or a second link to the same folder, whose images
  would be listed twice) is a :class:`~fedshift.core.errors.DataError` naming the link and
  where it leads, never a hang;
* a broken link named like a wanted file (``img.png -> /gone/img.png``) is a
  :class:`DataError` naming it (an image that cannot be read); another broken link is skipped.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from fedshift.core.errors import DataError

__all__ = ["Listing", "list_files", "suffix_of", "warn_skipped"]

#: how many file names a warning shows per client
SHOWN = 10
log = logging.getLogger("fedshift.data")


def suffix_of(path: Path | str) -> str:
    """The lower-case suffix of a file name, ``.nii.gz`` as one suffix."""
    name = Path(path).name.lower()
    if name.endswith(".nii.gz"):
        return ".nii.gz"
    return Path(name).suffix


@dataclass
class Listing:
    """The wanted files under a folder (sorted by relative path) and the skipped ones."""

    files: list[Path] = field(default_factory=list)
    skipped: list[Path] = field(default_factory=list)


def list_files(
    folder: Path, suffixes: tuple[str, ...], visited: dict[Path, Path] | None = None
) -> Listing:
    """Every file under ``folder`` whose suffix is in ``suffixes`` (module docstring), sorted
    by its path relative to ``folder`` (``/``-separated). ``visited`` (resolved folder -> the
    path it was entered by) is shared by calls that must not enter one folder twice, e.g. the
    class folders of one site."""
    out = Listing()
    visited = {} if visited is None else visited
    stack = [folder]
    while stack:
        here = stack.pop()
        real = here.resolve()
        if real in visited:
            raise DataError(
                f"{here} and {visited[real]} are one folder ({real}) reached twice through a "
                f"symbolic link: a symlink loop, or a second link to one folder (its files "
                f"would be listed twice); remove the link"
            )
        visited[real] = here
        try:
            entries = sorted(os.scandir(here), key=lambda e: e.name)
        except OSError as exc:
            raise DataError(f"{here}: cannot list this folder ({exc.strerror})") from exc
        subfolders = []
        for entry in entries:
            if entry.name.startswith("."):
                continue
            path = Path(entry.path)
            try:
                is_dir = entry.is_dir()  # follows links
                is_file = entry.is_file()
            except OSError:
                is_dir = is_file = False
            if is_dir:
                subfolders.append(path)
            elif is_file and suffix_of(path) in suffixes:
                out.files.append(path)
            elif entry.is_symlink() and not path.exists() and suffix_of(path) in suffixes:
                raise DataError(
                    f"{path} is a broken symbolic link (to {os.readlink(path)}); restore its "
                    f"target or remove the link"
                )
            else:
                out.skipped.append(path)
        stack.extend(reversed(subfolders))
    out.files.sort(key=lambda p: p.relative_to(folder).as_posix())
    out.skipped.sort(key=lambda p: p.relative_to(folder).as_posix())
    return out


def warn_skipped(dataset: str, what: str, names: dict[str, list[str]]) -> None:
    """A warning (logger ``fedshift.data``: ``fedshift run`` shows it as a ``fedshift: ...``
    line) saying, per client, how many files were skipped and which (the first
    :data:`SHOWN`); nothing when none was."""
    lines = []
    for client, files in names.items():
        if files:
            more = f" and {len(files) - SHOWN} more" if len(files) > SHOWN else ""
            lines.append(f"{client}: {len(files)} ({', '.join(files[:SHOWN])}{more})")
    if lines:
        log.warning("%s: skipped %s: %s", dataset, what, "; ".join(lines))
