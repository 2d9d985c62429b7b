"""Sites of the generic loaders (``folders``, ``segfolders``, ``arrays``): which sub-folders
(or files) of ``dataset.root`` are the clients, and the client names made from their names.

Client names are the site names in lower case with every run of characters other than
letters, digits, ``-`` and ``_`` replaced by one ``_`` (leading and trailing ``_`` dropped):
``Real World`` -> ``real_world``, ``Site A (1.5T)`` -> ``site_a_1_5t``, as ``officehome``
names its clients. Two sites that give one name are an error naming both.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

from fedshift.core.errors import ConfigError, DataError, MissingSourceError
from fedshift.data.common.checks import check_distinct

__all__ = [
    "check_sites_key",
    "client_name",
    "client_names",
    "name_hint",
    "numbered_clients",
    "site_folders",
]

_RUN = re.compile(r"_+")


def client_name(site: str) -> str:
    """The client name of a site (module docstring); ``""`` if nothing is left."""
    kept = "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in site.strip().lower())
    return _RUN.sub("_", kept).strip("_")


def name_hint(given: Iterable[str], clients: Iterable[str]) -> str:
    """For an error that names unknown clients: ``" ('Hospital C' is client 'hospital_c'; ...)"``
    for each of ``given`` that is not a client name but whose :func:`client_name` is one (a
    site's folder name given where its client name is wanted); ``""`` when there is none."""
    known = set(clients)
    pairs = [
        f"{g!r} is client {client_name(g)!r}"
        for g in given
        if g not in known and client_name(g) in known
    ]
    if not pairs:
        return ""
    return (
        f" ({'; '.join(pairs)}: client names are the site names in lower case, every run of "
        "characters other than letters, digits, - and _ made one _)"
    )


def numbered_clients(k: int) -> list[str]:
    """The names of ``k`` clients a partition deals: ``client00``, ``client01``, ..."""
    width = max(2, len(str(k - 1)))
    return [f"client{i:0{width}d}" for i in range(k)]


def client_names(sites: Iterable[str], where: str) -> dict[str, str]:
    """client name -> site name, in the sites' order; ``where`` names what holds the sites
    (for errors)."""
    out: dict[str, str] = {}
    for site in sites:
        name = client_name(site)
        if not name:
            raise DataError(
                f"site {site!r} in {where}: its name has no letter or digit to name a client "
                "with; rename it"
            )
        if name in out:
            raise DataError(
                f"sites {out[name]!r} and {site!r} in {where} both give the client name "
                f"{name!r} (lower case, other characters as _); rename one of them"
            )
        out[name] = site
    return out


def check_sites_key(value: object, key: str) -> None:
    """``dataset.sites``: ``None`` or a non-empty list of distinct names."""
    if value is None:
        return
    ok = isinstance(value, list | tuple) and all(isinstance(s, str) and s for s in value)
    if not ok or not value:
        raise ConfigError(
            f"config key '{key}' must be null (every site) or a non-empty list of site names, "
            f"got {value!r}"
        )
    check_distinct(value, key)


def site_folders(root: Path, sites: list[str] | None, dataset: str, tree: str) -> dict[str, Path]:
    """client name -> site folder: ``sites`` (folder names, in that order) or every
    non-hidden sub-folder of ``root``, sorted by name."""
    layout = f"Expected layout:\n{tree.rstrip()}"
    if sites is None:
        names = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
        if not names:
            raise MissingSourceError(
                f"dataset.root={str(root)!r} has no site folders ({dataset} makes one client "
                f"per sub-folder). {layout}"
            )
    else:
        names = list(sites)
        for site in names:
            if not (root / site).is_dir():
                raise MissingSourceError(
                    f"site folder {root / site} is missing; add it or drop {site!r} from "
                    f"dataset.sites. {layout}"
                )
    clients = client_names(names, str(root))
    return {client: root / site for client, site in clients.items()}
