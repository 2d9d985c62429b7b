"""FRAug (Chen et al., "FRAug: Tackling Federated Learning with Non-IID Features via
Representation Augmentation", ICCV 2023, arXiv 2205.14900).

Every client's model splits into a feature extractor and a prediction head,
``u = model.features(x)`` and ``logits = model.head(u)``. On top of FedBN-style training
(local BN layers, everything else averaged), each client augments its *embedding* space:

* a class-conditional generator ``g(z, y)`` (shared: averaged by the server like the model,
  payload record ``generator``) maps noise ``z`` and a one-hot label to a client-agnostic
  embedding; an MLP ``[z, onehot(y)] -> 2 x (Linear + BN1d + ReLU) -> R^d``;
* a Representation Transformation Network ``m`` (RTNet, one per client, never sent: it lives
  in client state only) turns ``g``'s output into a client-specific *residual*:
  ``m(g, y) = dec(enc([g, onehot(y)]))`` with ``enc = Linear + BN1d + ReLU`` and
  ``dec = Linear + BN1d``;
Default ``variant="paper"`` (Sec. 3, Eq. 1-6, Algorithm 1 lines 19-20), per mini-batch:

* Eq. 1, model step (generator and RTNet fixed): ``L_cls = L_real + L_syn`` with
  ``L_real = CE(h(u), y)``;
* Eq. 2: ``L_syn = CE(h(u_hat), y) + sum_{c in C} CE(h(u_hat_c), c)``, the sum over *all*
  classes (``per_class`` samples of each; the per-class mean CE is summed over classes);
  the synthetic embeddings carry no gradient, so ``L_syn`` trains the prediction head only;
* Eq. 3: ``u_hat = u + lambda_syn * m(g(z, y))`` on the batch's real embeddings and labels,
  ``u_hat_c = u_bar_c + lambda_syn * m(g(z', c))``, ``z, z' ~ N(0, I)`` (Sec. 3.2);
* Eq. 4: ``u_bar_c <- (1 - lambda_c) u_bar_c + lambda_c * mean{u_i : y_i = c}`` (classes absent
  from the batch keep their prototype; ``u_bar`` starts at 0);
* ramp-up (Sec. 3.2): ``lambda_syn`` and ``lambda_c`` both grow with an exponential ramp-up;
  the paper cites [21] without a formula, fedshift uses ``r_t = min(1, exp(gamma (e - T)))``
  (the released code's schedule; ``e`` = round - 1, ``T`` = ``train.rounds``) and
  ``lambda_syn(t) = lambda_syn * r_t``, ``lambda_c(t) = prototype_momentum * r_t``;
  ``ramp_up=false``: the maxima throughout;
* Eq. 5, generator step (model and RTNet fixed): ``L_gen = CE(h(u_hat), y) -
  alpha * MMD(u_hat, u)``, ``u_hat`` of Eq. 3 built through the fixed RTNet;
* Eq. 6, RTNet step (model and generator fixed): ``L_rt = -(H(h(u_hat)) + sum_c H(h(u_hat_c)))
  + beta * (MMD(u_hat, u) + sum_c MMD(u_hat_c, u_bar_c))``, one MMD per class against its
  prototype (``per_class_mmd``).

``variant="released"`` (HaokunChen245/FRAug @816e8be), every difference switching together:
the model loss is ``(1 - w_t) CE(h(u), y) + w_t * L_syn`` with ``w_t = min(lambda_syn,
exp(gamma (e - T)))`` and ``L_syn`` the *mean* of the two branches; the residual is added
unscaled (``u + m(g)``); the generator loss is ``CE(h(g(z, c)), c) - alpha * MMD(g(z, c), U)``
on the raw generator output; the class branch uses cycled labels (``cyclic_labels``) with a
pooled MMD against the prototypes; ``z ~ U[0, 1)``; the prototype rate is constant.

One local step (one mini-batch) = one model step, one generator step, one RTNet step, in that
order, as in the released code (``users/user_FRAug.py``). The generator and the RTNet use
their own SGD optimisers (``lr_generator``, ``lr_rtnet``, momentum ``aux_momentum``), fresh
each round or kept in client state like the model's (``train.optimizer_state``). The labels
``c`` of the generator / prototypical branch cycle through the classes (class-balanced
batches continuing across steps, as the code does). At test time only the feature extractor
and the head are used (no generator, no RTNet): evaluation is FedBN's (personal models with
each client's BN layers).

MMD (``mmd``): the code's multi-kernel Gaussian MMD^2 (``utils/loss_utils.py``, ``MMD_kernel``)
with 5 bandwidths ``s * 2^k / 4`` (k = 0..4) around ``s`` = the mean pairwise squared distance
of the pooled samples (no gradient through ``s``); ``mmd_kernel="mean_cov"`` is the code's
other "MMD" (squared differences of means and covariances).

Further options (defaults as in the paper where it says, else the released code):

* ``bn_policy``: ``local`` (default: the paper keeps local BN layers as FedBN does);
  ``stats-local`` is the released code's ``model_share="no_bn_running_stats"`` (BN affine
  parameters averaged, running statistics local) for all three benchmarks;
* ``generator_bn``: ``global`` (default; code Digits/PACS ``model_share_G="all"``: every
  generator tensor, BN running statistics included, is averaged); ``local`` is the code's
  OfficeHome ``no_local`` (the generator's BN layers never leave the client);
* ``generator_distance="mse"``: the code's Digits setting (``distance_metric_G="L2"``:
  ``-alpha * MSE(g(z, c), u_bar_c)``, pushing generated embeddings away from the prototypes);
  ``rtnet_distance="mse"`` is the code's PACS ``distance_metric_FT="L2"``;
* ``interpolate=true``: the code's ``use_feature_inter`` (PACS, OfficeHome): synthetic
  embeddings are mixed with their base, ``r * u_hat + (1 - r) * u`` with
  ``r = exp(gamma (e - T))`` (uncapped);
* ``reference="eval"`` (default, code): the real embeddings the MMD terms compare against
  are recomputed after the model step in evaluation mode (one extra forward pass per step);
  ``"train"`` reuses the (detached) training-mode embeddings of the model step (cheaper).

Ablations (the paper's Table 3): ``embeddings="agnostic"`` uses ``g(z, y)`` and ``g(z', c)``
directly (no RTNet: none is built or trained), ``"u_hat"`` only Eq. 2, ``"u_hat_c"`` only
Eq. 3, ``"both"`` (default) both; ``ramp_up=false`` removes the ramp-up.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn

from fedshift.algorithms import register
from fedshift.algorithms.base import Algorithm, FLParams, Reply, State
from fedshift.algorithms.bn import BNPolicy
from fedshift.algorithms.fraug_nets import (
    Generator,
    RTNet,
    cyclic_labels,
    entropy,
    mmd,
    module_bn_keys,
    ramp_factor,
    synthetic_weight,
    update_prototypes,
)
from fedshift.algorithms.tensors import clone, subset
from fedshift.core.bounds import bounded
from fedshift.core.config import TrainConfig
from fedshift.core.context import ClientContext
from fedshift.core.errors import ConfigError, TrainingError
from fedshift.core.payload import Payload
from fedshift.data.base import ClientData
from fedshift.models.base import FedModel

Embeddings = Literal["both", "agnostic", "u_hat", "u_hat_c"]


# ----------------------------------------------------------------------------- algorithm
@dataclass
class WorkingNets:
    """The generator and RTNet one local update trains: the client's own copies of the
    algorithm's templates, loaded from the down payload and the client state (``rtnet`` is
    None with ``embeddings=agnostic``)."""

    generator: Generator
    rtnet: RTNet | None


#: ``ctx.scratch`` key of the round's :class:`WorkingNets`
NETS = "fraug/nets"


@dataclass
class FRAugParams(FLParams):
    # "paper" (default): Eq. 1-6 as printed; "released": HaokunChen245/FRAug @816e8be
    # (see the module docstring for every difference that switches with it)
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


@register
class FRAug(Algorithm):
    """FedBN + a shared embedding generator + local RTNets; synthetic embeddings train the head."""

    name = "fraug"
    tasks = ("classification",)  # its objective needs one label per image
    # Algorithm 1's server update averages the client parameters with equal weights
    paper_weighting = "uniform"
    depends_on_rounds = True  # the ramp-up of lambda_syn / lambda_c runs over train.rounds
    Params = FRAugParams

    @classmethod
    def check(cls, params: Any, train: TrainConfig) -> None:
        def bad(key: str, why: str) -> ConfigError:
            return ConfigError(f"config key 'algorithm.{key}' {why}, got {getattr(params, key)!r}")

        if params.ramp_up and params.ramp_gamma <= 0:
            raise bad("ramp_gamma", "must be > 0 with ramp_up=true (set ramp_up=false instead)")
        if params.embeddings == "agnostic" and params.rtnet_hidden is not None:
            raise bad("rtnet_hidden", "has no effect with embeddings=agnostic (no RTNet)")
        if train.batch_size < 2:
            raise ConfigError(
                "algorithm 'fraug' needs train.batch_size >= 2 (its generator and RTNet have "
                f"BatchNorm layers), got {train.batch_size}"
            )

    def setup(self, model: FedModel) -> None:
        head = model.classifier
        if not isinstance(head, nn.Linear):
            raise ConfigError(
                "algorithm 'fraug' needs a model whose head (classifier) is a torch.nn.Linear "
                "(it reads the embedding size and the number of classes from it)"
            )
        p = self.params
        self.dim, self.num_classes = head.in_features, head.out_features
        self.noise_dim = p.noise_dim or max(1, self.dim // 2)
        self.rtnet_hidden = p.rtnet_hidden or self.noise_dim
        self.generator = Generator(
            self.noise_dim, self.num_classes, self.dim, p.generator_hidden or self.dim
        )
        #: ``generator`` and ``rtnet`` are templates (architecture and initial weights):
        #: each local update trains its own copies (:class:`WorkingNets`), so the algorithm
        #: object never changes during a round
        self.generator_local_keys = module_bn_keys(self.generator, p.generator_bn)
        local = set(self.generator_local_keys)
        self.generator_shared_keys = [k for k in self.generator.state_dict() if k not in local]
        self.uses_rtnet = p.embeddings != "agnostic"
        self.rtnet: RTNet | None = self._new_rtnet() if self.uses_rtnet else None

    def _new_rtnet(self) -> RTNet:
        return RTNet(self.dim, self.num_classes, self.rtnet_hidden)

    # -- server ----------------------------------------------------------------------------
    def init_server(self, model: FedModel) -> State:
        server = super().init_server(model)
        server["generator"] = clone(self.generator.state_dict())
        return server

    def broadcast(self, server: State, rnd: int, cid: str) -> Payload:
        return Payload(
            {
                "weights": subset(server["weights"], self.shared_keys),
                "generator": subset(server["generator"], self.generator_shared_keys),
            }
        )

    def aggregate(self, server: State, rnd: int, replies: list[Reply]) -> None:
        server["weights"].update(self.average_record(replies, "weights"))
        server["generator"].update(self.average_record(replies, "generator"))

    # -- client ----------------------------------------------------------------------------
    def init_client(self, cid: str, data: ClientData, model: FedModel) -> State:
        state = super().init_client(cid, data, model)
        state["generator_local"] = clone(
            subset(self.generator.state_dict(), self.generator_local_keys)
        )
        if self.uses_rtnet:
            state["rtnet"] = clone(self._new_rtnet().state_dict())
        ref = next(model.parameters(), None)  # on the model's device, like the rest
        state["prototypes"] = torch.zeros(
            self.num_classes, self.dim, device=None if ref is None else ref.device
        )
        state["label_offset"] = 0
        return state

    def working_nets(self, ctx: ClientContext, down: Payload, state: State) -> WorkingNets:
        """The round's generator (received shared tensors + the client's local BN tensors)
        and RTNet (the client's own), as fresh copies of the templates on the device."""
        gen = copy.deepcopy(self.generator).to(ctx.device)
        gen.load_state_dict({**down["generator"], **state["generator_local"]}, strict=True)
        rt = None
        if self.rtnet is not None:
            rt = copy.deepcopy(self.rtnet).to(ctx.device)
            rt.load_state_dict(state["rtnet"], strict=True)
        return WorkingNets(gen, rt)

    def local_update(self, ctx: ClientContext, down: Payload, state: State) -> Payload:
        self.load_client_model(ctx, down["weights"], state)
        nets = ctx.scratch[NETS] = self.working_nets(ctx, down, state)
        try:
            steps, loss = self.local_train(ctx, state)
        finally:
            del ctx.scratch[NETS]
        self.keep_local(ctx, state)
        gen_sd = nets.generator.state_dict()
        state["generator_local"] = clone(subset(gen_sd, self.generator_local_keys))
        if nets.rtnet is not None:
            state["rtnet"] = clone(nets.rtnet.state_dict())
        records = {
            "weights": self.shared_weights(ctx),
            "generator": clone(subset(gen_sd, self.generator_shared_keys)),
        }
        return self.reply(ctx, state, steps, loss, records)

    def _nets(self, nets: WorkingNets | None) -> WorkingNets:
        """``nets``, or the templates when a loss is evaluated outside a local update."""
        return nets if nets is not None else WorkingNets(self.generator, self.rtnet)

    # -- pieces of one local step ----------------------------------------------------------
    def noise(self, n: int, device: torch.device) -> torch.Tensor:
        kind = self.params.noise or ("normal" if self.params.variant == "paper" else "uniform")
        if kind == "normal":
            return torch.randn(n, self.noise_dim, device=device)
        return torch.rand(n, self.noise_dim, device=device)

    @torch.no_grad()
    def synthetic_embeddings(
        self,
        u: torch.Tensor,
        y: torch.Tensor,
        y_c: torch.Tensor,
        protos: torch.Tensor,
        mix: float | None = None,
        nets: WorkingNets | None = None,
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(embeddings, labels) of the branches in use, built without gradient from the
        detached real embeddings ``u`` (labels ``y``) and the prototypes of classes ``y_c``:
        Eq. 2 ``u_hat = u + m(g(z, y), y)``, Eq. 3 ``u_hat_c = u_bar_c + m(g(z', c), c)``;
        ``agnostic``: ``g(z, y)`` and ``g(z', c)``. ``mix`` = r interpolates with the base.
        ``nets``: the round's generator and RTNet (default: the templates)."""
        nets = self._nets(nets)
        mode, gen, rt = self.params.embeddings, nets.generator, nets.rtnet
        u = u.detach()
        out = []
        branches = []
        if mode in ("both", "u_hat", "agnostic"):
            branches.append((u, y))
        if mode in ("both", "u_hat_c", "agnostic"):
            branches.append((protos[y_c], y_c))
        for base, labels in branches:
            g = gen(self.noise(labels.shape[0], u.device), labels)
            emb = g if rt is None else rt(base, g, labels)
            if mix is not None:
                emb = mix * emb + (1 - mix) * base
            out.append((emb, labels))
        return out

    def synthetic_loss(
        self,
        model: FedModel,
        u: torch.Tensor,
        y: torch.Tensor,
        y_c: torch.Tensor,
        protos: torch.Tensor,
        mix: float | None = None,
        nets: WorkingNets | None = None,
    ) -> torch.Tensor:
        """Eq. 1's ``L_syn``: mean over branches of CE(h(synthetic), labels). Its gradient
        reaches the prediction head only."""
        parts = [
            F.cross_entropy(model.head(e), lab)
            for e, lab in self.synthetic_embeddings(u, y, y_c, protos, mix, nets)
        ]
        return torch.stack(parts).mean()

    def _distance(self, kind: str, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        if kind == "mse":
            return F.mse_loss(a, b)
        return mmd(a, b, kernel=self.params.mmd_kernel)

    def generator_loss(
        self,
        model: FedModel,
        y_c: torch.Tensor,
        ref: torch.Tensor | None,
        protos: torch.Tensor,
        nets: WorkingNets | None = None,
    ) -> torch.Tensor:
        """Eq. 5: ``CE(h(g(z, c)), c) - alpha * D``; D = MMD(g(z, c), U) against the real batch
        ``ref`` or (``generator_distance="mse"``) MSE(g(z, c), u_bar_c)."""
        g = self._nets(nets).generator(self.noise(y_c.shape[0], y_c.device), y_c)
        loss = F.cross_entropy(model.head(g), y_c)
        if self.params.alpha:
            if self.params.generator_distance == "mse":
                dist = F.mse_loss(g, protos[y_c])
            else:
                assert ref is not None
                dist = mmd(g, ref, kernel=self.params.mmd_kernel)
            loss = loss - self.params.alpha * dist
        return loss

    def rtnet_loss(
        self,
        model: FedModel,
        y: torch.Tensor,
        y_c: torch.Tensor,
        ref: torch.Tensor | None,
        protos: torch.Tensor,
        nets: WorkingNets | None = None,
    ) -> torch.Tensor:
        """Eq. 6: ``-H(h(u_hat)) + beta * D(u_hat, U)`` for Eq. 2's embeddings (U: the real
        batch) and ``-H(h(u_hat_c)) + beta * D(u_hat_c, u_bar_c)`` for Eq. 3's, averaged over
        the branches in use. The generator is fixed (its output is detached)."""
        gen, rt = self._nets(nets).generator, self._nets(nets).rtnet
        assert rt is not None
        mode = self.params.embeddings
        branches = []
        if mode in ("both", "u_hat"):
            assert ref is not None
            branches.append((ref, y))
        if mode in ("both", "u_hat_c"):
            branches.append((protos[y_c], y_c))
        parts = []
        for base, labels in branches:
            with torch.no_grad():
                g = gen(self.noise(labels.shape[0], labels.device), labels)
            emb = rt(base, g, labels)
            loss = -entropy(model.head(emb))
            if self.params.beta:
                dist = self._distance(self.params.rtnet_distance, emb, base)
                loss = loss + self.params.beta * dist
            parts.append(loss)
        return torch.stack(parts).mean()

    def _optimizers(self, ctx: ClientContext, state: State, nets: WorkingNets):
        """The model's, the generator's and (if any) the RTNet's optimizers of this round."""
        p, gen, rt = self.params, nets.generator, nets.rtnet
        opt = self.make_optimizer(ctx, state)
        opt_g = self._aux_optimizer(gen, p.lr_generator, state, "optimizer_generator")
        opt_r = None
        if rt is not None:
            opt_r = self._aux_optimizer(rt, p.lr_rtnet, state, "optimizer_rtnet")
        return opt, opt_g, opt_r

    def _keep_optimizers(self, state: State, opt, opt_g, opt_r) -> None:
        """Store the optimizers' states in the client state (``train.optimizer_state=persist``)."""
        if self.train.optimizer_state == "persist":
            state["optimizer"] = opt.state_dict()
            state["optimizer_generator"] = opt_g.state_dict()
            if opt_r is not None:
                state["optimizer_rtnet"] = opt_r.state_dict()

    def _aux_optimizer(self, module: nn.Module, lr: float, state: State, key: str):
        opt = torch.optim.SGD(module.parameters(), lr=lr, momentum=self.params.aux_momentum)
        if self.train.optimizer_state == "persist" and key in state:
            opt.load_state_dict(state[key])
        return opt

    @staticmethod
    def _step(opt: torch.optim.Optimizer, module: nn.Module, loss: torch.Tensor) -> None:
        """One step of ``module`` alone: gradients w.r.t. its parameters only (the model's
        ``.grad`` is left untouched)."""
        params = [p for p in module.parameters() if p.requires_grad]
        grads = torch.autograd.grad(loss, params)
        for p, g in zip(params, grads, strict=True):
            p.grad = g
        opt.step()
        opt.zero_grad(set_to_none=True)

    def local_train(self, ctx: ClientContext, state: State) -> tuple[int, float]:
        """The round's local steps: model (Eq. 1), generator (Eq. 5), RTNet (Eq. 6)."""
        if self.params.variant == "paper":
            return self._local_train_paper(ctx, state)
        return self._local_train_released(ctx, state)

    # ------------------------------------------------------------------ paper variant
    def paper_schedule(self, rnd: int) -> tuple[float, float]:
        """(lambda_syn(t), lambda_c(t)): Sec. 3.2 ramps both the residual weight of Eq. 3 and
        the prototype EMA rate of Eq. 4 up exponentially; fedshift uses the released code's
        schedule ``min(1, exp(gamma (e - T)))`` for the ramp (the paper cites [21] without a
        formula) times the maxima ``lambda_syn`` and ``prototype_momentum``.
        ``ramp_up=false``: the maxima throughout."""
        p = self.params
        r = min(1.0, ramp_factor(rnd, self.train.rounds, p.ramp_gamma)) if p.ramp_up else 1.0
        return p.lambda_syn * r, p.prototype_momentum * r

    def class_labels(self, batch: int, device: torch.device) -> torch.Tensor:
        """Labels of the sum over all classes c in Eq. 2 / 6: every class, ``per_class``
        times, grouped by class."""
        k = self.params.per_class or max(2, batch // self.num_classes)
        return torch.arange(self.num_classes, device=device).repeat_interleave(k)

    def paper_embeddings(
        self,
        base: torch.Tensor,
        labels: torch.Tensor,
        lam: float,
        nets: WorkingNets | None = None,
    ) -> torch.Tensor:
        """Eq. 3: ``base + lambda_syn * m(g(z, labels))``; ``agnostic``: ``g(z, labels)``."""
        nets = self._nets(nets)
        g = nets.generator(self.noise(labels.shape[0], labels.device), labels)
        return g if nets.rtnet is None else nets.rtnet(base, g, labels, scale=lam)

    def per_class_sum(self, values: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """``sum_c mean_{i: labels_i = c} values_i`` (the sums over c of Eq. 2 and 6)."""
        onehot = F.one_hot(labels, self.num_classes).to(values.dtype)
        return ((onehot.t() @ values) / onehot.sum(0).clamp(min=1)).sum()

    def per_class_mmd(
        self, emb: torch.Tensor, labels: torch.Tensor, protos: torch.Tensor
    ) -> torch.Tensor:
        """Eq. 6's ``sum_c MMD(u_hat_c, u_bar_c)``: one MMD per class against its prototype."""
        return torch.stack(
            [
                self._distance(self.params.rtnet_distance, emb[labels == c], protos[c : c + 1])
                for c in labels.unique()
            ]
        ).sum()

    def paper_losses_model(
        self,
        model: FedModel,
        u: torch.Tensor,
        y: torch.Tensor,
        protos: torch.Tensor,
        lam: float,
        nets: WorkingNets | None = None,
    ) -> torch.Tensor:
        """Eq. 1 ``L_cls = L_real + L_syn`` with Eq. 2 ``L_syn = CE(h(u_hat), y) +
        sum_c CE(h(u_hat_c), c)``; the synthetic embeddings carry no gradient (head only)."""
        mode = self.params.embeddings
        loss = F.cross_entropy(model.head(u), y)
        with torch.no_grad():
            if mode in ("both", "u_hat", "agnostic"):
                e = self.paper_embeddings(u.detach(), y, lam, nets)
            yc = self.class_labels(y.shape[0], y.device)
            if mode in ("both", "u_hat_c", "agnostic"):
                ec = self.paper_embeddings(protos[yc], yc, lam, nets)
        if mode in ("both", "u_hat", "agnostic"):
            loss = loss + F.cross_entropy(model.head(e), y)
        if mode in ("both", "u_hat_c", "agnostic"):
            ce = F.cross_entropy(model.head(ec), yc, reduction="none")
            loss = loss + self.per_class_sum(ce, yc)
        return loss

    def paper_generator_loss(
        self,
        model: FedModel,
        u: torch.Tensor,
        y: torch.Tensor,
        lam: float,
        nets: WorkingNets | None = None,
    ) -> torch.Tensor:
        """Eq. 5: ``CE(h(u_hat), y) - alpha * MMD(u_hat, u)`` with ``u_hat`` of Eq. 3 built
        through the fixed RTNet from the batch's real embeddings ``u`` and labels ``y``."""
        e = self.paper_embeddings(u, y, lam, nets)
        loss = F.cross_entropy(model.head(e), y)
        if self.params.alpha:
            loss = loss - self.params.alpha * mmd(e, u, kernel=self.params.mmd_kernel)
        return loss

    def paper_rtnet_loss(
        self,
        model: FedModel,
        u: torch.Tensor,
        y: torch.Tensor,
        protos: torch.Tensor,
        lam: float,
        nets: WorkingNets | None = None,
    ) -> torch.Tensor:
        """Eq. 6: ``-(H(h(u_hat)) + sum_c H(h(u_hat_c))) + beta (MMD(u_hat, u) +
        sum_c MMD(u_hat_c, u_bar_c))``, generator fixed."""
        gen, rt = self._nets(nets).generator, self._nets(nets).rtnet
        assert rt is not None
        mode, beta = self.params.embeddings, self.params.beta
        loss = torch.zeros((), device=u.device)
        if mode in ("both", "u_hat"):
            with torch.no_grad():
                g = gen(self.noise(y.shape[0], y.device), y)
            e = rt(u, g, y, scale=lam)
            loss = loss - entropy(model.head(e))
            if beta:
                loss = loss + beta * self._distance(self.params.rtnet_distance, e, u)
        if mode in ("both", "u_hat_c"):
            yc = self.class_labels(y.shape[0], y.device)
            with torch.no_grad():
                g = gen(self.noise(yc.shape[0], yc.device), yc)
            ec = rt(protos[yc], g, yc, scale=lam)
            logits = model.head(ec)
            ent = -(F.softmax(logits, 1) * F.log_softmax(logits, 1)).sum(1)
            loss = loss - self.per_class_sum(ent, yc)
            if beta:
                loss = loss + beta * self.per_class_mmd(ec, yc, protos)
        return loss

    def _local_train_paper(self, ctx: ClientContext, state: State) -> tuple[int, float]:
        """Algorithm 1, lines 19-20, per mini-batch: model step on Eq. 1 (generator and RTNet
        fixed), then generator step on Eq. 5 and RTNet step on Eq. 6 (model fixed)."""
        nets: WorkingNets = ctx.scratch[NETS]
        p, model, gen, rt = self.params, ctx.model, nets.generator, nets.rtnet
        opt, opt_g, opt_r = self._optimizers(ctx, state, nets)
        lam, lam_c = self.paper_schedule(ctx.round)
        protos = state["prototypes"].to(ctx.device)
        total = torch.zeros((), device=ctx.device)
        steps = 0
        for x, y in ctx.batches():
            if y.ndim != 1:
                raise TrainingError(
                    "fraug needs integer labels, but an augment produced soft labels"
                )
            model.train()
            gen.eval()
            if rt is not None:
                rt.eval()
            opt.zero_grad(set_to_none=True)
            u = model.features(x)
            protos = update_prototypes(protos, u, y, lam_c)  # Eq. 4
            loss = self.paper_losses_model(model, u, y, protos, lam, nets)
            loss.backward()
            opt.step()
            total += loss.detach()
            steps += 1
            model.eval()
            if p.reference == "eval":
                with torch.no_grad():
                    ref = model.features(x)
            else:
                ref = u.detach()
            gen.train()
            self._step(opt_g, gen, self.paper_generator_loss(model, ref, y, lam, nets))
            if rt is not None and opt_r is not None:
                gen.eval()
                rt.train()
                self._step(opt_r, rt, self.paper_rtnet_loss(model, ref, y, protos, lam, nets))
        model.train()
        state["prototypes"] = protos
        self._keep_optimizers(state, opt, opt_g, opt_r)
        return steps, float(total) / max(steps, 1)

    # --------------------------------------------------------------- released variant
    def _local_train_released(self, ctx: ClientContext, state: State) -> tuple[int, float]:
        """The released code's local steps (``users/user_FRAug.py``)."""
        nets: WorkingNets = ctx.scratch[NETS]
        p, model, gen, rt = self.params, ctx.model, nets.generator, nets.rtnet
        opt, opt_g, opt_r = self._optimizers(ctx, state, nets)
        w = synthetic_weight(ctx.round, self.train.rounds, p.lambda_syn, p.ramp_gamma, p.ramp_up)
        mix = ramp_factor(ctx.round, self.train.rounds, p.ramp_gamma) if p.interpolate else None
        needs_ref = (p.alpha and p.generator_distance == "mmd") or (
            rt is not None and p.embeddings in ("both", "u_hat")
        )
        protos = state["prototypes"].to(ctx.device)
        offset = int(state["label_offset"])
        total = torch.zeros((), device=ctx.device)
        steps = 0
        for x, y in ctx.batches():
            if y.ndim != 1:
                raise TrainingError(
                    "fraug needs integer labels, but an augment produced soft labels"
                )
            y_c = cyclic_labels(offset, y.shape[0], self.num_classes, y.device)
            offset = (offset + y.shape[0]) % self.num_classes
            # -- model step, Eq. 1 (generator and RTNet fixed, in evaluation mode)
            model.train()
            gen.eval()
            if rt is not None:
                rt.eval()
            opt.zero_grad(set_to_none=True)
            u = model.features(x)
            protos = update_prototypes(protos, u, y, p.prototype_momentum)  # Eq. 4
            loss = F.cross_entropy(model.head(u), y)
            if w > 0:
                syn = self.synthetic_loss(model, u, y, y_c, protos, mix, nets)
                loss = (1 - w) * loss + w * syn
            loss.backward()
            opt.step()
            total += loss.detach()
            steps += 1
            # -- generator step, Eq. 5, then RTNet step, Eq. 6 (model fixed, eval mode)
            model.eval()
            ref = None
            if needs_ref:
                if p.reference == "eval":
                    with torch.no_grad():
                        ref = model.features(x)
                else:
                    ref = u.detach()
            gen.train()
            self._step(opt_g, gen, self.generator_loss(model, y_c, ref, protos, nets))
            if rt is not None and opt_r is not None:
                gen.eval()
                rt.train()
                self._step(opt_r, rt, self.rtnet_loss(model, y, y_c, ref, protos, nets))
        model.train()
        state["prototypes"] = protos
        state["label_offset"] = offset
        self._keep_optimizers(state, opt, opt_g, opt_r)
        return steps, float(total) / max(steps, 1)
