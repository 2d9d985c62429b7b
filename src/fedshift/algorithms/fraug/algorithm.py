"""FRAug's algorithm (Chen et al., ICCV 2023, Sec. 3 and Algorithm 1): FedBN-style training
(local BN layers, everything else averaged) plus a shared class-conditional generator
(averaged like the model, payload record ``generator``) and a per-client RTNet (client state
only, never sent); synthetic embeddings train the prediction head. One local step per
mini-batch: model (Eq. 1), generator (Eq. 5), RTNet (Eq. 6); the losses are in
:mod:`fedshift.algorithms.fraug.objectives`. Evaluation is FedBN's (personal models)."""

from __future__ import annotations

import copy

import torch
from torch import nn

from fedshift.algorithms.base import Algorithm, Reply, State
from fedshift.algorithms.bn import bn_keys
from fedshift.algorithms.fraug.nets import (
    Generator,
    RTNet,
    ramp_factor,
    synthetic_weight,
    update_prototypes,
)
from fedshift.algorithms.fraug.objectives import Objectives, StepBatch, WorkingNets
from fedshift.algorithms.fraug.params import VARIANTS, FRAugParams, RoundPlan
from fedshift.algorithms.local_train import keep_optimizers, restore_optimizer, run_steps
from fedshift.algorithms.state import ABSENT, StateInit, StateVar, client_var, server_var
from fedshift.algorithms.tensors import clone, subset
from fedshift.core.config import TrainConfig
from fedshift.core.context import ClientContext
from fedshift.core.disclosure import (
    DOWN,
    UP,
    Disclosure,
    Kind,
    To,
    When,
    fixed,
    sums_only,
    tensor_bytes,
)
from fedshift.core.errors import ConfigError, TrainingError
from fedshift.core.payload import Payload
from fedshift.models.base import FedModel

#: ``ctx.scratch`` key of the round's :class:`WorkingNets`
NETS = "fraug/nets"


