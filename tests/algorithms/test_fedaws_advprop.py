"""FedAwS (spreadout, positive-only clients), AdvProp (auxiliary BNs, PGD) and pFedHN
(hypernetwork, delta-theta server step): hand-computed equations on tiny tensors, the payload
contents, and 2-round end-to-end runs on toyshift."""

from __future__ import annotations

import copy
import json
import math
from collections import OrderedDict

import pytest
import torch
import torch.nn.functional as F
from support.replies import reply
from support.same_run import assert_same_run
from torch import nn

from fedshift.algorithms.advprop import (
    AdvProp,
    AdvPropParams,
    auxiliary_bn,
    dual_layers,
    pgd_attack,
)
from fedshift.algorithms.base import bn_keys
from fedshift.algorithms.fedaws import (
    ClassEmbeddings,
    positive_loss,
    spreadout,
    spreadout_step,
    unit_distances,
)
from fedshift.algorithms.pfedhn import HyperNetwork, PFedHN, PFedHNParams
from fedshift.core.config import FederationConfig, InputConfig, TrainConfig
from fedshift.core.context import ClientContext, InputPipeline, Normalize
from fedshift.core.errors import ConfigError
from fedshift.core.federation import ClientData, Split
from fedshift.core.seeding import generator
from fedshift.models.base import FedModel
from fedshift.models.digits import SmallCNN
from fedshift.runtime.rundir.checkpoint_io import read_checkpoint
from fedshift.runtime.simulation import Simulation

TINY = ("model.name=cnn", "model.width=4")
ONE_CLASS = ("dataset.classes=3", "partition.name=one-class")


def _sim(make_cfg, tmp_path, *over: str, rounds: int = 2) -> Simulation:
    return Simulation(make_cfg(*TINY, *over, rounds=rounds), tmp_path / "run", None, False)


# ============================================================================ FedAwS
# three class embeddings in 2-d; row 0 is scaled by 2 (the regulariser normalises rows)
W3 = torch.tensor([[2.0, 0.0], [0.8, 0.6], [0.0, 1.0]], dtype=torch.float64)
D01, D12 = math.sqrt(0.4), math.sqrt(0.8)  # |(1,0)-(.8,.6)|, |(.8,.6)-(0,1)|; |(1,0)-(0,1)|=1.41


def test_spreadout_by_hand():
    assert torch.allclose(
        unit_distances(W3),
        torch.tensor([[0, D01, 2**0.5], [D01, 0, D12], [2**0.5, D12, 0]], dtype=torch.float64),
        atol=1e-6,
    )
    # nu = 1: pairs (0,1) and (1,2) violate the margin, (0,2) does not; both orders count
    want = 2 * ((1 - D01) ** 2 + (1 - D12) ** 2)
    assert float(spreadout(W3, 1.0)) == pytest.approx(want, rel=1e-9)
    # top-1 (each class's nearest other class): 0->1, 1->0, 2->1
    assert float(spreadout(W3, 1.0, topk=1)) == pytest.approx(
        2 * (1 - D01) ** 2 + (1 - D12) ** 2, rel=1e-9
    )
    assert float(spreadout(W3, 0.5)) == 0.0  # every pair is farther than 0.5


def test_server_spreadout_step_increases_the_minimum_distance():
    def min_dist(w):
        d = unit_distances(w)
        return float(d[~torch.eye(3, dtype=torch.bool)].min())

    w1 = spreadout_step(W3, nu=1.0, lr=0.05, weight=1.0, steps=1)
    assert min_dist(w1) > min_dist(W3) + 1e-3
    assert float(spreadout(w1, 1.0)) < float(spreadout(W3, 1.0))
    # one step is W - lr * lambda * grad reg_sp
    var = W3.clone().requires_grad_(True)
    (g,) = torch.autograd.grad(spreadout(var, 1.0), var)
    assert torch.allclose(w1, W3 - 0.05 * g, atol=1e-12)
    w5 = spreadout_step(W3, nu=1.0, lr=0.05, weight=1.0, steps=5)
    assert min_dist(w5) > min_dist(w1)
    assert torch.equal(spreadout_step(W3, 1.0, 0.05, 1.0, steps=0), W3)


def test_positive_losses_by_hand():
    cos = torch.tensor([1.0, 0.5, -0.2])
    assert float(positive_loss(cos, "squared-hinge", 0.9)) == pytest.approx(
        (0 + 0.4**2 + 1.1**2) / 3
    )
    assert float(positive_loss(cos, "distance", 0.9)) == pytest.approx((0 + 1.0 + 2.4) / 3)


