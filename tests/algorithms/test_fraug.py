"""FRAug: MMD, the head-only synthetic loss, generator sharing, local RTNet, prototypes,
the ramp-up, the Table 3 ablations, config checks and resume."""

from __future__ import annotations

import copy
import math
from collections.abc import Iterable

import pytest
import torch
import torch.nn.functional as F
from support.replies import reply
from support.same_run import assert_same_run

from fedshift.algorithms.fraug import (
    FRAug,
    FRAugParams,
    Generator,
    RoundPlan,
    RTNet,
    cyclic_labels,
    entropy,
    mmd,
    ramp_factor,
    synthetic_weight,
    update_prototypes,
)
from fedshift.algorithms.fraug.objectives import StepBatch
from fedshift.core.config import TrainConfig
from fedshift.core.errors import ConfigError
from fedshift.runtime.client import client_context, train_client
from fedshift.runtime.rundir.checkpoint_io import read_checkpoint
from fedshift.runtime.simulation import (
    Simulation,
    run_experiment,
)

EMBEDDINGS = ("both", "agnostic", "u_hat", "u_hat_c")


def fraug_sim(make_cfg, tmp_path, *over: str, rounds: int = 2) -> Simulation:
    cfg = make_cfg("algorithm.name=fraug", *over, rounds=rounds)
    return Simulation(cfg, tmp_path / "sim", progress=False)


def algo_of(sim: Simulation) -> FRAug:
    algo = sim.algo.algorithm
    assert isinstance(algo, FRAug)
    return algo


def batch(sim: Simulation, n: int = 12) -> tuple[torch.Tensor, torch.Tensor]:
    split = sim.train_clients["client0"].train
    return (split.x[:n] - 0.5) / 0.5, split.y[:n]


# ----------------------------------------------------------------------------- MMD
def test_mmd_zero_for_identical_sets_positive_otherwise_and_hand_value():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(7, 5, generator=g)
    assert mmd(x, x.clone()).item() == 0.0
    assert mmd(x, x + 0.5).item() > 0
    assert mmd(x, torch.randn(7, 5, generator=g)).item() > 0
    # hand value: x = {0, 1}, y = {3, 3} in 1-d. Pooled squared distances over ordered pairs
    # i != j sum to 2 * (1 + 9 + 9 + 4 + 4 + 0) = 54 over 12 pairs: s = 4.5; bandwidths
    # s/4, s/2, s, 2s, 4s.
    bws = [1.125, 2.25, 4.5, 9.0, 18.0]

    def k(d2: float) -> float:
        return sum(math.exp(-d2 / b) for b in bws)

    xx = (2 * k(0) + 2 * k(1)) / 4
    yy = k(0)
    xy = (2 * k(9) + 2 * k(4)) / 4
    got = mmd(torch.tensor([[0.0], [1.0]]), torch.tensor([[3.0], [3.0]])).item()
    assert got == pytest.approx(xx + yy - 2 * xy, rel=1e-6)
    # the code's "mean_cov": (mean diff)^2 + (cov diff)^2; cov{0, 2} = 2, cov{1, 1} = 0
    got = mmd(torch.tensor([[0.0], [2.0]]), torch.tensor([[1.0], [1.0]]), kernel="mean_cov")
    assert got.item() == pytest.approx(4.0)


def test_entropy_of_uniform_and_certain_predictions():
    assert entropy(torch.zeros(3, 4)).item() == pytest.approx(math.log(4))
    assert entropy(torch.tensor([[100.0, 0.0, 0.0]])).item() == pytest.approx(0.0, abs=1e-6)


# ----------------------------------------------------------------------------- Eq. 1
@pytest.mark.parametrize("embeddings", EMBEDDINGS)
def test_synthetic_loss_gradient_reaches_only_the_head(make_cfg, tmp_path, embeddings):
    sim = fraug_sim(make_cfg, tmp_path, f"algorithm.embeddings={embeddings}")
    algo, model = algo_of(sim), sim.model
    model.train()
    x, y = batch(sim)
    u = model.features(x)  # with its graph: the loss must not reach the extractor
    y_c = torch.arange(len(y)) % algo.num_classes
    protos = torch.randn(algo.num_classes, algo.dim)
    model.zero_grad(set_to_none=True)
    branches = algo.synthetic_embeddings(u, StepBatch(y, y_c, None, protos))
    torch.stack(list(algo.synthetic_terms(model, branches))).sum().backward()
    head = {f"classifier.{n}" for n, _ in model.classifier.named_parameters()}
    for name, p in model.named_parameters():
        if name in head:
            assert p.grad is not None and p.grad.abs().sum() > 0, name
        else:
            assert p.grad is None or not p.grad.any(), name
    for net in (algo.generator, algo.rtnet):
        if net is not None:
            assert all(p.grad is None for p in net.parameters())


