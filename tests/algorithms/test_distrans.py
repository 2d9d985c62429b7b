"""DisTrans: Eq. 1, the double-input-channel model, the joint offset/model update, offset
aggregation (none / avg / nn / auto), resume, and end-to-end runs on toyshift."""

from __future__ import annotations

import copy
import json
from collections import OrderedDict

import pytest
import torch
import torch.nn.functional as F
from support.replies import copy_of, reply
from support.same_run import assert_same_run
from torch import nn

from fedshift.algorithms.bn import FrozenBNStats
from fedshift.algorithms.distrans import (
    OFFSET,
    DisTrans,
    DisTransModel,
    DisTransParams,
    OffsetAggregator,
    blend,
    class_share,
    label_proportions,
    recover,
    train_aggregator,
)
from fedshift.core.config import FederationConfig, InputConfig, TrainConfig
from fedshift.core.context import ClientContext, InputPipeline, Normalize
from fedshift.core.errors import ConfigError
from fedshift.core.federation import ClientData, Federation, Split
from fedshift.models.base import FedModel
from fedshift.runtime.simulation import (
    Simulation,
    run_experiment,
)

SMALL = ("dataset.train_size=32", "dataset.val_size=8", "dataset.test_size=8", "dataset.classes=4")
SHAPE = (1, 3, 3)


# ----------------------------------------------------------------------------- helpers
class Tiny(FedModel):
    """1x3x3 input -> conv 2x2 (2 channels) -> (BN) -> ReLU -> 3-d embedding -> 2 logits."""

    def __init__(self, bn: bool = False) -> None:
        super().__init__()
        layers: OrderedDict[str, nn.Module] = OrderedDict(conv=nn.Conv2d(1, 2, 2))
        if bn:
            layers["bn"] = nn.BatchNorm2d(2)
        layers["relu"] = nn.ReLU()
        self.stages = nn.ModuleDict({"s1": nn.Sequential(layers)})
        self.embed = nn.Linear(8, 3)
        self.classifier = nn.Linear(3, 2)


def tiny_fed(sizes=(6, 6), seed=0) -> Federation:
    g = torch.Generator().manual_seed(seed)

    def split(n: int) -> Split:
        return Split(torch.rand(n, *SHAPE, generator=g), torch.arange(n) % 2)

    clients = [ClientData(f"c{i}", split(n), split(2), split(2)) for i, n in enumerate(sizes)]
    return Federation("tiny", clients, ["0", "1"], SHAPE)


def make_algo(fed, bn=False, train=None, weighting="samples", seed=0, **params):
    torch.manual_seed(seed)
    p = DisTransParams(**params)
    model = DisTrans.wrap_model(p, Tiny(bn=bn), fed)
    train = train or TrainConfig(lr=0.1, batch_size=64, local_steps=1)
    algo = DisTrans(p, train, FederationConfig(weighting=weighting), model, len(fed.clients))
    return algo, model


def make_ctx(algo, model, client: ClientData, state, seed=7, mean=0.5, std=0.5):
    norm = Normalize(InputConfig(mean=[mean], std=[std]), SHAPE[0], torch.device("cpu"))
    return ClientContext(
        cid=client.name,
        round=1,
        data=client,
        model=model,
        train=algo.train,
        pipeline=InputPipeline([], norm),
        generator=torch.Generator().manual_seed(seed),
        device=torch.device("cpu"),
        state=state,
    )


def summary_records(summary) -> dict:
    return summary["bytes_by_record"]


# ----------------------------------------------------------------------------- Eq. 1
def test_blend_hand_values_and_exact_inverse():
    x = torch.tensor([0.2, -0.4, 1.0])
    t = torch.tensor([1.0, 0.5, -2.0])
    left, right = blend(x, t, 0.3)
    # (1 - a) x + a t and (1 + a) x - a t, by hand
    assert torch.allclose(left, torch.tensor([0.44, -0.13, 0.1]), atol=1e-6)
    assert torch.allclose(right, torch.tensor([-0.04, -0.67, 1.9]), atol=1e-6)
    g = torch.Generator().manual_seed(0)
    for a in (0.0, 0.1, 0.3, 0.9):
        x = torch.randn(4, 3, 5, 5, generator=g)
        t = torch.randn(3, 5, 5, generator=g)
        x_rec, t_rec = recover(*blend(x, t, a), a)
        assert torch.allclose(x_rec, x, atol=1e-5)
        if a > 0:
            assert torch.allclose(t_rec.expand_as(x), t.expand_as(x), atol=1e-4)
        else:
            assert t_rec is None


