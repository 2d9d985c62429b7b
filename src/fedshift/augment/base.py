"""Plug-ins that compose with any algorithm: input-level, feature-level and label-level
augmentations and the statistics they exchange (FedRDN, amplitude normalisation, FedFA's
FFA layers, FedMix, mixup, MixStyle, MoEx, ...).

A run is ``algorithm x [augment, ...] x model``. An :class:`Augment` can

* change the model (``attach``: e.g. insert a layer after named conv stages through
  ``FedModel.stage_hooks``), training only or always;
* change what a client trains and is evaluated on (``train_batch`` / ``eval_batch``): batches
  arrive as raw images in [0, 1] and integer labels; an augment may return soft labels of
  shape (N, classes) (mixup-like methods), which the cross-entropy accepts as probabilities.
  Unless an augment declares ``normalizes = True`` (it normalises itself, as FedRDN does),
  the run's ``input.mean/std`` normalisation is applied after the augments;
* exchange its own named payload records: a one-off *setup* exchange before round 1
  (``setup_reply`` / ``setup_aggregate`` / ``setup_broadcast``: FedRDN's statistics) and
  per-round records (``broadcast`` / ``receive`` on the way down, ``reply`` / ``aggregate``
  on the way up: FedFA's statistics and variances, HarmoFL's amplitudes). Every record passes
  the ledger like the algorithm's own.

Client-side augment state lives in the client's state under ``"aug/<name>"`` (kept between
rounds, checkpointed, never sent); server-side state under ``"aug/<name>"`` of the server state.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from fedshift.algorithms import ALGORITHMS
from fedshift.algorithms.state import StateInit, StateVar, check_vars, init_state
from fedshift.core.contract import State
from fedshift.core.disclosure import Disclosure
from fedshift.core.errors import ConfigError
from fedshift.core.federation import ClientData
from fedshift.core.payload import Payload, Tensors
from fedshift.core.privacy import Mechanism
from fedshift.models.base import FedModel

Records = dict[str, Tensors]


def require_federation(augment: str, algorithm: str, needs: str, hint: str = "") -> None:
    """Config-time check for augments that exchange something through the server: the
    algorithm must communicate (``local`` and ``central`` train without a federation)."""
    if not ALGORITHMS.get(algorithm).communicates:
        raise ConfigError(
            f"augment '{augment}' {needs}, which algorithm '{algorithm}' does not have "
            f"(it trains without a federation){'; ' + hint if hint else ''}"
        )


class Augment:
    """Base class: every hook is optional and does nothing by default."""

    name: ClassVar[str] = "augment"
    Params: ClassVar[type | None] = None
    #: True when the augment normalises inputs itself (the run's input.mean/std is skipped).
    normalizes: ClassVar[bool] = False
    #: True when the augment needs the setup exchange before round 1.
    needs_setup: ClassVar[bool] = False
    #: the dataset tasks it works on (label mixing needs one label per image)
    tasks: ClassVar[tuple[str, ...]] = ("classification", "segmentation")

    def __init__(self, params: Any, seed: int, num_classes: int) -> None:
        self.params = params
        self.seed = seed
        self.num_classes = num_classes
        #: the Gaussian mechanism of each record this augment protects, set by the run when
        #: ``privacy.epsilon`` is on (:meth:`Composition.protect`); empty: sent as computed
        self.privacy: dict[str, Mechanism] = {}

    # -- config-time -------------------------------------------------------------------------
    @classmethod
    def check(cls, params: Any, algorithm: str, others: list[str]) -> None:
        """Raise ConfigError when combining with ``algorithm`` / other augments makes no sense."""

    def protected(self, augments: list[Augment]) -> None:
        """Called once ``privacy.epsilon`` gave this augment mechanisms (``privacy``), with
        the run's augments in pipeline order: raise :class:`ConfigError` when its
        per-example bound does not hold in that composition. Nothing by default."""

    # -- model -------------------------------------------------------------------------------
    def attach(self, model: FedModel) -> None:
        """Modify the model once, before the initial weights are taken."""

    # -- state (declared: fedshift.algorithms.state) ----------------------------------------
    def server_vars(self) -> list[StateVar]:
        """The augment's server state (under ``"aug/<name>"`` of the server state),
        declared; none by default."""
        return []

    def client_vars(self) -> list[StateVar]:
        """The augment's client state (under ``"aug/<name>"`` of each client's state),
        declared; none by default."""
        return []

    def init_server(self, model: FedModel) -> State:
        """The augment's server state built from :meth:`server_vars`."""
        vars = self.server_vars()
        check_vars(vars, "server", f"augment {self.name!r}")
        return init_state(vars, StateInit(model))

    def init_client(self, cid: str, data: ClientData, model: FedModel) -> State:
        """Client ``cid``'s augment state built from :meth:`client_vars`."""
        vars = self.client_vars()
        check_vars(vars, "client", f"augment {self.name!r}")
        return init_state(vars, StateInit(model, cid, data))

    # -- setup exchange (before round 1, every client) ----------------------------------------
    def setup_reply(self, cid: str, state: State) -> Records:
        return {}

    def setup_aggregate(self, server: State, replies: list[tuple[str, Records]]) -> None:
        """Server side of the setup exchange."""

    def setup_broadcast(self, server: State, cid: str) -> Records:
        return {}

    # -- every round -------------------------------------------------------------------------
    def broadcast(self, server: State, rnd: int, cid: str) -> Records:
        return {}

    def receive(self, records: Payload, state: State, rnd: int) -> None:
        """Client side: read this augment's records from the down payload (also at setup)."""

    def eval_broadcast(self, server: State, cid: str) -> Records:
        """Records a client that never trains (``federation.holdout``) needs before each
        evaluation (HarmoFL's global amplitude); read by :meth:`receive` with round 0. Like
        the evaluated weights, they are not counted in the ledger."""
        return {}

    def before_train(self, model: FedModel, state: State, rnd: int) -> None:
        """Client side, just before local training (e.g. load per-client layer statistics)."""

    def reply(self, model: FedModel, state: State, rnd: int) -> Records:
        """Client side, after local training: records to send up."""
        return {}

    def aggregate(self, server: State, rnd: int, replies: list[tuple[str, Payload]]) -> None:
        """Server side, after the algorithm aggregated."""

    # -- disclosure --------------------------------------------------------------------------
    def disclosures(self, model: FedModel) -> list[Disclosure]:
        """What each record this augment sends says about a site
        (:mod:`fedshift.core.disclosure`), declared next to the hooks that send them;
        ``model``: the model as attached. None by default."""
        return []

    # -- data path ---------------------------------------------------------------------------
    def train_batch(
        self, x: torch.Tensor, y: torch.Tensor, state: State, generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return x, y

    def eval_batch(self, x: torch.Tensor, state: State) -> torch.Tensor:
        return x

    # -- export (fedshift export's predictor: runtime/predictor.py) ----------------------------
    def eval_module(self, state: State) -> torch.nn.Module | None:
        """``eval_batch`` with this client state as a ``torch.nn.Module`` that ``torch.export``
        captures (its state as buffers), or ``None`` when the augment cannot give one: the
        export then refuses rather than write a model that predicts differently. Default: the
        identity for an augment that does not override ``eval_batch``, else ``None``."""
        if type(self).eval_batch is Augment.eval_batch:
            return torch.nn.Identity()
        return None

    def site_state(self, server: State, images: torch.Tensor | None) -> State | None:
        """The state ``eval_module`` takes for a site that never trained: from the server's
        augment state and, where the augment needs them, that site's images (raw, in [0, 1],
        (N, C, H, W)); ``None`` when it needs images and ``images`` is None. Default: ``{}``
        (no per-site state)."""
        return {}
