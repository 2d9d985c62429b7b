"""An algorithm and its augments presented to a runtime (the simulator, Flower) as one.

:class:`Composition` is what every runtime drives: it implements
:class:`fedshift.core.contract.FederatedAlgorithm` (the algorithm interface, ``init_server``,
``broadcast``, ``local_update``, ``aggregate``, ..., plus the setup exchange and the
evaluation of held-out clients). It merges each augment's
records into the algorithm's payloads (a record name used twice is an error, never a silent
overwrite). The data path (raw batch -> augments -> normalisation) is
:class:`fedshift.core.context.InputPipeline`.
"""

from __future__ import annotations

from collections.abc import Callable

from fedshift.algorithms.base import Algorithm
from fedshift.algorithms.state import StateVar, declared
from fedshift.augment.base import Augment, Records
from fedshift.core.context import ClientContext, aug_key
from fedshift.core.contract import AlgorithmSpec, Reply, State
from fedshift.core.contract_errors import ContractError, expect
from fedshift.core.disclosure import UP, Disclosure, summed_records
from fedshift.core.errors import FedshiftError
from fedshift.core.federation import ClientData
from fedshift.core.payload import Payload, Tensors
from fedshift.core.privacy import Mechanism
from fedshift.models.base import FedModel

#: what the hooks return, in the words of the contract (core/contract.py)
STATE = "a dict (the state: tensors, numbers, strings and nested dicts/lists of those)"
PAY = "a Payload"
WEIGHTS = "a dict of tensors (a state dict) or None"


def _merge(into: dict[str, Tensors], extra: Records, who: str) -> None:
    if not isinstance(extra, dict):
        got = "None" if extra is None else f"a {type(extra).__name__}"
        raise ContractError(
            f"augment {who!r} returned {got} for its records; it must return a dict of "
            "records (name -> dict of tensors), {} for none (see `fedshift docs extending`)"
        )
    clash = set(into) & set(extra)
    if clash:
        raise ValueError(f"{who} sends record(s) {sorted(clash)} that already exist in the payload")
    into.update(extra)


