"""Label-skew partitions: re-split a dataset's pooled examples across simulated clients.

A partition is a config section ``partition: {name: ..., **params}``. ``none`` keeps the
dataset's own clients (its domains, the feature-skew setting). The others pool every client's
train/val/test splits (:meth:`Federation.pooled`) and deal them out to ``clients`` new clients
named ``client00``, ``client01``, ...:

- ``iid``: every class is cut into equal random parts, one per client;
- ``classes``: the pFedHN-style split DisTrans uses: ``classes_per_client`` classes per client,
  per-class shares drawn from U(low, high) and normalised;
- ``dirichlet``: per class, client shares ~ Dir(alpha), redrawn until every client has at
  least ``min_size`` training examples;
- ``one-class``: client k holds only class k; its test set adds negatives from other classes.

One mechanism does the dealing (:func:`deal`): a (clients x classes) share matrix, whose
column c says which fraction of class c each client gets, is applied to *each* split, so a
client's validation and test sets follow its own label distribution (as in pFedHN's and
DisTrans's code, where the same class partition is used for train and test).

Determinism: a partition draws its randomness only from its own ``partition.seed`` (default
0), never from the run's ``seed``. Running several seeds therefore measures training variance
on one fixed partition; change ``partition.seed`` to measure partition variance.

Every partition (``none`` included) records in ``Federation.info``: ``dh`` (DisTrans's
distributional heterogeneity, Eq. 3-4, of the clients' *training* labels,
:func:`degree_of_heterogeneity`), ``tv_heterogeneity`` (mean pairwise TV distance),
``label_counts`` (clients x classes, training split) and ``partition`` (name and params).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from fedshift.core.bounds import bounded
from fedshift.core.components import Component
from fedshift.core.errors import ConfigError, DataError
from fedshift.core.federation import SPLITS, ClientData, Federation, Split
from fedshift.core.registry import Registry
from fedshift.core.tasks import LABEL_FREE_PARTITIONS
from fedshift.data.common.seeding import seeded_rng
from fedshift.data.common.sites import numbered_clients
from fedshift.data.domain_partition import DomainsParams, domains

PartitionFn = Callable[[Federation, object], Federation]
PARTITIONS: Registry[PartitionFn] = Registry("partition")

#: how often ``dirichlet`` redraws its shares before giving up
DIRICHLET_MAX_DRAWS = 1000

__all__ = [
    "PARTITIONS",
    "ClassesParams",
    "DirichletParams",
    "IIDParams",
    "OneClassParams",
    "apply_partition",
    "deal",
    "deal_counts",
    "degree_of_heterogeneity",
    "tv_heterogeneity",
    "keep",
    "label_counts",
]


# --------------------------------------------------------------------------------------------
# degree of heterogeneity
# --------------------------------------------------------------------------------------------


def _client_rows(counts: torch.Tensor) -> torch.Tensor:
    """Check a (clients x classes) count matrix and drop clients without examples."""
    p = torch.as_tensor(counts, dtype=torch.float64)
    if p.dim() != 2:
        raise ValueError(f"counts must be a (clients x classes) matrix, got shape {tuple(p.shape)}")
    if (p < 0).any():
        raise ValueError("counts must be non-negative")
    return p[p.sum(dim=1) > 0]


def degree_of_heterogeneity(counts: torch.Tensor) -> float:
    """DisTrans's distributional heterogeneity DH (Yuan et al., ECCV 2022, Eq. 3-4), in percent.

    ``counts`` is a (clients x classes) tensor of label counts (or distributions); a client
    "has data from class j" when its entry is positive. Clients without examples are left out.
    With N classes and C clients,

        DH = 1 - sum_j c_j / (N x C)                                   (Eq. 3)
        c_j = 0 if only one client has class j, else k = #clients holding class j   (Eq. 4)

    A class no client holds also contributes 0 (no client has data from it). DH is 0 % when
    every client holds every class (i.i.d.) and 100 % when each class sits on one client.
    With no client it is 0.
    """
    p = _client_rows(counts)
    c, n = p.shape
    if c == 0 or n == 0:
        return 0.0
    k = (p > 0).sum(dim=0)  # clients holding each class
    c_j = torch.where(k > 1, k, torch.zeros_like(k))
    return float(100.0 * (1.0 - c_j.sum().item() / (n * c)))


def tv_heterogeneity(counts: torch.Tensor) -> float:
    """Mean pairwise total-variation distance between clients' label distributions, percent.

    Not the paper's DH (that is :func:`degree_of_heterogeneity`, Eq. 3-4): an auxiliary
    measure that, unlike Eq. 3-4, sees how *much* of each class a client holds. It is 0 when
    all clients have the same label distribution and 100 when no two clients share a class;
    with fewer than two clients it is 0. Reported as ``tv_heterogeneity`` in summary.json.
    """
    p = _client_rows(counts)
    p = p / p.sum(dim=1, keepdim=True)
    n = p.shape[0]
    if n < 2:
        return 0.0
    tv = 0.5 * (p[:, None, :] - p[None, :, :]).abs().sum(dim=-1)  # (n, n), zero diagonal
    return float(100.0 * tv.sum() / (n * (n - 1)))


def label_counts(fed: Federation, split: str = "train") -> list[list[int]]:
    """Per-client label counts of one split, (clients x classes) as a list of lists."""
    c = fed.num_classes
    return [
        torch.bincount(cd.split(split).y.long(), minlength=c)[:c].tolist() for cd in fed.clients
    ]


# --------------------------------------------------------------------------------------------
# the shared "pool, then deal index lists per split" mechanism
# --------------------------------------------------------------------------------------------


def deal_counts(shares: np.ndarray, class_counts: np.ndarray) -> np.ndarray:
    """(clients x classes) example counts: class c's ``class_counts[c]`` examples are cut at
    ``round(cumsum(shares[:, c]) / sum(shares[:, c]) * class_counts[c])``.

    The clients are cut in the order ``c, c+1, ..., k-1, 0, ..., c-1`` (mod k) for class c,
    so rounding favours different clients in different classes (with equal shares and few
    examples per class, client 0 would otherwise lose every rounding). Every example of a
    class with a positive share column is dealt (none lost, none twice); a class whose column
    is all zero is held by no client.
    """
    shares = np.asarray(shares, dtype=np.float64)
    n = np.asarray(class_counts, dtype=np.int64)
    k, c = shares.shape
    cols = np.arange(c)[None, :]
    rot = (np.arange(k)[:, None] + cols) % k  # rot[j, c]: the j-th client cut in class c
    ordered = shares[rot, cols]
    col = ordered.sum(axis=0)
    used = col > 0
    cum = np.cumsum(ordered, axis=0) / np.where(used, col, 1.0)
    bounds = np.rint(cum * n[None, :]).astype(np.int64)
    bounds[-1, used] = n[used]  # exact, whatever the float rounding of the cumulative sum
    bounds = np.vstack([np.zeros((1, c), dtype=np.int64), bounds])
    counts = np.empty((k, c), dtype=np.int64)
    counts[rot, cols] = np.diff(bounds, axis=0)
    return counts


def deal(y: np.ndarray, shares: np.ndarray, rng: np.random.Generator) -> list[np.ndarray]:
    """Index arrays, one per client, dealing the examples with labels ``y`` by ``shares``.

    Vectorised: the examples are grouped by class in a random order, each position is given
    its owner from :func:`deal_counts`, and each client's indices are shuffled.
    """
    k, c = shares.shape
    y = np.asarray(y, dtype=np.int64)
    counts = deal_counts(shares, np.bincount(y, minlength=c)[:c])
    rest = np.bincount(y, minlength=c)[:c] - counts.sum(axis=0)  # classes nobody holds
    table = np.vstack([counts, rest[None, :]])  # (k + 1) x c, the last row: unassigned
    perm = rng.permutation(len(y))
    order = perm[np.argsort(y[perm], kind="stable")]  # by class, random within a class
    owner = np.repeat(np.tile(np.arange(k + 1), c), table.T.ravel())
    grouped = order[np.argsort(owner, kind="stable")]
    sizes = counts.sum(axis=1)
    parts = np.split(grouped[: sizes.sum()], np.cumsum(sizes)[:-1])
    return [rng.permutation(p) for p in parts]


def _pool(fed: Federation) -> ClientData:
    """The dataset's clients pooled; the one client itself when there is only one."""
    return fed.clients[0] if len(fed.clients) == 1 else fed.pooled()