def test_fedaws_model_logits_are_cosines_of_the_class_embeddings(make_cfg, tmp_path):
    sim = _sim(make_cfg, tmp_path, "algorithm.name=fedaws", *ONE_CLASS)
    model = sim.model
    assert isinstance(model.classifier, ClassEmbeddings)
    assert "classifier.bias" not in model.state_dict()
    x = torch.rand(4, 3, 28, 28)
    model.eval()
    z = model.features(x)
    want = F.normalize(z, dim=1) @ F.normalize(model.classifier.weight, dim=1).t()
    assert torch.allclose(model(x), want, atol=1e-6)
    # the client's loss is the positive-only squared hinge on the cosine to its own class
    y = torch.tensor([0, 1, 2, 1])
    algo = sim.algo.algorithm
    ctx = ClientContext(
        "client00",
        1,
        sim.fed.clients[0],
        model,
        sim.cfg.train,
        sim.pipeline,
        generator(0, "c"),
        torch.device("cpu"),
    )
    model.train()
    got = algo.loss(ctx, x, y)
    with torch.no_grad():
        cos = model(x).gather(1, y[:, None]).squeeze(1)
    assert float(got.detach()) == pytest.approx(float(((0.9 - cos).clamp_min(0) ** 2).mean()))
    # a Sequential head: its last linear layer becomes the class embeddings
    from fedshift.algorithms.fedaws import FedAwS

    m = SmallCNN(num_classes=3, width=4)
    m.classifier = nn.Sequential(
        OrderedDict(fc=nn.Linear(128, 16), relu=nn.ReLU(), out=nn.Linear(16, 3))
    )
    FedAwS.wrap_model(None, m, sim.fed)
    assert isinstance(m.classifier.out, ClassEmbeddings)
    assert "classifier.out.weight" in m.state_dict()


def test_client_sends_and_updates_only_the_rows_of_its_classes(make_cfg, tmp_path):
    sim = _sim(
        make_cfg, tmp_path, "algorithm.name=fedaws", "algorithm.spreadout_steps=0", *ONE_CLASS
    )
    algo, key = sim.algo.algorithm, "classifier.weight"
    w0 = sim.server["weights"][key].clone()
    for i, cid in enumerate(["client00", "client01", "client02"]):
        assert sim.fed.client(cid).train.y.unique().tolist() == [i]
        down = algo.broadcast(sim.server, 1, cid)
        assert key not in down["weights"]  # the matrix never travels whole
        assert down["class_embeddings"]["classes"].tolist() == [i]
        assert torch.equal(down["class_embeddings"]["weight"], w0[[i]])
    up = sim.client_round(1, "client01")
    rec = up["class_embeddings"]
    assert key not in up["weights"] and rec["classes"].tolist() == [1]
    assert rec["weight"].shape == (1, w0.shape[1])
    assert not torch.allclose(rec["weight"], w0[[1]])  # its own row was trained
    assert rec["counts"].tolist() == [len(sim.fed.client("client01").train)]
    enc = "embed.fc.weight"
    assert not torch.equal(up["weights"][enc], sim.server["weights"][enc])
    # the server (spreadout off) takes row 1 from its holder and keeps rows 0 and 2
    algo.aggregate(sim.server, 1, [("client01", up)])
    w1 = sim.server["weights"][key]
    assert torch.equal(w1[[0, 2]], w0[[0, 2]])
    assert torch.allclose(w1[[1]], rec["weight"], atol=1e-7)
    assert torch.equal(sim.server["weights"][enc], up["weights"][enc])


def test_server_averages_a_class_over_its_holders_then_spreads(make_cfg, tmp_path):
    over = ("algorithm.name=fedaws", "algorithm.spreadout_lr=0.1", "algorithm.nu=2.0")
    sim = _sim(make_cfg, tmp_path, *over, *ONE_CLASS)
    algo, key = sim.algo.algorithm, "classifier.weight"
    w0 = sim.server["weights"][key].clone()
    rows = [torch.randn(1, w0.shape[1]) for _ in range(2)]
    encoder = {k: sim.server["weights"][k] for k in algo.encoder_keys}
    replies = [
        reply(f"c{j}", n, weights=encoder, class_embeddings={
            "weight": rows[j], "classes": torch.tensor([2]), "counts": torch.tensor([n])})
        for j, n in enumerate((1, 3))
    ]  # fmt: skip
    algo.aggregate(sim.server, 1, replies)
    avg = w0.clone()
    avg[2] = (rows[0][0] * 1 + rows[1][0] * 3) / 4
    assert float(spreadout(avg, 2.0)) > 0  # every pair is within nu = 2: the step acts
    want = spreadout_step(avg, 2.0, 0.1, 10.0, 1)
    assert torch.allclose(sim.server["weights"][key], want, atol=1e-6)


