"""HarmoFL: amplitude normalisation (Eq. 2-4), weight perturbation (Eq. 6-7), its ablations,
the amplitude records in the ledger, and an end-to-end run."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import ROOT
from support.replies import reply
from torch import nn

from fedshift.algorithms import ALGORITHMS
from fedshift.algorithms.base import bn_keys
from fedshift.augment.ampnorm import (
    AmpNorm,
    AmpNormParams,
    amplitude_phase,
    batch_amplitude,
    rebuild,
    shrink_warning,
    tracks_bn_statistics,
)
from fedshift.core.config import FederationConfig, InputConfig, TrainConfig
from fedshift.core.context import ClientContext, InputPipeline, Normalize
from fedshift.core.errors import ConfigError
from fedshift.core.federation import ClientData, Split
from fedshift.core.payload import Payload
from fedshift.core.seeding import generator
from fedshift.models.base import FedModel
from fedshift.runtime.simulation import Simulation

AMP_BYTES = 3 * 28 * 28 * 4  # one toyshift amplitude spectrum, float32


def _aug(amplitude: str = "paper", init: str = "auto") -> tuple[AmpNorm, dict]:
    aug = AmpNorm(AmpNormParams(amplitude=amplitude, init=init), 0, 10)
    return aug, aug.init_client("c", None, None)


def _train(aug, x, state):
    return aug.train_batch(x, torch.zeros(x.shape[0], dtype=torch.long), state, None)[0]


# ----------------------------------------------------------------------------- Eq. 2-4
def test_own_amplitude_gives_the_image_back():
    img = torch.rand(2, 5, 6, generator=torch.Generator().manual_seed(0))
    # circular shifts share one amplitude spectrum: the batch mean amplitude is each image's own
    x = torch.stack([img, img.roll(1, -1), img.roll((2, 3), (-2, -1))])
    assert torch.allclose(rebuild(x, batch_amplitude(x)), x, atol=1e-5)
    aug, state = _aug(init="first")
    # round 1: the client rebuilds its batch with its own running amplitude
    assert torch.allclose(_train(aug, x, state), x, atol=1e-5)
    assert torch.allclose(aug.eval_batch(x, state), x, atol=1e-5)
    # paper start (Eq. 3: zero before the first batch): A_1 = v * A, so Eq. 4 gives v * x
    aug, state = _aug()
    assert torch.allclose(_train(aug, x, state), 0.1 * x, atol=1e-5)
    # two images with different spectra both change (they get the mean amplitude)
    y = torch.stack([img, torch.rand(2, 5, 6, generator=torch.Generator().manual_seed(1))])
    assert not torch.allclose(rebuild(y, batch_amplitude(y)), y, atol=1e-3)


def test_replaced_amplitude_keeps_the_phase():
    g = torch.Generator().manual_seed(2)
    x, z = torch.rand(2, 2, 6, 7, generator=g), torch.rand(2, 6, 7, generator=g)
    target = amplitude_phase(z)[0].float()
    out = rebuild(x, target)
    assert out.dtype == x.dtype and out.shape == x.shape
    amp_out, pha_out = amplitude_phase(out)
    _, pha_x = amplitude_phase(x)
    assert torch.allclose(amp_out, target.double().expand_as(amp_out), atol=1e-4)
    one = torch.ones_like(pha_x)
    assert torch.allclose(torch.polar(one, pha_out), torch.polar(one, pha_x), atol=1e-4)
    assert not torch.allclose(out, x, atol=1e-2)


# 2x2 images: F00 = a+b+c+d, F01 = a-b+c-d, F10 = a+b-c-d, F11 = a-b-c+d
B1 = torch.tensor([[[[1.0, 0.0], [0.0, 0.0]]], [[[1.0, 1.0], [0.0, 0.0]]]])  # |F| 1111, 2020
B2 = torch.tensor([[[[0.0, 0.0], [0.0, 1.0]]], [[[1.0, 0.0], [1.0, 0.0]]]])  # |F| 1111, 2200
B3 = torch.ones(2, 1, 2, 2)  # |F| = [[4, 0], [0, 0]], phase 0
A1 = torch.tensor([[[1.5, 0.5], [1.5, 0.5]]])
A2 = torch.tensor([[[1.5, 1.5], [0.5, 0.5]]])


def test_batch_amplitude_by_hand():
    assert torch.equal(batch_amplitude(B1), A1)
    assert torch.equal(batch_amplitude(B2), A2)


def test_running_amplitude_paper_starts_at_zero_by_hand():
    """Eq. 3 with the text under it: the previous average is zero for the first batch."""
    aug, state = _aug("paper")
    assert aug._init == "zero"  # the paper's default
    out1 = _train(aug, B1, state)
    assert torch.allclose(state["running"], 0.1 * A1)  # (1 - v) * 0 + v * A1
    assert torch.allclose(out1, 0.1 * rebuild(B1, A1), atol=1e-6)  # a tenth of Eq. 4 at A1
    _train(aug, B2, state)
    # 0.9 * 0.1 * A1 + 0.1 * A2
    assert torch.allclose(state["running"], torch.tensor([[[0.285, 0.195], [0.185, 0.095]]]))
    _train(aug, B3, state)
    r3 = torch.tensor([[[0.6565, 0.1755], [0.1665, 0.0855]]])  # 0.9 * r2 + 0.1 * [[4,0],[0,0]]
    assert torch.allclose(state["running"], r3)
    # K equal batches: the weights sum to 1 - (1 - v)^K, the shrink the module docstring states
    aug, state = _aug("paper")
    for _ in range(24):
        _train(aug, B3, state)
    assert torch.allclose(state["running"], (1 - 0.9**24) * batch_amplitude(B3), atol=1e-5)


def test_running_amplitude_first_batch_start_by_hand():
    aug, state = _aug("paper", init="first")
    _train(aug, B1, state)
    assert torch.allclose(state["running"], A1)  # the first batch starts the mean
    _train(aug, B2, state)
    # 0.9 * A1 + 0.1 * A2
    assert torch.allclose(state["running"], torch.tensor([[[1.5, 0.6], [1.4, 0.5]]]))
    out = _train(aug, B3, state)
    r3 = torch.tensor([[[1.75, 0.54], [1.26, 0.45]]])  # 0.9 * r2 + 0.1 * [[4, 0], [0, 0]]
    assert torch.allclose(state["running"], r3)
    assert state["batches"] == 3
    # ones have phase 0: the rebuilt image is the inverse 2x2 DFT of r3 (updated with B3 first)
    expected = torch.tensor([[1.0, 0.505], [0.145, 0.1]])
    assert torch.allclose(out, expected.expand_as(out), atol=1e-6)


def test_running_amplitude_released_first_batch_and_dc_only():
    aug, state = _aug("released")
    out1 = _train(aug, B1, state)
    # only F00 changes: 1 -> 1.5 (+0.5/4 per pixel), 2 -> 1.5 (-0.5/4 per pixel)
    assert torch.allclose(out1[0], B1[0] + 0.125) and torch.allclose(out1[1], B1[1] - 0.125)
    _train(aug, B2, state)
    out3 = _train(aug, B3, state)
    assert torch.equal(state["running"], A1)  # frozen at the first batch (momentum 0)
    assert torch.allclose(out3, torch.full_like(B3, 1.5 / 4))  # mean moved to 1.5 / 4
    x = torch.rand(3, 2, 5, 6, generator=torch.Generator().manual_seed(3))
    amp = torch.rand(2, 5, 6, generator=torch.Generator().manual_seed(4)) * 30
    shifted = x - x.mean((-2, -1), keepdim=True) + amp[:, 0, 0].view(1, 2, 1, 1) / 30
    assert torch.allclose(rebuild(x, amp, dc_only=True), shifted, atol=1e-5)


# ----------------------------------------------------------------------------- the exchange
def _amp_reply(client, value, n):
    return reply(client, n, weights={}, amplitude={"amplitude": value})


def test_server_averages_once_and_sends_once_to_each_client():
    aug, _ = _aug()
    server = aug.init_server(None)
    a = torch.tensor([[[1.0, 2.0], [3.0, 4.0]]])
    b = torch.tensor([[[3.0, 2.0], [1.0, 0.0]]])
    replies = [_amp_reply("a", a, 10), _amp_reply("b", b, 30), reply("c", 0, w={})]
    aug.aggregate(server, 1, replies)
    assert torch.equal(server["amplitude"], torch.full((1, 2, 2), 2.0))  # uniform mean
    aug.aggregate(server, 2, [_amp_reply("a", torch.full((1, 2, 2), 9.0), 1)])
    assert torch.equal(server["amplitude"], torch.full((1, 2, 2), 2.0))  # fixed after round 1
    down = aug.broadcast(server, 2, "a")
    assert torch.equal(down["global_amplitude"]["amplitude"], server["amplitude"])
    assert aug.broadcast(server, 3, "a") == {}
    assert "global_amplitude" in aug.broadcast(server, 3, "b")


def test_client_reply_once_and_global_after_receive():
    aug, state = _aug()
    x = torch.rand(1, 1, 2, 2, generator=torch.Generator().manual_seed(5))
    assert torch.equal(aug.eval_batch(x, state), x)  # no amplitude at all yet: unchanged
    assert aug.reply(None, state, 1) == {}  # nothing accumulated, nothing sent
    _train(aug, B1, state)
    up = aug.reply(None, state, 1)
    assert torch.allclose(up["amplitude"]["amplitude"], 0.1 * A1)
    assert aug.reply(None, state, 2) == {}  # once
    # before the global amplitude arrives, evaluation uses the client's own
    assert torch.allclose(aug.eval_batch(x, state), rebuild(x, 0.1 * A1))
    glob = torch.tensor([[[4.0, 1.0], [2.0, 0.5]]])
    aug.receive(Payload({"global_amplitude": {"amplitude": glob}}), state, 2)
    assert torch.allclose(_train(aug, x, state), rebuild(x, glob))
    assert torch.allclose(aug.eval_batch(x, state), rebuild(x, glob))
    assert torch.allclose(state["running"], 0.1 * A1)  # no longer accumulated
    aug.receive(Payload({"weights": {}}), state, 3)  # a broadcast without it keeps it
    assert torch.equal(state["global"], glob)


def test_ledger_amplitude_records(make_cfg, tmp_path):
    sim = Simulation(
        make_cfg("algorithm.name=harmofl", "model.name=cnn"), tmp_path / "h", None, False
    )
    res = sim.run()
    amp = [r for r in sim.ledger.rows if r[3] in ("amplitude", "global_amplitude")]
    clients = ["client0", "client1", "client2"]
    assert sorted(amp) == sorted(
        [(1, c, "up", "amplitude", AMP_BYTES) for c in clients]
        + [(2, c, "down", "global_amplitude", AMP_BYTES) for c in clients]
    )
    s = res.summary
    assert s["bytes_by_record"]["up"]["amplitude"] == 3 * AMP_BYTES
    assert s["bytes_by_record"]["down"]["global_amplitude"] == 3 * AMP_BYTES
    # end to end: 3 rounds of harmofl with the cnn on toyshift
    assert s["algorithm"] == "harmofl" and s["evaluated_model"] == "global"
    rows = [r for r in sim.records if r["round"] == 3]
    assert len(rows) == 3 and all(0.0 <= r["global"]["val_acc"] <= 1.0 for r in rows)
    assert all(torch.isfinite(torch.tensor(r["train_loss"])) for r in rows)
    server = sim.server["aug/ampnorm"]["amplitude"]
    states = [sim.states[c]["aug/ampnorm"] for c in clients]
    assert torch.allclose(server, torch.stack([st["running"] for st in states]).mean(0))
    assert all(torch.equal(st["global"], server) for st in states)


def test_partial_participation_and_any_algorithm(make_cfg, tmp_path):
    cfg = make_cfg(
        "algorithm.name=fedprox",
        "model.name=cnn",
        "augment=[{name: ampnorm, amplitude: released}]",
        "federation.sample_fraction=0.34",
        rounds=4,
    )
    sim = Simulation(cfg, tmp_path / "p", None, False)
    sim.run()
    sampled = {r: sim.sample(r) for r in range(1, 5)}
    ups = [(r[0], r[1]) for r in sim.ledger.rows if r[3] == "amplitude"]
    downs = [(r[0], r[1]) for r in sim.ledger.rows if r[3] == "global_amplitude"]
    assert ups == [(1, c) for c in sampled[1]]
    first_seen: dict[str, int] = {}
    for r in range(2, 5):
        for c in sampled[r]:
            first_seen.setdefault(c, r)
    assert sorted(downs) == sorted((r, c) for c, r in first_seen.items())


# ----------------------------------------------------------------------------- Eq. 6-7
class _Linear(FedModel):
    def __init__(self, d: int, k: int) -> None:
        super().__init__()
        self.stages = nn.ModuleDict({"flat": nn.Flatten()})
        self.embed = nn.Identity()
        self.classifier = nn.Linear(d, k)


def _grads(w, b, x, y):
    """Softmax regression: gradient of the mean cross-entropy, written out."""
    d = (torch.softmax(x @ w.T + b, 1) - F.one_hot(y, w.shape[0]).double()) / x.shape[0]
    return d.T @ x, d.sum(0)


def _one_step(**params):
    torch.manual_seed(0)
    model = _Linear(4, 3)
    g = torch.Generator().manual_seed(6)
    x, y = torch.rand(6, 1, 2, 2, generator=g), torch.tensor([0, 1, 2, 0, 1, 2])
    client = ClientData("c", Split(x, y), Split(x, y), Split(x, y))
    train = TrainConfig(lr=0.5, batch_size=6, local_steps=1)
    entry = ALGORITHMS.entry("harmofl")
    algo = entry.obj(entry.params(**params), train, FederationConfig(), model, 1)
    w0, b0 = model.classifier.weight.detach().double(), model.classifier.bias.detach().double()
    pipe = InputPipeline([], Normalize(InputConfig([0.5], [0.5]), 1, torch.device("cpu")))
    ctx = ClientContext("c", 1, client, model, train, pipe, generator(0, "c"), torch.device("cpu"))
    steps, _ = algo.local_train(ctx, {})
    assert steps == 1
    got = (model.classifier.weight.detach().double(), model.classifier.bias.detach().double())
    return got, (w0, b0), ((x.flatten(1).double() - 0.5) / 0.5, y)


def test_weight_perturbation_step_by_hand():
    rho, lr = 0.05, 0.5
    (w1, b1), (w0, b0), (x, y) = _one_step(rho=rho)
    gw, gb = _grads(w0, b0, x, y)
    norm = (gw.square().sum() + gb.square().sum()).sqrt()  # one norm over all parameters
    ew, eb = rho * gw / norm, rho * gb / norm
    gw2, gb2 = _grads(w0 + ew, b0 + eb, x, y)  # gradient at w + epsilon ...
    assert torch.allclose(w1, w0 - lr * gw2, atol=1e-6)  # ... applied at w
    assert torch.allclose(b1, b0 - lr * gb2, atol=1e-6)
    assert (w1 - (w0 - lr * gw)).abs().max() > 1e-4  # differs from a plain step


def test_ablation_perturbation_off_is_plain_sgd():
    (w1, b1), (w0, b0), (x, y) = _one_step(perturbation=False)
    gw, gb = _grads(w0, b0, x, y)
    assert torch.allclose(w1, w0 - 0.5 * gw, atol=1e-6)
    assert torch.allclose(b1, b0 - 0.5 * gb, atol=1e-6)


def test_ablation_amplitude_norm_off(make_cfg, tmp_path):
    assert [a.to_dict() for a in make_cfg("algorithm.name=harmofl").augment] == [
        {"name": "ampnorm", "amplitude": "paper", "decay": 0.1, "init": "auto"}
    ]
    cfg = make_cfg("algorithm.name=harmofl", "algorithm.amplitude_norm=false", "model.name=cnn")
    assert cfg.augment == []
    sim = Simulation(cfg, tmp_path / "a", None, False)
    s = sim.run().summary
    assert set(s["bytes_by_record"]["up"]) == {"weights"}
    assert set(s["bytes_by_record"]["down"]) == {"weights"}
    assert sim.algo.algorithm.sam_rho == 0.05


def test_zero_start_shrink_warning_threshold_by_hand():
    # c = 1 - 0.9^K: K = 6 -> 0.469 (< 0.5, warns), K = 7 -> 0.522 (does not)
    assert "47 % of a mean amplitude" in shrink_warning("client3", 6, 0.1)
    assert "client client3 ran 6 batch(es)" in shrink_warning("client3", 6, 0.1)
    assert "init: first" in shrink_warning("client3", 6, 0.1)
    assert shrink_warning("client3", 7, 0.1) is None
    assert shrink_warning("client3", 1, 0.6) is None  # c = 0.6
    assert tracks_bn_statistics(nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2)))
    assert not tracks_bn_statistics(nn.Sequential(nn.BatchNorm2d(2, track_running_stats=False)))
    assert not tracks_bn_statistics(nn.Sequential(nn.Conv2d(1, 2, 3), nn.GroupNorm(1, 2)))


@pytest.mark.parametrize(
    ("overrides", "percent"),
    [
        (["train.batch_size=1000"], 10),  # K = 1 of toyshift's 60 images: c = 0.1
        (["train.batch_size=16"], 34),  # K = 4: c = 1 - 0.9^4 = 0.344
        (["train.batch_size=8"], None),  # K = 8: c = 0.570, over 0.5
        (["train.batch_size=1000", "augment=[{name: ampnorm, init: first}]"], None),
        (["train.batch_size=1000", "model.norm=none", "model.conv=ws"], None),  # no BN
    ],
)
def test_zero_start_warns_once_where_bn_statistics_lag(
    make_cfg, tmp_path, caplog, overrides, percent
):
    cfg = make_cfg("algorithm.name=harmofl", "model.name=cnn", *overrides, rounds=2)
    sim = Simulation(cfg, tmp_path / "w", None, False)
    assert {len(c.train.y) for c in sim.fed.clients} == {60}  # the K above
    with caplog.at_level("WARNING", logger="fedshift.augment.ampnorm"):
        sim.run()
    said = [r.getMessage() for r in caplog.records if r.name == "fedshift.augment.ampnorm"]
    if percent is None:
        assert said == []
    else:
        assert len(said) == 1  # once, not once for each of the 3 clients
        assert f"rebuilds every image at {percent} % of a mean amplitude" in said[0]


def test_nonsense_combinations(make_cfg):
    with pytest.raises(ConfigError, match="'ampnorm' averages amplitudes.*'local'"):
        make_cfg("algorithm.name=local", "augment=[ampnorm]")
    with pytest.raises(ConfigError, match="rho"):
        make_cfg("algorithm.name=harmofl", "algorithm.rho=0")
    with pytest.raises(ConfigError, match="decay"):
        make_cfg("algorithm.name=fedavg", "augment=[{name: ampnorm, decay: 0}]")
    with pytest.raises(ConfigError, match="init.*'zero' with amplitude='released'"):
        make_cfg(
            "algorithm.name=fedavg", "augment=[{name: ampnorm, amplitude: released, init: zero}]"
        )
    make_cfg("algorithm.name=harmofl", "algorithm.rho=0", "algorithm.perturbation=false")


# ----------------------------------------------------------------------------- held-out client
def test_held_out_client_normalises_with_the_global_amplitude(make_cfg, tmp_path):
    """Sec. 3.2: the global amplitude harmonises any client's images; a client that never
    trains (federation.holdout) has no amplitude of its own and must use the global one."""
    cfg = make_cfg("algorithm.name=harmofl", "federation.holdout=[client2]", rounds=2)
    sim = Simulation(cfg, tmp_path / "h", None, False)
    held = sim.states["client2"]["aug/ampnorm"]
    assert sim.algo.eval_broadcast(sim.server, "client2").records == {}  # none before round 1
    sim.run()
    server = sim.server["aug/ampnorm"]["amplitude"]
    assert held["running"] is None and torch.equal(held["global"], server)
    aug = sim.algo.augments[0]
    x = torch.rand(2, 3, 28, 28, generator=torch.Generator().manual_seed(7))
    assert torch.allclose(aug.eval_batch(x, held), rebuild(x, server))
    # the evaluation copy is not traffic of the training protocol
    assert not [r for r in sim.ledger.rows if r[1] == "client2"]


# ----------------------------------------------------------------------------- BN policy
def _unet(bn: str):
    from fedshift.models import build_model

    return build_model({"name": "unet", "width": 4, "bn": bn}, 2, (3, 16, 16), "segmentation")


def _build(name: str, model, **params):
    entry = ALGORITHMS.entry(name)
    return entry.obj(entry.params(**params), TrainConfig(), FederationConfig(), model, 2)


def test_fedbn_without_bn_tensors_fails_and_with_standard_bn_works(make_cfg, tmp_path):
    """model.bn=harmofl (affine=False, no running statistics) leaves FedBN nothing to keep
    local: it would silently run FedAvg. It must fail, naming the model and the fix."""
    with pytest.raises(ConfigError, match=r"'fedbn'.*UNet.*model\.bn=standard"):
        _build("fedbn", _unet("harmofl"))
    with pytest.raises(ConfigError, match="bn_policy='stats-local'.*running statistics"):
        _build("fedavg", _unet("harmofl"), bn_policy="stats-local")
    model = _unet("standard")
    algo = _build("fedbn", model)
    assert algo.local_keys and algo.local_keys == bn_keys(model, "local")
    assert not _build("harmofl", _unet("harmofl")).local_keys  # global policy: no check
    with pytest.raises(ConfigError, match="has no batch-norm layer"):
        Simulation(make_cfg("algorithm.name=fedbn", "model.bn=false"), tmp_path / "b", None, False)


# ----------------------------------------------------------------------------- Adam betas
def test_adam_betas_config_key(make_cfg):
    from fedshift.algorithms.base import build_optimizer

    p = [nn.Parameter(torch.zeros(2))]
    assert build_optimizer(p, TrainConfig(optimizer="adam")).param_groups[0]["betas"] == (
        0.9,
        0.999,
    )  # torch's default: nothing else changes
    opt = build_optimizer(p, TrainConfig(optimizer="adam", betas=[0.9, 0.99], weight_decay=1e-4))
    assert opt.param_groups[0]["betas"] == (0.9, 0.99)
    assert opt.param_groups[0]["weight_decay"] == 1e-4
    assert make_cfg("train.optimizer=adam", "train.betas=[0.9,0.99]").train.betas == [0.9, 0.99]
    with pytest.raises(ConfigError, match="train.betas.*Adam only"):
        make_cfg("train.betas=[0.9,0.99]")
    with pytest.raises(ConfigError, match="train.betas.*two numbers"):
        make_cfg("train.optimizer=adam", "train.betas=[0.9]")


# ----------------------------------------------------------------------------- App. C aug
def test_rot90_flip_by_hand_and_labels_follow():
    from fedshift.augment.geometric import Rot90Flip, Rot90FlipParams, rot90_flip

    img = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    x, y = img.expand(4, 1, 2, 2).clone(), img.long().expand(4, 2, 2).clone()
    turns = torch.tensor([0, 1, 2, 0])
    flips = torch.tensor([False, False, True, True])
    vertical = torch.tensor([False, False, True, False])
    out, lab = rot90_flip(x, y, turns, flips, vertical)
    assert torch.equal(out[0, 0], img)
    assert torch.equal(out[1, 0], torch.tensor([[2.0, 4.0], [1.0, 3.0]]))  # 90 deg ccw
    assert torch.equal(out[2, 0], torch.tensor([[2.0, 1.0], [4.0, 3.0]]))  # 180, then up-down
    assert torch.equal(out[3, 0], torch.tensor([[2.0, 1.0], [4.0, 3.0]]))  # left-right
    assert torch.equal(lab.float(), out[:, 0])  # label maps get the same transform
    aug = Rot90Flip(Rot90FlipParams(), 0, 2)
    many = img.expand(400, 1, 2, 2).clone()
    got = aug.train_batch(many, torch.zeros(400), {}, torch.Generator().manual_seed(0))[0]
    again = aug.train_batch(many, torch.zeros(400), {}, torch.Generator().manual_seed(0))[0]
    assert torch.equal(got, again)  # deterministic in the batch generator
    assert len({tuple(t.flatten().tolist()) for t in got}) == 8  # all symmetries of the square
    with pytest.raises(ValueError, match="square"):
        aug.train_batch(torch.zeros(1, 1, 2, 3), torch.zeros(1), {}, torch.Generator())


# ----------------------------------------------------------------------------- suites
SUITES = ROOT / "configs" / "suites"


@pytest.mark.parametrize(
    "suite",
    [
        "harmofl_table1_prostate",
        "harmofl_table1_nuclei",
        "harmofl_table2_camelyon",
        "harmofl_table1",
    ],
)
def test_table_suites_give_fedbn_standard_bn(suite):
    """Every cell's BN policy finds tensors (FedBN gets standard BN); the others run
    HarmoFL's BN; the paper's uniform weighting is explicit (Alg. 1, equal-sized clients)."""
    from fedshift.algorithms.base import require_bn_tensors
    from fedshift.bench import plan

    cells = plan(SUITES / f"{suite}.yaml")
    for c in cells:
        name, bn = c.cfg.algorithm.name, c.cfg.model.params.bn
        assert bn == ("standard" if name == "fedbn" else "harmofl"), (name, bn)
        assert c.cfg.federation.weighting == "uniform"
    models = {}
    for c in cells:
        key = (c.cfg.model.name, c.cfg.model.params.bn)
        if key not in models and c.cfg.model.name == "unet":
            models[key] = _unet(c.cfg.model.params.bn)
        if key in models:
            require_bn_tensors(c.cfg.algorithm.name, c.cfg.algorithm.params.bn_policy, models[key])
    if suite != "harmofl_table2_camelyon":
        t = cells[0].cfg.train
        assert (t.optimizer, t.betas, t.weight_decay) == ("adam", [0.9, 0.99], 1e-4)
        assert t.optimizer_state == "persist"
        augment = [] if suite == "harmofl_table1_nuclei" else ["rot90_flip"]
        assert [a.name for a in cells[0].cfg.augment] == augment


def test_sweep_cell_sets_keys_together():
    from fedshift.core.config_tree import expand_sweep

    raw = {
        "model": {"name": "unet", "bn": "harmofl"},
        "sweep": {
            "cell": [
                {"algorithm.name": "harmofl"},
                {"algorithm.name": "fedbn", "model.bn": "standard"},
            ],
            "seed": [0, 1],
        },
    }
    out = expand_sweep(raw)
    got = [(o["algorithm"]["name"], o["model"]["bn"], o["seed"]) for o in out]
    assert got == [
        ("harmofl", "harmofl", 0),
        ("harmofl", "harmofl", 1),
        ("fedbn", "standard", 0),
        ("fedbn", "standard", 1),
    ]
    assert raw["model"]["bn"] == "harmofl"  # the base is not modified
    with pytest.raises(ConfigError, match="sweep key 'cell'.*mapping"):
        expand_sweep({"sweep": {"cell": ["fedbn"]}})


@pytest.mark.parametrize(
    ("suite", "source", "clients"),
    [
        ("harmofl_start_digits", "unseen_sites_digits", {80}),
        ("harmofl_start_brain", "brain_mri_table", None),
        ("harmofl_start_unseen_brain", "unseen_sites_brain_mri", {10, 25}),
    ],
)
def test_start_suites_repeat_their_source_cells_but_for_the_start(suite, source, clients):
    """The harmofl_start suites' headers say their FedAvg and HarmoFL cells are those of the
    suite they re-test (unseen_sites_digits at 80 clients, brain_mri_table,
    unseen_sites_brain_mri at 10 and 25 clients; the suite name aside), and that their one new row
    differs from HarmoFL's only in the running amplitude's start (Eq. 3: the paper's zero,
    the released code's first batch)."""
    import dataclasses

    from fedshift.bench import plan

    def key(cell):
        return dataclasses.replace(cell.cfg, name="", out="", sweep=None)

    ours = plan(SUITES / f"{suite}.yaml")
    theirs = plan(SUITES / f"{source}.yaml")
    base = [key(c) for c in theirs if clients is None or c.cfg.partition.params.clients in clients]
    same = [c for c in ours if key(c) in base]
    new = [c for c in ours if key(c) not in base]
    counts = sorted(clients) if clients else [None]

    def part(cell):
        return cell.cfg.partition.params.clients if clients else None

    assert sorted((c.cfg.algorithm.name, c.cfg.seed, part(c)) for c in same) == sorted(
        (a, s, n) for a in ("fedavg", "harmofl") for s in (0, 1, 2) for n in counts
    )
    assert len(new) == 3 * len(counts)
    zeros = [key(z) for z in same if z.cfg.algorithm.name == "harmofl"]
    assert all(z.augment[0].params.init == "auto" for z in zeros)  # the paper's zero start
    backs = []
    for c in new:
        (amp,) = c.cfg.augment
        assert (c.cfg.algorithm.name, amp.name, amp.params.init) == ("harmofl", "ampnorm", "first")
        auto = dataclasses.replace(amp, params=dataclasses.replace(amp.params, init="auto"))
        back = dataclasses.replace(c.cfg, augment=[auto])
        backs.append(dataclasses.replace(back, name="", out="", sweep=None))
    assert sorted(map(repr, backs)) == sorted(map(repr, zeros))  # one zero-start twin each
