"""FedSR (Nguyen, Torr, Lim, "FedSR: A Simple and Effective Domain Generalization Method for
Federated Learning", NeurIPS 2022).

FedAvg with a *probabilistic* representation and two regularisers of the local objective.

The representation (released code ``src/methods/base.py``, ``featurize``). The
backbone's embedding h(x) is mapped by one linear layer to 2 * z_dim numbers, split into a mean
mu(x) and a scale sigma(x) = softplus(.); the representation is z ~ N(mu, diag sigma^2), drawn
by reparameterisation z = mu + sigma * eps, eps ~ N(0, I) (one draw per example in training),
and the classifier is linear on z. z_dim defaults to the backbone's embedding width (the
released README's: 512 for ResNet-18, 2048 for ResNet-50, whose last ``fc`` the released code
replaces by that layer).

The local objective (the L2R and CMI regularisers the paper's abstract names; section and
equation numbers unverified: the paper text is not obtainable offline, only its abstract; the
forms below are the released code's ``src/methods/FedSR.py``, ``train_client``):

  L = CE(cls(z), y) + alpha_L2R * L2R + alpha_CMI * CMI

* L2R = 1/B sum_i ||z_i||_2 (the released code: the norm, not squared; ``l2r=squared``
  gives 1/B sum_i ||z_i||_2^2, the other reading of the paper's "L2-norm regulariser");
* CMI = 1/B sum_i KL( N(C mu_i, diag (C sigma_i)^2) || r(z | y_i) ), an upper bound of the
  conditional mutual information I(x; z | y), with learnable class-conditional reference
  distributions r(z | y) = N(r_mu[y], diag softplus(r_sigma[y])^2) and a learnable scalar C;
  per example the closed-form Gaussian KL summed over the z dimensions:
  log s_r - log s_z + (s_z^2 + (m_z - m_r)^2) / (2 s_r^2) - 1/2.
  r_mu starts at 0, r_sigma at 1 (softplus(1) = 1.313) and C at 1; they are trained by the
  client's optimiser together with the model (the released code adds them to the same SGD).

Where the reference parameters live (``reference``). In the released code r_mu, r_sigma and C
are attributes of the client's object but not of the model that ``communicate`` averages, so
each client keeps its own (``local``, the default: the authors' code, and the paper text that
might say otherwise is not obtainable). FL-bench makes them model parameters, so they are
averaged with the model (``averaged``: sent up as record ``reference``, averaged with the
aggregation weights, sent down with the weights). They never enter the prediction, so either
way the run has one global model.

Prediction (released ``forward``). In training mode one draw of z; in evaluation mode
(``prediction=sampled``, the default) ``num_samples`` draws per example (released default 20),
the classifier's softmax averaged over the draws and the log of that mean returned as the
scores (its argmax is the prediction; its cross-entropy is -log of the mean probability).
``prediction=mean`` classifies mu (deterministic). The evaluation draws come from a generator
seeded with a fixed seed at every forward call, never from torch's global generator, so an
evaluation is a function of the weights alone and leaves training's random stream untouched.
``features(x)`` is one draw of z in training mode and mu in evaluation mode (what t-SNE plots
and the new-site protocol embed).

Aggregation. The released ``communicate`` averages the source clients' models with equal
weights (``paper_weighting = "uniform"``); training takes E = 5 local *steps* per round
(``train.local_steps=5``), SGD lr 0.01, momentum 0.9, weight decay 5e-4, batch 64.

Defaults: alpha_L2R = 1e-2, alpha_CMI = 5e-4 (the released ``argument.py`` defaults; the
released README's PACS command uses alpha_CMI = 1e-3). ``representation=deterministic`` is the
released FedL2R variant (``src/methods/FedL2R.py``, an ablation): z is the posterior layer's
z_dim outputs themselves, no draw, only the L2R regulariser (``cmi_coeff`` must be 0). A
negative-entropy quantity the
released code logs is not part of the objective and is not computed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from fedshift.algorithms.base import FLParams, Reply, State
from fedshift.algorithms.fedavg import FedAvg
from fedshift.algorithms.state import StateVar, client_var, server_var
from fedshift.algorithms.tensors import clone
from fedshift.core.bounds import bounded
from fedshift.core.config import TrainConfig
from fedshift.core.context import ClientContext
from fedshift.core.disclosure import DOWN, UP, Disclosure, Kind, To, When, fixed, tensor_bytes
from fedshift.core.errors import ConfigError, TrainingError
from fedshift.core.federation import Federation
from fedshift.core.payload import Payload, Tensors
from fedshift.models.base import FedModel

#: ``ctx.scratch`` key of the round's reference parameters (r_mu, r_sigma, C) as nn.Parameters
REFERENCE = "fedsr/reference"
#: the seed of the evaluation draws (see the module doc)
EVAL_SEED = 0
REF_KEYS = ("r_mu", "r_sigma", "C")


@dataclass
class FedSRParams(FLParams):
    l2r_coeff: float = bounded(1e-2, ge=0)  # alpha_L2R (released argument.py)
    # alpha_CMI (released argument.py 5e-4; its README's PACS command 1e-3)
    cmi_coeff: float = bounded(5e-4, ge=0)
    z_dim: int | None = bounded(None, ge=1)  # None: the backbone's embedding width
    # "norm": 1/B sum ||z||_2 (released code); "squared": 1/B sum ||z||_2^2
    l2r: Literal["norm", "squared"] = "norm"
    # "local": each client keeps r_mu, r_sigma, C (released code); "averaged": FL-bench
    reference: Literal["local", "averaged"] = "local"
    # "sampled": log of the mean softmax over num_samples draws (released); "mean": cls(mu)
    prediction: Literal["sampled", "mean"] = "sampled"
    num_samples: int = bounded(20, ge=1)  # draws per example at evaluation (released 20)
    # "probabilistic": FedSR; "deterministic": z = a linear map of the embedding, L2R only
    # (the released FedL2R variant; needs cmi_coeff=0)
    representation: Literal["probabilistic", "deterministic"] = "probabilistic"


# ----------------------------------------------------------------------------- the equations
def gaussian_kl(
    mu_q: torch.Tensor, sigma_q: torch.Tensor, mu_p: torch.Tensor, sigma_p: torch.Tensor
) -> torch.Tensor:
    """Elementwise KL( N(mu_q, sigma_q^2) || N(mu_p, sigma_p^2) ) of univariate Gaussians:
    log sigma_p - log sigma_q + (sigma_q^2 + (mu_q - mu_p)^2) / (2 sigma_p^2) - 1/2."""
    return (
        torch.log(sigma_p)
        - torch.log(sigma_q)
        + (sigma_q**2 + (mu_q - mu_p) ** 2) / (2 * sigma_p**2)
        - 0.5
    )


def cmi_regulariser(
    mu: torch.Tensor,
    sigma: torch.Tensor,
    y: torch.Tensor,
    r_mu: torch.Tensor,
    r_sigma: torch.Tensor,
    scale: torch.Tensor,
) -> torch.Tensor:
    """CMI = 1/B sum_i sum_d KL( N(C mu_id, (C sigma_id)^2) || N(r_mu[y_i, d],
    softplus(r_sigma[y_i, d])^2) ) (see the module doc)."""
    kl = gaussian_kl(scale * mu, scale * sigma, r_mu[y], F.softplus(r_sigma)[y])
    return kl.sum(1).mean()


def l2r_regulariser(z: torch.Tensor, form: str = "norm") -> torch.Tensor:
    """L2R = 1/B sum_i ||z_i||_2 (``norm``) or 1/B sum_i ||z_i||_2^2 (``squared``)."""
    sq = (z**2).sum(1)
    return (sq if form == "squared" else sq.sqrt()).mean()


def standard_normal(
    shape: tuple[int, ...], generator: torch.Generator | None, like: torch.Tensor
) -> torch.Tensor:
    """eps ~ N(0, I) of ``shape`` on ``like``'s device and dtype, drawn from ``generator`` (on
    its own device, then moved) or torch's global generator when None."""
    if generator is None:
        return torch.randn(shape, device=like.device, dtype=like.dtype)
    eps = torch.randn(shape, generator=generator, device=generator.device, dtype=like.dtype)
    return eps.to(like.device)