def test_fedaws_end_to_end_one_class(make_cfg, tmp_path):
    cfg = make_cfg(*TINY, "algorithm.name=fedaws", *ONE_CLASS, rounds=2)
    sim = Simulation(cfg, tmp_path / "e2e", None, False)
    s = sim.run().summary
    assert json.loads((tmp_path / "e2e/summary.json").read_text())["algorithm"] == "fedaws"
    assert s["evaluated_model"] == "global" and s["dh"] == pytest.approx(100.0)
    d = sim.model.classifier.weight.shape[1]
    # down: each client's own row (+ its class index), up: the row, index and count
    assert s["bytes_by_record"]["down"]["class_embeddings"] == 2 * 3 * (4 * d + 8)
    assert s["bytes_by_record"]["up"]["class_embeddings"] == 2 * 3 * (4 * d + 16)


# ============================================================================ AdvProp
def _advprop(**kw) -> tuple[AdvProp, SmallCNN, ClientContext]:
    torch.manual_seed(0)
    model = SmallCNN(num_classes=3, width=4)
    AdvProp.wrap_model(None, model, None)
    train = TrainConfig(batch_size=8)
    algo = AdvProp(AdvPropParams(**kw), train, FederationConfig(), model, 1)
    g = torch.Generator().manual_seed(1)
    x = torch.rand(8, 3, 28, 28, generator=g)
    y = torch.arange(8) % 3
    split = Split(x, y)
    pipe = InputPipeline([], Normalize(InputConfig(), 3, torch.device("cpu")))
    ctx = ClientContext(
        "c",
        1,
        ClientData("c", split, split, split),
        model,
        train,
        pipe,
        generator(0, "c"),
        torch.device("cpu"),
    )
    return algo, model, ctx


def _xy(ctx):
    return ctx.pipeline.train(ctx.data.train.x, ctx.data.train.y, None, ctx.generator)


def _bn_buffers(model):
    return {k: v.clone() for k, v in model.state_dict().items() if "running" in k or "tracked" in k}


def test_dual_bn_keeps_main_keys_and_adds_auxiliary_ones():
    torch.manual_seed(0)
    plain = SmallCNN(num_classes=3, width=4)
    before = copy.deepcopy(plain.state_dict())
    AdvProp.wrap_model(None, plain, None)
    AdvProp.wrap_model(None, plain, None)  # idempotent
    after = plain.state_dict()
    for k, v in before.items():
        assert torch.equal(after[k], v)
    extra = set(after) - set(before)
    bns = ["stages.conv1.bn", "stages.conv2.bn", "embed.bn"]
    assert extra == {
        f"{b}.aux.{leaf}"
        for b in bns
        for leaf in ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")
    }
    assert set(plain.bn_layer_names()) == set(bns) | {f"{b}.aux" for b in bns}
    local = bn_keys(plain, "local")
    assert {k for k in after if ".bn." in k} == set(local)
    assert "stages.conv1.bn.aux.running_mean" in bn_keys(plain, "stats-local")


def test_adversarial_example_stays_in_the_ball_and_increases_the_loss():
    algo, model, ctx = _advprop(epsilon=8.0, step_size=2.0, iterations=5)
    x, y = _xy(ctx)
    model.train()
    stats = _bn_buffers(model)
    x_adv = algo.adversarial(ctx, x, y)
    # eps = 8/255 pixel levels = (8/255)/0.5 in normalised units, and the valid range [-1, 1]
    assert float((x_adv - x).abs().max()) <= 8 / 255 / 0.5 + 1e-6
    assert float((x_adv - x).abs().max()) > 8 / 255 / 0.5 - 1e-4
    assert float(x_adv.min()) >= -1 - 1e-6 and float(x_adv.max()) <= 1 + 1e-6
    assert all(p.grad is None for p in model.parameters())  # attack leaves no parameter grads
    after = _bn_buffers(model)
    assert all(torch.equal(after[k], v) for k, v in stats.items())  # no statistic recorded
    with torch.no_grad(), auxiliary_bn(model):
        clean = F.cross_entropy(model(x), y)
        adv = F.cross_entropy(model(x_adv), y)
    assert float(adv) > float(clean) + 1e-3


