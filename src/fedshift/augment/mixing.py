"""Centralised-learning augmentations that FedFA and FedRDN compare against, as plug-ins:
mixup, Manifold Mixup, MixStyle and MoEx. None of them communicates anything.

* ``mixup`` (Zhang et al., "mixup: Beyond Empirical Risk Minimization", ICLR 2018):
  x~ = lam x_i + (1 - lam) x_j, y~ = lam y_i + (1 - lam) y_j with lam ~ Beta(alpha, alpha) and
  j a random permutation of the batch (the paper's Sec. 2 equations). Input level.
* ``manifold_mixup`` (Verma et al., "Manifold Mixup", ICML 2019, Sec. 2): the same mixing of
  the hidden representation g_k(x) at a layer k drawn uniformly from an eligible set S
  (the input counts as layer 0), with the labels mixed by the same lam and permutation.
* ``mixstyle`` (Zhou et al., "Domain Generalization with MixStyle", ICLR 2021, Sec. 3):
  gamma_mix = lam sigma(x) + (1 - lam) sigma(x~), beta_mix = lam mu(x) + (1 - lam) mu(x~),
  MixStyle(x) = gamma_mix (x - mu(x)) / sigma(x) + beta_mix, with instance statistics over
  H x W, lam ~ Beta(alpha, alpha) per example, x~ a shuffled batch, applied with probability p
  after chosen stages. Labels are unchanged.
* ``moex`` (Li et al., "On Feature Normalization and Data Augmentation", CVPR 2021, Sec. 3):
  h_A^(B) = sigma_B (h_A - mu_A) / sigma_A + mu_B with positional moments (PONO: mean and
  std over the channels at each position), and the loss lam l(y_A) + (1 - lam) l(y_B),
  i.e. soft labels lam y_A + (1 - lam) y_B; applied with probability p at an early stage.

Label-mixing augments return soft labels (N, classes) that the local cross-entropy takes as
probabilities; a soft label coming from an earlier augment is mixed again (they compose).

Randomness: every draw (lam, the permutation, the stage, whether to fire) is made in
``train_batch`` from the client's batch generator, so runs are deterministic. Beta draws use a
NumPy generator seeded from that torch generator (torch's Beta sampler takes no generator).
Feature-level augments store their draws on the augment for the coming forward pass; their
stage hooks (installed by ``attach``, composed with any hook already on the stage) apply them
only while the model is in training mode and the batch size matches. The draws stay until the
next ``train_batch``, so a second forward of the same batch (the SAM second pass) mixes the
same way. At evaluation (``model.eval()``) every augment here is the identity.

Released-code facts used (the papers leave them open): MixStyle's statistics use the unbiased
variance + eps 1e-6 and are detached from the graph (``detach=True``); MoEx uses the unbiased
variance + eps 1e-5 and keeps gradients through the moments.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F

from fedshift.augment.base import Augment, State
from fedshift.core.bounds import bounded
from fedshift.core.errors import ConfigError
from fedshift.models.base import FedModel

#: algorithms whose local objective indexes by the integer label (soft labels break them)
HARD_LABEL_ALGORITHMS = ("fedproto", "fpl")
INPUT = "input"

Hook = Callable[[torch.Tensor], torch.Tensor]


# ----------------------------------------------------------------------------- helpers
def as_probs(y: torch.Tensor, num_classes: int) -> torch.Tensor:
    """Integer labels -> one-hot float rows; probability rows pass through unchanged."""
    if y.ndim == 1:
        return F.one_hot(y.long(), num_classes).float()
    return y


def mix_labels(
    y: torch.Tensor, perm: torch.Tensor, lam: float | torch.Tensor, num_classes: int
) -> torch.Tensor:
    """lam * y + (1 - lam) * y[perm] as probability rows (lam scalar or per example)."""
    p = as_probs(y, num_classes)
    lam_t = torch.as_tensor(lam, dtype=p.dtype, device=p.device)
    if lam_t.ndim == 1:
        lam_t = lam_t[:, None]
    return lam_t * p + (1 - lam_t) * p[perm.to(p.device)]


def sample_beta(alpha: float, size: int, generator: torch.Generator) -> np.ndarray:
    """``size`` draws of Beta(alpha, alpha) from a NumPy generator seeded by ``generator``;
    alpha = 0 gives lam = 1 (no mixing), as in the mixup paper's convention."""
    if alpha <= 0:
        return np.ones(size)
    seed = int(torch.randint(0, 2**62, (1,), generator=generator))
    return np.random.default_rng(seed).beta(alpha, alpha, size)


