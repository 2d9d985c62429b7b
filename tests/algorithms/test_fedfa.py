"""FedFA: the FFA layer's equations on hand-computed tiny tensors, its placement, the
statistics exchange (server variances, ledger bytes) and end-to-end ``fedfa`` runs."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import seg_cfg
from support.same_run import assert_same_run

from fedshift.augment.ffa import (
    FFA,
    FFALayer,
    FFAParams,
    batch_variance,
    fused_variance,
    fusion_weights,
    instance_statistics,
    momentum_update,
    resample,
    sharing_variance,
)
from fedshift.core.errors import ConfigError
from fedshift.core.payload import Payload
from fedshift.models.digits import LeNet5, SmallCNN
from fedshift.runtime.simulation import (
    Simulation,
    run_experiment,
)

T = torch.tensor


def close(a: torch.Tensor, b, tol: float = 1e-6) -> bool:
    return torch.allclose(a.double(), torch.as_tensor(b).double(), atol=tol, rtol=0)


# ----------------------------------------------------------------------------- equations
def test_instance_statistics_population_and_unbiased():
    # channel 0: [[1, 2], [3, 4]]: mean 2.5, var 1.25 (1/HW) or 5/3 (unbiased)
    # channel 1: [[0, 0], [2, 2]]: mean 1, var 1 or 4/3
    x = T([[[[1.0, 2.0], [3.0, 4.0]], [[0.0, 0.0], [2.0, 2.0]]]])
    mu, sigma = instance_statistics(x, eps=0.01)
    assert mu.shape == (1, 2) and close(mu, [[2.5, 1.0]])
    assert close(sigma, [[math.sqrt(1.26), math.sqrt(1.01)]])
    _, sigma_u = instance_statistics(x, eps=0.01, unbiased=True)
    assert close(sigma_u, [[math.sqrt(5 / 3 + 0.01), math.sqrt(4 / 3 + 0.01)]])


def test_client_specific_batch_variance():
    mu = T([[1.0, 2.0], [3.0, 6.0]])  # per channel over the batch: var 1, 4 (1/B) or 2, 8
    assert close(batch_variance(mu, eps=0.5), [1.5, 4.5])
    assert close(batch_variance(mu, eps=0.5, unbiased=True), [2.5, 8.5])


def test_momentum_update_of_batch_mean_statistics():
    s = T([[1.0, 2.0], [3.0, 6.0]])  # batch mean [2, 4]
    assert close(momentum_update(torch.zeros(2), s, 0.99), [0.02, 0.04])
    assert close(momentum_update(torch.ones(2), T([[1.0, 1.0], [3.0, 1.0]]), 0.99), [1.01, 1.0])


def test_server_per_channel_sharing_variance_and_gamma_three_clients():
    stats = T([[0.0, 1.0], [2.0, 1.0], [4.0, 4.0]])  # K=3 clients, C=2 channels
    var = sharing_variance(stats)  # 1/K: channel 0 (4+0+4)/3, channel 1 (1+1+4)/3
    assert close(var, [8 / 3, 2.0])
    assert close(sharing_variance(stats, unbiased=True), [4.0, 3.0])
    # r = v/(1+v) = [8/11, 2/3]; gamma = 2 r / sum r = [24/23, 22/23]
    assert close(fusion_weights(var, eps=0.0), [24 / 23, 22 / 23])
    assert close(fusion_weights(var).sum(), 2.0)


def test_gamma_two_clients_and_zero_variance():
    var = sharing_variance(T([[1.0, 5.0], [3.0, 5.0]]))  # [1, 0]
    assert close(var, [1.0, 0.0])
    assert close(fusion_weights(var, eps=0.0), [2.0, 0.0])  # r = [1/2, 0]
    assert close(fusion_weights(var), [2.0, 0.0], tol=1e-5)
    # no spread known at all (the server's initial zeros): gamma = 1 everywhere
    assert close(fusion_weights(torch.zeros(3)), [1.0, 1.0, 1.0])


def test_released_scalar_variance_gives_gamma_one():
    stats = T([[0.0, 1.0], [2.0, 1.0], [4.0, 4.0]])
    var = sharing_variance(stats, per_channel=False, unbiased=True)  # torch.var over 6 values
    assert close(var, [2.8, 2.8])
    assert close(fusion_weights(var), torch.ones(2))


def test_fused_variance_of_each_variant():
    client, shared = T([1.0, 2.0]), T([8 / 3, 2.0])  # gamma = [24/23, 22/23]
    assert close(fused_variance(client, shared, "fedfa", eps=0.0), [47 / 23, 90 / 23])
    assert close(fused_variance(client, shared, "fedfa-r"), [0.25, 0.25])  # lambda = 0.5
    assert close(fused_variance(client, shared, "fedfa-r", fixed_std=0.2), [0.04, 0.04])
    assert close(fused_variance(client, shared, "fedfa-c"), [1.0, 2.0])
    # Direct Fusion (Table 7): (Sigma_hat^2 + 1) * Sigma^2 = [11/3 * 1, 3 * 2]
    assert close(fused_variance(client, shared, "direct"), [11 / 3, 6.0])


@pytest.mark.parametrize("scale", [1e-4, 1.0, 1e3])
def test_fedfa_r_std_is_lambda_whatever_the_client_variance(scale):
    # Sec. 4.1: FedFA-R samples with std lambda = 0.5 in every channel
    client = T([0.3, 2.0, 7.0]) * scale
    for shared in (torch.zeros(3), T([5.0, 0.1, 9.0])):
        assert close(fused_variance(client, shared, "fedfa-r").sqrt(), [0.5] * 3)
    x = _x() * scale
    layer = FFALayer(3, p=1.0, variant="fedfa-r").train()
    layer.generator = torch.Generator().manual_seed(7)
    out = layer(x)
    g = torch.Generator().manual_seed(7)
    torch.rand((), generator=g)
    e_mu, e_sigma = torch.randn(4, 3, generator=g), torch.randn(4, 3, generator=g)
    mu, sigma = instance_statistics(x)
    beta, gam = mu + 0.5 * e_mu, sigma + 0.5 * e_sigma
    want = (x - mu[..., None, None]) / sigma[..., None, None] * gam[..., None, None]
    assert torch.allclose(out, want + beta[..., None, None], atol=1e-4 * max(scale, 1.0))


def test_direct_fusion_is_the_product_not_the_sum():
    client, shared = T([0.5, 2.0, 4.0]), T([0.0, 1.0, 3.0])
    got = fused_variance(client, shared, "direct")
    assert close(got, (shared + 1) * client)  # [0.5, 4, 16]
    assert not close(got, shared + client)


def test_resample_formula():
    x = T([[[[0.0, 2.0], [0.0, 2.0]]]])  # mu 1, sigma 1
    out = resample(x, T([[1.0]]), T([[1.0]]), T([4.0]), T([1.0]), T([[0.5]]), T([[1.0]]))
    # beta = 1 + 0.5 * 2 = 2, gamma = 1 + 1 * 1 = 2: x_hat = 2 (x - 1) + 2
    assert close(out, [[[[0.0, 4.0], [0.0, 4.0]]]])


# ----------------------------------------------------------------------------- the layer
def _x(b: int = 4, c: int = 3, seed: int = 0) -> torch.Tensor:
    return torch.randn(b, c, 5, 5, generator=torch.Generator().manual_seed(seed)) * 2 + 1


@pytest.mark.parametrize("variant", ["fedfa", "fedfa-r", "fedfa-c", "direct"])
def test_layer_sampling_with_fixed_generator(variant):
    x = _x()
    layer = FFALayer(3, p=1.0, variant=variant, eps=1e-6)
    layer.shared_var_mean.copy_(T([0.1, 1.0, 3.0]))
    layer.shared_var_std.copy_(T([2.0, 0.5, 0.0]))
    layer.generator = torch.Generator().manual_seed(7)
    out = layer.train()(x)

    g = torch.Generator().manual_seed(7)
    assert torch.rand((), generator=g) < 1.0  # the p-draw comes first
    e_mu, e_sigma = torch.randn(4, 3, generator=g), torch.randn(4, 3, generator=g)
    mu = x.mean((2, 3))
    sigma = (((x - mu[:, :, None, None]) ** 2).mean((2, 3)) + 1e-6).sqrt()
    v_mu = ((mu - mu.mean(0)) ** 2).mean(0) + 1e-6
    v_sigma = ((sigma - sigma.mean(0)) ** 2).mean(0) + 1e-6
    sh_mu, sh_sigma = T([0.1, 1.0, 3.0]), T([2.0, 0.5, 0.0])

    def gamma(v):
        r = 1 / (1 + 1 / (v + 1e-6))
        return 3 * r / r.sum()

    fuse = {
        "fedfa": lambda v, s: (1 + gamma(s)) * v,
        "fedfa-r": lambda v, s: torch.full_like(v, 0.25),
        "fedfa-c": lambda v, s: v,
        "direct": lambda v, s: (s + 1) * v,
    }[variant]
    beta = mu + e_mu * fuse(v_mu, sh_mu).sqrt()
    gam = sigma + e_sigma * fuse(v_sigma, sh_sigma).sqrt()
    want = (x - mu[:, :, None, None]) / sigma[:, :, None, None] * gam[:, :, None, None]
    want = want + beta[:, :, None, None]
    assert layer.fired
    assert torch.allclose(out, want, atol=1e-5)
    # Eq. 4 momentum statistics of the batch means
    assert torch.allclose(layer.running_mean, 0.01 * mu.mean(0), atol=1e-6)
    assert torch.allclose(layer.running_std, 0.99 + 0.01 * sigma.mean(0), atol=1e-6)


def test_variants_give_different_outputs_for_the_same_noise():
    x = _x()
    outs = {}
    for variant in ("fedfa", "fedfa-r", "fedfa-c", "direct"):
        layer = FFALayer(3, p=1.0, variant=variant).train()
        layer.shared_var_mean.copy_(T([0.1, 1.0, 3.0]))
        layer.shared_var_std.copy_(T([2.0, 0.5, 0.0]))
        layer.generator = torch.Generator().manual_seed(3)
        outs[variant] = layer(x)
    names = list(outs)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            assert not torch.allclose(outs[a], outs[b]), (a, b)


def test_identity_in_eval_mode_and_when_not_fired():
    x = _x()
    layer = FFALayer(3, p=1.0).eval()
    assert layer(x) is x and not layer.fired
    assert torch.equal(layer.running_mean, torch.zeros(3))
    off = FFALayer(3, p=0.0).train()
    assert off(x) is x and torch.equal(off.running_std, torch.ones(3))


def test_one_draw_per_forward_for_the_whole_batch():
    x = _x(b=6)
    layer = FFALayer(3, p=0.5).train()
    layer.generator = torch.Generator().manual_seed(11)
    g = torch.Generator().manual_seed(11)
    fired = 0
    for _ in range(40):
        out = layer(x)
        fires = bool(torch.rand((), generator=g) < 0.5)
        assert layer.fired == fires
        if fires:
            torch.randn(6, 3, generator=g), torch.randn(6, 3, generator=g)
            fired += 1
            changed = (out - x).flatten(1).abs().amax(1) > 1e-4
            assert bool(changed.all())  # every instance of the batch is augmented
        else:
            assert out is x
    assert 8 <= fired <= 32


def test_gradients_flow_through_the_statistics():
    x = _x().requires_grad_(True)
    layer = FFALayer(3, p=1.0).train()
    layer(x).sum().backward()
    assert x.grad is not None and bool(torch.isfinite(x.grad).all())


# ----------------------------------------------------------------------------- placement
def _ffa(**kw) -> FFA:
    return FFA(FFAParams(**kw), seed=0, num_classes=10)


def test_placement_after_chosen_stages_only_and_out_of_state_dict():
    model = LeNet5()
    keys = list(model.state_dict())
    aug = _ffa(stages=["conv2"], p=1.0)
    aug.attach(model)
    assert set(model.stage_hooks) == {"conv2"} and set(aug.layers) == {"conv2"}
    assert aug.layers["conv2"].channels == 16
    assert list(model.state_dict()) == keys  # the statistics never enter the weights
    model.train()(torch.rand(4, 3, 28, 28))
    assert aug.layers["conv2"].fired
    model.eval()(torch.rand(4, 3, 28, 28))
    assert not aug.layers["conv2"].fired  # model.eval() reaches the layers


def test_default_placement_is_every_stage():
    model = SmallCNN()
    aug = _ffa()
    aug.attach(model)
    assert {s: aug.layers[s].channels for s in aug.layers} == {"conv1": 32, "conv2": 64}


def test_unknown_stage_is_rejected_with_the_valid_ones():
    with pytest.raises(ConfigError, match="valid stages: conv1, conv2"):
        _ffa(stages=["conv3"]).attach(LeNet5())


def test_existing_stage_hook_is_chained():
    model = LeNet5()
    seen = []
    model.stage_hooks["conv1"] = lambda t: seen.append(t.shape) or t
    aug = _ffa(stages=["conv1"], p=1.0)
    aug.attach(model)
    model.train()(torch.rand(2, 3, 28, 28))
    assert seen and aug.layers["conv1"].fired


# ----------------------------------------------------------------------------- exchange
def _reply(a: list[float], b: list[float]) -> Payload:
    f = torch.float32
    return Payload({"ffa_stats": {"conv1.mean": T(a, dtype=f), "conv1.std": T(b, dtype=f)}})


def _attached(**kw) -> tuple[FFA, dict]:
    model = LeNet5()
    aug = _ffa(stages=["conv1"], **kw)
    aug.attach(model)
    return aug, aug.init_server(model)


def test_server_aggregate_per_channel_and_released():
    replies = [
        ("a", _reply([0, 1, 0, 0, 0, 0], [1] * 6)),
        ("b", _reply([2, 1, 0, 0, 0, 0], [1] * 6)),
        ("c", _reply([4, 4, 0, 0, 0, 0], [1, 1, 1, 1, 1, 4])),
    ]
    aug, server = _attached()
    assert torch.equal(server["variance"]["conv1.mean"], torch.zeros(6))  # before any stats
    aug.aggregate(server, 1, replies)
    assert close(server["variance"]["conv1.mean"], [8 / 3, 2, 0, 0, 0, 0])
    assert close(server["variance"]["conv1.std"], [0, 0, 0, 0, 0, 2])
    down = aug.broadcast(server, 2, "a")
    assert set(down) == {"ffa_variance"}
    assert set(down["ffa_variance"]) == {"conv1.mean", "conv1.std"}

    rel, server_r = _attached(variance="released")
    rel.aggregate(server_r, 1, replies)
    # one unbiased variance over all 3 x 6 values: mean 2/3, sum of squares 38 - 18 * 4/9 = 30
    v = server_r["variance"]["conv1.mean"]
    assert close(v, [30 / 17] * 6)
    assert close(fusion_weights(v), torch.ones(6))


@pytest.mark.parametrize("variance", ["paper", "released"])
def test_single_reply_keeps_previous_variances(variance):
    aug, server = _attached(variance=variance)
    before = torch.full((6,), 0.25)
    server["variance"]["conv1.mean"] = before
    aug.aggregate(server, 2, [("a", _reply([0, 1, 0, 0, 0, 0], [1] * 6))])
    assert torch.equal(server["variance"]["conv1.mean"], before)


def test_client_flow_per_ema_mode():
    modes = (("reset", 0.0), ("corrected", 0.0), ("persist", 5.0), ("average", 3.0))
    for ema, want_start in modes:
        model = LeNet5()
        aug = _ffa(stages=["conv1"], p=1.0, ema=ema)
        aug.attach(model)
        state = aug.init_client("a", None, model)
        state["running"] = {"conv1.mean": torch.full((6,), 5.0), "conv1.std": torch.ones(6)}
        down = Payload(
            {
                "ffa_variance": {"conv1.mean": torch.full((6,), 0.5), "conv1.std": torch.zeros(6)},
                "ffa_running": {"conv1.mean": torch.full((6,), 3.0), "conv1.std": torch.ones(6)},
            }
        )
        layer = aug.layers["conv1"]
        layer.running_mean.fill_(-7.0)  # left over from the previous client
        aug.receive(down, state, 1)
        aug.before_train(model, state, 1)
        assert torch.equal(layer.running_mean, torch.full((6,), want_start)), ema
        assert torch.equal(layer.shared_var_mean, torch.full((6,), 0.5))
        layer.running_mean.add_(1.0)  # "training"
        up = aug.reply(model, state, 1)
        if ema == "corrected":  # nothing fired: nothing to upload
            assert up == {"ffa_stats": {}}
            layer.updates = 1  # one update: (mu_bar - 0.99^1 * 0) / (1 - 0.99^1)
            up = aug.reply(model, state, 1)
            assert close(up["ffa_stats"]["conv1.mean"], torch.full((6,), 100.0), tol=1e-3)
            assert close(up["ffa_stats"]["conv1.std"], torch.ones(6), tol=1e-4)
        else:
            assert torch.equal(up["ffa_stats"]["conv1.mean"], torch.full((6,), want_start + 1))
        kept = 6.0 if ema == "persist" else (3.0 if ema == "average" else 5.0)
        assert torch.equal(state["running"]["conv1.mean"], torch.full((6,), kept)), ema


def test_bias_corrected_momentum_is_the_weighted_batch_mean():
    # Eq. 4 from mu_bar = 0, sigma_bar = 1 (Alg. 1 line 3) over three batches, then corrected
    layer = FFALayer(2, p=1.0, variant="fedfa-c", momentum=0.9).train()
    batches = [_x(4, 2, seed) for seed in range(3)]
    for x in batches:
        layer(x)
    assert layer.updates == 3
    stats = [instance_statistics(x) for x in batches]
    w = T([0.1 * 0.81, 0.1 * 0.9, 0.1]) / (1 - 0.9**3)
    want_mu = sum(wi * s[0].mean(0) for wi, s in zip(w, stats, strict=True))
    want_sd = sum(wi * s[1].mean(0) for wi, s in zip(w, stats, strict=True))
    mu, sd = layer.momentum_statistics(corrected=True)
    assert torch.allclose(mu, want_mu, atol=1e-5) and torch.allclose(sd, want_sd, atol=1e-5)
    raw_mu, _ = layer.momentum_statistics(corrected=False)
    assert torch.allclose(raw_mu, (1 - 0.9**3) * want_mu, atol=1e-5)
    layer.reset_running()
    assert layer.updates == 0 and layer.momentum_statistics(corrected=True) is None


def _pearson(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double() - a.double().mean(), b.double() - b.double().mean()
    return float((a * b).sum() / (a.norm() * b.norm()))


def _gamma_vs_true_shift(ema: str, seed: int) -> tuple[float, float]:
    """Six clients whose channel c has feature mean base_c + s_kc, s_kc ~ N(0, tau_c^2): a
    known cross-client shift, independent of the channels' mean size base_c. Each client runs
    1-8 firing batches through the default augment flow (before_train, forward, reply), the
    server runs Eq. 5 (aggregate); returns corr(gamma_mu, true shift variance) and
    corr(gamma_mu, base_c)."""
    g = torch.Generator().manual_seed(seed)
    n_clients, channels = 6, 16
    base = torch.linspace(0, 8, channels)[torch.randperm(channels, generator=g)]
    tau = torch.linspace(0.05, 0.7, channels)[torch.randperm(channels, generator=g)]
    shift = torch.randn(n_clients, channels, generator=g) * tau
    aug = FFA(FFAParams(p=1.0, ema=ema), seed=0, num_classes=2)
    aug.layers["h"] = FFALayer(channels, p=1.0)
    server = aug.init_server(None)
    replies = []
    for k in range(n_clients):
        state = aug.init_client(str(k), None, None)
        aug.before_train(None, state, 1)
        layer = aug.layers["h"].train()
        for _ in range(int(torch.randint(1, 9, (), generator=g))):
            x = (base + shift[k]).view(1, -1, 1, 1) + 0.5 * torch.randn(16, channels, 4, 4)
            layer(x)
        replies.append((str(k), Payload(aug.reply(None, state, 1))))
    aug.aggregate(server, 1, replies)
    gamma = fusion_weights(server["variance"]["h.mean"])
    true = shift.var(dim=0, correction=0)
    return _pearson(gamma, true), _pearson(gamma, base)


def test_gamma_tracks_the_true_cross_client_shift_under_the_default_ema():
    assert FFAParams().ema == "corrected"
    torch.manual_seed(0)
    for seed in range(3):
        good, size = _gamma_vs_true_shift("corrected", seed)
        bad, bad_size = _gamma_vs_true_shift("reset", seed)
        assert good > 0.9, (seed, good)
        # the literal Alg. 1 reading: gamma follows the channels' mean size, not the shift
        assert bad < 0.5 and bad_size > 0.9, (seed, bad, bad_size)
        assert good - bad > 0.4


def test_client_without_variances_uses_gamma_one():
    model = LeNet5()
    aug = _ffa(stages=["conv1"])
    aug.attach(model)
    state = aug.init_client("a", None, model)
    aug.layers["conv1"].shared_var_mean.fill_(9.0)
    aug.before_train(model, state, 1)
    assert torch.equal(aug.layers["conv1"].shared_var_mean, torch.zeros(6))
    assert close(fusion_weights(aug.layers["conv1"].shared_var_mean), torch.ones(6))


# ----------------------------------------------------------------------------- config
def test_fedfa_implies_ffa_and_explicit_params_win(make_cfg):
    cfg = make_cfg("algorithm.name=fedfa")
    assert [a.name for a in cfg.augment] == ["ffa"]
    assert cfg.augment[0].params.variant == "fedfa" and cfg.augment[0].params.variance == "paper"
    cfg = make_cfg("algorithm.name=fedfa", "augment=[{name: ffa, variant: fedfa-c, p: 0.3}]")
    assert len(cfg.augment) == 1 and cfg.augment[0].params.variant == "fedfa-c"
    assert cfg.augment[0].params.p == 0.3


def test_config_rejects_nonsense(make_cfg):
    with pytest.raises(ConfigError, match="augment.ffa.p"):
        make_cfg("algorithm.name=fedfa", "augment=[{name: ffa, p: 1.5}]")
    with pytest.raises(ConfigError, match="fedfa-c"):
        make_cfg("algorithm.name=local", "augment=[ffa]")
    make_cfg("algorithm.name=local", "augment=[{name: ffa, variant: fedfa-c}]")


# ----------------------------------------------------------------------------- end to end
def _ffa_rows(sim: Simulation) -> list[tuple]:
    return [r for r in sim.ledger.rows if r[3].startswith("ffa")]


def test_fedfa_run_ledger_and_server_variances(make_cfg, tmp_path):
    cfg = make_cfg(
        "algorithm.name=fedfa",
        "model.name=cnn",
        "augment=[{name: ffa, ema: persist}]",
        rounds=2,
    )
    sim = Simulation(cfg, tmp_path / "run", progress=False)
    result = sim.run()
    channels = 32 + 64
    rows = _ffa_rows(sim)
    per = {}
    for rnd, cid, _, _, nbytes in rows:
        per[(rnd, cid)] = per.get((rnd, cid), 0) + nbytes
    assert sorted(per) == [(r, c) for r in (1, 2) for c in ("client0", "client1", "client2")]
    assert set(per.values()) == {4 * channels * 4}
    assert {(r[2], r[3], r[4]) for r in rows} == {
        ("up", "ffa_stats", 2 * channels * 4),
        ("down", "ffa_variance", 2 * channels * 4),
    }
    weights = sum(t.numel() * t.element_size() for t in sim.model.state_dict().values())
    assert {r[4] for r in sim.ledger.rows if r[3] == "weights"} == {weights}
    # the server's variances are Eq. 5 over the clients' last uploaded momentum statistics
    server = sim.server["aug/ffa"]["variance"]
    for key in ("conv1.mean", "conv2.std"):
        stats = torch.stack([sim.states[c]["aug/ffa"]["running"][key] for c in sim.states])
        assert torch.allclose(server[key], stats.var(0, correction=0))
        assert bool((server[key] > 0).all())
    assert math.isfinite(result.summary["test_mean"])


@pytest.mark.parametrize("variant", ["fedfa-r", "fedfa-c"])
def test_variants_without_server_statistics_send_nothing(make_cfg, tmp_path, variant):
    cfg = make_cfg("algorithm.name=fedfa", f"augment=[{{name: ffa, variant: {variant}}}]", rounds=1)
    sim = Simulation(cfg, tmp_path / variant, progress=False)
    sim.run()
    assert _ffa_rows(sim) == []


def test_released_flow_end_to_end(make_cfg, tmp_path):
    cfg = make_cfg(
        "algorithm.name=fedfa", "augment=[{name: ffa, variance: released, ema: average}]", rounds=2
    )
    sim = Simulation(cfg, tmp_path / "rel", progress=False)
    sim.run()
    server = sim.server["aug/ffa"]
    for v in server["variance"].values():
        assert bool((v == v[0]).all()) and float(v[0]) > 0  # one scalar per layer and key
    names = {(r[2], r[3]) for r in _ffa_rows(sim)}
    assert names == {("up", "ffa_stats"), ("down", "ffa_variance"), ("down", "ffa_running")}
    assert not torch.equal(server["running"]["conv1.mean"], torch.zeros(6))


def test_fedfa_two_rounds_cnn_end_to_end_and_deterministic(make_cfg, tmp_path):
    cfg = make_cfg("algorithm.name=fedfa", "model.name=cnn", rounds=2)
    a = run_experiment(cfg, run_dir=tmp_path / "a", progress=False).summary
    b = run_experiment(cfg, run_dir=tmp_path / "b", progress=False).summary
    assert a["test_mean"] == b["test_mean"] and math.isfinite(a["test_mean"])
    assert a["bytes_by_record"] == b["bytes_by_record"]
    assert set(a["bytes_by_record"]["up"]) == {"weights", "ffa_stats"}


@pytest.mark.parametrize("ema", ["corrected", "persist", "average"])
def test_killed_then_resumed_equals_uninterrupted(make_cfg, tmp_path, ema):
    """FFA's running statistics (each EMA mode) survive a kill after round 1."""
    cfg = make_cfg(
        "algorithm.name=fedfa",
        f"augment=[{{name: ffa, ema: {ema}}}]",
        "checkpoint.every=1",
        rounds=3,
    )
    assert_same_run(cfg, tmp_path, stop_after=1)


