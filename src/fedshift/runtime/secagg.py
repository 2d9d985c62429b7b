"""Secure aggregation on the native engines: pairwise masking over a finite field.

The masking protocol of Bonawitz et al. (CCS 2017, "Practical Secure Aggregation for
Privacy-Preserving Machine Learning"), without its dropout recovery: with
``federation.secure_aggregation=true`` the server of a round sees each site's records only
masked, and recovers nothing but their sum.

Client ``u`` of a round's cohort ``U`` (the sampled clients), for every ``up`` record its
method declares summed (:func:`fedshift.core.disclosure.sums_only`):

1. multiplies each tensor ``x_u`` by its aggregation weight ``w_u`` (the algorithm's
   ``reply_weight``: ``n_u`` under ``federation.weighting=samples``, 1 under ``uniform``;
   1 for a record whose mean is declared uniform, HarmoFL's amplitude);
2. quantises ``w_u x_u``, ``w_u`` and a count of 1 to fixed point, ``q = round(v * 2**f)`` with
   ``f = federation.secagg_frac_bits``, as integers modulo ``M = 2**secagg_modulus_bits``
   (its example count ``n_u`` too, unscaled); a value whose sum over the cohort could
   wrap around ``M`` (``|q| >= M / (2 |U|)``) is refused, naming the tensor;
3. adds, for every other ``v`` in ``U``, the mask ``+PRG(s_uv)`` if ``u < v`` else
   ``-PRG(s_uv)`` (mod ``M``), where ``s_uv`` is the secret the pair shares
   (:func:`pair_seed`): in a deployment what a key agreement between ``u`` and ``v``
   gives both of them; here derived from (run seed, round, pair), so a resumed run masks
   exactly as an uninterrupted one.

The server adds the masked vectors modulo ``M``: every pair's masks cancel, leaving
``sum_u q_u``, decoded as a signed integer and scaled back. It hands the algorithm's
``aggregate`` one reply holding ``sum_u w_u x_u / sum_u w_u`` (a uniform record: over the
count ``|U|``; and ``sum_u n_u`` examples):
what ``Algorithm.average_record`` computes from the plain replies, so the aggregate is the
plain one within the rounding of the quantisation: each of the ``|U|`` summands is off by at
most ``2**-(f+1)`` and the weight sum is at least 1 (a reply weight is >= 1), so every
element is within ``|U| * 2**-f`` of the plain mean (:meth:`FixedPoint.mean_error`).

A client lost in the round leaves masks that nobody can remove (no dropout recovery):
:meth:`SecureAggregation.combine` refuses the round with an error instead of a wrong sum.
Methods whose server reads any site's record individually (FedRDN's statistics forwarded to
the other clients, SCAFFOLD's per-round count of replies, FedFA's variance over sites) are
refused before any client state is built (:meth:`SecureAggregation.check`).

Where masking runs: :class:`SecureTransport` wraps the run's transport and masks each reply
as it arrives from the client code (in-process, vectorised or pool worker processes), after
the client's own check for non-finite values and before the round loop, its ledger or the
algorithm see it; the ledger counts the masked integers.
Training metrics (loss, steps) still reach the server per client.

On Flower the transport masks and sums itself, with Flower's own SecAgg+ protocol
(:mod:`fedshift.flower.secagg`: its ``secure_train``): :class:`SecureTransport` hands it the
round and keeps the sum it returns for :meth:`SecureAggregation.combine`; the refusals of
:meth:`SecureAggregation.check` are the same.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from fedshift.core.config import RunConfig
from fedshift.core.contract import Reply
from fedshift.core.disclosure import (
    UP,
    Disclosure,
    Kind,
    Site,
    To,
    When,
    summed_records,
)
from fedshift.core.errors import ConfigError, FedshiftError
from fedshift.core.payload import Payload, Tensors
from fedshift.core.seeding import derive_seed, generator
from fedshift.runtime.guarded import GuardedTransport

if TYPE_CHECKING:
    from fedshift.algorithms.base import Algorithm
    from fedshift.augment.base import Augment
    from fedshift.runtime.experiment import Experiment
    from fedshift.runtime.transport import Transport

#: the record of a masked reply that holds its weight and example count
META = "secagg"
#: the client name of the one reply the server hands the algorithm
SUM_CLIENT = "(secure sum)"


@dataclass(frozen=True)
class FixedPoint:
    """The finite field and the fixed-point code of the masked values."""

    frac_bits: int = 16
    modulus_bits: int = 62

    @property
    def modulus(self) -> int:
        return 1 << self.modulus_bits

    @property
    def scale(self) -> float:
        return float(2**self.frac_bits)

    def limit(self, clients: int) -> int:
        """The largest magnitude one client's quantised value may have so that the sum over
        ``clients`` cannot wrap around the modulus (decoded as a signed integer)."""
        return self.modulus // (2 * max(1, clients))

    def mean_error(self, clients: int) -> float:
        """The bound on ``|secure mean - plain mean|`` per element over ``clients`` replies
        whose weights are >= 1 (module docstring): ``clients * 2**-frac_bits``."""
        return clients * 2.0**-self.frac_bits


def pair_seed(seed: int, rnd: int, a: str, b: str) -> int:
    """The secret clients ``a`` and ``b`` share in round ``rnd``: in a deployment what a key
    agreement between them (Diffie-Hellman in Bonawitz et al.) gives both and nobody else;
    on the native engines derived from the run seed, the round and the pair (in either
    order), so both ends and a resumed run compute the same one."""
    lo, hi = sorted((a, b))
    return derive_seed(seed, "secagg", rnd, lo, hi)


def pair_mask(seed: int, rnd: int, a: str, b: str, n: int, modulus: int) -> torch.Tensor:
    """``n`` integers uniform in ``[0, modulus)`` drawn from the pair's secret."""
    g = generator(pair_seed(seed, rnd, a, b))
    return torch.randint(0, modulus, (n,), generator=g, dtype=torch.int64)