def mean_softmax_scores(logits: torch.Tensor) -> torch.Tensor:
    """(S, B, K) logits of S draws -> (B, K) log of the softmax averaged over the draws."""
    return torch.log(torch.softmax(logits, dim=-1).mean(0))


# ----------------------------------------------------------------------------- the model
class FedSRModel(FedModel):
    """A backbone whose embedding h is mapped to (mu, sigma) of z (``posterior``: Linear(d,
    2 z_dim), sigma = softplus), with a linear classifier on z (see the module doc).

    The backbone is kept whole as ``base`` (its own ``features`` runs, so every FedModel
    works); its classifier is replaced by the identity. ``stages`` and ``stage_hooks`` are the
    backbone's, so stage-level augments attach as before."""

    classifier: nn.Linear  # the linear classifier on z

    def __init__(
        self,
        backbone: FedModel,
        embed_dim: int,
        z_dim: int,
        num_classes: int,
        prediction: str = "sampled",
        num_samples: int = 20,
        probabilistic: bool = True,
    ) -> None:
        super().__init__()
        backbone.classifier = nn.Identity()
        self.base = backbone
        self.stage_hooks = backbone.stage_hooks  # the same dict: hooks reach the backbone
        self.z_dim = z_dim
        self.probabilistic = probabilistic
        self.posterior = nn.Linear(embed_dim, (2 if probabilistic else 1) * z_dim)
        self.classifier = nn.Linear(z_dim, num_classes)
        self.prediction = prediction
        self.num_samples = num_samples

    @property
    def stages(self) -> nn.ModuleDict:  # type: ignore[override]
        return self.base.stages

    def distribution(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(mu, sigma) of z for input ``x``: the posterior layer on the backbone's embedding
        (a deterministic representation: (z, None))."""
        params = self.posterior(self.base.features(x))
        if not self.probabilistic:
            return params, None
        return params[:, : self.z_dim], F.softplus(params[:, self.z_dim :])

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """One draw of z (training mode, torch's global generator) or mu (evaluation)."""
        mu, sigma = self.distribution(x)
        if not self.training or sigma is None:
            return mu
        return mu + sigma * standard_normal(tuple(mu.shape), None, mu)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training or self.prediction == "mean" or not self.probabilistic:
            return self.head(self.features(x))
        mu, sigma = self.distribution(x)
        assert sigma is not None
        g = torch.Generator(device=mu.device).manual_seed(EVAL_SEED)
        eps = standard_normal((self.num_samples, *mu.shape), g, mu)
        return mean_softmax_scores(self.head(mu + sigma * eps))


def embedding_width(model: FedModel, input_shape: tuple[int, ...]) -> int:
    """The width of ``model.features``: its linear classifier's input, else one probe."""
    head = getattr(model, "classifier", None)
    if isinstance(head, nn.Linear):
        return int(head.in_features)
    was = model.training
    device = next(iter(model.state_dict().values())).device
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        model.eval()
        z = model.features(torch.zeros(2, *input_shape, device=device))
    model.train(was)
    if z.dim() != 2:
        raise ConfigError(
            f"algorithm 'fedsr' needs a model whose features() is one vector per image; "
            f"this model's has shape {tuple(z.shape)}"
        )
    return int(z.shape[1])


# ----------------------------------------------------------------------------- the algorithm
class FedSR(FedAvg[FedSRParams]):
    """FedAvg with FedSR's probabilistic representation and L2R + CMI regularisers."""

    name = "fedsr"
    tasks = ("classification",)  # r(z | y) and the CE need one label per image
    # released src/methods/base.py communicate: the plain mean over the source clients
    paper_weighting = "uniform"
    Params = FedSRParams

    @classmethod
    def wrap_model(cls, params: FedSRParams, model: FedModel, federation: Federation) -> FedModel:
        width = embedding_width(model, tuple(federation.input_shape))
        z_dim = params.z_dim if params.z_dim is not None else width
        return FedSRModel(
            model,
            width,
            z_dim,
            federation.num_classes,
            params.prediction,
            params.num_samples,
            probabilistic=params.representation == "probabilistic",
        )

    @classmethod
    def export_refusal(cls, params: FedSRParams) -> str | None:
        if params.prediction != "sampled" or params.representation != "probabilistic":
            return None
        return (
            "its sampled prediction (algorithm.prediction=sampled) draws its noise inside the "
            "forward pass from a torch.Generator seeded there, which torch.export cannot "
            "carry, and the draw an image gets depends on its batch; a run with "
            "algorithm.prediction=mean exports"
        )

    @classmethod
    def check(cls, params: FedSRParams, train: TrainConfig) -> None:
        if params.representation == "deterministic" and params.cmi_coeff:
            raise ConfigError(
                "config key 'algorithm.cmi_coeff': the CMI regulariser needs the probabilistic "
                "representation; with algorithm.representation=deterministic (FedL2R) set "
                f"algorithm.cmi_coeff=0 (got {params.cmi_coeff})"
            )
        if params.reference == "averaged" and not params.cmi_coeff:
            raise ConfigError(
                "config key 'algorithm.reference': 'averaged' has no effect with "
                "algorithm.cmi_coeff=0 (no reference distributions are trained); drop the key "
                "or set a CMI coefficient"
            )

    def setup(self, model: FedModel) -> None:
        if not isinstance(model, FedSRModel):
            raise ConfigError("algorithm 'fedsr' trains the model its wrap_model builds")
        self.z_dim = model.z_dim
        self.num_classes = int(model.classifier.out_features)
        #: the reference distributions exist (trained, kept, maybe sent) only with the CMI term
        self.reference: str | None = self.params.reference if self.params.cmi_coeff else None

    def initial_reference(self, device: torch.device) -> Tensors:
        """r_mu = 0, r_sigma = 1 (before softplus), C = 1 (the released initial values)."""
        k, d = self.num_classes, self.z_dim
        return {
            "r_mu": torch.zeros(k, d, device=device),
            "r_sigma": torch.ones(k, d, device=device),
            "C": torch.ones((), device=device),
        }

    # -- server ----------------------------------------------------------------------------
    def server_vars(self) -> list[StateVar]:
        if self.reference != "averaged":
            return super().server_vars()
        return [
            *super().server_vars(),
            server_var("reference", lambda at: self.initial_reference(torch.device("cpu")),
                       "mean", doc="reference=averaged: the sites' mean reference distribution"),
        ]  # fmt: skip

    def disclosures(self, model: FedModel) -> list[Disclosure]:
        out = self.weights_disclosures(model)
        if self.reference == "averaged":
            ref = fixed(tensor_bytes(self.initial_reference(torch.device("meta"))))
            out += [
                Disclosure("reference", UP, Kind.PARAMETERS, When.ROUND, ref,
                           "the site's trained reference distribution (r_mu, r_sigma, C)",
                           to=To.AGGREGATE),
                Disclosure("reference", DOWN, Kind.PARAMETERS, When.ROUND, ref,
                           "the averaged reference distribution", carries=("reference",)),
            ]  # fmt: skip
        return out

    def broadcast(self, server: State, rnd: int, cid: str) -> Payload:
        down = super().broadcast(server, rnd, cid)
        if self.reference == "averaged":
            down.records["reference"] = server["reference"]
        return down

    def aggregate(self, server: State, rnd: int, replies: list[Reply]) -> None:
        """The declared means: the weights and, with ``reference=averaged``, the reference
        distribution (an override of its own: FedAvg's ``sums_only`` mark names the weights
        only)."""
        self.aggregate_declared(server, replies)

    # -- client ----------------------------------------------------------------------------
    def client_vars(self) -> list[StateVar]:
        if self.reference != "local":
            return super().client_vars()
        return [
            *super().client_vars(),
            client_var("reference", lambda at: self.initial_reference(torch.device("cpu")),
                       doc="reference=local: the client's own reference distribution"),
        ]  # fmt: skip

    def local_update(self, ctx: ClientContext, down: Payload, state: State) -> Payload:
        if self.reference is None:
            return super().local_update(ctx, down, state)
        start = down["reference"] if self.reference == "averaged" else state["reference"]
        ref = {k: nn.Parameter(start[k].detach().clone().to(ctx.device)) for k in REF_KEYS}
        ctx.scratch[REFERENCE] = ref
        try:
            self.load_client_model(ctx, down["weights"], state)
            steps, loss = self.local_train(ctx, state)
        finally:
            del ctx.scratch[REFERENCE]
        self.keep_local(ctx, state)
        trained = clone({k: p.detach().cpu() for k, p in ref.items()})
        if self.reference == "local":
            state["reference"] = trained
            return self.reply(ctx, state, steps, loss)
        return self.reply(
            ctx, state, steps, loss, {"weights": self.shared_weights(ctx), "reference": trained}
        )

    def trainable(self, ctx: ClientContext) -> list[torch.nn.Parameter]:
        """The model's parameters and the round's reference parameters (one optimiser, as
        the released code adds them to the model's SGD)."""
        ref = ctx.scratch.get(REFERENCE)
        extra = [] if ref is None else [ref[k] for k in REF_KEYS]
        return super().trainable(ctx) + extra

    def loss(self, ctx: ClientContext, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """CE(cls(z), y) + alpha_L2R L2R + alpha_CMI CMI (+ ``penalty``), z drawn with the
        client's generator; the reference parameters are the round's (``ctx.scratch``)."""
        if y.ndim != 1:
            raise TrainingError("fedsr needs integer labels, but an augment produced soft labels")
        model = ctx.model
        assert isinstance(model, FedSRModel)
        mu, sigma = model.distribution(x)
        z = (
            mu
            if sigma is None
            else mu + sigma * standard_normal(tuple(mu.shape), ctx.generator, mu)
        )
        loss = ctx.task.loss(model.head(z), y)
        p = self.params
        if p.l2r_coeff:
            loss = loss + p.l2r_coeff * l2r_regulariser(z, p.l2r)
        ref = ctx.scratch.get(REFERENCE)
        if ref is not None and sigma is not None:
            cmi = cmi_regulariser(mu, sigma, y, ref["r_mu"], ref["r_sigma"], ref["C"])
            loss = loss + p.cmi_coeff * cmi
        extra = self.penalty(ctx)
        return loss if extra is None else loss + extra
