"""Which runs example-level DP-SGD can protect (``privacy.updates=example``; the mechanism:
:mod:`fedshift.core.dpsgd`, the local step: :mod:`fedshift.algorithms.dp_sgd`, the budget:
:mod:`fedshift.runtime.privacy`).

:func:`example_refusal` is asked by ``build_experiment`` (every process that builds the run,
``fedshift privacy show`` too) before any client state exists; a run it refuses stops with
one line naming the key and a fix. DP-SGD's guarantee holds when the only thing a site's
data decides is the noisy sum of clipped per-example gradients, so it refuses:

* a model with a layer Opacus cannot give per-example gradients for (its
  ``ModuleValidator``: BatchNorm mixes the examples of a batch and keeps running statistics
  of them): ``model.norm=none`` removes every normalisation layer (FedWon's option), nothing
  is converted silently;
* a local step other than the default one (:meth:`Algorithm.local_train`,
  :meth:`Algorithm.loss` and :meth:`Algorithm.before_step` as the base class has them, no
  SAM pass) or a local update other than FedAvg's or FedProx's: its own optimiser loops,
  losses over other clients' data or features, gradient corrections would bypass the
  clipping or add data the noise does not cover. A penalty must read no data: the base's
  (none) or FedProx's proximal term;
* a reply record other than the weights and the statistics ``privacy.epsilon`` protects
  (DP-SGD covers what is computed from the trained model alone);
* an augment that mixes the examples of a batch or changes the model or the objective
  (mixup, MixStyle, MoEx, FedMix, FFA...), or normalises with the site's own raw statistics
  (``norm`` with ``stats=client``): one example would then reach the other examples'
  gradients. Input-level per-example augments run (:data:`PER_EXAMPLE_AUGMENTS`);
* a loss that is not a mean of per-example losses (segmentation's Dice: ``train.loss=ce``
  is one); the vectorised executor (``run.executor=vmap``, which has its own step), the
  trunk cache (``train.trunk_cache`` with ``train.trainable=head``: its own batches) and
  secure aggregation (not wired together yet).

:func:`check_steps` is the runtime's guard after a client's round: the steps DP-SGD took must
be the planned ones (a local loop that bypassed it would otherwise pass unnoticed).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fedshift.algorithms.base import Algorithm
from fedshift.algorithms.dp_sgd import DPSGD_STEPS
from fedshift.algorithms.fedavg import FedAvgClient
from fedshift.algorithms.fedprox import FedProxClient
from fedshift.core.config import RunConfig
from fedshift.core.context import ClientContext
from fedshift.core.disclosure import UP, Kind, When
from fedshift.core.errors import FedshiftError

if TYPE_CHECKING:
    from fedshift.augment.compose import Composition
    from fedshift.models.base import FedModel

__all__ = ["PER_EXAMPLE_AUGMENTS", "check_steps", "example_refusal"]

KEY = "config key 'privacy.updates'"  # the start of its refusals (privacy.updates=example)
NONE = "or privacy.updates=none"
#: augments whose training transform acts on each example alone, from the example and
#: values the site received (FedRDN's bank: the sites' released, noisy statistics) or fixed
#: constants; ``norm`` only with ``stats=fixed``
PER_EXAMPLE_AUGMENTS = frozenset({"flip_rotate", "rot90_flip", "norm", "fedrdn", "fedrdn_v"})
#: the local updates whose training is the default local step
_UPDATES = (FedAvgClient.local_update, FedProxClient.local_update)
#: penalties that read no data (FedProx's proximal term reads the weights only)
_PENALTIES = (Algorithm.penalty, FedProxClient.penalty)


def _model_refusal(cfg: RunConfig, model: FedModel) -> str | None:
    from opacus.validators import ModuleValidator

    errors = ModuleValidator.validate(model, strict=False)
    if not errors:
        return None
    first = str(errors[0]).split(". ")[0].strip()
    return (
        f"{KEY}: example-level DP-SGD needs per-example gradients, which Opacus cannot give "
        f"for model {cfg.model.name!r} ({len(errors)} layer(s); first: {first}); set "
        f"model.norm=none (every normalisation layer removed), choose another model, {NONE}"
    )


def _algorithm_refusal(algo: Algorithm) -> str | None:
    cls, name = type(algo), algo.name
    for hook in ("local_train", "loss", "before_step"):
        if getattr(cls, hook) is not getattr(Algorithm, hook):
            return (
                f"{KEY}: {name} defines its own {hook!r}, and DP-SGD clips the per-example "
                "gradients of the default local step only (the task loss, one optimiser step a "
                f"batch); choose fedavg, fedprox, fedrdn or another method on that step, {NONE}"
            )
    if algo.sam_rho:
        return (
            f"{KEY}: {name}'s sharpness-aware pass takes a second gradient that DP-SGD does "
            f"not clip; choose a method without it (fedavg, fedprox), {NONE}"
        )
    if not any(cls.local_update is u for u in _UPDATES):
        return (
            f"{KEY}: {name} has its own local update, which DP-SGD cannot vouch for (only "
            f"FedAvg's and FedProx's are its default local step); choose one of them, {NONE}"
        )
    if not any(cls.penalty is p for p in _PENALTIES):
        return (
            f"{KEY}: {name}'s penalty may read the site's data, which DP-SGD adds after the "
            f"noise; choose fedavg or fedprox, {NONE}"
        )
    return None


def _augment_refusal(composed: Composition) -> str | None:
    for a in composed.augments:
        stats = getattr(a.params, "stats", "fixed")
        if a.name not in PER_EXAMPLE_AUGMENTS or stats != "fixed" and a.name == "norm":
            why = (
                "normalises with the site's own statistics, which every example shares"
                if a.name == "norm"
                else "is not an input transform of one example at a time (it mixes a batch's "
                "examples or changes the model or the objective)"
            )
            return (
                f"{KEY}: augment {a.name!r} {why}, so one example would reach the others' "
                f"gradients and DP-SGD's per-example clipping bounds nothing; remove it "
                f"(per-example augments: {', '.join(sorted(PER_EXAMPLE_AUGMENTS))}), {NONE}"
            )
    return None


def _record_refusal(composed: Composition, model: FedModel) -> str | None:
    ups = [d for d in composed.disclosures(model) if d.direction == UP]
    if not any(d.record == "weights" for d in ups):
        sent = ", ".join(sorted({repr(d.record) for d in ups})) or "nothing"
        return (
            f"{KEY}: {composed.algo.name} sends no shared weights (it sends {sent}); DP-SGD "
            f"protects the weights a site trains and sends; choose a method that sends them, "
            f"{NONE}"
        )
    for d in ups:
        if d.when is When.SETUP:  # privacy.epsilon's records, or refused by it
            continue
        if d.record == "weights" and d.kind is Kind.PARAMETERS:
            continue
        if d.needs_protection and d.clip is not None:
            continue  # a statistic privacy.epsilon protects
        return (
            f"{KEY}: {d.source or 'the method'} sends record {d.record!r} ({d.kind}) besides "
            "the weights, which DP-SGD does not cover and privacy.epsilon does not protect; "
            f"choose a method whose replies are its weights (and protected statistics), {NONE}"
        )
    return None


def _setting_refusal(cfg: RunConfig, task: str) -> str | None:
    t = cfg.train
    if task != "classification" and t.loss != "ce":
        return (
            f"config key 'train.loss': DP-SGD (privacy.updates=example) needs a mean of "
            f"per-example losses; {t.loss} on segmentation mixes a batch's images (its Dice "
            f"is over the batch); set train.loss=ce, {NONE}"
        )
    if cfg.run.executor == "vmap":
        return (
            "config key 'run.executor': vmap steps its own vectorised SGD, not DP-SGD's "
            "per-example clipping; use run.executor=sequential with privacy.updates=example"
        )
    if t.trainable == "head" and t.trunk_cache:
        return (
            "config key 'train.trunk_cache': the cached trunk trains the head on its own "
            "batches, not DP-SGD's Poisson-sampled ones; set train.trunk_cache=false with "
            "privacy.updates=example"
        )
    if cfg.federation.secure_aggregation:
        return (
            f"{KEY}: example-level DP-SGD is not available together with "
            "federation.secure_aggregation yet; set one of them off"
        )
    return None


def example_refusal(
    cfg: RunConfig, composed: Composition, model: FedModel, task: str
) -> str | None:
    """Why ``privacy.updates=example`` cannot protect this run (module docstring), or None:
    one line naming the key and a fix."""
    algo = composed.algo
    return (
        _setting_refusal(cfg, task)
        or _algorithm_refusal(algo)
        or _record_refusal(composed, model)
        or _augment_refusal(composed)
        or _model_refusal(cfg, model)
    )


def check_steps(ctx: ClientContext) -> None:
    """After a client's round under DP-SGD: it took the planned steps through DP-SGD."""
    if ctx.dpsgd is None:
        return
    took, want = ctx.scratch.get(DPSGD_STEPS), ctx.planned_steps()
    if took != want:
        raise FedshiftError(
            f"round {ctx.round}: client {ctx.cid!r} trained outside DP-SGD ({took} DP-SGD "
            f"step(s), {want} planned), so privacy.updates=example would not cover its "
            "weights; the run stops (a local loop that bypasses the default step)"
        )