def record_layout(up: Payload) -> list[tuple[str, str]]:
    """(record, key) of every tensor, in the order the masked vector holds them (and Flower's
    SecAgg+ vector: :mod:`fedshift.flower.secagg`)."""
    return [(r, k) for r in sorted(up.records) for k in sorted(up.records[r])]


def flat_records(
    up: Payload, names: list[tuple[str, str]], uniform: frozenset[str], factor: float
) -> list[torch.Tensor]:
    """The reply's tensors ``names`` flattened in float64, each times ``factor`` (its weight)
    unless its record is averaged plainly (``uniform``)."""
    return [up.records[r][k].detach().to("cpu", torch.float64).flatten()
            * (1.0 if r in uniform else factor) for r, k in names]  # fmt: skip


def first_flagged(
    over: torch.Tensor, up: Payload, names: list[tuple[str, str]]
) -> tuple[int, str] | None:
    """The first element ``over`` flags in the flattened reply (:func:`flat_records`, then
    the weight): its index and what it is (``tensor <record>/<key>``, or the weight); None
    when ``over`` flags none."""
    if not bool(over.any()):
        return None
    i = at = int(over.nonzero()[0])
    for r, k in names:
        n = up.records[r][k].numel()
        if at < n:
            return i, f"tensor {r}/{k}"
        at -= n
    return i, "the weight"


