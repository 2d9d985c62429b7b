"""What a broken contract looks like: :class:`ContractError`, naming the component's class,
the member and what fedshift expected, and :func:`expect`, the check of what a hook
returned. A module of its own below :mod:`fedshift.core.contract` (the Protocols and the class
checks) and :mod:`fedshift.core.context` (whose input pipeline checks augments' batches), so
both use it without importing each other."""

from __future__ import annotations

from types import UnionType
from typing import Any

from fedshift.core.errors import FedshiftError

__all__ = ["GUIDE", "ContractError", "expect"]

#: where a plug-in author reads the contract
GUIDE = "`fedshift docs extending`"


class ContractError(FedshiftError):
    """A component (usually a plug-in) breaks the contract of its base class."""


def _who(owner: object) -> str:
    cls = owner if isinstance(owner, type) else type(owner)
    return f"{cls.__module__}:{cls.__qualname__}"


def expect(value: Any, check: Any, owner: object, hook: str, want: str) -> Any:
    """``value``, returned by ``owner.hook``, if it passes ``check`` (a type or tuple of
    types, or a predicate); else a :class:`ContractError` naming the class, the hook, what it
    returned and ``want``."""
    ok = isinstance(value, check) if isinstance(check, type | tuple | UnionType) else check(value)
    if not ok:
        got = "None" if value is None else f"a {type(value).__name__}"
        shape = getattr(value, "shape", None)
        if shape is not None:
            got += f" of shape {tuple(shape)}"
        raise ContractError(
            f"{_who(owner)}.{hook} returned {got}, but fedshift needs {want} (see the "
            f"contract in {GUIDE})"
        )
    return value
