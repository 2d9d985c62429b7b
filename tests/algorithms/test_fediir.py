"""FedIIR: the gradient-alignment penalty (hand-computed classifier gradients), its second
order, the batch-weighted mean gradient, the EMA recursion kept in the server state (unlike
FL-bench's port), the lagged target and the records in the ledger."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fedshift.algorithms.fediir import (
    BATCHES,
    FedIIR,
    alignment_penalty,
    batch_weighted_mean,
    ema_update,
)
from fedshift.core.context import ClientContext
from fedshift.core.seeding import generator
from fedshift.testing import client_round, full_round, start, tiny_cfg, tiny_federation

TOL = dict(rtol=1e-5, atol=1e-6)


def hand_linear_ce_grad(z, y, w, b):
    """d CE / d (W, b) of logits = z W^T + b, mean over the batch: with p = softmax and the
    one-hot e_y, dW = (p - e_y)^T z / B and db = mean(p - e_y) (derived by hand)."""
    p = torch.softmax(z @ w.T + b, 1)
    r = p - F.one_hot(y, w.shape[0]).float()
    return r.T @ z / z.shape[0], r.mean(0)


# ----------------------------------------------------------------------------- the penalty
def test_penalty_is_the_squared_distance_of_the_classifier_gradient():
    g = torch.Generator().manual_seed(0)
    z, y = torch.randn(5, 3, generator=g), torch.tensor([0, 1, 1, 0, 1])
    w = torch.randn(2, 3, generator=g, requires_grad=True)
    b = torch.randn(2, generator=g, requires_grad=True)
    ce = F.cross_entropy(z @ w.T + b, y)
    grads = torch.autograd.grad(ce, [w, b], create_graph=True)
    tw, tb = torch.randn(2, 3, generator=g), torch.randn(2, generator=g)
    hw, hb = hand_linear_ce_grad(z, y, w.detach(), b.detach())
    want = ((hw - tw) ** 2).sum() + ((hb - tb) ** 2).sum()
    assert torch.allclose(alignment_penalty(grads, [tw, tb]), want, **TOL)
    # a target equal to the gradient: no penalty
    assert alignment_penalty(grads, [hw, hb]).abs().item() < 1e-10


def _ctx(run, cid: str) -> ClientContext:
    exp = run.exp
    return ClientContext(
        cid=cid, round=1, data=exp.train_clients[cid], model=exp.model, train=run.cfg.train,
        pipeline=exp.pipeline, generator=generator(0, "t", cid), device=exp.device,
        state=run.states[cid], task=exp.task,
    )  # fmt: skip


def _run(*over: str):
    cfg = tiny_cfg("fediir", "algorithm.penalty=0.5", *over)
    return start(cfg, tiny_federation(cfg))


def test_client_loss_is_ce_plus_penalty_times_the_distance_and_second_order():
    run = _run()
    algo, cid = run.exp.algo.algorithm, run.cids[0]
    assert isinstance(algo, FedIIR) and algo.cls_keys == ["classifier.weight", "classifier.bias"]
    ctx = _ctx(run, cid)
    model = ctx.model.train()
    x, y = next(iter(ctx.batches()))
    w, b = model.classifier.weight, model.classifier.bias
    target = [torch.full_like(w, 0.01), torch.full_like(b, -0.02)]
    ctx.scratch["fediir/target"] = target
    loss = algo.loss(ctx, x, y)
    z = model.features(x).detach()
    ce = F.cross_entropy(model.head(z), y)
    hw, hb = hand_linear_ce_grad(z, y, w.detach(), b.detach())
    dist = ((hw - target[0]) ** 2).sum() + ((hb - target[1]) ** 2).sum()
    assert torch.allclose(loss, ce + 0.5 * dist, **TOL)
    # second order: the penalty alone sends a gradient into the featurizer
    model.zero_grad()
    (loss - F.cross_entropy(model(x), y)).backward()
    conv = model.stages["conv1"].conv.weight.grad
    assert conv is not None and conv.abs().sum() > 0


# ----------------------------------------------------------------------------- mean gradient
def test_mean_gradient_is_weighted_by_batches_not_by_clients():
    a = {"w": torch.tensor([3.0, 0.0])}  # sum over 3 batches
    b = {"w": torch.tensor([0.0, 1.0])}  # sum over 1 batch
    got = batch_weighted_mean([(a, 3.0), (b, 1.0)])
    assert torch.allclose(got["w"], torch.tensor([0.75, 0.25]))  # (a + b) / 4
    # not the mean of the clients' means ((1, 0) + (0, 1)) / 2
    assert not torch.allclose(got["w"], torch.tensor([0.5, 0.5]))


def test_ema_recursion():
    g = [{"w": torch.tensor([float(t)])} for t in (1, 2, 4)]
    bar = {"w": torch.zeros(1)}
    for new in g:
        bar = ema_update(bar, new, 0.9)
    # g_bar_3 = 0.1 (0.9^2 * 1 + 0.9 * 2 + 4)
    assert bar["w"].item() == pytest.approx(0.1 * (0.81 + 1.8 + 4.0), rel=1e-6)


def test_gradient_sum_is_the_sum_of_batch_gradients_and_leaves_bn_alone():
    run = _run()
    algo, cid = run.exp.algo.algorithm, run.cids[0]
    ctx = _ctx(run, cid)
    model = ctx.model
    bn = {k: v.clone() for k, v in model.state_dict().items() if "bn" in k}
    sums, batches = algo.gradient_sum(ctx)
    n, bs = ctx.num_train, run.cfg.train.batch_size
    assert batches == n // bs == 3  # 12 examples, batches of 4
    assert all(torch.equal(model.state_dict()[k], v) for k, v in bn.items())
    # reference: the hand gradient of each batch's CE on the embedding, summed
    split = ctx.data.train
    want_w = torch.zeros_like(model.classifier.weight)
    for s in range(0, n, bs):
        x = ctx.pipeline.eval(split.x[s : s + bs], ctx.state)  # no training augments here
        with torch.no_grad():
            z = model.train().features(x)
        want_w += hand_linear_ce_grad(z, split.y[s : s + bs], model.classifier.weight,
                                      model.classifier.bias)[0]  # fmt: skip
    assert torch.allclose(sums["classifier.weight"], want_w, rtol=1e-4, atol=1e-6)


# ----------------------------------------------------------------------------- the server
def test_server_keeps_the_ema_and_broadcasts_it_next_round():
    run = _run()
    algo = run.exp.algo
    assert all(t.abs().sum() == 0 for t in run.server["grad_mean"].values())  # g_bar_0 = 0
    down = algo.broadcast(run.server, 1, run.cids[0])
    assert set(down.records) == {"weights", "grad_mean"}
    replies = full_round(run, 1)
    for _, up in replies:
        assert set(up.records) == {"weights", "grad", BATCHES}
        assert up[BATCHES][BATCHES].item() == 3
    g1 = batch_weighted_mean([(up["grad"], 3.0) for _, up in replies])
    first = {k: v.clone() for k, v in run.server["grad_mean"].items()}
    for k in first:
        assert torch.allclose(first[k], 0.05 * g1[k], **TOL)  # ema 0.95 from 0
    sent = algo.broadcast(run.server, 2, run.cids[0])["grad_mean"]
    assert all(torch.equal(sent[k], first[k]) for k in first)  # the lagged target
    replies = full_round(run, 2)
    g2 = batch_weighted_mean([(up["grad"], 3.0) for _, up in replies])
    for k in first:  # the EMA persists across rounds (FL-bench's port restarts it from 0)
        want = 0.95 * first[k] + 0.05 * g2[k]
        assert torch.allclose(run.server["grad_mean"][k], want, **TOL)


def test_the_gradient_records_are_the_classifier_size_in_the_ledger():
    run = _run()
    up = client_round(run, 1, run.cids[0], run.states[run.cids[0]])
    nbytes = up.nbytes()
    assert nbytes["grad"] == (10 * 128 + 10) * 4  # SmallCNN classifier, float32
    assert nbytes[BATCHES] == 4
    assert FedIIR.paper_weighting == "uniform"