# ----------------------------------------------------------------------------- the model
def test_wrapper_logits_features_stages_bn_names():
    torch.manual_seed(0)
    fed = tiny_fed()
    backbone = Tiny(bn=True)
    model = DisTrans.wrap_model(DisTransParams(alpha=0.3), backbone, fed)
    assert isinstance(model, DisTransModel)
    with torch.no_grad():
        model.offset.copy_(torch.randn(SHAPE))
    model.eval()
    x = torch.randn(4, *SHAPE)
    left = 0.7 * x + 0.3 * model.offset
    right = 1.3 * x - 0.3 * model.offset
    z = torch.cat([backbone.features(left), backbone.features(right)], dim=1)
    expected = z @ model.classifier.weight.T + model.classifier.bias
    assert torch.allclose(model(x), expected, atol=1e-6)
    assert torch.allclose(model.features(x), z, atol=1e-6)
    assert torch.allclose(model.head(z), expected, atol=1e-6)
    assert model.classifier.in_features == 6
    # stages / hooks are the backbone's; BN layers named as in the wrapper's state dict
    assert model.stages is backbone.stages and model.stage_names == ["s1"]
    assert model.stage_hooks is backbone.stage_hooks
    sd = model.state_dict()
    assert model.bn_layer_names() == ["backbone.stages.s1.bn"]
    assert "backbone.stages.s1.bn.running_mean" in sd
    assert sd[OFFSET].shape == SHAPE
    assert not any(k.startswith("backbone.classifier") for k in sd)  # dropped, unused
    # a hook added on the wrapper reaches the backbone's forward
    model.stage_hooks["s1"] = lambda h: h * 0
    bias = torch.cat([backbone.embed.bias, backbone.embed.bias]).expand(4, 6)
    assert torch.allclose(model.features(x), bias)


def test_single_channel_feeds_left_input_only():
    torch.manual_seed(0)
    fed = tiny_fed()
    backbone = Tiny()
    model = DisTrans.wrap_model(DisTransParams(alpha=0.2, channels=1), backbone, fed)
    with torch.no_grad():
        model.offset.copy_(torch.randn(SHAPE))
    x = torch.randn(3, *SHAPE)
    z = backbone.features(0.8 * x + 0.2 * model.offset)
    assert model.classifier.in_features == 3
    assert torch.allclose(model(x), model.classifier(z), atol=1e-6)


def test_offset_is_client_local_and_used_in_personal_weights():
    fed = tiny_fed()
    algo, model = make_algo(fed, bn=True, bn_policy="stats-local")
    assert algo.local_keys[0] == OFFSET and OFFSET not in algo.shared_keys
    assert "backbone.stages.s1.bn.running_mean" in algo.local_keys
    assert not algo.has_global_model and algo.has_personal_model
    server = algo.init_server(model)
    sa, sb = algo.init_client("c0", None, model), algo.init_client("c1", None, model)
    pa, pb = algo.personal_weights(server, sa), algo.personal_weights(server, sb)
    assert not torch.equal(pa[OFFSET], pb[OFFSET])  # each client its own offset
    assert torch.equal(pa[OFFSET], algo.client_offset(sa))
    for k in algo.shared_keys:
        assert torch.equal(pa[k], pb[k])
    assert OFFSET not in algo.broadcast(server, 1, "c0")["weights"]


def test_offset_init_uniform_then_run_normalisation_and_deterministic():
    fed = tiny_fed()
    algo, model = make_algo(fed, train=TrainConfig(local_steps=0))
    state = algo.init_client("c0", None, model)
    u = state["local"][OFFSET].clone()
    assert u.shape == SHAPE and u.min() >= 0 and u.max() <= 1
    assert torch.allclose(algo.client_offset(state), (u - 0.5) / 0.5)  # before any training
    algo2, model2 = make_algo(fed, train=TrainConfig(local_steps=0))
    assert torch.equal(algo2.init_client("c0", None, model2)["local"][OFFSET], u)
    assert not torch.equal(algo2.init_client("c1", None, model2)["local"][OFFSET], u)
    # the first local update maps it with the run's normalisation (here mean 0.2, std 0.4)
    server = algo.init_server(model)
    ctx = make_ctx(algo, model, fed.clients[0], state, mean=0.2, std=0.4)
    algo.local_update(ctx, algo.broadcast(server, 1, "c0"), state)
    assert not state["offset_raw"]
    assert torch.allclose(state["local"][OFFSET], (u - 0.2) / 0.4, atol=1e-6)


