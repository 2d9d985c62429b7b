"""pFedHN's algorithm (Shamsian et al., ICML 2021, Algorithm 1): the server's hypernetwork
generates each client's weights theta_i = h(v_i; phi); the client trains them with the run's
local steps and replies delta theta_i; the server descends phi and v_i along
``(d theta_i / d(phi, v_i))^T (theta_i - theta_tilde_i)``. BN running statistics stay on the
clients; with ``variant=pc`` the classifier head too. docs/METHODS.md has the details."""

from __future__ import annotations

from typing import cast

import torch
from torch import nn

from fedshift.algorithms.base import Algorithm, Reply, State
from fedshift.algorithms.partialfed import resolve_layer_keys
from fedshift.algorithms.pfedhn.hypernet import HyperNetwork
from fedshift.algorithms.pfedhn.params import PFedHNParams
from fedshift.algorithms.state import ABSENT, StateVar, client_var, server_var
from fedshift.algorithms.tensors import clone
from fedshift.core.config import TrainConfig
from fedshift.core.context import ClientContext
from fedshift.core.disclosure import DOWN, UP, Disclosure, Kind, To, When, fixed, tensor_bytes
from fedshift.core.errors import ConfigError, FedshiftError
from fedshift.core.federation import ClientData
from fedshift.core.payload import Payload, Tensors
from fedshift.models.base import FedModel


class PFedHN(Algorithm[PFedHNParams]):
    """Server hypernetwork generating each client's model; updated through delta theta."""

    name = "pfedhn"
    Params = PFedHNParams
    #: Algorithm 1 samples one client per step uniformly, so each client's step counts
    #: equally; with several clients per round phi's gradient is their 1/|S| mean
    paper_weighting = "uniform"
    partial_training_refusal = (
        "generates every tensor of each client's model from its hypernetwork (Eq. 1), so "
        "no part of the model stays frozen"
    )

    @classmethod
    def check(cls, params: PFedHNParams, train: TrainConfig) -> None:
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
                    head = cast(nn.Linear, self.hnet.heads[HyperNetwork.head_name(k)])  # built so
                    head.bias.copy_(own[k].reshape(-1))
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
    def server_vars(self) -> list[StateVar]:
        """The hypernetwork and its optimiser (no server model: ``weights`` is not declared)."""
        return [
            server_var("hnet", lambda at: self.hnet.state_dict(),
                       doc="the hypernetwork's state dict (shares the live tensors)"),
            server_var("hnet_opt", None, doc="its optimiser's state (after the first update)"),
            server_var("updates", 0, doc="the hypernetwork updates so far"),
            server_var("generated", ABSENT,
                       doc="only in a server_view: the client's generated weights"),
        ]  # fmt: skip

    def init_server(self, model: FedModel) -> State:
        server = super().init_server(model)
        self._synced = server["hnet"]
        return server

    def disclosures(self, model: FedModel) -> list[Disclosure]:
        size = fixed(tensor_bytes(model.state_dict(), self.param_keys))
        return [
            Disclosure("weights", DOWN, Kind.PARAMETERS, When.ROUND, size,
                       "the site's target model generated by the hypernetwork",
                       carries=("delta",)),
            Disclosure("delta", UP, Kind.UPDATE, When.ROUND, size,
                       "the site's update of its generated model", to=To.SERVER),
        ]  # fmt: skip

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
        return super().init_client(cid, data, model)

    def client_vars(self) -> list[StateVar]:
        return [
            *super().client_vars(),
            client_var("cid", lambda at: at.cid, doc="the client's id (its embedding row)"),
        ]

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
