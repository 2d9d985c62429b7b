"""pFedHN (Shamsian, Navon, Fetaya & Chechik, "Personalized Federated Learning using
Hypernetworks", ICML 2021).

The server holds a hypernetwork ``h(v_i; phi)``: a learnable embedding ``v_i`` per client feeds
an MLP (``n_hidden`` hidden layers of width ``hidden_dim``) whose last features go through one
linear head per tensor of the target network, so ``theta_i = h(v_i; phi)`` is every trainable
tensor of the client's model (fedshift's backbone: all its parameters, BN weight and bias
included). A round (Algorithm 1):

* the server sends client i its generated weights ``theta_i`` (record ``weights``);
* the client trains them for the run's local steps (``train.*``) and replies
  ``delta theta_i = theta_tilde_i - theta_i`` (record ``delta``);
* the server updates phi and v_i through the hypernetwork's Jacobian:
  ``grad_phi = (d theta_i / d phi)^T (theta_i - theta_tilde_i) = -(d theta_i / d phi)^T
  delta theta_i``, i.e. it descends the surrogate ``1/2 ||h(v_i; phi) - theta_tilde_i||^2``
  (the paper's update rule, Algorithm 1, with the sign of the released code: the
  server moves theta_i towards the client's trained weights); the same for v_i.

The hypernetwork lives only in the server state (checkpointed); it never travels. With several
clients per round (fedshift's ``federation.sample_fraction``; the paper samples one client per
step) phi's gradient is the ``federation.weighting``-weighted mean of the clients' gradients
(``auto``: uniform, as the paper's uniformly sampled one-client steps weigh clients equally),
taken at the phi that generated their weights, and each client's own v_i gets its own gradient.

Embedding updates: ``embedding_update=paper`` (default) moves only the replying clients' v_i,
``v_i <- v_i - embed_lr * grad_{v_i}`` (Algorithm 1); ``released`` treats the embedding table
as one more parameter of the server optimiser, as the released code does (with momentum and
weight decay every row keeps moving, sampled or not).

``variant=pc`` is pFedHN-PC, the paper's personalised-classifier variant (described with
the method in Sec. 3; its own rows in the main results table, Table 1): the hypernetwork
generates only the feature extractor, and each client keeps its own classifier head (``head``,
default the model's ``classifier`` module, resolved by
:func:`fedshift.algorithms.partialfed.resolve_layer_keys`) in its state. The head is trained
locally together with the received extractor in the same local steps, is never sent (neither
broadcast nor in ``delta``), and is part of the client's personal model; the hypernetwork has
no head for it. ``variant=full`` (default) is pFedHN, generating every trainable tensor.

BN running statistics are not generated: they stay on each client (client state), are never
sent, and are part of the client's personal model. Models without BN (``lenet5`` with
``model.bn=false``) have no local tensors at all.

Evaluation: client i's personal model is ``h(v_i; phi)`` (+ its BN statistics); there is no
global model.

Size: the heads hold ``hidden_dim x P`` weights for a target network of P parameters
(``cnn`` width 32: P = 0.46 M, hypernetwork 46 M). Target networks above
``max_target_params`` are rejected with a ConfigError.

Initial output (``head_init``; the paper does not state how the heads are initialised):
``target`` (default) starts each head's bias at the target model's own initial tensor, so at
the start ``h(v_i; phi)`` is the model's usual initialisation plus a small client-dependent
term; ``default`` keeps nn.Linear's default init, as the released code does. The released
target networks have no BatchNorm; with ``default`` every generated BN scale starts near 0
(about N(0, 0.07) instead of 1), so fedshift's ``cnn`` (three BN layers) starts with its
signal scaled by ~1e-4 and its gradients vanish: on the DisTrans Fashion-MNIST suite it stayed
at chance (10.5 %) for 15 rounds.

Defaults are otherwise the released code's (``experiments/pfedhn/trainer.py``, which matches
the paper's appendix): embedding dim ``1 + N/4`` (N clients), 3 hidden layers of 100 units,
server SGD lr 1e-2, momentum 0.9, weight decay 1e-3, embedding lr = server lr. The paper's
client side (50 inner SGD steps, lr 5e-3, momentum 0.9, weight decay 5e-5, batch 64) is set through
``train.local_steps=50 train.lr=0.005 train.momentum=0.9 train.weight_decay=5e-5
train.batch_size=64``. The released code also clips gradient norms at 50, on the client and on
the server; ``inner_clip`` / ``server_clip`` (default off, as the paper describes no clipping)
reproduce that.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import nn

from fedshift.algorithms import register
from fedshift.algorithms.base import Algorithm, FLParams, Reply, State
from fedshift.algorithms.partialfed import resolve_layer_keys
from fedshift.algorithms.tensors import clone
from fedshift.core.bounds import bounded
from fedshift.core.config import TrainConfig
from fedshift.core.context import ClientContext
from fedshift.core.errors import ConfigError, FedshiftError
from fedshift.core.payload import Payload, Tensors
from fedshift.data.base import ClientData
from fedshift.models.base import FedModel


@dataclass
class PFedHNParams(FLParams):
    # dimension of each client's embedding v_i; null: int(1 + N / 4) (released code)
    embed_dim: int | None = bounded(None, ge=1)
    hidden_dim: int = bounded(100, ge=1)
    # hidden layers after the first linear layer (released trainer: 3)
    n_hidden: int = bounded(3, ge=0)
    server_optimizer: Literal["sgd", "adam"] = "sgd"
    server_lr: float = bounded(0.01, gt=0)
    server_momentum: float = bounded(0.9, ge=0, lt=1)
    server_weight_decay: float = bounded(0.001, ge=0)
    # learning rate of the client embeddings; null: server_lr
    embed_lr: float | None = bounded(None, gt=0)
    # "paper": only the replying clients' v_i move (plain step); "released": the embedding
    # table is a parameter of the server optimiser (momentum, weight decay on every row)
    embedding_update: Literal["paper", "released"] = "paper"
    # gradient-norm clipping (released code: 50 on the client and on the server); null: off
    inner_clip: float | None = bounded(None, gt=0)
    server_clip: float | None = bounded(None, gt=0)
    # target networks with more trainable parameters are rejected (hypernetwork size)
    max_target_params: int = bounded(1_000_000, ge=1)
    # "full": pFedHN (every trainable tensor generated); "pc": pFedHN-PC (the head listed in
    # ``head`` is a local, locally trained classifier; the hypernetwork generates the rest)
    variant: Literal["full", "pc"] = "full"
    head: list[str] = field(default_factory=lambda: ["classifier"])
    # initial output of the hypernetwork: "target" (default): each head's bias starts at the
    # target model's own initial tensor; "default": nn.Linear's default init (released code)
    head_init: Literal["target", "default"] = "target"


class HyperNetwork(nn.Module):
    """``h(v_i; phi)``: embedding table -> MLP -> one linear head per target tensor."""

    def __init__(
        self,
        n_clients: int,
        embed_dim: int,
        hidden_dim: int,
        n_hidden: int,
        shapes: dict[str, torch.Size],
    ) -> None:
        super().__init__()
        self.shapes = OrderedDict((k, torch.Size(s)) for k, s in shapes.items())
        self.embeddings = nn.Embedding(n_clients, embed_dim)
        layers: list[nn.Module] = [nn.Linear(embed_dim, hidden_dim)]
        for _ in range(n_hidden):
            layers += [nn.ReLU(), nn.Linear(hidden_dim, hidden_dim)]
        self.mlp = nn.Sequential(*layers)
        self.heads = nn.ModuleDict(
            {self.head_name(k): nn.Linear(hidden_dim, s.numel()) for k, s in self.shapes.items()}
        )

    @staticmethod
    def head_name(key: str) -> str:
        return key.replace(".", "__")

    def forward(self, row: int) -> dict[str, torch.Tensor]:
        """The target network's tensors for the client whose embedding is ``row``."""
        features = self.mlp(self.embeddings.weight[row])
        return {k: self.heads[self.head_name(k)](features).view(s) for k, s in self.shapes.items()}

    def phi(self) -> list[nn.Parameter]:
        """Every parameter except the client embeddings."""
        return [p for n, p in self.named_parameters() if not n.startswith("embeddings.")]


