"""An algorithm in two halves: the server's rule and the client's trainer (after Flower's
strategy / ClientApp split and fedjax's client functions).

* :class:`ServerRule` is what the server process (the round loop and the transports'
  server side) drives: ``init_server`` (init), ``broadcast`` (configure train: the down
  payload), ``aggregate`` (aggregate train: the replies into the server state),
  ``server_view`` (configure evaluate: what a client needs to evaluate its personal model;
  the evaluation scores themselves are aggregated by the loop, not by the algorithm),
  ``global_weights`` / ``personal_weights`` (the weights evaluated) and
  ``register_clients``.
* :class:`ClientTrainer` is what a client process (a pool worker, a Flower SuperNode)
  drives: ``init_client`` (init), ``local_update`` (the local update, built from ``loss``,
  ``penalty``, ``make_optimizer`` and ``local_train``), ``reply`` (the up payload),
  ``keep_local`` / ``local_keys`` (what stays local) and ``personal_weights`` from a server
  view.
* :class:`MethodSpec` is the method itself, frozen: its name, ``Params``, tasks, paper
  weighting, config-time checks and implied augments, and the two half classes.

How an algorithm is written as two halves (one file, one registration in
:mod:`fedshift.algorithms`)::

    class MyClient(ClientHalf[MyParams]):      # the client's trainer + the method's spec
        name = "mine"; Params = MyParams       # (a client process builds only this class)
        def local_update(self, ctx, down, state): ...

    class MyServer(ServerHalf[MyParams]):      # the server's rule (its machinery lives here)
        def aggregate(self, server, rnd, replies): ...

    class Mine(MyServer, MyClient):            # the registered class: both halves, no body
        client_half = MyClient                 # but this line

The registered class is what the in-process runtime and the server process build (one
object: the native simulator runs its clients next to the server); :func:`client_class`
gives the class a client process builds. Both halves subclass
:class:`~fedshift.algorithms.base.Algorithm`, so they share its key lists (BN policy,
frozen tensors, shared / local keys) and its defaults: a half overrides only its side.

An algorithm not yet written in two halves (one class that overrides both sides) is its own
client half (the adapter: :func:`client_class` returns the class itself), so every existing
algorithm and plug-in keeps working unchanged; the runtime still builds only the client's
view of it in a client process (:class:`fedshift.augment.compose.Composition` refuses the
server side there).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

from fedshift.algorithms.base import Algorithm, ParamsT
from fedshift.core.context import ClientContext
from fedshift.core.contract import ClientRound, ServerRule, State
from fedshift.core.payload import Tensors

if TYPE_CHECKING:
    import torch

    from fedshift.core.config import TrainConfig
    from fedshift.core.federation import Federation
    from fedshift.models.base import FedModel

__all__ = [
    "ClientHalf", "ClientTrainer", "MethodSpec", "ServerHalf", "ServerRule", "client_class",
    "is_split", "method_spec",
]  # fmt: skip


@runtime_checkable
class ClientTrainer(ClientRound, Protocol):
    """The client half: what a pool worker or a Flower SuperNode calls (``init_client``,
    ``local_update`` and ``reply``: :class:`~fedshift.core.contract.ClientRound`; the hooks
    ``local_update`` is built from and what stays local, here)."""

    #: the state-dict keys that never leave the client (what stays local)
    local_keys: list[str]

    def loss(self, ctx: ClientContext, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The local objective on one batch (the task's loss + ``penalty``)."""
        ...

    def penalty(self, ctx: ClientContext) -> torch.Tensor | None:
        """An extra term of the local objective (None: none)."""
        ...

    def make_optimizer(self, ctx: ClientContext, state: State) -> torch.optim.Optimizer:
        """The local optimiser of the round."""
        ...

    def keep_local(self, ctx: ClientContext, state: State) -> None:
        """Store the trained local tensors (``local_keys``) in ``state``."""
        ...

    def personal_weights(self, server: State, state: State) -> Tensors | None:
        """The client's own model from the server view it was sent."""
        ...


class ClientHalf(Algorithm[ParamsT]):
    """Base class of a client half (:class:`ClientTrainer`): the method's spec (``name``,
    ``Params``, ``tasks``, ``paper_weighting``, ``check``, ``implied_augments``, ...) and
    its client side. It builds none of the server's machinery: its ``setup`` must not
    construct what only the server uses (a hypernetwork, an aggregation network)."""


class ServerHalf(Algorithm[ParamsT]):
    """Base class of a server half (:class:`ServerRule`): the server side of a method whose
    spec and client side are its :class:`ClientHalf` (the registered class joins both)."""

    #: the client half, declared (assigned) by the registered class that joins both halves
    #: (:func:`client_class` reads it from that class's own body only)
    client_half: ClassVar[type[Algorithm[Any]]]


def client_class(cls: type[Algorithm]) -> type[Algorithm]:
    """The class a client process builds for the registered algorithm ``cls``: the client
    half the class declares itself (``client_half`` in its own body, never inherited: a
    subclass of a split method that is not split itself is one class again), else ``cls``
    (a one-class algorithm is its own client half)."""
    half = vars(cls).get("client_half")
    return half if isinstance(half, type) and issubclass(half, Algorithm) else cls


def is_split(cls: type[Algorithm]) -> bool:
    """Whether ``cls`` is written as two halves (a client process builds less than it)."""
    return client_class(cls) is not cls


@dataclass(frozen=True)
class MethodSpec:
    """A federated method as the config layer sees it, frozen: what ``algorithm.name``
    selects, read from the registered class (:func:`method_spec`)."""

    name: str
    #: the dataclass of ``algorithm.*`` (None: no keys)
    Params: type | None
    #: the dataset tasks the local objective works on
    tasks: tuple[str, ...]
    #: the aggregation weighting of the method's paper (``federation.weighting=auto``)
    paper_weighting: str
    #: False for methods without client-server traffic (local-only, centralised)
    communicates: bool
    #: True when a round's local work depends on ``train.rounds``
    depends_on_rounds: bool
    #: config overrides without which the method refuses to run
    requires: tuple[str, ...]
    #: config-time check of ``(params, train)``: raises ConfigError
    check: Callable[[Any, TrainConfig], None]
    #: the augments the method consists of, from its params
    implied_augments: Callable[[Any], list[str]]
    #: the trained model around the backbone, from ``(params, model, federation)``
    wrap_model: Callable[[Any, FedModel, Federation], FedModel]
    #: the server process's class (both halves joined, or the one-class algorithm)
    server: type[Algorithm]
    #: the client process's class (:func:`client_class`)
    client: type[Algorithm]


def method_spec(cls: type[Algorithm]) -> MethodSpec:
    """The frozen :class:`MethodSpec` of the registered algorithm class ``cls``."""
    return MethodSpec(
        name=cls.name,
        Params=cls.Params,
        tasks=tuple(cls.tasks),
        paper_weighting=cls.paper_weighting,
        communicates=cls.communicates,
        depends_on_rounds=cls.depends_on_rounds,
        requires=tuple(cls.requires),
        check=cls.check,
        implied_augments=cls.implied_augments,
        wrap_model=cls.wrap_model,
        server=cls,
        client=client_class(cls),
    )
