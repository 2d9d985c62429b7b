"""Aggregation math of each algorithm on tiny hand-computed cases."""

from __future__ import annotations

import pytest
import torch
from conftest import toy_cfg
from support.replies import copy_of, full, reply

from fedshift.algorithms import ALGORITHMS
from fedshift.algorithms.base import bn_keys, resolve_weighting, weighted_average
from fedshift.algorithms.fednova import a_norm
from fedshift.algorithms.fedprox import ANCHOR
from fedshift.core.config import FederationConfig, TrainConfig
from fedshift.core.context import ClientContext, InputPipeline, Normalize
from fedshift.core.errors import ConfigError
from fedshift.core.seeding import generator
from fedshift.data.domains.toy import ToyParams, load_toy
from fedshift.models import build_model
from fedshift.models.digits import SmallCNN
from fedshift.runtime.simulation import run_experiment


def make_algo(name, model=None, train=None, weighting="samples", num_clients=2, **params):
    model = model or SmallCNN(width=4)
    entry = ALGORITHMS.entry(name)
    p = entry.params(**params) if entry.params else None
    train = train or TrainConfig(lr=0.1)
    return entry.obj(p, train, FederationConfig(weighting=weighting), model, num_clients), model


def test_weighted_average_by_hand():
    a = {"w": torch.tensor([1.0, 2.0]), "n": torch.tensor(1)}
    b = {"w": torch.tensor([5.0, 6.0]), "n": torch.tensor(4)}
    avg = weighted_average([(1.0, a), (3.0, b)])
    assert torch.allclose(avg["w"], torch.tensor([4.0, 5.0]))  # (1*1 + 3*5)/4, (2 + 18)/4
    assert avg["n"].dtype == torch.int64 and int(avg["n"]) == 3  # 13/4 = 3.25 -> 3


def test_fedavg_sample_and_uniform_weights():
    for weighting, expected in (("samples", 0.25 * 1 + 0.75 * 3), ("uniform", 2.0)):
        algo, model = make_algo("fedavg", weighting=weighting)
        server = algo.init_server(model)
        w = server["weights"]
        algo.aggregate(server, 1, [reply("a", 100, weights=full(w, 1)),
                                   reply("b", 300, weights=full(w, 3))])  # fmt: skip
        w = server["weights"]["stages.conv1.conv.weight"]
        assert torch.allclose(w, torch.full_like(w, expected))


def test_bn_policy_keys():
    model = SmallCNN(width=4)
    local = bn_keys(model, "local")
    expected = {
        f"{layer}.{leaf}"
        for layer in ("stages.conv1.bn", "stages.conv2.bn", "embed.bn")
        for leaf in ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")
    }
    assert set(local) == expected
    stats = bn_keys(model, "stats-local")
    assert set(stats) == {k for k in expected if not k.endswith(("weight", "bias"))}
    assert bn_keys(model, "global") == []


def test_fedbn_never_averages_a_bn_tensor():
    algo, model = make_algo("fedbn")
    server = algo.init_server(model)
    before = {k: v.clone() for k, v in server["weights"].items()}
    down = algo.broadcast(server, 1, "a")
    assert not set(down["weights"]) & set(algo.local_keys)
    assert set(down["weights"]) | set(algo.local_keys) == set(before)
    # the personal model uses the client's own BN tensors
    state = algo.init_client("a", None, model)
    state["local"] = {k: v + 7 for k, v in state["local"].items()}
    pw = algo.personal_weights(server, state)
    for k in algo.local_keys:
        assert torch.equal(pw[k], state["local"][k])
    assert algo.global_weights(server) is None and algo.has_personal_model