# ----------------------------------------------------------------------------- local update
def _hand_step(ref: DisTransModel, t0, x, y, a, lr, lr_t, alternate: bool):
    """One batch of Algorithm 1 written out: returns (new offset, new model parameters)."""
    bb, dense = ref.backbone, ref.classifier
    params = [p for n, p in ref.named_parameters() if n != OFFSET]

    def loss_at(t):
        z = torch.cat([bb.features((1 - a) * x + a * t), bb.features((1 + a) * x - a * t)], 1)
        return F.cross_entropy(dense(z), y)

    t = t0.clone().requires_grad_(True)
    loss = loss_at(t)
    grads = torch.autograd.grad(loss, [t, *params])
    t1 = t0 - lr_t * grads[0]
    if alternate:
        grads = (None, *torch.autograd.grad(loss_at(t1), params))
    return t1, [p.detach() - lr * g for p, g in zip(params, grads[1:], strict=True)]


@pytest.mark.parametrize("update", ["alternate", "simultaneous"])
def test_local_step_matches_hand_written_update(update):
    fed = tiny_fed(sizes=(6, 6))
    a, lr, lr_t = 0.6, 0.1, 20.0
    train = TrainConfig(lr=lr, batch_size=64, local_steps=1)
    algo, model = make_algo(fed, train=train, alpha=a, offset_lr=lr_t, update=update)
    server = algo.init_server(model)
    state = algo.init_client("c0", None, model)
    t0 = (state["local"][OFFSET] - 0.5) / 0.5
    ref = copy.deepcopy(model)
    ctx = make_ctx(algo, model, fed.clients[0], state, seed=7)
    algo.local_update(ctx, algo.broadcast(server, 1, "c0"), state)
    split = fed.clients[0].train
    perm = torch.randperm(len(split), generator=torch.Generator().manual_seed(7))
    x, y = (split.x[perm] - 0.5) / 0.5, split.y[perm]
    t1, new = _hand_step(ref, t0, x, y, a, lr, lr_t, alternate=update == "alternate")
    assert torch.allclose(model.offset.detach(), t1, atol=1e-6)
    assert torch.allclose(state["local"][OFFSET], t1, atol=1e-6)
    got = [p.detach() for n, p in model.named_parameters() if n != OFFSET]
    for g, w in zip(got, new, strict=True):
        assert torch.allclose(g, w, atol=1e-6)
    # the other update rule gives other model weights
    _, other = _hand_step(ref, t0, x, y, a, lr, lr_t, alternate=update != "alternate")
    assert max(float((g - w).abs().max()) for g, w in zip(got, other, strict=True)) > 1e-4


def test_alternate_and_simultaneous_differ_and_bn_stats_counted_once():
    fed = tiny_fed(sizes=(8, 8))
    train = TrainConfig(lr=0.1, batch_size=4, local_steps=2)
    out = {}
    for update in ("alternate", "simultaneous"):
        algo, model = make_algo(fed, bn=True, train=train, offset_lr=0.5, update=update)
        server = algo.init_server(model)
        state = algo.init_client("c0", None, model)
        ctx = make_ctx(algo, model, fed.clients[0], state)
        algo.local_update(ctx, algo.broadcast(server, 1, "c0"), state)
        bn = model.backbone.stages.s1.bn
        assert int(bn.num_batches_tracked) == 2 * 2  # 2 steps x 2 channel passes, no more
        out[update] = (model.offset.detach().clone(), bn.running_mean.clone())
    assert not torch.allclose(out["alternate"][0], out["simultaneous"][0])


