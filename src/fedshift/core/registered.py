"""Every registry made (:class:`fedshift.core.registry.Registry` adds itself here), and
whether a name is registered in one: what :mod:`fedshift.core.consent` asks before it holds a
plug-in name back (a plug-in imported already needs no consent). A module of its own below
both, so neither imports the other for it."""

from __future__ import annotations

from collections.abc import Container

__all__ = ["REGISTRIES", "registered_anywhere"]

#: every registry made, in the order they were made
REGISTRIES: list[Container[str]] = []


def registered_anywhere(name: str) -> bool:
    """Whether ``name`` is registered in some registry (a plug-in imported already)."""
    return any(name in r for r in REGISTRIES)
