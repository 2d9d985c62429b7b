"""DP-FedAvg on the native engines (``privacy.updates=client``; the mechanism:
:mod:`fedshift.core.dp_updates`, the budget: :mod:`fedshift.runtime.privacy`).

:class:`UpdatePrivacy` is built by the round loop when the run's plan protects the weights.
Before any client state is built (:func:`fedshift.runtime.privacy.updates_refusal`, from
``build_experiment``: every process that builds the run, ``fedshift privacy show`` too) a
method is refused, in one line naming the key:

* an aggregation weighting other than uniform (``federation.weighting``): the mean's
  sensitivity is ``clip / m`` only when every site weighs ``1 / m``; weighting by sample size
  would scale it by the largest site's share, and make the noise depend on the sites' sizes;
* a method whose server reads a site's weights other than through their mean (its
  ``aggregate`` is not declared :func:`~fedshift.core.disclosure.sums_only` for
  ``weights``: FedDG-GA, pFedMe, ...), or that sends a record in its rounds that is neither
  the weights nor a statistic ``privacy.epsilon`` protects (updates, control variates,
  generators, prototypes: SCAFFOLD, FedNova, FRAug, FedFA's statistics...);
* secure aggregation together with it (not wired yet).

Client side, :class:`DPTransport` wraps the run's transport: each reply's ``weights`` record
is clipped to ``privacy.update_clip`` around the weights that client received
(:func:`~fedshift.core.dp_updates.clip_update`), as the reply arrives from the client code (in
process, vectorised or from a worker), before the ledger or the algorithm see it: what a site
would send. Server side, :meth:`UpdatePrivacy.combine` hands the algorithm's ``aggregate``
one reply: the mean of the clipped weights over the round's sampled clients plus the
Gaussian noise (:meth:`~fedshift.core.dp_updates.UpdateMechanism.release`), and each other
summed record's plain mean; a noisy BatchNorm running variance is floored at the noise's
std (post-processing: a released variance within one noise std of zero cannot be told from
zero, and a variance of 0 makes the layer multiply its input by ``1 / sqrt(bn eps)``, about
316: a U-Net's outputs overflowed to NaN at epsilon 4 on brain-mri with a floor of 0).
Every method whose aggregate is declared a mean of the weights gives the same result on that
one reply as on the replies it averages (the contract secure aggregation relies on), so
FedAvg, FedBN, FedProx, FedAvgM / FedAdam (the server step on the noisy mean), HarmoFL and
FedRDN run unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from fedshift.algorithms.tensors import weighted_average
from fedshift.core.config import RunConfig
from fedshift.core.contract import Reply
from fedshift.core.dp_updates import UpdateMechanism, clip_update
from fedshift.core.errors import ConfigError, FedshiftError
from fedshift.core.payload import Payload, Tensors
from fedshift.runtime.guarded import GuardedTransport

if TYPE_CHECKING:
    from fedshift.runtime.experiment import Experiment
    from fedshift.runtime.transport import Transport

#: the record the updates' mechanism protects
WEIGHTS = "weights"
#: the client name of the one reply the server hands the algorithm
DP_CLIENT = "(dp mean)"
KEY = "config key 'privacy.updates'"  # the start of its errors


class UpdatePrivacy:
    """A run's DP-FedAvg (module docstring): refusals, clipping, the noisy mean."""

    def __init__(self, cfg: RunConfig) -> None:
        if cfg.federation.secure_aggregation:
            raise ConfigError(
                f"{KEY}: not available together with federation.secure_aggregation yet "
                "(the noise is added to the plain mean); set one of them off"
            )
        self.seed = cfg.seed
        self.mechanism: UpdateMechanism | None = None  # the plan's, set by check
        #: the weights each client of the round in progress received
        self.received: dict[str, Tensors] = {}

    @classmethod
    def of(cls, cfg: RunConfig) -> UpdatePrivacy | None:
        on = cfg.privacy.epsilon is not None and cfg.privacy.updates == "client"
        return cls(cfg) if on else None

    def wrap(self, transport: Transport) -> DPTransport:
        return DPTransport(transport, self)

    def check(self, exp: Experiment) -> None:
        """Take the plan's mechanism (``build_experiment`` has refused a method DP-FedAvg
        cannot protect: :func:`fedshift.runtime.privacy.updates_refusal`)."""
        plan = exp.privacy  # build_experiment refused what it cannot protect
        assert plan is not None and plan.updates is not None, "privacy.updates without a plan"
        self.mechanism = plan.updates.mechanism(self.seed)

    def clip(self, rnd: int, cid: str, up: Payload) -> Payload:
        """Client ``cid``'s reply with its ``weights`` update clipped (what the site sends)."""
        assert self.mechanism is not None
        if WEIGHTS not in up.records:
            raise FedshiftError(f"round {rnd}: client {cid!r} sent no weights under {KEY}")
        reference = self.received.get(cid)
        if reference is None or not set(up[WEIGHTS]) <= set(reference):
            raise FedshiftError(
                f"round {rnd}: client {cid!r} sent weights that are not the ones it received, "
                f"so {KEY} cannot clip its update; use privacy.updates=none with this method"
            )
        clipped, _ = clip_update(up[WEIGHTS], reference, self.mechanism.clip)
        records = {**up.records, WEIGHTS: clipped}
        return Payload(records, num_examples=up.num_examples, metrics=dict(up.metrics),
                       config=dict(up.config))  # fmt: skip

    def combine(self, rnd: int, cohort: list[str], replies: list[Reply]) -> list[Reply]:
        """The one reply the algorithm's ``aggregate`` receives (module docstring): the
        noisy mean of the clipped weights over the ``cohort`` (the round's sampled clients;
        a lost client adds a zero update), each other record's plain mean."""
        assert self.mechanism is not None
        if not replies:
            return replies
        reference = self.received[replies[0][0]]
        for cid, _ in replies[1:]:
            other = self.received[cid]
            if other.keys() != reference.keys() or any(
                not torch.equal(other[k], reference[k]) for k in reference
            ):
                raise FedshiftError(
                    f"round {rnd}: clients {replies[0][0]!r} and {cid!r} received different "
                    f"weights; {KEY} needs one global model a round"
                )
        sent = [p[WEIGHTS] for _, p in replies]
        keys = set(sent[0])
        ref = {k: v for k, v in reference.items() if k in keys}
        weights = self.mechanism.release(ref, sent, len(cohort), rnd)
        floor = self.mechanism.std(len(cohort))
        for k in weights:
            if k.endswith("running_var"):  # post-processing (module docstring)
                weights[k] = weights[k].clamp_min(floor)
        records: dict[str, Tensors] = {WEIGHTS: weights}
        others = sorted({r for _, p in replies for r in p.records} - {WEIGHTS})
        for r in others:
            records[r] = weighted_average([(1.0, p[r]) for _, p in replies if r in p.records])
        total = sum(p.num_examples for _, p in replies)
        return [(DP_CLIENT, Payload(records, num_examples=total))]


class DPTransport(GuardedTransport[UpdatePrivacy]):
    """A transport whose replies' weights are clipped as they arrive from the client code
    (:meth:`UpdatePrivacy.clip`, a NaN refused first); every other call goes to the wrapped
    transport."""

    def sent(self, down: Callable[[str], Payload]) -> Callable[[str], Payload]:
        """``down``, each client's weights kept as sent (the clipping's reference)."""
        self.guard.received = {}

        def watched(cid: str) -> Payload:
            payload = down(cid)
            if WEIGHTS in payload.records:
                self.guard.received[cid] = payload[WEIGHTS]
            return payload

        return watched

    def protect(self, rnd: int, cid: str, cids: list[str], up: Payload) -> Payload:
        return self.guard.clip(rnd, cid, up)