def test_adversarial_examples_are_generated_through_the_auxiliary_bns():
    algo, model, ctx = _advprop(epsilon=4.0, iterations=3)
    x, y = _xy(ctx)
    model.train()
    with torch.no_grad():  # make the auxiliary BNs differ from the main ones
        for m in dual_layers(model):
            m.aux.weight.uniform_(0.2, 3.0, generator=torch.Generator().manual_seed(5))
    x_adv = algo.adversarial(ctx, x, y)
    eps, step, lo, hi = algo.attack_scales(ctx, x)
    ref = copy.deepcopy(model)
    with auxiliary_bn(ref):
        via_aux = pgd_attack(ref, x, y, eps, step, 3, lo, hi)
    via_main = pgd_attack(copy.deepcopy(model), x, y, eps, step, 3, lo, hi)
    assert torch.equal(x_adv, via_aux)
    assert not torch.equal(x_adv, via_main)


def test_training_step_routes_clean_through_main_and_adversarial_through_auxiliary_bns():
    algo, model, ctx = _advprop()
    x, y = _xy(ctx)
    model.train()
    ref = copy.deepcopy(model)
    x_adv = algo.adversarial(ctx, x, y)
    # the paper's default attack: one step of 1 pixel level
    assert torch.allclose((x_adv - x).abs().max(), torch.tensor(1 / 255 / 0.5), atol=1e-6)
    loss = algo.loss(ctx, x, y)
    with torch.no_grad():
        clean = F.cross_entropy(ref(x), y)
        with auxiliary_bn(ref):
            adv = F.cross_entropy(ref(x_adv), y)
    assert float(loss.detach()) == pytest.approx(float(clean + adv), rel=1e-5)
    got, want = model.state_dict(), ref.state_dict()
    for k in _bn_buffers(model):
        assert torch.equal(got[k], want[k]), k
    # main statistics saw the clean batch only, auxiliary ones the adversarial batch only
    main, aux = "stages.conv1.bn.running_mean", "stages.conv1.bn.aux.running_mean"
    assert int(got["stages.conv1.bn.num_batches_tracked"]) == 1
    assert int(got["stages.conv1.bn.aux.num_batches_tracked"]) == 1
    assert not torch.allclose(got[main], got[aux])
    assert not torch.equal(got[aux], torch.zeros_like(got[aux]))


def test_evaluation_uses_the_main_bns():
    algo, model, ctx = _advprop()
    x, _ = _xy(ctx)
    model.eval()
    with torch.no_grad():
        before = model(x)
        for m in dual_layers(model):
            m.aux.weight.zero_()  # a different auxiliary BN must not change evaluation
        assert torch.equal(model(x), before)
        with auxiliary_bn(model):
            assert not torch.allclose(model(x), before)
    try:
        with auxiliary_bn(model):
            raise RuntimeError
    except RuntimeError:
        pass
    assert not any(m.use_aux for m in dual_layers(model))


def test_advprop_end_to_end(make_cfg, tmp_path):
    cfg = make_cfg(*TINY, "algorithm.name=advprop", "algorithm.bn_policy=stats-local")
    sim = Simulation(cfg, tmp_path / "a", None, False)
    s = sim.run().summary
    assert (tmp_path / "a/summary.json").is_file() and s["evaluated_model"] == "personal"
    assert "stages.conv1.bn.aux.running_var" in sim.algo.algorithm.local_keys
    assert "stages.conv1.bn.aux.weight" in sim.algo.algorithm.shared_keys
    with pytest.raises(ConfigError, match="batch-norm"):
        Simulation(
            make_cfg("algorithm.name=advprop", "model.bn=false"), tmp_path / "b", None, False
        )


# ============================================================================ pFedHN
class Tiny(FedModel):
    """conv 3->1 (1x1), global pool, linear 1->2: 8 parameters, no BN."""

    def __init__(self) -> None:
        super().__init__()
        self.stages = nn.ModuleDict(
            {"s": nn.Sequential(nn.Conv2d(3, 1, 1), nn.AdaptiveAvgPool2d(1))}
        )
        self.embed = nn.Identity()
        self.classifier = nn.Linear(1, 2)


def _pfedhn(**kw) -> tuple[PFedHN, Tiny]:
    torch.manual_seed(0)
    model = Tiny()
    params = PFedHNParams(embed_dim=2, hidden_dim=3, n_hidden=1, **kw)
    algo = PFedHN(params, TrainConfig(), FederationConfig(), model, 2)
    return algo, model