@pytest.mark.parametrize("embeddings", EMBEDDINGS)
def test_ablations_compute_different_branches(make_cfg, tmp_path, embeddings):
    sim = fraug_sim(make_cfg, tmp_path, f"algorithm.embeddings={embeddings}")
    algo = algo_of(sim)
    y = torch.tensor([1, 1, 2, 3])
    y_c = torch.tensor([5, 6, 7, 8])
    protos = torch.randn(algo.num_classes, algo.dim)
    u = torch.randn(4, algo.dim)
    algo.generator.eval()
    if algo.rtnet is not None:
        algo.rtnet.eval()
    out = algo.synthetic_embeddings(u, StepBatch(y, y_c, None, protos))
    labels = [b.labels.tolist() for b in out]
    expect = {
        "both": [y.tolist(), y_c.tolist()],
        "agnostic": [y.tolist(), y_c.tolist()],
        "u_hat": [y.tolist()],
        "u_hat_c": [y_c.tolist()],
    }[embeddings]
    assert labels == expect
    assert (algo.rtnet is None) == (embeddings == "agnostic")
    if embeddings == "agnostic":  # g(z, y) itself: non-negative (ReLU output), no base added
        assert all(bool((b.emb >= 0).all()) for b in out)


# ----------------------------------------------------------------------------- Eq. 5, 6
def test_generator_loss_is_ce_minus_alpha_mmd_to_the_real_batch(make_cfg, tmp_path):
    sim = fraug_sim(make_cfg, tmp_path, "algorithm.alpha=2.5", "algorithm.variant=released")
    algo, model = algo_of(sim), sim.model
    model.eval()
    algo.generator.train()
    y_c = torch.arange(8) % algo.num_classes
    ref = torch.rand(8, algo.dim)
    protos = torch.zeros(algo.num_classes, algo.dim)
    torch.manual_seed(3)
    got = algo.generator_loss(model, StepBatch(y_c, y_c, ref, protos))
    torch.manual_seed(3)
    g = algo.generator(torch.rand(8, algo.noise_dim), y_c)
    want = F.cross_entropy(model.head(g), y_c) - 2.5 * mmd(g, ref)
    assert got.item() == pytest.approx(want.item(), rel=1e-5)


def test_rtnet_loss_is_minus_entropy_plus_beta_mmd(make_cfg, tmp_path):
    sim = fraug_sim(
        make_cfg,
        tmp_path,
        "algorithm.beta=3.0",
        "algorithm.embeddings=u_hat_c",
        "algorithm.variant=released",
    )
    algo, model = algo_of(sim), sim.model
    assert algo.rtnet is not None
    model.eval()
    algo.generator.eval()
    algo.rtnet.train()
    y = torch.arange(8) % algo.num_classes
    y_c = (torch.arange(8) + 3) % algo.num_classes
    protos = torch.randn(algo.num_classes, algo.dim)
    torch.manual_seed(4)
    got = algo.rtnet_loss(model, StepBatch(y, y_c, None, protos))
    torch.manual_seed(4)
    g = algo.generator(torch.rand(8, algo.noise_dim), y_c)
    emb = algo.rtnet(protos[y_c], g, y_c)  # Eq. 3: the prototype plus the RTNet residual
    want = -entropy(model.head(emb)) + 3.0 * mmd(emb, protos[y_c])
    assert got.item() == pytest.approx(want.item(), rel=1e-5)


# ----------------------------------------------------------------------------- Eq. 4
def test_prototype_ema_matches_hand_computation():
    protos = torch.tensor([[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]])
    u = torch.tensor([[0.0, 2.0], [4.0, 0.0], [10.0, 10.0]])
    y = torch.tensor([0, 0, 2])
    new = update_prototypes(protos, u, y, momentum=0.3)
    # class 0: batch mean (2, 1) -> 0.7 * (1, 1) + 0.3 * (2, 1) = (1.3, 1.0)
    # class 1: absent -> unchanged; class 2: 0.7 * (3, 3) + 0.3 * (10, 10) = (5.1, 5.1)
    want = torch.tensor([[1.3, 1.0], [2.0, 2.0], [5.1, 5.1]])
    assert torch.allclose(new, want)