def test_fedbn_full_round_keeps_bn_on_clients():
    fed = load_toy(ToyParams(clients=2, train_size=20))
    model = build_model({"name": "cnn", "width": 4}, 10, (3, 28, 28))
    algo, _ = make_algo("fedbn", model=model, train=TrainConfig(lr=0.1, batch_size=8))
    server = algo.init_server(model)
    init_bn = {k: server["weights"][k].clone() for k in algo.local_keys}
    states = {c.name: algo.init_client(c.name, c, model) for c in fed.clients}
    replies = []
    for c in fed.clients:
        ctx = ClientContext(
            c.name,
            1,
            c,
            model,
            algo.train,
            default_pipeline(),
            generator(0, c.name),
            torch.device("cpu"),
        )
        up = algo.local_update(ctx, algo.broadcast(server, 1, c.name), states[c.name])
        assert not set(up["weights"]) & set(algo.local_keys)
        replies.append((c.name, up))
    algo.aggregate(server, 1, replies)
    for k in algo.local_keys:
        assert torch.equal(server["weights"][k], init_bn[k])
    a, b = (states[c.name]["local"] for c in fed.clients)
    assert not torch.equal(a["stages.conv1.bn.running_mean"], b["stages.conv1.bn.running_mean"])


def default_pipeline():
    from fedshift.core.config import InputConfig

    return InputPipeline([], Normalize(InputConfig(), 3, torch.device("cpu")))


def _scalar_server(algo, model, value):
    server = algo.init_server(model)
    for k in algo.shared_param_keys:
        server["weights"][k] = torch.full_like(server["weights"][k], value)
    return server


def test_fedavgm_server_momentum_by_hand():
    algo, model = make_algo("fedavgm", server_lr=1.0, server_momentum=0.5)
    server = _scalar_server(algo, model, 0.0)
    k = algo.shared_param_keys[0]
    ones = full(server["weights"], 1.0)
    algo.aggregate(server, 1, [reply("a", weights=ones)])
    # v1 = 1, w1 = 0 + 1 = 1
    assert torch.allclose(server["weights"][k], torch.ones_like(server["weights"][k]))
    algo.aggregate(server, 2, [reply("a", weights=ones)])
    # delta = 1 - 1 = 0, v2 = 0.5 * 1 + 0 = 0.5, w2 = 1.5
    assert torch.allclose(server["weights"][k], torch.full_like(server["weights"][k], 1.5))


def test_fedadam_one_step_by_hand():
    algo, model = make_algo("fedadam", server_lr=0.1, beta1=0.9, beta2=0.99, tau=1e-3)
    server = _scalar_server(algo, model, 0.0)
    k = algo.shared_param_keys[0]
    twos = full(server["weights"], 2.0)
    algo.aggregate(server, 1, [reply("a", weights=twos)])
    m = 0.1 * 2.0
    v = 0.99 * 1e-6 + 0.01 * 4.0
    expected = 0.1 * m / (v**0.5 + 1e-3)
    assert torch.allclose(server["weights"][k], torch.full_like(server["weights"][k], expected))
    # buffers take the plain average, never the adaptive step
    buf = algo.shared_buffer_keys[0]
    assert torch.allclose(server["weights"][buf].float(), twos[buf].float())


def test_fednova_a_norm_formulas():
    assert a_norm(5, 0.1) == 5.0
    # momentum 0.5, tau 3: (3 - 0.5 (1 - 0.125) / 0.5) / 0.5 = 4.25
    assert a_norm(3, 0.1, momentum=0.5) == pytest.approx(4.25)
    # proximal: lr 0.1, mu 1, tau 2: (1 - 0.9^2) / 0.1 = 1.9
    assert a_norm(2, 0.1, mu=1.0) == pytest.approx(1.9)


def test_fednova_aggregation_by_hand():
    algo, model = make_algo("fednova", train=TrainConfig(lr=0.1), weighting="uniform")
    server = _scalar_server(algo, model, 1.0)
    k = algo.shared_param_keys[0]

    w = server["weights"]

    def nova(client, d, a):
        g = full(w, d, algo.shared_param_keys)
        buffers = copy_of(w, algo.shared_buffer_keys)
        return reply(client, 10, normalized_grad=g, buffers=buffers, config={"a_norm": a})

    algo.aggregate(server, 1, [nova("a", 1.0, 2.0), nova("b", 3.0, 4.0)])
    # tau_eff = 0.5*2 + 0.5*4 = 3; sum p d = 2; w = 1 - 3 * 0.1 * 2 = 0.4
    assert torch.allclose(server["weights"][k], torch.full_like(server["weights"][k], 0.4))


