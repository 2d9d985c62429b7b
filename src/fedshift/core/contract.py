"""The algorithm contracts, stated as typed protocols.

Two sides meet at an algorithm:

* :class:`FederatedAlgorithm` is what a runtime drives: the native simulator
  (``fedshift.runtime``) and the Flower server and nodes (``fedshift.flower``) call exactly
  these members and nothing else. ``fedshift.augment.compose.Composition`` (an algorithm with
  its augments) is the implementation every runtime receives.
* :class:`AlgorithmSpec` is what an algorithm author implements.
  ``fedshift.algorithms.base.Algorithm`` is the base class that satisfies it with defaults
  (FedAvg-style broadcast and reply, BN policy, the local mini-batch loop and its hooks);
  a subclass overrides the members its method changes.

Message flow of one round, for every sampled client ``cid``::

    server: down = broadcast(server, rnd, cid)            # server state -> down payload
    client: up   = local_update(ctx, down, state)          # trains; up = reply(...)
    server: aggregate(server, rnd, [(cid, up), ...])       # replies -> new server state

Rules both sides rely on:

* State is data. ``server`` (from ``init_server``) and each client's ``state`` (from
  ``init_client``) are plain dicts of tensors, numbers, strings, ``None`` and nested
  dicts/lists of those: checkpointed with ``torch.save`` and loaded back with
  ``weights_only=True``. A client's state never leaves the client; a payload is the only
  thing that crosses the wire (and the communication ledger).
* Algorithms are re-entrant. The algorithm object holds configuration (set in ``__init__``)
  and nothing that changes during a round: ``broadcast`` and ``local_update`` of several
  clients may interleave on one object (a worker pool). What a client's round computes and
  its hooks read travels as explicit arguments: the down payload, the client's ``state`` and
  the round's :class:`~fedshift.core.context.ClientContext` (``ctx.scratch``).
* ``personal_weights(server_view(server, cid), state) == personal_weights(server, state)``:
  a runtime whose clients live elsewhere (Flower) evaluates personal models from the view.

This module belongs to ``fedshift.core`` and imports nothing above it; the model and data
types it names live in core too (:mod:`fedshift.core.model`, :mod:`fedshift.core.federation`),
imported for type checkers only. The dataset contract is :mod:`fedshift.core.datasets`.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

from fedshift.core.context import ClientContext
from fedshift.core.contract_errors import GUIDE, ContractError
from fedshift.core.payload import Payload, Tensors

if TYPE_CHECKING:  # types only: core imports nothing above it
    from fedshift.core.config import TrainConfig
    from fedshift.core.federation import ClientData, Federation
    from fedshift.core.model import FedModel

#: server or client state: plain data (tensors, numbers, strings, None, nested dicts/lists)
State = dict[str, Any]
#: one client's answer to a broadcast, as the server receives it: (client id, up payload)
Reply = tuple[str, Payload]

__all__ = [
    "AlgorithmSpec",
    "ClientRound",
    "FederatedAlgorithm",
    "Reply",
    "ServerRule",
    "State",
    "Tensors",
    "check_component_class",
    "check_params",
]


@runtime_checkable
class FederatedAlgorithm(Protocol):
    """What a runtime drives: one run's algorithm with its augments.

    Server side: ``init_server``, ``register_clients``, ``setup_aggregate`` /
    ``setup_broadcast``, ``broadcast``, ``aggregate``, ``eval_broadcast``, ``server_view``.
    Client side: ``init_client``, ``setup_reply`` / ``setup_receive``, ``local_update``,
    ``eval_receive``, ``personal_weights`` (from a server view). Evaluation:
    ``global_weights`` and ``personal_weights``."""

    # -- what the run has ------------------------------------------------------------------
    @property
    def communicates(self) -> bool:
        """False for training without a federation (local-only, centralised): no traffic."""
        ...

    @property
    def has_global_model(self) -> bool:
        """One server model that every client can be evaluated with."""
        ...

    @property
    def has_personal_model(self) -> bool:
        """Each client has a model of its own (``personal_weights``)."""
        ...

    @property
    def needs_setup(self) -> bool:
        """The one-off setup exchange runs before round 1."""
        ...

    @property
    def algorithm(self) -> AlgorithmSpec:
        """The configured algorithm itself (``algorithm.name``), without its augments: the
        one accessor for what the run's algorithm is (its name, weighting, class flags)."""
        ...

    # -- state -------------------------------------------------------------------------------
    def init_server(self, model: FedModel) -> State:
        """The server state, from the model at its initial weights."""
        ...

    def init_client(self, cid: str, data: ClientData, model: FedModel) -> State:
        """Client ``cid``'s state (kept between rounds, never sent), from its data and the
        model at its initial weights."""
        ...

    def register_clients(self, cids: list[str]) -> None:
        """Server side, once, before any round: the training clients, in order."""
        ...

    # -- setup exchange (before round 1) -----------------------------------------------------
    def setup_reply(self, cid: str, state: State) -> Payload:
        """Client side: what the client sends in the setup exchange."""
        ...

    def setup_aggregate(self, server: State, replies: list[Reply]) -> None:
        """Server side: take in every client's setup reply."""
        ...

    def setup_broadcast(self, server: State, cid: str) -> Payload:
        """Server side: what client ``cid`` receives in the setup exchange."""
        ...

    def setup_receive(self, down: Payload, state: State) -> None:
        """Client side: take in the setup broadcast."""
        ...

    # -- rounds ------------------------------------------------------------------------------
    def broadcast(self, server: State, rnd: int, cid: str) -> Payload:
        """Server side: the down payload of round ``rnd`` for client ``cid``."""
        ...

    def local_update(self, ctx: ClientContext, down: Payload, state: State) -> Payload:
        """Client side: train on ``ctx`` from ``down``, update ``state``, return the up
        payload."""
        ...

    def aggregate(self, server: State, rnd: int, replies: list[Reply]) -> None:
        """Server side: fold round ``rnd``'s replies into ``server`` (in place)."""
        ...

    # -- evaluation --------------------------------------------------------------------------
    def eval_broadcast(self, server: State, cid: str) -> Payload:
        """Server side: what a client that never trains (held out) needs to be evaluated."""
        ...

    def eval_receive(self, down: Payload, state: State) -> None:
        """Client side: take in ``eval_broadcast``."""
        ...

    def global_weights(self, server: State) -> Tensors | None:
        """The global model's state dict (None without a global model)."""
        ...

    def personal_weights(self, server: State, state: State) -> Tensors | None:
        """The client's own model's state dict (None without personal models); ``server``
        may be the full server state or ``server_view(server, cid)``."""
        ...

    def server_view(self, server: State, cid: str) -> State:
        """The part of the server state that ``personal_weights`` reads for ``cid``."""
        ...


