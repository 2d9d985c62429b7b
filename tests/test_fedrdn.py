"""FedRDN, FedRDN-V and conventional normalisation (Eq. 5-9), and their place in the protocol."""

from __future__ import annotations

import pytest
import torch

from fedshift.augment.fedrdn import FedRDN, FedRDNParams, FedRDNV, Norm, channel_statistics
from fedshift.data.base import ClientData, Split
from fedshift.engine.payload import Payload
from fedshift.engine.simulation import run_experiment
from fedshift.errors import ConfigError


def test_channel_statistics_by_hand():
    # two 1-channel 2x2 images: [0, 0, 2, 2] (mean 1, std 1) and [1, 3, 1, 3] (mean 2, std 1)
    x = torch.tensor([[[[0.0, 0.0], [2.0, 2.0]]], [[[1.0, 3.0], [1.0, 3.0]]]])
    mean, std = channel_statistics(x)
    assert torch.allclose(mean, torch.tensor([1.5])) and torch.allclose(std, torch.tensor([1.0]))
    # per-image std averaged (Eq. 6), not the std of the pooled pixels (which is 1.118)
    assert not torch.allclose(std, x.flatten().std(unbiased=False).reshape(1))


def _client(x):
    y = torch.zeros(x.shape[0], dtype=torch.long)
    return ClientData("c", Split(x, y), Split(x, y), Split(x, y))


def _fedrdn_with_bank(draw="paper"):
    aug = FedRDN(FedRDNParams(draw=draw), 0, 10)
    state = {"mean": torch.tensor([0.5]), "std": torch.tensor([0.25])}
    bank = {"mean": torch.tensor([[0.0], [1.0], [2.0]]), "std": torch.tensor([[1.0], [2.0], [4.0]])}
    aug.receive(Payload({"fedrdn_bank": bank}), state, 0)
    return aug, state, bank


def test_train_draws_a_client_pair_per_image():
    aug, state, bank = _fedrdn_with_bank()
    x = torch.full((64, 1, 2, 2), 3.0)
    g = torch.Generator().manual_seed(0)
    out, _ = aug.train_batch(x, torch.zeros(64), state, g)
    values = out[:, 0, 0, 0]
    # each image is (3 - mu_j) / sigma_j for some client j: 3, 1, 0.25
    assert set(values.tolist()) <= {3.0, 1.0, 0.25}
    assert len(set(values.tolist())) == 3  # per image, not one pair for the batch
    j = torch.randint(3, (64,), generator=torch.Generator().manual_seed(0))
    expected = (3.0 - bank["mean"][j, 0]) / bank["std"][j, 0]
    assert torch.allclose(values, expected)


def test_released_draw_is_per_batch_with_independent_mean_and_std():
    aug, state, bank = _fedrdn_with_bank("released")
    x = torch.full((8, 1, 2, 2), 3.0)
    seen = set()
    for seed in range(40):
        out, _ = aug.train_batch(x, torch.zeros(8), state, torch.Generator().manual_seed(seed))
        assert len(set(out[:, 0, 0, 0].tolist())) == 1  # one draw for the whole batch
        seen.add(round(out[0, 0, 0, 0].item(), 4))
    paired = {3.0, 1.0, 0.25}
    assert seen - paired  # some (mean_i, std_j) with i != j, e.g. (3 - 0) / 2 = 1.5


def test_test_time_uses_own_statistics():
    aug, state, _ = _fedrdn_with_bank()
    x = torch.full((2, 1, 2, 2), 1.0)
    assert torch.allclose(aug.eval_batch(x, state), torch.full_like(x, (1.0 - 0.5) / 0.25))


def test_fedrdn_v_and_norm():
    v = FedRDNV(None, 0, 10)
    server = {}
    replies = [
        ("a", {"fedrdn_stats": {"mean": torch.tensor([0.0]), "std": torch.tensor([1.0])}}),
        ("b", {"fedrdn_stats": {"mean": torch.tensor([2.0]), "std": torch.tensor([3.0])}}),
    ]
    v.setup_aggregate(server, replies)
    down = v.setup_broadcast(server, "a")
    assert torch.allclose(down["fedrdn_avg"]["mean"], torch.tensor([1.0]))
    assert torch.allclose(down["fedrdn_avg"]["std"], torch.tensor([2.0]))
    state = {}
    v.receive(Payload(down), state, 0)
    x = torch.full((1, 1, 2, 2), 5.0)
    assert torch.allclose(v.train_batch(x, None, state, None)[0], torch.full_like(x, 2.0))
    assert torch.allclose(v.eval_batch(x, state), torch.full_like(x, 2.0))
    n = Norm(None, 0, 10)
    st = n.init_client("c", _client(torch.tensor([[[[0.0, 0.0], [2.0, 2.0]]]])), None)
    assert torch.allclose(n.train_batch(x, None, st, None)[0], torch.full_like(x, 4.0))


def test_ledger_statistics_travel_once(make_cfg, tmp_path):
    res = run_experiment(
        make_cfg("algorithm.name=fedrdn", rounds=2), run_dir=tmp_path / "r", progress=False
    )
    import json

    ledger = json.loads((tmp_path / "r/ledger.json").read_text())
    c, k = 3, 3  # channels, clients
    assert ledger["by_record"]["up"]["fedrdn_stats"] == 2 * c * 4 * k  # 2C floats per client
    assert ledger["by_record"]["down"]["fedrdn_bank"] == k * 2 * c * 4 * k
    assert set(ledger["by_round"]["0"]) == {"up", "down"}
    assert ledger["by_round"]["0"]["up"] == 2 * c * 4 * k  # only the statistics in round 0
    assert res.summary["algorithm"] == "fedrdn"


def test_fedrdn_changes_training_and_composes(make_cfg, tmp_path):
    base = run_experiment(
        make_cfg("algorithm.name=fedbn", rounds=1), run_dir=tmp_path / "a", progress=False
    ).summary
    rdn = run_experiment(
        make_cfg("algorithm.name=fedbn", "augment=[fedrdn]", rounds=1),
        run_dir=tmp_path / "b",
        progress=False,
    ).summary
    assert rdn["val_per_client"] != base["val_per_client"]
    assert "fedrdn_stats" in rdn["bytes_by_record"]["up"]


def test_nonsense_combinations(make_cfg):
    with pytest.raises(ConfigError, match="'fedrdn' shares statistics.*'local'"):
        make_cfg("algorithm.name=local", "augment=[fedrdn]")
    with pytest.raises(ConfigError, match="both normalise"):
        make_cfg("augment=[fedrdn, norm]")
    with pytest.raises(ConfigError, match="unknown augment 'fedrdnn'"):
        make_cfg("augment=[fedrdnn]")
    with pytest.raises(ConfigError, match=r"'augment.draw'.*'paper', 'released'"):
        make_cfg("augment=[{name: fedrdn, draw: batch}]")
