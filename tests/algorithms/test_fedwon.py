"""FedWon (Zhuang & Lyu, ICLR 2024): the normalisation-free model option
(:mod:`fedshift.models.normfree`: scaled weight standardisation, Eq. 1, no normalisation
layer), adaptive gradient clipping (:mod:`fedshift.algorithms.agc`, NFNets Eq. 3) and the
``fedwon`` algorithm's refusals. Hand-computed cases on tiny tensors; behaviour on the tiny
federation of :mod:`fedshift.testing`."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

from fedshift.algorithms.agc import adaptive_clip_, agc_parameters, unitwise_norm
from fedshift.core.errors import ConfigError
from fedshift.models import build_model
from fedshift.models.normfree import (
    NORM_TYPES,
    RELU_GAMMA,
    WSConv2d,
    is_norm_free,
    make_norm_free,
    standardize_weight,
)
from fedshift.runtime.experiment import build_experiment
from fedshift.testing import check_one_round, full_round, start, tiny_cfg, tiny_federation

FEDWON = ("model.norm=none", "model.conv=ws")


# ----------------------------------------------------------------------------- Eq. 1 (WSConv)
def _tiny_kernel() -> torch.Tensor:
    """Two output channels, one input channel, 2x2 kernels: fan-in N = 4."""
    return torch.tensor([[[[1.0, 2.0], [3.0, 4.0]]], [[[0.0, 0.0], [0.0, 2.0]]]])


def test_standardised_weight_equals_the_hand_computation():
    """Channel 0 = (1, 2, 3, 4): mean 2.5, population variance 1.25, N var = 5, so
    W_hat = g gamma (W - 2.5) / sqrt(5). Channel 1 = (0, 0, 0, 2): mean 0.5, variance 0.75,
    N var = 3, so W_hat = g gamma (W - 0.5) / sqrt(3). Gains (1, 2), gamma 1.5."""
    w = _tiny_kernel()
    gain = torch.tensor([1.0, 2.0])
    got = standardize_weight(w, gain, gamma=1.5)
    want0 = 1.5 * torch.tensor([-1.5, -0.5, 0.5, 1.5]) / math.sqrt(5.0)
    want1 = 2.0 * 1.5 * torch.tensor([-0.5, -0.5, -0.5, 1.5]) / math.sqrt(3.0)
    torch.testing.assert_close(got[0].flatten(), want0)
    torch.testing.assert_close(got[1].flatten(), want1)
    # the defining properties: per channel mean 0 and std g gamma / sqrt(N)
    flat = got.flatten(1)
    torch.testing.assert_close(flat.mean(1), torch.zeros(2), atol=1e-6, rtol=0)
    torch.testing.assert_close(flat.std(1, unbiased=False), gain * 1.5 / math.sqrt(4.0))


def test_a_constant_kernel_standardises_to_zero_not_nan():
    """sigma = 0: the floor eps under the square root keeps the weight finite (0)."""
    w = torch.full((1, 2, 3, 3), 0.5)  # exact in float32: the mean is exactly 0.5
    got = standardize_weight(w, torch.ones(1), gamma=RELU_GAMMA)
    assert torch.equal(got, torch.zeros_like(w))


def test_wsconv_forward_equals_conv_with_the_standardised_weight():
    torch.manual_seed(0)
    conv = WSConv2d(2, 3, 3, padding=1, gamma=RELU_GAMMA)
    with torch.no_grad():
        conv.gain.copy_(torch.tensor([0.5, 1.0, 2.0]))
    x = torch.randn(2, 2, 5, 5)
    w = conv.weight.detach()
    mean = w.mean(dim=(1, 2, 3), keepdim=True)
    std = w.std(dim=(1, 2, 3), unbiased=False, keepdim=True)
    w_hat = conv.gain.detach().view(-1, 1, 1, 1) * RELU_GAMMA * (w - mean) / (std * math.sqrt(18))
    want = F.conv2d(x, w_hat, conv.bias.detach(), padding=1)
    torch.testing.assert_close(conv(x), want, rtol=1e-5, atol=1e-5)
    assert pytest.approx(math.sqrt(2 / (1 - 1 / math.pi))) == RELU_GAMMA  # NF-ResNets' ReLU gain


def test_wsconv_gradient_reaches_weight_bias_and_gain():
    conv = WSConv2d(1, 2, 2)
    conv(torch.randn(1, 1, 3, 3)).square().sum().backward()
    for p in (conv.weight, conv.bias, conv.gain):
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0


# ----------------------------------------------------------------------------- the model option
MODELS = [
    ({"name": "cnn", "width": 4}, (3, 28, 28), "classification"),
    ({"name": "digitmodel"}, (3, 28, 28), "classification"),
    ({"name": "lenet5"}, (3, 28, 28), "classification"),
    ({"name": "alexnet", "hidden": 16}, (3, 64, 64), "classification"),
    ({"name": "resnet18", "width": 4, "small_input": True}, (3, 16, 16), "classification"),
    ({"name": "unet", "width": 4}, (1, 16, 16), "segmentation"),
    ({"name": "densenet121", "growth": 4, "blocks": [1, 1, 1, 1], "init_features": 8},
     (3, 32, 32), "classification"),
]  # fmt: skip


@pytest.mark.parametrize(("section", "shape", "task"), MODELS, ids=lambda v: str(v))
def test_ws_models_have_no_normalisation_and_no_running_statistics(section, shape, task):
    """model.norm=none model.conv=ws: no normalisation module, no buffer at all, every
    Conv2d a WSConv2d with a gain, linear layers plain; the raw conv weights are the seeded
    weights of the model as built (the conversion draws no random number); a finite
    forward pass."""
    torch.manual_seed(3)
    plain = build_model(dict(section), 2, shape, task)
    torch.manual_seed(3)
    ws = build_model({**section, "norm": "none", "conv": "ws"}, 2, shape, task)
    assert is_norm_free(ws) is None
    assert not [n for n, m in ws.named_modules() if isinstance(m, NORM_TYPES)]
    assert not list(ws.buffers())
    convs = {n: m for n, m in ws.named_modules() if isinstance(m, nn.Conv2d)}
    assert convs and all(isinstance(m, WSConv2d) for m in convs.values())
    assert not any(isinstance(m, WSConv2d) for m in ws.modules() if isinstance(m, nn.Linear))
    plain_state, ws_state = plain.state_dict(), ws.state_dict()
    for name, m in convs.items():
        assert torch.equal(ws_state[f"{name}.weight"], plain_state[f"{name}.weight"]), name
        assert torch.equal(m.gain.detach(), torch.ones(m.out_channels))
        assert m.bias is not None  # a removed BN's shift becomes the conv's bias
    assert plain.bn_layer_names() and not ws.bn_layer_names()
    ws.eval()
    out = ws(torch.randn(2, *shape))
    assert torch.isfinite(out).all()


def test_norm_none_with_plain_convs_and_ws_with_norm_kept():
    """The two keys are independent: norm=none alone removes the BN layers and gives the
    bias-free ResNet convolutions a zero bias; conv=ws alone keeps the BN layers."""
    section = {"name": "resnet18", "width": 4, "small_input": True}
    bare = build_model({**section, "norm": "none"}, 2, (3, 16, 16))
    assert not bare.bn_layer_names()
    convs = [m for m in bare.modules() if isinstance(m, nn.Conv2d)]
    assert not any(isinstance(m, WSConv2d) for m in convs)
    assert all(m.bias is not None and not m.bias.any() for m in convs)
    assert "not weight-standardised" in is_norm_free(bare)  # not FedWon's model: plain convs
    ws_bn = build_model({**section, "conv": "ws"}, 2, (3, 16, 16))
    assert ws_bn.bn_layer_names() and "normalisation layer" in is_norm_free(ws_bn)
    assert make_norm_free(ws_bn, "keep", "ws") is ws_bn  # idempotent: WSConv2d stays


def test_default_keys_leave_the_model_as_built():
    torch.manual_seed(1)
    a = build_model({"name": "cnn", "width": 4}, 3, (3, 28, 28))
    torch.manual_seed(1)
    b = build_model({"name": "cnn", "width": 4, "norm": "keep", "conv": "plain"}, 3, (3, 28, 28))
    assert list(a.state_dict()) == list(b.state_dict())
    assert all(torch.equal(a.state_dict()[k], v) for k, v in b.state_dict().items())


# ----------------------------------------------------------------------------- AGC (NFNets Eq. 3)
def test_agc_clips_units_above_lambda_and_leaves_those_below():
    """lambda = 0.1, eps = 1e-3. Weight rows (3, 4) (norm 5) and (0, 1) (norm 1):
    row 0's gradient (0.6, 0.8) has norm 1, ratio 1/5 = 0.2 > 0.1: scaled by
    0.1 * 5 / 1 = 0.5 to (0.3, 0.4); row 1's (0.03, 0.04) has ratio 0.05 < 0.1: unchanged.
    A bias vector is one unit: weights (0, 0) floor at eps, max norm 1e-4; its gradient
    (0.3, 0.4) (norm 0.5) becomes (0.3, 0.4) * 1e-4 / 0.5."""
    w = nn.Parameter(torch.tensor([[3.0, 4.0], [0.0, 1.0]]))
    w.grad = torch.tensor([[0.6, 0.8], [0.03, 0.04]])
    b = nn.Parameter(torch.zeros(2))
    b.grad = torch.tensor([0.3, 0.4])
    adaptive_clip_([w, b], clip=0.1, eps=1e-3)
    torch.testing.assert_close(w.grad, torch.tensor([[0.3, 0.4], [0.03, 0.04]]))
    torch.testing.assert_close(b.grad, torch.tensor([0.3, 0.4]) * 1e-4 / 0.5)


def test_agc_units_of_a_convolution_are_its_output_channels():
    """Kernel (2, 1, 1, 2): channel 0 weights (0, 2) norm 2, gradient (0, 1): ratio 0.5 >
    lambda 0.25: scaled by 0.25 * 2 / 1 to (0, 0.5); channel 1 weights (1, 0), gradient
    (0.1, 0): ratio 0.1, unchanged."""
    w = nn.Parameter(torch.tensor([[[[0.0, 2.0]]], [[[1.0, 0.0]]]]))
    w.grad = torch.tensor([[[[0.0, 1.0]]], [[[0.1, 0.0]]]])
    assert unitwise_norm(w.grad).flatten().tolist() == pytest.approx([1.0, 0.1])
    adaptive_clip_([w], clip=0.25)
    torch.testing.assert_close(w.grad, torch.tensor([[[[0.0, 0.5]]], [[[0.1, 0.0]]]]))


def test_agc_leaves_the_classifier_out_unless_asked():
    model = build_model({"name": "cnn", "width": 4}, 3, (3, 28, 28))
    head = {id(p) for p in model.classifier.parameters()}
    assert not head & {id(p) for p in agc_parameters(model, head=False)}
    assert head <= {id(p) for p in agc_parameters(model, head=True)}


def _change_ratio(before: dict, after: dict, key: str) -> float:
    """The largest ||W_i' - W_i|| / max(||W_i||, eps) over the units of one tensor."""
    delta = unitwise_norm(after[key] - before[key]).flatten()
    return float((delta / unitwise_norm(before[key]).clamp(min=1e-3).flatten()).max())