def _check_labels(pool: ClientData, num_classes: int, name: str) -> None:
    for split in SPLITS:
        y = pool.split(split).y
        if len(y) and (int(y.min()) < 0 or int(y.max()) >= num_classes):
            raise DataError(
                f"partition {name!r}: pooled {split} labels must lie in 0..{num_classes - 1}"
            )


def _build(
    fed: Federation,
    pool: ClientData,
    index: dict[str, list[np.ndarray]],
    name: str,
    extra_info: dict | None = None,
) -> Federation:
    """The new federation from per-split, per-client index arrays into ``pool``.

    Raises :class:`DataError` if a client ends up with an empty split.
    """
    names = numbered_clients(len(index["train"]))
    for split in SPLITS:
        for cname, idx in zip(names, index[split], strict=True):
            if len(idx) == 0:
                have = len(pool.split(split))
                raise DataError(
                    f"partition {name!r}: {cname} gets no {split} examples (the pooled {split} "
                    f"split of {fed.name!r} has {have}); use fewer partition.clients, a milder "
                    f"setting, or larger dataset sizes (dataset.train_size/val_size/test_size)"
                )
    clients = []
    for i, cname in enumerate(names):
        parts = []
        for split in SPLITS:
            src = pool.split(split)
            idx = torch.from_numpy(np.asarray(index[split][i], dtype=np.int64))
            parts.append(Split(src.x.index_select(0, idx), src.y.index_select(0, idx)))
        clients.append(ClientData(cname, *parts))
    info = {**fed.info, "source_clients": fed.client_names, **(extra_info or {})}
    return Federation(fed.name, clients, list(fed.classes), fed.input_shape, info, fed.task)