@runtime_checkable
class ServerRule(Protocol):
    """The server half of an algorithm: what the round loop and the transports' server side
    call (:mod:`fedshift.algorithms.halves`)."""

    def init_server(self, model: FedModel) -> State:
        """Init: the server state from the model at its initial weights."""
        ...

    def register_clients(self, cids: list[str]) -> None:
        """Once, before any round: the training clients, in order."""
        ...

    def broadcast(self, server: State, rnd: int, cid: str) -> Payload:
        """Configure train: round ``rnd``'s down payload for client ``cid``."""
        ...

    def aggregate(self, server: State, rnd: int, replies: list[Reply]) -> None:
        """Aggregate train: fold round ``rnd``'s replies into ``server`` (in place)."""
        ...

    def server_view(self, server: State, cid: str) -> State:
        """Configure evaluate: what ``personal_weights`` reads for client ``cid``."""
        ...

    def global_weights(self, server: State) -> Tensors | None:
        """The global model's weights (None without one)."""
        ...

    def personal_weights(self, server: State, state: State) -> Tensors | None:
        """Client ``state``'s own model from the full server state (or a view)."""
        ...


@runtime_checkable
class ClientRound(Protocol):
    """A client's part of a round: its state, the local update and the reply that ends it
    (the client trainer adds its hooks: :class:`fedshift.algorithms.halves.ClientTrainer`)."""

    def init_client(self, cid: str, data: ClientData, model: FedModel) -> State:
        """Init: client ``cid``'s state, kept between rounds, never sent."""
        ...

    def local_update(self, ctx: ClientContext, down: Payload, state: State) -> Payload:
        """The local update: train from ``down``, update ``state``, return the reply."""
        ...

    def reply(
        self,
        ctx: ClientContext,
        state: State,
        steps: int,
        loss: float,
        records: dict[str, Tensors] | None = None,
    ) -> Payload:
        """The up payload at the end of ``local_update``."""
        ...