def test_frozen_bn_stats_context():
    m = Tiny(bn=True)
    bn = m.stages.s1.bn
    m.train()
    m(torch.randn(4, *SHAPE))
    before = (bn.running_mean.clone(), bn.running_var.clone(), int(bn.num_batches_tracked))
    with FrozenBNStats(m):
        m(torch.randn(4, *SHAPE))
        m(torch.randn(4, *SHAPE))
    assert torch.equal(bn.running_mean, before[0]) and torch.equal(bn.running_var, before[1])
    assert int(bn.num_batches_tracked) == before[2] and bn.momentum == 0.1


# ----------------------------------------------------------------------------- aggregation
def _reply(client, algo, model, offset, n, counts=None):
    """``client``'s DisTrans reply: the model's shared weights, its offset, its label counts."""
    dist = {}
    if counts is not None:
        dist["label_dist"] = {"counts": torch.tensor(counts, dtype=torch.float32)}
    return reply(client, n, weights=copy_of(model.state_dict(), algo.shared_keys),
                 offset={OFFSET: offset}, **dist)  # fmt: skip


@pytest.mark.parametrize("weighting", ["samples", "uniform"])
def test_avg_aggregation_by_hand_and_clients_continue_from_it(weighting):
    fed = tiny_fed(sizes=(6, 2))
    algo, model = make_algo(
        fed, train=TrainConfig(local_steps=0), weighting=weighting, aggregation="avg"
    )
    server = algo.init_server(model)
    down = algo.broadcast(server, 1, "c0")
    assert "offset" not in down.records and down.config["upload_offset"] == 1
    ta, tb = torch.full(SHAPE, 1.0), torch.full(SHAPE, -2.0)
    algo.aggregate(server, 1, [_reply("c0", algo, model, ta, 3), _reply("c1", algo, model, tb, 1)])
    want = (3 * ta + tb) / 4 if weighting == "samples" else (ta + tb) / 2
    assert torch.allclose(server["offset_avg"], want)
    for cid in ("c0", "c1"):
        assert torch.allclose(algo.broadcast(server, 2, cid)["offset"][OFFSET], want)
    # the client continues from the average (no local steps: its upload is the average)
    state = algo.init_client("c1", None, model)
    ctx = make_ctx(algo, model, fed.clients[1], state)
    up = algo.local_update(ctx, algo.broadcast(server, 2, "c1"), state)
    assert torch.allclose(up["offset"][OFFSET], want) and torch.allclose(
        state["local"][OFFSET], want
    )
    assert torch.allclose(algo.personal_weights(server, state)[OFFSET], want)
    # a client evaluated before it receives the average is evaluated with it too
    fresh = algo.init_client("c0", None, model)
    assert torch.allclose(algo.personal_weights(server, fresh)[OFFSET], want)


@pytest.mark.parametrize("offset_input", [False, True])
@pytest.mark.parametrize("shape", [(3, 28, 28), (1, 3, 3), (3, 5, 7), (2, 32, 32), (3, 64, 64)])
def test_aggregator_output_shape_any_input(shape, offset_input):
    agg = OffsetAggregator(5, shape, hidden=8, width=4, offset_input=offset_input)
    t = torch.randn(3, *shape) if offset_input else None
    out = agg(label_proportions(torch.rand(3, 5)), t)
    assert out.shape == (3, *shape) and out.abs().max() <= 1


def test_class_share_is_section_4_4_embedding():
    # e_ij = fraction of class j's training data on client i (columns sum to 1)
    counts = torch.tensor([[5.0, 1.0, 0.0], [2.0, 2.0, 0.0], [0.0, 2.0, 0.0]])
    e = class_share(counts)
    assert torch.allclose(e[:, 0], torch.tensor([5 / 7, 2 / 7, 0.0]))
    assert torch.allclose(e[:, 1], torch.tensor([0.2, 0.4, 0.4]))
    assert torch.equal(e[:, 2], torch.zeros(3))  # nobody holds class 2
    # not the client's own label mix (rows of label_proportions sum to 1)
    assert not torch.allclose(e, label_proportions(counts))


