"""The current folder on Python's path: a place for plug-ins, never for the modules fedshift
or its dependencies import.

``python -m fedshift`` puts the current folder on Python's path, ahead of everything; the
entry point (:mod:`fedshift.__main__`) moves it to the end (:func:`current_folder_last`), so
a ``.py`` file there cannot shadow an installed module. That left the modules that are *not*
installed: an optional dependency (``wandb``, ``mlflow``, ``tensorboard``, ``flwr``...), or
any module a library tries to import and does without (``try: import x``). A ``wandb.py``
lying in a received folder ran as soon as ``track=[wandb]`` asked whether wandb is
installed.

:func:`guard_current_folder` closes that: the current folder's entry on the path then
serves a module only while a ``module:Class`` plug-in is being imported
(:func:`plugin_import`, which :func:`fedshift.core.registry.load_object` wraps around its
import): the plug-in's module and what it imports while it loads. Any other import that
reaches the current folder finds nothing there, so a missing optional module is reported
missing. Its installed packages' metadata (``*.dist-info`` with entry points) is not read
from there either (:func:`in_guarded_folder`). A folder the user put on the path
themselves (``PYTHONPATH``) is not guarded.

The guard is installed by the entry points (``python -m fedshift``, ``python -m
fedshift.cli``, after they move the folder last) and, in any process (a worker started with
``spawn`` inherits the path but not the guard), before an optional module is looked for
(:func:`find_optional`).
"""

from __future__ import annotations

import contextlib
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Iterator
from importlib.machinery import ModuleSpec

__all__ = [
    "find_optional",
    "guard_current_folder",
    "in_guarded_folder",
    "plugin_import",
]

#: top-level modules taken from the current folder as plug-ins (with what they imported)
_plugins: set[str] = set()
#: > 0 while a plug-in is imported or looked for
_open = 0


def _here() -> str:
    return os.path.realpath(os.getcwd())


def _explicit(folder: str) -> bool:
    """Whether ``folder`` is on ``PYTHONPATH``: put there by the user, not by ``-m``."""
    entries = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    return any(e and os.path.realpath(e) == folder for e in entries)


class _PluginsOnly:
    """The current folder's path-entry finder, answering only for plug-ins (module
    docstring); everything else it holds is as if absent."""

    def __init__(self, inner: object, folder: str) -> None:
        self.inner = inner
        self.folder = folder

    def find_spec(self, fullname: str, target: object = None) -> ModuleSpec | None:
        top = fullname.partition(".")[0]
        if _open or top in _plugins:
            return self.inner.find_spec(fullname, target)  # type: ignore[attr-defined]
        return None

    def invalidate_caches(self) -> None:
        with contextlib.suppress(AttributeError):
            self.inner.invalidate_caches()  # type: ignore[attr-defined]

    def __repr__(self) -> str:
        return f"_PluginsOnly({self.folder!r})"


def guard_current_folder() -> None:
    """Let the current folder's entry on ``sys.path`` (if any, and not from ``PYTHONPATH``)
    serve plug-ins only (module docstring). Idempotent; cheap when already done."""
    folder = _here()
    entries = {p for p in sys.path if os.path.realpath(p or ".") == folder}
    if not entries or _explicit(folder):
        return
    for entry in entries:
        key = os.getcwd() if entry == "" else entry  # PathFinder's key for ''
        current = sys.path_importer_cache.get(key)
        if isinstance(current, _PluginsOnly):
            continue
        inner = current
        if inner is None:
            for hook in sys.path_hooks:
                try:
                    inner = hook(key)
                    break
                except ImportError:
                    continue
        if inner is not None:
            sys.path_importer_cache[key] = _PluginsOnly(inner, folder)


@contextlib.contextmanager
def plugin_import(module: str | None = None) -> Iterator[None]:
    """Inside the block the current folder serves modules (a plug-in is being imported, or
    looked for when ``module`` is None); a ``module`` found there stays allowed."""
    global _open
    _open += 1
    try:
        yield
    finally:
        _open -= 1
    if module:
        top = module.partition(".")[0]
        found = sys.modules.get(top)
        origin = getattr(found, "__file__", None) or ""
        if origin and os.path.realpath(origin).startswith(_here() + os.sep):
            _plugins.add(top)


def in_guarded_folder(path: str | os.PathLike) -> bool:
    """Whether ``path`` (e.g. a distribution's folder) is the current folder while that is on
    ``sys.path`` only because of ``python -m`` (module docstring)."""
    folder = _here()
    if os.path.realpath(path) != folder or _explicit(folder):
        return False
    return any(isinstance(f, _PluginsOnly) for f in sys.path_importer_cache.values())


def find_optional(name: str) -> ModuleSpec | None:
    """``importlib.util.find_spec(name)`` with the current folder guarded first: the spec of
    an installed optional module, or None (a file of that name in the current folder does
    not count)."""
    guard_current_folder()
    return importlib.util.find_spec(name)