@runtime_checkable
class AlgorithmSpec(ServerRule, ClientRound, Protocol):
    """What an algorithm author implements (``fedshift.algorithms.base.Algorithm`` gives
    every member a default; see the module docstring for the rules).

    Config time (class level): ``check`` rejects nonsensical combinations,
    ``implied_augments`` names the augments a preset consists of, ``wrap_model`` builds the
    trained model around the backbone, ``training_data`` picks the clients that train.
    Run time: the server and client halves of a round and the evaluated weights (the members
    of :class:`ServerRule` and :class:`ClientRound`); ``reply`` builds the up payload at the
    end of ``local_update`` as ``broadcast`` builds the down payload."""

    #: registry name (``algorithm.name``)
    name: ClassVar[str]
    #: dataclass of the algorithm's config keys (``algorithm.*``), None for none
    Params: ClassVar[type | None]
    #: False for algorithms with no client-server traffic (local-only, centralised)
    communicates: ClassVar[bool]
    #: dataset tasks the local objective works on (``classification``, ``segmentation``)
    tasks: ClassVar[tuple[str, ...]]
    #: the paper's aggregation weighting (``federation.weighting=auto``)
    paper_weighting: ClassVar[str]
    #: True when a round's local work depends on ``train.rounds`` (a ramp-up over the run):
    #: such a run refuses to be extended to more rounds (``fedshift run --resume``)
    depends_on_rounds: ClassVar[bool]

    # -- config time -------------------------------------------------------------------------
    @classmethod
    def check(cls, params: Any, train: TrainConfig) -> None: ...

    @classmethod
    def implied_augments(cls, params: Any) -> list[str]: ...

    @classmethod
    def wrap_model(cls, params: Any, model: FedModel, federation: Federation) -> FedModel: ...

    @classmethod
    def training_data(cls, federation: Federation) -> list[ClientData]: ...

    # -- what the run has --------------------------------------------------------------------
    @property
    def weighting(self) -> str:
        """The aggregation weighting of the run (``federation.weighting``, ``auto``
        resolved to ``paper_weighting``): what the run's metadata records."""
        ...

    @property
    def has_global_model(self) -> bool: ...

    @property
    def has_personal_model(self) -> bool: ...

    # the server (init_server, register_clients, broadcast, aggregate), its evaluation
    # (global_weights, personal_weights, server_view) and the client's round (init_client,
    # local_update, reply): the members of ServerRule and ClientRound


# ---------------------------------------------------------------------------- checks
# A plug-in is checked against the contract twice: its class when it is registered
# (:func:`check_component_class`: ``Params`` a dataclass, every overridden method callable
# as the base class's is), and what its hooks return when they run (:func:`expect`): a
# break is a :class:`ContractError` naming the class, the member and what was expected,
# not a traceback from deep inside a round.


def _kind(member: Any) -> str:
    if isinstance(member, classmethod):
        return "classmethod"
    if isinstance(member, staticmethod):
        return "staticmethod"
    if isinstance(member, property):
        return "property"
    if inspect.isfunction(member):
        return "method"
    return "attribute"


def _callable_as(base_fn: Any, fn: Any) -> bool:
    """Whether ``fn`` accepts the positional arguments ``base_fn`` declares (self or cls
    included: both are the plain functions)."""
    try:
        base_sig, sig = inspect.signature(base_fn), inspect.signature(fn)
    except (TypeError, ValueError):
        return True  # a builtin or C function: nothing to compare
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    n = sum(1 for p in base_sig.parameters.values() if p.kind in kinds)
    try:
        sig.bind(*([None] * n))
    except TypeError:
        return False
    return True


def check_params(params: Any, what: str) -> None:
    """A component's ``Params`` is None or a dataclass (its config keys); else a
    :class:`ContractError` saying so."""
    if params is not None and not (isinstance(params, type) and dataclasses.is_dataclass(params)):
        shown = params.__name__ if isinstance(params, type) else repr(params)[:60]
        raise ContractError(
            f"{what}: its Params ({shown}) must be a @dataclass whose fields are the "
            f"component's config keys, with types and defaults (see {GUIDE})"
        )


def check_component_class(cls: type, base: type, what: str) -> None:
    """The static part of a plug-in's contract, checked when it is registered: its
    ``Params`` (if any) is a dataclass, and every method of ``base`` it overrides is of the
    same kind (method, classmethod, staticmethod, property) and takes the arguments fedshift
    passes to it. Raises :class:`ContractError` naming the member and the fix."""
    check_params(getattr(cls, "Params", None), what)
    for name, member in vars(cls).items():
        if name.startswith("_"):
            continue
        base_member = inspect.getattr_static(base, name, None)
        if base_member is None:
            continue
        kb, kc = _kind(base_member), _kind(member)
        if kb == "attribute":
            continue
        if kb != kc:
            raise ContractError(
                f"{what}: {name} is a {kc} here but a {kb} in {base.__qualname__}, which is "
                f"how fedshift calls it; define it as a {kb} (see {GUIDE})"
            )
        if kb == "property":
            continue
        base_fn = getattr(base_member, "__func__", base_member)
        fn = getattr(member, "__func__", member)
        if not _callable_as(base_fn, fn):
            raise ContractError(
                f"{what}: {name}{inspect.signature(fn)} cannot take the arguments fedshift "
                f"passes, as to {base.__qualname__}.{name}{inspect.signature(base_fn)}; give "
                f"it the same parameters (see {GUIDE})"
            )
