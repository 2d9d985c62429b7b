"""Consent before a plug-in's code runs: a ``module:Class`` name is code.

Importing a plug-in named ``module:Class`` (:mod:`fedshift.core.registry`) runs its module's
top-level code, so a config is code as soon as it names one. A name the user gave, on the
command line or in their own ``-c`` file (or to the Python API), is imported as asked. A
name from a source the user may have received from someone else is not imported without an
explicit yes:

* a run directory's ``config.yaml`` (``fedshift run --resume``, the protocols on finished
  runs, ``fedshift flower simulate --resume``, :meth:`fedshift.api.LoadedRun.rebuild`);
* a suite run by ``fedshift bench`` (names in its ``key=value`` overrides count as given);
* a Flower run config (the ServerApp's ``fedshift-config``, the config a SuperNode receives).

Such a source is read inside :func:`untrusted`: every ``module:Class`` name it holds that is
not registered yet is listed in one :class:`PluginConsentError` (with the file each module
would be imported from, found without importing it), and nothing is imported, unless
plug-ins are allowed: ``--allow-plugins`` (:func:`allow_in_this_process`), the environment
variable ``FEDSHIFT_ALLOW_PLUGINS=1``, :func:`allowed` around Python code, or the scope's own
``allow`` (a SuperNode's ``allow-plugins`` node-config key). The registry checks the scope
again before every import (:func:`require`), so a name the listing missed is refused too.

A command that only reads never imports a plug-in a config file names (:data:`READ_ONLY`):
``fedshift config show`` prints such a section as written (:func:`held_back`), ``fedshift
data check`` refuses, and ``fedshift report`` shows the plug-in's keys without its defaults;
each imports with ``--allow-plugins``. Names typed on the command line are imported as asked.

Entry-point names (a plain name declared by an installed package) are not gated: installing
the package already ran its code on this machine. A ``*.dist-info`` lying in the folder
``python -m fedshift`` runs from is not an installed package, and declares nothing
(:mod:`fedshift.core.searchpath`).
"""

from __future__ import annotations

import importlib.machinery
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

from fedshift.core.errors import ConfigError
from fedshift.core.registered import registered_anywhere
from fedshift.core.searchpath import plugin_import

__all__ = [
    "ALLOW_ENV",
    "PluginConsentError",
    "allow_in_this_process",
    "allowed",
    "held_back",
    "listing",
    "plugin_names",
    "require",
    "untrusted",
]

#: set to 1 / true / yes to import plug-ins named by configs from elsewhere
ALLOW_ENV = "FEDSHIFT_ALLOW_PLUGINS"
#: the config keys whose value may be a ``module:Class`` plug-in name
PLUGIN_KEYS = ("algorithm.name", "model.name", "dataset.name", "augment")
#: why a config from elsewhere is not imported from (the default reason)
ELSEWHERE = "this config did not come from your command line or your own -c file"
#: why a command that only reads imports nothing a config file names
READ_ONLY = "{command} only reads, and imports no plug-in a config file names"

#: how to say yes, from the command line or Python
HOW = (
    f"--allow-plugins (or set {ALLOW_ENV}=1; in Python, inside "
    "`with fedshift.core.consent.allowed():`)"
)

_process_allows = False
_allow: ContextVar[bool] = ContextVar("fedshift_allow_plugins", default=False)


@dataclass(frozen=True)
class _Scope:
    source: str
    trusted: frozenset[str]
    allow: bool
    how: str
    reason: str = ELSEWHERE


_scope: ContextVar[_Scope | None] = ContextVar("fedshift_plugin_scope", default=None)


class PluginConsentError(ConfigError):
    """A config from elsewhere names plug-in code and plug-ins are not allowed: nothing was
    imported."""


def allow_in_this_process(on: bool = True) -> None:
    """``--allow-plugins``: plug-ins named by any config are imported in this process."""
    global _process_allows
    _process_allows = on


@contextmanager
def allowed(on: bool = True) -> Iterator[None]:
    """Inside the block (this thread), plug-ins named by configs from elsewhere are imported:
    the Python API's yes (``with fedshift.core.consent.allowed(): resume_experiment(...)``)."""
    token = _allow.set(on)
    try:
        yield
    finally:
        _allow.reset(token)


