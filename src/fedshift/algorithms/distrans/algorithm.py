"""DisTrans's algorithm (Yuan et al., ECCV 2022, Algorithm 1 and Sec. 4.4): per-client offsets
trained jointly with a double-input-channel model averaged FedAvg-style; offsets aggregated by
averaging, by the server network, or not at all (the DH rule, Eq. 3-4, picks with
``aggregation=auto``). docs/METHODS.md has the paper / released-code differences."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import cast

import torch
from torch import nn

from fedshift.algorithms.base import Reply, State
from fedshift.algorithms.bn import FrozenBNStats, bn_keys
from fedshift.algorithms.distrans.aggregator import (
    AggPair,
    OffsetAggregator,
    class_share,
    label_proportions,
    train_aggregator,
)
from fedshift.algorithms.distrans.model import DisTransModel
from fedshift.algorithms.distrans.params import (
    DEFAULT_NORM,
    LABEL_RECORD,
    OFFSET,
    OFFSET_RECORD,
    DisTransParams,
)
from fedshift.algorithms.halves import ClientHalf, ServerHalf
from fedshift.algorithms.local_train import keep_optimizers, restore_optimizer, run_steps
from fedshift.algorithms.state import ABSENT, StateInit, StateVar, client_var, replaced, server_var
from fedshift.algorithms.tensors import clone, subset, weighted_average
from fedshift.core.context import ClientContext
from fedshift.core.disclosure import DOWN, UP, Disclosure, Kind, Over, To, When, fixed, tensor_bytes
from fedshift.core.federation import Federation
from fedshift.core.payload import Payload, Tensors
from fedshift.core.seeding import derive_seed
from fedshift.data.partition import degree_of_heterogeneity
from fedshift.models.base import FedModel


@contextmanager
def _frozen(param: nn.Parameter) -> Iterator[None]:
    """``param`` takes no gradient inside the block."""
    param.requires_grad_(False)
    try:
        yield
    finally:
        param.requires_grad_(True)


def _model(ctx: ClientContext) -> DisTransModel:
    """The client's model as the type checker should see it: the DisTransModel that
    :meth:`DisTrans.setup` checked (a cast, nothing is converted)."""
    return cast(DisTransModel, ctx.model)


# ----------------------------------------------------------------------------- offset mode
def offset_mode(params: DisTransParams, server: State) -> str:
    """``none`` / ``avg`` / ``nn`` now; ``pending`` while ``auto`` does not know DH."""
    agg = params.aggregation
    if agg != "auto":
        return agg
    dh = server.get("dh")
    if dh is None:
        return "pending"
    return params.auto_aggregator if dh < params.dh_threshold else "none"


def wants_label_dist(params: DisTransParams) -> bool:
    """Whether the clients upload their label counts (the NN aggregator or DH need them)."""
    return params.aggregation in ("nn", "auto")


def aggregated_offset(params: DisTransParams, server: State, cid: str) -> torch.Tensor | None:
    """The offset the server gives client ``cid`` now (None: it keeps its own); ``server``
    is the server state or the client's server view."""
    mode = offset_mode(params, server)
    if mode == "avg":
        return server.get("offset_avg")
    if mode == "nn":
        return server.get("offset_nn", {}).get(cid)
    return None


