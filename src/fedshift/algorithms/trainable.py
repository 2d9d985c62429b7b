"""Which of a model's tensors a federation trains (``train.trainable``), and keeping the
rest frozen.

Starting from a pretrained backbone, the field trains a fraction of it: the classification
head only (a linear probe), the batch-norm layers (affine parameters and running
statistics), or both. ``train.trainable`` names that fraction:

* ``all`` (default): every tensor trains, as before;
* ``head``: the classifier (``FedModel.classifier``) only; the trunk is frozen;
* ``bn``: every batch-norm layer's tensors only;
* ``bn+head``: both;
* ``adapters``: residual adapters after the model's stages, and the classifier;
* ``lora``: low-rank updates of its convolution and linear weights, and the classifier
  (both added when the experiment is built: :mod:`fedshift.models.peft`).

A frozen tensor is frozen everywhere: its parameter has ``requires_grad=False`` (no
optimiser, weight decay or gradient correction reaches it), the modules outside the trained
part that behave differently in training (batch norm, dropout) run in evaluation mode (a
frozen BN layer normalises with its running statistics and never updates them, as a linear
probe on a pretrained trunk does), it is not a shared key (:attr:`Algorithm.shared_keys`:
it never crosses the wire and is not charged to a payload or a privacy budget) and not a
local key. Every process builds the same initial model (the seeded initialisation or
``model.weights``), so every copy of a frozen tensor is the same without communication;
:class:`Frozen` keeps one copy with the algorithm to complete a model loaded from shared
and local tensors, and checks at the end of a run that the evaluated models still hold it
(``summary.json``: ``trainable``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

import torch
from torch import nn

from fedshift.algorithms.bn import bn_layers
from fedshift.core.errors import ConfigError, FedshiftError

__all__ = ["TRAINABLE", "Frozen", "Trainable", "frozen_keys", "trained_modules"]

Trainable = Literal["all", "head", "bn", "bn+head", "adapters", "lora"]
TRAINABLE: tuple[str, ...] = ("all", "head", "bn", "bn+head", "adapters", "lora")
#: the modes that add layers to the model (:func:`fedshift.models.peft.add_peft`), trained
#: with the classifier: the model's module holding them
ADDED = {"adapters": "adapters", "lora": "lora"}

#: modules whose forward pass depends on ``training``: run in evaluation mode when frozen
_MODE_DEPENDENT = (nn.modules.batchnorm._BatchNorm, nn.modules.dropout._DropoutNd)


def trained_modules(model: nn.Module, trainable: str) -> list[str]:
    """Qualified names of the modules whose tensors train under ``trainable`` (none for
    ``all``: every tensor trains). Refuses, naming ``train.trainable``, a model without the
    part the mode names (no ``classifier`` module, no batch-norm layer with tensors)."""
    if trainable not in TRAINABLE:
        raise ConfigError(
            f"config key 'train.trainable': {trainable!r} is not one of {', '.join(TRAINABLE)}"
        )
    if trainable == "all":
        return []
    names: list[str] = []
    if trainable in ADDED:  # the model's (or, wrapped, its backbone's) added layers
        leaf = ADDED[trainable]
        added = [n for n, _ in model.named_modules() if n == leaf or n.endswith("." + leaf)]
        if not added:
            raise ConfigError(
                f"config key 'train.trainable={trainable}': model {type(model).__name__} has "
                f"no `{leaf}` module (fedshift.models.peft adds it when the experiment is "
                "built)"
            )
        names.extend(added)
    if "head" in trainable.split("+") or trainable in ADDED:
        if not isinstance(getattr(model, "classifier", None), nn.Module):
            raise ConfigError(
                f"config key 'train.trainable={trainable}': model {type(model).__name__} has "
                "no `classifier` module (the head a FedModel names); use train.trainable=all"
            )
        names.append("classifier")
    if "bn" in trainable.split("+"):
        layers = bn_layers(model)
        with_tensors = [n for n in layers if _tensors_of(model.get_submodule(n))]
        if not with_tensors:
            raise ConfigError(
                f"config key 'train.trainable={trainable}': model {type(model).__name__} has "
                "no batch-norm layer with tensors to train (a normalisation-free model, or "
                "model.bn=harmofl: BatchNorm without affine parameters or running "
                "statistics); choose train.trainable=head or all"
            )
        names.extend(with_tensors)
    return names


def _tensors_of(module: nn.Module) -> list[str]:
    return [k for k, _ in module.state_dict().items()]


def _inside(name: str, modules: list[str]) -> bool:
    return any(name == m or name.startswith(m + ".") for m in modules)


def frozen_keys(model: nn.Module, trainable: str, keep: tuple[str, ...] = ()) -> list[str]:
    """State-dict keys of ``model`` that ``trainable`` freezes, in state-dict order (empty
    for ``all``); ``keep``: the method's own tensors that train in every mode, as
    state-dict keys or module prefixes (DisTrans's offset, FedCLIP's adapter)."""
    trained = trained_modules(model, trainable)
    if not trained:
        return []
    return [
        k for k in model.state_dict()
        if not _inside(k, list(keep)) and not _inside(k.rpartition(".")[0], trained)
    ]  # fmt: skip


def _eval_mode(module: nn.Module, args: object) -> None:
    """Forward pre-hook of a frozen mode-dependent module: evaluation mode whatever the
    model's mode (a module-level function: the model stays picklable and deep-copyable)."""
    module.training = False