def _ctx(client, model, train, seed=0):
    return ClientContext(
        client.name,
        1,
        client,
        model,
        train,
        default_pipeline(),
        generator(seed, client.name),
        torch.device("cpu"),
    )


def test_fednova_equals_fedavg_for_equal_steps():
    fed = load_toy(ToyParams(clients=2, train_size=16))
    train = TrainConfig(lr=0.05, batch_size=8)
    outs = {}
    for name in ("fedavg", "fednova"):
        torch.manual_seed(0)
        model = SmallCNN(width=4)
        algo, _ = make_algo(name, model=model, train=train)
        server = algo.init_server(model)
        replies = []
        for c in fed.clients:
            st = algo.init_client(c.name, c, model)
            replies.append(
                (
                    c.name,
                    algo.local_update(_ctx(c, model, train), algo.broadcast(server, 1, c.name), st),
                )
            )
        algo.aggregate(server, 1, replies)
        outs[name] = server["weights"]
    for k in outs["fedavg"]:
        assert torch.allclose(outs["fedavg"][k].float(), outs["fednova"][k].float(), atol=1e-5), k


def test_scaffold_correction_and_option_two():
    fed = load_toy(ToyParams(clients=1, train_size=16))
    client = fed.clients[0]
    train = TrainConfig(lr=0.1, batch_size=8, local_steps=1)
    ys = {}
    for name in ("fedavg", "scaffold"):
        torch.manual_seed(0)
        model = SmallCNN(width=4)
        algo, _ = make_algo(name, model=model, train=train, num_clients=4)
        server = algo.init_server(model)
        state = algo.init_client(client.name, client, model)
        if name == "scaffold":
            server["control"] = {k: torch.full_like(v, 0.5) for k, v in server["control"].items()}
            state["control"] = {k: torch.full_like(v, 0.2) for k, v in state["control"].items()}
        down = algo.broadcast(server, 1, client.name)
        up = algo.local_update(_ctx(client, model, train), down, state)
        ys[name] = up
    key = "stages.conv1.conv.weight"
    y_avg = ys["fedavg"]["weights"][key]
    delta = ys["scaffold"]["delta"][key]
    x = down["weights"][key]
    # one SGD step: y = x - lr (g - c_i + c) = y_fedavg - 0.1 * (0.5 - 0.2)
    assert torch.allclose(x + delta, y_avg - 0.1 * 0.3, atol=1e-6)
    # option II: delta_c = c_i+ - c_i = -c + (x - y)/(K lr)
    dc = ys["scaffold"]["control_delta"][key]
    assert torch.allclose(dc, -0.5 - delta / (1 * 0.1), atol=1e-4)
    # the client's control is updated in its state and never sent
    assert torch.allclose(state["control"][key], 0.2 + dc, atol=1e-6)
    assert "control" not in ys["scaffold"].records


def scaffold_reply(algo, server, client, dy, dc, n=10):
    """A SCAFFOLD reply: every shared parameter moved by ``dy``, its control by ``dc``."""
    w, keys = server["weights"], algo.shared_param_keys
    return reply(client, n, delta=full(w, dy, keys), control_delta=full(w, dc, keys),
                 buffers=copy_of(w, algo.shared_buffer_keys))  # fmt: skip


def test_scaffold_server_update_by_hand():
    algo, model = make_algo("scaffold", num_clients=4, weighting="uniform")
    server = _scalar_server(algo, model, 1.0)
    k = algo.shared_param_keys[0]
    replies = [scaffold_reply(algo, server, "a", 0.2, 1.0),
               scaffold_reply(algo, server, "b", 0.4, 3.0)]  # fmt: skip
    algo.aggregate(server, 1, replies)
    # x = 1 + mean(0.2, 0.4) = 1.3 ; c = 0 + (2/4) * mean(1, 3) = 1.0
    assert torch.allclose(server["weights"][k], torch.full_like(server["weights"][k], 1.3))
    assert torch.allclose(server["control"][k], torch.full_like(server["control"][k], 1.0))