def uniform(generator: torch.Generator) -> float:
    return float(torch.rand((), generator=generator))


def default_stages(names: list[str]) -> list[str]:
    """The first half of a model's stages (rounded up): ResNet's res1-res2 of four (MixStyle's
    default), conv1 of the 2-stage CNN, conv1-conv2 of DigitModel."""
    return names[: math.ceil(len(names) / 2)]


def resolve_stages(model: FedModel, wanted: list[str] | None, who: str) -> list[str]:
    names = model.stage_names
    stages = default_stages(names) if wanted is None else list(wanted)
    unknown = [s for s in stages if s not in names]
    if unknown:
        raise ConfigError(
            f"augment '{who}': unknown stage(s) {unknown}; this model's stages are {names}"
        )
    return stages


def add_stage_hook(model: FedModel, stage: str, hook: Hook) -> None:
    """Install ``hook`` on ``stage``, after any hook already there (composition, never an
    overwrite: FedFA's FFA layer and MixStyle may share a stage)."""
    prev = model.stage_hooks.get(stage)
    if prev is None:
        model.stage_hooks[stage] = hook
    else:

        def composed(x: torch.Tensor, prev: Hook = prev, hook: Hook = hook) -> torch.Tensor:
            return hook(prev(x))

        model.stage_hooks[stage] = composed


class _MixesLabels(Augment):
    """Shared config check of the label-mixing augments."""

    tasks = ("classification",)  # they mix one label per image

    @classmethod
    def check(cls, params: Any, algorithm: str, others: list[str]) -> None:
        if algorithm in HARD_LABEL_ALGORITHMS:
            raise ConfigError(
                f"augment '{cls.name}' returns soft (mixed) labels, but algorithm '{algorithm}' "
                "needs each example's integer class (it pulls the embedding towards its "
                "class's prototype); use a label-preserving augment such as 'mixstyle'"
            )


# ----------------------------------------------------------------------------- mixup
@dataclass
class MixupParams:
    # Beta(alpha, alpha); the mixup paper uses 0.1-0.4 on ImageNet and 1.0 on CIFAR.
    alpha: float = bounded(0.2, ge=0)