def _deal_all(
    pool: ClientData, shares: np.ndarray, seed: int, name: str
) -> dict[str, list[np.ndarray]]:
    """Apply one share matrix to every split (the same class proportions everywhere)."""
    return {
        s: deal(pool.split(s).y.numpy(), shares, seeded_rng(seed, f"{name}/deal/{s}"))
        for s in SPLITS
    }


# --------------------------------------------------------------------------------------------
# params
# --------------------------------------------------------------------------------------------


def _where(prefix: str, key: str) -> str:
    return f"config key '{prefix}.{key}'" if prefix else f"config key '{key}'"


def _require(ok: bool, prefix: str, key: str, what: str, value: object) -> None:
    if not ok:
        raise ConfigError(f"{_where(prefix, key)} must be {what}, got {value!r}")


@dataclass
class IIDParams:
    """``iid``: each class cut into ``clients`` equal random parts."""

    clients: int = bounded(10, ge=1)
    seed: int = bounded(0, ge=0)  # the partition's own seed (independent of the run seed)


@dataclass
class ClassesParams:
    """``classes``: pFedHN/DisTrans split, ``classes_per_client`` classes per client."""

    clients: int = bounded(10, ge=1)
    classes_per_client: int = bounded(2, ge=1)  # u in DisTrans
    # each holder's share of a class ~ U(low, high), then normalised
    low: float = bounded(0.4, gt=0)
    high: float = bounded(0.6, gt=0)
    seed: int = bounded(0, ge=0)

    def validate(self, prefix: str = "partition") -> None:
        _require(self.high >= self.low, prefix, "high", f">= low ({self.low})", self.high)


@dataclass
class DirichletParams:
    """``dirichlet``: per class, client shares ~ Dir(alpha)."""

    clients: int = bounded(10, ge=1)
    alpha: float = bounded(0.5, gt=0)
    # redraw until every client has this many training examples
    min_size: int = bounded(10, ge=0)
    seed: int = bounded(0, ge=0)


@dataclass
class OneClassParams:
    """``one-class``: client k holds only class k (FedAwS; DisTrans's 100 % DH setting)."""

    clients: int | None = bounded(None, ge=1)  # None: the number of classes
    negatives: float = bounded(1.0, ge=0)  # test negatives per test positive
    seed: int = bounded(0, ge=0)


# --------------------------------------------------------------------------------------------
# the partitions
# --------------------------------------------------------------------------------------------


def keep(fed: Federation, params: object) -> Federation:
    """The dataset's own clients, unchanged."""
    return fed


def iid(fed: Federation, params: IIDParams) -> Federation:
    """Every class of every split cut into ``clients`` equal parts in random order: each
    client's label distribution matches the pool's (DH close to 0)."""
    pool = _pool(fed)
    _check_labels(pool, fed.num_classes, "iid")
    shares = np.ones((params.clients, fed.num_classes))
    return _build(fed, pool, _deal_all(pool, shares, params.seed, "iid"), "iid")