@register
class PFedHN(Algorithm):
    """Server hypernetwork generating each client's model; updated through delta theta."""

    name = "pfedhn"
    Params = PFedHNParams
    #: Algorithm 1 samples one client per step uniformly, so each client's step counts
    #: equally; with several clients per round phi's gradient is their 1/|S| mean
    paper_weighting = "uniform"

    @classmethod
    def check(cls, params: Any, train: TrainConfig) -> None:
        if params.variant == "pc" and not params.head:
            raise ConfigError(
                "config key 'algorithm.head' is empty: pFedHN-PC needs the classifier head "
                "each client keeps (e.g. [classifier]); or set algorithm.variant=full"
            )
        if params.bn_policy != "global":
            raise ConfigError(
                "algorithm 'pfedhn' generates every trainable tensor and keeps BN running "
                "statistics on the clients; 'algorithm.bn_policy' does not apply (leave it "
                "'global')"
            )

    def setup(self, model: FedModel) -> None:
        params, num_clients = self.params, self.num_clients
        local = set(self.local_keys)  # pc: the personal head is not generated
        shapes = {k: p.shape for k, p in model.named_parameters() if k not in local}
        total = sum(s.numel() for s in shapes.values())
        if total > params.max_target_params:
            raise ConfigError(
                f"algorithm 'pfedhn' generates every trainable tensor of the model: it has "
                f"{total:,} parameters, above 'algorithm.max_target_params' = "
                f"{params.max_target_params:,} (the hypernetwork's heads would hold "
                f"{params.hidden_dim * total:,} weights); use a smaller model (e.g. "
                f"model.name=cnn model.width=16, or lenet5) or raise the budget"
            )
        embed_dim = params.embed_dim or int(1 + num_clients / 4)
        device = next(model.parameters()).device
        self.hnet = HyperNetwork(
            num_clients, embed_dim, params.hidden_dim, params.n_hidden, shapes
        ).to(device)
        if params.head_init == "target":
            own = dict(model.named_parameters())
            with torch.no_grad():
                for k in shapes:
                    self.hnet.heads[HyperNetwork.head_name(k)].bias.copy_(own[k].reshape(-1))
        self.param_keys = list(shapes)
        self.opt = self._make_optimizer()
        self._rows: dict[str, int] = {}
        self._synced: object = None

    def compute_local_keys(self, model: FedModel) -> list[str]:
        """BN running statistics (never generated), and with ``variant=pc`` the personal
        classifier head's tensors."""
        params = {n for n, _ in model.named_parameters()}
        head: set[str] = set()
        if self.params.variant == "pc":
            head = set(resolve_layer_keys(model, list(self.params.head), key="algorithm.head"))
        return [k for k in model.state_dict() if k not in params or k in head]

    @property
    def has_global_model(self) -> bool:
        return False

    @property
    def has_personal_model(self) -> bool:
        return True

    # -- the hypernetwork's state ----------------------------------------------------------
    def _make_optimizer(self) -> torch.optim.Optimizer:
        p = self.params
        embed_lr = p.server_lr if p.embed_lr is None else p.embed_lr
        groups: list[dict] = [{"params": self.hnet.phi()}]
        if p.embedding_update == "released":
            groups.append({"params": [self.hnet.embeddings.weight], "lr": embed_lr})
        if p.server_optimizer == "sgd":
            return torch.optim.SGD(
                groups,
                lr=p.server_lr,
                momentum=p.server_momentum,
                weight_decay=p.server_weight_decay,
            )
        return torch.optim.Adam(groups, lr=p.server_lr, weight_decay=p.server_weight_decay)

    def _sync(self, server: State) -> None:
        """Make the live hypernetwork hold ``server``'s state (after a checkpoint reload the
        server dict is a new object); the server dict then shares the live tensors."""
        if server["hnet"] is self._synced:
            return
        self.hnet.load_state_dict(server["hnet"])
        if server.get("hnet_opt") is not None:
            self.opt.load_state_dict(server["hnet_opt"])
        server["hnet"] = self.hnet.state_dict()
        self._synced = server["hnet"]

    def row(self, cid: str) -> int:
        if cid not in self._rows:
            raise FedshiftError(f"pfedhn: unknown client {cid!r} (no embedding row)")
        return self._rows[cid]

    def generate(self, server: State, cid: str) -> Tensors:
        """``theta_i = h(v_i; phi)`` (detached)."""
        self._sync(server)
        with torch.no_grad():
            return {k: v.detach().clone() for k, v in self.hnet(self.row(cid)).items()}

    # -- server ----------------------------------------------------------------------------
    def init_server(self, model: FedModel) -> State:
        state = self.hnet.state_dict()
        self._synced = state
        return {"hnet": state, "hnet_opt": None, "updates": 0}

    def broadcast(self, server: State, rnd: int, cid: str) -> Payload:
        return Payload({"weights": self.generate(server, cid)})

    def aggregate(self, server: State, rnd: int, replies: list[Reply]) -> None:
        """Algorithm 1's server step for every reply: phi (weighted mean over the replies) and
        each v_i (its own) descend ``(d theta_i / d(phi, v_i))^T (theta_i - theta_tilde_i)``."""
        self._sync(server)
        p = self.params
        phi = self.hnet.phi()
        table = self.hnet.embeddings.weight
        weights = [self.reply_weight(pl) for _, pl in replies]
        total = float(sum(weights))
        phi_grads = [torch.zeros_like(q) for q in phi]
        table_grad = torch.zeros_like(table)
        for (cid, pl), w in zip(replies, weights, strict=True):
            theta = self.hnet(self.row(cid))
            delta = pl["delta"]
            outs = [theta[k] for k in self.param_keys]
            # grad_outputs = -delta: the VJP gives (d theta / d .)^T (theta - theta_tilde)
            gouts = [-delta[k].to(theta[k]) for k in self.param_keys]
            grads = torch.autograd.grad(outs, [*phi, table], grad_outputs=gouts)
            for acc, g in zip(phi_grads, grads[:-1], strict=True):
                acc.add_(g, alpha=w / total)
            table_grad.add_(grads[-1])  # only row i is non-zero: v_i gets its own gradient
        if p.server_clip is not None:  # one norm over phi and the table (released code)
            norm = torch.norm(torch.stack([g.norm() for g in [*phi_grads, table_grad]]))
            scale = min(1.0, p.server_clip / (float(norm) + 1e-6))
            for g in [*phi_grads, table_grad]:
                g.mul_(scale)
        self.opt.zero_grad(set_to_none=True)
        for q, g in zip(phi, phi_grads, strict=True):
            q.grad = g
        if p.embedding_update == "released":
            table.grad = table_grad
        self.opt.step()
        if p.embedding_update == "paper":
            embed_lr = p.server_lr if p.embed_lr is None else p.embed_lr
            with torch.no_grad():
                table.sub_(table_grad, alpha=embed_lr)
        self.opt.zero_grad(set_to_none=True)
        server["hnet_opt"] = self.opt.state_dict()
        server["updates"] = int(server.get("updates", 0)) + 1

    # -- client ----------------------------------------------------------------------------
    def _register(self, cid: str) -> None:
        if cid not in self._rows:
            if len(self._rows) >= self.num_clients:
                raise FedshiftError(f"pfedhn: more clients than embedding rows ({cid!r})")
            self._rows[cid] = len(self._rows)

    def init_client(self, cid: str, data: ClientData, model: FedModel) -> State:
        self._register(cid)
        state = super().init_client(cid, data, model)
        state["cid"] = cid
        return state

    def before_step(self, ctx: ClientContext) -> None:
        if self.params.inner_clip is not None:
            torch.nn.utils.clip_grad_norm_(ctx.model.parameters(), self.params.inner_clip)

    def local_update(self, ctx: ClientContext, down: Payload, state: State) -> Payload:
        theta = down["weights"]
        self.load_client_model(ctx, theta, state)
        steps, loss = self.local_train(ctx, state)
        self.keep_local(ctx, state)
        trained = ctx.model.state_dict()
        delta = {k: (trained[k] - theta[k].to(trained[k])).detach().clone() for k in theta}
        return self.reply(ctx, state, steps, loss, {"delta": delta})  # delta, not weights

    # -- evaluation ------------------------------------------------------------------------
    def global_weights(self, server: State) -> Tensors | None:
        return None

    def personal_weights(self, server: State, state: State) -> Tensors | None:
        # a server view (Flower) carries the client's generated weights; the server state
        # itself holds the hypernetwork
        gen = server.get("generated")
        if gen is None:
            gen = self.generate(server, state["cid"])
        return {**gen, **clone(state["local"])}

    def server_view(self, server: State, cid: str) -> State:
        return {"generated": self.generate(server, cid)}

    def register_clients(self, cids: list[str]) -> None:
        for cid in cids:
            self._register(cid)
