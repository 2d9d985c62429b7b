"""The transport wrappers that change each training reply as it arrives from the client code:
secure aggregation masks it (:class:`~fedshift.runtime.secagg.SecureTransport`), DP-FedAvg
clips it (:class:`~fedshift.runtime.dp_updates.DPTransport`). What they share:
:class:`GuardedTransport`."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

from fedshift.core.payload import Payload
from fedshift.runtime.client import check_reply
from fedshift.runtime.transport import WrappedTransport

if TYPE_CHECKING:
    from fedshift.runtime.experiment import Experiment
    from fedshift.runtime.transport import Transport

__all__ = ["Guard", "GuardedTransport"]


class Guard(Protocol):
    """What a :class:`GuardedTransport` protects the replies with (the run's
    ``SecureAggregation`` or ``UpdatePrivacy``)."""

    def check(self, exp: Experiment) -> None:
        """Refuse an experiment it cannot protect (before any client state is built)."""
        ...


G = TypeVar("G", bound=Guard)


class GuardedTransport(WrappedTransport, Generic[G]):
    """A transport around ``inner`` whose training replies are each checked to be finite
    (a NaN or inf the guard would hide by clipping or masking is refused first, naming the
    round and the client) and then passed through :meth:`protect`; ``guard`` checks the
    experiment first (:meth:`check`). Every other call goes to the wrapped transport."""

    def __init__(self, inner: Transport, guard: G) -> None:
        super().__init__(inner)
        self.guard = guard

    def check(self, exp: Experiment) -> None:
        self.guard.check(exp)

    def sent(self, down: Callable[[str], Payload]) -> Callable[[str], Payload]:
        """What the wrapped transport sends each client for training: ``down`` itself,
        unless a subclass watches it."""
        return down

    def protect(self, rnd: int, cid: str, cids: list[str], up: Payload) -> Payload:
        """Client ``cid``'s finite reply of round ``rnd`` (``cids``: the round's clients),
        as the loop receives it."""
        raise NotImplementedError

    def train(
        self, rnd: int, cids: list[str], down: Callable[[str], Payload]
    ) -> tuple[dict[str, Payload], list[str]]:
        replies, lost = self.inner.train(rnd, cids, self.sent(down))
        for cid, up in replies.items():
            check_reply(rnd, cid, up)
        return {cid: self.protect(rnd, cid, cids, up) for cid, up in replies.items()}, lost
