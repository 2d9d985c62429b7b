"""DisTrans (Yuan, Hui, Yang, Burlina, Gong & Cao, "Addressing Heterogeneity in Federated
Learning via Distributional Transformation", ECCV 2022, arXiv 2210.15025).

Every client k owns an *offset* t_k shaped like one (normalised) model input and trains it
jointly with the shared model; the offset is applied at test time too, each client with its
own. The model is a *double-input-channel* model around any fedshift backbone
(:class:`DisTransModel`):

* Eq. 1: left = (1 - a) x + a t, right = (1 + a) x - a t (a = ``alpha`` = 0.3, the paper's
  default; one released script uses 0.2). x is recoverable: x = (left + right) / 2 and, for
  a > 0, t = ((1 + a) left - (1 - a) right) / (2 a) (:func:`recover`);
* one backbone shared by both channels (``backbone.features``), the two embeddings
  concatenated, one dense layer to the logits. The backbone's embedding layer is the paper's
  "dense layer accepting outputs from two channels in parallel" and the wrapper's
  ``classifier`` its "logits layer" (the released code: AlexNet's last layer replaced by a
  256-unit layer, then ``Linear(2 * 256, classes)``); the backbone's own classifier is
  dropped, as the released code drops ResNet's ``fc``.

Local training (Algorithm 1): per mini-batch the client first takes an SGD step on its offset
(lr ``offset_lr`` = 1e-3, no momentum, as the released ``SGD([trigger], lr)``), then a step
on the model with the updated offset (``train.optimizer`` / ``train.lr``; the paper's model
lr is 5e-3 and the released code uses plain SGD, no momentum or weight decay, with lr 5e-3,
so set ``train.lr=0.005`` to reproduce them: fedshift does not override ``train``).
``update=simultaneous`` is the released code instead: one forward/backward, both optimisers
step on the same gradient. In the alternating update the offset step's forward pass leaves
BN running statistics untouched, so they are updated once per batch in both modes.

Model weights (backbone + dense layer) are averaged as in FedAvg (``federation.weighting``;
the released code uses a uniform mean of every tensor, i.e. ``bn_policy=global``, the
default). The offset is a client-local key (``local_keys``): evaluation uses
``personal_weights`` = shared model + the client's offset, so there is no global model.

Offset aggregation (``aggregation``; the paper's Table 4 ablation is none / avg / nn):

* ``none``: each client keeps its own offset; nothing about offsets reaches the server.
* ``avg``: clients upload their offsets (record ``offset``), the server averages them with
  ``federation.weighting`` (the released ``avg_trigger`` is a uniform mean) and every client
  continues from the average.
* ``nn`` (Section 4.4): clients also upload their training-label counts once (record
  ``label_dist``). A server-side network (:class:`OffsetAggregator`) maps a client-specific
  embedding and the client's offset to an aggregated offset for that client. With
  ``nn_input=paper`` (default) the embedding is e with e_j = the client's share of all
  training images of class j (the column-normalised count matrix, :func:`class_share`) and
  the network also takes the client's offset, as Section 4.4 states. Section 4.4 trains it
  by regression on pairs (t_i, t'_i): t_i the offset client i uploaded this round, t'_i the
  aggregated offset the network output for it in the previous round; fedshift recomputes
  t'_i with the current network from the same inputs (e_i and the offset it was fed last
  time: the client's previous upload, or this one the first time), minimises ||t_i - t'_i||^2
  by SGD (``nn_steps`` passes, one step per uploaded offset, lr ``nn_lr`` = 1e-2, as
  ``hyperMACFed.py``: one step per client per round) and sends every client the network's
  output for (e_i, t_i). Clients with the same label counts (i.i.d. splits) therefore still
  get different offsets. ``nn_input=released`` is the released code's generator: its only
  input is the client's own label distribution (proportions summing to 1), so i.i.d. clients
  all receive one offset. Its weights live in the server state (checkpointed), never sent.
* ``auto`` (default): the paper's rule: aggregate only when the degree of heterogeneity
  DH < ``dh_threshold`` (50 %); otherwise ``none``. Below the threshold it uses
  ``auto_aggregator`` (``nn``: the released README runs ``hyperMACFed.py``, the NN aggregator,
  for the i.i.d. setting and ``MACFed.py`` without offset aggregation for the non-i.i.d.
  one). The server computes DH (:func:`fedshift.data.partition.degree_of_heterogeneity`) from
  the label distributions it has received; until it knows DH it asks for no offsets, so with
  DH >= 50 % offsets never leave the clients. Aggregation therefore starts in round 2.

Clients are evaluated with the offset they would hold next (the released code evaluates
after ``set_trigger``): the server's aggregate for them when one exists, otherwise their own.

Offset initialisation: the released ``random_initial`` draws an image from U[0, 1] and
normalises it with the dataset statistics, i.e. a random image in the model's input space.
fedshift draws U[0, 1] from a per-client stream derived from the run's seeded RNG and
normalises it with the run's ``input.mean/std`` the first time the client trains (the
algorithm sees the normalisation only through that round's client context); before that
(a client evaluated before it first trains), and when an augment normalises the inputs
itself (FedRDN), 0.5 / 0.5 is used. (The released
``hyperMACFed.py`` instead starts every client from the untrained aggregator's output; that
is not reproduced.)

Single-input-channel ablation (``channels=1``, Table 3): the backbone sees only the left
input (1 - a) x + a t and the dense layer takes one embedding (an assumption: the released
code has no single-channel offset model; its ``SingleModel`` baseline takes x with no offset).

Departures in the NN aggregator, all server-side: the released generator
(``TriggerHyperDis``: spectrally-normalised MLP -> linear -> 5 transposed convolutions with
BN + ReLU -> tanh, fixed 3 x 64 x 64) is generalised to any input shape (transposed
convolutions from 4 x 4 doubling up to the largest side, centre crop to H x W), without
spectral normalisation and without BN (the released BN layers run in training mode on one
label distribution at a time).

Sources: the paper (Yuan et al., ECCV 2022; Eq. 1-4, Algorithm 1, Section 4.4, Tables 1-7)
and the released code (hyhmia/DisTrans @7836e02). DH is the paper's Eq. 3-4,
:func:`fedshift.data.partition.degree_of_heterogeneity` (documented there).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn

from fedshift.algorithms import register
from fedshift.algorithms.base import Algorithm, FLParams, Reply, State
from fedshift.algorithms.bn import FrozenBNStats, bn_keys
from fedshift.algorithms.tensors import clone, subset, weighted_average
from fedshift.core.bounds import bounded
from fedshift.core.context import ClientContext
from fedshift.core.payload import Payload, Tensors
from fedshift.core.seeding import derive_seed
from fedshift.data.base import ClientData, Federation
from fedshift.data.partition import degree_of_heterogeneity
from fedshift.models.base import FedModel

#: the offset's key in the wrapper's state dict (and in the ``offset`` payload record)
OFFSET = "offset"
#: payload records
OFFSET_RECORD = "offset"
LABEL_RECORD = "label_dist"
#: the normalisation assumed when the run's is unknown (fedshift's default input.mean/std)
DEFAULT_NORM = (0.5, 0.5)

Aggregation = Literal["auto", "none", "avg", "nn"]


@dataclass
class DisTransParams(FLParams):
    # a of Eq. 1, in [0, 1) (paper: 0.3; released MACFed.py: 0.2)
    alpha: float = bounded(0.3, ge=0, lt=1)
    # SGD step size of the offset (paper and released code: 1e-3)
    offset_lr: float = bounded(1e-3, gt=0)
    # momentum of the offset's SGD (released: none)
    offset_momentum: float = bounded(0.0, ge=0, lt=1)
    # "alternate": offset step then model step per batch (Algorithm 1);
    # "simultaneous": both step on one gradient (the released code)
    update: Literal["alternate", "simultaneous"] = "alternate"
    # 2: double-input-channel model; 1: single channel (Table 3 ablation)
    channels: Literal[1, 2] = 2
    # offset aggregation: auto (DH rule), none, avg, nn (Table 4)
    aggregation: Aggregation = "auto"
    # auto: aggregate when DH (percent) is below this
    dh_threshold: float = bounded(50.0, ge=0, le=100, why="a percentage")
    # auto: which aggregation to use below the threshold
    auto_aggregator: Literal["nn", "avg"] = "nn"
    # nn aggregator: passes over the uploaded offsets per round (released: 1)
    nn_steps: int = bounded(1, ge=1)
    # nn aggregator: SGD step size (released: 1e-2)
    nn_lr: float = bounded(1e-2, gt=0)
    # nn aggregator: MLP width (released: 100)
    nn_hidden: int = bounded(100, ge=1)
    # nn aggregator: channels of the last transposed conv (released ngf: 64)
    nn_width: int = bounded(64, ge=1)
    # nn aggregator input: "paper" = class-share embedding e + the client's offset
    # (Sec. 4.4); "released" = the client's own label distribution only (hyperMACFed.py)
    nn_input: Literal["paper", "released"] = "paper"


# ----------------------------------------------------------------------------- Eq. 1
def blend(x: torch.Tensor, t: torch.Tensor, alpha: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. 1: the two channel inputs ``((1 - a) x + a t, (1 + a) x - a t)``."""
    return (1.0 - alpha) * x + alpha * t, (1.0 + alpha) * x - alpha * t


