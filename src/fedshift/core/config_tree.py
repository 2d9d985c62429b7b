"""The raw config tree (nested dicts of plain values, before a :class:`~fedshift.core.config.
RunConfig` is built): ``key=value`` overrides, dotted keys, merging, lookups and the sweep
grid's expansion. Imports only the standard library, yaml and ``core`` (errors, yamlsafe);
every caller imports these names from here (:mod:`fedshift.core.config` builds on them)."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from typing import Any

import yaml

from fedshift.core.errors import ConfigError, FedshiftError
from fedshift.core.yamlsafe import DuplicateKeyError, load_text, plain_tree, short_repr

#: the config sections that name a registered component (``<section>.name``)
COMPONENT_SECTIONS = ("dataset", "model", "algorithm", "partition")
#: combinations a sweep grid may expand to (the largest suite in configs/ has 84)
MAX_SWEEP_CELLS = 10_000


def parse_override(item: str) -> tuple[str, Any]:
    if "=" not in item:
        raise ConfigError(f"override {item!r} is not of the form key=value (e.g. train.lr=0.05)")
    key, raw = item.split("=", 1)
    key = key.strip()
    if not key:
        raise ConfigError(f"override {item!r} has an empty key")
    where = f"override {short_repr(item)}"
    try:
        value = load_text(raw) if raw.strip() else ""
    except DuplicateKeyError as e:
        raise ConfigError(f"{where}: key {short_repr(e.key)} appears twice") from None
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{where}: cannot parse value: {e}") from e
    return key, plain_tree(value, where)


def set_dotted(tree: dict, key: str, value: Any) -> None:
    parts = key.split(".")
    node = tree
    for p in parts[:-1]:
        nxt = node.get(p)
        if nxt is None:
            nxt = node[p] = {}
        elif not isinstance(nxt, dict):
            raise ConfigError(f"config key '{key}': '{p}' is not a section")
        node = nxt
    node[parts[-1]] = value


def merge(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict) and k not in ("sweep",):
            # a component section whose name changes starts from scratch
            if k in COMPONENT_SECTIONS and "name" in v and v["name"] != out[k].get("name"):
                out[k] = copy.deepcopy(v)
            else:
                out[k] = merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def lookup(tree: dict, dotted: str, default: Any = None) -> Any:
    """The value at ``a.b.c`` in a nested dict, or ``default`` when a part is missing."""
    node: Any = tree
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return node


def _overlaps(a: str, b: str) -> bool:
    """Whether dotted keys ``a`` and ``b`` name the same value, or one holds the other."""
    return a == b or a.startswith(b + ".") or b.startswith(a + ".")


def replace_swept(raw: dict, key: str, value: Any) -> None:
    """The explicit ``key=value`` replaces what ``raw``'s sweep grid says about ``key``: a grid
    key equal to ``key``, inside it (``train.lr`` for ``train``) or holding it (``algorithm``
    for ``algorithm.name``) leaves the grid; in the ``cell`` mappings such keys give way to
    ``key: value`` (cells that become the same are one cell). A grid left empty is removed."""
    grid = raw.get("sweep")
    if not isinstance(grid, dict):
        return
    for k in list(grid):
        if k == "cell" and isinstance(grid[k], list):
            cells: list = []
            for c in grid[k]:
                if isinstance(c, dict) and any(_overlaps(dk, key) for dk in c):
                    c = {dk: dv for dk, dv in c.items() if not _overlaps(dk, key)}
                    c[key] = copy.deepcopy(value)
                if c not in cells:
                    cells.append(c)
            grid[k] = cells
        elif _overlaps(k, key):
            del grid[k]
    if not grid:
        del raw["sweep"]


def expand_sweep(raw: dict, source: str = "config") -> list[dict]:
    """One raw config per combination of the ``sweep`` grid (the grid itself removed).

    The sweep key ``cell`` takes a list of mappings of dotted keys; each mapping is one grid
    value whose keys are set together (per-cell settings, e.g. ``{algorithm.name: fedbn,
    model.bn: standard}`` next to ``{algorithm.name: harmofl}``)."""
    import itertools

    grid = raw.get("sweep") or {}
    if not isinstance(grid, dict):
        raise ConfigError(f"{source}: 'sweep' must map dotted keys to lists of values")
    base = {k: v for k, v in raw.items() if k != "sweep"}
    if not grid:
        return [base]
    keys = list(grid)
    for k in keys:
        if not isinstance(grid[k], list) or not grid[k]:
            raise ConfigError(f"{source}: sweep key '{k}' needs a non-empty list of values")
    for i, v in enumerate(grid.get("cell", [])):
        if not isinstance(v, dict) or not v:
            raise ConfigError(
                f"{source}: sweep key 'cell' [{i}] must be a non-empty mapping of dotted keys "
                f"to values (e.g. {{algorithm.name: fedbn, model.bn: standard}}), got "
                f"{short_repr(v)}"
            )
    cells = math.prod(len(grid[k]) for k in keys)
    if cells > MAX_SWEEP_CELLS:
        raise ConfigError(
            f"{source}: the sweep grid has {cells:,} combinations (the product of its lists' "
            f"lengths); at most {MAX_SWEEP_CELLS:,} are run from one config: split it"
        )
    out = []
    for combo in itertools.product(*(grid[k] for k in keys)):
        one = copy.deepcopy(base)
        for k, v in zip(keys, combo, strict=True):
            for dk, dv in v.items() if k == "cell" else [(k, v)]:
                _set_sweep_value(one, dk, copy.deepcopy(dv))
        out.append(one)
    return out


def single_cell(
    raw: dict,
    source: str,
    refusal: Callable[[int, str], str],
    error: type[FedshiftError] = ConfigError,
) -> dict:
    """The one raw config of ``raw``'s sweep grid (:func:`expand_sweep`), for a command that
    runs one experiment; a grid of n != 1 cells raises ``error(refusal(n, keys))``, ``keys``
    the swept keys joined by ", "."""
    cells = expand_sweep(raw, source)
    if len(cells) != 1:
        raise error(refusal(len(cells), ", ".join(raw.get("sweep") or {})))
    return cells[0]


def _set_sweep_value(one: dict, k: str, v: Any) -> None:
    head = k.split(".")[0]
    if head in COMPONENT_SECTIONS and k == f"{head}.name":
        section = one.setdefault(head, {})
        extra = sorted(x for x in section if x != "name") if isinstance(section, dict) else []
        if isinstance(section, dict) and "name" not in section and extra:
            # keys written for no named component would silently be dropped for every value
            raise ConfigError(
                f"config section '{head}' sets {', '.join(f'{head}.{x}' for x in extra)} "
                f"but no {head}.name, while the sweep varies '{k}': they would apply to none "
                f"of its values. Give the values as mappings instead (sweep: {{{head}: "
                f"[{{name: {v}, {extra[0]}: ...}}, ...]}}), or name the {head} they belong to"
            )
        if section.get("name") != v:
            one[head] = {"name": v}
            return
    set_dotted(one, k, v)
