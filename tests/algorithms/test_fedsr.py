"""FedSR: the L2R and CMI regularisers (hand-computed and against torch.distributions), the
probabilistic model (draw shapes, evaluation by the mean softmax over draws), where the
reference distributions live, and a short end-to-end run."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import distributions as D
from torch import nn

from fedshift.algorithms.fedsr import (
    EVAL_SEED,
    REF_KEYS,
    FedSR,
    FedSRModel,
    cmi_regulariser,
    gaussian_kl,
    l2r_regulariser,
    mean_softmax_scores,
)
from fedshift.core.errors import ConfigError
from fedshift.models.base import FedModel
from fedshift.testing import full_round, start, tiny_cfg, tiny_federation

TOL = dict(rtol=1e-5, atol=1e-6)  # float32 rounding of a few operations


# ----------------------------------------------------------------------------- L2R
def test_l2r_is_the_batch_mean_of_the_norms_or_of_their_squares():
    z = torch.tensor([[3.0, 4.0], [0.0, 1.0]])
    # ||(3, 4)|| = 5, ||(0, 1)|| = 1 -> mean 3; squared: 25 and 1 -> mean 13
    assert torch.allclose(l2r_regulariser(z), torch.tensor(3.0))
    assert torch.allclose(l2r_regulariser(z, "squared"), torch.tensor(13.0))


# ----------------------------------------------------------------------------- CMI (KL)
def test_gaussian_kl_by_hand():
    # KL(N(1, 1) || N(0, 2^2)) = log 2 - log 1 + (1 + 1) / (2 * 4) - 1/2 = log 2 - 1/4
    got = gaussian_kl(*(torch.tensor([v]) for v in (1.0, 1.0, 0.0, 2.0)))
    assert got.item() == pytest.approx(math.log(2) - 0.25, rel=1e-6)
    # identical distributions: 0
    same = gaussian_kl(*(torch.tensor([v]) for v in (0.3, 0.7, 0.3, 0.7)))
    assert same.abs().item() < 1e-6


def test_gaussian_kl_equals_torch_distributions():
    g = torch.Generator().manual_seed(0)
    mq, mp = torch.randn(5, 3, generator=g), torch.randn(5, 3, generator=g)
    sq, sp = torch.rand(5, 3, generator=g) + 0.1, torch.rand(5, 3, generator=g) + 0.1
    ref = D.kl_divergence(D.Normal(mq, sq), D.Normal(mp, sp))
    assert torch.allclose(gaussian_kl(mq, sq, mp, sp), ref, **TOL)


def test_cmi_scales_z_by_c_and_uses_the_label_row_of_the_softplus_reference():
    g = torch.Generator().manual_seed(1)
    mu, sigma = torch.randn(4, 3, generator=g), torch.rand(4, 3, generator=g) + 0.2
    y = torch.tensor([0, 2, 2, 1])
    r_mu, r_sigma = torch.randn(3, 3, generator=g), torch.randn(3, 3, generator=g)
    c = torch.tensor(1.7)
    got = cmi_regulariser(mu, sigma, y, r_mu, r_sigma, c)
    # independent reference: KL of the d-dimensional diagonal Gaussians, batch mean
    q = D.Independent(D.Normal(c * mu, c * sigma), 1)
    r = D.Independent(D.Normal(r_mu[y], F.softplus(r_sigma[y])), 1)
    assert torch.allclose(got, D.kl_divergence(q, r).mean(), **TOL)
    # hand case: z_dim 1, one example with C mu = r_mu and C sigma = softplus(r_sigma): 0
    s = F.softplus(torch.tensor([[0.4]]))
    one, half, raw = torch.tensor([[1.0]]), torch.tensor([[0.5]]), torch.tensor([[0.4]])
    zero = cmi_regulariser(half, s / 2, torch.tensor([0]), one, raw, torch.tensor(2.0))
    assert zero.abs().item() < 1e-6


# ----------------------------------------------------------------------------- the model
class Tiny(FedModel):
    """A 3-d input -> 4-d embedding -> 2 classes backbone."""

    def __init__(self) -> None:
        super().__init__()
        self.stages = nn.ModuleDict({"lin": nn.Linear(3, 4)})
        self.embed = nn.Identity()
        self.classifier = nn.Linear(4, 2)


def _model(**kw) -> FedSRModel:
    torch.manual_seed(0)
    return FedSRModel(Tiny(), 4, kw.pop("z_dim", 5), 2, **kw)


def test_model_layout_draw_shapes_and_features():
    m = _model()
    keys = set(m.state_dict())
    assert {"posterior.weight", "classifier.weight", "base.stages.lin.weight"} <= keys
    assert not any(k.startswith("base.classifier") for k in keys)  # the backbone's head is gone
    assert m.posterior.out_features == 10 and m.classifier.in_features == 5
    x = torch.randn(6, 3)
    mu, sigma = m.distribution(x)
    assert mu.shape == sigma.shape == (6, 5) and bool((sigma > 0).all())
    m.train()
    assert m.features(x).shape == (6, 5) and m(x).shape == (6, 2)
    m.eval()
    assert torch.equal(m.features(x), mu)  # evaluation embeds the mean
    # the backbone's stage hooks are the wrapper's
    m.stage_hooks["lin"] = lambda t: t * 0
    assert torch.equal(m.distribution(x)[0], m.posterior(torch.zeros(6, 4))[:, :5])


def test_evaluation_averages_the_softmax_over_the_draws():
    m = _model(num_samples=7).eval()
    x = torch.randn(3, 3)
    rng = torch.get_rng_state()
    out = m(x)
    assert torch.equal(torch.get_rng_state(), rng)  # no draw from torch's global generator
    assert torch.equal(out, m(x))  # a function of the weights alone
    # reference: the same 7 draws, one softmax per draw, averaged per example, log
    mu, sigma = m.distribution(x)
    g = torch.Generator().manual_seed(EVAL_SEED)
    eps = torch.randn(7, 3, 5, generator=g)
    probs = torch.stack([torch.softmax(m.classifier(mu + sigma * eps[s]), 1) for s in range(7)])
    assert torch.allclose(out, probs.mean(0).log(), **TOL)
    assert torch.allclose(out.exp().sum(1), torch.ones(3), **TOL)
    # mean_softmax_scores: two draws with probabilities (1, 0)-ish and (0, 1)-ish average
    logits = torch.tensor([[[0.0, 0.0]], [[math.log(3.0), 0.0]]])  # softmax (.5,.5), (.75,.25)
    assert torch.allclose(mean_softmax_scores(logits).exp(), torch.tensor([[0.625, 0.375]]))
    # prediction=mean classifies mu
    det = _model(prediction="mean").eval()
    assert torch.allclose(det(x), det.classifier(det.distribution(x)[0]))


def test_z_dim_defaults_to_the_backbone_embedding_width():
    cfg = tiny_cfg("fedsr")
    run = start(cfg, tiny_federation(cfg))
    model = run.exp.model
    assert isinstance(model, FedSRModel) and model.z_dim == 128  # SmallCNN's embedding
    cfg = tiny_cfg("fedsr", "algorithm.z_dim=16")
    assert start(cfg, tiny_federation(cfg)).exp.model.classifier.in_features == 16


def test_fedsr_is_for_classification_and_averages_uniformly():
    assert FedSR.tasks == ("classification",)
    assert FedSR.paper_weighting == "uniform"  # released communicate: plain mean


# ----------------------------------------------------------------------------- references
def _run(*over: str):
    cfg = tiny_cfg("fedsr", "algorithm.cmi_coeff=0.5", *over)
    return start(cfg, tiny_federation(cfg))


def test_local_references_train_on_each_client_and_are_never_sent():
    run = _run()
    assert "reference" not in run.server
    before = {c: {k: s["reference"][k].clone() for k in REF_KEYS} for c, s in run.states.items()}
    replies = full_round(run, 1)
    for cid, up in replies:
        assert set(up.records) == {"weights"}
        ref = run.states[cid]["reference"]
        # the CMI term trains r_mu, r_sigma and C (one optimiser with the model)
        assert all(not torch.equal(ref[k], before[cid][k]) for k in REF_KEYS)
    a, b = (run.states[c]["reference"]["r_mu"] for c in run.cids)
    assert not torch.equal(a, b)  # each client's own


def test_averaged_references_go_up_and_the_server_averages_them():
    run = _run("algorithm.reference=averaged")
    k, d = 10, 128  # toyshift classes, SmallCNN width
    assert run.server["reference"]["r_mu"].shape == (k, d)
    assert "reference" not in next(iter(run.states.values()))
    down = run.exp.algo.broadcast(run.server, 1, run.cids[0])
    assert set(down.records) >= {"weights", "reference"}
    replies = full_round(run, 1)
    # uniform weighting (the released code's plain mean)
    for key in REF_KEYS:
        mean = (replies[0][1]["reference"][key] + replies[1][1]["reference"][key]) / 2
        assert torch.allclose(run.server["reference"][key], mean, **TOL)
    nbytes = replies[0][1].nbytes()["reference"]
    assert nbytes == (2 * k * d + 1) * 4  # r_mu, r_sigma (float32) and C


def test_a_model_whose_features_are_not_vectors_is_refused():
    from fedshift.algorithms.fedsr import embedding_width

    class Maps(Tiny):
        def __init__(self) -> None:
            super().__init__()
            self.classifier = nn.Conv2d(4, 2, 1)

        def features(self, x: torch.Tensor) -> torch.Tensor:
            return x.new_zeros(x.shape[0], 4, 2, 2)

    with pytest.raises(ConfigError, match="one vector per image"):
        embedding_width(Maps(), (3,))


# ----------------------------------------------------------------------------- FedL2R, checks
def test_deterministic_representation_is_the_released_fedl2r():
    m = _model(probabilistic=False)
    assert m.posterior.out_features == 5  # z itself, no scale
    x = torch.randn(4, 3)
    z = m.posterior(m.base.features(x))
    for mode in (True, False):  # no draw in training, none at evaluation
        m.train(mode)
        assert torch.equal(m.features(x), z) and torch.equal(m(x), m.classifier(z))
    run = _run("algorithm.representation=deterministic", "algorithm.cmi_coeff=0")
    assert "reference" not in next(iter(run.states.values()))
    assert set(full_round(run, 1)[0][1].records) == {"weights"}


@pytest.mark.parametrize(
    ("over", "key"),
    [
        (("algorithm.representation=deterministic",), "cmi_coeff"),
        (("algorithm.reference=averaged", "algorithm.cmi_coeff=0"), "algorithm.reference"),
    ],
)
def test_settings_without_effect_are_config_errors(over, key):
    with pytest.raises(ConfigError, match=key):
        cfg = tiny_cfg("fedsr", *over)
        start(cfg, tiny_federation(cfg))


def test_without_cmi_no_reference_is_kept_or_sent():
    run = _run("algorithm.cmi_coeff=0")
    assert "reference" not in next(iter(run.states.values())) and "reference" not in run.server


def test_client_loss_is_ce_plus_the_weighted_regularisers_on_one_draw():
    from fedshift.algorithms.fedsr import REFERENCE
    from fedshift.core.context import ClientContext
    from fedshift.core.seeding import generator

    run = _run("algorithm.l2r_coeff=0.3")
    exp, cid = run.exp, run.cids[0]
    ctx = ClientContext(
        cid=cid, round=1, data=exp.train_clients[cid], model=exp.model, train=run.cfg.train,
        pipeline=exp.pipeline, generator=generator(0, "t", cid), device=exp.device,
        state=run.states[cid], task=exp.task,
    )  # fmt: skip
    g = torch.Generator().manual_seed(3)
    ref = {
        "r_mu": torch.randn(10, 128, generator=g),
        "r_sigma": torch.randn(10, 128, generator=g),
        "C": torch.tensor(0.8),
    }
    ctx.scratch[REFERENCE] = ref
    model = exp.model.train()
    x = ctx.pipeline.eval(exp.train_clients[cid].train.x[:4], ctx.state)
    y = exp.train_clients[cid].train.y[:4]
    loss = run.exp.algo.algorithm.loss(ctx, x, y)
    # reference: the same draw from a fresh copy of the client's generator
    mu, sigma = model.distribution(x)
    eps = torch.randn(mu.shape, generator=generator(0, "t", cid))
    z = mu + sigma * eps
    q = D.Independent(D.Normal(0.8 * mu, 0.8 * sigma), 1)
    r = D.Independent(D.Normal(ref["r_mu"][y], F.softplus(ref["r_sigma"][y])), 1)
    want = (
        F.cross_entropy(model.classifier(z), y)
        + 0.3 * z.norm(dim=1).mean()
        + 0.5 * D.kl_divergence(q, r).mean()
    )
    assert torch.allclose(loss, want, rtol=1e-5, atol=1e-5)
