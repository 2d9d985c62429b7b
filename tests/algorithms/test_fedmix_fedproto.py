"""FedMix / NaiveMix (averaged data shared once, the approximate mixup loss) and FedProto
(prototypes, count-weighted aggregation, the regulariser, personal models only)."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fedshift.algorithms.fedproto import (
    GLOBAL_PROTOS,
    FedProto,
    FedProtoParams,
    aggregate_prototypes,
    prototype_regulariser,
)
from fedshift.augment.fedmix import FedMix, FedMixParams, group_means
from fedshift.core.config import FederationConfig, InputConfig, TrainConfig
from fedshift.core.context import ClientContext, InputPipeline, Normalize
from fedshift.core.errors import ConfigError
from fedshift.core.federation import ClientData, Split
from fedshift.core.payload import Payload
from fedshift.core.seeding import generator
from fedshift.models.base import FedModel
from fedshift.runtime.rundir.checkpoint_io import read_checkpoint
from fedshift.runtime.simulation import Simulation, run_experiment


class Linear(FedModel):
    """No stages: logits = W flatten(x) + b."""

    def __init__(self, inputs: int = 4, classes: int = 3) -> None:
        super().__init__()
        self.stages = nn.ModuleDict()
        self.embed = nn.Identity()
        self.classifier = nn.Linear(inputs, classes)


def g(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ----------------------------------------------------------------------------- FedMix
def test_group_means_by_hand():
    x = torch.tensor([0.0, 1.0, 2.0, 6.0]).view(4, 1, 1, 1)
    y = torch.tensor([0, 1, 1, 2])
    xb, yb = group_means(x, y, None, 3, g(0))  # m = all: one mean per client
    assert torch.allclose(xb.flatten(), torch.tensor([2.25]))
    assert torch.allclose(yb, torch.tensor([[0.25, 0.5, 0.25]]))
    order = torch.randperm(4, generator=g(7))
    xb, yb = group_means(x, y, 2, 3, g(7))  # groups of 2 in a random order
    vals, onehot = x.flatten(), torch.eye(3)[y]
    for k in range(2):
        idx = order[2 * k : 2 * k + 2]
        assert torch.isclose(xb[k].flatten()[0], vals[idx].mean())
        assert torch.allclose(yb[k], onehot[idx].mean(0))
    xb, _ = group_means(x, y, 3, 3, g(7))  # a trailing group smaller than m is dropped
    assert xb.shape[0] == 1 and torch.isclose(xb[0].flatten()[0], vals[order[:3]].mean())


def test_client_means_use_a_derived_seed():
    x, y = torch.rand(10, 1, 2, 2, generator=g(1)), torch.arange(10) % 3
    data = ClientData("c", Split(x, y), Split(x, y), Split(x, y))
    aug = FedMix(FedMixParams(m=5), 3, 3)
    state = aug.init_client("c", data, Linear())
    xb, yb = group_means(x, y, 5, 3, generator(3, "fedmix", "c"))
    assert torch.equal(state["x"], xb) and torch.equal(state["y"], yb)
    rec = aug.setup_reply("c", state)["fedmix_means"]
    assert rec["x"].shape == (2, 1, 2, 2) and rec["y"].shape == (2, 3)


def _fedmix_setup(mode: str, lam: float = 0.2):
    model = Linear()
    aug = FedMix(FedMixParams(mode=mode, lam=lam), 0, 3)
    aug.attach(model)
    xbar = torch.tensor([0.2, 0.9, 0.4, 0.6]).view(1, 1, 2, 2)
    ybar = torch.tensor([[0.5, 0.25, 0.25]])
    state: dict = {}
    aug.receive(Payload({"fedmix_bank": {"x": xbar, "y": ybar}}), state, 0)
    norm = Normalize(InputConfig(mean=[0.5], std=[0.25]), 1, torch.device("cpu"))
    pipe = InputPipeline([aug], norm)
    x = torch.rand(5, 1, 2, 2, generator=g(4))
    y = torch.tensor([0, 1, 2, 0, 1])
    return model, aug, {"aug/fedmix": state}, pipe, x, y, xbar, ybar


def test_fedmix_loss_matches_the_formula_on_a_linear_model():
    lam = 0.2
    model, aug, states, pipe, x, y, xbar, ybar = _fedmix_setup("fedmix", lam)
    model.train()
    xin, target = pipe.train(x, y, states, g(0))
    onehot = torch.eye(3)[y]
    assert torch.allclose(target, (1 - lam) * onehot + lam * ybar)
    loss = F.cross_entropy(model(xin), target)
    loss.backward()
    # by hand: l_FedMix = (1-lam) CE(f(x~), y) + lam CE(f(x~), ybar) + lam <dCE/dx, xbar>,
    # x~ = (1-lam) x, f(v) = W (v - 0.5) / 0.25 + b, dCE_i/dx_i = W^T (softmax - e_y) / 0.25
    W = model.classifier.weight.detach().clone().requires_grad_(True)
    b = model.classifier.bias.detach().clone().requires_grad_(True)
    v = ((1 - lam) * x - 0.5).flatten(1) / 0.25
    logits = v @ W.T + b
    logp = logits.log_softmax(1)
    ce_y = -(onehot * logp).sum(1)
    ce_bar = -(ybar * logp).sum(1)
    dx = (logits.softmax(1) - onehot) @ W / 0.25
    term = lam * (dx * xbar.flatten(1)).sum(1)
    expected = ((1 - lam) * ce_y + lam * ce_bar + term).mean()
    assert aug.last_term is not None and aug.last_term != 0.0
    assert torch.isclose(loss.detach() + aug.last_term, expected.detach(), atol=1e-6)
    expected.backward()
    assert torch.allclose(model.classifier.weight.grad, W.grad, atol=1e-6)
    assert torch.allclose(model.classifier.bias.grad, b.grad, atol=1e-6)
    # a second forward of the same batch (SAM's second pass) adds the term again
    model.zero_grad()
    F.cross_entropy(model(xin), target).backward()
    assert torch.allclose(model.classifier.weight.grad, W.grad, atol=1e-6)
    # evaluation: no term, no change of input
    model.eval()
    with torch.no_grad():
        assert torch.allclose(model(x), model.classifier(x.flatten(1)))


def test_fedmix_needs_a_differentiable_pipeline_after_it():
    from fedshift.augment.base import Augment
    from fedshift.core.errors import TrainingError

    class Detach(Augment):
        name = "detach"

        def train_batch(self, x, y, state, generator):
            return x.detach(), y

    model, aug, states, _, x, y, _, _ = _fedmix_setup("fedmix")
    pipe = InputPipeline([aug, Detach(None, 0, 3)], lambda v: v)
    model.train()
    xin, _ = pipe.train(x, y, {**states, "aug/detach": {}}, g(0))
    with pytest.raises(TrainingError, match="list 'fedmix' last"):
        model(xin)


def test_naivemix_mixes_with_the_received_means():
    lam = 0.1
    model, aug, states, pipe, x, y, xbar, ybar = _fedmix_setup("naivemix", lam)
    xm, target = aug.train_batch(x, y, states["aug/fedmix"], g(0))
    assert torch.allclose(xm, (1 - lam) * x + lam * xbar)
    assert torch.allclose(target, (1 - lam) * torch.eye(3)[y] + lam * ybar)
    assert aug.pending is None and not model._forward_hooks  # no gradient term


def test_fedmix_ledger_shows_the_averaged_images_in_round_0(make_cfg, tmp_path):
    cfg = make_cfg("model.name=cnn", "augment=[{name: fedmix, m: 30}]", rounds=2)
    sim = Simulation(cfg, tmp_path / "m", progress=False)
    sim.run()
    # 60 training images per client, groups of 30: 2 averaged 3x28x28 images + 2 label rows
    per_client = 2 * 3 * 28 * 28 * 4 + 2 * 10 * 4
    rows = [r for r in sim.ledger.rows if r[3].startswith("fedmix")]
    assert {r[0] for r in rows} == {0}  # shared once, before round 1
    ups = [r for r in rows if r[2] == "up"]
    downs = [r for r in rows if r[2] == "down"]
    assert [r[3] for r in ups] == ["fedmix_means"] * 3 and all(r[4] == per_client for r in ups)
    assert [r[3] for r in downs] == ["fedmix_bank"] * 3
    assert all(r[4] == 3 * per_client for r in downs)  # everyone's averaged images
    ledger = json.loads((tmp_path / "m/ledger.json").read_text())
    assert ledger["by_round"]["0"] == {"up": 3 * per_client, "down": 9 * per_client}
    s = json.loads((tmp_path / "m/summary.json").read_text())
    assert s["bytes_by_record"]["up"]["fedmix_means"] == 3 * per_client


@pytest.mark.parametrize(
    ("over", "match"),
    [
        (["algorithm.name=local", "augment=[fedmix]"], "without a federation"),
        (["algorithm.name=central", "augment=[fedmix]"], "without a federation"),
        (["algorithm.name=fedproto", "augment=[fedmix]"], "integer class"),
        (["augment=[{name: fedmix, lam: 1.0}]"], "augment.fedmix.lam"),
        (["augment=[{name: fedmix, m: 0}]"], "augment.fedmix.m"),
    ],
)
def test_fedmix_config_checks(make_cfg, over, match):
    with pytest.raises(ConfigError, match=match):
        make_cfg(*over)


@pytest.mark.parametrize(
    "over",
    [
        ("algorithm.name=fedavg", "augment=[fedmix]"),
        ("algorithm.name=fedavg", "augment=[{name: fedmix, mode: naivemix}]"),
        ("algorithm.name=fedsam", "augment=[fedmix]"),
        ("algorithm.name=fedprox", "augment=[fedmix, mixstyle]"),
    ],
)
def test_fedmix_end_to_end(make_cfg, tmp_path, over):
    s = run_experiment(
        make_cfg("model.name=cnn", *over, rounds=2), run_dir=tmp_path / "r", progress=False
    ).summary
    assert 0.0 <= s["test_mean"] <= 1.0
    assert s["bytes_by_record"]["down"]["fedmix_bank"] > 0


def test_fedmix_gradient_term_takes_part_in_training(make_cfg, tmp_path, monkeypatch):
    def weights(name):
        cfg = make_cfg("model.name=cnn", "augment=[{name: fedmix, lam: 0.3}]", rounds=1)
        run_experiment(cfg, run_dir=tmp_path / name, progress=False)
        ck = read_checkpoint(tmp_path / name / "checkpoint.pt")
        return ck["server"]["weights"]["classifier.weight"]

    a = weights("a")
    assert torch.equal(a, weights("b"))  # deterministic
    monkeypatch.setattr(FedMix, "_post_hook", lambda self, module, args, out: None)
    assert not torch.allclose(a, weights("c"))  # without the input-gradient term


# ----------------------------------------------------------------------------- FedProto
def test_prototype_aggregation_is_count_weighted():
    a = (torch.tensor([[1.0], [10.0]]), torch.tensor([1.0, 0.0]))  # client A: no class 1
    b = (torch.tensor([[4.0], [20.0]]), torch.tensor([2.0, 3.0]))
    protos, weight = aggregate_prototypes([a, b], "paper")
    assert torch.allclose(protos, torch.tensor([[3.0], [20.0]]))  # (1*1 + 2*4) / 3
    assert torch.allclose(weight, torch.tensor([3.0, 3.0], dtype=torch.float64))
    protos, _ = aggregate_prototypes([a, b], "released")  # plain mean over holders
    assert torch.allclose(protos, torch.tensor([[2.5], [20.0]]))
    none = (torch.zeros(2, 1), torch.zeros(2))
    _, weight = aggregate_prototypes([none], "paper")
    assert (weight == 0).all()


def test_regulariser_by_hand():
    z = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    y = torch.tensor([0, 1])
    protos = torch.tensor([[0.0, 0.0], [1.0, 1.0]])
    both = torch.tensor([True, True])
    # ||(1,2)||^2 = 5, ||(2,3)||^2 = 13, mean over the batch
    assert torch.isclose(prototype_regulariser(z, y, protos, both), torch.tensor(9.0))
    assert torch.isclose(prototype_regulariser(z, y, protos, both, "mse"), torch.tensor(4.5))
    only0 = torch.tensor([True, False])  # class 1 has no global prototype yet
    assert torch.isclose(prototype_regulariser(z, y, protos, only0), torch.tensor(2.5))


def _algo(lam: float, model: FedModel) -> FedProto:
    return FedProto(FedProtoParams(lam=lam), TrainConfig(), FederationConfig(), model, 2)


def test_local_objective_adds_the_regulariser():
    torch.manual_seed(0)
    model = Linear(inputs=2, classes=2)
    algo = _algo(0.5, model)
    x = torch.tensor([[1.0, 2.0], [3.0, 4.0]]).view(2, 1, 1, 2)
    y = torch.tensor([0, 1])
    protos = torch.tensor([[0.0, 0.0], [1.0, 1.0]])
    ctx = ClientContext("c", 1, None, model, TrainConfig(), None, g(0), torch.device("cpu"))
    ctx.scratch[GLOBAL_PROTOS] = (protos, torch.tensor([True, True]))
    ce = F.cross_entropy(model(x), y)
    assert torch.isclose(algo.loss(ctx, x, y), ce + 0.5 * 9.0)
    ctx.scratch[GLOBAL_PROTOS] = None  # round 1: no prototypes yet
    assert torch.isclose(algo.loss(ctx, x, y), ce)


def test_uploaded_prototypes_are_per_class_means(make_cfg, tmp_path):
    sim = Simulation(
        make_cfg("algorithm.name=fedproto", "model.name=cnn", rounds=1), tmp_path / "p"
    )
    up = sim.client_round(1, "client0")
    assert set(up.records) == {"prototypes"}  # no weights
    model, data = sim.model, sim.train_clients["client0"]
    model.load_state_dict(sim.states["client0"]["local"])
    model.eval()
    with torch.no_grad():
        z = model.features(sim.pipeline.eval(data.train.x, sim.states["client0"]))
    for c in range(10):
        assert torch.allclose(
            up["prototypes"]["protos"][c], z[data.train.y == c].mean(0), atol=1e-5
        )
    assert torch.equal(up["prototypes"]["counts"], torch.bincount(data.train.y).float())
    assert up["prototypes"]["protos"].shape == (10, 128)


def test_released_prototypes_collect_training_embeddings(make_cfg, tmp_path):
    cfg = make_cfg(
        "algorithm.name=fedproto", "algorithm.prototypes=released", "train.local_epochs=2"
    )
    sim = Simulation(cfg, tmp_path / "r")
    up = sim.client_round(1, "client0")
    y = sim.train_clients["client0"].train.y
    # every training example twice (2 epochs of 60 examples, batches of 16 + 12)
    assert torch.equal(up["prototypes"]["counts"], 2 * torch.bincount(y).float())


def test_server_averages_prototypes_and_sends_no_weights(make_cfg, tmp_path):
    sim = Simulation(make_cfg("algorithm.name=fedproto", rounds=1), tmp_path / "s")
    assert set(sim.algo.broadcast(sim.server, 1, "client0").records) == set()
    replies = [(cid, sim.client_round(1, cid)) for cid in sim.train_clients]
    sim.algo.aggregate(sim.server, 1, replies)
    items = [(p["prototypes"]["protos"], p["prototypes"]["counts"]) for _, p in replies]
    counts = torch.stack([c for _, c in items])
    expected = sum(c[:, None] * p for p, c in items) / counts.sum(0)[:, None]
    assert torch.allclose(sim.server["protos"], expected, atol=1e-6)
    down = sim.algo.broadcast(sim.server, 2, "client0")
    assert set(down.records) == {"global_protos"}
    assert down["global_protos"]["mask"].all()


def test_fedproto_end_to_end_personal_models(make_cfg, tmp_path):
    def run(name, *over):
        cfg = make_cfg("model.name=cnn", *over, rounds=2)
        return run_experiment(cfg, run_dir=tmp_path / name, progress=False).summary

    s = run("p", "algorithm.name=fedproto")
    assert s["evaluated_model"] == "personal" and sorted(s["models"]) == ["personal"]
    assert s["bytes_by_record"] == {
        "up": {"prototypes": 3 * 2 * (10 * 128 * 4 + 10 * 4)},
        "down": {"global_protos": 3 * (10 * 128 * 4 + 10)},  # round 2 only; mask is bool
    }
    ck = read_checkpoint(tmp_path / "p/checkpoint.pt")
    w = [ck["clients"][c]["local"]["classifier.weight"] for c in ("client0", "client1")]
    assert not torch.equal(w[0], w[1])  # never averaged
    # lam = 0 is local training exactly; lam = 1 is not
    local = run("l", "algorithm.name=local")
    zero = run("z", "algorithm.name=fedproto", "algorithm.lam=0")
    assert zero["test_per_client"] == local["test_per_client"]
    assert s["test_per_client"] != local["test_per_client"] or s["val_mean"] != local["val_mean"]


def test_fedproto_options_and_checks(make_cfg, tmp_path):
    with pytest.raises(ConfigError, match="bn_policy"):
        make_cfg("algorithm.name=fedproto", "algorithm.bn_policy=local")
    with pytest.raises(ConfigError, match="algorithm.lam"):
        make_cfg("algorithm.name=fedproto", "algorithm.lam=-1")
    cfg = make_cfg(
        "algorithm.name=fedproto",
        "algorithm.share_weights=true",
        "algorithm.bn_policy=local",
        "algorithm.aggregation=released",
        "algorithm.reg=mse",
        rounds=2,
    )
    s = run_experiment(cfg, run_dir=tmp_path / "w", progress=False).summary
    assert set(s["bytes_by_record"]["up"]) == {"prototypes", "weights"}
