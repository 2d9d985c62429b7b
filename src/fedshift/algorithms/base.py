"""The algorithm base class and the mechanisms every algorithm shares.

An algorithm is what a server does with messages and what a client does with its data
(the contract, :class:`fedshift.core.contract.AlgorithmSpec`):

* server side: ``init_server`` (server state), ``broadcast`` (server -> client payload) and
  ``aggregate`` (client payloads -> new server state);
* client side: ``init_client`` (client state from its data and the initial model, kept
  between rounds and never sent) and ``local_update`` (down payload + state + data -> up
  payload, built by ``reply``);
* evaluation: ``global_weights`` / ``personal_weights`` (the state dicts to evaluate).

Algorithms never see the round loop, the sampler, the ledger or where client state lives;
the runtime (or the Flower adapter) owns those. State is plain dicts of tensors and numbers so
that it checkpoints with ``torch.save``. The algorithm object holds configuration only:
what one client's round computes and its hooks read is passed explicitly (the down payload,
the client state, ``ctx.scratch``), so several clients' rounds may share one object.

This module holds the defaults: the key lists of the BN policy, FedAvg-shaped server and
client steps, the standard up payload (``reply``), the hooks of the local loop (``loss``,
``penalty`` for FedProx-like objectives, ``before_step`` for gradient corrections) and
``setup(model)``, where a subclass builds what it needs once per run (no constructor of its
own). The mechanisms live in their own modules: :mod:`fedshift.algorithms.local_train` (the
local mini-batch loop, optimisers, SAM), :mod:`fedshift.algorithms.tensors` (named-tensor
copies and weighted averages) and :mod:`fedshift.algorithms.bn` (BN policy, frozen BN
statistics).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, Literal, TypeVar

import torch

# the shared helpers live in their own modules; imported here for the algorithms (and the
# plug-ins) that import them from ``fedshift.algorithms.base``
from fedshift.algorithms.bn import BN_STATS, BNPolicy, bn_keys, require_bn_tensors
from fedshift.algorithms.dp_sgd import dp_sgd_steps
from fedshift.algorithms.local_train import build_optimizer, restore_optimizer, sam_second_pass
from fedshift.algorithms.local_train import sgd_steps as _sgd_steps
from fedshift.algorithms.state import (
    ABSENT,
    StateInit,
    StateVar,
    check_vars,
    client_var,
    init_state,
    reduce_replies,
    server_var,
)
from fedshift.algorithms.tensors import clone, subset, weighted_average
from fedshift.algorithms.trainable import Frozen
from fedshift.core.config import FederationConfig, TrainConfig
from fedshift.core.context import ClientContext
from fedshift.core.contract import Reply, State
from fedshift.core.contract_errors import expect
from fedshift.core.disclosure import (
    DOWN,
    UP,
    Disclosure,
    Kind,
    Over,
    To,
    When,
    fixed,
    tensor_bytes,
)
from fedshift.core.errors import ConfigError
from fedshift.core.federation import ClientData, Federation
from fedshift.core.payload import Payload, Tensors
from fedshift.models.base import FedModel

__all__ = [
    "BN_STATS", "FLParams", "Algorithm", "BNPolicy", "ParamsT", "Reply", "State", "Weighting",
    "bn_keys", "build_optimizer", "clone", "require_bn_tensors", "require_sgd",
    "resolve_weighting", "subset", "weighted_average",
]  # fmt: skip

Weighting = Literal["samples", "uniform"]

#: an algorithm's ``Params`` dataclass (``None`` for one that takes no keys): the type of its
#: ``self.params``. A class that its subclasses extend with their own ``Params`` stays
#: generic in it (``class FedAvg(Algorithm[ParamsT])``); a leaf names its own
#: (``class FedSAM(FedAvg[FedSAMParams])``), and the type checker sees its fields.
ParamsT = TypeVar("ParamsT")


@dataclass
class FLParams:
    """Parameters every federated algorithm accepts.

    ``bn_policy``: which batch-norm tensors stay on the client.
    ``global``: none (every BN tensor is averaged, as FedAvg does);
    ``local``: all of them (weight, bias, running mean/var, counter: FedBN);
    ``stats-local``: the running statistics and counter only (affine parameters averaged).
    """

    bn_policy: BNPolicy = "global"


def resolve_weighting(requested: str, algorithm: type[Algorithm]) -> Weighting:
    """The aggregation weighting a run uses: ``federation.weighting`` when it is ``samples``
    or ``uniform`` (an explicit choice always wins), else (``auto``) the algorithm's
    ``paper_weighting``."""
    if requested == "auto":
        return algorithm.paper_weighting
    if requested not in ("samples", "uniform"):
        raise ConfigError(
            f"config key 'federation.weighting': {requested!r} is not one of "
            "'auto', 'samples', 'uniform'"
        )
    return requested  # type: ignore[return-value]


def require_sgd(algorithm: str, why: str, train: TrainConfig) -> None:
    """Config-time check for algorithms whose update rule assumes plain SGD steps."""
    if train.optimizer != "sgd":
        raise ConfigError(
            f"algorithm '{algorithm}' {why}: set train.optimizer=sgd (got {train.optimizer!r})"
        )


# ----------------------------------------------------------------------------- the contract
class Algorithm(Generic[ParamsT]):
    """Base class. Subclasses override the hooks they need; see FedAvg for the plain flow.

    Generic in its ``Params`` dataclass (:data:`ParamsT`), the type of ``self.params``."""

    name: ClassVar[str] = "base"
    #: the dataclass of the algorithm's config keys (``algorithm.*``); None: it takes none
    Params: ClassVar[type | None] = FLParams
    #: False for algorithms with no client-server traffic (Local, Centralised).
    communicates: ClassVar[bool] = True
    #: the dataset tasks (fedshift.core.tasks) whose labels the local objective can use
    tasks: ClassVar[tuple[str, ...]] = ("classification", "segmentation")
    #: how the algorithm's paper weights client replies in its aggregation
    #: (``federation.weighting=auto`` resolves to it): ``samples`` = n_k / n (FedAvg, McMahan
    #: et al. 2017, Alg. 1), ``uniform`` = 1 / |S|. Subclasses set their paper's choice.
    paper_weighting: ClassVar[Weighting] = "samples"
    #: True when a round's local work depends on the total ``train.rounds`` (a ramp-up
    #: schedule over the run, FRAug): such a run cannot be extended to more rounds and equal
    #: a longer run from the start, so ``--resume ... train.rounds=N`` refuses it
    depends_on_rounds: ClassVar[bool] = False
    #: config overrides (``key=value``) without which the algorithm refuses to run, e.g.
    #: FedWon's normalisation-free model; :func:`fedshift.testing.tiny_cfg` adds them
    requires: ClassVar[tuple[str, ...]] = ()

    def __init__(
        self,
        params: ParamsT,
        train: TrainConfig,
        federation: FederationConfig,
        model: FedModel,
        num_clients: int,
    ) -> None:
        self.params: ParamsT = params
        self.train = train
        #: the run's federation settings with ``weighting`` resolved (never ``auto``): every
        #: runtime (native, Flower) builds the algorithm the same way, so both resolve alike
        self.federation = dataclasses.replace(
            federation, weighting=resolve_weighting(federation.weighting, type(self))
        )
        self.num_clients = num_clients
        state = model.state_dict()
        require_bn_tensors(self.name, getattr(params, "bn_policy", "global"), model)
        if train.agc is not None and type(self).local_train is not Algorithm.local_train:
            raise ConfigError(
                f"config key 'train.agc': algorithm {self.name!r} trains with its own local "
                "step, which has no adaptive gradient clipping (only the default step does, "
                "fedshift.algorithms.agc); remove train.agc or choose another algorithm"
            )
        #: the tensors ``train.trainable`` freezes (:mod:`fedshift.algorithms.trainable`):
        #: neither local nor shared; ``model`` is frozen in place
        self.frozen = Frozen(model, train.trainable, self.always_trained)
        if self.frozen and self.partial_training_refusal is not None:
            raise ConfigError(
                f"config key 'train.trainable={train.trainable}': algorithm {self.name!r} "
                f"{self.partial_training_refusal}; use train.trainable=all"
            )
        frozen = set(self.frozen.keys)
        own = self.compute_local_keys(model)
        self.local_keys: list[str] = [k for k in own if k not in frozen]
        if own and not self.local_keys:
            raise ConfigError(
                f"config key 'train.trainable={train.trainable}': algorithm {self.name!r} keeps "
                f"{len(own)} tensor(s) on each client ({', '.join(own[:2])}, ...), and "
                "train.trainable freezes them all, so it would run as FedAvg on the trained "
                "part; choose a train.trainable that trains them (bn or bn+head for BN "
                "tensors) or another algorithm"
            )
        self.bn_tensor_keys: list[str] = bn_keys(model, "local")
        local = set(self.local_keys)
        self.shared_keys: list[str] = [k for k in state if k not in local and k not in frozen]
        if frozen and not self.shared_keys and len(own) < len(state):
            raise ConfigError(
                f"config key 'train.trainable={train.trainable}': algorithm {self.name!r} "
                "keeps every tensor train.trainable trains on the client, so nothing is left "
                "to share and each site trains alone; choose train.trainable=bn+head or all, "
                "or algorithm local"
            )
        params_named = {n for n, _ in model.named_parameters()}
        #: shared keys that are trainable parameters (server optimisers act on these only)
        self.shared_param_keys: list[str] = [k for k in self.shared_keys if k in params_named]
        #: shared keys that are buffers (BN running statistics): always plainly averaged
        self.shared_buffer_keys: list[str] = [k for k in self.shared_keys if k not in params_named]
        self.setup(model)

    def setup(self, model: FedModel) -> None:
        """Build what the algorithm needs beyond the base's key lists, once per run, from the
        (wrapped) initial model: called at the end of the constructor, with ``params``,
        ``train``, ``federation``, ``num_clients``, ``local_keys`` and ``shared_keys`` set.
        Override it instead of ``__init__`` (nothing by default)."""

    #: SAM radius rho for the local steps (None: plain steps). FedSAM and HarmoFL set it.
    sam_rho: float | None = None

    @classmethod
    def check(cls, params: Any, train: TrainConfig) -> None:
        """Config-time check of a combination; raise ConfigError saying why it makes no sense."""

    @classmethod
    def implied_augments(cls, params: Any) -> list[str]:
        """Augments this algorithm consists of (a preset such as ``fedrdn`` = FedAvg +
        the ``fedrdn`` augment). Listing one in ``augment`` explicitly sets its parameters."""
        return []

    @classmethod
    def export_refusal(cls, params: Any) -> str | None:
        """Why the predictor ``fedshift export`` writes (a ``torch.export`` program of the
        evaluated model) could not compute what this algorithm's evaluation computes, or
        ``None`` (default) when it can; the export then refuses with this reason."""
        return None

    @classmethod
    def wrap_model(cls, params: Any, model: FedModel, federation: Federation) -> FedModel:
        """The model this algorithm trains, built around the configured backbone ``model``
        (identity by default; DisTrans wraps it in a double-input-channel model). Called once
        per run with the seeded initial backbone, before augments attach."""
        return model

    def compute_local_keys(self, model: FedModel) -> list[str]:
        return bn_keys(model, getattr(self.params, "bn_policy", "global"))

    #: why this algorithm cannot train a part of the model (``train.trainable`` other than
    #: ``all``), or None when it can (checked for every algorithm by
    #: tests/algorithms/test_trainable.py: frozen tensors unchanged, fewer bytes sent)
    partial_training_refusal: ClassVar[str | None] = None
    #: the method's own tensors that train whatever ``train.trainable`` freezes: state-dict
    #: keys or module prefixes (DisTrans's offset, FedCLIP's adapter)
    always_trained: ClassVar[tuple[str, ...]] = ()
    #: why this algorithm's local update cannot train on cached embeddings of a frozen
    #: trunk (:mod:`fedshift.runtime.trunk_cache`), or None when it can
    trunk_cache_refusal: ClassVar[str | None] = None

    # -- which models exist to be evaluated ---------------------------------------------
    @property
    def has_global_model(self) -> bool:
        """A single server model that every client can use (no client-local tensors)."""
        return not self.local_keys

    @property
    def has_personal_model(self) -> bool:
        """Each client's model differs (it keeps tensors of its own)."""
        return bool(self.local_keys)

    def new_site_keys(self) -> set[str]:
        """The local state-dict keys a site that never trained may take as the sources'
        uniform mean (:meth:`has_new_site_answer`): the model's BN tensors."""
        return set(self.bn_tensor_keys)

    def has_new_site_answer(self) -> bool:
        """Whether a site that never trained (``federation.holdout``) has a model although
        the algorithm keeps client-local tensors: True when a client's personal model is the
        server's shared tensors plus its own ``state["local"]`` (this class's
        ``personal_weights``) and those local tensors are BN tensors only (FedBN, FRAug,
        ``bn_policy=local``; DisTrans adds its offset, :meth:`new_site_keys`). The new site
        then takes the shared tensors with the uniform mean of the sources' local tensors
        (``fedshift protocol new-site``, which also re-estimates the BN statistics on the
        site: AdaBN); during the run such a site is not scored. Always False for
        ``local``-style algorithms (every tensor local) and personalised models built
        otherwise (pFedMe, pFedHN, PartialFed, FedAvg-FT)."""
        own_rule = type(self).personal_weights is Algorithm.personal_weights
        return own_rule and bool(self.local_keys) and set(self.local_keys) <= self.new_site_keys()

    @classmethod
    def training_data(cls, federation: Federation) -> list[ClientData]:
        """The clients that train (the centralised oracle overrides this with one pool)."""
        return federation.clients

    # -- declared state (fedshift.algorithms.state) ----------------------------------------
    def server_vars(self) -> list[StateVar]:
        """The server state, declared: ``weights``, the server model (every tensor at its
        initial weights), the weighted mean of the replies' ``weights`` records. A subclass
        adds its own (``[*super().server_vars(), server_var(...)]``)."""
        return [
            server_var("weights", lambda at: clone(at.model.state_dict()), "mean",
                       doc="the server model's state dict (shared keys: the replies' mean)"),
        ]  # fmt: skip

    def client_vars(self) -> list[StateVar]:
        """The client state, declared: ``local``, the client's own tensors (``local_keys``)
        from the initial model; ``optimizer``, the optimiser state kept between rounds with
        ``train.optimizer_state=persist`` (written by the local step)."""
        return [
            client_var("local", lambda at: clone(subset(at.model.state_dict(), self.local_keys)),
                       doc="the client's local tensors (local_keys)"),
            client_var("optimizer", ABSENT, doc="train.optimizer_state=persist: the optimiser"),
        ]  # fmt: skip

    # -- server ----------------------------------------------------------------------------
    def init_server(self, model: FedModel) -> State:
        """The server state built from :meth:`server_vars`."""
        vars = self.server_vars()
        check_vars(vars, "server", f"algorithm {self.name!r}")
        return init_state(vars, StateInit(model))

    def aggregate_declared(self, server: State, replies: list[Reply]) -> None:
        """The declared reduction: every ``mean`` server variable <- the ``reply_weight``
        mean of the replies' record, every ``sum`` one <- their sum."""
        reduce_replies(server, self.server_vars(), replies, self.reply_weight)

    def broadcast(self, server: State, rnd: int, cid: str) -> Payload:
        """The down payload: the shared tensors of the server model (record ``weights``)."""
        return Payload({"weights": subset(server["weights"], self.shared_keys)})

    def aggregate(self, server: State, rnd: int, replies: list[Reply]) -> None:
        """Fold round ``rnd``'s replies into ``server``: by default the declared reduction
        (:meth:`aggregate_declared`)."""
        self.aggregate_declared(server, replies)

    @property
    def weighting(self) -> Weighting:
        """The resolved aggregation weighting (``federation.weighting``, ``auto`` resolved)."""
        return self.federation.weighting  # type: ignore[return-value]

    def reply_weight(self, payload: Payload) -> float:
        """Aggregation weight of one reply (the resolved ``federation.weighting``)."""
        if self.federation.weighting == "uniform":
            return 1.0
        return float(payload.num_examples)

    def average_record(self, replies: list[Reply], record: str) -> Tensors:
        return weighted_average([(self.reply_weight(p), p[record]) for _, p in replies])

    # -- client ----------------------------------------------------------------------------
    def init_client(self, cid: str, data: ClientData, model: FedModel) -> State:
        """Client ``cid``'s initial state: its copy of the local tensors (``local_keys``) of
        ``model`` at its initial weights. ``data`` is the client's data (unused here;
        the same signature as the augments' ``init_client``): built from
        :meth:`client_vars`."""
        vars = self.client_vars()
        check_vars(vars, "client", f"algorithm {self.name!r}")
        return init_state(vars, StateInit(model, cid, data))

    def local_update(self, ctx: ClientContext, down: Payload, state: State) -> Payload:
        raise NotImplementedError

    def shared_weights(self, ctx: ClientContext) -> Tensors:
        """A detached copy of the working model's shared tensors (``shared_keys``)."""
        return clone(subset(ctx.model.state_dict(), self.shared_keys))

    def reply(
        self,
        ctx: ClientContext,
        state: State,
        steps: int,
        loss: float,
        records: dict[str, Tensors] | None = None,
    ) -> Payload:
        """The up payload at the end of ``local_update`` (the client's counterpart of
        ``broadcast``): ``records`` (default: the trained shared tensors as record
        ``weights``, nothing when the algorithm shares no tensor), the number of training
        examples behind them and the metrics ``train_loss`` (mean loss of the round's
        ``steps`` local steps) and ``steps``. Algorithms that send more or other records pass
        them (``{"weights": self.shared_weights(ctx), "generator": ...}``) or extend the
        returned payload."""
        if records is None:
            records = {"weights": self.shared_weights(ctx)} if self.shared_keys else {}
        return Payload(
            records, num_examples=ctx.num_train, metrics={"train_loss": loss, "steps": steps}
        )

    def disclosures(self, model: FedModel) -> list[Disclosure]:
        """What each record this algorithm sends says about a site
        (:mod:`fedshift.core.disclosure`), declared with the records: by default the
        ``weights`` record both ways (the shared tensors of ``model``), nothing for an
        algorithm that does not communicate or shares no tensor. A subclass that sends other
        records overrides this next to its ``broadcast`` / ``local_update``."""
        if not self.communicates or not self.shared_keys:
            return []
        return self.weights_disclosures(model)

    def weights_disclosures(
        self, model: FedModel, keys: list[str] | None = None
    ) -> list[Disclosure]:
        """The ``weights`` record up (the trained shared tensors ``keys``, default
        ``shared_keys``) and down (their aggregate)."""
        keys = self.shared_keys if keys is None else keys
        state = model.state_dict()
        size = fixed(tensor_bytes(state, keys))
        bn = any(k.endswith(("running_mean", "running_var")) for k in keys)
        also = " (with BatchNorm running means/variances of the site's batches)" if bn else ""
        return [
            # shared BatchNorm running statistics are statistics of the site's recent batches
            Disclosure("weights", UP, Kind.PARAMETERS, When.ROUND, size,
                       f"the site's trained shared model tensors{also}", to=To.AGGREGATE,
                       over=Over.BATCH if bn else None),
            Disclosure("weights", DOWN, Kind.PARAMETERS, When.ROUND, size,
                       "the aggregated shared model tensors", carries=("weights",)),
        ]  # fmt: skip

    def down_weights(self, model: FedModel, carries: tuple[str, ...]) -> Disclosure:
        """The ``weights`` record down alone, computed from the up records ``carries``
        (algorithms that send updates instead of weights)."""
        return dataclasses.replace(self.weights_disclosures(model)[1], carries=carries)

    def load_client_model(self, ctx: ClientContext, shared: Tensors, state: State) -> None:
        """Working model <- the received shared tensors + the client's own local tensors."""
        ctx.model.load_state_dict(self.frozen.complete({**shared, **state["local"]}), strict=True)

    def keep_local(self, ctx: ClientContext, state: State) -> None:
        if self.local_keys:
            state["local"] = clone(subset(ctx.model.state_dict(), self.local_keys))

    # -- the local loop --------------------------------------------------------------------
    def trainable(self, ctx: ClientContext) -> list[torch.nn.Parameter]:
        """The tensors the model optimiser steps (DisTrans leaves its offset to its own)."""
        return [p for p in ctx.model.parameters() if p.requires_grad]

    def make_optimizer(self, ctx: ClientContext, state: State) -> torch.optim.Optimizer:
        opt = build_optimizer(self.trainable(ctx), self.train)
        return restore_optimizer(opt, state, "optimizer", self.train)

    def loss(self, ctx: ClientContext, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Local objective on one batch: the task's loss (cross-entropy, or the segmentation
        loss ``train.loss``) plus ``penalty`` (0 by default). Values the round's objective
        needs beyond the batch (a frozen model, prototypes) are in ``ctx.scratch``, put
        there by ``local_update``."""
        loss = ctx.task.loss(ctx.model(x), y)
        extra = self.penalty(ctx)
        if extra is not None:
            expect(extra, (torch.Tensor, float, int), self, "penalty", "a scalar tensor or None")
        return loss if extra is None else loss + extra

    def penalty(self, ctx: ClientContext) -> torch.Tensor | None:
        """An extra term of the local objective (None: none); reads the round's values, e.g.
        FedProx's anchor, from ``ctx.scratch``."""
        return None

    def before_step(self, ctx: ClientContext) -> None:
        """Called after ``backward`` and before ``optimizer.step`` (gradient corrections;
        the round's values, e.g. SCAFFOLD's correction, are in ``ctx.scratch``)."""

    def local_train(self, ctx: ClientContext, state: State) -> tuple[int, float]:
        """Run the round's local mini-batch steps; returns (steps taken, mean loss). Default:
        :func:`fedshift.algorithms.local_train.sgd_steps` (``loss``, the SAM pass when
        ``sam_rho`` is set, ``before_step``, one optimiser step per mini-batch); under
        ``privacy.updates=example`` (``ctx.dpsgd`` set) DP-SGD's steps,
        :func:`fedshift.algorithms.dp_sgd.dp_sgd_steps`."""
        if ctx.dpsgd is not None:
            return dp_sgd_steps(self, ctx, state)
        return _sgd_steps(self, ctx, state)

    def sam_second_pass(
        self, ctx: ClientContext, x: torch.Tensor, y: torch.Tensor, rho: float
    ) -> None:
        """The sharpness-aware second pass of a local step
        (:func:`fedshift.algorithms.local_train.sam_second_pass`)."""
        sam_second_pass(self, ctx, x, y, rho)

    # -- evaluation ------------------------------------------------------------------------
    def global_weights(self, server: State) -> Tensors | None:
        return server["weights"] if self.has_global_model else None

    def personal_weights(self, server: State, state: State) -> Tensors | None:
        if not self.has_personal_model:
            return None
        shared = subset(server["weights"], self.shared_keys)
        return self.frozen.complete({**shared, **state["local"]})

    def server_view(self, server: State, cid: str) -> State:
        """The part of the server state that ``personal_weights`` reads for client ``cid``.

        A runtime whose clients live elsewhere (Flower) sends it to the client for evaluation
        and calls ``personal_weights(view, state)`` there. Contract (tested for every
        algorithm with a personal model): ``personal_weights(server_view(server, cid), state)
        == personal_weights(server, state)``. Override it together with ``personal_weights``.
        """
        if not self.has_personal_model:
            return {}
        return {"weights": subset(server["weights"], self.shared_keys)}

    def register_clients(self, cids: list[str]) -> None:
        """Called once with the training clients, in order, before any round (by the server
        side of every runtime). Algorithms that index clients on the server (pFedHN's
        embedding rows) assign the indices here."""