def recover(
    left: torch.Tensor, right: torch.Tensor, alpha: float
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Inverse of Eq. 1: ``x = (left + right) / 2`` and, for a > 0,
    ``t = ((1 + a) left - (1 - a) right) / (2 a)`` (None when a = 0)."""
    x = 0.5 * (left + right)
    t = ((1.0 + alpha) * left - (1.0 - alpha) * right) / (2.0 * alpha) if alpha > 0 else None
    return x, t


# ----------------------------------------------------------------------------- the model
@torch.no_grad()
def _embedding_dim(backbone: FedModel, input_shape: tuple[int, ...]) -> int:
    was_training = backbone.training
    backbone.eval()  # BN uses its running statistics: nothing is updated
    try:
        ref = next(backbone.parameters(), None)
        x = torch.zeros(2, *input_shape, device=ref.device if ref is not None else None)
        return int(backbone.features(x).shape[1])
    finally:
        backbone.train(was_training)


class DisTransModel(FedModel):
    """The double-input-channel model (one shared backbone, Eq. 1 inputs, one dense layer).

    ``features(x)`` is the concatenated embedding of both channels and ``head(z)`` the dense
    layer, so t-SNE and feature-level methods still work; ``stages`` and ``stage_hooks`` are
    the backbone's (augments insert layers there); BN layers keep their backbone names under
    ``backbone.`` in this model's state dict. The client's offset is the parameter
    ``offset`` (shape = one input).
    """

    def __init__(
        self,
        backbone: FedModel,
        num_classes: int,
        input_shape: tuple[int, ...],
        alpha: float = 0.3,
        channels: int = 2,
        offset_seed: int = 0,
    ) -> None:
        super().__init__()
        if channels not in (1, 2):
            raise ValueError(f"channels must be 1 or 2, got {channels}")
        dim = _embedding_dim(backbone, tuple(input_shape))
        if isinstance(getattr(backbone, "classifier", None), nn.Module):
            backbone.classifier = nn.Identity()  # unused: the dense layer below replaces it
        self.backbone = backbone
        self.stage_hooks = backbone.stage_hooks  # one dict: hooks added here reach the backbone
        self.alpha = float(alpha)
        self.channels = int(channels)
        self.input_shape = tuple(int(s) for s in input_shape)
        #: seed of the clients' offset-initialisation streams
        self.offset_seed = int(offset_seed)
        self.classifier = nn.Linear(self.channels * dim, num_classes)
        ref = next(backbone.parameters(), None)
        self.offset = nn.Parameter(
            torch.zeros(self.input_shape, device=ref.device if ref is not None else None)
        )

    @property
    def stages(self) -> nn.ModuleDict:  # type: ignore[override]
        return self.backbone.stages

    def channel_inputs(self, x: torch.Tensor) -> list[torch.Tensor]:
        """What the backbone sees: both channels of Eq. 1, or the left one (``channels=1``)."""
        left, right = blend(x, self.offset, self.alpha)
        return [left, right] if self.channels == 2 else [left]

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """Concatenated backbone embeddings of the channel inputs (two separate passes, as
        the released code: BN normalises each channel with its own batch statistics)."""
        return torch.cat([self.backbone.features(c) for c in self.channel_inputs(x)], dim=1)

    def head(self, z: torch.Tensor) -> torch.Tensor:
        return self.classifier(z)


# ----------------------------------------------------------------------------- NN aggregator
class OffsetAggregator(nn.Module):
    """Section 4.4's server network: (client embedding, client offset) -> aggregated offset.

    The embedding (C values) goes through an MLP (C -> hidden -> hidden). With
    ``offset_input`` the client's offset goes through a convolutional encoder (3 x 3 conv to
    ``width`` channels, ReLU, average-pooled to 4 x 4, linear to ``hidden``) and the two codes
    are concatenated; without it (the released generator) the embedding alone is the input.
    Then a linear layer to a 100-d code and the generator: transposed convolutions 1 -> 4 x 4
    (kernel 4), stride-2 doublings until the largest input side is covered, channels
    ``width * 2^k`` halving down to ``width`` and finally the input's channels -> centre crop
    to H x W -> tanh. For 3 x 64 x 64 the generator is the released one's layer shape
    (``ngf`` = 64) without its BN layers. Weights: He-uniform, biases zero (the released
    ``weights_init_uniform`` for linear layers; applied to the convolutions too).
    """

    CODE = 100

    def __init__(
        self,
        num_classes: int,
        shape: tuple[int, ...],
        hidden: int = 100,
        width: int = 64,
        offset_input: bool = False,
    ) -> None:
        super().__init__()
        c, h, w = (int(s) for s in shape)
        self.shape = (c, h, w)
        self.mlp = nn.Sequential(
            nn.Linear(num_classes, hidden), nn.ReLU(), nn.Linear(hidden, hidden)
        )
        self.encoder = (
            nn.Sequential(
                nn.Conv2d(c, width, 3, padding=1),
                nn.ReLU(),
                nn.AdaptiveAvgPool2d(4),
                nn.Flatten(),
                nn.Linear(width * 16, hidden),
            )
            if offset_input
            else None
        )
        self.fc = nn.Linear(hidden * (2 if offset_input else 1), self.CODE)
        ups = max(0, math.ceil(math.log2(max(h, w) / 4)))
        outs = [width * 2 ** (ups - 1 - i) for i in range(ups)] + [c]
        layers: list[nn.Module] = [nn.ConvTranspose2d(self.CODE, outs[0], 4, 1, 0)]
        for i in range(1, len(outs)):
            layers += [nn.ReLU(), nn.ConvTranspose2d(outs[i - 1], outs[i], 4, 2, 1)]
        self.deconv = nn.Sequential(*layers)
        self.size = 4 * 2**ups
        for m in self.modules():  # the released init for linear layers (He uniform, zero bias);
            # the same for the convolutions, which have no BN here to rescale them
            if isinstance(m, nn.Linear | nn.ConvTranspose2d | nn.Conv2d):
                nn.init.kaiming_uniform_(m.weight, nonlinearity="relu")
                nn.init.zeros_(m.bias)

    def forward(self, e: torch.Tensor, t: torch.Tensor | None = None) -> torch.Tensor:
        """(N, C) embeddings [+ (N, c, h, w) offsets] -> (N, c, h, w) offsets in [-1, 1]."""
        code = self.mlp(e)
        if self.encoder is not None:
            if t is None:
                raise ValueError("this offset aggregator also takes the clients' offsets")
            code = torch.cat([code, self.encoder(t)], dim=1)
        out = self.deconv(self.fc(code).view(e.shape[0], self.CODE, 1, 1))
        c, h, w = self.shape
        top, left = (self.size - h) // 2, (self.size - w) // 2
        return torch.tanh(out[:, :, top : top + h, left : left + w])


def label_proportions(counts: torch.Tensor) -> torch.Tensor:
    """Label counts -> each client's own label distribution (rows sum to 1; released input)."""
    counts = counts.float()
    return counts / counts.sum(dim=-1, keepdim=True).clamp_min(1e-12)


