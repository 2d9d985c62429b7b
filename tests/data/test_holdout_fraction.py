"""Engine support for the generalisation protocols: held-out clients (leave-one-client-out)
and the local-data fraction."""

from __future__ import annotations

import json

import pytest
import torch

from fedshift.core.errors import ConfigError
from fedshift.data import load_dataset
from fedshift.runtime.simulation import Simulation, run_experiment


def test_holdout_client_never_trains_and_is_reported_as_target(make_cfg, tmp_path):
    cfg = make_cfg("algorithm.name=fedrdn", "federation.holdout=[client1]", rounds=2)
    res = run_experiment(cfg, run_dir=tmp_path / "h", progress=False)
    s = res.summary
    ledger = json.loads((tmp_path / "h/ledger.json").read_text())
    assert s["holdout"] == ["client1"]
    # it uploads nothing (no statistics in round 0, no weights), but receives the setup
    rows = [json.loads(line) for line in (tmp_path / "h/metrics.jsonl").read_text().splitlines()]
    best = [r for r in rows if r["round"] == s["best_round"]]
    target = next(r for r in best if r["client"] == "client1")
    assert target["holdout"] is True
    assert s["target_test_mean"] == pytest.approx(target["global"]["test_acc"])
    sources = [r for r in best if not r.get("holdout")]
    assert s["val_mean"] == pytest.approx(
        sum(r["global"]["val_acc"] for r in sources) / len(sources)
    )
    assert s["test_per_client"]["client1"] == target["global"]["test_acc"]
    assert "train_loss" not in target
    sim = Simulation(cfg, tmp_path / "again", progress=False)
    assert "client1" not in sim.train_clients and "client1" in sim.states
    assert ledger["total"]["up"] > 0


def test_holdout_uploads_nothing(make_cfg, tmp_path):
    cfg = make_cfg("algorithm.name=fedrdn", "federation.holdout=[client2]", rounds=1)
    sim = Simulation(cfg, tmp_path / "r", progress=False)
    sim.run()
    ups = {client for _, client, d, _, _ in sim.ledger.rows if d == "up"}
    downs = {client for _, client, d, _, _ in sim.ledger.rows if d == "down"}
    assert "client2" not in ups and "client2" in downs  # it receives FedRDN's statistics


@pytest.mark.parametrize(
    "over, match",
    [
        (["algorithm.name=local", "federation.holdout=[client1]"], "one global model"),
        (["algorithm.name=pfedme", "federation.holdout=[client1]"], "protocol new-site"),
        (["federation.holdout=[nobody]"], r"nobody'\] must name"),
        # a site's own spelling is answered with its client name
        (["federation.holdout=[Client1]"], "'Client1' is client 'client1'"),
        (["federation.holdout=[client0,client1,client2]"], "not all"),
    ],
)
def test_holdout_errors(make_cfg, tmp_path, over, match):
    with pytest.raises(ConfigError, match=match):
        Simulation(make_cfg(*over), tmp_path / "x", progress=False)


@pytest.mark.parametrize("algo", ["fedbn", "distrans"])
def test_holdout_with_client_local_tensors_trains_and_leaves_the_site_unscored(
    make_cfg, tmp_path, algo
):
    """FedBN / DisTrans keep client-local tensors; a held-out site has none of its own, so the
    run trains the sources, scores only them and says nothing of the site
    (``fedshift protocol new-site`` answers for it); the summary is valid and tabulates."""
    from fedshift.eval.summary import check_summary
    from fedshift.eval.tables import runs_table

    cfg = make_cfg(f"algorithm.name={algo}", "federation.holdout=[client1]", rounds=1)
    s = run_experiment(cfg, run_dir=tmp_path / "h", progress=False).summary
    assert s["holdout"] == ["client1"] and s["target_test_mean"] is None
    assert set(s["test_per_client"]) == {"client0", "client2"}
    check_summary(s, tmp_path / "h/summary.json")
    assert "| —" in runs_table([s])


def test_data_fraction_keeps_a_stratified_share_of_train_only():
    fed = load_dataset({"name": "toyshift", "train_size": 60, "classes": 3})
    half = fed.with_train_fraction(0.5)
    for a, b in zip(fed.clients, half.clients, strict=True):
        assert len(b.train) == 30
        assert torch.bincount(b.train.y).tolist() == [10, 10, 10]
        assert b.val is a.val and b.test is a.test
        # a subset of the original training images
        assert all((a.train.x == x).flatten(1).all(1).any() for x in b.train.x[:5])
    again = fed.with_train_fraction(0.5)
    assert torch.equal(again.clients[0].train.x, half.clients[0].train.x)
    assert fed.with_train_fraction(1.0) is fed


def test_data_fraction_config(make_cfg, tmp_path):
    with pytest.raises(ConfigError, match="data_fraction"):
        make_cfg("federation.data_fraction=0")
    sim = Simulation(make_cfg("federation.data_fraction=0.5"), tmp_path / "f", progress=False)
    assert len(sim.train_clients["client0"].train) == 30  # 3 of 6 per class