# ----------------------------------------------------------------------------- FedRobust
def test_fedrobust_affine_map_full_and_channel():
    from fedshift.algorithms.fedrobust import apply_affine

    x = torch.arange(8.0).view(2, 2, 2, 1)  # B=2, C=2, H=2, W=1: d = 4
    full = torch.eye(4).flip(0)  # reverses the flattened input
    delta = T([1.0, 0.0, 0.0, 0.0]).view(2, 2, 1)
    out = apply_affine(x, full, delta)
    assert torch.equal(out[0].flatten(), T([4.0, 2.0, 1.0, 0.0]))
    swap = T([[0.0, 1.0], [2.0, 0.0]])  # channel map: c0 <- c1, c1 <- 2 c0
    out = apply_affine(x, swap, torch.zeros(2, 2, 1))
    assert torch.equal(out[0, 0], x[0, 1]) and torch.equal(out[0, 1], 2 * x[0, 0])


def test_fedrobust_ascent_step_in_a_buffer_has_the_plain_expressions_bits():
    """The buffered step is the paper's ascent step lr (g - 2 lam (Lambda - I)) bit for bit:
    the same float32 operations in the same order, so committed FedRobust runs reproduce."""
    from fedshift.algorithms.fedrobust import BUF, ascent_step

    gen = torch.Generator().manual_seed(0)
    lam = torch.eye(37) + 0.3 * torch.randn(37, 37, generator=gen)
    lam[0, 1] = -0.0  # a signed zero off the diagonal stays as the plain expression leaves it
    grad = torch.randn(37, 37, generator=gen)
    scratch: dict = {}
    for penalty, lr in ((1.0, 0.01), (0.37, 0.003), (0.0, 0.1)):
        plain = lam + lr * (grad - 2 * penalty * (lam - torch.eye(37)))
        buffered = lam + ascent_step(lam, grad, penalty, lr, scratch)
        assert torch.equal(plain, buffered)
        assert torch.equal(plain.view(torch.int32), buffered.view(torch.int32))
    assert scratch[BUF].shape == lam.shape  # one buffer, reused


