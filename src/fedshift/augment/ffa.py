"""FedFA's federated feature augmentation (Zhou & Konukoglu, "FedFA: Federated Feature
Augmentation", ICLR 2023): the FFA layer and the ``ffa`` augment that exchanges its statistics.

An FFA layer sits after a named conv stage (``FedModel.stage_hooks``; default: after every
stage, the placement of the paper's Table 8 is the ``stages`` parameter). In training mode it
fires with probability ``p`` (one draw per layer per forward, for the whole batch; identity
otherwise and always in eval mode). When it fires, on features x of shape (B, C, H, W):

* Eq. 2, instance statistics over H x W:  mu_b = mean_hw(x_b),
  sigma_b = sqrt(var_hw(x_b) + eps).
* Eq. 3, client-specific statistic variances over the batch:
  Sigma^2_mu = var_b(mu_b) + eps,  Sigma^2_sigma = var_b(sigma_b) + eps   (each (C,)).
* Eq. 4, momentum statistics of the client (alpha = ``momentum`` = 0.99, updated only when
  the layer fires, initialised mu_bar = 0, sigma_bar = 1):
  mu_bar <- alpha mu_bar + (1 - alpha) mean_b(mu_b),  likewise sigma_bar.
* Eq. 5, client-sharing statistic variances, on the server from the K uploaded mu_bar^k
  (sigma_bar^k): Sigma_hat^2_mu = var_k(mu_bar^k), one value per channel.
* Eq. 6-7, adaptive fusion: a Student-t kernel with one degree of freedom turns each channel's
  sharing variance into r_j = (1 + 1 / (Sigma_hat^2_j + eps))^-1, normalised over channels,
  gamma_j = C r_j / sum_c r_c (so gamma averages 1); the fused variance is
  Sigma~^2 = (1 + gamma) * Sigma^2 (client-specific variance scaled per channel).
* Eq. 8-9, reparameterised sampling and re-normalisation, with e ~ N(0, 1) per instance and
  channel: beta = mu + e_mu Sigma~_mu, gamma' = sigma + e_sigma Sigma~_sigma,
  x_hat = gamma' (x - mu) / sigma + beta. Gradients flow through mu, sigma and the variances.

Variants (``variant``): ``fedfa`` (the above), ``fedfa-r`` (Sec. 4.1: the sampling std is a
fixed lambda = ``fixed_std`` = 0.5 for every channel, Sigma~_mu = Sigma~_sigma = lambda, whatever
the client's own variances), ``fedfa-c`` (Sec. 4.1: client-specific variances only,
Sigma~^2 = Sigma^2) and ``direct`` (the "Direct Fusion" ablation of Sec. 4.4 / Table 7:
Sigma~^2 = (Sigma_hat^2 + 1) * Sigma^2, the raw client-sharing variance in place of gamma).
``fedfa-r`` and ``fedfa-c`` do not use the server's statistics, so they exchange nothing.

Communication (variants ``fedfa``, ``direct``), per client per round: UP ``ffa_stats``
(``<stage>.mean``, ``<stage>.std``: the client's momentum statistics, 2 x C per layer) and
DOWN ``ffa_variance`` (``<stage>.mean``, ``<stage>.std``: Sigma_hat^2_mu and
Sigma_hat^2_sigma, 2 x C per layer): 4 x sum of the layers' channels floats (Sec. 4.5, App. D).
The layers' statistics are non-persistent buffers, so they never travel in the ``weights``
record; each client's values are loaded into the layers in ``before_train`` and read back in
``reply``. The server computes Eq. 5 per statistic over the clients that uploaded it in the
round (fewer than two: the previous variances are kept). Before any statistics have been
aggregated the server holds Sigma_hat^2 = 0 for every channel: under ``fedfa`` that gives
gamma = 1 for every channel (the same as the released code, whose variance buffers start at 1:
equal variances give gamma = 1), under ``direct`` Sigma~^2 = Sigma^2 until the first broadcast.

Momentum statistics across rounds (``ema``). The paper is ambiguous: Algorithm 1 line 3 resets
mu_bar = 0, sigma_bar = 1 at the start of every round, while Sec. 2.3.1 calls the uploaded values
"accumulated" statistics. With alpha = 0.99 and a reset, after n firing updates in the round
(n = a few to a few dozen: p = 0.5 per batch, one epoch of a small client)

    mu_bar = (1 - alpha^n) * m,   sigma_bar = alpha^n + (1 - alpha^n) * s,

with m, s the (update-weighted) means of the batch statistics. The factor (1 - alpha^n) is
0.01-0.08 for n = 1-8 and differs between clients (different n), so Eq. 5's variance over
clients is dominated by m^2 * var_k(1 - alpha^{n_k}), i.e. by how *large* a channel's mean is,
not by how much it *differs* across clients. fedshift's options:

* ``corrected`` (default): Alg. 1's reset and Eq. 4's update unchanged, and the client uploads
  the bias-corrected statistics (mu_bar - alpha^n * 0) / (1 - alpha^n) and
  (sigma_bar - alpha^n * 1) / (1 - alpha^n) (the correction Adam uses for its moment
  estimates). Each is exactly a weighted mean of this round's batch statistics (weights
  (1 - alpha) alpha^(n-i) / (1 - alpha^n), summing to 1) computed with the model every client
  started the round from, so Eq. 5 measures the spread of the clients' feature statistics, as
  Sec. 2.3.1 intends; alpha = 0 (Fig. 3) still gives the last batch's statistics. A layer that
  never fired in the round (n = 0) has no statistic and uploads nothing for it; Eq. 5 then
  uses the clients that did.
* ``reset``: the literal Algorithm 1 (uncorrected mu_bar, sigma_bar uploaded).
* ``persist``: each client keeps its own uncorrected EMA across rounds (accumulated over rounds;
  the bias fades only after a few hundred updates and mixes statistics of older models).
* ``average`` (released code): the buffers are in the model's state dict, so the server
  averages them uniformly with the weights and every client starts the next round from that
  average; here it travels as an extra DOWN record ``ffa_running``, 2 x C per layer.

Paper vs released code (tfzhou/FedFA @57e9582, ``pyfed/utils/ffa_layer.py``,
``pyfed/manager/comm.py``), option ``variance``:

* ``paper`` (default): Eq. 5 per channel (variance over clients), population estimators
  (1/HW, 1/B, 1/K) as the paper writes them.
* ``released``: the server calls ``torch.var`` without ``dim``, one unbiased variance over all
  K x C values, so Sigma_hat^2 is one scalar and gamma == 1 for every channel (the cross-client
  statistic never changes anything); all estimators are unbiased (``torch.var`` defaults).
  ``unbiased`` overrides the estimator choice of either mode. Use ``ema=average`` as well to
  reproduce the released flow in full.

eps = 1e-6 is added where the released code adds it (inside the instance sqrt, to the batch
variances, and to Sigma_hat^2 in the t kernel).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn

from fedshift.algorithms.state import StateVar, client_var, server_var
from fedshift.augment.base import Augment, Records, State, require_federation
from fedshift.core.bounds import bounded
from fedshift.core.disclosure import Disclosure, Kind, Over, To, When, fixed
from fedshift.core.errors import ConfigError
from fedshift.core.payload import Payload, Tensors
from fedshift.models.base import FedModel

Variant = Literal["fedfa", "fedfa-r", "fedfa-c", "direct"]
#: variants whose fused variance uses the server's client-sharing variances
SHARING = ("fedfa", "direct")
UP, DOWN, RUNNING = "ffa_stats", "ffa_variance", "ffa_running"


# ----------------------------------------------------------------------------- equations
def instance_statistics(
    x: torch.Tensor, eps: float = 1e-6, unbiased: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. 2: per-instance channel mean and std over H x W, sigma = sqrt(var + eps); (B, C)."""
    if x.ndim != 4:
        raise ValueError(f"FFA expects (B, C, H, W) features, got shape {tuple(x.shape)}")
    mu = x.mean(dim=(2, 3))
    var = x.var(dim=(2, 3), correction=1 if unbiased else 0)
    return mu, (var + eps).sqrt()