# ----------------------------------------------------------------------------- ramp-up
def test_ramp_up_schedule():
    # w_t = min(lambda_syn, exp(gamma * (e - T))), e = round - 1
    assert synthetic_weight(1, 100, 0.5, 0.01) == pytest.approx(math.exp(-1.0))
    assert synthetic_weight(51, 100, 1.0, 0.01) == pytest.approx(math.exp(-0.5))
    assert synthetic_weight(51, 100, 0.5, 0.01) == 0.5  # capped
    assert synthetic_weight(100, 100, 1.0, 0.01) == pytest.approx(math.exp(-0.01))
    assert ramp_factor(11, 40, 0.002) == pytest.approx(math.exp(-0.06))
    for rnd in (1, 7, 100):
        assert synthetic_weight(rnd, 100, 1.0, 0.01, ramp_up=False) == 1.0
        assert synthetic_weight(rnd, 100, 0.3, 0.01, ramp_up=False) == 0.3


# ----------------------------------------------------------------------------- payloads
def test_generator_is_sent_and_averaged_and_rtnet_never_leaves(make_cfg, tmp_path):
    # unequal sizes, sample weights set explicitly (FRAug's paper weighting is uniform)
    sim = fraug_sim(make_cfg, tmp_path, "dataset.clients=2", "federation.weighting=samples")
    algo = algo_of(sim)
    gen_keys = set(algo.generator.state_dict())
    rt_keys = set(algo._new_rtnet().state_dict())
    rt0 = {k: v.clone() for k, v in sim.states["client0"]["rtnet"].items()}
    down = algo.broadcast(sim.server, 1, "client0")
    assert set(down.records) == {"weights", "generator"}
    assert set(down["generator"]) == gen_keys
    replies = [(cid, sim.client_round(1, cid)) for cid in ("client0", "client1")]
    for _, up in replies:
        assert set(up.records) == {"weights", "generator"}
        assert set(up["generator"]) == gen_keys
        for rec in up.records.values():
            assert not set(rec) & rt_keys
    # the RTNet trained, but only in client state
    assert any(not torch.equal(rt0[k], sim.states["client0"]["rtnet"][k]) for k in rt0)
    assert {r[3] for r in sim.ledger.rows} == {"weights", "generator"}
    # hand check of the average, with sample-size weights 1 and 3
    a, b = (up["generator"] for _, up in replies)
    fake = [
        reply("client0", 1, weights=replies[0][1]["weights"], generator=a),
        reply("client1", 3, weights=replies[1][1]["weights"], generator=b),
    ]
    algo.aggregate(sim.server, 1, fake)
    key = "net.fc1.weight"
    assert torch.allclose(sim.server["generator"][key], 0.25 * a[key] + 0.75 * b[key])
    count = "net.bn1.num_batches_tracked"
    assert sim.server["generator"][count] == a[count]  # equal step counts: rounded mean
    assert not torch.equal(a[key], b[key])


def test_generator_bn_local_keeps_its_bn_on_the_client(make_cfg, tmp_path):
    sim = fraug_sim(make_cfg, tmp_path, "algorithm.generator_bn=local")
    algo = algo_of(sim)
    up = sim.client_round(1, "client0")
    assert not any(".bn" in k for k in up["generator"])
    assert set(sim.states["client0"]["generator_local"]) == {
        k for k in algo.generator.state_dict() if ".bn" in k
    }


# ----------------------------------------------------------------------------- end to end
def test_ablations_run_end_to_end_and_differ(make_cfg, tmp_path):
    variants = [[f"algorithm.embeddings={e}"] for e in EMBEDDINGS] + [["algorithm.ramp_up=false"]]
    losses = []
    for i, over in enumerate(variants):
        # gamma = 1 makes the ramp-up visible within 2 rounds: w_1 = exp(-2) < 0.5
        cfg = make_cfg("algorithm.name=fraug", "algorithm.ramp_gamma=1.0", *over, rounds=2)
        res = run_experiment(cfg, run_dir=tmp_path / str(i), progress=False)
        assert res.summary["evaluated_model"] == "personal"
        assert set(res.summary["bytes_by_record"]["up"]) == {"weights", "generator"}
        ck = read_checkpoint(tmp_path / str(i) / "checkpoint.pt")
        for state in ck["clients"].values():
            # with "agnostic" no RTNet exists, so none is trained
            assert ("rtnet" in state) == (over != ["algorithm.embeddings=agnostic"])
            assert state["prototypes"].abs().sum() > 0
        run_losses = tuple(r["train_loss"] for r in ck["records"])
        assert all(math.isfinite(v) for v in run_losses)
        losses.append(run_losses)
    assert len(set(losses)) == len(variants)  # every ablation computes something else