def test_hypernetwork_outputs_the_target_parameter_shapes():
    algo, model = _pfedhn()
    server = algo.init_server(model)
    algo.init_client("a", None, model)
    theta = algo.broadcast(server, 1, "a")["weights"]
    assert list(theta) == [k for k, _ in model.named_parameters()]
    for k, p in model.named_parameters():
        assert theta[k].shape == p.shape
    cnn = SmallCNN(num_classes=10, width=4)
    big = PFedHN(PFedHNParams(), TrainConfig(), FederationConfig(), cnn, 3)
    out = big.hnet(0)
    assert {k: v.shape for k, v in out.items()} == {k: p.shape for k, p in cnn.named_parameters()}
    assert big.local_keys == [k for k in cnn.state_dict() if "running" in k or "tracked" in k]
    assert big.hnet.embeddings.weight.shape == (3, 1)  # int(1 + 3 / 4)


def test_pfedhn_initial_output_is_the_target_models_init_by_default():
    """head_init=target: h(v; phi) starts at the model's own init (BN scales near 1), so a BN
    target's signal is not crushed; head_init=default (released nn.Linear init) starts every
    generated BN scale near 0."""
    torch.manual_seed(0)
    cnn = SmallCNN(num_classes=10, width=4)
    own = {k: p.detach().clone() for k, p in cnn.named_parameters()}
    scales = [k for k in own if k.endswith("bn.weight")]
    assert scales and all(torch.equal(own[k], torch.ones_like(own[k])) for k in scales)
    target = PFedHN(PFedHNParams(), TrainConfig(), FederationConfig(), cnn, 3)
    released = PFedHN(PFedHNParams(head_init="default"), TrainConfig(), FederationConfig(), cnn, 3)
    for row in range(3):
        out_t, out_r = target.hnet(row), released.hnet(row)
        for k in scales:
            assert (out_t[k] - 1).abs().mean() < 0.3, k  # around the model's 1
            assert out_r[k].abs().mean() < 0.3, k  # around 0: the released init
        # the bias carries the model's init; the rest is the client-dependent linear term
        head = target.hnet.heads[HyperNetwork.head_name(scales[0])]
        assert torch.equal(head.bias.detach(), own[scales[0]].reshape(-1))


def test_server_update_is_the_vector_jacobian_product():
    lr, elr = 0.1, 0.3
    algo, model = _pfedhn(server_momentum=0.0, server_weight_decay=0.0, server_lr=lr, embed_lr=elr)
    server = algo.init_server(model)
    for c in ("a", "b"):
        algo.init_client(c, None, model)
    theta = algo.broadcast(server, 1, "b")["weights"]
    g = torch.Generator().manual_seed(3)
    delta = {k: torch.randn(v.shape, generator=g) for k, v in theta.items()}  # theta~ - theta
    names = [n for n, _ in algo.hnet.named_parameters()]
    before = {n: p.detach().clone() for n, p in algo.hnet.named_parameters()}

    # the explicit Jacobian d theta_b / d(param) of the flattened output, for every parameter
    def flat_out(*params):
        out = torch.func.functional_call(algo.hnet, dict(zip(names, params, strict=True)), (1,))
        return torch.cat([out[k].flatten() for k in theta])

    jac = torch.autograd.functional.jacobian(flat_out, tuple(before.values()))
    vec = -torch.cat([delta[k].flatten() for k in theta])  # theta - theta~
    algo.aggregate(server, 1, [reply("b", 5, delta=delta)])
    after = dict(algo.hnet.named_parameters())
    for n, j in zip(names, jac, strict=True):
        grad = torch.tensordot(vec, j, dims=1)
        step = elr if n == "embeddings.weight" else lr
        assert torch.allclose(after[n].detach(), before[n] - step * grad, atol=1e-6), n
    # only client b's embedding moved (Algorithm 1), a's row is untouched
    emb = after["embeddings.weight"].detach()
    assert torch.equal(emb[0], before["embeddings.weight"][0])
    assert not torch.equal(emb[1], before["embeddings.weight"][1])
    # the server state shares the live hypernetwork
    assert torch.equal(server["hnet"]["embeddings.weight"], emb)


