"""ADCOL (Li, He, Song, ICML 2023): the KL-to-uniform party term by hand, the discriminator's
training, the direction of the party gradient, the uploads and the personalised default."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from fedshift.algorithms.adcol import (
    DISC,
    discriminator,
    kl_to_uniform,
    train_discriminator,
)
from fedshift.core.config import TrainConfig
from fedshift.core.context import ClientContext
from fedshift.core.errors import ConfigError
from fedshift.core.payload import Payload
from fedshift.runtime.rundir.checkpoint_io import read_checkpoint
from fedshift.runtime.simulation import Simulation, run_experiment


def test_kl_to_uniform_by_hand():
    # logits (0, log 3): q = (1/4, 3/4); KL(U || q) = 1/2 log(1/2 / 1/4) + 1/2 log(1/2 / 3/4)
    # = 1/2 log(4/3); a row of equal logits is uniform: 0. Mean over the two rows.
    logits = torch.tensor([[0.0, math.log(3.0)], [1.0, 1.0]])
    assert kl_to_uniform(logits).item() == pytest.approx(0.25 * math.log(4 / 3), rel=1e-6)
    # the same as torch's KL(target || input) with a uniform target
    ref = F.kl_div(F.log_softmax(logits, 1), torch.full((2, 2), 0.5), reduction="batchmean")
    assert torch.isclose(kl_to_uniform(logits), ref)


def _separable(n: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    z = torch.randn(2 * n, 4, generator=g)
    z[:n, 0] += 3.0  # party 0 shifted along the first axis, party 1 the other way
    z[n:, 0] -= 3.0
    party = torch.tensor([0] * n + [1] * n)
    return z, party


def test_one_discriminator_step_lowers_its_loss():
    torch.manual_seed(0)
    disc = discriminator(4, 8, 2)
    z, party = _separable()
    opt = torch.optim.SGD(disc.parameters(), lr=0.1)
    disc.train()
    before = F.cross_entropy(disc(z), party).item()
    # one epoch of one full batch = one step
    train_discriminator(disc, opt, z, party, 1, len(z), torch.Generator().manual_seed(0))
    disc.train()
    after = F.cross_entropy(disc(z), party).item()
    assert after < before


def test_party_gradient_moves_the_prediction_towards_uniform():
    torch.manual_seed(0)
    disc = discriminator(4, 8, 3).eval()
    z = torch.randn(6, 4, requires_grad=True)
    kl = kl_to_uniform(disc(z))
    (grad,) = torch.autograd.grad(kl, z)
    assert kl.item() > 0
    with torch.no_grad():
        assert kl_to_uniform(disc(z - 0.05 * grad)).item() < kl.item()


def test_server_labels_uploads_by_client_index_and_trains_d(make_cfg, tmp_path):
    sim = Simulation(make_cfg("algorithm.name=adcol", "algorithm.dis_epochs=30"), tmp_path / "s")
    algo, server = sim.algo.algo, sim.server
    down = algo.broadcast(server, 1, "client0")
    assert set(down.records) == {"discriminator"}  # no weights: nothing is averaged
    dim = sim.model.classifier.in_features
    g = torch.Generator().manual_seed(0)
    # each client's representations sit around its own direction: D must learn client -> row
    centres = torch.eye(3, dim) * 4
    replies = [
        (cid, Payload({"features": {"z": centres[i] + 0.1 * torch.randn(20, dim, generator=g)}}))
        for i, cid in enumerate(["client0", "client1", "client2"])
    ]
    first = server["disc"]["fc1.weight"].clone()
    algo.aggregate(server, 1, replies)
    assert not torch.equal(server["disc"]["fc1.weight"], first)
    assert server["disc_opt"] is not None and server["disc_loss"] < math.log(3)
    algo.disc.load_state_dict(server["disc"])
    with torch.no_grad():
        pred = algo.disc.eval()(torch.cat([z["features"]["z"] for _, z in replies])).argmax(1)
    assert (pred == torch.arange(3).repeat_interleave(20)).float().mean() > 0.9
    # the discriminator's training is seeded: the same round from the same state is the same
    again = Simulation(make_cfg("algorithm.name=adcol", "algorithm.dis_epochs=30"), tmp_path / "t")
    again.algo.algo.aggregate(again.server, 1, replies)
    assert torch.equal(again.server["disc"]["fc1.weight"], server["disc"]["fc1.weight"])


def test_client_objective_and_uploads(make_cfg, tmp_path):
    sim = Simulation(make_cfg("algorithm.name=adcol", "train.local_epochs=2"), tmp_path / "c")
    algo = sim.algo.algo
    up = sim.client_round(1, "client0")
    assert set(up.records) == {"features"}
    n = len(sim.train_clients["client0"].train)
    # the last of the two epochs: every training example once
    assert up["features"]["z"].shape == (n, sim.model.classifier.in_features)
    # the loss is CE + mu * KL(U || softmax(D(z))) with the frozen D
    model = sim.model
    x = sim.train_clients["client0"].train.x[:8]
    y = sim.train_clients["client0"].train.y[:8]
    ctx = ClientContext(
        "client0", 1, None, model, TrainConfig(), None, torch.Generator(), torch.device("cpu")
    )
    model.eval()
    ctx.scratch[DISC] = sim.server["disc"]
    z = model.features(x)
    d = algo.client_disc.eval()
    d.load_state_dict(sim.server["disc"])
    expected = F.cross_entropy(model.head(z), y) + 0.5 * kl_to_uniform(d(z))
    assert torch.isclose(algo.loss(ctx, x, y), expected, rtol=1e-5)


def test_adcol_end_to_end_personal_default_and_fedavg_option(make_cfg, tmp_path):
    def run(name, *over):
        cfg = make_cfg(*over, rounds=2)
        return run_experiment(cfg, run_dir=tmp_path / name, progress=False).summary

    s = run("p", "algorithm.name=adcol")
    assert s["evaluated_model"] == "personal"
    ck = read_checkpoint(tmp_path / "p/checkpoint.pt")
    w = [ck["clients"][c]["local"]["classifier.weight"] for c in ("client0", "client1")]
    assert not torch.equal(w[0], w[1])  # never averaged
    disc_bytes = sum(t.numel() * t.element_size() for t in ck["server"]["disc"].values())
    dim = w[0].shape[1]
    n = 3 * 60  # three toy clients of 60 training examples
    assert s["bytes_by_record"] == {
        "up": {"features": 2 * n * dim * 4},
        "down": {"discriminator": 2 * 3 * disc_bytes},
    }
    # mu = 0: the discriminator plays no part, so this is local training
    local = run("l", "algorithm.name=local")
    zero = run("z", "algorithm.name=adcol", "algorithm.mu=0")
    assert zero["test_per_client"] == local["test_per_client"]
    f = run("f", "algorithm.name=adcol", "algorithm.averaging=fedavg", "algorithm.mu=0")
    avg = run("a", "algorithm.name=fedavg")
    assert f["evaluated_model"] == "global" and f["test_per_client"] == avg["test_per_client"]
    with pytest.raises(ConfigError, match="bn_policy"):
        make_cfg("algorithm.name=adcol", "algorithm.bn_policy=local")