def class_share(counts: torch.Tensor) -> torch.Tensor:
    """(clients, classes) label counts -> Section 4.4's embeddings: e_ij = the fraction of
    class j's training data that is on client i (columns sum to 1; a class nobody holds is
    0 for every client)."""
    counts = counts.float()
    return counts / counts.sum(dim=0, keepdim=True).clamp_min(1e-12)


#: one regression pair: (embedding, input offset or None, uploaded offset)
AggPair = tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]


def train_aggregator(
    agg: OffsetAggregator, pairs: list[AggPair], steps: int, lr: float
) -> list[float]:
    """Section 4.4's regression: minimise ||t_i - agg(e_i, t_in)||^2 by SGD, ``steps`` passes,
    one step per pair in the given order (hyperMACFed.py). Returns each pass's mean MSE,
    measured as it trains."""
    agg.train()
    opt = torch.optim.SGD(agg.parameters(), lr=lr)
    history = []
    for _ in range(steps):
        total = 0.0
        for e, t_in, t in pairs:
            opt.zero_grad(set_to_none=True)
            out = agg(e[None], None if t_in is None else t_in[None])[0]
            loss = F.mse_loss(out, t)
            loss.backward()
            opt.step()
            total += float(loss.detach())
        history.append(total / max(len(pairs), 1))
    return history