# ----------------------------------------------------------------------------- config
@pytest.mark.parametrize(
    "key,value",
    [
        ("lambda_syn", 1.5),
        ("ramp_gamma", 0),
        ("alpha", -1),
        ("beta", -0.5),
        ("lr_generator", 0),
        ("lr_rtnet", -1),
        ("aux_momentum", 1.0),
        ("prototype_momentum", 0),
        ("noise_dim", 0),
        ("embeddings", "all"),
    ],
)
def test_check_rejects_nonsense(make_cfg, key, value):
    with pytest.raises(ConfigError, match=f"algorithm.{key}"):
        make_cfg("algorithm.name=fraug", f"algorithm.{key}={value}")


def test_check_rejects_rtnet_width_without_rtnet(make_cfg):
    with pytest.raises(ConfigError, match="algorithm.rtnet_hidden"):
        make_cfg(
            "algorithm.name=fraug", "algorithm.embeddings=agnostic", "algorithm.rtnet_hidden=8"
        )
    make_cfg("algorithm.name=fraug", "algorithm.ramp_up=false", "algorithm.ramp_gamma=0")


@pytest.mark.parametrize(
    "variant,key,value",
    [
        ("paper", "generator_distance", "mse"),
        ("paper", "interpolate", "true"),
        ("released", "per_class", 4),
    ],
)
def test_a_key_the_variant_does_not_read_is_an_error(make_cfg, variant, key, value):
    """A key that one variant of the objective never reads is refused with that variant,
    instead of the run silently training without it; the other variant takes it."""
    with pytest.raises(ConfigError, match=f"algorithm.{key}' has no effect with variant"):
        make_cfg("algorithm.name=fraug", f"algorithm.variant={variant}", f"algorithm.{key}={value}")
    other = "released" if variant == "paper" else "paper"
    cfg = make_cfg("algorithm.name=fraug", f"algorithm.variant={other}", f"algorithm.{key}={value}")
    assert str(getattr(cfg.algorithm.params, key)).lower() == str(value).lower()


# ----------------------------------------------------------------------------- resume
def test_killed_then_resumed_equals_uninterrupted(make_cfg, tmp_path):
    """Killed after round 3 (checkpoint of round 2) and resumed: the same run, the clients'
    prototypes, label offsets and RTNets included (the final checkpoint's client state)."""
    over = [
        "algorithm.name=fraug",
        "checkpoint.every=2",
        "train.optimizer_state=persist",
        "train.momentum=0.5",
        "federation.sample_fraction=0.67",
        "dataset.train_size=43",  # 43 examples a round: the class cycle does not restart
    ]
    runs = assert_same_run(make_cfg(*over, rounds=4), tmp_path, stop_after=3)
    state = read_checkpoint(runs.dir("resume") / "checkpoint.pt")["clients"]
    assert all({"prototypes", "label_offset", "rtnet"} <= set(s) for s in state.values())


# ----------------------------------------------------------------------------- paper variant
def test_paper_cls_loss_is_l_real_plus_l_syn_with_scaled_residuals(make_cfg, tmp_path):
    """Eq. 1-3: L_cls = CE(h(u), y) + CE(h(u_hat), y) + sum_c CE(h(u_hat_c), c), with
    u_hat = u + lambda_syn * m(g(z, y)) and u_hat_c = u_bar_c + lambda_syn * m(g(z', c))."""
    sim = fraug_sim(make_cfg, tmp_path, "algorithm.lambda_syn=0.3")
    algo, model = algo_of(sim), sim.model
    model.eval()
    algo.generator.eval()
    algo.rtnet.eval()
    u = torch.randn(8, algo.dim)
    y = torch.arange(8) % algo.num_classes
    protos = torch.randn(algo.num_classes, algo.dim)
    torch.manual_seed(5)
    yc = algo.class_labels(8, u.device)
    got = algo.model_loss(model, u, StepBatch(y, yc, None, protos, RoundPlan(scale=0.3)))
    torch.manual_seed(5)
    g = algo.generator(torch.randn(8, algo.noise_dim), y)
    u_hat = u + 0.3 * (algo.rtnet(torch.zeros_like(u), g, y))
    gc = algo.generator(torch.randn(yc.shape[0], algo.noise_dim), yc)
    uc = protos[yc] + 0.3 * algo.rtnet(torch.zeros(yc.shape[0], algo.dim), gc, yc)
    ce_c = F.cross_entropy(model.head(uc), yc, reduction="none")
    per_class = sum(ce_c[yc == c].mean() for c in range(algo.num_classes))
    want = F.cross_entropy(model.head(u), y) + F.cross_entropy(model.head(u_hat), y) + per_class
    assert got.item() == pytest.approx(want.item(), rel=1e-5)
    # every class appears in the sum of Eq. 2
    assert set(yc.tolist()) == set(range(algo.num_classes))