def test_pfedhn_end_to_end_payloads_and_embeddings(make_cfg, tmp_path):
    cfg = make_cfg(*TINY, "algorithm.name=pfedhn", "train.local_steps=3", rounds=2)
    sim = Simulation(cfg, tmp_path / "p", None, False)
    algo = sim.algo.algorithm
    emb0 = algo.hnet.embeddings.weight.detach().clone()
    s = sim.run().summary
    assert (tmp_path / "p/summary.json").is_file() and s["evaluated_model"] == "personal"
    param_bytes = sum(p.numel() * 4 for p in sim.model.parameters())
    # only generated weights go down and deltas up: never the hypernetwork
    assert s["bytes_by_record"] == {
        "down": {"weights": 6 * param_bytes},
        "up": {"delta": 6 * param_bytes},
    }
    emb = algo.hnet.embeddings.weight.detach()
    assert all(not torch.equal(emb[i], emb0[i]) for i in range(3))  # every v_i was trained
    personal = [algo.personal_weights(sim.server, sim.states[c]) for c in sim.states]
    w = "stages.conv1.conv.weight"
    assert not torch.allclose(personal[0][w], personal[1][w])
    ck = read_checkpoint(tmp_path / "p/checkpoint.pt")
    assert torch.equal(ck["server"]["hnet"]["embeddings.weight"], emb)


def test_pfedhn_client_replies_trained_minus_received(make_cfg, tmp_path):
    sim = _sim(make_cfg, tmp_path, "algorithm.name=pfedhn", "train.local_steps=2")
    down = sim.algo.broadcast(sim.server, 1, "client1")
    up = sim.client_round(1, "client1")
    trained = sim.model.state_dict()  # the working model still holds the trained weights
    assert set(up["delta"]) == set(down["weights"])
    for k, d in up["delta"].items():
        assert torch.allclose(d, trained[k] - down["weights"][k], atol=1e-7), k
    assert any(float(d.abs().max()) > 0 for d in up["delta"].values())
    # the BN running statistics stayed on the client
    st = sim.states["client1"]["local"]
    assert torch.equal(st["stages.conv1.bn.running_mean"], trained["stages.conv1.bn.running_mean"])


def test_pfedhn_resume_equals_uninterrupted(make_cfg, tmp_path):
    """The hypernetwork (the server state) and its embeddings survive a kill after round 2."""
    over = (*TINY, "algorithm.name=pfedhn", "train.local_steps=2", "checkpoint.every=1")
    runs = assert_same_run(make_cfg(*over, rounds=3), tmp_path, stop_after=2)
    hnet = read_checkpoint(runs.dir("resume") / "checkpoint.pt")["server"]["hnet"]
    assert "embeddings.weight" in hnet


def test_pfedhn_rejects_targets_above_the_budget(make_cfg, tmp_path):
    with pytest.raises(ConfigError, match="max_target_params"):
        _sim(make_cfg, tmp_path, "algorithm.name=pfedhn", "algorithm.max_target_params=1000")


def test_pfedhn_released_embedding_update_and_clipping():
    algo, model = _pfedhn(
        embedding_update="released", server_momentum=0.0, server_weight_decay=0.1, embed_lr=0.5
    )
    server = algo.init_server(model)
    for c in ("a", "b"):
        algo.init_client(c, None, model)
    theta = algo.broadcast(server, 1, "b")["weights"]
    delta = {k: torch.ones_like(v) for k, v in theta.items()}
    row_a = algo.hnet.embeddings.weight[0].detach().clone()
    algo.aggregate(server, 1, [reply("b", delta=delta)])
    # the table is an optimiser parameter: weight decay moves client a's row too
    assert torch.allclose(algo.hnet.embeddings.weight[0].detach(), row_a * (1 - 0.5 * 0.1))
    clip, lr = 1e-3, 0.01
    algo, model = _pfedhn(server_momentum=0.0, server_weight_decay=0.0, server_clip=clip)
    server = algo.init_server(model)
    algo.init_client("a", None, model)
    before = torch.cat([q.detach().flatten().clone() for q in algo.hnet.parameters()])
    algo.aggregate(server, 1, [reply("a", delta=delta)])
    after = torch.cat([q.detach().flatten() for q in algo.hnet.parameters()])
    assert float((after - before).norm()) <= lr * clip * 1.01  # float32 rounding of w - step
    assert float((after - before).norm()) >= lr * clip * 0.99  # the raw gradient is larger
    adam, model = _pfedhn(server_optimizer="adam")
    server = adam.init_server(model)
    adam.init_client("a", None, model)
    adam.aggregate(server, 1, [reply("a", delta=delta)])
    assert server["hnet_opt"]["state"]