def test_nn_aggregator_mse_decreases():
    torch.manual_seed(0)
    for offset_input in (False, True):
        agg = OffsetAggregator(4, (3, 8, 8), hidden=16, width=8, offset_input=offset_input)
        targets = [([5, 1, 0, 0], 0.5), ([0, 1, 3, 0], -0.3), ([1, 1, 1, 1], 0.1)]
        pairs = [
            (
                label_proportions(torch.tensor(c, dtype=torch.float32)),
                torch.full((3, 8, 8), -v) if offset_input else None,
                torch.full((3, 8, 8), v),
            )
            for c, v in targets
        ]
        hist = train_aggregator(agg, pairs, steps=15, lr=5e-2)
        assert all(b < a for a, b in zip(hist, hist[1:], strict=False))
        assert hist[-1] < 0.6 * hist[0]


@pytest.mark.parametrize("nn_input", ["paper", "released"])
def test_nn_aggregation_inputs_and_per_client_offsets(nn_input):
    fed = tiny_fed(sizes=(6, 4, 2))
    algo, model = make_algo(
        fed, aggregation="nn", nn_steps=3, nn_hidden=8, nn_width=4, nn_input=nn_input
    )
    server = algo.init_server(model)
    counts = {"c0": [5, 1], "c1": [2, 2], "c2": [0, 2]}
    torch.manual_seed(0)
    ups = {c: torch.rand(SHAPE) - 0.5 for c in counts}
    replies = [_reply(c, algo, model, ups[c], 1, counts[c]) for c in counts]
    before = copy.deepcopy(server["aggregator"])
    algo.aggregate(server, 1, replies)
    assert len(server["nn_loss"]) == 3 and server["nn_loss"][-1] < server["nn_loss"][0]
    assert any(not torch.equal(before[k], server["aggregator"][k]) for k in before)
    net = algo.aggregator(server)
    matrix = torch.tensor([counts[c] for c in sorted(counts)], dtype=torch.float32)
    emb = class_share(matrix) if nn_input == "paper" else label_proportions(matrix)
    for i, cid in enumerate(sorted(counts)):
        out = algo.broadcast(server, 2, cid)["offset"][OFFSET]
        assert out.shape == SHAPE
        t = ups[cid][None] if nn_input == "paper" else None
        assert torch.allclose(out, net(emb[i][None], t)[0], atol=1e-6)
    assert not torch.allclose(server["offset_nn"]["c0"], server["offset_nn"]["c2"])
    # the aggregator's weights stay on the server
    assert set(algo.broadcast(server, 2, "c0").records) == {"weights", "offset"}


@pytest.mark.parametrize("nn_input", ["paper", "released"])
def test_nn_aggregation_iid_clients_get_different_offsets(nn_input):
    """Section 4.4 feeds the client's offset too, so clients with identical label counts (an
    i.i.d. split) get different aggregated offsets; the released label-only input cannot."""
    fed = tiny_fed(sizes=(4, 4, 4))
    algo, model = make_algo(fed, aggregation="nn", nn_hidden=8, nn_width=4, nn_input=nn_input)
    server = algo.init_server(model)
    torch.manual_seed(1)
    ups = {c: torch.randn(SHAPE) for c in ("c0", "c1", "c2")}
    algo.aggregate(server, 1, [_reply(c, algo, model, ups[c], 4, [2, 2]) for c in ups])
    out = server["offset_nn"]
    same = all(torch.allclose(out["c0"], out[c]) for c in ("c1", "c2"))
    assert same == (nn_input == "released")
    # round 2: the regression input is what the network was fed last round, its target the
    # new upload; the next offsets are computed from the new uploads
    if nn_input == "paper":
        new = {c: torch.randn(SHAPE) for c in ups}
        algo.aggregate(server, 2, [_reply(c, algo, model, new[c], 4, None) for c in ups])
        assert all(torch.equal(server["offset_in"][c], new[c]) for c in ups)
        net = algo.aggregator(server)
        e = class_share(torch.tensor([[2.0, 2.0]] * 3))
        want = net(e, torch.stack([new[c] for c in sorted(ups)]))
        for i, c in enumerate(sorted(ups)):
            assert torch.allclose(out_c := server["offset_nn"][c], want[i], atol=1e-6), out_c