def batch_variance(s: torch.Tensor, eps: float = 1e-6, unbiased: bool = False) -> torch.Tensor:
    """Eq. 3: client-specific variance over the batch of per-instance statistics (B, C) -> (C,)."""
    return s.var(dim=0, correction=1 if unbiased else 0) + eps


def momentum_update(running: torch.Tensor, s: torch.Tensor, momentum: float) -> torch.Tensor:
    """Eq. 4: ``running * alpha + mean_b(s) * (1 - alpha)`` (no gradient)."""
    return running * momentum + s.detach().mean(dim=0) * (1.0 - momentum)


def bias_corrected(
    running: torch.Tensor, start: float, momentum: float, updates: int
) -> torch.Tensor:
    """Eq. 4's EMA after ``updates`` steps from ``start`` (0 for mu_bar, 1 for sigma_bar),
    corrected for its start: ``(running - alpha^n start) / (1 - alpha^n)``, the weighted mean
    of the batch statistics it has seen (``ema=corrected``; see the module docstring)."""
    if updates < 1:
        raise ValueError("bias_corrected needs at least one momentum update")
    decay = momentum**updates
    return (running - decay * start) / (1.0 - decay)


def sharing_variance(
    stats: torch.Tensor, per_channel: bool = True, unbiased: bool = False
) -> torch.Tensor:
    """Eq. 5: variance over clients of their momentum statistics, ``stats`` (K, C) -> (C,).

    ``per_channel=False`` is the released code: one variance over all K x C values, repeated
    for every channel."""
    correction = 1 if unbiased else 0
    if per_channel:
        return stats.var(dim=0, correction=correction)
    return stats.var(correction=correction).expand(stats.shape[1]).clone()


