"""``partition.name=domains``: N clients drawn from a dataset's D domains with a controlled
heterogeneity (Bai, Bagchi and Inouye, "Benchmarking Algorithms for Federated Domain
Generalization", arXiv 2307.04942, ICLR 2024: the heterogeneous partitioning of their
benchmark methodology, Fig. 1; counts as their released ``src/splitter.py``).

The dataset's clients are its domains (digits' five, brain-mri's scanners, a ``folders``
site per folder). ``lam`` is the paper's domain balancing parameter lambda:

* ``lam = 0``: complete heterogeneity, every client holds one domain: with at least as many
  clients as domains, each domain is split evenly over m_d clients (m_d grown one at a time
  for the domain with the most examples per client, so clients stay balanced); with fewer
  clients than domains, whole domains are packed onto clients, largest first onto the
  smallest client;
* ``lam = 1``: every client holds the same share, 1/N, of every domain;
* in between, client c holds ``(1 - lam)`` of its lam=0 part plus ``lam / N`` of every domain.

Counts are floored and each domain's remainder is given one example each to the clients with
the largest fractional share of that domain (ties: client order), so a client never receives
an example of a domain whose share it does not hold: at ``lam = 0`` every client holds exactly
one domain, as the paper defines it, whatever the sizes. ``rounding=first`` is the released
``src/splitter.py``'s rule instead: the remainder goes to the first clients, which at
``lam = 0`` hands the first clients one example of every other domain whenever a domain's size
is not a multiple of its clients (brain-mri's 5 x 32 slices over 25 clients: client00 and
client01 hold all five scanners). The two give the same counts when every share is whole
(e.g. digits' 750 per domain over 10 clients). Every split (train, val, test) is dealt with
its own counts, and the examples of a domain are drawn in a seeded random order, so the
clients partition the data exactly (nothing duplicated or dropped). ``info["domain_mix"]``
records each client's training examples per domain (the run summary's ``data.partition``
info carries it).

``keep`` names domains that are not dealt: each stays one client under its own name, after
the dealt clients. That is how an unseen site is set up (Bai et al.'s benchmark holds the test
domains out of the partition): ``partition.keep=[mnistm] federation.holdout=[mnistm]`` trains
``clients`` clients on the other domains and tests the global model on the whole of MNIST-M.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import torch

from fedshift.core.bounds import bounded
from fedshift.core.errors import ConfigError, DataError
from fedshift.core.federation import SPLITS, ClientData, Federation, Split
from fedshift.core.images import cat_images
from fedshift.data.common.seeding import seeded_rng
from fedshift.data.common.sites import numbered_clients

__all__ = ["DomainsParams", "domain_counts", "domains"]


@dataclass
class DomainsParams:
    """``domains``: ``clients`` clients from the dataset's domains, ``lam`` from one domain per
    client (0) to equal shares of every domain (1)."""

    clients: int = bounded(10, ge=1)
    lam: float = bounded(0.1, ge=0, le=1)  # Bai et al.'s "heterogeneous" setting (Fig. 1c)
    seed: int = bounded(0, ge=0)  # the partition's own seed (independent of the run seed)
    #: domains kept whole, one client each under the domain's name (e.g. a held-out target)
    keep: list[str] = field(default_factory=list)
    #: where each domain's rounding remainder goes: "largest" fractional shares (one domain
    #: per client at lam = 0, the paper's definition) or the "first" clients (released code)
    rounding: Literal["largest", "first"] = "largest"


def _main_domains(n: np.ndarray, clients: int) -> tuple[np.ndarray, np.ndarray]:
    """With at least as many clients as non-empty domains: each client's one domain at
    ``lam = 0``, client order grouped by domain, and m_d, the clients of domain d."""
    m = (n > 0).astype(np.int64)
    while m.sum() < clients:
        ratio = np.where(m > 0, n / np.maximum(m, 1), -1.0)
        m[int(np.argmax(ratio))] += 1
    return np.repeat(np.arange(len(n)), m), m


def domain_counts(
    n: Sequence[int], clients: int, lam: float, rounding: str = "largest"
) -> np.ndarray:
    """``(clients, D)`` integer counts: how many examples of domain d client c gets, from the
    domains' sizes ``n`` and the rounding rule (module docstring). Every column sums to its
    domain's size; with ``rounding="largest"`` a count is positive only where the real-valued
    share is."""
    n = np.asarray(n, dtype=np.int64)
    sizes = n.astype(np.float64)
    if (n > 0).sum() <= clients:
        main, m = _main_domains(n, clients)
        own = np.zeros((clients, len(n)))
        own[np.arange(clients), main] = sizes[main] / m[main]
    else:  # more domains than clients: whole domains packed, largest onto the smallest client
        own = np.zeros((clients, len(n)))
        for d in np.argsort(-n, kind="stable"):
            own[int(np.argmin(own.sum(axis=1))), d] = sizes[d]
    shares = (1.0 - lam) * own + lam * sizes[None, :] / clients
    counts = np.floor(shares + 1e-9).astype(np.int64)
    for d in range(len(n)):
        rest = int(n[d] - counts[:, d].sum())
        if rounding == "first":
            counts[:rest, d] += 1
            continue
        # largest remainder: the fractional parts, rounded so that equal shares tie exactly
        frac = np.round(shares[:, d] - counts[:, d], 9)
        frac[shares[:, d] <= 1e-9] = -1.0  # a client without a share of d gets none of it
        counts[np.argsort(-frac, kind="stable")[:rest], d] += 1
    return counts


def domains(fed: Federation, params: DomainsParams) -> Federation:
    """The federation of ``params.clients`` clients dealt from ``fed``'s clients (domains),
    followed by the ``keep`` domains as they are."""
    unknown = [d for d in params.keep if d not in fed.client_names]
    if unknown or len(set(params.keep)) != len(params.keep):
        raise ConfigError(
            f"config key 'partition.keep': {unknown or params.keep} must name distinct domains "
            f"of dataset {fed.name!r} ({', '.join(fed.client_names)})"
        )
    kept = [fed.client(d) for d in params.keep]
    dealt = [c for c in fed.clients if c.name not in params.keep]
    if not dealt:
        raise ConfigError("config key 'partition.keep': keeps every domain; none is left to deal")
    k = params.clients
    names = numbered_clients(k)
    per_split: dict[str, list[Split]] = {}
    mix: dict[str, dict[str, int]] = {c: {} for c in names}
    for split in SPLITS:
        parts = [d.split(split) for d in dealt]
        counts = domain_counts([len(p) for p in parts], k, params.lam, params.rounding)
        picked: list[list[tuple[int, torch.Tensor]]] = [[] for _ in range(k)]
        for j, (domain, part) in enumerate(zip(dealt, parts, strict=True)):
            order = seeded_rng(params.seed, f"domains/{split}/{domain.name}").permutation(len(part))
            ends = np.cumsum(counts[:, j])
            for c in range(k):
                idx = np.sort(order[ends[c] - counts[c, j] : ends[c]])
                if len(idx):
                    picked[c].append((j, torch.from_numpy(idx)))
                if split == "train":
                    mix[names[c]][domain.name] = int(counts[c, j])
        splits = []
        for c in range(k):
            if not picked[c]:
                raise DataError(
                    f"partition 'domains': {names[c]} gets no {split} examples ({k} clients "
                    f"from {len(dealt)} domains with {[len(p) for p in parts]} {split} "
                    "examples); use fewer partition.clients or more data"
                )
            xs = [parts[j].x.index_select(0, idx) for j, idx in picked[c]]
            ys = [parts[j].y.index_select(0, idx) for j, idx in picked[c]]
            splits.append(Split(cat_images(xs), torch.cat(ys)))
        per_split[split] = splits
    clients = [
        ClientData(names[c], per_split["train"][c], per_split["val"][c], per_split["test"][c])
        for c in range(k)
    ]
    for c in kept:
        if c.name in names:
            raise DataError(
                f"config key 'partition.keep': domain {c.name!r} has the name of a dealt client"
            )
        mix[c.name] = {c.name: len(c.train)}
    # every client's row over all domains, in the dataset's order (0 where it holds none)
    mix = {c: {d: mix[c].get(d, 0) for d in fed.client_names} for c in mix}
    info = {**fed.info, "source_clients": fed.client_names, "domain_mix": mix}
    return Federation(
        fed.name, [*clients, *kept], list(fed.classes), fed.input_shape, info, fed.task
    )
