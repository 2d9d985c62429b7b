"""pFedHN's config keys (``algorithm.*``; Shamsian et al., ICML 2021). ``variant`` picks
pFedHN or pFedHN-PC (Sec. 3); ``embedding_update``, ``inner_clip``/``server_clip`` and
``head_init=default`` reproduce the released code (docs/METHODS.md)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from fedshift.algorithms.base import FLParams
from fedshift.core.bounds import bounded


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
