"""Executors run the clients of a round. The round loop only calls ``map``, so a parallel or
vectorised executor can replace the sequential one without touching algorithms or the loop."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")


class SequentialExecutor:
    """Clients one after another, in the order given (deterministic)."""

    def map(self, fn: Callable[[T], R], items: Iterable[T]) -> list[R]:
        return [fn(x) for x in items]
