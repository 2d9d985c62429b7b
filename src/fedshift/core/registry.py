"""Name -> component registries (algorithms, datasets, models) with helpful lookup errors.

Every built-in component is registered by one :meth:`Registry.add` in its kind's package
``__init__`` (``ALGORITHMS.add(name, cls, Params)``, ``MODELS.add(name, cls, Params,
description)``; datasets: each built-in :class:`~fedshift.core.datasets.Dataset`, shaped as
a plug-in, through the plug-ins' check and then ``DATASETS.add``): the name, the
implementation, its parameter dataclass, a one-line description and, for a registry made
with ``tasks`` (datasets), the task, which lives on the :class:`Entry`.

A registry that accepts plug-ins (:meth:`Registry.accept_plugins`; the catalog switches it on
for algorithms, augments, models and datasets) also finds components that are not built in,
the first time their name is asked for:

* ``package.module:Class`` (a dotted attribute path after the colon is allowed): the module is
  imported, the class taken and checked to subclass the registry's base class, then
  registered under that full name, so configs, summaries and ``--resume`` name it the same;
* a plain name that is not built in: an entry point of that name in the registry's group
  (``fedshift.algorithms``, ``fedshift.augments``, ``fedshift.models``,
  ``fedshift.datasets``), declared by an
  installed package, loaded the same way. Entry points are read only for such a name, so
  built-in names never touch the installed packages' metadata.

A registry whose plug-ins follow a structural contract rather than a base class (datasets:
:class:`~fedshift.core.datasets.DatasetSpec`) passes ``plugin_entry``, which checks the
object and makes its :class:`Entry`.

A class without its own ``name`` attribute gets the name it was registered under (augment
state and records are keyed by ``name``; two plug-ins must not share the base class's).
Every failure is a :class:`~fedshift.core.errors.ConfigError` naming the config key, the
module and the fix (the import error, Python's path, the attributes the module has).
"""

from __future__ import annotations

import contextlib
import difflib
import importlib
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar, cast

from fedshift.core import consent, registered, searchpath
from fedshift.core.components import Component
from fedshift.core.config import build_dataclass, unknown_key_error
from fedshift.core.errors import ConfigError
from fedshift.core.yamlsafe import short_repr

T = TypeVar("T")

#: where a user reads how to write and name a plug-in
GUIDE = "`fedshift docs extending`"


@dataclass(frozen=True)
class Entry(Generic[T]):
    name: str
    obj: T
    params: type | None  # a dataclass describing the component's config keys
    description: str
    #: the component's task, in a registry made with ``tasks`` (datasets), else None
    task: str | None = None