def _robust_state(sim: Simulation, cid: str) -> dict:
    state = sim.states[cid]
    found = [v for v in state.values() if isinstance(v, dict) and "affine" in v]
    return state["affine"] if "affine" in state else found[0]["affine"]


@pytest.mark.parametrize("affine", ["full", "channel"])
def test_fedrobust_learns_an_adversarial_affine_shift(make_cfg, tmp_path, affine):
    # the model barely moves (lr 1e-12): only the ascent on (Lambda_i, delta_i) acts, so the
    # learned shift must raise the client's loss above the identity map's
    cfg = make_cfg(
        "algorithm.name=fedrobust",
        f"algorithm.affine={affine}",
        "algorithm.adv_lr=0.05",
        "train.lr=0.000000000001",
        rounds=2,
    )
    sim = Simulation(cfg, tmp_path / affine, progress=False)
    sim.run()
    assert {r[3] for r in sim.ledger.rows} == {"weights"}  # the shift never leaves the client
    from fedshift.algorithms.fedrobust import apply_affine

    cid = next(iter(sim.states))
    adv = _robust_state(sim, cid)
    eye = torch.eye(adv["lambda"].shape[0])
    assert adv["lambda"].shape[0] == (3 * 28 * 28 if affine == "full" else 3)
    assert float((adv["lambda"] - eye).abs().max()) > 0 and float(adv["delta"].abs().max()) > 0
    data = sim.fed.client(cid).train
    model = sim.model
    model.load_state_dict(sim.server["weights"])
    model.eval()
    x = sim.exp.pipeline.eval(data.x[:64], None) if hasattr(sim, "exp") else data.x[:64]
    y = data.y[:64]
    with torch.no_grad():
        clean = torch.nn.functional.cross_entropy(model(x), y)
        shifted = torch.nn.functional.cross_entropy(
            model(apply_affine(x, adv["lambda"], adv["delta"])), y
        )
    assert float(shifted) > float(clean)


def test_fedrobust_segmentation_channel_map_and_resume(tmp_path):
    """FedRobust's channel maps on a U-Net: a finite Dice, and a run killed after round 1
    ends as the uninterrupted one (the maps come from the checkpoint)."""
    cfg = seg_cfg("algorithm.name=fedrobust", "algorithm.affine=channel", "checkpoint.every=1")
    runs = assert_same_run(cfg, tmp_path, stop_after=1)
    assert math.isfinite(runs["native"].summary["test_mean"])


def test_fedrobust_full_map_rejects_large_inputs(make_cfg, tmp_path):
    cfg = make_cfg("algorithm.name=fedrobust", "algorithm.max_full_dim=100", rounds=1)
    with pytest.raises(ConfigError, match="affine=channel"):
        Simulation(cfg, tmp_path / "big", progress=False).run()


# FedFA's prostate (Table 13) and DomainNet (Table 12) splits: tests/data/