def test_paper_noise_is_gaussian_released_uniform(make_cfg, tmp_path):
    paper = algo_of(fraug_sim(make_cfg, tmp_path / "p"))
    released = algo_of(fraug_sim(make_cfg, tmp_path / "r", "algorithm.variant=released"))
    z = paper.noise(4000, torch.device("cpu"))
    assert (z < 0).any() and abs(z.mean().item()) < 0.05 and abs(z.std().item() - 1) < 0.05
    zr = released.noise(4000, torch.device("cpu"))
    assert zr.min() >= 0 and zr.max() < 1


def test_per_class_mmd_differs_from_pooled_when_class_means_differ(make_cfg, tmp_path):
    algo = algo_of(fraug_sim(make_cfg, tmp_path))
    labels = torch.tensor([0, 0, 0, 1, 1, 1])
    protos = torch.zeros(algo.num_classes, algo.dim)
    protos[1] = 3.0
    emb = protos[labels] + 0.1 * torch.randn(6, algo.dim)
    per_class = algo.per_class_mmd(emb, labels, protos)
    pooled = mmd(emb, protos[labels])
    want = mmd(emb[:3], protos[0:1]) + mmd(emb[3:], protos[1:2])
    assert per_class.item() == pytest.approx(want.item(), rel=1e-5)
    assert per_class.item() != pytest.approx(pooled.item(), rel=1e-2)


def test_paper_ramp_up_scales_lambda_syn_and_prototype_rate(make_cfg, tmp_path):
    """Sec. 3.2: lambda_syn and the EMA ratio lambda_c both follow an exponential ramp-up."""
    algo = algo_of(fraug_sim(make_cfg, tmp_path, "algorithm.ramp_gamma=1.0"))
    plan = algo.round_plan(1)
    lam1, mom1 = plan.scale, plan.proto_rate
    assert lam1 == pytest.approx(0.5 * math.exp(-2))
    assert mom1 == pytest.approx(0.3 * math.exp(-2))
    off = algo_of(fraug_sim(make_cfg, tmp_path / "o", "algorithm.ramp_up=false"))
    plan = off.round_plan(1)
    assert (plan.scale, plan.proto_rate) == (0.5, 0.3)


def test_paper_and_released_variants_train_differently(make_cfg, tmp_path):
    losses = []
    for v in ("paper", "released"):
        cfg = make_cfg("algorithm.name=fraug", f"algorithm.variant={v}", rounds=1)
        res = run_experiment(cfg, run_dir=tmp_path / v, progress=False)
        ck = read_checkpoint(tmp_path / v / "checkpoint.pt")
        losses.append(ck["records"][-1]["train_loss"])
        assert res.summary["evaluated_model"] == "personal"
    assert losses[0] != losses[1]


def test_paper_weighting_is_uniform():
    assert FRAug.paper_weighting == "uniform"