def fusion_weights(shared_var: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Eq. 6-7: gamma_j = C r_j / sum_c r_c with the t kernel r = (1 + 1/(var + eps))^-1."""
    r = 1.0 / (1.0 + 1.0 / (shared_var + eps))
    return shared_var.shape[-1] * r / r.sum()


def fused_variance(
    client_var: torch.Tensor,
    shared_var: torch.Tensor,
    variant: str = "fedfa",
    eps: float = 1e-6,
    fixed_std: float = 0.5,
) -> torch.Tensor:
    """Eq. 7 and its ablations: the variance the new statistics are sampled with.

    ``fedfa`` (Eq. 7): (1 + gamma) * Sigma^2 with gamma from :func:`fusion_weights`;
    ``fedfa-r`` (Sec. 4.1): fixed_std^2 (lambda = 0.5) for every channel, independent of
    Sigma^2; ``fedfa-c`` (Sec. 4.1): Sigma^2; ``direct`` (Sec. 4.4, Table 7):
    (Sigma_hat^2 + 1) * Sigma^2."""
    if variant == "fedfa":
        return (1.0 + fusion_weights(shared_var, eps)) * client_var
    if variant == "fedfa-r":
        return torch.full_like(client_var, fixed_std**2)
    if variant == "fedfa-c":
        return client_var
    if variant == "direct":
        return (shared_var + 1.0) * client_var
    raise ValueError(f"unknown FFA variant {variant!r}")


def resample(
    x: torch.Tensor,
    mu: torch.Tensor,
    sigma: torch.Tensor,
    var_mu: torch.Tensor,
    var_sigma: torch.Tensor,
    noise_mu: torch.Tensor,
    noise_sigma: torch.Tensor,
) -> torch.Tensor:
    """Eq. 8-9: beta = mu + e_mu sqrt(var_mu), gamma = sigma + e_sigma sqrt(var_sigma) (B, C);
    x_hat = gamma (x - mu) / sigma + beta."""
    beta = mu + noise_mu * var_mu.sqrt()
    gamma = sigma + noise_sigma * var_sigma.sqrt()
    b, c = mu.shape
    shape = (b, c, 1, 1)
    return (x - mu.view(shape)) / sigma.view(shape) * gamma.view(shape) + beta.view(shape)


# ----------------------------------------------------------------------------- the layer
class FFALayer(nn.Module):
    """One FFA layer for features with ``channels`` channels (Eq. 2-9; see the module doc).

    Its state (momentum statistics, the received client-sharing variances) are
    non-persistent buffers: outside the model's state dict. ``generator`` (optional) makes
    the p-draw and the noise come from that generator instead of torch's global RNG."""

    def __init__(
        self,
        channels: int,
        p: float = 0.5,
        momentum: float = 0.99,
        eps: float = 1e-6,
        unbiased: bool = False,
        variant: str = "fedfa",
        fixed_std: float = 0.5,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        self.channels = channels
        self.p = p
        self.momentum = momentum
        self.eps = eps
        self.unbiased = unbiased
        self.variant = variant
        self.fixed_std = fixed_std
        #: momentum updates (firings) since the last reset_running
        self.updates = 0
        self.generator: torch.Generator | None = None
        #: whether the last training forward fired (diagnostics and tests)
        self.fired = False
        for name, fill in (
            ("running_mean", 0.0),
            ("running_std", 1.0),
            ("shared_var_mean", 0.0),
            ("shared_var_std", 0.0),
        ):
            self.register_buffer(
                name, torch.full((channels,), fill, device=device), persistent=False
            )

    def reset_running(self) -> None:
        """mu_bar = 0, sigma_bar = 1 (Eq. 4's initial values), update count 0."""
        self.running_mean.fill_(0.0)
        self.running_std.fill_(1.0)
        self.updates = 0

    def momentum_statistics(self, corrected: bool) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The (mu_bar, sigma_bar) to upload: raw (Eq. 4) or bias-corrected for the reset start
        (``ema=corrected``; None when the layer has not fired since the reset)."""
        mean, std = self.running_mean.detach(), self.running_std.detach()
        if not corrected:
            return mean.clone(), std.clone()
        if self.updates == 0:
            return None
        return (
            bias_corrected(mean, 0.0, self.momentum, self.updates),
            bias_corrected(std, 1.0, self.momentum, self.updates),
        )

    def _draw_fires(self) -> bool:
        g = self.generator
        u = torch.rand((), generator=g) if g is not None else torch.rand(())
        return bool(u < self.p)

    def _noise(self, like: torch.Tensor) -> torch.Tensor:
        g = self.generator
        if g is None:
            return torch.randn(like.shape, device=like.device, dtype=like.dtype)
        return torch.randn(like.shape, generator=g, device=g.device, dtype=like.dtype).to(
            like.device
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.fired = False
        if not self.training or not self._draw_fires():
            return x
        self.fired = True
        if x.shape[1] != self.channels:
            raise ValueError(f"FFA layer built for {self.channels} channels got {x.shape[1]}")
        mu, sigma = instance_statistics(x, self.eps, self.unbiased)
        with torch.no_grad():
            self.running_mean.copy_(momentum_update(self.running_mean, mu, self.momentum))
            self.running_std.copy_(momentum_update(self.running_std, sigma, self.momentum))
        self.updates += 1
        var_mu = batch_variance(mu, self.eps, self.unbiased)
        var_sigma = batch_variance(sigma, self.eps, self.unbiased)
        var_mu = fused_variance(
            var_mu, self.shared_var_mean, self.variant, self.eps, self.fixed_std
        )
        var_sigma = fused_variance(
            var_sigma, self.shared_var_std, self.variant, self.eps, self.fixed_std
        )
        noise_mu = self._noise(mu)
        noise_sigma = self._noise(sigma)
        return resample(x, mu, sigma, var_mu, var_sigma, noise_mu, noise_sigma)

    def extra_repr(self) -> str:
        return f"{self.channels}, p={self.p}, variant={self.variant}"


def stage_channels(model: FedModel, stage: str) -> int:
    """Output channels of a conv stage: those of its last BatchNorm or conv layer."""
    for m in reversed(list(model.stages[stage].modules())):
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            return m.num_features
        if isinstance(m, nn.modules.conv._ConvNd):
            return m.out_channels
    raise ConfigError(
        f"augment 'ffa': stage {stage!r} has no conv or batch-norm layer to read its channel "
        "count from; FFA layers go after convolutional stages"
    )


# ----------------------------------------------------------------------------- the augment
@dataclass
class FFAParams:
    """Parameters of the ``ffa`` augment (see the module docstring)."""

    #: stages to put an FFA layer after (None: every stage of the model)
    stages: list[str] | None = None
    #: probability that a layer fires in a training forward
    p: float = bounded(0.5, ge=0, le=1)
    #: alpha of the momentum statistics (Eq. 4)
    momentum: float = bounded(0.99, ge=0, lt=1)
    eps: float = bounded(1e-6, gt=0)
    variant: Variant = "fedfa"
    #: "paper": Eq. 5 per channel; "released": one scalar variance (gamma == 1)
    variance: Literal["paper", "released"] = "paper"
    #: unbiased variance estimators (None: False for "paper", True for "released")
    unbiased: bool | None = None
    #: momentum statistics across rounds: "corrected" (Alg. 1 reset + bias-corrected upload),
    #: "reset" (Alg. 1 literally), "persist", "average" (released); see the module docstring
    ema: Literal["corrected", "reset", "persist", "average"] = "corrected"
    #: lambda of the fedfa-r variant: the sampling std of every channel (Sec. 4.1)
    fixed_std: float = bounded(0.5, ge=0)

    def validate(self, prefix: str = "augment") -> None:
        where = f"config key '{prefix}." if prefix else "config key '"
        if self.ema not in ("corrected", "reset", "persist", "average"):
            raise ConfigError(
                f"{where}ema' must be corrected, reset, persist or average, got {self.ema!r}"
            )
        if self.stages is not None:
            if not self.stages:
                raise ConfigError(f"{where}stages' is empty; leave it out for every stage")
            dup = sorted({s for s in self.stages if self.stages.count(s) > 1})
            if dup:
                raise ConfigError(f"{where}stages' lists {dup} more than once")

    @property
    def is_unbiased(self) -> bool:
        return self.variance == "released" if self.unbiased is None else self.unbiased


def _zeros_ones(layers: dict[str, FFALayer], fill_std: float) -> Tensors:
    out: Tensors = {}
    for name, layer in layers.items():
        out[f"{name}.mean"] = torch.zeros(layer.channels)
        out[f"{name}.std"] = torch.full((layer.channels,), fill_std)
    return out


class FFA(Augment):
    """FedFA's feature augmentation layers after conv stages, with server-side variances."""

    name = "ffa"
    Params = FFAParams

    def __init__(self, params: Any, seed: int, num_classes: int) -> None:
        super().__init__(params if params is not None else FFAParams(), seed, num_classes)
        self.layers: dict[str, FFALayer] = {}

    @property
    def shares(self) -> bool:
        """Whether the variant uses (and so exchanges) the server's statistics."""
        return self.params.variant in SHARING

    @classmethod
    def check(cls, params: Any, algorithm: str, others: list[str]) -> None:
        variant = params.variant if params is not None else "fedfa"
        if variant in SHARING:
            require_federation(
                "ffa",
                algorithm,
                f"with variant {variant!r} needs statistics from the other clients",
                "use variant 'fedfa-c' (client-specific variances only)",
            )

    # -- model -------------------------------------------------------------------------------
    def attach(self, model: FedModel) -> None:
        """An FFA layer after each chosen stage (chained after any hook already there)."""
        valid = model.stage_names
        chosen = list(self.params.stages) if self.params.stages is not None else valid
        bad = [s for s in chosen if s not in valid]
        if bad:
            raise ConfigError(
                f"config key 'augment.stages': {bad} not stage(s) of model "
                f"{type(model).__name__}; valid stages: {', '.join(valid)}"
            )
        if hasattr(model, "ffa_layers"):
            raise ConfigError("augment 'ffa': the model already has FFA layers attached")
        ref = next(model.parameters(), None)
        device = ref.device if ref is not None else None
        p = self.params
        for stage in chosen:
            layer = FFALayer(
                stage_channels(model, stage),
                p=p.p,
                momentum=p.momentum,
                eps=p.eps,
                unbiased=p.is_unbiased,
                variant=p.variant,
                fixed_std=p.fixed_std,
                device=device,
            )
            self.layers[stage] = layer
            prev = model.stage_hooks.get(stage)
            if prev is None:
                model.stage_hooks[stage] = layer
            else:
                model.stage_hooks[stage] = lambda x, prev=prev, layer=layer: layer(prev(x))
        # registered so that .to(), .train() and .eval() reach the layers; their buffers are
        # non-persistent, so the model's state dict (the weights record) is unchanged
        model.add_module("ffa_layers", nn.ModuleDict(self.layers))

    # -- state -------------------------------------------------------------------------------
    def server_vars(self) -> list[StateVar]:
        if not self.shares:
            return []
        out = [server_var("variance", lambda at: _zeros_ones(self.layers, 0.0),
                          doc="the sharing variance of each layer's statistics")]
        if self.params.ema == "average":
            out.append(server_var("running", lambda at: _zeros_ones(self.layers, 1.0),
                                  doc="ema=average: the sites' mean momentum statistics"))
        return out

    def client_vars(self) -> list[StateVar]:
        if not self.shares:
            return []
        return [
            client_var("running", lambda at: _zeros_ones(self.layers, 1.0),
                       doc="the client's momentum mean and std of each layer"),
            client_var("variance", None, doc="the server's sharing variance once received"),
        ]  # fmt: skip

    # -- every round -------------------------------------------------------------------------
    def disclosures(self, model: FedModel) -> list[Disclosure]:
        if not self.shares:
            return []
        size = fixed(2 * sum(layer.channels for layer in self.layers.values()) * 4)
        out = [
            Disclosure(
                UP,
                "up",
                Kind.STATISTIC,
                When.ROUND,
                size,
                "the site's momentum mean and std of instance feature statistics per "
                "FFA layer (Eq. 4) over the round's batches where the layer fired",
                to=To.AGGREGATE,
                over=Over.BATCH,
                exact=False,
                unprotectable="computed with the model the site trained on its own "
                "data, which privacy.epsilon does not protect: clipping each example's "
                "features cannot bound the record's sensitivity (issue 53 item 2, DP "
                "training, is not built)",
            ),
            Disclosure(
                DOWN,
                "down",
                Kind.STATISTIC,
                When.ROUND,
                size,
                "the variances over sites of those statistics (Eq. 5)",
                carries=(UP,),
            ),
        ]
        if self.params.ema == "average":
            out.append(
                Disclosure(
                    RUNNING,
                    "down",
                    Kind.STATISTIC,
                    When.ROUND,
                    size,
                    "the sites' momentum statistics averaged",
                    carries=(UP,),
                )
            )
        return out  # fmt: skip

    def broadcast(self, server: State, rnd: int, cid: str) -> Records:
        if not self.shares:
            return {}
        out: Records = {DOWN: dict(server["variance"])}
        if self.params.ema == "average":
            out[RUNNING] = dict(server["running"])
        return out

    def receive(self, records: Payload, state: State, rnd: int) -> None:
        if not self.shares:
            return
        var = records.records.get(DOWN)
        if var is not None:
            state["variance"] = {k: v.detach().cpu().clone() for k, v in var.items()}
        running = records.records.get(RUNNING)
        if running is not None and self.params.ema == "average":
            state["running"] = {k: v.detach().cpu().clone() for k, v in running.items()}

    def before_train(self, model: FedModel, state: State, rnd: int) -> None:
        """Load this client's momentum statistics and received variances into the layers."""
        variance = state.get("variance")
        for stage, layer in self.layers.items():
            with torch.no_grad():
                if self.shares and self.params.ema in ("persist", "average"):
                    layer.running_mean.copy_(state["running"][f"{stage}.mean"])
                    layer.running_std.copy_(state["running"][f"{stage}.std"])
                else:
                    layer.reset_running()
                if variance is not None:
                    layer.shared_var_mean.copy_(variance[f"{stage}.mean"])
                    layer.shared_var_std.copy_(variance[f"{stage}.std"])
                else:  # nothing received yet: no cross-client spread known (gamma = 1)
                    layer.shared_var_mean.zero_()
                    layer.shared_var_std.zero_()

    def reply(self, model: FedModel, state: State, rnd: int) -> Records:
        """Send each layer's momentum statistics (2 x C per layer) up; under ``ema=corrected``
        bias-corrected, and nothing for a layer that did not fire this round."""
        if not self.shares:
            return {}
        stats: Tensors = {}
        corrected = self.params.ema == "corrected"
        for stage, layer in self.layers.items():
            pair = layer.momentum_statistics(corrected)
            if pair is None:
                continue
            stats[f"{stage}.mean"] = pair[0].cpu().clone()
            stats[f"{stage}.std"] = pair[1].cpu().clone()
        if self.params.ema == "persist":
            state["running"] = {k: v.clone() for k, v in stats.items()}
        return {UP: stats}

    def aggregate(self, server: State, rnd: int, replies: list[tuple[str, Payload]]) -> None:
        """Eq. 5 per statistic over the clients that uploaded it (and, for ``ema=average``,
        the plain mean of their momentum statistics); fewer than two: the previous value."""
        if not self.shares:
            return
        ups = [p[UP] for _, p in replies if UP in p.records]
        if self.params.ema == "average" and ups:
            server["running"] = {
                k: torch.stack([u[k] for u in ups]).mean(0) for k in server["running"]
            }
        per_channel = self.params.variance == "paper"
        for k in server["variance"]:
            got = [u[k].float() for u in ups if k in u]
            if len(got) >= 2:
                server["variance"][k] = sharing_variance(
                    torch.stack(got), per_channel, self.params.is_unbiased
                )
