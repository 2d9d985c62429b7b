"""The disclosure model: what each payload record says about a site, declared next to the
code that sends it.

Every record an algorithm or augment puts in a :class:`~fedshift.core.payload.Payload` is
declared by its component's ``disclosures(model)`` (``Algorithm.disclosures`` in
``algorithms/``, ``Augment.disclosures`` in ``augment/``) as one :class:`Disclosure`: its
record name and direction (``up``: the site sends it; ``down``: the site receives it), what
it is (:class:`Kind`), who receives an ``up`` record (:class:`To`), how often (:class:`When`),
for a statistic what one value summarises (:class:`Over`) and how many examples that is at
a given site, and its size in bytes at a site (from the model's and the data's shapes).

The vocabulary lives here once; ``fedshift privacy show`` prints the declarations of a config
(:mod:`fedshift.runtime.disclosure`), and ``tests/core/test_disclosure.py`` runs every
registered algorithm and augment and checks that the records the
:class:`~fedshift.core.payload.Ledger` counted are exactly the declared ones, of the declared
sizes. Imports only the standard library and ``core``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Literal, TypeVar

from fedshift.core.federation import ClientData

Direction = Literal["up", "down"]
UP: Direction = "up"
DOWN: Direction = "down"

__all__ = [
    "DOWN",
    "UP",
    "Direction",
    "Disclosure",
    "Kind",
    "Over",
    "Site",
    "To",
    "When",
    "fixed",
    "site_of",
    "summed_records",
    "sums_only",
    "tensor_bytes",
]


class Kind(StrEnum):
    """What a record is."""

    #: model parameters (or buffers) as trained or aggregated
    PARAMETERS = "parameters"
    #: an update of parameters: a difference, a gradient, a control variate
    UPDATE = "update"
    #: an aggregate statistic of examples (a mean, a variance, a histogram, a spectrum)
    STATISTIC = "statistic"
    #: data of single examples (images, per-image spectra)
    EXAMPLES = "examples"
    #: representations (features) of single examples
    REPRESENTATION = "representation"
    #: a protocol's key material (public keys, secret shares of mask seeds): nothing of the
    #: data (Flower's SecAgg+ key exchange)
    PROTOCOL = "protocol"


class To(StrEnum):
    """Who receives a record a site sends (the server sees it as sent, unless
    ``federation.secure_aggregation`` hides a record the server only sums:
    :attr:`Disclosure.summed`, :mod:`fedshift.runtime.secagg`)."""

    #: the server only (what it sends back is a model trained or updated with it)
    SERVER = "server only"
    #: the server, and the other clients only inside an aggregate over sites
    AGGREGATE = "server; clients: aggregate"
    #: the server, and the other clients as it was sent
    CLIENTS = "server; clients: as sent"


class When(StrEnum):
    """How often a record crosses the wire."""

    #: once, in the setup exchange before round 1 (round 0 in the ledger)
    SETUP = "once (setup)"
    #: every round the site takes part in
    ROUND = "every round"
    #: once, in the first round the site takes part in (or the first it can)
    ONCE = "once"


class Over(StrEnum):
    """What one value of a statistic (or of per-example data) summarises at a site."""

    #: all the site's training examples
    SITE = "site"
    #: the site's training examples of one class
    CLASS = "class"
    #: a group of the site's examples (a parameter of the method fixes its size)
    GROUP = "group"
    #: one mini-batch (a running statistic dominated by recent batches counts as one)
    BATCH = "batch"
    #: one example
    EXAMPLE = "example"


@dataclass(frozen=True)
class Site:
    """The facts about one training site that sizes and counts are computed from."""

    name: str
    #: training examples at the site
    examples: int
    #: training examples per class (classification; None for per-pixel labels)
    class_counts: tuple[int, ...] | None
    #: (C, H, W) of an image
    input_shape: tuple[int, int, int]
    num_classes: int
    #: training examples of every training site, in federation order (this one included)
    federation: tuple[int, ...]
    batch_size: int
    #: mini-batch steps of one round's local work
    steps: int

    @property
    def image_floats(self) -> int:
        """Numbers in one image (C x H x W)."""
        return math.prod(self.input_shape)

    @property
    def num_sites(self) -> int:
        return len(self.federation)

    @property
    def classes_held(self) -> int:
        """Classes with at least one training example here (all classes when unknown)."""
        if self.class_counts is None:
            return self.num_classes
        return sum(1 for c in self.class_counts if c)

    @property
    def steps_per_epoch(self) -> int:
        """As :meth:`fedshift.core.context.ClientContext.steps_per_epoch` counts them."""
        full, rest = divmod(self.examples, self.batch_size)
        return full + (1 if rest > 1 else 0)

    @property
    def smallest_batch(self) -> int:
        """The fewest examples one of the site's mini-batches holds (a trailing batch of one
        is skipped, as the local loop does)."""
        if self.examples <= self.batch_size:
            return self.examples
        rest = self.examples % self.batch_size
        return rest if rest > 1 else self.batch_size

    @property
    def last_epoch_examples(self) -> int:
        """Examples the round's last local epoch draws (FPL's and ADCOL's uploads)."""
        if self.steps >= self.steps_per_epoch:
            return self.examples
        return min(self.examples, self.steps * self.batch_size)