class FRAug(Objectives, Algorithm[FRAugParams]):
    """FedBN + a shared embedding generator + local RTNets; synthetic embeddings train the head."""

    name = "fraug"
    tasks = ("classification",)  # its objective needs one label per image
    # Algorithm 1's server update averages the client parameters with equal weights
    paper_weighting = "uniform"
    depends_on_rounds = True  # the ramp-up of lambda_syn / lambda_c runs over train.rounds
    Params = FRAugParams

    @classmethod
    def check(cls, params: FRAugParams, train: TrainConfig) -> None:
        def bad(key: str, why: str) -> ConfigError:
            return ConfigError(f"config key 'algorithm.{key}' {why}, got {getattr(params, key)!r}")

        if params.ramp_up and params.ramp_gamma <= 0:
            raise bad("ramp_gamma", "must be > 0 with ramp_up=true (set ramp_up=false instead)")
        variant = VARIANTS[params.variant]
        if variant.generator_on_residual and params.generator_distance != "mmd":
            raise bad(
                "generator_distance",
                f"has no effect with variant={params.variant} (Eq. 5 compares u_hat with the "
                "real batch by MMD; the distance to the class prototypes is the released "
                "code's: set variant=released, or drop the key)",
            )
        if params.interpolate and not variant.interpolates:
            raise bad(
                "interpolate",
                f"has no effect with variant={params.variant} (the paper has no interpolation "
                "step; it is the released code's use_feature_inter: set variant=released)",
            )
        if params.per_class is not None and not variant.class_sums:
            raise bad(
                "per_class",
                f"has no effect with variant={params.variant} (its class branch cycles the "
                "labels through the classes instead of summing over them: set variant=paper)",
            )
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
        self.variant = VARIANTS[p.variant]
        self.dim, self.num_classes = head.in_features, head.out_features
        self.noise_dim = p.noise_dim or max(1, self.dim // 2)
        self.rtnet_hidden = p.rtnet_hidden or self.noise_dim
        self.generator = Generator(
            self.noise_dim, self.num_classes, self.dim, p.generator_hidden or self.dim
        )
        #: ``generator`` and ``rtnet`` are templates (architecture and initial weights):
        #: each local update trains its own copies (:class:`WorkingNets`), so the algorithm
        #: object never changes during a round
        self.generator_local_keys = bn_keys(self.generator, p.generator_bn)
        local = set(self.generator_local_keys)
        self.generator_shared_keys = [k for k in self.generator.state_dict() if k not in local]
        self.uses_rtnet = p.embeddings != "agnostic"
        self.rtnet: RTNet | None = self._new_rtnet() if self.uses_rtnet else None

    def _new_rtnet(self) -> RTNet:
        return RTNet(self.dim, self.num_classes, self.rtnet_hidden)

    # -- server ----------------------------------------------------------------------------
    def server_vars(self) -> list[StateVar]:
        return [
            *super().server_vars(),
            server_var("generator", lambda at: clone(self.generator.state_dict()), "mean",
                       doc="the feature generator (shared tensors: the replies' mean)"),
        ]  # fmt: skip

    def disclosures(self, model: FedModel) -> list[Disclosure]:
        gen = fixed(tensor_bytes(self.generator.state_dict(), self.generator_shared_keys))
        return [
            *self.weights_disclosures(model),
            Disclosure("generator", UP, Kind.PARAMETERS, When.ROUND, gen,
                       "the site's trained feature generator (shared tensors)", to=To.AGGREGATE),
            Disclosure("generator", DOWN, Kind.PARAMETERS, When.ROUND, gen,
                       "the aggregated feature generator", carries=("generator",)),
        ]  # fmt: skip

    def broadcast(self, server: State, rnd: int, cid: str) -> Payload:
        return Payload(
            {
                "weights": subset(server["weights"], self.shared_keys),
                "generator": subset(server["generator"], self.generator_shared_keys),
            }
        )

    @sums_only("weights", "generator")  # both weighted means only
    def aggregate(self, server: State, rnd: int, replies: list[Reply]) -> None:
        self.aggregate_declared(server, replies)

    # -- client ----------------------------------------------------------------------------
    def client_vars(self) -> list[StateVar]:
        def prototypes(at: StateInit) -> torch.Tensor:
            ref = next(at.model.parameters(), None)  # on the model's device, like the rest
            device = None if ref is None else ref.device
            return torch.zeros(self.num_classes, self.dim, device=device)

        rtnet = [
            client_var("rtnet", lambda at: clone(self._new_rtnet().state_dict()),
                       doc="the client's RTNet (a fresh one draws from the torch stream)"),
        ] if self.uses_rtnet else []  # fmt: skip
        return [
            *super().client_vars(),
            client_var("generator_local",
                       lambda at: clone(subset(self.generator.state_dict(),
                                               self.generator_local_keys)),
                       doc="the generator's client-local tensors"),
            *rtnet,
            client_var("prototypes", prototypes, doc="the client's class prototypes"),
            client_var("label_offset", 0, doc="the prototype update's label offset"),
            client_var("optimizer_generator", ABSENT, doc="optimizer_state=persist"),
            client_var("optimizer_rtnet", ABSENT, doc="optimizer_state=persist (RTNet)"),
        ]  # fmt: skip

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

    def _optimizers(self, ctx: ClientContext, state: State, nets: WorkingNets):
        """The model's, the generator's and (if any) the RTNet's optimizers of this round."""
        p, gen, rt = self.params, nets.generator, nets.rtnet
        opt = self.make_optimizer(ctx, state)
        opt_g = self._aux_optimizer(gen, p.lr_generator, state, "optimizer_generator")
        opt_r = None
        if rt is not None:
            opt_r = self._aux_optimizer(rt, p.lr_rtnet, state, "optimizer_rtnet")
        return opt, opt_g, opt_r

    def _aux_optimizer(self, module: nn.Module, lr: float, state: State, key: str):
        opt = torch.optim.SGD(module.parameters(), lr=lr, momentum=self.params.aux_momentum)
        return restore_optimizer(opt, state, key, self.train)

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

    # -- the local steps (Algorithm 1, lines 19-20) -----------------------------------------
    def round_plan(self, rnd: int) -> RoundPlan:
        """Round ``rnd``'s schedule. Paper (Sec. 3.2): lambda_syn (Eq. 3's residual scale) and
        lambda_c (Eq. 4's EMA rate) ramp up exponentially; the paper cites [21] without a
        formula, fedshift uses the released code's ``r_t = min(1, exp(gamma (e - T)))``
        (``ramp_factor``) times the maxima ``lambda_syn`` and ``prototype_momentum``
        (``ramp_up=false``: the maxima throughout). Code: an unscaled residual, a constant
        rate, the loss weight ``w_t = min(lambda_syn, exp(gamma (e - T)))`` and, with
        ``interpolate``, ``r = exp(gamma (e - T))``."""
        p, v, rounds = self.params, self.variant, self.train.rounds
        r = min(1.0, ramp_factor(rnd, rounds, p.ramp_gamma)) if p.ramp_up else 1.0
        scale = p.lambda_syn * r if v.scaled_residual else 1.0
        rate = p.prototype_momentum * r if v.ramped_prototypes else p.prototype_momentum
        weight = None
        if not v.additive_losses:
            weight = synthetic_weight(rnd, rounds, p.lambda_syn, p.ramp_gamma, p.ramp_up)
        mix = None
        if v.interpolates and p.interpolate:
            mix = ramp_factor(rnd, rounds, p.ramp_gamma)
        return RoundPlan(scale=scale, proto_rate=rate, syn_weight=weight, mix=mix)

    def needs_reference(self, rtnet: RTNet | None) -> bool:
        """Whether a step's generator or RTNet loss reads the real batch's embeddings."""
        p = self.params
        return (
            self.variant.generator_on_residual
            or (bool(p.alpha) and p.generator_distance == "mmd")
            or (rtnet is not None and p.embeddings in ("both", "u_hat"))
        )

    def local_train(self, ctx: ClientContext, state: State) -> tuple[int, float]:
        """The round's local steps, per mini-batch (Algorithm 1, lines 19-20): a model step on
        Eq. 1 (generator and RTNet fixed, in evaluation mode) after the prototype update of
        Eq. 4, then a generator step on Eq. 5 and an RTNet step on Eq. 6 (model fixed, in
        evaluation mode), in that order as in the released code. Returns the model steps'
        mean loss."""
        nets: WorkingNets = ctx.scratch[NETS]
        p, model, gen, rt = self.params, ctx.model, nets.generator, nets.rtnet
        opt, opt_g, opt_r = self._optimizers(ctx, state, nets)
        plan = self.round_plan(ctx.round)
        needs_ref = self.needs_reference(rt)
        protos = state["prototypes"].to(ctx.device)
        offset = int(state["label_offset"])

        def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            nonlocal protos, offset
            if y.ndim != 1:
                raise TrainingError(
                    "fraug needs integer labels, but an augment produced soft labels"
                )
            y_c = self.class_labels(y.shape[0], y.device, offset)
            if not self.variant.class_sums:  # the cycled labels continue across steps
                offset = (offset + y.shape[0]) % self.num_classes
            # -- model step, Eq. 1 (generator and RTNet fixed)
            model.train()
            gen.eval()
            if rt is not None:
                rt.eval()
            opt.zero_grad(set_to_none=True)
            u = model.features(x)
            protos = update_prototypes(protos, u, y, plan.proto_rate)  # Eq. 4
            loss = self.model_loss(model, u, StepBatch(y, y_c, None, protos, plan, nets))
            loss.backward()
            opt.step()
            # -- generator step, Eq. 5, then RTNet step, Eq. 6 (model fixed)
            model.eval()
            ref = None
            if needs_ref:
                if p.reference == "eval":
                    with torch.no_grad():
                        ref = model.features(x)
                else:
                    ref = u.detach()
            gen.train()
            batch = StepBatch(y, y_c, ref, protos, plan, nets)
            self._step(opt_g, gen, self.generator_loss(model, batch))
            if rt is not None and opt_r is not None:
                gen.eval()
                rt.train()
                self._step(opt_r, rt, self.rtnet_loss(model, batch))
            return loss

        out = run_steps(ctx, step)
        model.train()
        state["prototypes"] = protos
        state["label_offset"] = offset
        keep_optimizers(
            state, self.train, optimizer=opt, optimizer_generator=opt_g, optimizer_rtnet=opt_r
        )
        return out