@pytest.mark.parametrize("head", [False, True])
def test_a_round_with_agc_moves_every_clipped_unit_by_at_most_lr_lambda(head, one_thread):
    """train.agc in the default local step: one SGD step (lr 1, no momentum) per client,
    so every clipped unit moves by at most lr * lambda * max(||W_i||, eps) in each client,
    and so in their average; the classifier, left out by default, moves further."""
    lam = 1e-4
    over = ("train.local_steps=1", "train.lr=1.0", f"train.agc={lam}", f"train.agc_head={head}")
    cfg = tiny_cfg("fedavg", *FEDWON, *over)
    run = start(cfg, tiny_federation(cfg))
    comp = run.exp.algo
    before = {k: v.clone() for k, v in comp.global_weights(run.server).items()}
    full_round(run, 1)
    after = comp.global_weights(run.server)
    for key in before:
        ratio = _change_ratio(before, after, key)
        if key.startswith("classifier.") and not head:
            continue
        assert ratio <= lam * (1 + 1e-4), key
    head_moves = max(_change_ratio(before, after, k) for k in before if "classifier" in k)
    assert (head_moves > 10 * lam) == (not head)


# ----------------------------------------------------------------------------- loud refusals
def test_fedbn_on_the_normalisation_free_model_fails_loudly():
    cfg = tiny_cfg("fedbn", *FEDWON)
    with pytest.raises(ConfigError, match=r"fedbn.*no batch-norm layer"):
        build_experiment(cfg, tiny_federation(cfg))


