"""Valid ranges of numeric config fields, declared once as dataclass field metadata.

``lr: float = bounded(0.01, gt=0)`` (or ``field(default_factory=..., metadata=bounds(ge=1))``
for a list, checked per element); :func:`fedshift.core.config.build_dataclass` calls
:func:`check_bounds` on the fixed config sections and on every component's parameter
dataclass, so a value out of range is a :class:`ConfigError` naming the full key
(``algorithm.mu``) and the range. ``None`` (an optional key left unset) always passes.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from fedshift.core.errors import ConfigError

__all__ = ["Bounds", "bounded", "bounds", "check_bounds"]


@dataclass(frozen=True)
class Bounds:
    """The valid range of a numeric config field: ``ge`` <= v (or ``gt`` < v), v <= ``le``
    (or v < ``lt``); ``why`` is added to the error message."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    why: str = ""

    def contains(self, v: float) -> bool:
        return not (
            (self.ge is not None and v < self.ge)
            or (self.gt is not None and v <= self.gt)
            or (self.le is not None and v > self.le)
            or (self.lt is not None and v >= self.lt)
        )

    def describe(self) -> str:
        """``'>= 0'``, ``'> 0'``, ``'<= 1'``, ``'in [0, 1)'``..."""
        low = (f"{self.ge:g}", "[") if self.ge is not None else None
        low = (f"{self.gt:g}", "(") if self.gt is not None else low
        high = (f"{self.le:g}", "]") if self.le is not None else None
        high = (f"{self.lt:g}", ")") if self.lt is not None else high
        if low and high:
            return f"in {low[1]}{low[0]}, {high[0]}{high[1]}"
        if low:
            return f"{'>=' if low[1] == '[' else '>'} {low[0]}"
        if high:
            return f"{'<=' if high[1] == ']' else '<'} {high[0]}"
        return "any number"


def bounds(
    *,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    lt: float | None = None,
    why: str = "",
) -> dict[str, Bounds]:
    """Field metadata declaring a numeric field's valid range, checked by
    :func:`build_dataclass` (``None`` values pass; a list is checked per element)."""
    return {"bounds": Bounds(ge, gt, le, lt, why)}


def bounded(
    default: Any,
    *,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    lt: float | None = None,
    why: str = "",
) -> Any:
    """A dataclass field with ``default`` and a valid range: ``mu: float = bounded(0.01,
    ge=0)``."""
    return field(default=default, metadata=bounds(ge=ge, gt=gt, le=le, lt=lt, why=why))


def check_bounds(obj: Any, prefix: str = "") -> None:
    """Raise :class:`ConfigError` for a field of dataclass ``obj`` outside its declared
    :class:`Bounds`, naming the full key and the valid range."""
    for f in dataclasses.fields(obj):
        rng = f.metadata.get("bounds")
        value = getattr(obj, f.name)
        if rng is None or value is None:
            continue
        key = f"{prefix}.{f.name}" if prefix else f.name
        items = enumerate(value) if isinstance(value, list | tuple) else [(None, value)]
        for i, v in items:
            if isinstance(v, bool) or not isinstance(v, int | float) or rng.contains(v):
                continue
            where = key if i is None else f"{key}[{i}]"
            optional = " or null" if f.default is None else ""
            why = f" ({rng.why})" if rng.why else ""
            raise ConfigError(
                f"config key '{where}' must be {rng.describe()}{optional}{why}, got {v!r}"
            )