# ----------------------------------------------------------------------------- released variant
# An independent reference implementation of one client's local update with
# variant=released, written from docs/METHODS.md (FRAug, variant=released) and the
# FRAug section of shared/reference/official-code-notes.md. It reuses only the building blocks
# tested on their own above (Generator, RTNet, mmd, entropy, update_prototypes,
# cyclic_labels); the steps, their order, the modes, the optimisers and the noise draws are
# its own.
def released_reference(
    model: torch.nn.Module,
    gen: Generator,
    rt: RTNet,
    protos: torch.Tensor,
    offset: int,
    batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
    w: float,
    p: FRAugParams,
    train: TrainConfig,
) -> tuple[list[float], torch.Tensor, int]:
    """One round of local steps; returns (per-step losses, prototypes, label offset).

    Per mini-batch, in the released code's order: the model step (Eq. 1, generator and RTNet
    fixed in eval mode), the generator step (Eq. 5), the RTNet step (Eq. 6); the latter two
    with the model fixed in eval mode, each optimiser stepping its own network only."""
    classes = model.classifier.out_features
    opt = torch.optim.SGD(
        model.parameters(), lr=train.lr, momentum=train.momentum, weight_decay=train.weight_decay
    )
    opt_g = torch.optim.SGD(gen.parameters(), lr=p.lr_generator, momentum=p.aux_momentum)
    opt_r = torch.optim.SGD(rt.parameters(), lr=p.lr_rtnet, momentum=p.aux_momentum)

    def z(n: int) -> torch.Tensor:  # released code: torch.rand, U[0, 1), global RNG
        return torch.rand(n, gen.noise_dim)

    losses = []
    for x, y in batches:
        n = y.shape[0]
        # labels of the generator / prototype branch: the class cycle continues across steps
        yc = cyclic_labels(offset, n, classes, y.device)
        offset = (offset + n) % classes

        # model step, Eq. 1: (1 - w) CE(h(u), y) + w L_syn
        model.train()
        gen.eval()
        rt.eval()
        opt.zero_grad()
        u = model.features(x)
        protos = update_prototypes(protos, u, y, p.prototype_momentum)  # Eq. 4, constant rate
        loss = F.cross_entropy(model.head(u), y)
        if w > 0:
            with torch.no_grad():  # synthetic embeddings train the head only
                u_hat = rt(u.detach(), gen(z(n), y), y)  # u + m(g(z, y), y), unscaled
                u_hat_c = rt(protos[yc], gen(z(n), yc), yc)  # u_bar_c + m(g(z', c), c)
            syn = torch.stack(
                [F.cross_entropy(model.head(u_hat), y), F.cross_entropy(model.head(u_hat_c), yc)]
            ).mean()
            loss = (1 - w) * loss + w * syn
        loss.backward()
        opt.step()
        losses.append(loss.item())

        # the real embeddings the MMD terms compare against: after the step, in eval mode
        model.eval()
        with torch.no_grad():
            real = model.features(x)

        # generator step, Eq. 5 (released): CE(h(g(z, c)), c) - alpha MMD(g(z, c), U)
        gen.train()
        opt_g.zero_grad()
        g = gen(z(n), yc)
        (F.cross_entropy(model.head(g), yc) - p.alpha * mmd(g, real)).backward()
        opt_g.step()

        # RTNet step, Eq. 6 (released): per branch -H(h(emb)) + beta MMD(emb, base), the
        # mean of the real branch and the prototype branch; the generator fixed (eval mode)
        gen.eval()
        rt.train()
        opt_r.zero_grad()
        terms = []
        for base, labels in ((real, y), (protos[yc], yc)):
            with torch.no_grad():
                g = gen(z(n), labels)
            emb = rt(base, g, labels)
            terms.append(-entropy(model.head(emb)) + p.beta * mmd(emb, base))
        torch.stack(terms).mean().backward()
        opt_r.step()
    model.train()
    return losses, protos, offset


def assert_same_tensors(got: dict, want: dict, what: str) -> None:
    assert got.keys() == want.keys(), what
    for key, a in got.items():
        b = want[key]
        diff = (a.double() - b.double()).abs().max().item()
        assert torch.equal(a, b), (
            f"{what} {key!r} differs from the reference: max |diff| {diff:.3g}"
        )