# ----------------------------------------------------------------------------- the client half
class DisTransClient(ClientHalf[DisTransParams]):
    """DisTrans's client half: the offset and the double-input-channel model trained
    jointly, the offset and label counts uploaded when the server asks; no NN aggregator."""

    #: the offset trains whatever train.trainable freezes (it is the method)
    always_trained = (OFFSET,)
    name = "distrans"
    tasks = ("classification",)  # its objective needs one label per image
    Params = DisTransParams
    paper_weighting = "uniform"  # Alg. 1 averages the local models uniformly

    # -- config / model --------------------------------------------------------------------
    def setup(self, model: FedModel) -> None:
        if not isinstance(model, DisTransModel):
            raise TypeError("distrans trains a DisTransModel: build it with DisTrans.wrap_model")
        self.input_shape = model.input_shape
        self.num_classes = int(model.classifier.out_features)

    @classmethod
    def wrap_model(
        cls, params: DisTransParams, model: FedModel, federation: Federation
    ) -> FedModel:
        """The double-input-channel model around the configured backbone. Draws the dense
        layer's initial weights and the seed of the clients' offset streams from the run's
        seeded RNG."""
        return DisTransModel(
            model,
            federation.num_classes,
            federation.input_shape,
            params.alpha,
            params.channels,
            offset_seed=int(torch.randint(0, 2**62, ())),
        )

    def compute_local_keys(self, model: FedModel) -> list[str]:
        return [OFFSET, *bn_keys(model, self.params.bn_policy)]

    def disclosures(self, model: FedModel) -> list[Disclosure]:
        offset = fixed(tensor_bytes(model.state_dict(), [OFFSET]))
        when = "while the offsets are aggregated (aggregation avg or nn; auto: decided by DH)"
        out = [
            *self.weights_disclosures(model),
            Disclosure(
                OFFSET_RECORD,
                UP,
                Kind.PARAMETERS,
                When.ROUND,
                offset,
                "the site's trained input offset (an image-shaped tensor)",
                to=To.AGGREGATE,
                maybe=when,
            ),
            Disclosure(
                OFFSET_RECORD,
                DOWN,
                Kind.PARAMETERS,
                When.ROUND,
                offset,
                "the aggregated offset for this site",
                carries=(OFFSET_RECORD,),
                maybe=when,
            ),
        ]
        if self.wants_label_dist():
            out.append(
                Disclosure(
                    LABEL_RECORD,
                    UP,
                    Kind.STATISTIC,
                    When.ONCE,
                    fixed(self.num_classes * 4),
                    "the site's examples per class",
                    to=To.SERVER,
                    over=Over.SITE,
                )
            )
        return out  # fmt: skip

    # -- offset aggregation mode -----------------------------------------------------------
    def offset_mode(self, server: State) -> str:
        """``none`` / ``avg`` / ``nn`` now; ``pending`` while ``auto`` does not know DH."""
        return offset_mode(self.params, server)

    def wants_label_dist(self) -> bool:
        return wants_label_dist(self.params)

    def aggregated_offset(self, server: State, cid: str) -> torch.Tensor | None:
        """The offset the server gives client ``cid`` now (None: it keeps its own)."""
        return aggregated_offset(self.params, server, cid)

    # -- client ----------------------------------------------------------------------------
    def client_vars(self) -> list[StateVar]:
        """The client's offset (in ``local``) starts as a U[0, 1] image from its own stream;
        it is mapped to the model's input space (the run's normalisation) when the client
        first trains (``offset_raw``)."""
        base = super().client_vars()
        local = next(v for v in base if v.name == "local")

        def with_offset(at: StateInit) -> Tensors:
            tensors: Tensors = local.initial(at)
            seed = cast(DisTransModel, at.model).offset_seed  # the model setup checked
            g = torch.Generator().manual_seed(derive_seed(seed, "distrans/offset", at.cid))
            ref = tensors[OFFSET]
            tensors[OFFSET] = torch.rand(self.input_shape, generator=g).to(ref.device)
            return tensors

        return [
            *replaced(base, "local", init=with_offset),
            client_var("offset_raw", True, doc="the offset is still the U[0, 1] image"),
            client_var("cid", lambda at: at.cid, doc="the client's id (its aggregated offset)"),
            client_var("label_dist_sent", False, doc="its label counts were sent"),
            client_var("offset_optimizer", ABSENT, doc="optimizer_state=persist: the offset's"),
        ]  # fmt: skip

    @staticmethod
    def _normalise(u: torch.Tensor, ctx: ClientContext | None = None) -> torch.Tensor:
        """A raw offset in [0, 1] mapped to the model's input space with the normalisation of
        ``ctx``'s input pipeline; 0.5 / 0.5 without a context (a client that has not trained
        yet) or when the pipeline does not normalise (an augment normalises itself)."""
        norm = None if ctx is None else ctx.pipeline.normalize
        if norm is None or not hasattr(norm, "mean"):
            mean, std = DEFAULT_NORM
            return (u - mean) / std
        # typed as a plain callable; a Normalize has mean and std (hasattr above)
        std = norm.std  # type: ignore[attr-defined]
        m, s = norm.mean.detach().reshape(-1, 1, 1), std.detach().reshape(-1, 1, 1)
        return (u - m.to(u.device)) / s.to(u.device)

    def client_offset(self, state: State, ctx: ClientContext | None = None) -> torch.Tensor:
        """The client's current offset in the model's input space (a raw offset, before the
        client's first training, is normalised as :meth:`_normalise` says)."""
        t = state["local"][OFFSET]
        return self._normalise(t, ctx) if state.get("offset_raw") else t

    def local_update(self, ctx: ClientContext, down: Payload, state: State) -> Payload:
        if state.get("offset_raw"):
            state["local"][OFFSET] = self.client_offset(state, ctx)
            state["offset_raw"] = False
        self.load_client_model(ctx, down["weights"], state)
        if OFFSET_RECORD in down.records:  # continue from the server's aggregate
            with torch.no_grad():
                _model(ctx).offset.copy_(down[OFFSET_RECORD][OFFSET])
        steps, loss = self.local_train(ctx, state)
        self.keep_local(ctx, state)
        up = self.reply(ctx, state, steps, loss)
        if down.config.get("upload_offset"):
            up.records[OFFSET_RECORD] = {OFFSET: _model(ctx).offset.detach().clone()}
        if self.wants_label_dist() and not state["label_dist_sent"]:
            y = ctx.data.train.y.long()
            counts = torch.bincount(y, minlength=self.num_classes)[: self.num_classes]
            up.records[LABEL_RECORD] = {"counts": counts.float()}
            state["label_dist_sent"] = True
        return up

    # -- the local loop --------------------------------------------------------------------
    def trainable(self, ctx: ClientContext) -> list[torch.nn.Parameter]:
        """The model optimiser (``train``) steps every trainable tensor but the offset."""
        return [p for n, p in ctx.model.named_parameters() if p.requires_grad and n != OFFSET]

    def make_offset_optimizer(self, ctx: ClientContext, state: State) -> torch.optim.SGD:
        """The offset's own SGD (``offset_lr``, ``offset_momentum``)."""
        opt = torch.optim.SGD(
            [_model(ctx).offset], lr=self.params.offset_lr, momentum=self.params.offset_momentum
        )
        return restore_optimizer(opt, state, "offset_optimizer", self.train)

    def offset_step(
        self, ctx: ClientContext, x: torch.Tensor, y: torch.Tensor, opt_t: torch.optim.SGD
    ) -> None:
        """Algorithm 1's offset update: one SGD step on t along the gradient of the loss at
        the current model, whose forward pass leaves BN running statistics untouched (they
        are updated once per batch, by the model step)."""
        offset = _model(ctx).offset
        with FrozenBNStats(ctx.model):
            loss_t = self.loss(ctx, x, y)
        (g,) = torch.autograd.grad(loss_t, [offset], allow_unused=True)
        offset.grad = torch.zeros_like(offset) if g is None else g
        opt_t.step()
        offset.grad = None

    def local_train(self, ctx: ClientContext, state: State) -> tuple[int, float]:
        """Algorithm 1's joint optimisation of the offset t and the model, per mini-batch:
        ``update=alternate`` (paper) an offset step (:meth:`offset_step`), then a model step
        with the updated offset held fixed; ``simultaneous`` (released code) one loss whose
        gradient both optimisers step on. Reports the model steps' mean loss."""
        model = _model(ctx)
        model.train()
        opt = self.make_optimizer(ctx, state)
        opt_t = self.make_offset_optimizer(ctx, state)
        alternate = self.params.update == "alternate"

        def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            if alternate:
                self.offset_step(ctx, x, y, opt_t)
            opt.zero_grad(set_to_none=True)
            if not alternate:
                opt_t.zero_grad(set_to_none=True)
            with _frozen(model.offset) if alternate else nullcontext():
                loss = self.loss(ctx, x, y)
                loss.backward()
            opt.step()
            if not alternate:
                opt_t.step()
            return loss

        out = run_steps(ctx, step)
        keep_optimizers(state, self.train, optimizer=opt, offset_optimizer=opt_t)
        return out

    # -- evaluation ------------------------------------------------------------------------
    def has_new_site_answer(self) -> bool:
        """A new site takes the shared model with the mean of the sources' offsets (and BN
        tensors): the offset is a local tensor ``personal_weights`` reads, the aggregated
        offset the server gives a source being its replacement."""
        return True

    def personal_weights(self, server: State, state: State) -> Tensors | None:
        """Shared model + the client's BN-policy tensors + the offset it holds next: the
        server's aggregate for it if there is one, else its own (applied at test time)."""
        local = dict(state["local"])
        agg = self.aggregated_offset(server, state["cid"])
        local[OFFSET] = agg if agg is not None else self.client_offset(state)
        return {**subset(server["weights"], self.shared_keys), **local}