def mask_reply(
    fp: FixedPoint, seed: int, rnd: int, cid: str, cohort: list[str], up: Payload,
    weight: float, uniform: frozenset[str] = frozenset(),
) -> Payload:  # fmt: skip
    """Client ``cid``'s masked reply (module docstring, steps 1-3): each tensor as int64
    residues modulo ``fp.modulus``, its weight, count and example count in record
    ``secagg``; the metrics pass as they are. ``cohort``: the round's clients (``cid`` among
    them); ``uniform``: records weighted 1 (their plain mean)."""
    if weight < 1:
        raise FedshiftError(
            f"round {rnd}: secure aggregation needs aggregation weights >= 1 (the error bound "
            f"divides by their sum); client {cid!r} has {weight}"
        )
    names = record_layout(up)
    parts = flat_records(up, names, uniform, weight)
    values = torch.cat([*parts, torch.tensor([weight, 1.0], dtype=torch.float64)])
    q = torch.round(values * fp.scale)
    limit = fp.limit(len(cohort))
    flagged = first_flagged(q.abs() >= limit, up, names)
    if flagged is not None:
        i, where = flagged
        raise FedshiftError(
            f"round {rnd}: client {cid!r}: secure aggregation would overflow at {where} "
            f"(weighted value {float(values[i]):.4g} times 2**{fp.frac_bits} summed over "
            f"{len(cohort)} clients exceeds the modulus 2**{fp.modulus_bits}); lower "
            "federation.secagg_frac_bits or raise federation.secagg_modulus_bits (at most 62)"
        )
    q = torch.cat([q.to(torch.int64), torch.tensor([up.num_examples], dtype=torch.int64)])
    q = q.remainder(fp.modulus)
    for other in cohort:
        if other == cid:
            continue
        m = pair_mask(seed, rnd, cid, other, q.numel(), fp.modulus)
        q = (q + m if cid < other else q - m).remainder(fp.modulus)
    records: dict[str, Tensors] = {r: {} for r in up.records}
    config: dict[str, float | int | str] = {}
    start = 0
    for r, k in names:
        t = up.records[r][k]
        records[r][k] = q[start : start + t.numel()].reshape(t.shape)
        config[f"{META}/dtype/{r}/{k}"] = str(t.dtype).removeprefix("torch.")
        start += t.numel()
    records[META] = {"weight": q[start : start + 1], "count": q[start + 1 : start + 2],
                     "examples": q[start + 2 : start + 3]}  # fmt: skip
    return Payload(records, num_examples=0, metrics=dict(up.metrics), config=config)


def unmask_sum(
    fp: FixedPoint, rnd: int, cohort: list[str], masked: dict[str, Payload],
    device: torch.device | str = "cpu", uniform: frozenset[str] = frozenset(),
) -> Payload:  # fmt: skip
    """The server's side: the masked replies of every client of ``cohort`` added modulo
    ``fp.modulus`` (the masks cancel), decoded, and divided by the summed weight (a record
    of ``uniform``: by the count of clients): one payload holding each record's mean and
    the summed example count."""
    lost = [c for c in cohort if c not in masked]
    if lost:
        raise FedshiftError(
            f"round {rnd}: secure aggregation lost client(s) {', '.join(lost)}: their pairwise "
            "masks stay in the other clients' replies, so the sum cannot be recovered (this "
            "version has no dropout recovery). Restart those clients and resume the run "
            "(`--resume`), or run without federation.secure_aggregation"
        )
    first = masked[cohort[0]]
    names = record_layout(first)
    shapes = [(r, k, tuple(first.records[r][k].shape)) for r, k in names]
    for cid in cohort[1:]:
        other = masked[cid]
        got = [(r, k, tuple(other.records[r][k].shape)) for r, k in record_layout(other)]
        if got != shapes:
            raise FedshiftError(
                f"round {rnd}: secure aggregation needs the same records from every client; "
                f"client {cid!r} sent {sorted({r for r, _, _ in got})}, client {cohort[0]!r} "
                f"{sorted({r for r, _, _ in shapes})} (or other shapes)"
            )
    total = torch.zeros(sum(first.records[r][k].numel() for r, k in names), dtype=torch.int64)
    for cid in cohort:
        p = masked[cid]
        flat = torch.cat([p.records[r][k].flatten() for r, k in names])
        total = (total + flat).remainder(fp.modulus)
    half = fp.modulus // 2
    signed = torch.where(total >= half, total - fp.modulus, total)
    out: dict[str, Tensors] = {}
    meta: dict[str, int] = {}
    for r, k in names:
        n = first.records[r][k].numel()
        part, signed = signed[:n], signed[n:]
        if r == META:
            meta[k] = int(part[0])
            continue
        out.setdefault(r, {})[k] = part.reshape(first.records[r][k].shape)
    records: dict[str, Tensors] = {}
    for r, rec in out.items():
        records[r] = {}
        over = (meta["count"] if r in uniform else meta["weight"]) / fp.scale
        for k, s in rec.items():
            dtype = getattr(torch, str(first.config[f"{META}/dtype/{r}/{k}"]))
            mean = s.to(torch.float64) / fp.scale / over
            if not dtype.is_floating_point:
                mean = mean.round()  # integer tensors (BN counters), as weighted_average does
            records[r][k] = mean.to(device=device, dtype=dtype)
    return Payload(records, num_examples=meta["examples"])