@pytest.mark.numerics
def test_released_local_update_matches_an_independent_reference(make_cfg, tmp_path, one_thread):
    """The released variant's local update (run as a run runs it: ``train_client`` on the
    broadcast payload and the client's state) equals :func:`released_reference` started from
    copies of the same state with the same seeds, in round 1 and in round 2 (which starts from
    the averaged model and generator, the trained RTNet, non-zero prototypes and a label
    offset carried over from round 1).

    Tolerances: both sides run the same torch operations on the same tensors in the same
    order, in one process with one thread, so every kernel (whatever the CPU's vector path,
    ATEN_CPU_CAPABILITY or oneDNN setting) rounds identically on both sides: the weights,
    BN statistics and prototypes must be bit-identical (the gradients, taken with
    ``backward`` here and ``autograd.grad`` there, are the same backward kernels). The one
    sum ordered differently is the round's mean loss: the algorithm adds the per-step losses
    in float32, the reference adds the same float32 values exactly (``math.fsum``); a float32
    running sum of n positive terms is within (n - 1) u of the exact sum (u = 2^-24, one
    rounding per addition), hence ``rel = n * 2^-24``."""
    rounds = 2
    cfg = make_cfg(
        "algorithm.name=fraug",
        "algorithm.variant=released",
        # gamma = 1: w_t = exp(gamma (e - T)) = e^-2, e^-1 lies below the cap lambda_syn = 0.5,
        # so the ramp itself decides the weight (with gamma = 0.01 both rounds use the cap)
        "algorithm.ramp_gamma=1.0",
        # 43 examples in batches of 16, 16, 11, two epochs: 6 steps a round, and the class
        # cycle (10 classes) ends round 1 at offset 86 % 10 = 6, not back at 0
        "dataset.clients=2",
        "dataset.train_size=43",
        "train.local_epochs=2",
        "train.momentum=0.5",
        rounds=rounds,
    )
    sim = Simulation(cfg, tmp_path / "sim", progress=False)
    algo, exp, cid = algo_of(sim), sim.exp, "client0"
    p, data = algo.params, exp.train_clients[cid]
    head = exp.model.classifier
    for rnd in range(1, rounds + 1):
        w = min(p.lambda_syn, math.exp(p.ramp_gamma * ((rnd - 1) - rounds)))
        assert 0 < w < p.lambda_syn
        down = sim.algo.broadcast(sim.server, rnd, cid)
        start = sim.states[cid]
        if rnd > 1:  # round 2 really starts from where round 1 left the client
            assert start["prototypes"].abs().sum() > 0 and start["label_offset"] == 6

        # the algorithm, on a copy of the client's state
        state = copy.deepcopy(start)
        up = train_client(exp, exp.seed, cid, data, rnd, copy.deepcopy(down), state)
        model_after = {k: v.clone() for k, v in exp.model.state_dict().items()}

        # the reference, from another copy of the same start: the model is the broadcast
        # shared tensors + the client's own BN tensors (FedBN), the generator the broadcast
        # one + its local tensors, the RTNet the client's own; the networks are built before
        # client_context seeds the global RNG (their initialisation draws from it)
        mine = copy.deepcopy(start)
        model = copy.deepcopy(exp.model)
        model.load_state_dict({**down["weights"], **mine["local"]}, strict=True)
        dim, classes = head.in_features, head.out_features
        gen = Generator(dim // 2, classes, dim, dim)  # noise d/2, hidden d (docstring defaults)
        gen.load_state_dict({**down["generator"], **mine["generator_local"]}, strict=True)
        rt = RTNet(dim, classes, dim // 2)  # hidden = the noise size
        rt.load_state_dict(mine["rtnet"], strict=True)
        ctx = client_context(exp, exp.seed, cid, data, rnd, mine)  # same seeds, same batches
        losses, protos, offset = released_reference(
            model,
            gen,
            rt,
            mine["prototypes"].clone(),
            mine["label_offset"],
            ctx.batches(),
            w,
            p,
            cfg.train,
        )

        n = len(losses)
        assert n == up.metrics["steps"] == 6
        assert up.metrics["train_loss"] == pytest.approx(math.fsum(losses) / n, rel=n * 2**-24)
        assert_same_tensors(model_after, model.state_dict(), f"round {rnd}: model")
        assert exp.model.training and model.training
        assert_same_tensors(
            {**up["generator"], **state["generator_local"]},
            gen.state_dict(),
            f"round {rnd}: generator",
        )
        assert_same_tensors(state["rtnet"], rt.state_dict(), f"round {rnd}: RTNet")
        assert torch.equal(state["prototypes"], protos), f"round {rnd}: prototypes"
        assert state["label_offset"] == offset
        # and the round did train the RTNet, the generator and the prototypes
        assert any(not torch.equal(state["rtnet"][k], start["rtnet"][k]) for k in start["rtnet"])
        assert not torch.equal(
            up["generator"]["net.fc1.weight"], down["generator"]["net.fc1.weight"]
        )
        assert not torch.equal(state["prototypes"], start["prototypes"])

        sim.run_round(rnd)  # the run's round: every client trains, the server averages