# ----------------------------------------------------------------------------- the algorithm
@register
class DisTrans(Algorithm):
    """Per-client offsets + a double-input-channel model averaged FedAvg-style."""

    name = "distrans"
    tasks = ("classification",)  # its objective needs one label per image
    Params = DisTransParams
    paper_weighting = "uniform"  # Alg. 1 averages the local models uniformly

    def setup(self, model: FedModel) -> None:
        if not isinstance(model, DisTransModel):
            raise TypeError("distrans trains a DisTransModel: build it with DisTrans.wrap_model")
        self.input_shape = model.input_shape
        self.num_classes = model.classifier.out_features
        #: the server's working copy of the NN aggregator, created on first use; its weights
        #: are loaded from the server state every time (it carries nothing between calls)
        self._aggregator: OffsetAggregator | None = None

    # -- config / model --------------------------------------------------------------------
    @classmethod
    def wrap_model(cls, params: Any, model: FedModel, federation: Federation) -> FedModel:
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

    # -- offset aggregation mode -----------------------------------------------------------
    def offset_mode(self, server: State) -> str:
        """``none`` / ``avg`` / ``nn`` now; ``pending`` while ``auto`` does not know DH."""
        agg = self.params.aggregation
        if agg != "auto":
            return agg
        dh = server.get("dh")
        if dh is None:
            return "pending"
        return self.params.auto_aggregator if dh < self.params.dh_threshold else "none"

    def wants_label_dist(self) -> bool:
        return self.params.aggregation in ("nn", "auto")

    def aggregated_offset(self, server: State, cid: str) -> torch.Tensor | None:
        """The offset the server gives client ``cid`` now (None: it keeps its own)."""
        mode = self.offset_mode(server)
        if mode == "avg":
            return server.get("offset_avg")
        if mode == "nn":
            return server.get("offset_nn", {}).get(cid)
        return None

    # -- server ----------------------------------------------------------------------------
    def init_server(self, model: FedModel) -> State:
        server = super().init_server(model)
        server.update(
            label_dist={}, dh=None, offset_avg=None, offset_nn={}, offset_in={}, nn_loss=[]
        )
        if self.wants_label_dist():
            server["aggregator"] = clone(self._new_aggregator().state_dict())
        return server

    def broadcast(self, server: State, rnd: int, cid: str) -> Payload:
        down = Payload({"weights": subset(server["weights"], self.shared_keys)})
        offset = self.aggregated_offset(server, cid)
        if offset is not None:
            down.records[OFFSET_RECORD] = {OFFSET: offset}
        down.config["upload_offset"] = int(self.offset_mode(server) in ("avg", "nn"))
        return down

    def aggregate(self, server: State, rnd: int, replies: list[Reply]) -> None:
        server["weights"].update(self.average_record(replies, "weights"))
        for cid, p in replies:
            if LABEL_RECORD in p.records:
                server["label_dist"][cid] = p[LABEL_RECORD]["counts"].detach().cpu().clone()
        if self.params.aggregation == "auto" and server["label_dist"]:
            ids = sorted(server["label_dist"])
            server["dh"] = degree_of_heterogeneity(
                torch.stack([server["label_dist"][c] for c in ids])
            )
        uploads = [(cid, p) for cid, p in replies if OFFSET_RECORD in p.records]
        mode = self.offset_mode(server)
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

    # -- client ----------------------------------------------------------------------------
    def init_client(self, cid: str, data: ClientData, model: FedModel) -> State:
        """The client's offset starts as a U[0, 1] image from its own stream; it is mapped to
        the model's input space (the run's normalisation) when the client first trains."""
        state = super().init_client(cid, data, model)
        g = torch.Generator().manual_seed(derive_seed(model.offset_seed, "distrans/offset", cid))
        ref = state["local"][OFFSET]
        state["local"][OFFSET] = torch.rand(self.input_shape, generator=g).to(ref.device)
        state["offset_raw"] = True
        state["cid"] = cid
        state["label_dist_sent"] = False
        return state

    @staticmethod
    def _normalise(u: torch.Tensor, ctx: ClientContext | None = None) -> torch.Tensor:
        """A raw offset in [0, 1] mapped to the model's input space with the normalisation of
        ``ctx``'s input pipeline; 0.5 / 0.5 without a context (a client that has not trained
        yet) or when the pipeline does not normalise (an augment normalises itself)."""
        norm = None if ctx is None else ctx.pipeline.normalize
        if norm is None or not hasattr(norm, "mean"):
            mean, std = DEFAULT_NORM
            return (u - mean) / std
        m, s = norm.mean.detach().reshape(-1, 1, 1), norm.std.detach().reshape(-1, 1, 1)
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
                ctx.model.offset.copy_(down[OFFSET_RECORD][OFFSET])
        steps, loss = self.local_train(ctx, state)
        self.keep_local(ctx, state)
        up = self.reply(ctx, state, steps, loss)
        if down.config.get("upload_offset"):
            up.records[OFFSET_RECORD] = {OFFSET: ctx.model.offset.detach().clone()}
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
        opt = torch.optim.SGD(
            [ctx.model.offset], lr=self.params.offset_lr, momentum=self.params.offset_momentum
        )
        if self.train.optimizer_state == "persist" and "offset_optimizer" in state:
            opt.load_state_dict(state["offset_optimizer"])
        return opt

    def local_train(self, ctx: ClientContext, state: State) -> tuple[int, float]:
        """Algorithm 1's joint optimisation, one offset step and one model step per batch
        (``update=alternate``), or both on one gradient (``simultaneous``, released code).
        The reported loss is the model step's."""
        model = ctx.model
        model.train()
        opt = self.make_optimizer(ctx, state)
        opt_t = self.make_offset_optimizer(ctx, state)
        offset = model.offset
        total = torch.zeros((), device=ctx.device)
        steps = 0
        for x, y in ctx.batches():
            if self.params.update == "alternate":
                with FrozenBNStats(model):
                    loss_t = self.loss(ctx, x, y)
                (g,) = torch.autograd.grad(loss_t, [offset], allow_unused=True)
                offset.grad = torch.zeros_like(offset) if g is None else g
                opt_t.step()
                offset.grad = None
                opt.zero_grad(set_to_none=True)
                offset.requires_grad_(False)
                try:
                    loss = self.loss(ctx, x, y)
                    loss.backward()
                finally:
                    offset.requires_grad_(True)
                opt.step()
            else:
                opt.zero_grad(set_to_none=True)
                opt_t.zero_grad(set_to_none=True)
                loss = self.loss(ctx, x, y)
                loss.backward()
                opt.step()
                opt_t.step()
            total += loss.detach()
            steps += 1
        if self.train.optimizer_state == "persist":
            state["optimizer"] = opt.state_dict()
            state["offset_optimizer"] = opt_t.state_dict()
        return steps, float(total) / max(steps, 1)

    # -- evaluation ------------------------------------------------------------------------
    def personal_weights(self, server: State, state: State) -> Tensors | None:
        """Shared model + the client's BN-policy tensors + the offset it holds next: the
        server's aggregate for it if there is one, else its own (applied at test time)."""
        local = dict(state["local"])
        agg = self.aggregated_offset(server, state["cid"])
        local[OFFSET] = agg if agg is not None else self.client_offset(state)
        return {**subset(server["weights"], self.shared_keys), **local}

    def server_view(self, server: State, cid: str) -> State:
        """The shared weights plus what ``aggregated_offset`` reads for ``cid``."""
        view = super().server_view(server, cid)
        view.update({k: server[k] for k in ("dh", "offset_avg") if k in server})
        nn = server.get("offset_nn")
        if nn is not None:
            view["offset_nn"] = {cid: nn[cid]} if cid in nn else {}
        return view