class Composition:
    """``algorithm x [augments]`` behind the runtime's interface
    (:class:`fedshift.core.contract.FederatedAlgorithm`).

    ``rule``: None when ``algo`` is the registered class, both halves (the in-process
    runtime, the server process); in a client process (pool worker, Flower SuperNode)
    ``algo`` is only the client half (:func:`fedshift.algorithms.halves.client_class`) and
    ``rule`` the registered class, whose server side this composition then refuses to run
    (:meth:`client_only`)."""

    #: wrap every state ``init_server`` / ``init_client`` builds in a
    #: :class:`~fedshift.algorithms.state.DeclaredState`: a key its component did not declare
    #: is a ContractError (tests/algorithms/test_state.py; off in runs: states stay plain
    #: dicts, checkpointed with ``torch.save``)
    check_state: bool = False

    def __init__(
        self, algo: Algorithm, augments: list[Augment], rule: type[Algorithm] | None = None
    ) -> None:
        self.algo = algo
        self.augments = augments
        #: the registered algorithm class when this process holds the client half only
        self.rule = rule

    @property
    def client_only(self) -> bool:
        """True in a client process: the server half was not built here."""
        return self.rule is not None

    def _server_side(self, what: str) -> None:
        """Refuse a server-side call in a client process (a runtime bug, not a config)."""
        if self.rule is not None:
            raise FedshiftError(
                f"algorithm {self.algo.name!r}: {what} is the server's (its ServerRule), but "
                "this process built only the client half (a pool worker or Flower SuperNode: "
                "fedshift.algorithms.halves); call it on the server's composition"
            )

    # -- passthrough -------------------------------------------------------------------------
    @property
    def communicates(self) -> bool:
        return self.algo.communicates

    @property
    def has_global_model(self) -> bool:
        return self.algo.has_global_model

    @property
    def has_personal_model(self) -> bool:
        return self.algo.has_personal_model

    @property
    def needs_setup(self) -> bool:
        return any(a.needs_setup for a in self.augments)

    @property
    def algorithm(self) -> AlgorithmSpec:
        """The algorithm without its augments (``algo``)."""
        return self.algo

    def global_weights(self, server: State) -> Tensors | None:
        self._server_side("global_weights")
        w = self.algo.global_weights(server)
        return w if w is None else expect(w, dict, self.algo, "global_weights", WEIGHTS)

    def personal_weights(self, server: State, state: State) -> Tensors | None:
        w = self.algo.personal_weights(server, state)
        return w if w is None else expect(w, dict, self.algo, "personal_weights", WEIGHTS)

    def server_view(self, server: State, cid: str) -> State:
        self._server_side("server_view")
        return self.algo.server_view(server, cid)

    def register_clients(self, cids: list[str]) -> None:
        self.algo.register_clients(cids)

    def disclosures(self, model: FedModel) -> list[Disclosure]:
        """Every record the run sends, declared by the algorithm and its augments
        (:mod:`fedshift.core.disclosure`), each with the component that declared it and, for
        an ``up`` record, whether that component's ``aggregate`` only sums it
        (:func:`~fedshift.core.disclosure.sums_only`)."""
        out: list[Disclosure] = []
        for component in (self.algo, *self.augments):
            # the server half's aggregate says what it only sums, also in a client process
            rule = self.rule if component is self.algo and self.rule is not None else None
            summed = summed_records((rule or type(component)).aggregate)
            out += [
                d.with_source(component.name, d.direction == UP and d.record in summed)
                for d in component.disclosures(model)
            ]
        return out

    def protect(self, model: FedModel, mechanisms: dict[str, Mechanism]) -> None:
        """Hand each component the Gaussian mechanisms of the records it declares
        (``privacy.epsilon``: :mod:`fedshift.runtime.privacy`); a component clips and
        releases those records itself. Before any client state is built."""
        for component in (self.algo, *self.augments):
            mine = {d.record for d in component.disclosures(model) if d.direction == UP}
            given = {r: m for r, m in mechanisms.items() if r in mine}
            if given:
                component.privacy = given  # type: ignore[union-attr]
        for a in self.augments:
            if getattr(a, "privacy", None):  # a plug-in may not call Augment.__init__
                a.protected(self.augments)

    # -- state -------------------------------------------------------------------------------
    def init_server(self, model: FedModel) -> State:
        self._server_side("init_server")
        return self._joined_state(
            "server", self.algo.init_server(model), lambda a: a.init_server(model),
            lambda part: part.server_vars(),
        )  # fmt: skip

    def init_client(self, cid: str, data: ClientData, model: FedModel) -> State:
        return self._joined_state(
            "client", self.algo.init_client(cid, data, model),
            lambda a: a.init_client(cid, data, model), lambda part: part.client_vars(),
        )  # fmt: skip

    def _joined_state(
        self,
        side: str,
        state: State,
        init: Callable[[Augment], State],
        declared_vars: Callable[[Algorithm | Augment], list[StateVar]],
    ) -> State:
        """The algorithm's ``side`` state (``server`` or ``client``: ``state``, what its
        ``init_<side>`` returned) with each augment's own (``init(augment)``) under its key,
        every part checked to be a dict and, with ``check_state``, against its declarations
        (``declared_vars(part)``)."""
        hook = f"init_{side}"
        expect(state, dict, self.algo, hook, STATE)
        for a in self.augments:
            state[aug_key(a)] = expect(init(a), dict, a, hook, STATE)
            if self.check_state:
                state[aug_key(a)] = declared(
                    state[aug_key(a)], declared_vars(a), f"augment {a.name!r} {side}"
                )
        if self.check_state:
            aug_keys = [aug_key(a) for a in self.augments]
            state = declared(
                state, declared_vars(self.algo), f"algorithm {self.algo.name!r} {side}", *aug_keys
            )
        return state

    def _records(self, states: State, records: Callable[[Augment, State], Records]) -> Payload:
        """A payload of every augment's records, ``records(augment, its part of states)``
        merged in the augments' order (``states``: the server or a client state)."""
        out = Payload()
        for a in self.augments:
            _merge(out.records, records(a, states[aug_key(a)]), a.name)
        return out

    def _receive_setup(self, down: Payload, state: State) -> None:
        """Each augment takes its records from a down payload sent outside the rounds
        (round 0: the setup exchange, a held-out client's ``eval_broadcast``)."""
        for a in self.augments:
            a.receive(down, state[aug_key(a)], 0)

    # -- setup exchange ----------------------------------------------------------------------
    def setup_reply(self, cid: str, state: State) -> Payload:
        return self._records(state, lambda a, s: a.setup_reply(cid, s))

    def setup_aggregate(self, server: State, replies: list[Reply]) -> None:
        self._server_side("setup_aggregate")
        for a in self.augments:
            a.setup_aggregate(server[aug_key(a)], [(cid, p.records) for cid, p in replies])

    def setup_broadcast(self, server: State, cid: str) -> Payload:
        self._server_side("setup_broadcast")
        return self._records(server, lambda a, s: a.setup_broadcast(s, cid))

    def setup_receive(self, down: Payload, state: State) -> None:
        self._receive_setup(down, state)

    # -- rounds ------------------------------------------------------------------------------
    def broadcast(self, server: State, rnd: int, cid: str) -> Payload:
        self._server_side("broadcast")
        down = expect(self.algo.broadcast(server, rnd, cid), Payload, self.algo, "broadcast", PAY)
        for a in self.augments:
            _merge(down.records, a.broadcast(server[aug_key(a)], rnd, cid), a.name)
        return down

    def local_update(self, ctx: ClientContext, down: Payload, state: State) -> Payload:
        self.before_local(ctx, down, state)
        up = self.algo.local_update(ctx, down, state)
        expect(up, Payload, self.algo, "local_update", f"{PAY} (build it with self.reply)")
        return self.after_local(ctx, state, up)

    def before_local(self, ctx: ClientContext, down: Payload, state: State) -> None:
        """The augments' part of a round before the algorithm's ``local_update``: each takes
        its records from ``down``, then prepares the model (``before_train``)."""
        for a in self.augments:
            a.receive(down, state[aug_key(a)], ctx.round)
        for a in self.augments:
            a.before_train(ctx.model, state[aug_key(a)], ctx.round)

    def after_local(self, ctx: ClientContext, state: State, up: Payload) -> Payload:
        """The augments' records merged into the algorithm's up payload ``up`` (read from the
        trained working model)."""
        for a in self.augments:
            _merge(up.records, a.reply(ctx.model, state[aug_key(a)], ctx.round), a.name)
        return up

    # -- evaluation of clients that never train ----------------------------------------------
    def eval_broadcast(self, server: State, cid: str) -> Payload:
        """The augments' records a held-out client needs to evaluate (``eval_broadcast``)."""
        self._server_side("eval_broadcast")
        return self._records(server, lambda a, s: a.eval_broadcast(s, cid))

    def eval_receive(self, down: Payload, state: State) -> None:
        self._receive_setup(down, state)

    def aggregate(self, server: State, rnd: int, replies: list[Reply]) -> None:
        self._server_side("aggregate")
        self.algo.aggregate(server, rnd, replies)
        for a in self.augments:
            a.aggregate(server[aug_key(a)], rnd, replies)
