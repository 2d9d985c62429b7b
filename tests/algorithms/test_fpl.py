"""FPL (Huang et al., CVPR 2023): FINCH, the CPCL and UPCR terms by hand, the server's
cluster prototypes and the local prototypes of the last epoch."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fedshift.algorithms.fpl import (
    CLUSTERS,
    FPL,
    FPLParams,
    cluster_prototypes,
    cpcl_loss,
    finch,
    first_neighbour_partition,
    unbiased_prototypes,
)
from fedshift.core.config import FederationConfig, TrainConfig
from fedshift.core.context import ClientContext
from fedshift.core.errors import ConfigError
from fedshift.core.payload import Payload
from fedshift.models.base import FedModel
from fedshift.runtime.simulation import Simulation, run_experiment


class Linear(FedModel):
    """No stages: z = flatten(x), logits = W z + b."""

    def __init__(self, inputs: int = 2, classes: int = 3) -> None:
        super().__init__()
        self.stages = nn.ModuleDict()
        self.embed = nn.Identity()
        self.classifier = nn.Linear(inputs, classes)


def on_circle(degrees: list[float]) -> np.ndarray:
    rad = np.deg2rad(degrees)
    return np.stack([np.cos(rad), np.sin(rad)], 1)


def test_first_neighbour_partition_two_clear_clusters():
    # rows 0-2 point near 0 degrees, rows 3-5 near 90: every first neighbour (cosine) is
    # inside its own group (0->1 (tie with 2, lowest index), 1->0, 2->0, 3->4, 4->3, 5->3)
    pts = on_circle([0, 3, -3, 90, 93, 87])
    labels = first_neighbour_partition(pts)
    assert labels.tolist() == [0, 0, 0, 1, 1, 1]
    # the next level (two means, each other's first neighbour) would be one cluster: dropped
    parts = finch(pts)
    assert len(parts) == 1 and parts[0].tolist() == [0, 0, 0, 1, 1, 1]


def test_finch_recurses_on_cluster_means():
    # angles 0,2 | 20,22 | 90,92 | 110,112: level 0 pairs them (4 clusters); their means
    # 1, 21, 91, 111 pair as (1, 21) and (91, 111) (first neighbours 20 degrees apart, the
    # other group 70 or more away): 2 clusters; the means 11 and 101 would merge into one,
    # so that level is dropped and the coarsest partition has 2 clusters
    pts = on_circle([0, 2, 20, 22, 90, 92, 110, 112])
    parts = finch(pts)
    assert [int(p.max()) + 1 for p in parts] == [4, 2]
    assert parts[0].tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    assert parts[1].tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    protos = torch.tensor(pts, dtype=torch.float32)
    coarse = cluster_prototypes(protos, "coarsest")
    assert torch.allclose(coarse, torch.stack([protos[:4].mean(0), protos[4:].mean(0)]))
    assert cluster_prototypes(protos, "first").shape == (4, 2)
    one = protos[:1]
    assert torch.equal(cluster_prototypes(one), one)


def test_cpcl_by_hand_multiple_positives_inside_the_log():
    # z = (1, 0) of class 0; cluster prototypes (1,0) and (0,1) of class 0, (-1,0) of class 1:
    # cosines 1, 0, -1; tau = 0.5 -> logits 2, 0, -2:
    # L = -log((e^2 + e^0) / (e^2 + e^0 + e^-2)). A second example, of class 2 (no
    # prototypes), adds 0 but counts in the batch size 2.
    z = torch.tensor([[1.0, 0.0], [0.0, 3.0]])
    y = torch.tensor([0, 2])
    protos = torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]])
    labels = torch.tensor([0, 0, 1])
    e = math.exp
    expected = -math.log((e(2) + 1) / (e(2) + 1 + e(-2))) / 2
    got = cpcl_loss(z, y, protos, labels, tau=0.5)
    assert got.item() == pytest.approx(expected, rel=1e-6)
    # the example without prototypes has a finite (zero) gradient
    zz = z.clone().requires_grad_(True)
    cpcl_loss(zz, y, protos, labels, tau=0.5).backward()
    assert torch.isfinite(zz.grad).all() and torch.equal(zz.grad[1], torch.zeros(2))


def test_unbiased_prototype_is_the_plain_mean_of_cluster_prototypes():
    protos = torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]])
    labels = torch.tensor([0, 0, 1])
    u, mask = unbiased_prototypes(protos, labels, 3)
    assert torch.allclose(u[:2], torch.tensor([[0.5, 0.5], [-1.0, 0.0]]))
    assert mask.tolist() == [True, True, False]


def _ctx(model: FedModel) -> ClientContext:
    g = torch.Generator().manual_seed(0)
    return ClientContext("c", 1, None, model, TrainConfig(), None, g, torch.device("cpu"))


def test_local_objective_is_ce_plus_cpcl_plus_upcr_by_hand():
    torch.manual_seed(0)
    model = Linear()
    algo = FPL(FPLParams(tau=0.5), TrainConfig(), FederationConfig(), model, 2)
    x = torch.tensor([[1.0, 0.0], [0.0, 3.0]]).view(2, 1, 1, 2)
    y = torch.tensor([0, 2])
    protos = torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]])
    labels = torch.tensor([0, 0, 1])
    ctx = _ctx(model)
    ce = F.cross_entropy(model(x), y)
    assert torch.isclose(algo.loss(ctx, x, y), ce)  # round 1: no prototypes
    ctx.scratch[CLUSTERS] = (protos, labels, *unbiased_prototypes(protos, labels, 3))
    e = math.exp
    cpcl = -math.log((e(2) + 1) / (e(2) + 1 + e(-2))) / 2
    # UPCR: z = (1, 0), unbiased prototype of class 0 = (0.5, 0.5): ||.||^2 / d = 0.5 / 2,
    # over the batch of 2 (class 2 has no prototype): 0.125
    upcr = 0.125
    got = algo.loss(ctx, x, y)
    assert got.item() == pytest.approx(ce.item() + cpcl + upcr, rel=1e-5)
    algo.params.lam_cpcl, algo.params.lam_upcr = 0.0, 2.0
    assert algo.loss(ctx, x, y).item() == pytest.approx(ce.item() + 2 * upcr, rel=1e-5)


def _reply(protos: list[list[float]], counts: list[float], weights: dict, n: int) -> Payload:
    return Payload(
        {
            "prototypes": {"protos": torch.tensor(protos), "counts": torch.tensor(counts)},
            "weights": weights,
        },
        num_examples=n,
    )


def test_server_clusters_each_class_and_averages_weights_by_samples(make_cfg, tmp_path):
    sim = Simulation(make_cfg("algorithm.name=fpl", rounds=1), tmp_path / "s")
    algo, server = sim.algo.algo, sim.server
    assert set(algo.broadcast(server, 1, "client0").records) == {"weights"}
    key = algo.shared_param_keys[0]
    w = server["weights"][key]
    zero, one = torch.zeros_like(w), torch.ones_like(w)
    # class 0: clients 0 and 1 point one way, 2 and 3 another (first neighbours by hand:
    # 0<->1, 2<->3: two clusters; their two means would merge, so that level is dropped);
    # class 1 is held by client 3 only; class 2 by nobody
    replies = [
        ("client0", _reply([[1, 0], [0, 0], [0, 0]], [5, 0, 0], {key: zero}, 10)),
        ("client1", _reply([[1, 0.1], [0, 0], [0, 0]], [5, 0, 0], {key: one}, 30)),
        ("client2", _reply([[0, 1], [0, 0], [0, 0]], [5, 0, 0], {key: one}, 20)),
        ("client3", _reply([[0.1, 1], [3, 3], [0, 0]], [5, 2, 0], {key: one}, 40)),
    ]
    algo.aggregate(server, 1, replies)
    assert torch.allclose(server["weights"][key], torch.full_like(w, 90 / 100))
    cl = server["clusters"]
    assert cl["labels"].tolist() == [0, 0, 1]
    expected = torch.tensor([[1.0, 0.05], [0.05, 1.0], [3.0, 3.0]])
    assert torch.allclose(cl["protos"], expected)
    down = algo.broadcast(server, 2, "client0")
    assert set(down.records) == {"weights", "cluster_protos"}


def test_local_prototypes_come_from_the_last_local_epoch(make_cfg, tmp_path):
    cfg = make_cfg("algorithm.name=fpl", "train.local_epochs=2", rounds=1)
    sim = Simulation(cfg, tmp_path / "p")
    up = sim.client_round(1, "client0")
    assert set(up.records) == {"prototypes", "weights"}
    y = sim.train_clients["client0"].train.y
    # two epochs of 60 examples, only the last one counted
    assert torch.equal(up["prototypes"]["counts"], torch.bincount(y, minlength=10).float())
    assert up["prototypes"]["protos"].shape == (10, sim.model.classifier.in_features)


def test_fpl_without_its_terms_is_fedavg_and_options(make_cfg, tmp_path):
    def run(name, *over):
        cfg = make_cfg("model.name=cnn", *over, rounds=2)
        return run_experiment(cfg, run_dir=tmp_path / name, progress=False).summary

    s = run("f", "algorithm.name=fpl")
    assert s["evaluated_model"] == "global"
    assert set(s["bytes_by_record"]["up"]) == {"prototypes", "weights"}
    assert s["bytes_by_record"]["up"]["prototypes"] == 3 * 2 * (10 * 128 * 4 + 10 * 4)
    assert "cluster_protos" in s["bytes_by_record"]["down"]
    off = run("o", "algorithm.name=fpl", "algorithm.lam_cpcl=0", "algorithm.lam_upcr=0")
    avg = run("a", "algorithm.name=fedavg")
    assert off["test_per_client"] == avg["test_per_client"]
    assert s["test_per_client"] != avg["test_per_client"] or s["val_mean"] != avg["val_mean"]
    with pytest.raises(ConfigError, match="algorithm.tau"):
        make_cfg("algorithm.name=fpl", "algorithm.tau=0")
    with pytest.raises(ConfigError, match="'fpl' needs each example's integer class"):
        make_cfg("algorithm.name=fpl", "augment=[fedmix]")


def test_first_neighbour_partition_matches_the_adjacency_formula():
    # FINCH's Eq. 1 as a matrix: A = (K + I)(K + I)^T with K the first-neighbour matrix;
    # clusters = connected components of A (an independent computation with scipy)
    from scipy.sparse.csgraph import connected_components

    rng = np.random.default_rng(0)
    pts = rng.normal(size=(40, 5))
    unit = pts / np.linalg.norm(pts, axis=1, keepdims=True)
    dist = 1 - unit @ unit.T
    np.fill_diagonal(dist, np.inf)
    k = np.zeros((40, 40))
    k[np.arange(40), dist.argmin(1)] = 1
    adj = (k + np.eye(40)) @ (k + np.eye(40)).T
    n, ref = connected_components(adj > 0, directed=False)
    got = first_neighbour_partition(pts)
    assert int(got.max()) + 1 == n
    # the same partition (labels may be numbered differently)
    assert len({(a, b) for a, b in zip(got, ref, strict=True)}) == n
