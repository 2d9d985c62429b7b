"""Name -> component registries (algorithms, datasets, models) with helpful lookup errors."""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from fedshift.core.errors import ConfigError

T = TypeVar("T")


@dataclass(frozen=True)
class Entry(Generic[T]):
    name: str
    obj: T
    params: type | None  # a dataclass describing the component's config keys
    description: str


class Registry(Generic[T]):
    """A named collection of components. ``get`` fails with the valid choices listed."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, Entry[T]] = {}

    def register(
        self, name: str, params: type | None = None, description: str = ""
    ) -> Callable[[T], T]:
        def deco(obj: T) -> T:
            self.add(name, obj, params, description)
            return obj

        return deco

    def add(self, name: str, obj: T, params: type | None = None, description: str = "") -> None:
        if name in self._entries:
            raise ValueError(f"{self.kind} {name!r} registered twice")
        doc = description or (getattr(obj, "__doc__", None) or "").strip().split("\n")[0]
        self._entries[name] = Entry(name, obj, params, doc)

    def entry(self, name: str, key: str | None = None) -> Entry[T]:
        if name not in self._entries:
            where = f"config key '{key}': " if key else ""
            hint = difflib.get_close_matches(name, self.names(), n=1)
            did = f" (did you mean {hint[0]!r}?)" if hint else ""
            raise ConfigError(
                f"{where}unknown {self.kind} {name!r}{did}; valid: {', '.join(self.names())}"
            )
        return self._entries[name]

    def get(self, name: str, key: str | None = None) -> T:
        return self.entry(name, key).obj

    def names(self) -> list[str]:
        return sorted(self._entries)

    def entries(self) -> list[Entry[T]]:
        return [self._entries[n] for n in self.names()]

    def __contains__(self, name: Any) -> bool:
        return name in self._entries