def _env_allows() -> bool:
    return os.environ.get(ALLOW_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def _is_allowed(scope: _Scope) -> bool:
    return scope.allow or _process_allows or _allow.get() or _env_allows()


def _is_plugin(name: object) -> bool:
    return isinstance(name, str) and ":" in name


def plugin_names(raw: dict) -> list[tuple[str, str]]:
    """``(config key, name)`` of every ``module:Class`` name a raw config holds:
    ``algorithm.name``, ``model.name``, ``dataset.name``, the ``augment`` entries, and the
    same keys' values in its ``sweep`` grid (``cell`` mappings included). Nothing is
    imported."""
    found: list[tuple[str, str]] = []

    def section(key: str, value: object) -> None:
        name = value.get("name") if isinstance(value, dict) else value
        if _is_plugin(name):
            found.append((key, str(name)))

    def augments(key: str, value: object) -> None:
        for i, item in enumerate(value if isinstance(value, list) else [value]):
            section(f"{key}[{i}]", item)

    def dotted(key: str, value: object) -> None:
        if key in ("algorithm.name", "model.name", "dataset.name", "algorithm", "model", "dataset"):
            section(key if key.endswith(".name") else f"{key}.name", value)
        elif key == "augment":
            augments(key, value)

    if not isinstance(raw, dict):
        return found
    for head in ("algorithm", "model", "dataset"):
        section(f"{head}.name", raw.get(head))
    if "augment" in raw:
        augments("augment", raw["augment"])
    grid = raw.get("sweep")
    if isinstance(grid, dict):
        for key, values in grid.items():
            for v in values if isinstance(values, list) else [values]:
                if key == "cell" and isinstance(v, dict):
                    for dk, dv in v.items():
                        dotted(str(dk), dv)
                else:
                    dotted(str(key), v)
    return found


def locate(module: str) -> str | None:
    """The file (or folder) the top-level package of ``module`` would be imported from,
    found on Python's path without importing anything; None when not found."""
    top = module.partition(":")[0].split(".")[0]
    loaded = sys.modules.get(top)
    if loaded is not None:
        return getattr(loaded, "__file__", None)
    try:
        with plugin_import():  # looked for as a plug-in: python -m's folder counts
            spec = importlib.machinery.PathFinder.find_spec(top, sys.path) if top else None
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        return None
    if spec.origin not in (None, "namespace"):
        return spec.origin
    return next(iter(spec.submodule_search_locations or []), None)


def _where(name: str) -> str:
    top = name.partition(":")[0].split(".")[0]
    path = locate(top)
    return f"module {top!r} at {path}" if path else f"module {top!r}, not found on Python's path"


@contextmanager
def untrusted(
    source: str,
    raws: list[dict] | None = None,
    trusted: set[str] | frozenset[str] = frozenset(),
    allow: bool = False,
    how: str | None = None,
    reason: str | None = None,
) -> Iterator[None]:
    """Read a config from ``source`` (a place the user may have received from elsewhere):
    the ``module:Class`` names in ``raws`` other than the ``trusted`` ones (given by the
    user) and those registered already are listed in one :class:`PluginConsentError` unless
    plug-ins are allowed (``allow``, or the module docstring's ways; ``how`` says how to);
    inside the block the registry refuses to import any other (:func:`require`). A scope
    inside another keeps the outer one's ``how`` and ``reason`` (why nothing is imported,
    :data:`ELSEWHERE` by default; :data:`READ_ONLY` for a command that only reads) unless
    given its own, and its ``allow``."""
    outer = _scope.get()
    if how is None:
        how = outer.how if outer is not None else HOW
    if reason is None:
        reason = outer.reason if outer is not None else ELSEWHERE
    allow = allow or (outer is not None and outer.allow)
    scope = _Scope(source, frozenset(trusted), allow, how, reason)
    if raws is not None:
        check(scope, [n for raw in raws for n in plugin_names(raw)])
    token = _scope.set(scope)
    try:
        yield
    finally:
        _scope.reset(token)


def _held(scope: _Scope, names: list[tuple[str, str]]) -> dict[str, str]:
    """``{name: config key}`` of the ``names`` that ``scope`` does not let be imported."""
    if _is_allowed(scope):
        return {}
    todo: dict[str, str] = {}
    for key, name in names:
        if name not in scope.trusted and not registered_anywhere(name):
            todo.setdefault(name, key)
    return todo


def listing(held: dict[str, str]) -> str:
    """``algorithm.name 'm:X' (module 'm' at /path/m.py); ...`` for :func:`held_back`'s
    answer: each name with its key and the file its module would come from."""
    return "; ".join(f"{key} {name!r} ({_where(name)})" for name, key in held.items())


def check(scope: _Scope, names: list[tuple[str, str]]) -> None:
    todo = _held(scope, names)
    if not todo:
        return
    raise PluginConsentError(
        f"{scope.source} names plug-in code: {listing(todo)}. Importing a plug-in runs its "
        f"module's code, and {scope.reason}: nothing was imported. If you trust it and its "
        f"modules, run again with {scope.how}"
    )


def held_back(raws: list[dict], trusted: set[str] | frozenset[str] = frozenset()) -> dict[str, str]:
    """``{name: config key}`` of the ``module:Class`` names in ``raws`` that are not
    imported here: not registered yet, not ``trusted`` (given on the command line), and
    plug-ins not allowed (``--allow-plugins``, :data:`ALLOW_ENV`, :func:`allowed`). A
    command that only shows a config treats these as names (``fedshift config show``)."""
    scope = _Scope("config", frozenset(trusted), False, HOW)
    return _held(scope, [n for raw in raws for n in plugin_names(raw)])


def require(name: str, key: str | None) -> None:
    """The registry is about to import the plug-in ``name``: refused inside an
    :func:`untrusted` scope that does not allow it (unless the user gave that name)."""
    scope = _scope.get()
    if scope is not None:
        check(scope, [(key or "plug-in", name)])