def assign_classes(clients: int, num_classes: int, u: int, rng: np.random.Generator) -> np.ndarray:
    """(clients x classes) boolean matrix: which ``u`` classes each client holds.

    As pFedHN's ``gen_classes_per_node`` (which DisTrans uses): every class has a quota of
    holders, the ``clients * u`` slots spread as evenly as possible (pFedHN requires them to
    divide evenly; here the remainder goes to randomly chosen classes), and each client in
    turn picks, ``u`` times, a random class among those it does not hold yet with the most
    quota left. The quotas stay within one of each other, so the picks never run out.
    """
    base, extra = divmod(clients * u, num_classes)
    remaining = np.full(num_classes, base, dtype=np.int64)
    remaining[rng.choice(num_classes, size=extra, replace=False)] += 1
    held = np.zeros((clients, num_classes), dtype=bool)
    for k in range(clients):
        for _ in range(u):
            avail = ~held[k] & (remaining > 0)
            best = remaining[avail].max()
            c = int(rng.choice(np.flatnonzero(avail & (remaining == best))))
            held[k, c] = True
            remaining[c] -= 1
    return held


def classes(fed: Federation, params: ClassesParams) -> Federation:
    """pFedHN-style label skew (DisTrans's non-i.i.d. setting).

    Each client holds ``classes_per_client`` (u) classes (:func:`assign_classes`). For each
    class, each of its holders draws a share from U(low, high); the shares are normalised per
    class and the class's examples are split in those proportions, in every split. Unlike
    pFedHN's code, which floors ``n_c * share`` and drops the remainder, the cuts are rounded
    cumulative shares, so no example of a held class is lost. If ``clients * u`` is smaller
    than the number of classes, only that many classes are held; the others are unused
    (listed in ``info["unused_classes"]``).
    """
    c, u = fed.num_classes, params.classes_per_client
    if u > c:
        raise ConfigError(
            f"config key 'partition.classes_per_client' must be <= the number of classes of "
            f"{fed.name!r} ({c}), got {u}"
        )
    pool = _pool(fed)
    _check_labels(pool, c, "classes")
    rng = seeded_rng(params.seed, "classes/assign")
    held = assign_classes(params.clients, c, u, rng)
    shares = rng.uniform(params.low, params.high, size=held.shape) * held
    index = _deal_all(pool, shares, params.seed, "classes")
    info = {
        "client_classes": [np.flatnonzero(row).tolist() for row in held],
        "unused_classes": np.flatnonzero(~held.any(axis=0)).tolist(),
    }
    return _build(fed, pool, index, "classes", info)


def dirichlet(fed: Federation, params: DirichletParams) -> Federation:
    """Per class, the clients' shares ~ Dir(alpha * 1) (Hsu et al. 2019; Li et al. 2022).

    The shares are redrawn until every client gets at least ``min_size`` training examples
    and at least one validation and one test example, at most
    :data:`DIRICHLET_MAX_DRAWS` times; then a :class:`DataError` says what to change.
    """
    k, c = params.clients, fed.num_classes
    pool = _pool(fed)
    _check_labels(pool, c, "dirichlet")
    n = {s: np.bincount(pool.split(s).y.numpy(), minlength=c)[:c] for s in SPLITS}
    rng = seeded_rng(params.seed, "dirichlet/shares")
    draws = 0
    while True:
        draws += 1
        shares = rng.dirichlet(np.full(k, params.alpha), size=c).T  # (clients x classes)
        sizes = {s: deal_counts(shares, n[s]).sum(axis=1) for s in SPLITS}
        if (
            sizes["train"].min() >= params.min_size
            and sizes["val"].min() >= 1
            and sizes["test"].min() >= 1
        ):
            break
        if draws == DIRICHLET_MAX_DRAWS:
            raise DataError(
                f"partition 'dirichlet': no draw in {DIRICHLET_MAX_DRAWS} gave every one of "
                f"{k} clients >= {params.min_size} training examples (partition.min_size) and "
                f"a non-empty val/test split, from {int(n['train'].sum())} pooled training "
                f"examples; lower partition.min_size or partition.clients, raise "
                f"partition.alpha, or use larger dataset sizes"
            )
    index = _deal_all(pool, shares, params.seed, "dirichlet")
    return _build(fed, pool, index, "dirichlet", {"dirichlet_draws": draws})


