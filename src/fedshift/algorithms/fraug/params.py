"""FRAug's config keys (``algorithm.*``) and what the ``variant`` key switches: the paper's
objective (Sec. 3, Eq. 1-6) or the released code's, as one record of flags read by the one
training loop (:mod:`fedshift.algorithms.fraug.algorithm`) and the losses
(:mod:`fedshift.algorithms.fraug.objectives`). docs/METHODS.md lists every difference."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from fedshift.algorithms.base import FLParams
from fedshift.algorithms.bn import BNPolicy
from fedshift.core.bounds import bounded

Embeddings = Literal["both", "agnostic", "u_hat", "u_hat_c"]


@dataclass(frozen=True)
class Variant:
    """What ``algorithm.variant`` switches (every flag together)."""

    #: distribution of z when ``noise`` is unset: N(0, I) (Sec. 3.2) or U[0, 1) (code)
    noise: Literal["normal", "uniform"]
    #: Eq. 3's residual scaled by lambda_syn(t) (paper) or added unscaled (code)
    scaled_residual: bool
    #: Eq. 4's prototype rate ramps up with lambda_syn (paper) or stays constant (code)
    ramped_prototypes: bool
    #: Eq. 1 ``L_real + L_syn`` and Eq. 6 as one sum (paper), or ``(1 - w_t) L_real +
    #: w_t mean(L_syn)`` and the mean of Eq. 6's branches (code)
    additive_losses: bool
    #: the class branch: every class, summed over c with one MMD per class (Eq. 2, 6), or
    #: labels cycled through the classes with one pooled MMD (code)
    class_sums: bool
    #: Eq. 5 classifies u_hat (the real batch + the RTNet residual) with the batch labels
    #: (paper), or the raw generator output with the cycled labels (code); only the latter
    #: reads ``generator_distance``
    generator_on_residual: bool
    #: ``interpolate`` applies (the code's use_feature_inter; no such step in the paper)
    interpolates: bool


def _variant(paper: bool) -> Variant:
    """The paper's objective (``paper``) or the released code's: they differ in every flag."""
    return Variant(
        noise="normal" if paper else "uniform",
        scaled_residual=paper,
        ramped_prototypes=paper,
        additive_losses=paper,
        class_sums=paper,
        generator_on_residual=paper,
        interpolates=not paper,
    )


VARIANTS = {"paper": _variant(True), "released": _variant(False)}


@dataclass(frozen=True)
class RoundPlan:
    """A round's constants of the schedule (Sec. 3.2 ramp-up)."""

    #: Eq. 3's residual scale lambda_syn(t) (1.0: unscaled)
    scale: float = 1.0
    #: Eq. 4's prototype EMA rate lambda_c(t)
    proto_rate: float = 0.3
    #: the code's synthetic-loss weight w_t (None: Eq. 1's plain sum)
    syn_weight: float | None = None
    #: the code's interpolation ratio r of synthetic and base embeddings (None: none)
    mix: float | None = None


@dataclass
class FRAugParams(FLParams):
    # "paper" (default): Eq. 1-6 as printed; "released": HaokunChen245/FRAug @816e8be
    # (VARIANTS above records every difference that switches with it)
    variant: Literal["paper", "released"] = "paper"
    # BN tensors of the classification model kept on the client: "local" = FedBN (paper);
    # the released code uses "stats-local" (model_share="no_bn_running_stats")
    bn_policy: BNPolicy = "local"
    # which synthetic embeddings train the head (Table 3 ablations)
    embeddings: Embeddings = "both"
    # cap of the synthetic-loss weight w_t (code: min(0.5, ratio))
    lambda_syn: float = bounded(0.5, ge=0, le=1)
    # exponential ramp-up exp(gamma (e - T)) of w_t; false: w_t = lambda_syn
    ramp_up: bool = True
    # code: inter_gamma = 0.01 (PACS, OfficeHome), 0.002 (Digits)
    ramp_gamma: float = bounded(0.01, ge=0)
    # code's use_feature_inter: r * synthetic + (1 - r) * base (PACS, OfficeHome; not Digits)
    interpolate: bool = False
    # weight of the generator's distance term, Eq. 5 (code L_G_dist_lambda: Digits 1)
    alpha: float = bounded(1.0, ge=0, why="the sign of its term is fixed by the method")
    # weight of the RTNet's distance term, Eq. 6 (code L_FT_dist_lambda: PACS 1)
    beta: float = bounded(1.0, ge=0, why="the sign of its term is fixed by the method")
    # noise size of g (None: d // 2, the code's default latent_dim)
    noise_dim: int | None = bounded(None, ge=1)
    # hidden width of g (None: d, as in the code)
    generator_hidden: int | None = bounded(None, ge=1)
    # hidden width of the RTNet (None: the noise size, as in the code's latent_dim)
    rtnet_hidden: int | None = bounded(None, ge=1)
    # distribution of z: None = by variant (paper Sec. 3.2: N(0, I); released: torch.rand,
    # uniform on [0, 1))
    noise: Literal["uniform", "normal"] | None = None
    # paper variant: synthetic embeddings per class in the sums over c of Eq. 2 / 6
    # (None: max(2, batch_size // C))
    per_class: int | None = bounded(None, ge=1)
    # SGD learning rates of the generator and the RTNet (code: lr_G, lr_FTNet = 0.05)
    lr_generator: float = bounded(0.05, gt=0)
    lr_rtnet: float = bounded(0.05, gt=0)
    # SGD momentum of the generator and RTNet optimisers (code: local_momentum = 0.5)
    aux_momentum: float = bounded(0.5, ge=0, lt=1)
    # EMA momentum of the class prototypes, Eq. 4 (code: cls_mean_momentum = 0.3)
    prototype_momentum: float = bounded(0.3, gt=0, le=1)
    # distance in Eq. 5: "mmd" to the real batch (paper; code PACS/OfficeHome) or
    # "mse" to the class prototypes (code Digits: distance_metric_G="L2")
    generator_distance: Literal["mmd", "mse"] = "mmd"
    # distance in Eq. 6: "mmd" (paper; code Digits/OfficeHome) or "mse" (code PACS)
    rtnet_distance: Literal["mmd", "mse"] = "mmd"
    # "gaussian": multi-kernel Gaussian MMD (code MMD_kernel); "mean_cov": the code's "MMD"
    mmd_kernel: Literal["gaussian", "mean_cov"] = "gaussian"
    # generator BN tensors kept on the client ("global": all averaged, code Digits/PACS)
    generator_bn: BNPolicy = "global"
    # real embeddings the distances compare against: recomputed in eval mode after the
    # model step ("eval", code) or the detached training-mode ones of the model step
    reference: Literal["eval", "train"] = "eval"