class Frozen:
    """The frozen part of a run's model (module docstring): built once by the algorithm from
    the initial model, which it freezes in place."""

    def __init__(self, model: nn.Module, trainable: str, keep: tuple[str, ...] = ()) -> None:
        self.mode = trainable
        self.keys: list[str] = frozen_keys(model, trainable, keep)
        state = model.state_dict()
        #: the frozen tensors' values at the start (detached copies)
        self.tensors: dict[str, torch.Tensor] = {k: state[k].detach().clone() for k in self.keys}
        if not self.keys:
            return
        trained = trained_modules(model, trainable) + list(keep)
        frozen = set(self.keys)
        for name, p in model.named_parameters():
            if name in frozen:
                p.requires_grad_(False)
        for name, m in model.named_modules():
            if isinstance(m, _MODE_DEPENDENT) and not _inside(name, trained):
                m.register_forward_pre_hook(_eval_mode)

    def __bool__(self) -> bool:
        return bool(self.keys)

    def complete(self, tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """``tensors`` (shared and local keys) with the frozen tensors added: a whole model's
        state dict."""
        return {**self.tensors, **tensors} if self.keys else dict(tensors)

    def check(self, weights: Mapping[str, torch.Tensor], what: str) -> None:
        """Raise :class:`FedshiftError` where ``weights`` (an evaluated model's state dict)
        no longer hold the frozen tensors exactly: a method that changed a frozen tensor
        (its refusal is missing)."""
        moved = [
            k for k in self.keys
            if k in weights and not torch.equal(weights[k].detach().cpu(), self.tensors[k].cpu())
        ]  # fmt: skip
        if moved:
            raise FedshiftError(
                f"train.trainable={self.mode}: {what} changed {len(moved)} frozen tensor(s) "
                f"({', '.join(moved[:3])}{', ...' if len(moved) > 3 else ''}); this method "
                "cannot train a part of the model: report it, and use train.trainable=all"
            )

    def at_end(self, server: Mapping[str, object], model: nn.Module) -> dict | None:
        """``summary.json``'s ``trainable`` (None when every tensor trains), after checking
        that the server's model (``server["weights"]``, where it keeps one) and the working
        model still hold the frozen tensors."""
        if not self.keys:
            return None
        weights = server.get("weights")
        if isinstance(weights, dict):
            self.check(weights, "the server's model")
        self.check(model.state_dict(), "local training")
        return self.report(model)

    def report(self, model: nn.Module) -> dict[str, object]:
        """``summary.json``'s ``trainable``: the mode and how many tensors/parameters train
        and stay frozen."""
        state = model.state_dict()
        frozen = set(self.keys)
        return {
            "mode": self.mode,
            "frozen_tensors": len(self.keys),
            "frozen_values": sum(state[k].numel() for k in self.keys),
            "trained_tensors": sum(1 for k in state if k not in frozen),
            "trained_values": sum(v.numel() for k, v in state.items() if k not in frozen),
        }