class Mixup(_MixesLabels):
    """mixup (Zhang et al., ICLR 2018): convex combinations of input pairs and their labels."""

    name = "mixup"
    Params = MixupParams

    def train_batch(
        self, x: torch.Tensor, y: torch.Tensor, state: State, generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        lam = float(sample_beta(self.params.alpha, 1, generator)[0])
        perm = torch.randperm(x.shape[0], generator=generator).to(x.device)
        return lam * x + (1 - lam) * x[perm], mix_labels(y, perm, lam, self.num_classes)


# ----------------------------------------------------------------------------- manifold mixup
@dataclass
class ManifoldMixupParams:
    # Beta(alpha, alpha); Verma et al. use 2.0 for Manifold Mixup on CIFAR.
    alpha: float = bounded(2.0, ge=0)
    # eligible hidden stages (None: the first half of the model's stages, like the paper's
    # S = {0, 1, 2} of a PreActResNet: the input and the first two of four block groups)
    stages: list[str] | None = None
    # the input (layer 0) is in the eligible set, as in the paper
    include_input: bool = True


@dataclass
class _Pending:
    """Draws made in ``train_batch`` for the coming forward pass of a batch of ``n``."""

    n: int
    perm: torch.Tensor
    lam: float | torch.Tensor = 1.0
    stage: str | None = None
    fire: bool = True


class ManifoldMixup(_MixesLabels):
    """Manifold Mixup (Verma et al., ICML 2019): mixup of the representation at a random
    eligible layer, labels mixed with the same lam and permutation."""

    name = "manifold_mixup"
    Params = ManifoldMixupParams

    @classmethod
    def check(cls, params: Any, algorithm: str, others: list[str]) -> None:
        super().check(params, algorithm, others)
        if params.stages is not None and not params.stages and not params.include_input:
            raise ConfigError(
                "augment 'manifold_mixup': no eligible layer (stages=[] and include_input=false)"
            )

    def __init__(self, params: Any, seed: int, num_classes: int) -> None:
        super().__init__(params, seed, num_classes)
        self.eligible: list[str] = []
        self.pending: _Pending | None = None

    def attach(self, model: FedModel) -> None:
        stages = resolve_stages(model, self.params.stages, self.name)
        self.eligible = ([INPUT] if self.params.include_input else []) + stages
        if not self.eligible:
            raise ConfigError("augment 'manifold_mixup': no eligible layer")
        for stage in stages:
            add_stage_hook(model, stage, self._hook(model, stage))

    def _hook(self, model: FedModel, stage: str) -> Hook:
        def hook(h: torch.Tensor) -> torch.Tensor:
            p = self.pending
            if not model.training or p is None or p.stage != stage or h.shape[0] != p.n:
                return h
            perm = p.perm.to(h.device)
            return p.lam * h + (1 - p.lam) * h[perm]

        return hook

    def train_batch(
        self, x: torch.Tensor, y: torch.Tensor, state: State, generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        k = int(torch.randint(len(self.eligible), (), generator=generator))
        stage = self.eligible[k]
        lam = float(sample_beta(self.params.alpha, 1, generator)[0])
        # drawn on the (CPU) generator, moved once to the batch's device (not in every hook)
        perm = torch.randperm(x.shape[0], generator=generator).to(x.device)
        y_mix = mix_labels(y, perm, lam, self.num_classes)
        if stage == INPUT:
            self.pending = None
            return lam * x + (1 - lam) * x[perm], y_mix
        self.pending = _Pending(n=x.shape[0], perm=perm, lam=lam, stage=stage)
        return x, y_mix


# ----------------------------------------------------------------------------- MixStyle
@dataclass
class MixStyleParams:
    p: float = bounded(0.5, ge=0, le=1)  # probability of mixing, one draw per stage per batch
    alpha: float = bounded(0.1, ge=0)  # Beta(alpha, alpha) for the per-example lam
    eps: float = bounded(1e-6, gt=0)
    # stages after which to mix (None: the first half of the model's stages; the paper's
    # default for ResNet is after res1 and res2 of four)
    stages: list[str] | None = None
    # stop gradients through mu and sigma (released code)
    detach: bool = True


def mixstyle(
    h: torch.Tensor, perm: torch.Tensor, lam: torch.Tensor, eps: float, detach: bool = True
) -> torch.Tensor:
    """MixStyle: normalise each instance with its own (mu, sigma) over H x W and re-style it
    with gamma_mix = lam sigma + (1 - lam) sigma[perm], beta_mix = lam mu + (1 - lam) mu[perm].
    ``lam`` has one value per example; sigma = sqrt(unbiased var + eps)."""
    mu = h.mean(dim=(2, 3), keepdim=True)
    sig = (h.var(dim=(2, 3), keepdim=True) + eps).sqrt()
    if detach:
        mu, sig = mu.detach(), sig.detach()
    lam = lam.to(h.device, h.dtype).view(-1, 1, 1, 1)
    perm = perm.to(h.device)
    mu_mix = lam * mu + (1 - lam) * mu[perm]
    sig_mix = lam * sig + (1 - lam) * sig[perm]
    return (h - mu) / sig * sig_mix + mu_mix


class MixStyle(Augment):
    """MixStyle (Zhou et al., ICLR 2021): mixes instance-level feature statistics between
    examples of a batch after early stages, training only; labels unchanged."""

    name = "mixstyle"
    Params = MixStyleParams

    def __init__(self, params: Any, seed: int, num_classes: int) -> None:
        super().__init__(params, seed, num_classes)
        self.stages: list[str] = []
        self.pending: dict[str, _Pending] = {}

    def attach(self, model: FedModel) -> None:
        self.stages = resolve_stages(model, self.params.stages, self.name)
        for stage in self.stages:
            add_stage_hook(model, stage, self._hook(model, stage))

    def _hook(self, model: FedModel, stage: str) -> Hook:
        def hook(h: torch.Tensor) -> torch.Tensor:
            p = self.pending.get(stage)
            if not model.training or p is None or not p.fire or h.shape[0] != p.n:
                return h
            if h.ndim != 4:
                raise ValueError(f"mixstyle needs (N, C, H, W) features at stage {stage!r}")
            return mixstyle(h, p.perm, p.lam, self.params.eps, self.params.detach)

        return hook

    def train_batch(
        self, x: torch.Tensor, y: torch.Tensor, state: State, generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        n = x.shape[0]
        self.pending = {}
        for stage in self.stages:
            fire = uniform(generator) < self.params.p
            if fire:
                # moved once to the batch's device (the hook may run more than once)
                beta = sample_beta(self.params.alpha, n, generator)
                lam = torch.as_tensor(beta).float().to(x.device)
                perm = torch.randperm(n, generator=generator).to(x.device)
                self.pending[stage] = _Pending(n=n, perm=perm, lam=lam, fire=True)
        return x, y


# ----------------------------------------------------------------------------- MoEx
@dataclass
class MoExParams:
    # weight of the original label; the paper's ImageNet setting (lam 0.9, p 1). Its CIFAR
    # setting is lam 0.5, p 0.25.
    lam: float = bounded(0.9, ge=0, le=1)
    p: float = bounded(1.0, ge=0, le=1)
    # stage whose output exchanges moments (None: the first stage, as early as the paper puts it)
    stage: str | None = None
    # "pono": positional moments over channels (paper default); "in": instance moments over H x W
    norm: Literal["pono", "in"] = "pono"
    eps: float = bounded(1e-5, gt=0)


def moment_exchange(
    h: torch.Tensor, perm: torch.Tensor, norm: str = "pono", eps: float = 1e-5
) -> torch.Tensor:
    """MoEx: h_A^(B) = sigma_B (h_A - mu_A) / sigma_A + mu_B, where B = perm(A) and the
    moments are positional (over channels, PONO) or instance (over H x W); sigma =
    sqrt(unbiased var + eps). Gradients flow through the moments."""
    dims = (1,) if norm == "pono" else (2, 3)
    mu = h.mean(dim=dims, keepdim=True)
    sig = (h.var(dim=dims, keepdim=True) + eps).sqrt()
    perm = perm.to(h.device)
    return (h - mu) / sig * sig[perm] + mu[perm]


class MoEx(_MixesLabels):
    """Moment exchange (Li et al., CVPR 2021): each example takes the early-layer moments of
    another; the label is lam * own + (1 - lam) * other's."""

    name = "moex"
    Params = MoExParams

    def __init__(self, params: Any, seed: int, num_classes: int) -> None:
        super().__init__(params, seed, num_classes)
        self.stage = ""
        self.pending: _Pending | None = None

    def attach(self, model: FedModel) -> None:
        wanted = None if self.params.stage is None else [self.params.stage]
        stages = resolve_stages(model, wanted, self.name)
        self.stage = stages[0] if wanted else model.stage_names[0]
        add_stage_hook(model, self.stage, self._hook(model))

    def _hook(self, model: FedModel) -> Hook:
        def hook(h: torch.Tensor) -> torch.Tensor:
            p = self.pending
            if not model.training or p is None or h.shape[0] != p.n:
                return h
            if h.ndim != 4:
                raise ValueError(f"moex needs (N, C, H, W) features at stage {self.stage!r}")
            return moment_exchange(h, p.perm, self.params.norm, self.params.eps)

        return hook

    def train_batch(
        self, x: torch.Tensor, y: torch.Tensor, state: State, generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        self.pending = None
        if uniform(generator) >= self.params.p:
            return x, y
        perm = torch.randperm(x.shape[0], generator=generator).to(x.device)
        self.pending = _Pending(n=x.shape[0], perm=perm, stage=self.stage)
        return x, mix_labels(y, perm, self.params.lam, self.num_classes)