def test_fedprox_penalty_by_hand():
    fed = load_toy(ToyParams(clients=1, train_size=16))
    model = SmallCNN(width=4)
    algo, _ = make_algo("fedprox", model=model, mu=0.2)
    ctx = _ctx(fed.clients[0], model, algo.train)
    ctx.scratch[ANCHOR] = {
        k: p.detach().clone() - 1.0
        for k, p in model.named_parameters()
        if k in algo.shared_param_keys
    }
    n = sum(p.numel() for k, p in model.named_parameters() if k in algo.shared_param_keys)
    pen = algo.penalty(ctx)
    assert pen.item() == pytest.approx(0.5 * 0.2 * n, rel=1e-5)


# ------------------------------------------------------------------ federation.weighting
# each paper's own aggregation weights (n_k / n or 1 / |S|), checked against the class
PAPER_WEIGHTING = {
    "fedavg": "samples",  # McMahan et al. 2017, Alg. 1
    "fedprox": "samples",  # Li et al. 2020, Sec. 5.1
    "fednova": "samples",  # Wang et al. 2020, p_i = n_i / n
    "fedavgm": "samples",
    "moon": "samples",
    "scaffold": "uniform",  # Karimireddy et al. 2020, Alg. 1: 1/|S|
    "fedbn": "uniform",  # FedBN Alg. 1 and released code: 1/K
    "fedadam": "uniform",  # Reddi et al. 2021, Alg. 2: 1/|S|
    "fedyogi": "uniform",
    "fedadagrad": "uniform",
    "pfedme": "uniform",  # T Dinh et al. 2020, Alg. 1: 1/S
    "pfedhn": "uniform",  # Shamsian et al. 2021, Alg. 1: clients sampled uniformly
}


def test_config_default_is_auto():
    assert FederationConfig().weighting == "auto"


@pytest.mark.parametrize("entry", ALGORITHMS.entries(), ids=lambda e: e.name)
def test_auto_resolves_to_every_registered_algorithms_paper_weighting(entry):
    cls = entry.obj
    assert cls.paper_weighting in ("samples", "uniform"), entry.name
    assert resolve_weighting("auto", cls) == cls.paper_weighting
    if entry.name in PAPER_WEIGHTING:
        assert cls.paper_weighting == PAPER_WEIGHTING[entry.name], entry.name
    for explicit in ("samples", "uniform"):  # an explicit choice always wins
        assert resolve_weighting(explicit, cls) == explicit


def test_resolve_weighting_rejects_unknown_value():
    with pytest.raises(ConfigError, match="federation.weighting"):
        resolve_weighting("by-size", ALGORITHMS.get("fedavg"))


def _scaffold_round(weighting):
    algo, model = make_algo("scaffold", num_clients=4, weighting=weighting)
    server = _scalar_server(algo, model, 1.0)
    k = algo.shared_param_keys[0]
    replies = [scaffold_reply(algo, server, "a", 0.2, 0.0, n=10),
               scaffold_reply(algo, server, "b", 0.4, 0.0, n=30)]  # fmt: skip
    algo.aggregate(server, 1, replies)
    return algo, float(server["weights"][k].flatten()[0])


def test_scaffold_default_averages_one_over_S_with_unequal_client_sizes():
    algo, x = _scaffold_round("auto")
    assert algo.weighting == "uniform"
    assert x == pytest.approx(1.0 + (0.2 + 0.4) / 2)  # Alg. 1 line 16: 1/|S|, not 10:30


def test_explicit_weighting_overrides_the_paper_weighting():
    algo, x = _scaffold_round("samples")
    assert algo.weighting == "samples"
    assert x == pytest.approx(1.0 + (10 * 0.2 + 30 * 0.4) / 40)
    fedavg, _ = make_algo("fedavg", weighting="uniform")
    assert fedavg.weighting == "uniform" and fedavg.federation.weighting == "uniform"


def test_summary_records_the_resolved_weighting(tmp_path):

    for name, want in (("scaffold", "uniform"), ("fedavg", "samples")):
        cfg = toy_cfg(f"algorithm.name={name}", rounds=1)
        res = run_experiment(cfg, run_dir=tmp_path / name, progress=False)
        assert res.summary["weighting"] == want
