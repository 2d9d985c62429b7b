"""Per-site split lists: ``<site>/train.txt``, ``val.txt`` and ``test.txt``.

Each list names one file per line, by its path relative to the folder the loader lists
(``folders``: the site folder, e.g. ``dog/img_001.jpg``; ``segfolders``: ``images/``, e.g.
``case01.nii.gz`` or just ``case01``). Blank lines and lines starting with ``#`` are ignored;
``\\`` is read as ``/`` and a leading ``./`` dropped. A site has all three lists or none (two
of three is an error naming the missing one). A line naming no listed file, a file in two
lists (or twice in one) is a :class:`~fedshift.core.errors.DataError` naming the list file and
line. Files listed in no list are left out (the loader counts them as ``unlisted``).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from fedshift.core.errors import ConfigError, DataError
from fedshift.core.federation import SPLITS
from fedshift.data.common.checks import check_cap, check_fractions, check_seed

__all__ = ["SPLIT_MODES", "check_split_keys", "find_split_lists", "read_split_lists"]

#: ``dataset.splits``: lists where a site has them (else fractions), lists required, or
#: fractions always (lists ignored)
SPLIT_MODES = ("auto", "lists", "fractions")


def check_split_keys(params: object, prefix: str) -> None:
    """The splitting keys of the generic loaders' Params: ``splits`` (where they have it),
    ``fractions``, ``seed`` and ``max_per_split``; :class:`ConfigError` naming the key."""
    splits = getattr(params, "splits", None)
    if splits is not None and splits not in SPLIT_MODES:
        raise ConfigError(f"config key '{prefix}.splits' must be one of {SPLIT_MODES}")
    check_fractions(params.fractions, f"{prefix}.fractions")
    check_seed(params.seed, f"{prefix}.seed")
    check_cap(params.max_per_split, f"{prefix}.max_per_split")


def find_split_lists(site: Path, mode: str) -> dict[str, Path] | None:
    """The site's split list files, or ``None`` when it splits by fractions."""
    if mode == "fractions":
        return None
    found = {s: site / f"{s}.txt" for s in SPLITS if (site / f"{s}.txt").is_file()}
    if not found and mode == "auto":
        return None
    missing = [f"{s}.txt" for s in SPLITS if s not in found]
    if missing:
        why = (
            "dataset.splits=lists needs them in every site folder"
            if not found
            else f"it has {', '.join(p.name for p in found.values())}; a site has all three "
            f"lists or none"
        )
        raise DataError(
            f"site folder {site} lacks the split list(s) {', '.join(missing)}: {why} (or set "
            f"dataset.splits=fractions to split by dataset.fractions)"
        )
    return found


def read_split_lists(
    lists: dict[str, Path], known: Mapping[str, str], what: str
) -> dict[str, list[str]]:
    """The entries of each list, as the values of ``known`` (accepted spelling -> the file's
    key); ``what`` describes a valid line for the error message."""
    out: dict[str, list[str]] = {}
    seen: dict[str, str] = {}
    for split in SPLITS:
        path = lists[split]
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise DataError(f"{path}: cannot read this split list ({exc})") from exc
        items: list[str] = []
        for n, raw in enumerate(text.splitlines(), 1):
            line = raw.strip().replace("\\", "/")
            if not line or line.startswith("#"):
                continue
            line = line.removeprefix("./")
            if line not in known:
                raise DataError(
                    f"{path}, line {n}: {line!r} is not {what}; fix the line or add the file"
                )
            item = known[line]
            if item in seen:
                raise DataError(
                    f"{path}, line {n}: {line!r} is listed already ({seen[item]}); a file "
                    f"belongs to one split, once"
                )
            seen[item] = f"{path.name}, line {n}"
            items.append(item)
        out[split] = items
    return out