# ----------------------------------------------------------------------------- end to end
@pytest.mark.parametrize(
    "channels,aggregation",
    [(2, "none"), (2, "avg"), (2, "nn"), (1, "none"), (1, "avg"), (1, "nn"), (1, "auto")],
)
def test_end_to_end_two_rounds_and_ledger(make_cfg, tmp_path, channels, aggregation):
    cfg = make_cfg(
        "algorithm.name=distrans",
        f"algorithm.channels={channels}",
        f"algorithm.aggregation={aggregation}",
        "algorithm.nn_width=8",
        *SMALL,
        rounds=2,
    )
    res = run_experiment(cfg, run_dir=tmp_path / "r", progress=False)
    summary = json.loads((tmp_path / "r/summary.json").read_text())
    assert list(summary["models"]) == ["personal"]
    rec = summary_records(summary)
    off, lab = 3 * 28 * 28 * 4, 4 * 4  # one offset / one label distribution, in bytes
    clients = 3
    expected = {
        "none": ({"weights"}, {"weights"}),
        "avg": ({"weights", "offset"}, {"weights", "offset"}),
        "nn": ({"weights", "offset", "label_dist"}, {"weights", "offset"}),
        "auto": ({"weights", "offset", "label_dist"}, {"weights"}),  # toyshift: DH 0
    }[aggregation]
    assert set(rec["up"]) == expected[0] and set(rec["down"]) == expected[1]
    if aggregation in ("avg", "nn"):
        assert rec["up"]["offset"] == 2 * clients * off
        assert rec["down"]["offset"] == clients * off  # round 2 only
    if aggregation in ("nn", "auto"):
        assert rec["up"]["label_dist"] == clients * lab  # sent once
    if aggregation == "auto":
        assert rec["up"]["offset"] == clients * off  # asked for once DH was known
    assert res.summary["dh"] == 0.0


@pytest.mark.parametrize("partition,dh,mode", [("one-class", 100.0, "none"), ("iid", 0.0, "nn")])
def test_auto_rule_from_label_distributions(make_cfg, tmp_path, partition, dh, mode):
    cfg = make_cfg(
        "algorithm.name=distrans",
        "algorithm.nn_width=8",
        f"partition.name={partition}",
        "partition.clients=3",
        *SMALL,
        rounds=3,
    )
    sim = Simulation(cfg, tmp_path / partition, progress=False)
    sim.run()
    assert sim.server["dh"] == pytest.approx(dh)
    assert sim.algo.algorithm.offset_mode(sim.server) == mode
    rec = sim.ledger.by_record()
    if mode == "none":  # offsets never left the clients
        assert "offset" not in rec["up"] and "offset" not in rec["down"]
        assert sim.server["offset_nn"] == {} and sim.server["offset_avg"] is None
    else:
        assert "offset" in rec["up"] and "offset" in rec["down"]
        assert set(sim.server["offset_nn"]) == set(sim.states)


def test_resumed_run_equals_uninterrupted(make_cfg, tmp_path):
    """NN offset aggregation with offset momentum, persisted optimiser state and sampled
    clients, killed after round 3 (checkpoint of round 2) and resumed."""
    over = [
        "algorithm.name=distrans",
        "algorithm.aggregation=nn",
        "algorithm.nn_width=8",
        "algorithm.offset_momentum=0.5",
        "checkpoint.every=2",
        "train.optimizer_state=persist",
        "train.momentum=0.5",
        "federation.sample_fraction=0.67",
        *SMALL,
    ]
    assert_same_run(make_cfg(*over, rounds=4), tmp_path, stop_after=3)


@pytest.mark.parametrize("augment", ["mixup", "fedrdn"])
def test_composes_with_augments(make_cfg, tmp_path, augment):
    cfg = make_cfg("algorithm.name=distrans", f"augment=[{augment}]", *SMALL, rounds=1)
    s = run_experiment(cfg, run_dir=tmp_path / augment, progress=False).summary
    assert 0.0 <= s["test_mean"] <= 1.0


@pytest.mark.parametrize(
    "bad,key",
    [
        ("algorithm.alpha=1.0", "alpha"),
        ("algorithm.alpha=-0.1", "alpha"),
        ("algorithm.offset_lr=0", "offset_lr"),
        ("algorithm.nn_steps=0", "nn_steps"),
        ("algorithm.dh_threshold=150", "dh_threshold"),
        ("algorithm.channels=3", "channels"),
    ],
)
def test_check_rejects_nonsense(make_cfg, bad, key):
    with pytest.raises(ConfigError, match=key):
        make_cfg("algorithm.name=distrans", bad)