class Registry(Generic[T]):
    """A named collection of components. ``get`` fails with the valid choices listed."""

    def __init__(self, kind: str, tasks: tuple[str, ...] | None = None) -> None:
        self.kind = kind
        #: the tasks an entry may declare; None: entries declare none
        self.tasks = tasks
        self._entries: dict[str, Entry[T]] = {}
        #: plug-ins: the class they must subclass and their entry-point group (None: none)
        self._base: type | None = None
        self._group: str | None = None
        self._plugins: set[str] = set()
        self._plugin_entry: Callable[[str, Any, str], Entry[T]] | None = None
        registered.REGISTRIES.append(self)  # registered_anywhere: consent asks

    def add(
        self,
        name: str,
        obj: T,
        params: type | None = None,
        description: str = "",
        task: str | None = None,
    ) -> None:
        """Register ``obj`` under ``name`` with its ``Params`` dataclass, a one-line
        description (default: the first line of its docstring) and, in a registry made with
        ``tasks``, its task (one of them)."""
        if name in self._entries:
            raise ValueError(f"{self.kind} {name!r} registered twice")
        if (task is None) != (self.tasks is None) or (
            task is not None and self.tasks is not None and task not in self.tasks
        ):
            want = f"task= one of {self.tasks}" if self.tasks else "no task"
            raise ValueError(f"{self.kind} {name!r} registered with task={task!r}: needs {want}")
        doc = description or (getattr(obj, "__doc__", None) or "").strip().split("\n")[0]
        self._entries[name] = Entry(name, obj, params, doc, task)

    def accept_plugins(
        self,
        base: type,
        group: str,
        plugin_entry: Callable[[str, Any, str], Entry[T]] | None = None,
    ) -> None:
        """Let :meth:`entry` load components that are not built in (see the module
        docstring): subclasses of ``base``, named ``module:Class`` or by an entry point in
        ``group``; with ``plugin_entry``, anything that function accepts (it checks the
        loaded object against the contract ``base`` states and returns its :class:`Entry`,
        or raises an error naming the plug-in and what is missing)."""
        self._base, self._group, self._plugin_entry = base, group, plugin_entry

    def entry(self, name: str, key: str | None = None) -> Entry[T]:
        if name not in self._entries and self._base is not None:
            self._load_plugin(name, key)
        if name not in self._entries:
            where = f"config key '{key}': " if key else ""
            choices = self.names()
            hint = difflib.get_close_matches(name, choices, n=1)
            did = f" (did you mean {hint[0]!r}?)" if hint else ""
            own = ""
            if self._base is not None:
                own = (
                    f", or your own {self.kind} class as 'module:Class' or an entry point in "
                    f"group '{self._group}' (see {GUIDE})"
                )
            raise ConfigError(
                f"{where}unknown {self.kind} {name!r}{did}; valid: {', '.join(choices)}{own}"
            )
        return self._entries[name]

    def component(
        self,
        data: Mapping[str, Any] | Component[Any, T],
        section: str,
        prefix: str | None = None,
        extra_keys: tuple[str, ...] = (),
    ) -> Component[Any, T]:
        """``data`` as a typed :class:`~fedshift.core.components.Component`: one is returned
        as it is; a ``{name: ..., **params}`` mapping has its entry looked up (``<section>.name``
        in errors) and its other keys validated into the entry's ``Params`` (errors name keys
        as ``<prefix>.<key>``, default: the section). ``extra_keys`` are kept aside, unchecked,
        as :attr:`Component.extra` (the caller resolves them: a model's weights keys)."""
        if isinstance(data, Component):
            return data
        if not isinstance(data, Mapping) or "name" not in data:
            raise ConfigError(
                f"config section '{section}' needs a 'name' key, got {short_repr(data)}"
            )
        entry = self.entry(str(data["name"]), key=f"{section}.name")
        rest = {k: v for k, v in data.items() if k != "name" and k not in extra_keys}
        prefix = prefix or section
        if entry.params is None:
            if rest:
                raise unknown_key_error(f"{prefix}.{next(iter(rest))}", ["name"])
            params = None
        else:
            params = build_dataclass(entry.params, rest, prefix)
        extra = tuple((k, data[k]) for k in extra_keys if k in data)
        return Component(entry.name, params, entry.obj, extra, entry.task)

    def get(self, name: str, key: str | None = None) -> T:
        return self.entry(name, key).obj

    def names(self) -> list[str]:
        return sorted(self._entries)

    def entries(self) -> list[Entry[T]]:
        return [self._entries[n] for n in self.names()]

    def __contains__(self, name: Any) -> bool:
        return name in self._entries

    # ------------------------------------------------------------------------- plug-ins
    def plugin_names(self) -> dict[str, list[str]]:
        """The installed packages' entry points in this registry's group whose names are not
        built in: ``{name: ['module:Class', ...]}`` (more than one value: a clash that
        :meth:`entry` refuses). Nothing is imported."""
        import importlib.metadata

        if self._group is None:
            return {}
        found: dict[str, set[str]] = {}
        for ep in _installed(importlib.metadata.entry_points(group=self._group)):
            if ep.name not in self._entries:
                found.setdefault(ep.name, set()).add(ep.value)
        return {n: sorted(v) for n, v in sorted(found.items())}

    def _load_plugin(self, name: str, key: str | None) -> None:
        """Register the plug-in ``name`` names, if any (``module:Class`` or an entry point);
        a name that is neither is left for :meth:`entry`'s unknown-name error."""
        where = f"config key '{key}': " if key else ""
        if ":" in name:
            consent.require(name, key)  # a name from elsewhere needs the user's yes
            obj = load_object(name, f"{where}{self.kind} {name!r}")
            self._add_plugin(name, obj, f"{where}{self.kind} {name!r}")
            return
        found = self._entry_points(name)
        if not found:
            return
        values = sorted({ep.value for ep in found})
        if len(values) > 1:
            raise ConfigError(
                f"{where}{self.kind} {name!r}: installed packages declare {len(values)} "
                f"entry points of that name in group '{self._group}' ({', '.join(values)}); "
                "name the one you mean as 'module:Class'"
            )
        what = f"{where}{self.kind} {name!r} (entry point {values[0]!r} in '{self._group}')"
        try:
            obj = found[0].load()
        except (Exception, SystemExit) as e:  # the plug-in's own import failed (or exited)
            raise ConfigError(f"{what}: loading it failed: {_failure(e)}") from e
        self._add_plugin(name, obj, what)

    def _entry_points(self, name: str) -> list[Any]:
        """The installed packages' entry points called ``name`` in this registry's group."""
        import importlib.metadata

        if self._group is None:
            return []
        return _installed(importlib.metadata.entry_points(group=self._group, name=name))

    def _add_plugin(self, name: str, obj: Any, what: str) -> None:
        base = self._base
        assert base is not None
        if self._plugin_entry is not None:
            e = self._plugin_entry(name, obj, what)
            self.add(name, e.obj, e.params, e.description, e.task)
            self._plugins.add(name)
            return
        if not (isinstance(obj, type) and issubclass(obj, base)):
            kind = f"class {obj.__name__!r}" if isinstance(obj, type) else type(obj).__name__
            raise ConfigError(
                f"{what} is a {kind}, not a subclass of {base.__module__}.{base.__qualname__}; "
                f"{_article(self.kind)} {self.kind} must subclass it (see {GUIDE})"
            )
        from fedshift.core.contract import check_component_class  # torch: only for plug-ins

        check_component_class(obj, base, what)  # Params a dataclass, overrides callable
        if hasattr(base, "name") and "name" not in vars(obj):
            obj.name = name  # type: ignore[attr-defined]
        self.add(name, cast(T, obj), getattr(obj, "Params", None))  # a subclass of the base
        self._plugins.add(name)

    def is_plugin(self, name: str) -> bool:
        """Whether ``name`` was registered as a plug-in (not built in)."""
        return name in self._plugins


