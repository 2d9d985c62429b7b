"""FedRDN, FedRDN-V and conventional normalisation (Eq. 5-9), and their place in the protocol."""

from __future__ import annotations

import pytest
import torch

from fedshift.augment.fedmix import FedMix, FedMixParams, group_means
from fedshift.augment.fedrdn import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    FedRDN,
    FedRDNParams,
    FedRDNV,
    Norm,
    NormParams,
    channel_statistics,
)
from fedshift.core.errors import ConfigError
from fedshift.core.federation import ClientData, Split
from fedshift.core.payload import Payload
from fedshift.data.domains.fedbn_pickles import DomainNetParams, OfficeParams, split_bounds
from fedshift.runtime.simulation import run_experiment


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
    n = Norm(NormParams(stats="client"), 0, 10)
    st = n.init_client("c", _client(torch.tensor([[[[0.0, 0.0], [2.0, 2.0]]]])), None)
    assert torch.allclose(n.train_batch(x, None, st, None)[0], torch.full_like(x, 4.0))


def test_norm_default_uses_fixed_constants_whatever_the_client_statistics():
    """Eq. 4: the "+norm" baseline standardises with fixed constants (the released code's
    ImageNet mean/std), so two clients with very different data get the same transform."""
    n = Norm(NormParams(), 0, 10)
    dark = _client(torch.rand(6, 3, 4, 4, generator=torch.Generator().manual_seed(0)) * 0.1)
    bright = _client(0.9 + 0.1 * torch.rand(6, 3, 4, 4, generator=torch.Generator().manual_seed(1)))
    x = torch.rand(2, 3, 4, 4, generator=torch.Generator().manual_seed(2))
    mean = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
    for c in (dark, bright):
        st = n.init_client("c", c, None)
        assert torch.allclose(n.train_batch(x, None, st, None)[0], (x - mean) / std)
        assert torch.allclose(n.eval_batch(x, st), (x - mean) / std)
    # user constants, one per channel; a channel-count mismatch names the keys
    one = Norm(NormParams(mean=[0.5], std=[0.25]), 0, 10)
    st = one.init_client("c", _client(torch.zeros(2, 1, 2, 2)), None)
    assert torch.allclose(one.eval_batch(torch.ones(1, 1, 2, 2), st), torch.full((1, 1, 2, 2), 2.0))
    with pytest.raises(ConfigError, match="augment.norm.mean"):
        n.init_client("c", _client(torch.zeros(2, 1, 2, 2)), None)


def test_fedmix_shares_means_of_m_images():
    """FedRDN App. A.2: FedMix's means are over batches of 5 images (lam = 0.1)."""
    x = torch.arange(12.0).view(12, 1, 1, 1)
    y = torch.arange(12) % 3
    xbar, ybar = group_means(x, y, 5, 3, torch.Generator().manual_seed(0))
    assert xbar.shape == (2, 1, 1, 1) and ybar.shape == (2, 3)  # floor(12 / 5) means
    # each mean is over 5 distinct images: the same permutation's first 10 entries in 2 groups
    order = torch.randperm(12, generator=torch.Generator().manual_seed(0))[:10].view(2, 5)
    assert torch.allclose(xbar.flatten(), order.float().mean(1))
    assert torch.allclose(ybar * 5, (ybar * 5).round())
    assert torch.allclose(ybar.sum(1), torch.ones(2))
    fm = FedMix(FedMixParams(lam=0.1, m=5), 0, 3)
    st = fm.init_client("c", ClientData("c", *(3 * [Split(x, y)])), None)
    assert st["x"].shape[0] == 2


def test_office_fedrdn_split_is_table6():
    """FedRDN Table 6 (train / val / test per client) from the released pickles' lengths."""
    pickles = {"amazon": (766, 192), "caltech": (898, 225), "dslr": (125, 32), "webcam": (236, 59)}
    table6 = {
        "amazon": (459, 307, 192),
        "caltech": (538, 360, 225),
        "dslr": (75, 50, 32),
        "webcam": (141, 95, 59),
    }
    for d, (n, n_test) in pickles.items():
        b = split_bounds("office-caltech10", "fedrdn", n, 125)
        got = (b["train"][1] - b["train"][0], b["val"][1] - b["val"][0], n_test)
        assert got == table6[d], d
        assert b["train"][1] == b["val"][0] and b["val"][1] == n  # disjoint, whole pickle
    # FedBN's split stays the loader's default and gives other sizes (m = 125)
    assert OfficeParams().split == "fedbn"
    assert split_bounds("office-caltech10", "fedbn", 766, 125)["train"] == (0, 62)
    OfficeParams(root="/x", split="fedrdn").validate()
    with pytest.raises(ConfigError, match="dataset.split.*domainnet"):
        DomainNetParams(root="/x", split="fedrdn").validate()


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
    with pytest.raises(ConfigError, match=r"'augment.fedrdn.draw'.*'paper', 'released'"):
        make_cfg("augment=[{name: fedrdn, draw: batch}]")
    with pytest.raises(ConfigError, match="augment.norm.mean"):
        make_cfg("augment=[{name: norm, mean: [0.5, 0.5], std: [0.5]}]")
    with pytest.raises(ConfigError, match="stats=client.*'central'"):
        make_cfg("algorithm.name=central", "augment=[{name: norm, stats: client}]")
    make_cfg("algorithm.name=central", "augment=[norm]")  # fixed constants: no clients needed
    make_cfg("augment=[{name: norm, mean: [0.5, 0.5, 0.5], std: [0.2, 0.2, 0.2]}]")


