"""Label-skew partitions (iid, classes, dirichlet, one-class) and DisTrans's DH metric."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from fedshift.catalog import resolve
from fedshift.core.config import load_config
from fedshift.core.errors import ConfigError, DataError
from fedshift.core.federation import ClientData, Federation, Split
from fedshift.data.domains.toy import ToyParams, load_toy
from fedshift.data.partition import (
    apply_partition,
    deal,
    deal_counts,
    degree_of_heterogeneity,
    tv_heterogeneity,
)
from fedshift.runtime.simulation import run_experiment

# ------------------------------------------------------------------------------ helpers


def make_fed(num_classes: int, per_class: dict[str, int], sources: int = 2) -> Federation:
    """A synthetic federation whose every example carries a unique id as its only pixel.

    ``per_class[split]`` examples of every class in each split, dealt in turn over
    ``sources`` original clients (so pooling is exercised).
    """
    splits: dict[str, list[Split]] = {}
    first = 0
    for split in ("train", "val", "test"):
        n = per_class[split] * num_classes
        y = torch.arange(n) % num_classes
        uid = torch.arange(first, first + n, dtype=torch.float64)
        first += n
        splits[split] = [
            Split(uid[s::sources].view(-1, 1, 1, 1), y[s::sources]) for s in range(sources)
        ]
    clients = [
        ClientData(f"src{s}", *(splits[k][s] for k in ("train", "val", "test")))
        for s in range(sources)
    ]
    classes = [str(c) for c in range(num_classes)]
    return Federation("synthetic", clients, classes, (1, 1, 1), {"origin": "test"})


def ids(split: Split) -> np.ndarray:
    return split.x.view(-1).numpy().astype(np.int64)


def pooled_labels(fed: Federation, split: str) -> dict[int, int]:
    pool = fed.pooled().split(split)
    return dict(zip(ids(pool).tolist(), pool.y.tolist(), strict=True))


def shares_of(out: Federation, num_classes: int, split: str = "train") -> np.ndarray:
    """(clients x classes) realised fraction of each class each client got."""
    counts = np.array(
        [np.bincount(c.split(split).y.numpy(), minlength=num_classes) for c in out.clients],
        dtype=np.float64,
    )
    return counts / counts.sum(axis=0, keepdims=True)


# ------------------------------------------------------------------------------ DH


def test_dh_is_eq3_4_on_hand_made_partitions():
    # DisTrans Eq. 3-4: DH = 1 - sum_j c_j / (N x C), c_j = 0 if one client holds class j,
    # else the number k > 1 of clients holding it.
    iid = torch.tensor([[5.0, 3.0, 2.0], [10.0, 6.0, 4.0], [0.5, 0.3, 0.2]])
    assert degree_of_heterogeneity(iid) == pytest.approx(0.0)  # c_j = 3 for all, 9 / 9
    one_class = torch.eye(4) * torch.tensor([7.0, 1.0, 3.0, 9.0])[:, None]
    assert degree_of_heterogeneity(one_class) == pytest.approx(100.0)  # all c_j = 0
    # mixed: N = 3 classes, C = 3 clients; class 0 on clients a,b (c=2), class 1 on a,b,c
    # (c=3), class 2 only on c (c=0) -> DH = 1 - 5/9
    mixed = torch.tensor([[4, 1, 0], [1, 9, 0], [0, 2, 6]])
    assert degree_of_heterogeneity(mixed) == pytest.approx(100.0 * (1 - 5 / 9))
    # amounts do not matter, only who holds a class (the old TV measure gave 50 here)
    assert degree_of_heterogeneity(torch.tensor([[2, 0], [1, 1]])) == pytest.approx(50.0)
    assert degree_of_heterogeneity(torch.tensor([[100, 1], [1, 100]])) == pytest.approx(0.0)
    # the example: u = 3 of 10 classes on 5 clients, every class on >= 2 clients
    u3 = torch.zeros(5, 10)
    for i in range(5):
        for j in range(3):
            u3[i, (2 * i + j) % 10] = 1.0
    k = (u3 > 0).sum(0)
    assert degree_of_heterogeneity(u3) == pytest.approx(100 * (1 - k[k > 1].sum().item() / 50))
    # an empty client is left out
    assert degree_of_heterogeneity(torch.tensor([[1, 1, 0], [0, 1, 1], [0, 0, 0]])) == (
        pytest.approx(100.0 * (1 - 2 / 6))
    )


def test_tv_heterogeneity_keeps_the_old_measure_under_its_own_name():
    assert tv_heterogeneity(torch.tensor([[2, 0], [1, 1]])) == pytest.approx(50.0)
    three = torch.tensor([[1.0, 0.0], [0.0, 1.0], [4.0, 0.0]])
    assert tv_heterogeneity(three) == pytest.approx(200.0 / 3.0)
    assert tv_heterogeneity(torch.tensor([[3.0, 1.0]])) == 0.0


def test_dh_monotone_in_classes_per_client():
    fed = load_toy(ToyParams(clients=2, train_size=300, val_size=50, test_size=50))
    dh = [
        apply_partition(fed, {"name": "classes", "clients": 10, "classes_per_client": u}).info["dh"]
        for u in range(1, 11)
    ]
    assert dh[0] == pytest.approx(100.0)
    assert all(a > b for a, b in zip(dh, dh[1:], strict=False)), dh
    assert dh[-1] < 15.0
    assert apply_partition(fed, {"name": "iid", "clients": 10}).info["dh"] < 1.0
    assert apply_partition(fed, {"name": "one-class"}).info["dh"] == pytest.approx(100.0)


def test_info_records_dh_counts_and_partition_without_touching_the_input():
    fed = load_toy(ToyParams(clients=3, classes=4, train_size=8, val_size=4, test_size=4))
    out = apply_partition(fed, {"name": "none"})
    assert out.client_names == fed.client_names
    assert out.info["dh"] == pytest.approx(0.0)
    assert out.info["label_counts"] == [[2, 2, 2, 2]] * 3
    assert out.info["partition"] == {"name": "none"}
    assert "dh" not in fed.info
    sec = {"name": "classes", "clients": 4, "classes_per_client": 1, "seed": 3}
    out = apply_partition(fed, sec)
    assert out.info["partition"] == {**sec, "low": 0.4, "high": 0.6}
    assert out.info["synthetic"] is True  # the dataset's own info is kept
    counts = np.array(out.info["label_counts"])
    assert counts.shape == (4, 4) and counts.sum() == 24
    assert out.info["dh"] == pytest.approx(degree_of_heterogeneity(torch.tensor(counts)))


# ------------------------------------------------------------------------------ dealing


def test_deal_counts_rounds_cumulative_shares_and_loses_nothing():
    shares = np.array([[1.0, 0.0, 0.2], [1.0, 0.0, 0.3], [2.0, 0.0, 0.5]])
    counts = deal_counts(shares, np.array([10, 7, 3]))
    # class 0, clients cut in order 0, 1, 2: at round(2.5)=2, round(5)=5, 10;
    # class 1: held by nobody; class 2, order 2, 0, 1: at round(1.5)=2, round(2.1)=2, 3
    assert counts.tolist() == [[2, 0, 0], [3, 0, 1], [5, 0, 2]]
    rng = np.random.default_rng(0)
    y = np.array([0] * 10 + [1] * 7 + [2] * 3)
    parts = deal(y, shares, rng)
    assert [len(p) for p in parts] == counts.sum(axis=1).tolist()
    assert all((np.bincount(y[p], minlength=3) == counts[i]).all() for i, p in enumerate(parts))
    assert len(np.unique(np.concatenate(parts))) == 10 + 3


@pytest.mark.parametrize(
    "section",
    [
        {"name": "iid", "clients": 7},
        {"name": "classes", "clients": 10, "classes_per_client": 3},
        {"name": "classes", "clients": 6, "classes_per_client": 5},
        {"name": "dirichlet", "clients": 8, "alpha": 0.3, "min_size": 5},
    ],
)
def test_every_pooled_example_goes_to_exactly_one_client(section):
    fed = make_fed(10, {"train": 40, "val": 12, "test": 12})
    out = apply_partition(fed, section)
    assert out.client_names == [f"client{i:02d}" for i in range(section["clients"])]
    for split in ("train", "val", "test"):
        truth = pooled_labels(fed, split)
        got = np.concatenate([ids(c.split(split)) for c in out.clients])
        assert sorted(got.tolist()) == sorted(truth)  # none lost, none twice
        for c in out.clients:  # labels travel with their images
            s = c.split(split)
            assert [truth[i] for i in ids(s).tolist()] == s.y.tolist()


def test_same_class_proportions_in_every_split():
    fed = make_fed(10, {"train": 400, "val": 100, "test": 200})
    out = apply_partition(fed, {"name": "classes", "clients": 10, "classes_per_client": 3})
    train = shares_of(out, 10, "train")
    for split in ("val", "test"):
        other = shares_of(out, 10, split)
        assert ((train > 0) == (other > 0)).all()
        assert np.abs(train - other).max() < 0.02
    held = [sorted(np.flatnonzero(row).tolist()) for row in train]
    assert held == out.info["client_classes"]
    assert all(len(h) == 3 for h in held)
    holders = (train > 0).sum(axis=0)
    assert holders.tolist() == [3] * 10  # every class held by the same number of clients


def test_classes_shares_follow_uniform_low_high():
    # 100 classes x 100 clients x u=2: every class has exactly two holders
    fed = make_fed(100, {"train": 1000, "val": 4, "test": 4}, sources=1)
    out = apply_partition(fed, {"name": "classes", "clients": 100, "classes_per_client": 2})
    shares = shares_of(out, 100)
    assert ((shares > 0).sum(axis=0) == 2).all()
    pair = shares.T[shares.T > 0].reshape(100, 2)  # per class: (lower client, higher client)
    # U1/(U1+U2) with U ~ U(0.4, 0.6) lies in [0.4, 0.6], sd 0.041; E[max/sum] = 0.5335
    assert pair.min() >= 0.4 - 1e-3 and pair.max() <= 0.6 + 1e-3
    assert 0.030 < pair[:, 0].std() < 0.052
    assert 0.52 < pair.max(axis=1).mean() < 0.547
    wide = apply_partition(
        fed,
        {"name": "classes", "clients": 100, "classes_per_client": 2, "low": 0.1, "high": 0.9},
    )
    wide_shares = shares_of(wide, 100)
    assert wide_shares[wide_shares > 0].min() < 0.3  # the range follows low/high


def test_dirichlet_shares_match_the_dirichlet_moments():
    k, c, alpha = 5, 100, 0.5
    fed = make_fed(c, {"train": 500, "val": 5, "test": 5}, sources=1)
    out = apply_partition(fed, {"name": "dirichlet", "clients": k, "alpha": alpha, "min_size": 0})
    shares = shares_of(out, c)  # each entry ~ Beta(alpha, (k-1) alpha)
    var = (1 / k) * (1 - 1 / k) / (k * alpha + 1)  # 0.0457
    assert 0.035 < shares.var() < 0.057, (shares.var(), var)
    assert np.abs(shares.mean(axis=1) - 1 / k).max() < 0.08
    flat = apply_partition(fed, {"name": "dirichlet", "clients": k, "alpha": 50.0, "min_size": 0})
    assert shares_of(flat, c).var() < 0.005  # alpha controls the spread


def test_dirichlet_min_size_is_met_or_fails_clearly():
    fed = make_fed(10, {"train": 30, "val": 10, "test": 10})
    out = apply_partition(fed, {"name": "dirichlet", "clients": 5, "alpha": 0.2, "min_size": 20})
    assert min(len(c.train) for c in out.clients) >= 20
    assert out.info["dirichlet_draws"] >= 1
    with pytest.raises(DataError, match="partition.min_size"):
        apply_partition(fed, {"name": "dirichlet", "clients": 5, "min_size": 61})


def test_one_class_tests_are_half_positives_half_true_negatives():
    fed = make_fed(10, {"train": 20, "val": 6, "test": 30})
    out = apply_partition(fed, {"name": "one-class"})
    assert len(out.clients) == 10 and out.info["dh"] == pytest.approx(100.0)
    truth = pooled_labels(fed, "test")
    for k, c in enumerate(out.clients):
        assert set(c.train.y.tolist()) == {k} and set(c.val.y.tolist()) == {k}
        assert len(c.train) == 20 and len(c.val) == 6
        y = c.test.y
        assert (y == k).sum() == 30 and (y != k).sum() == 30
        assert [truth[i] for i in ids(c.test).tolist()] == y.tolist()  # true labels
        assert len(set(ids(c.test).tolist())) == 60
    half = apply_partition(fed, {"name": "one-class", "clients": 3, "negatives": 0.5})
    assert [(c.test.y != k).sum().item() for k, c in enumerate(half.clients)] == [15] * 3
    assert half.info["unused_classes"] == list(range(3, 10))


def test_one_class_with_more_clients_than_classes_splits_each_class():
    fed = make_fed(4, {"train": 10, "val": 4, "test": 6})
    out = apply_partition(fed, {"name": "one-class", "clients": 8})
    for k, c in enumerate(out.clients):
        assert set(c.train.y.tolist()) == {k % 4}
        assert len(c.train) == 5 and len(c.val) == 2
        assert (c.test.y == k % 4).sum() == 3 and (c.test.y != k % 4).sum() == 3
    for k in range(4):  # the two holders of class k share its examples disjointly
        a, b = ids(out.clients[k].train), ids(out.clients[k + 4].train)
        assert not set(a.tolist()) & set(b.tolist())


def test_same_seed_same_partition_other_seed_differs():
    fed = make_fed(10, {"train": 30, "val": 10, "test": 10})
    for name in ("iid", "classes", "dirichlet", "one-class"):
        extra = {"min_size": 2} if name == "dirichlet" else {}

        def snapshot(seed, name=name, extra=extra):
            out = apply_partition(fed, {"name": name, "seed": seed, **extra})
            return [ids(c.split(s)).tolist() for c in out.clients for s in ("train", "test")]

        assert snapshot(0) == snapshot(0), name
        assert snapshot(0) != snapshot(1), name


def test_errors_name_the_key():
    fed = make_fed(10, {"train": 10, "val": 2, "test": 2})
    with pytest.raises(ConfigError, match="partition.classes_per_client"):
        apply_partition(fed, {"name": "classes", "classes_per_client": 11})
    with pytest.raises(ConfigError, match="partition.low"):
        apply_partition(fed, {"name": "classes", "low": 0.0})
    with pytest.raises(ConfigError, match="partition.high"):
        apply_partition(fed, {"name": "classes", "low": 0.5, "high": 0.4})
    with pytest.raises(ConfigError, match="partition.alpha"):
        apply_partition(fed, {"name": "dirichlet", "alpha": 0})
    with pytest.raises(ConfigError, match="unknown config key 'partition.u'"):
        apply_partition(fed, {"name": "classes", "u": 2})
    with pytest.raises(ConfigError, match="partition.clients"):
        resolve(load_config(None, ["partition.name=iid", "partition.clients=0"]))
    with pytest.raises(ConfigError, match="partition.seed"):
        resolve(load_config(None, ["partition.name=none", "partition.seed=1"]))
    # 20 pooled val examples cannot give 30 clients one each
    with pytest.raises(DataError, match="no val examples"):
        apply_partition(fed, {"name": "iid", "clients": 30})
    with pytest.raises(DataError, match="partition.negatives"):
        apply_partition(fed, {"name": "one-class", "negatives": 10.0})


def test_classes_partition_end_to_end(make_cfg, tmp_path):
    cfg = make_cfg("partition.name=classes", "partition.clients=4", rounds=1)
    result = run_experiment(cfg, run_dir=tmp_path / "run", progress=False)
    summary = json.loads((tmp_path / "run/summary.json").read_text())
    assert summary["clients"] == ["client00", "client01", "client02", "client03"]
    assert summary["dh"] == pytest.approx(100.0)  # 4 x 2 classes of 10: no class shared
    assert summary["partition"]["name"] == "classes"
    assert set(summary["test_per_client"]) == set(summary["clients"])
    assert result.summary["dh"] == summary["dh"]