#: bytes of Flower's SecAgg+ key exchange a client sends (flwr 1.41: SECP384R1 public keys
#: of 215 bytes, an encrypted share pair of 612 bytes to every other client, a seed share of
#: 52 bytes (a dropped client's key share: 324) per client to unmask, node ids of 8 bytes)
FLOWER_KEYS = {"public_keys": 2 * 215, "per_other": 612 + 8, "per_unmask": 324 + 8}


def secure_disclosures(cfg: RunConfig, declared: list[Disclosure]) -> list[Disclosure]:
    """``declared`` as a run with ``federation.secure_aggregation`` sends them (unchanged
    when it is off): each record the server only sums goes masked, as int64 residues (8
    bytes an element: at most twice a record of 4-byte elements), and two records are
    added: ``secagg`` (the masked weight, count and example count; on Flower its weight
    factor, the masked weight and example count) and, on Flower, ``secagg+`` (its SecAgg+
    key exchange, which grows with the round's clients)."""
    if not cfg.federation.secure_aggregation:
        return declared
    out = []
    for d in declared:
        if d.hideable:
            size = d.size
            d = Disclosure(**{**d.__dict__, "size": lambda s, size=size: 2 * size(s),
                              "exact": False, "what": f"{d.what}; masked: int64 residues, "
                              "8 bytes an element"})  # fmt: skip
        out.append(d)

    def keys(site: Site) -> int:
        n = site.num_sites
        k = FLOWER_KEYS
        return k["public_keys"] + k["per_other"] * (n - 1) + k["per_unmask"] * n

    where = "secure aggregation"
    out.append(Disclosure(
        META, UP, Kind.PROTOCOL, When.ROUND, lambda s: 24,
        "the site's aggregation weight, a count of 1 (on Flower: SecAgg+'s weight factor) and "
        "its example count, masked: the server learns only their sums",
        to=To.SERVER,
    ).with_source(where, summed=True))  # fmt: skip
    out.append(Disclosure(
        "secagg+", UP, Kind.PROTOCOL, When.ROUND, keys,
        "Flower's SecAgg+ key exchange: two public keys, an encrypted share of the site's "
        "mask seed and key for every other client of the round, the shares that unmask",
        to=To.SERVER, maybe="on Flower only (fedshift flower ...)", exact=False,
    ).with_source(where))  # fmt: skip
    return out