# ----------------------------------------------------------------------------- the server half
class DisTransServer(ServerHalf[DisTransParams]):
    """DisTrans's server half: FedAvg-style averaging of the model, the DH rule and the
    offsets' aggregation (their mean or the Sec. 4.4 NN aggregator, built here only)."""

    #: set by the client half's ``setup`` (a server half is joined with its client half)
    input_shape: tuple[int, ...]
    num_classes: int

    def setup(self, model: FedModel) -> None:
        super().setup(model)  # the client half's: input shape, number of classes
        #: the server's working copy of the NN aggregator, created on first use; its weights
        #: are loaded from the server state every time (it carries nothing between calls)
        self._aggregator: OffsetAggregator | None = None

    # -- server ----------------------------------------------------------------------------
    def server_vars(self) -> list[StateVar]:
        aggregator = [
            server_var("aggregator", lambda at: clone(self._new_aggregator().state_dict()),
                       doc="the NN offset aggregator (aggregation nn or auto)"),
        ] if wants_label_dist(self.params) else []  # fmt: skip
        return [
            *super().server_vars(),
            server_var("label_dist", {}, doc="each site's label counts (aggregation nn, auto)"),
            server_var("dh", None, doc="the degree of heterogeneity (auto, once known)"),
            server_var("offset_avg", None, doc="the sites' mean offset (avg)"),
            server_var("offset_nn", {}, doc="each site's offset from the NN aggregator"),
            server_var("offset_in", {}, doc="each site's last uploaded offset (nn)"),
            server_var("nn_loss", [], doc="the NN aggregator's last training losses"),
            *aggregator,
        ]  # fmt: skip

    def broadcast(self, server: State, rnd: int, cid: str) -> Payload:
        down = Payload({"weights": subset(server["weights"], self.shared_keys)})
        offset = aggregated_offset(self.params, server, cid)
        if offset is not None:
            down.records[OFFSET_RECORD] = {OFFSET: offset}
        down.config["upload_offset"] = int(offset_mode(self.params, server) in ("avg", "nn"))
        return down

    def aggregate(self, server: State, rnd: int, replies: list[Reply]) -> None:
        self.aggregate_declared(server, replies)  # the weights' mean
        for cid, p in replies:
            if LABEL_RECORD in p.records:
                server["label_dist"][cid] = p[LABEL_RECORD]["counts"].detach().cpu().clone()
        if self.params.aggregation == "auto" and server["label_dist"]:
            ids = sorted(server["label_dist"])
            server["dh"] = degree_of_heterogeneity(
                torch.stack([server["label_dist"][c] for c in ids])
            )
        uploads = [(cid, p) for cid, p in replies if OFFSET_RECORD in p.records]
        mode = offset_mode(self.params, server)
        if not uploads or mode not in ("avg", "nn"):
            return
        if mode == "avg":
            avg = weighted_average([(self.reply_weight(p), p[OFFSET_RECORD]) for _, p in uploads])
            server["offset_avg"] = avg[OFFSET].detach().cpu()
            return
        self._aggregate_nn(server, uploads)

    def aggregator(self, server: State) -> OffsetAggregator:
        """The server's NN aggregator loaded from the server state."""
        if self._aggregator is None:
            self._aggregator = self._new_aggregator()
        self._aggregator.load_state_dict(server["aggregator"])
        return self._aggregator

    def _new_aggregator(self) -> OffsetAggregator:
        p = self.params
        return OffsetAggregator(
            self.num_classes,
            self.input_shape,
            p.nn_hidden,
            p.nn_width,
            offset_input=p.nn_input == "paper",
        )

    def _embeddings(self, server: State) -> dict[str, torch.Tensor]:
        """Each known client's aggregator embedding (``nn_input``): its class share among
        the clients whose label counts the server has, or its own label distribution."""
        ids = sorted(server["label_dist"])
        counts = torch.stack([server["label_dist"][c] for c in ids])
        emb = class_share(counts) if self.params.nn_input == "paper" else label_proportions(counts)
        return {c: emb[i] for i, c in enumerate(ids)}

    def _aggregate_nn(self, server: State, uploads: list[Reply]) -> None:
        agg = self.aggregator(server)
        emb = self._embeddings(server)
        paper = self.params.nn_input == "paper"
        fed_in: dict[str, torch.Tensor] = server.setdefault("offset_in", {})  # old checkpoints
        pairs: list[AggPair] = []
        for cid, p in uploads:
            if cid not in emb:
                continue
            t = p[OFFSET_RECORD][OFFSET].detach().float().cpu()
            pairs.append((emb[cid], fed_in.get(cid, t) if paper else None, t))
            if paper:
                fed_in[cid] = t
        if not pairs:
            return
        server["nn_loss"] = train_aggregator(agg, pairs, self.params.nn_steps, self.params.nn_lr)
        server["aggregator"] = clone(agg.state_dict())
        # every client the network can serve: known embedding (and, for the paper's input,
        # an offset it has uploaded at least once)
        ids = [c for c in sorted(emb) if not paper or c in fed_in]
        with torch.no_grad():
            e = torch.stack([emb[c] for c in ids])
            out = agg(e, torch.stack([fed_in[c] for c in ids]) if paper else None)
        server["offset_nn"] = {c: out[i].clone() for i, c in enumerate(ids)}

    # -- evaluation ------------------------------------------------------------------------
    def server_view(self, server: State, cid: str) -> State:
        """The shared weights plus what ``aggregated_offset`` reads for ``cid``."""
        view = super().server_view(server, cid)
        view.update({k: server[k] for k in ("dh", "offset_avg") if k in server})
        nn = server.get("offset_nn")
        if nn is not None:
            view["offset_nn"] = {cid: nn[cid]} if cid in nn else {}
        return view


class DisTrans(DisTransServer, DisTransClient):
    """Per-client offsets + a double-input-channel model averaged FedAvg-style."""

    client_half = DisTransClient