def one_class(fed: Federation, params: OneClassParams) -> Federation:
    """One class per client: the extreme label skew of FedAwS and DisTrans's 100 % DH.

    Client k holds class ``k % C`` (C classes). With fewer clients than classes, classes
    ``clients..C-1`` are unused; with more, each class is split evenly among its clients
    (k, k + C, k + 2C, ... share class k % C). Train and val hold positives only. The test set
    is the client's positives of the pooled test split plus ``round(negatives * positives)``
    negatives drawn without replacement, uniformly from the other classes' test examples,
    with their true labels (DisTrans's ``cifar10_client_test``; that code draws the
    negatives with replacement). Different clients' negatives may overlap.
    """
    c = fed.num_classes
    k = params.clients if params.clients is not None else c
    pool = _pool(fed)
    _check_labels(pool, c, "one-class")
    cls = np.arange(k) % c
    shares = np.zeros((k, c))
    shares[np.arange(k), cls] = 1.0
    index = _deal_all(pool, shares, params.seed, "one-class")
    y_test = pool.test.y.numpy()
    rng = seeded_rng(params.seed, "one-class/negatives")
    tests = []
    for i in range(k):
        pos = index["test"][i]
        others = np.flatnonzero(y_test != cls[i])
        want = int(round(params.negatives * len(pos)))
        if want > len(others):
            raise DataError(
                f"partition 'one-class': client{i:02d} needs {want} test negatives but the "
                f"pooled test split has only {len(others)} examples of other classes; lower "
                f"partition.negatives"
            )
        neg = rng.choice(others, size=want, replace=False)
        tests.append(rng.permutation(np.concatenate([pos, neg])))
    index["test"] = tests
    info = {
        "client_classes": [[int(x)] for x in cls],
        "unused_classes": sorted(set(range(c)) - {int(x) for x in cls}),
    }
    return _build(fed, pool, index, "one-class", info)


PARTITIONS.add("none", keep, None, "keep the dataset's own clients (domains)")
PARTITIONS.add("iid", iid, IIDParams, "pooled data split i.i.d. (stratified) across clients")
PARTITIONS.add(
    "classes", classes, ClassesParams, "u classes per client, shares ~ U(low, high) (pFedHN)"
)
PARTITIONS.add("dirichlet", dirichlet, DirichletParams, "per-class client shares ~ Dir(alpha)")
PARTITIONS.add("one-class", one_class, OneClassParams, "one class per client; test adds negatives")
PARTITIONS.add(
    "domains",
    domains,
    DomainsParams,
    "clients drawn from the dataset's domains: lam 0 one domain each, 1 equal shares (Bai et al.)",
)
#: partitions that deal out examples without reading their labels (any task)
LABEL_FREE = LABEL_FREE_PARTITIONS


def dealt_client_names(params: object) -> list[str] | None:
    """The clients a partition deals to, known before any data is loaded: ``clients`` of
    them, named by :func:`~fedshift.data.common.sites.numbered_clients`; None when its
    ``clients`` key leaves the count to the data (``one-class``'s default: one per class) or
    it has none (``none``)."""
    k = getattr(params, "clients", None)
    return numbered_clients(k) if isinstance(k, int) else None


def apply_partition(fed: Federation, section: Component | dict) -> Federation:
    """Apply the resolved ``partition`` component (or a plain ``{name: ..., **params}``
    section, validated first) to a loaded federation.

    Returns a new federation (the input's ``info`` is not changed) whose ``info`` has
    ``dh``, ``label_counts`` and ``partition``.
    """
    part = PARTITIONS.component(section, "partition")
    if fed.task != "classification":
        if part.name not in LABEL_FREE:
            raise ConfigError(
                f"config key 'partition.name': {part.name!r} deals out images by class, "
                f"which the {fed.task} dataset {fed.name!r} does not have; use "
                f"{' or '.join(LABEL_FREE)}"
            )
        out = part.factory(fed, part.params)
        return dataclasses.replace(out, info={**out.info, "partition": part.to_dict()})
    out = part.factory(fed, part.params)
    counts = label_counts(out)
    info = dict(out.info)
    info["dh"] = degree_of_heterogeneity(torch.tensor(counts, dtype=torch.float64))
    info["tv_heterogeneity"] = tv_heterogeneity(torch.tensor(counts, dtype=torch.float64))
    info["label_counts"] = counts
    info["partition"] = part.to_dict()
    return dataclasses.replace(out, info=info)
