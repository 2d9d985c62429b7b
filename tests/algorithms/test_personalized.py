"""MOON, pFedMe, FedAvg + fine-tuning (pfedavg) and PartialFed-Fix: equations on tiny tensors,
equivalences with FedAvg, partial initialisation, end-to-end runs and resume."""

from __future__ import annotations

import math
from collections import OrderedDict

import pytest
import torch
import torch.nn.functional as F
from support.same_run import assert_same_run
from torch import nn

from fedshift.algorithms.moon import contrastive_loss
from fedshift.algorithms.pfedme import PFedMe, PFedMeParams, blend, inner_step, outer_step
from fedshift.core.config import FederationConfig, TrainConfig
from fedshift.core.context import ClientContext, InputPipeline
from fedshift.core.errors import ConfigError
from fedshift.core.federation import ClientData, Split
from fedshift.core.payload import Payload
from fedshift.models.base import FedModel
from fedshift.runtime.simulation import (
    Simulation,
    run_experiment,
)

SMALL = (
    "dataset.train_size=24",
    "dataset.val_size=8",
    "dataset.test_size=8",
    "train.local_steps=2",
)


def small(make_cfg, *over: str, rounds: int = 2):
    return make_cfg(*SMALL, *over, rounds=rounds)


def assert_same_tensors(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


# ----------------------------------------------------------------------------------- MOON
def test_moon_contrastive_loss_matches_hand_computation():
    z = torch.tensor([[1.0, 0.0], [3.0, 4.0]])
    z_glob = torch.tensor([[1.0, 1.0], [4.0, 3.0]])  # cos = 1/sqrt(2) and 24/25
    z_prev = torch.tensor([[0.0, 1.0], [-3.0, -4.0]])  # cos = 0 and -1
    tau = 0.5
    # -log(e^{a/tau} / (e^{a/tau} + e^{b/tau})) = log(1 + e^{(b - a)/tau}), mean over rows
    rows = [
        math.log(1 + math.exp((0.0 - 1 / math.sqrt(2)) / tau)),
        math.log(1 + math.exp((-1.0 - 0.96) / tau)),
    ]
    got = contrastive_loss(z, z_glob, z_prev, tau)
    assert got.item() == pytest.approx(sum(rows) / 2, rel=1e-6)
    # z_glob == z_prev: the two logits are equal, the loss is log 2 whatever z is
    assert contrastive_loss(z, z_glob, z_glob.clone(), tau).item() == pytest.approx(math.log(2))
    # no previous model (first round): only the positive logit, loss 0
    assert contrastive_loss(z, z_glob, None, tau).item() == pytest.approx(0.0, abs=1e-7)


def test_moon_mu0_equals_fedavg_and_mu_changes_training(make_cfg, tmp_path):
    over = ("algorithm.projection=false", "train.momentum=0.5")
    runs = {}
    for name, algo in (
        ("fedavg", ["algorithm.name=fedavg", "train.momentum=0.5"]),
        ("moon0", ["algorithm.name=moon", "algorithm.mu=0", *over]),
        ("moon5", ["algorithm.name=moon", "algorithm.mu=5", *over]),
    ):
        sim = Simulation(small(make_cfg, *algo), tmp_path / name, progress=False)
        for rnd in (1, 2):  # round 2 has a previous model: the contrastive branch runs
            sim.run_round(rnd)
        runs[name] = sim
    assert_same_tensors(runs["moon0"].server["weights"], runs["fedavg"].server["weights"])
    w5, wa = runs["moon5"].server["weights"], runs["fedavg"].server["weights"]
    assert any(not torch.equal(w5[k], wa[k]) for k in wa)


def test_moon_keeps_previous_local_model_and_frozen_features_use_eval_mode(make_cfg, tmp_path):
    sim = Simulation(
        small(make_cfg, "algorithm.name=moon", "algorithm.projection=false"),
        tmp_path / "m",
        progress=False,
    )
    up = sim.client_round(1, "client0")
    prev = sim.states["client0"]["prev"]
    assert_same_tensors(prev, up["weights"])  # bn_policy global: the whole trained model
    algo = sim.algo.algorithm
    model = sim.model
    model.train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.rand(5, 3, 28, 28)
    data, cpu = sim.train_clients["client0"], torch.device("cpu")
    ctx = ClientContext(
        "client0", 2, data, model, sim.cfg.train, sim.pipeline, torch.Generator(), cpu
    )
    got = algo.frozen_features(ctx, prev, x)
    ref = type(model)(num_classes=10)
    ref.load_state_dict(prev)
    ref.eval()
    with torch.no_grad():
        want = ref.features(x)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert model.training  # mode restored
    assert_same_tensors(model.state_dict(), before)  # working weights untouched
    # round 2: z_glob from the received global model, z_prev from the client's own last model
    replies = [("client0", up)] + [(c, sim.client_round(1, c)) for c in ("client1", "client2")]
    sim.algo.aggregate(sim.server, 1, replies)
    seen: list[dict] = []
    orig = algo.frozen_features

    def spy(ctx, tensors, x):
        seen.append({k: v.clone() for k, v in tensors.items()})
        return orig(ctx, tensors, x)

    algo.frozen_features = spy
    glob = {k: v.clone() for k, v in sim.server["weights"].items()}
    sim.client_round(2, "client0")
    assert len(seen) == 2 * sim.cfg.train.local_steps
    for i in range(0, len(seen), 2):  # frozen: the same tensors at every step
        assert_same_tensors(seen[i], glob)
        assert_same_tensors(seen[i + 1], prev)
    assert any(not torch.equal(glob[k], prev[k]) for k in glob)


def test_moon_projection_head_is_part_of_the_shared_model(make_cfg, tmp_path):
    sim = Simulation(
        small(make_cfg, "algorithm.name=moon", "algorithm.projection_dim=16"),
        tmp_path / "p",
        progress=False,
    )
    init = {k: v.clone() for k, v in sim.server["weights"].items()}
    proj = [k for k in init if k.startswith("embed.proj.")]
    assert proj and init["classifier.weight"].shape == (10, 16)
    x = torch.rand(4, 3, 28, 28)
    assert sim.model.features(x).shape == (4, 16)
    up = sim.client_round(1, "client0")
    assert set(proj) <= set(up["weights"])  # sent
    assert all(not torch.equal(up["weights"][k], init[k]) for k in proj)  # trained
    sim.run_round(2)
    assert sim.algo.has_global_model and not sim.algo.has_personal_model


# ----------------------------------------------------------------------------------- pFedMe
def test_pfedme_update_rules_by_hand():
    theta = [torch.tensor([1.0, -2.0])]
    w = [torch.tensor([0.5, 0.0])]
    g = [torch.tensor([0.2, 0.4])]
    inner_step(theta, g, w, lr=0.1, lam=15.0, l2=0.0)
    # theta - 0.1 * (g + 15 (theta - w)) = [1 - 0.1 (0.2 + 7.5), -2 - 0.1 (0.4 - 30)]
    torch.testing.assert_close(theta[0], torch.tensor([0.23, 0.96]))
    theta = [torch.tensor([1.0, -2.0])]
    inner_step(theta, g, w, lr=0.1, lam=15.0, l2=0.5)  # released code's extra mu * theta
    torch.testing.assert_close(theta[0], torch.tensor([0.23 - 0.05, 0.96 + 0.1]))
    wi = [torch.tensor([0.5, 0.0])]
    outer_step(wi, [torch.tensor([0.23, 0.96])], eta=0.01, lam=15.0)
    # w - 0.01 * 15 * (w - theta) = [0.5 - 0.15 * 0.27, 0 - 0.15 * (-0.96)]
    torch.testing.assert_close(wi[0], torch.tensor([0.4595, 0.144]))
    prev, avg = torch.tensor([1.0, 2.0]), torch.tensor([3.0, 1.0])
    torch.testing.assert_close(blend(prev, avg, 2.0), torch.tensor([5.0, 0.0]))  # -w + 2 avg
    torch.testing.assert_close(blend(prev, avg, 0.5), torch.tensor([2.0, 1.5]))
    assert torch.equal(blend(prev, avg, 1.0), avg)


class _Tiny(FedModel):
    """Linear classifier on a 1x1x2 image: features = flattened input."""

    def __init__(self) -> None:
        super().__init__()
        self.stages = nn.ModuleDict(OrderedDict(s=nn.Identity()))
        self.embed = nn.Identity()
        self.classifier = nn.Linear(2, 2)


def _tiny_ctx(model: FedModel, train: TrainConfig) -> tuple[ClientContext, Split]:
    x = torch.tensor([[[[0.5, -1.0]]], [[[2.0, 0.3]]]])
    split = Split(x, torch.tensor([0, 1]))
    data = ClientData("c", split, split, split)
    pipe = InputPipeline([], lambda t: t)
    ctx = ClientContext("c", 1, data, model, train, pipe, torch.Generator(), torch.device("cpu"))
    return ctx, split


def test_pfedme_local_update_one_step_matches_hand_computation():
    torch.manual_seed(0)
    model = _Tiny()
    train = TrainConfig(lr=0.05, batch_size=2, local_steps=1)
    params = PFedMeParams(lam=15.0, k=2, personal_lr=0.02)
    algo = PFedMe(params, train, FederationConfig(), model, 1)
    w0 = {k: v.clone() for k, v in model.state_dict().items()}
    ctx, split = _tiny_ctx(model, train)
    state = algo.init_client("c", None, model)
    up = algo.local_update(ctx, Payload({"weights": w0}), state)

    def grad(t: dict) -> dict:  # gradient of the batch loss at weights t
        m = _Tiny()
        m.load_state_dict(t)
        loss = F.cross_entropy(m(split.x), split.y)
        return dict(zip(t, torch.autograd.grad(loss, list(m.parameters())), strict=True))

    lam, plr, eta = 15.0, 0.02, 0.05
    g0 = grad(w0)
    th1 = {k: w0[k] - plr * g0[k] for k in w0}  # theta starts at w: prox term 0
    g1 = grad(th1)
    th2 = {k: th1[k] - plr * (g1[k] + lam * (th1[k] - w0[k])) for k in w0}
    w1 = {k: w0[k] - eta * lam * (w0[k] - th2[k]) for k in w0}  # Eq. 8
    for k in w0:
        torch.testing.assert_close(up["weights"][k], w1[k])
        torch.testing.assert_close(state["personal"][k], th2[k])
    assert up.metrics["steps"] == 1


def test_pfedme_server_blends_parameters_and_averages_buffers(make_cfg, tmp_path):
    sim = Simulation(
        small(make_cfg, "algorithm.name=pfedme", "algorithm.beta=2"), tmp_path / "b", progress=False
    )
    algo = sim.algo.algorithm
    w_t = {k: v.clone() for k, v in sim.server["weights"].items()}
    replies = [(cid, sim.client_round(1, cid)) for cid in ("client0", "client1", "client2")]
    avg = algo.average_record(replies, "weights")
    algo.aggregate(sim.server, 1, replies)
    new = sim.server["weights"]
    for k in algo.shared_param_keys:
        torch.testing.assert_close(new[k], -w_t[k] + 2 * avg[k])
    assert algo.shared_buffer_keys
    for k in algo.shared_buffer_keys:
        assert torch.equal(new[k], avg[k])


def test_config_checks(make_cfg):
    with pytest.raises(ConfigError, match="tau"):
        make_cfg("algorithm.name=moon", "algorithm.tau=0")
    with pytest.raises(ConfigError, match="finetune_epochs"):
        make_cfg("algorithm.name=pfedavg", "algorithm.finetune_epochs=-1")
    with pytest.raises(ConfigError, match="local_layers"):
        make_cfg("algorithm.name=partialfed", "algorithm.local_layers=[]")
    with pytest.raises(ConfigError, match="momentum"):
        make_cfg("algorithm.name=pfedme", "train.momentum=0.9")
    with pytest.raises(ConfigError, match="sgd"):
        make_cfg("algorithm.name=pfedme", "train.optimizer=adam")
    with pytest.raises(ConfigError, match="algorithm.k"):
        make_cfg("algorithm.name=pfedme", "algorithm.k=0")


# -------------------------------------------------------------------------- FedAvg + FT
def test_pfedavg_uploads_fedavg_weights_and_finetunes_off_the_ledger(make_cfg, tmp_path):
    sims = {}
    for name in ("fedavg", "pfedavg"):
        sim = Simulation(
            small(make_cfg, f"algorithm.name={name}", "train.momentum=0.5"),
            tmp_path / name,
            progress=False,
        )
        metrics = [sim.run_round(r) for r in (1, 2)]
        sims[name] = (sim, metrics)
    fa, pa = sims["fedavg"][0], sims["pfedavg"][0]
    assert_same_tensors(pa.server["weights"], fa.server["weights"])
    assert pa.ledger.rows == fa.ledger.rows  # fine-tuning costs no bytes
    assert all(m["finetune_steps"] == 2 for m in sims["pfedavg"][1][1].values())
    g = pa.algo.global_weights(pa.server)
    for cid in pa.train_clients:
        personal = pa.algo.personal_weights(pa.server, pa.states[cid])
        assert any(not torch.equal(personal[k], g[k]) for k in g)
    up = pa.client_round(3, "client0")  # the working model is left at the trained weights
    assert_same_tensors(pa.model.state_dict(), up["weights"])


def test_pfedavg_personal_model_comes_from_the_received_global(make_cfg, tmp_path):
    """With no fine-tuning the personal model at round t is exactly w_{t-1}."""
    sim = Simulation(
        small(make_cfg, "algorithm.name=pfedavg", "algorithm.finetune_epochs=0"),
        tmp_path / "r",
        progress=False,
    )
    sim.run_round(1)
    w1 = {k: v.clone() for k, v in sim.server["weights"].items()}
    sim.run_round(2)
    assert_same_tensors(sim.algo.personal_weights(sim.server, sim.states["client1"]), w1)


# ----------------------------------------------------------------------------- PartialFed
def test_partialfed_initialises_local_layers_from_previous_local_model(make_cfg, tmp_path):
    sim = Simulation(
        small(make_cfg, "algorithm.name=partialfed", "algorithm.local_layers=[bn, conv2]"),
        tmp_path / "pf",
        progress=False,
    )
    algo = sim.algo.algorithm
    keys = algo.partial_keys
    bn = {"stages.conv1.bn.weight", "stages.conv1.bn.running_var", "embed.fc1.bn.bias"}
    assert bn <= set(keys) and any(k.startswith("stages.conv2.conv.") for k in keys)
    assert not any(k.startswith("stages.conv1.conv.") or k.startswith("classifier.") for k in keys)
    starts: dict[str, dict] = {}
    orig = algo.local_train

    def spy(ctx, state):
        starts[ctx.cid] = {k: v.clone() for k, v in ctx.model.state_dict().items()}
        return orig(ctx, state)

    algo.local_train = spy
    sim.run_round(1)
    # round 1: no previous model, everything from the (initial) global model
    init = Simulation(small(make_cfg, "algorithm.name=fedavg"), tmp_path / "i", progress=False)
    assert_same_tensors(starts["client0"], init.server["weights"])
    prev = {cid: {k: v.clone() for k, v in s["model"].items()} for cid, s in sim.states.items()}
    glob = {k: v.clone() for k, v in sim.server["weights"].items()}
    sim.run_round(2)
    for cid, start in starts.items():
        for k, v in start.items():
            want = prev[cid][k] if k in keys else glob[k]
            assert torch.equal(v, want), (cid, k)
        assert any(not torch.equal(prev[cid][k], glob[k]) for k in keys)  # a real difference
    # personal model = the whole local model after the last update
    state = sim.states["client2"]
    assert_same_tensors(sim.algo.personal_weights(sim.server, state), state["model"])


def test_partialfed_rejects_unknown_layers(make_cfg, tmp_path):
    with pytest.raises(ConfigError, match="selects no tensor"):
        Simulation(
            small(make_cfg, "algorithm.name=partialfed", "algorithm.local_layers=[nope]"),
            tmp_path / "x",
            progress=False,
        )


def test_partialfed_adaptive_gates_are_per_layer_and_learned_from_the_loss(
    make_cfg, tmp_path, monkeypatch
):
    """PartialFed-Adaptive: each layer of each client starts from w_global or w_prev by its
    own hard gate, and the gate logits move by the straight-through gradient
    dL/dalpha_l = <dL/dw_l, w_global,l - w_prev,l> s_l (1 - s_l) / temperature."""
    import fedshift.algorithms.partialfed as pf

    sim = Simulation(
        small(make_cfg, "algorithm.name=partialfed", "algorithm.strategy=adaptive"),
        tmp_path / "pfa",
        progress=False,
    )
    algo = sim.algo.algorithm
    units = algo.units
    assert len(units) > 3 and "classifier" in "".join(units)
    starts, first_grads, softs = {}, {}, {}
    orig_train, orig_step, orig_gates = algo.local_train, algo.before_step, pf.relaxed_gates

    def spy_train(ctx, state):
        starts[ctx.cid] = {k: v.clone() for k, v in ctx.model.state_dict().items()}
        return orig_train(ctx, state)

    def spy_step(ctx):
        if ctx.cid not in first_grads:
            first_grads[ctx.cid] = {n: p.grad.clone() for n, p in ctx.model.named_parameters()}
        return orig_step(ctx)

    def spy_gates(alpha, temperature, gen):
        soft, hard = orig_gates(alpha, temperature, gen)
        softs[len(softs)] = soft
        return soft, hard

    monkeypatch.setattr(algo, "local_train", spy_train)
    monkeypatch.setattr(algo, "before_step", spy_step)
    monkeypatch.setattr(pf, "relaxed_gates", spy_gates)
    sim.run_round(1)  # no previous model: everything global, nothing learned yet
    assert all(torch.all(s["alpha"] == 0) and s["gates"] is None for s in sim.states.values())
    prev = {cid: {k: v.clone() for k, v in s["model"].items()} for cid, s in sim.states.items()}
    glob = {k: v.clone() for k, v in sim.server["weights"].items()}
    starts.clear()
    first_grads.clear()
    sim.run_round(2)
    all_gates = []
    for i, (cid, state) in enumerate(sim.states.items()):
        gates = state["gates"].tolist()
        all_gates += gates
        for g, keys in zip(gates, units.values(), strict=True):
            for k in keys:  # the unit's tensors all come from the source its gate picked
                assert torch.equal(starts[cid][k], glob[k] if g else prev[cid][k]), (cid, k)
        soft = softs[i]
        want = []
        for keys in units.values():
            dg = sum(
                float((first_grads[cid][k].double() * (glob[k] - prev[cid][k]).double()).sum())
                for k in keys
                if k in first_grads[cid]
            )
            want.append(dg)
        want = -algo.params.strategy_lr * torch.tensor(want, dtype=torch.float64)
        want = want * soft * (1 - soft) / algo.params.temperature
        assert torch.allclose(state["alpha"], want, rtol=1e-6, atol=1e-12), cid
        assert state["alpha"].abs().max() > 0 and len(set(state["alpha"].tolist())) > 1
    assert 0 in all_gates and 1 in all_gates  # the choice differs between layers


def test_partialfed_fix_is_the_default_and_adaptive_keeps_fedavg_traffic(make_cfg, tmp_path):
    sim = Simulation(small(make_cfg, "algorithm.name=partialfed"), tmp_path / "f", progress=False)
    assert sim.algo.algorithm.params.strategy == "fix" and "alpha" not in sim.states["client0"]
    res = run_experiment(
        small(make_cfg, "algorithm.name=partialfed", "algorithm.strategy=adaptive"),
        run_dir=tmp_path / "a",
        progress=False,
    )
    assert set(res.summary["bytes_by_record"]["up"]) == {"weights"}  # gates never travel


# ------------------------------------------------------------------------------ pFedHN-PC
def test_pfedhn_pc_head_stays_on_the_client_and_the_hypernetwork_generates_the_rest(
    make_cfg, tmp_path
):
    """pFedHN-PC: the hypernetwork generates the feature extractor only; each client's
    classifier head is trained locally, kept in its state and never sent."""
    cfg = small(make_cfg, "algorithm.name=pfedhn", "algorithm.variant=pc")
    sim = Simulation(cfg, tmp_path / "pc", progress=False)
    algo = sim.algo.algorithm
    params = [n for n, _ in sim.model.named_parameters()]
    head = [k for k in params if k.startswith("classifier.")]
    assert head and set(algo.param_keys) == set(params) - set(head)
    assert not any(k.startswith("classifier.") for k in algo.hnet.shapes)
    assert set(head) <= set(algo.local_keys)
    before = {cid: {k: s["local"][k].clone() for k in head} for cid, s in sim.states.items()}
    sim.run_round(1)
    down = algo.broadcast(sim.server, 2, "client0")
    assert set(down["weights"]) == set(algo.param_keys)  # nothing of the head goes down
    up_records = sim.ledger.by_record()["up"]
    assert set(up_records) == {"delta"}
    for cid, state in sim.states.items():  # trained locally, differs per client
        assert any(not torch.equal(state["local"][k], before[cid][k]) for k in head), cid
        personal = sim.algo.personal_weights(sim.server, state)
        for k in head:
            assert torch.equal(personal[k], state["local"][k])
    a, b = (sim.states[c]["local"][head[0]] for c in ("client0", "client1"))
    assert not torch.equal(a, b)
    full = Simulation(small(make_cfg, "algorithm.name=pfedhn"), tmp_path / "f", progress=False)
    assert set(full.algo.algorithm.param_keys) == set(params)  # variant=full generates the head


# --------------------------------------------------------------------------- end to end
@pytest.mark.parametrize(
    ("algo", "kinds"),
    [
        ("moon", ["global"]),
        ("pfedme", ["global", "personal"]),
        ("pfedavg", ["global", "personal"]),
        ("partialfed", ["global", "personal"]),
    ],
)
def test_end_to_end_two_rounds(make_cfg, tmp_path, algo, kinds):
    res = run_experiment(
        small(make_cfg, f"algorithm.name={algo}"), run_dir=tmp_path / algo, progress=False
    )
    s = res.summary
    assert sorted(s["models"]) == kinds
    assert s["evaluated_model"] == ("global" if algo == "moon" else "personal")
    assert set(s["bytes_by_record"]["up"]) == {"weights"}
    assert (tmp_path / algo / "summary.json").is_file()


@pytest.mark.parametrize("algo", ["moon", "pfedme"])
def test_killed_then_resumed_equals_uninterrupted(make_cfg, tmp_path, algo):
    """MOON's previous local model and pFedMe's personal model survive a kill after round 3
    (checkpoint of round 2) with sampled clients."""
    cfg = small(
        make_cfg,
        f"algorithm.name={algo}",
        "checkpoint.every=2",
        "federation.sample_fraction=0.67",
        "train.local_steps=1",
        rounds=4,
    )
    assert_same_run(cfg, tmp_path, stop_after=3)