class SecureAggregation:
    """A run's secure aggregation (module docstring): refusals, client-side masking,
    server-side sum. Built by :meth:`of` (None when ``federation.secure_aggregation`` is
    off)."""

    def __init__(self, cfg: RunConfig) -> None:
        fed = cfg.federation
        self.fp = FixedPoint(fed.secagg_frac_bits, fed.secagg_modulus_bits)
        self.seed = cfg.seed
        self.sample_fraction = fed.sample_fraction
        self.device: torch.device | str = "cpu"
        self.weight: Callable[[Payload], float] = lambda p: 1.0
        #: records whose declared mean is uniform (not weighted by ``reply_weight``)
        self.uniform: frozenset[str] = frozenset()
        #: a transport that sums itself (Flower's SecAgg+): each round's sum, until combined
        self.summed: dict[int, Payload] = {}

    @classmethod
    def of(cls, cfg: RunConfig) -> SecureAggregation | None:
        return cls(cfg) if cfg.federation.secure_aggregation else None

    def wrap(self, transport: Transport) -> SecureTransport:
        """``transport`` with every reply masked on arrival (on Flower: summed by its
        SecAgg+, the transport's own ``secure_train``)."""
        return SecureTransport(transport, self)

    def check(self, exp: Experiment) -> None:
        """Refuse a method that sends any record the server does not only sum, naming each
        record and why (:meth:`fedshift.core.disclosure.Disclosure.secure_aggregation`)."""
        ups = [d for d in exp.algo.disclosures(exp.model) if d.direction == UP]
        bad = [d for d in ups if not d.hideable]
        if bad:
            why = "; ".join(f"{d.record!r} ({d.source}): {d.secure_aggregation()}" for d in bad)
            raise ConfigError(
                "config key 'federation.secure_aggregation': this method sends record(s) "
                f"secure aggregation cannot hide from the server: {why}. Set "
                "federation.secure_aggregation=false, or choose a method whose server only "
                "averages what sites send (`fedshift privacy show` says which records can be)"
            )
        varies = [d.record for d in ups if d.maybe or not d.exact]
        if varies:
            raise ConfigError(
                "config key 'federation.secure_aggregation': record(s) "
                f"{', '.join(map(repr, varies))} are sent on a condition or with tensors that "
                "depend on what the round saw, so sites of one round may send different "
                "tensors, whose masks cannot be summed together; set "
                "federation.secure_aggregation=false"
            )
        once = [d.record for d in ups if d.when is not When.ROUND]
        if once and self.sample_fraction < 1:
            raise ConfigError(
                "config key 'federation.secure_aggregation': record(s) "
                f"{', '.join(map(repr, once))} are sent once, in the first round a site takes "
                "part in; with federation.sample_fraction < 1 a later round mixes sites that "
                "send them with sites that do not, whose masks cannot be summed together. Set "
                "federation.sample_fraction=1 or federation.secure_aggregation=false"
            )
        algo = exp.algo
        parts: list[Algorithm | Augment] = [algo.algo, *algo.augments]
        marks = [summed_records(type(c).aggregate) for c in parts]
        self.uniform = frozenset(r for m in marks for r, w in m.items() if w == "uniform")
        self.weight = algo.algorithm.reply_weight  # type: ignore[attr-defined]
        self.device = exp.device

    def mask(self, rnd: int, cid: str, cohort: list[str], up: Payload) -> Payload:
        """Client ``cid``'s reply of round ``rnd``, masked (:func:`mask_reply`)."""
        weight = float(self.weight(up))
        return mask_reply(self.fp, self.seed, rnd, cid, cohort, up, weight, self.uniform)

    def combine(self, rnd: int, cohort: list[str], replies: list[Reply]) -> list[Reply]:
        """The one reply the algorithm's ``aggregate`` receives: the securely summed mean
        of the masked ``replies`` of every client of ``cohort`` (on Flower: the sum its
        SecAgg+ gave for the round, over the clients that sent a vector)."""
        if rnd in self.summed:
            return [(SUM_CLIENT, self.summed.pop(rnd))]
        summed = unmask_sum(self.fp, rnd, cohort, dict(replies), self.device, self.uniform)
        return [(SUM_CLIENT, summed)]


class SecureTransport(GuardedTransport[SecureAggregation]):
    """A transport whose replies are masked as they arrive from the client code
    (:meth:`SecureAggregation.mask`, a NaN refused first: the loop cannot see one once it is
    masked); every other call goes to the wrapped transport."""

    def train(
        self, rnd: int, cids: list[str], down: Callable[[str], Payload]
    ) -> tuple[dict[str, Payload], list[str]]:
        own = getattr(self.inner, "secure_train", None)
        if own is not None:  # Flower: the nodes mask, its SecAgg+ workflow sums
            replies, lost, self.guard.summed[rnd] = own(rnd, cids, down, self.guard)
            return replies, lost
        return super().train(rnd, cids, down)

    def protect(self, rnd: int, cid: str, cids: list[str], up: Payload) -> Payload:
        return self.guard.mask(rnd, cid, cids, up)

    def info(self) -> dict | None:
        info = self.inner.info()
        if info is None:
            return None
        fp = self.guard.fp
        extra = info.pop("secure_aggregation", {})  # Flower's: its protocol and key bytes
        keys = {"frac_bits": fp.frac_bits, "modulus_bits": fp.modulus_bits, **extra}
        return {**info, "secure_aggregation": keys}