def test_fedwon_refuses_a_model_with_normalisation_or_plain_convolutions():
    for over in (("model.norm=keep",), ("model.conv=plain",)):
        cfg = tiny_cfg("fedwon", *over)
        with pytest.raises(ConfigError, match="fedwon.*normalisation-free model"):
            build_experiment(cfg, tiny_federation(cfg))


def test_fedwon_refuses_to_run_without_clipping():
    with pytest.raises(ConfigError, match="fedwon.*train.agc"):
        cfg = tiny_cfg("fedwon", "train.agc=null")
        build_experiment(cfg, tiny_federation(cfg))


def test_agc_with_an_algorithm_of_its_own_local_step_fails_loudly():
    cfg = tiny_cfg("distrans", "train.agc=0.1")
    with pytest.raises(ConfigError, match="train.agc.*distrans.*own local step"):
        build_experiment(cfg, tiny_federation(cfg))


def test_fedwon_runs_a_round_as_fedavg_on_the_same_model(one_thread):
    """FedWon is FedAvg on its model: one round of each from the same seed is the same."""
    outs = []
    for name in ("fedwon", "fedavg"):
        cfg = tiny_cfg(name, *FEDWON, "train.agc=1.28")
        run = start(cfg, tiny_federation(cfg))
        full_round(run, 1)
        outs.append(run.exp.algo.global_weights(run.server))
    assert outs[0].keys() == outs[1].keys()
    assert all(torch.equal(outs[0][k], outs[1][k]) for k in outs[0])


def test_fedfa_feature_statistics_need_no_bn_and_run_on_the_normalisation_free_model(one_thread):
    """FedFA's FFA layers use feature-map statistics, not BN tensors: a round on FedWon's
    model is a valid round (state, payloads, weights with the model's keys)."""
    cfg = tiny_cfg("fedfa", *FEDWON)
    check_one_round(cfg, tiny_federation(cfg))


def test_batch_size_one_takes_one_step_per_example(one_thread):
    """FedWon's small-batch setting: with train.batch_size=1 every example is a batch (a
    trailing one-example batch is skipped only for larger batch sizes, where BatchNorm needs
    two): one local epoch is len(train) steps, and the round ends."""
    cfg = tiny_cfg("fedwon", "train.batch_size=1", "train.local_steps=null")
    run = start(cfg, tiny_federation(cfg))
    for cid, up in full_round(run, 1):
        assert up.metrics["steps"] == len(run.exp.train_clients[cid].train), cid