def site_of(
    data: ClientData,
    federation: Iterable[int],
    num_classes: int,
    batch_size: int,
    local_steps: int | None,
    local_epochs: int,
) -> Site:
    """The :class:`Site` of a client's data (its labels are counted; no image is read)."""
    x, y = data.train.x, data.train.y
    n = int(x.shape[0])
    counts = None
    if y.ndim == 1:
        counts = tuple(int(c) for c in y.long().cpu().bincount(minlength=num_classes).tolist())
    site = Site(
        name=data.name,
        examples=n,
        class_counts=counts,
        input_shape=tuple(int(s) for s in x.shape[1:]),  # type: ignore[arg-type]
        num_classes=num_classes,
        federation=tuple(federation),
        batch_size=batch_size,
        steps=0,
    )
    steps = local_steps if local_steps is not None else local_epochs * site.steps_per_epoch
    return Site(**{**site.__dict__, "steps": steps})


def tensor_bytes(tensors: Mapping[str, Any], keys: Iterable[str] | None = None) -> int:
    """Bytes of the named tensors (all, or ``keys``): ``numel * element_size`` each, as the
    ledger counts them (tensors on the meta device count alike)."""
    names = tensors.keys() if keys is None else keys
    return sum(tensors[k].numel() * tensors[k].element_size() for k in names)


def fixed(nbytes: int) -> Callable[[Site], int]:
    """A size that does not depend on the site."""
    return lambda site: nbytes


def _default_count(over: Over | None) -> Callable[[Site], int] | None:
    if over is Over.SITE:
        return lambda s: s.examples
    if over is Over.CLASS:
        return lambda s: min((c for c in s.class_counts or () if c), default=s.examples)
    if over is Over.BATCH:
        return lambda s: s.smallest_batch
    if over is Over.EXAMPLE:
        return lambda s: 1
    return None


