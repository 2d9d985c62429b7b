"""Declared state: what each key of an algorithm's (or augment's) server and client state is,
how it starts, and what the server does with it (issue 52; after torchmetrics'
``Metric.add_state(name, default, dist_reduce_fx)``).

A component declares its state once, next to its ``Params``::

    def server_vars(self) -> list[StateVar]:
        return [*super().server_vars(),
                server_var("control", lambda s: zeros(s.model), doc="the control variate c")]

    def client_vars(self) -> list[StateVar]:
        return [*super().client_vars(),
                client_var("control", lambda s: zeros(s.model), doc="the client's c_i")]

and the defaults read the declarations instead of literal keys: ``init_server`` and
``init_client`` build the state from them (:func:`init_state`, in declaration order), and the
default ``aggregate`` folds the replies into every server variable whose ``reduce`` is
``mean`` or ``sum`` (:func:`reduce_replies`). ``reduce`` says what the server does with a
variable:

* ``mean``: the server's value is the weighted mean of the replies' record of that name
  (``record``, default the variable's name): a dict of tensors is updated in place (a reply
  may carry a subset of its keys, as the shared tensors of the server model), a tensor
  replaced. The weights are the algorithm's ``reply_weight`` (``federation.weighting``).
* ``sum``: the same with the sum of the replies' records (unweighted).
* ``none``: the component's own ``aggregate`` (or setup exchange) updates it, or nothing does.
* ``keep-local``: client state, kept on the client between rounds and never sent (every
  client variable).

The initial value is a plain value (deep-copied into each new state: ``None``, ``0``,
``{}``), a factory ``init(StateInit) -> value`` (the model at its initial weights and, for a
client, its id and data), or :data:`ABSENT`: declared, but written only later (the
optimiser state kept with ``train.optimizer_state=persist``, MOON's previous model).

The declarations are checked: :func:`check_vars` (a name twice, a server variable kept
local, a client variable the server reduces) when a state is built, and a state read or
written under a key its component did not declare is a :class:`ContractError` when the
state is a :class:`DeclaredState` (``Composition.check_state``; every registered algorithm
and augment runs so in ``tests/algorithms/test_state.py``). Outside that check the states stay
plain dicts (checkpointed with ``torch.save``, loaded with ``weights_only=True``).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

from fedshift.algorithms.tensors import weighted_average
from fedshift.core.contract import Reply, State
from fedshift.core.contract_errors import ContractError
from fedshift.core.federation import ClientData
from fedshift.core.model import FedModel
from fedshift.core.payload import Tensors

__all__ = [
    "ABSENT", "DeclaredState", "Reduce", "StateInit", "StateVar", "check_vars", "client_var",
    "declared", "init_state", "reduce_replies", "replaced", "server_var",
]  # fmt: skip

#: what the server does with a variable (the module docstring)
Reduce = Literal["mean", "sum", "keep-local", "none"]
REDUCES: tuple[str, ...] = ("mean", "sum", "keep-local", "none")


class _Absent:
    """The initial value of a variable that a state holds only once written."""

    def __repr__(self) -> str:
        return "ABSENT"


#: declared, not in a new state: the component writes it later
ABSENT: Any = _Absent()


@dataclass(frozen=True)
class StateInit:
    """What a factory builds an initial value from: the model at its initial weights (the
    run's working model, wrapped and with its augments attached) and, for client state, the
    client's id and data."""

    model: FedModel
    cid: str | None = None
    data: ClientData | None = None


@dataclass(frozen=True)
class StateVar:
    """One declared state variable (build it with :func:`server_var` / :func:`client_var`).

    ``name``: its key in the state; ``side``: ``server`` or ``client``; ``init``: a value
    (deep-copied), a factory ``init(StateInit) -> value`` or :data:`ABSENT`; ``reduce``: what
    the server does with it; ``record``: the up record a ``mean``/``sum`` reads (default
    ``name``); ``doc``: what it holds."""

    name: str
    side: Literal["server", "client"]
    init: Any
    reduce: Reduce = "none"
    record: str | None = None
    doc: str = ""

    def initial(self, at: StateInit) -> Any:
        """A new initial value (a fresh copy for a plain value)."""
        if callable(self.init):
            return self.init(at)
        return copy.deepcopy(self.init)


def server_var(
    name: str, init: Any, reduce: Reduce = "none", record: str | None = None, doc: str = ""
) -> StateVar:
    """A server state variable: ``reduce`` ``mean`` or ``sum`` (the default ``aggregate``
    folds the replies' ``record`` into it) or ``none`` (the component's own rule)."""
    return StateVar(name, "server", init, reduce, record, doc)


def client_var(name: str, init: Any, doc: str = "") -> StateVar:
    """A client state variable: kept on the client between rounds, never sent."""
    return StateVar(name, "client", init, "keep-local", None, doc)


def replaced(vars: Sequence[StateVar], name: str, **changes: Any) -> list[StateVar]:
    """``vars`` with the variable ``name`` changed (``reduce``, ``init``...): a subclass
    that updates an inherited variable by its own rule (``reduce="none"``)."""
    if name not in {v.name for v in vars}:
        raise ContractError(f"no state variable {name!r} to change (declared: "
                            f"{', '.join(v.name for v in vars)})")
    return [dataclasses.replace(v, **changes) if v.name == name else v for v in vars]


def check_vars(vars: Sequence[StateVar], side: str, who: str) -> None:
    """Raise :class:`ContractError` on a declaration that cannot mean anything: a name
    declared twice, a variable of the other side, a server variable kept local or a client
    variable the server reduces, an unknown ``reduce``."""
    seen: set[str] = set()
    for v in vars:
        where = f"{who}'s {side} state variable {v.name!r}"
        if v.name in seen:
            raise ContractError(f"{where} is declared twice; declare each key once")
        seen.add(v.name)
        if v.side != side:
            raise ContractError(
                f"{where} is a {v.side} variable; declare it with {v.side}_var in "
                f"{v.side}_vars()"
            )
        if v.reduce not in REDUCES:
            raise ContractError(f"{where}: reduce {v.reduce!r} is not one of {REDUCES}")
        if side == "server" and v.reduce == "keep-local":
            raise ContractError(f"{where}: the server keeps no variable local; use 'none'")
        if side == "client" and v.reduce != "keep-local":
            raise ContractError(f"{where}: client state is never sent; use client_var")


def init_state(vars: Sequence[StateVar], at: StateInit) -> State:
    """A new state from the declarations, in their order (:data:`ABSENT` ones left out)."""
    return {v.name: v.initial(at) for v in vars if v.init is not ABSENT}


def reduce_replies(
    server: State,
    vars: Iterable[StateVar],
    replies: list[Reply],
    weight: Callable[[Any], float],
) -> None:
    """Fold the round's replies into every ``mean`` / ``sum`` server variable, in
    declaration order: the weighted mean (``weight(payload)``) or the sum of the replies'
    record; a dict value is updated in place, anything else replaced."""
    for v in vars:
        if v.reduce not in ("mean", "sum"):
            continue
        record = v.record or v.name
        if v.reduce == "mean":
            value: Any = weighted_average([(weight(p), p[record]) for _, p in replies])
        else:
            value = _sum([p[record] for _, p in replies])
        if isinstance(server[v.name], dict) and isinstance(value, dict):
            server[v.name].update(value)
        else:
            server[v.name] = value


def _sum(items: list[Tensors]) -> Tensors:
    return {k: torch.stack([t[k] for t in items]).sum(0) for k in items[0]}


# ----------------------------------------------------------------------------- the check
class DeclaredState(dict[str, Any]):
    """A state that refuses a key its component did not declare (the check of
    ``Composition.check_state``: a test wraps every state so). ``names``: the declared keys;
    ``who``: the component (and side) for the message."""

    def __init__(self, data: dict[str, Any], names: Iterable[str], who: str) -> None:
        self.names = frozenset(names)
        self.who = who
        super().__init__()
        for k, v in data.items():
            self[k] = v

    def _check(self, key: object) -> None:
        if key not in self.names:
            raise ContractError(
                f"{self.who} state key {key!r} is not declared (declared: "
                f"{', '.join(sorted(self.names)) or 'none'}); declare it in the component's "
                "server_vars()/client_vars() (fedshift.algorithms.state)"
            )

    def __getitem__(self, key: str) -> Any:
        self._check(key)
        return super().__getitem__(key)

    def __setitem__(self, key: str, value: Any) -> None:
        self._check(key)
        super().__setitem__(key, value)

    def __delitem__(self, key: str) -> None:
        self._check(key)
        super().__delitem__(key)

    def __contains__(self, key: object) -> bool:
        self._check(key)
        return super().__contains__(key)

    def get(self, key: str, default: Any = None) -> Any:
        self._check(key)
        return super().get(key, default)

    def pop(self, key: str, *default: Any) -> Any:
        self._check(key)
        return super().pop(key, *default)

    def setdefault(self, key: str, default: Any = None) -> Any:
        self._check(key)
        return super().setdefault(key, default)

    def update(self, *args: Any, **kwargs: Any) -> None:
        for k, v in dict(*args, **kwargs).items():
            self[k] = v

    def __reduce__(self) -> Any:  # copies (the loop's undo copy) keep the check
        return (DeclaredState, (dict(self), self.names, self.who))


def declared(state: State, vars: Sequence[StateVar], who: str, *extra: str) -> DeclaredState:
    """``state`` as a :class:`DeclaredState` of ``vars`` (and the keys ``extra``)."""
    return DeclaredState(state, [*(v.name for v in vars), *extra], who)