def _installed(eps: Any) -> list[Any]:
    """The entry points of installed packages: not those of a ``*.dist-info`` lying in the
    current folder that ``python -m`` put on the path (a received folder's metadata naming
    its own module would be code run by ``fedshift list``; :mod:`fedshift.core.searchpath`)."""
    out = []
    for ep in eps:
        dist = getattr(ep, "dist", None)
        where = None
        if dist is not None:
            with contextlib.suppress(Exception):  # a distribution without a folder
                where = dist.locate_file("")
        if where is not None and searchpath.in_guarded_folder(str(where)):
            continue
        out.append(ep)
    return out


def load_object(spec: str, what: str) -> Any:
    """The object ``module.path:Attr.path`` names, importing the module; every failure is a
    :class:`ConfigError` starting with ``what`` that says what to fix."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr or ":" in attr:
        raise ConfigError(
            f"{what}: expected 'module:Class' (e.g. mypkg.mymethods:MyAlgo), one colon between "
            "an importable module and a class in it"
        )
    try:
        with searchpath.plugin_import(module_name):  # python -m's folder serves plug-ins
            module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        missing = e.name or ""
        if missing and (module_name == missing or module_name.startswith(missing + ".")):
            raise ConfigError(
                f"{what}: cannot import module {module_name!r} ({e}). {_path_hint(module_name)}"
            ) from None
        raise ConfigError(
            f"{what}: importing module {module_name!r} failed: {e} (a module it imports is "
            "not installed in this environment)"
        ) from e
    except (Exception, SystemExit) as e:  # its own code failed (an error, or sys.exit)
        where = _origin(module_name)
        raise ConfigError(
            f"{what}: importing module {module_name!r}{where} failed: {_failure(e)}"
        ) from e
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            where = getattr(module, "__file__", None) or module_name
            classes = sorted(n for n, v in vars(module).items() if isinstance(v, type))
            has = f"; its classes: {', '.join(classes)}" if classes else ""
            raise ConfigError(
                f"{what}: module {module_name!r} ({where}) has no attribute {attr!r}{has}"
            )
        obj = getattr(obj, part)
    return obj


def _failure(e: BaseException) -> str:
    """What went wrong while a plug-in module was imported."""
    if isinstance(e, SystemExit):
        return (
            f"it called sys.exit({e.code!r}) while being imported (a plug-in module must "
            "define its classes, not run a program: move that code under "
            "`if __name__ == '__main__':`)"
        )
    return f"{type(e).__name__}: {e}"


def _origin(module_name: str) -> str:
    """`` (path/to/module.py)``: where the module's top-level package is on Python's path."""
    path = consent.locate(module_name)
    return f" ({path})" if path else ""


def _path_hint(module_name: str) -> str:
    """How to make ``module_name`` importable: its folder on ``PYTHONPATH``; which folders
    Python searches now."""
    top = module_name.split(".")[0]
    cwd = Path.cwd()
    here = (cwd / f"{top}.py").is_file() or (cwd / top).is_dir()
    on_path = {os.path.abspath(p or ".") for p in sys.path}
    if here and str(cwd) not in on_path:
        return (
            f"It is in the current folder {cwd}, which is not on Python's path when you run "
            f"the 'fedshift' command: run PYTHONPATH={cwd} fedshift ..., or python -m "
            "fedshift ... (which looks there last)"
        )
    shown = [p for p in sys.path if p][:6]
    more = ", ..." if len(sys.path) > len(shown) else ""
    return (
        "Put the folder that holds it on Python's path (PYTHONPATH=/path/to/folder, or "
        f"install its package); Python looks in: {', '.join(shown)}{more}"
    )


def _article(word: str) -> str:
    return "an" if word[:1] in "aeiou" else "a"
