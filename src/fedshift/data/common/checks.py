"""Checks of ``dataset.*`` values and of users' data folders, with actionable errors.

Parameter checks raise :class:`~fedshift.core.errors.ConfigError` naming the config key and
what it must be; folder checks raise :class:`~fedshift.core.errors.MissingSourceError`
naming the path and showing the expected layout as a small tree.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Protocol

from fedshift.core.errors import ConfigError, MissingSourceError

__all__ = [
    "check_cache_dir",
    "check_cap",
    "check_distinct",
    "check_domains",
    "check_flag",
    "check_fractions",
    "check_root_key",
    "check_seed",
    "check_size",
    "require_file",
    "require_root",
]


# --------------------------------------------------------------------------------------------
# folders
# --------------------------------------------------------------------------------------------


def require_root(root: str | os.PathLike | None, dataset: str, tree: str) -> Path:
    """``dataset.root`` as an existing folder, absolute (a relative one is taken from the
    current folder, and every message about its files names them so), else
    :class:`MissingSourceError` naming the absolute path it looked at.

    ``tree`` is the expected layout (a few indented lines) shown in the message.
    """
    layout = f"Expected layout:\n{tree.rstrip()}"
    if root is None or str(root) == "":
        raise MissingSourceError(
            f"dataset {dataset!r} reads data you keep on disk (nothing is downloaded): set "
            f"dataset.root to its folder (e.g. `dataset.root=/data/{dataset}`). {layout}"
        )
    given = Path(root).expanduser()
    path = given.absolute()  # a relative root: from the current folder, named so in errors
    if not path.is_dir():
        what = "is a file, not a folder" if path.exists() else "does not exist"
        where = "" if given.is_absolute() else f" (relative to the current folder {Path.cwd()})"
        raise MissingSourceError(
            f"dataset.root={str(root)!r}: {path} {what}{where}; set dataset.root to the "
            f"folder holding your {dataset} data. {layout}"
        )
    return path


def require_file(path: Path, dataset: str, tree: str) -> Path:
    """``path`` if it is a file, else :class:`MissingSourceError` showing the layout."""
    if not path.is_file():
        raise MissingSourceError(
            f"{path} is missing; {dataset} needs it (fix dataset.root or restore the file). "
            f"Expected layout:\n{tree.rstrip()}"
        )
    return path


# --------------------------------------------------------------------------------------------
# parameters
# --------------------------------------------------------------------------------------------


def check_size(value: object, key: str, multiple: int = 1, minimum: int = 1) -> int:
    """An integer ``>= minimum`` divisible by ``multiple`` (a U-Net with four 2x poolings needs
    sides that are multiples of 16), else :class:`ConfigError` naming ``key``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"config key '{key}' must be an integer >= {minimum}, got {value!r}")
    if value % multiple:
        lower = max(multiple, value - value % multiple)
        raise ConfigError(
            f"config key '{key}' must be a multiple of {multiple} (the U-Net halves the image "
            f"four times), got {value}; use e.g. {lower} or {lower + multiple}"
        )
    return value


def check_fractions(value: object, key: str = "dataset.fractions") -> tuple[float, float, float]:
    """Three positive train/val/test fractions summing to 1 (within 1e-6)."""
    ok = isinstance(value, list | tuple) and len(value) == 3
    ok = ok and all(not isinstance(v, bool) and isinstance(v, int | float) for v in value)
    if not ok or any(v <= 0 for v in value) or abs(sum(value) - 1.0) > 1e-6:
        raise ConfigError(
            f"config key '{key}' must be three positive numbers [train, val, test] summing to "
            f"1, e.g. [0.64, 0.16, 0.2]; got {value!r}"
        )
    return float(value[0]), float(value[1]), float(value[2])


def check_domains(value: object, valid: Sequence[str], key: str = "dataset.domains") -> list[str]:
    """A non-empty list of distinct names from ``valid``, else :class:`ConfigError`."""
    if isinstance(value, str) or not isinstance(value, list | tuple):
        raise ConfigError(f"config key '{key}' must be a list of names from {list(valid)}")
    if not value:
        raise ConfigError(f"config key '{key}' is empty; choose one or more of {list(valid)}")
    unknown = [d for d in value if d not in valid]
    if unknown:
        raise ConfigError(f"config key '{key}': unknown domain(s) {unknown}; valid: {list(valid)}")
    check_distinct(value, key)
    return list(value)


def check_distinct(value: Sequence[str], key: str) -> None:
    """No name listed twice in the list ``value`` of config key ``key``, else
    :class:`ConfigError` naming the repeated names."""
    dupes = sorted({d for d in value if list(value).count(d) > 1})
    if dupes:
        raise ConfigError(f"config key '{key}' lists {dupes} more than once")


def check_seed(value: object, key: str = "dataset.seed") -> int:
    """An integer >= 0."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"config key '{key}' must be an integer >= 0, got {value!r}")
    return value


def check_cap(value: object, key: str) -> int | None:
    """``None`` (no cap) or an integer >= 1."""
    return None if value is None else check_size(value, key)


def check_required_size(value: object, key: str) -> int:
    """An integer >= 1 where None (all) is not an option, else :class:`ConfigError`."""
    if value is None:
        raise ConfigError(f"config key '{key}' must be an integer >= 1")
    return check_size(value, key)


def check_flag(value: object, key: str) -> bool:
    """``True`` or ``False`` (not 0 / 1 / a string)."""
    if not isinstance(value, bool):
        raise ConfigError(f"config key '{key}' must be true or false, got {value!r}")
    return value


def check_root_key(value: object, key: str = "dataset.root") -> None:
    """``None`` or a path (the folder itself is checked by :func:`require_root`)."""
    if value is not None and not isinstance(value, str | os.PathLike):
        raise ConfigError(f"config key '{key}' must be a folder path, got {value!r}")


def check_cache_dir(value: object, key: str = "dataset.cache_dir") -> None:
    """``None`` (the default cache folder) or a path."""
    if value is not None and not isinstance(value, str | os.PathLike):
        raise ConfigError(f"config key '{key}' must be a folder path or null, got {value!r}")


class CachedImageKeys(Protocol):
    """The ``dataset.*`` keys of a dataset read from image files into the decoded-image cache
    (``pacs``, ``officehome``, ``office-caltech10``, ``domainnet``)."""

    size: int
    max_per_split: int | None
    seed: int
    cache: bool
    cache_dir: str | None


def check_cached_image_keys(params: CachedImageKeys, prefix: str = "dataset") -> None:
    """``size``, ``max_per_split``, ``seed``, ``cache`` and ``cache_dir`` of ``params``, in
    that order, each by its check above (the key named ``<prefix>.<key>``)."""
    check_size(params.size, f"{prefix}.size")
    check_cap(params.max_per_split, f"{prefix}.max_per_split")
    check_seed(params.seed, f"{prefix}.seed")
    check_flag(params.cache, f"{prefix}.cache")
    check_cache_dir(params.cache_dir, f"{prefix}.cache_dir")


def differences(
    ref: Iterable, have: Iterable, lacks: Callable[[list], str], adds: Callable[[list], str]
) -> str:
    """How ``have`` differs from ``ref`` as a set, for an error: ``lacks(missing)`` and/or
    ``adds(extra)`` (each of a sorted list, only when not empty) joined by " and "; "" when
    the two are the same set."""
    ref_set, have_set = set(ref), set(have)
    missing, extra = sorted(ref_set - have_set), sorted(have_set - ref_set)
    return " and ".join([lacks(missing)] * bool(missing) + [adds(extra)] * bool(extra))