def test_flows_table_delta_against_the_same_algorithm_settings():
    """Table 1 compares each flow with the same algorithm at the paper's settings (FedProx mu
    0.001, App. A.2): the Δ of 'mu=0.001 +fedrdn' is taken against 'mu=0.001'."""
    from fedshift.eval.tables import Flow, flow_label, flows_table

    def s(augs, seed, acc):
        return {
            "algorithm": "fedprox",
            "algorithm_config": {"name": "fedprox", "mu": 0.001},
            "augment": [{"name": a} for a in augs],
            "implied": [],
            "seed": seed,
            "test_mean": acc,
            "clients": ["a"],
            "test_per_client": {"a": acc},
        }

    runs = [s([], k, 0.80 + 0.01 * k) for k in range(3)]
    runs += [s(["fedrdn"], k, 0.85 + 0.01 * k + 0.001 * k * k) for k in range(3)]
    assert flow_label(runs[0]) == "mu=0.001" and flow_label(runs[3]) == "mu=0.001 +fedrdn"

    def bases(*variant: str, context: tuple[str, ...] = ()) -> list[str]:
        return Flow("fedprox", context, variant).bases()

    assert bases("mu=0.001", "+fedrdn") == ["mu=0.001", "base"] and bases("+fedrdn") == ["base"]
    assert bases("perturbation=False") == ["base"] and bases("+flip_rotate") == ["base"]
    assert bases("+flip_rotate", "+fedrdn")[0] == "+flip_rotate"  # the Office suites' flows
    # with other keys set apart (train.lr=0.1), Δ compares with the same keys only
    assert bases("+fedrdn", context=("train.lr=0.1",)) == ["train.lr=0.1"]
    assert bases(context=("train.lr=0.1",)) == []
    row = next(line for line in flows_table(runs).splitlines() if "+fedrdn" in line)
    assert "+5.17" in row


def test_office_loader_fedrdn_split_on_pickle_fixture(tmp_path):
    """dataset.split=fedrdn on a tiny copy of FedBN's pickle layout: train = the first
    int(0.6 n) entries of each domain's train pickle, val = the rest, test = the test pickle
    (Table 6's rule), whatever the smallest domain (FedBN's rule would use it)."""
    import pickle

    import numpy as np
    from PIL import Image

    from fedshift.data.domains.fedbn_pickles import OFFICE_CLASSES, load_office

    sizes = {"amazon": (15, 4), "caltech": (20, 5), "dslr": (5, 2), "webcam": (10, 3)}
    folder = tmp_path / "office_caltech_10"
    for d, (n_train, n_test) in sizes.items():
        for which, n in (("train", n_train), ("test", n_test)):
            rel = [f"office_caltech_10/{d}/{which}_{i}.png" for i in range(n)]
            for i, r in enumerate(rel):
                (tmp_path / r).parent.mkdir(parents=True, exist_ok=True)
                Image.new("RGB", (4, 4), (10 * i + 5, 0, 0)).save(tmp_path / r)
            labels = np.array([OFFICE_CLASSES[i % 10] for i in range(n)])
            with open(folder / f"{d}_{which}.pkl", "wb") as fh:
                pickle.dump((np.array(rel), labels), fh)
    fed = load_office(OfficeParams(root=str(tmp_path), split="fedrdn", size=4, cache=False))
    for d, (n, n_test) in sizes.items():
        c = fed.client(d)
        first = [int(round(v * 255)) for v in c.train.x[:, 0, 0, 0].tolist()]
        assert first == [10 * i + 5 for i in range(int(0.6 * n))], d
        assert len(c.val) == n - int(0.6 * n) and len(c.test) == n_test
    assert fed.info["split_rule"] == "fedrdn" and "Table 6" in fed.info["split"]