@dataclass(frozen=True)
class Disclosure:
    """One payload record, declared by the component that sends it (module docstring)."""

    record: str
    direction: Direction
    kind: Kind
    when: When
    #: its bytes at a site (exact, or an upper bound when ``exact`` is False)
    size: Callable[[Site], int]
    #: one line: what the record holds
    what: str
    #: who receives an ``up`` record (None for ``down``)
    to: To | None = None
    #: for an ``up`` statistic (and per-example data): what one value summarises; for
    #: parameters, what statistics inside them summarise (shared BatchNorm running
    #: statistics: recent mini-batches)
    over: Over | None = None
    #: the examples one value summarises at a site (default: from ``over``; ``GROUP`` must
    #: give it)
    count: Callable[[Site], int] | None = None
    #: a ``down`` record: the ``up`` records (or ``weights``: the server's model) it is
    #: computed from
    carries: tuple[str, ...] = ()
    #: a condition decided while the run goes (empty: always sent at ``when``)
    maybe: str = ""
    #: False when ``size`` is an upper bound (the record depends on what the round saw)
    exact: bool = True
    #: the default L2 bound of one example's contribution when ``privacy.epsilon`` protects
    #: this ``up`` record (:mod:`fedshift.core.privacy`), from the input shape (C, H, W): the
    #: component clips and releases it; None: the component cannot protect it
    clip: Callable[[tuple[int, int, int]], float] | None = None
    #: why the component cannot protect this record (with ``clip`` None): one line
    unprotectable: str = ""
    #: the component that declared it (set by the composition)
    source: str = field(default="", compare=False)
    #: an ``up`` record the server reads only through its weighted sum over the round's sites
    #: (the component's ``aggregate`` is declared :func:`sums_only` for it; set by the
    #: composition): secure aggregation can hide each site's value from the server
    summed: bool = field(default=False, compare=False)

    def __post_init__(self) -> None:
        if self.direction == UP and self.to is None:
            raise ValueError(f"record {self.record!r}: an up record names who receives it (to)")
        data = (Kind.STATISTIC, Kind.EXAMPLES, Kind.REPRESENTATION)
        if self.direction == UP and self.kind in data and not self.over:
            raise ValueError(f"record {self.record!r}: a {self.kind} says what it summarises")
        if self.over is Over.GROUP and self.count is None:
            raise ValueError(f"record {self.record!r}: a group statistic gives its count")

    @property
    def key(self) -> tuple[str, str]:
        return (self.direction, self.record)

    def bytes_at(self, site: Site) -> int:
        return int(self.size(site))

    def examples_at(self, site: Site) -> int | None:
        """Examples one value summarises at ``site`` (None: not a statistic of examples)."""
        count = self.count or _default_count(self.over)
        return None if count is None else int(count(site))

    def rule(self) -> str:
        """``over`` in words: what the smallest count is."""
        return {
            None: "",
            Over.SITE: "the site's training examples",
            Over.CLASS: "the site's examples of its rarest class",
            Over.GROUP: "one group of examples",
            Over.BATCH: "one mini-batch",
            Over.EXAMPLE: "one example",
        }[self.over]

    def with_source(self, source: str, summed: bool = False) -> Disclosure:
        return Disclosure(**{**self.__dict__, "source": source, "summed": summed})

    @property
    def hideable(self) -> bool:
        """An ``up`` record secure aggregation can hide from the server: summed by the
        server, and not forwarded to other clients as sent."""
        return self.direction == UP and self.summed and self.to is not To.CLIENTS

    def secure_aggregation(self) -> str:
        """Whether secure aggregation (``federation.secure_aggregation``) can hide this
        ``up`` record from the server, and why not where it cannot ("" for ``down``)."""
        if self.direction != UP:
            return ""
        if self.to is To.CLIENTS:
            return "no: other clients receive it as sent; secure aggregation cannot hide it"
        if self.hideable:
            return "yes: the server reads only its sum over the round's sites"
        if self.kind is Kind.PROTOCOL:
            return "not needed: the protocol's own key material, nothing of the data"
        return (
            "no: the server's aggregate reads each site's value (it is not declared sums_only "
            f"by {self.source or 'its component'}'s aggregate)"
        )

    @property
    def needs_protection(self) -> bool:
        """An ``up`` record of data (a statistic, examples, representations): what
        ``privacy.epsilon`` must protect or refuse (weights and updates are not covered)."""
        return self.direction == UP and self.kind in (
            Kind.STATISTIC,
            Kind.EXAMPLES,
            Kind.REPRESENTATION,
        )

    def privacy(self) -> str:
        """Whether ``privacy.epsilon`` protects this ``up`` record, and why not where it
        cannot ("" for ``down``)."""
        if self.direction != UP:
            return ""
        if self.kind is Kind.PROTOCOL:
            return "not covered: a record of the secure aggregation protocol itself"
        if not self.needs_protection:
            return "not covered: privacy.epsilon protects shared statistics, not model weights"
        if self.clip is not None:
            return "yes: clipped per example, Gaussian noise"
        why = self.unprotectable or f"{self.source or 'its component'} gives no per-example bound"
        return f"no, refused: {why}"

    def row(self, sites: list[Site]) -> dict:
        """The record at ``sites``: plain data for a table or JSON."""
        sizes = [self.bytes_at(s) for s in sites]
        counts = [c for c in (self.examples_at(s) for s in sites) if c is not None]
        return {
            "record": self.record,
            "direction": self.direction,
            "component": self.source,
            "kind": str(self.kind),
            "to": None if self.to is None else str(self.to),
            "when": str(self.when),
            "maybe": self.maybe,
            "what": self.what,
            "bytes_min": min(sizes, default=0),
            "bytes_max": max(sizes, default=0),
            "bytes_exact": self.exact,
            "over": None if self.over is None else str(self.over),
            "rule": self.rule(),
            "fewest_examples": min(counts) if counts else None,
            "carries": list(self.carries),
            "secure_aggregation": self.secure_aggregation(),
            "privacy": self.privacy(),
            "clip": None
            if self.clip is None or not sites
            else float(self.clip(sites[0].input_shape)),
        }


_F = TypeVar("_F", bound=Callable[..., Any])


Weighting = Literal["reply", "uniform"]


def sums_only(*records: str, weight: Weighting = "reply") -> Callable[[_F], _F]:
    """Declare, on a component's ``aggregate``, that the server reads the named ``up``
    records only through their mean over the round's replies, and reads nothing else of any
    single reply; ``weight``: ``reply``, weighted by the algorithm's ``reply_weight``
    (``Algorithm.average_record``), or ``uniform``, the plain mean over the replies that hold
    the record. Such an ``aggregate`` gives the same result when handed one reply holding
    that mean (what secure aggregation hands it: :mod:`fedshift.runtime.secagg`), so secure
    aggregation can hide each site's value of these records from the server.

    The mark sits on the function: a subclass that overrides ``aggregate`` is not marked
    unless it declares it again."""

    def mark(fn: _F) -> _F:
        fn.sums_only = {r: weight for r in records}  # type: ignore[attr-defined]
        return fn

    return mark


def summed_records(aggregate: Callable[..., Any]) -> dict[str, Weighting]:
    """The records an ``aggregate`` function is declared :func:`sums_only` for, with the
    weighting of each one's mean."""
    return dict(getattr(aggregate, "sums_only", {}))
