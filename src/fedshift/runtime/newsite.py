"""What a site that never trained gets from a finished run (a :class:`SavedRun`): the
model of an algorithm that keeps client-local tensors (:func:`new_site_weights`) and AdaBN's
BN statistics re-estimated on the site's images (:func:`adabn`). Used by
``fedshift protocol new-site`` (:mod:`fedshift.protocols.new_site`, its ``global`` and
``adabn`` variants) and by ``fedshift export --adabn DIR`` (:mod:`fedshift.runtime.export`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from fedshift.models.base import tracking_bn

__all__ = ["adabn", "new_site_weights"]


def new_site_weights(sim: Any) -> dict[str, torch.Tensor]:
    """The model a site that never trained takes from a run whose algorithm keeps
    client-local tensors (FedBN, FRAug, DisTrans: ``has_new_site_answer``): every source's
    personal model, the tensors in which they differ (the local ones: BN tensors, DisTrans's
    offset) replaced by their uniform mean over the sources, the others (the shared layers,
    equal in every source) taken as they are. Integer tensors (BN's batch counters) are taken
    from the first source."""
    sources = list(sim.train_clients)
    per = [sim.weights_for(c, "personal") for c in sources]
    out = {}
    for k, v in per[0].items():
        same = all(torch.equal(v, p[k]) for p in per[1:])
        if same or not v.is_floating_point():
            out[k] = v.clone()
        else:
            out[k] = torch.stack([p[k].double() for p in per]).mean(0).to(v.dtype)
    return out


@torch.no_grad()
def adabn(
    model: nn.Module,
    x: torch.Tensor,
    prepare: Any,
    batch_size: int,
    device: torch.device,
) -> bool:
    """AdaBN: re-estimate every BN layer's running statistics on the images ``x`` (through
    ``prepare``, the site's input pipeline). The statistics are reset and accumulated with
    ``momentum=None`` (PyTorch's cumulative moving average: each batch weighs 1/t of the
    running value at its t-th step, so equal batches give the plain mean of the batch
    means and of the unbiased batch variances); only the BN layers are in training mode,
    the rest (dropout, FedFA's FFA layers) stays in eval mode; no gradient, no weight
    changes. Returns False (and does nothing) when the model has no such layer."""
    layers = tracking_bn(model)
    if not layers:
        return False
    momenta = [m.momentum for m in layers]
    model.eval()
    for m in layers:
        m.reset_running_stats()
        m.momentum = None
        m.train()
    try:
        for i in range(0, len(x), batch_size):
            model(prepare(x[i : i + batch_size].to(device)))
    finally:
        for m, mom in zip(layers, momenta, strict=True):
            m.momentum = mom
        model.eval()
    return True


def adapted_weights(sim: Any, images: torch.Tensor, states: dict | None) -> dict[str, torch.Tensor]:
    """The weights a new site whose (unlabelled) images are ``images`` takes with AdaBN, as
    ``fedshift protocol new-site``'s ``adabn`` variant computes them: the global model (or,
    for an algorithm that keeps client-local tensors and has a rule for a new site,
    :func:`new_site_weights`) with every tracked BN layer's running statistics re-estimated
    on ``images`` through the site's input pipeline (its augments' ``states``), in batches of
    the run's ``eval.batch_size``. On the CPU; the run's working model is left loaded with
    them."""
    from fedshift.core.errors import FedshiftError

    algo = sim.algo
    if algo.has_global_model:
        base = sim.weights_for(next(iter(sim.train_clients)), "global")
    elif algo.algo.has_new_site_answer():
        base = new_site_weights(sim)
    else:
        raise FedshiftError(
            f"--adabn: algorithm {sim.cfg.algorithm.name!r} keeps client-local tensors and has "
            "no rule for a site that never trained, so there is no model to adapt"
        )
    model = sim.model
    model.load_state_dict(base)

    def prepare(x: torch.Tensor) -> torch.Tensor:
        return sim.pipeline.eval(x, states)

    if not adabn(model, images, prepare, sim.exp.eval_batch_size, sim.device):
        raise FedshiftError(
            f"--adabn: model {sim.cfg.model.name!r} has no BatchNorm layer with running "
            "statistics to re-estimate (AdaBN needs one); export without --adabn"
        )
    return {k: v.detach().to("cpu").clone().contiguous() for k, v in model.state_dict().items()}
