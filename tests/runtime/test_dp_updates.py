"""DP-FedAvg on the weights (``privacy.updates=client``, issue 53 item 2): the mechanism against
its definition (:mod:`fedshift.core.dp_updates`), the budget (:mod:`fedshift.runtime.privacy`),
refusals, resume, and every registered algorithm either protected or refused in one line."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch
from conftest import toy_cfg
from scipy.stats import chi2
from support.same_run import assert_runs_equal

from fedshift.algorithms import ALGORITHMS
from fedshift.core.dp_updates import UpdateMechanism, clip_update, update_norm
from fedshift.core.errors import ConfigError, FedshiftError
from fedshift.core.payload import Payload
from fedshift.core.privacy import ALPHAS, TOLERANCE, epsilon_composed, epsilon_spent
from fedshift.runtime.dp_updates import DP_CLIENT, UpdatePrivacy
from fedshift.runtime.privacy import Plan, UpdatePlan
from fedshift.runtime.simulation import resume_experiment, run_experiment
from fedshift.runtime.stopping import RunInterrupted
from fedshift.testing import tiny_cfg

pytestmark = pytest.mark.usefixtures("one_thread")
needs_opacus = pytest.mark.skipif(
    importlib.util.find_spec("opacus") is None, reason="Opacus is not installed"
)

DP = ("privacy.updates=client", "federation.weighting=uniform")


def _summary(run_dir) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


# ----------------------------------------------------------------------------- the mechanism
def test_an_update_above_the_clip_is_scaled_to_the_clip_exactly():
    g = torch.Generator().manual_seed(0)
    ref = {"a": torch.randn(3, 4, generator=g), "b": torch.randn(5, generator=g),
           "n": torch.tensor(7)}  # fmt: skip
    sent = {"a": ref["a"] + 2.0, "b": ref["b"] - 1.0, "n": torch.tensor(9)}
    before = update_norm(sent, ref)
    assert before == pytest.approx((12 * 4 + 5) ** 0.5)
    clipped, norm = clip_update(sent, ref, 0.5)
    assert norm == before
    assert update_norm(clipped, ref) == pytest.approx(0.5, rel=1e-6)
    # the direction is kept: every float tensor's update scaled by one factor
    s = 0.5 / before
    assert torch.allclose(clipped["a"] - ref["a"], (sent["a"] - ref["a"]) * s, atol=1e-6)
    assert torch.allclose(clipped["b"] - ref["b"], (sent["b"] - ref["b"]) * s, atol=1e-6)
    assert torch.equal(clipped["n"], sent["n"])  # a counter is not an update to clip
    within, _ = clip_update(sent, ref, before * 2)
    assert all(torch.equal(within[k], sent[k]) for k in sent)  # within the bound: unchanged


def test_the_server_noise_has_std_multiplier_times_clip_over_clients():
    """The noisy mean minus the mean of the clipped updates, over the stated std
    z * C / m, is N(0, 1): its sum of squares lies within chi-square's central 1 - 1e-6."""
    mech = UpdateMechanism(clip=0.7, noise_multiplier=1.3, seed=5)
    assert mech.std(4) == pytest.approx(1.3 * 0.7 / 4)
    g = torch.Generator().manual_seed(1)
    ref = {"w": torch.randn(2000, generator=g, dtype=torch.float64)}
    ups = [{"w": ref["w"] + 0.01 * torch.randn(2000, generator=g, dtype=torch.float64)}
           for _ in range(3)]  # fmt: skip
    out = mech.release(ref, ups, clients=4, rnd=2)  # one client of four lost: a zero update
    mean = ref["w"] + sum(u["w"] - ref["w"] for u in ups) / 4
    z = (out["w"] - mean) / mech.std(4)
    stat = float(z.pow(2).sum())
    assert chi2.ppf(5e-7, 2000) < stat < chi2.ppf(1 - 5e-7, 2000), stat
    again = mech.release(ref, ups, clients=4, rnd=2)
    assert torch.equal(again["w"], out["w"])  # the seed's noise, drawn again
    assert not torch.equal(mech.release(ref, ups, clients=4, rnd=3)["w"], out["w"])


@needs_opacus
def test_the_noise_multiplier_is_opacus_for_the_budget_and_rounds():
    from opacus.accountants.utils import get_noise_multiplier

    cfg = toy_cfg(*DP, "privacy.epsilon=3", "privacy.update_clip=0.25", rounds=7)
    from fedshift.runtime.privacy import plan_privacy

    plan = plan_privacy(cfg, [], (3, 28, 28))
    assert plan is not None and plan.updates is not None
    want = get_noise_multiplier(
        target_epsilon=3, target_delta=1e-5, sample_rate=1.0, steps=7, accountant="rdp",
        epsilon_tolerance=TOLERANCE * 3, alphas=list(ALPHAS),
    )  # fmt: skip
    assert plan.updates.noise_multiplier == want
    assert plan.updates.clip == 0.25 and plan.updates.releases == 7
    assert plan.updates.mechanism(0).std(3) == pytest.approx(want * 0.25 / 3)
    spent = plan.summary(7)["records"]["weights"]["epsilon_spent"]
    assert 3 * (1 - TOLERANCE) <= spent <= 3


def test_the_combined_reply_is_the_noisy_mean_of_the_clipped_weights():
    cfg = toy_cfg(*DP, "privacy.epsilon=1", rounds=1)
    dp = UpdatePrivacy(cfg)
    dp.mechanism = UpdateMechanism(clip=1.0, noise_multiplier=0.0, seed=0)  # no noise: exact
    ref = {"w": torch.zeros(4), "bn.running_var": torch.ones(2)}
    dp.received = {"a": ref, "b": ref}
    big = Payload({"weights": {"w": torch.full((4,), 3.0), "bn.running_var": torch.ones(2)}},
                  num_examples=5)  # fmt: skip
    small = Payload({"weights": {"w": torch.full((4,), 0.1), "bn.running_var": torch.ones(2)}},
                    num_examples=7)  # fmt: skip
    ups = [("a", dp.clip(1, "a", big)), ("b", dp.clip(1, "b", small))]
    assert update_norm(ups[0][1]["weights"], ref) == pytest.approx(1.0)
    [(who, got)] = dp.combine(1, ["a", "b", "c"], ups)  # c lost: its update counts as zero
    assert who == DP_CLIENT and got.num_examples == 12
    want = (torch.full((4,), 0.5) + torch.full((4,), 0.1)) / 3
    assert torch.allclose(got["weights"]["w"], want)


def test_a_noisy_running_variance_is_floored_at_the_noise_std():
    """Post-processing: a released BatchNorm variance below the noise's std (negative ones
    included) is raised to it; one above it, and every other value, is left as released."""
    cfg = toy_cfg(*DP, "privacy.epsilon=1", rounds=1)
    dp = UpdatePrivacy(cfg)
    dp.mechanism = UpdateMechanism(clip=1.0, noise_multiplier=4.0, seed=0)
    ref = {"w": torch.zeros(4), "bn.running_var": torch.full((64,), 0.05)}
    dp.received = {"a": ref, "b": ref}
    ups = [(c, dp.clip(1, c, Payload({"weights": dict(ref)}, num_examples=3))) for c in "ab"]
    [(_, got)] = dp.combine(1, ["a", "b"], ups)
    floor = dp.mechanism.std(2)  # 4 * 1 / 2
    released = dp.mechanism.release(ref, [u["weights"] for _, u in ups], 2, 1)
    var = got["weights"]["bn.running_var"]
    assert bool((released["bn.running_var"] < floor).any())  # the case the floor is for
    assert torch.equal(var, released["bn.running_var"].clamp_min(floor))
    assert torch.equal(got["weights"]["w"], released["w"])  # no floor on other values


# ----------------------------------------------------------------------------- a run
@needs_opacus
def test_a_protected_fedavg_run_reports_the_weights_epsilon(tmp_path):
    cfg = toy_cfg(*DP, "privacy.epsilon=4", "privacy.update_clip=0.5", rounds=2)
    run_experiment(cfg, run_dir=tmp_path / "r", progress=False)
    p = _summary(tmp_path / "r")["privacy"]
    w = p["records"]["weights"]
    assert w["unit"] == "client" and w["releases"] == 2 and w["clip"] == 0.5
    assert w["epsilon_spent"] <= 4
    assert w["epsilon_spent"] == pytest.approx(epsilon_spent(w["noise_multiplier"], 2, 1e-5))
    assert p["client_level"]["epsilon_spent"] == w["epsilon_spent"]
    # one example changes its site's clipped update by up to 2 C: half the multiplier
    want = epsilon_composed([(w["noise_multiplier"] / 2, 1.0, 2)], 1e-5)
    assert p["example_level_all_records"]["epsilon_spent"] == pytest.approx(want)


@needs_opacus
def test_a_protected_run_moves_the_weights_by_at_most_the_clip(tmp_path):
    """At a huge budget the noise is negligible: one round with every update clipped to
    1e-3 moves the global weights by at most 1e-3 (the mean of clipped updates), while the
    plain run moves them further."""
    from fedshift.runtime.simulation import Simulation

    moved = {}
    for name, over in (("plain", ()), ("dp", ("privacy.epsilon=1e6", "privacy.update_clip=1e-3",
                                              "privacy.updates=client"))):  # fmt: skip
        sim = Simulation(toy_cfg("federation.weighting=uniform", *over, rounds=1),
                         tmp_path / name, progress=False)  # fmt: skip
        start = {k: t.clone() for k, t in sim.server["weights"].items()}
        sim.run()
        floats = {k: sim.server["weights"][k] for k, t in start.items() if t.is_floating_point()}
        moved[name] = update_norm(floats, start)
    assert moved["dp"] <= 1e-3 * 1.001 < moved["plain"]


@needs_opacus
def test_a_resumed_protected_run_spends_and_repeats_the_uninterrupted_one(tmp_path):
    cfg = toy_cfg(*DP, "privacy.epsilon=2", "checkpoint.every=1", rounds=3)
    full = run_experiment(cfg, run_dir=tmp_path / "full", progress=False)
    with pytest.raises(RunInterrupted):
        run_experiment(cfg, run_dir=tmp_path / "cut", progress=False, stop_after=1)
    resume_experiment(tmp_path / "cut", progress=False)
    assert_runs_equal(tmp_path / "cut", full.run_dir)
    assert _summary(tmp_path / "cut")["privacy"] == _summary(full.run_dir)["privacy"]


@needs_opacus
def test_an_extension_past_the_planned_rounds_stops_before_its_first_round(tmp_path):
    plan = Plan(1.0, 1e-5, 0.0, rounds=4, records=(), seed=0,
                updates=UpdatePlan("client", 1.0, 3.0, releases=4))  # fmt: skip
    plan.check_rounds(4)
    with pytest.raises(ConfigError, match=r"'weights' would be released again.*before round 5"):
        plan.check_rounds(5)
    cfg = toy_cfg(*DP, "privacy.epsilon=2", rounds=1)
    run_experiment(cfg, run_dir=tmp_path / "r", progress=False)
    with pytest.raises(ConfigError, match=r"stops before round 2") as e:
        resume_experiment(tmp_path / "r", progress=False, rounds=2)
    assert "\n" not in str(e.value)


@needs_opacus
def test_statistics_and_weights_share_the_budget_and_are_reported_per_record(tmp_path):
    cfg = toy_cfg("augment=[fedrdn]", *DP, "privacy.epsilon=4", rounds=2)
    run_experiment(cfg, run_dir=tmp_path / "r", progress=False)
    p = _summary(tmp_path / "r")["privacy"]
    assert set(p["records"]) == {"fedrdn_stats", "weights"}
    stats, w = p["records"]["fedrdn_stats"], p["records"]["weights"]
    assert stats["unit"] == "example" and w["unit"] == "client"
    assert stats["epsilon_spent"] <= 4 and w["epsilon_spent"] <= 4
    assert p["epsilon_spent"] == pytest.approx(stats["epsilon_spent"])  # the example level
    both = epsilon_composed([(p["noise_multiplier"], 1.0, 1),
                             (w["noise_multiplier"] / 2, 1.0, 2)], 1e-5)  # fmt: skip
    assert p["example_level_all_records"]["epsilon_spent"] == pytest.approx(both)
    assert p["releases"] == 3


# ----------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        ([*DP, "privacy.epsilon=0"], "privacy.epsilon"),
        ([*DP, "privacy.epsilon=-1"], "privacy.epsilon"),
        ([*DP, "privacy.epsilon=1", "privacy.delta=1"], "privacy.delta"),
        ([*DP, "privacy.epsilon=1", "privacy.update_clip=0"], "privacy.update_clip"),
        ([*DP, "privacy.epsilon=1", "privacy.update_clip=-2"], "privacy.update_clip"),
        ([*DP], "privacy.updates"),  # no budget
        (["privacy.epsilon=1", "privacy.updates=bogus"], "privacy.updates"),
    ],
)
def test_bad_input_is_one_line_naming_the_key(overrides, key):
    with pytest.raises(ConfigError) as e:
        toy_cfg(*overrides, rounds=1)
    assert f"'{key}'" in str(e.value) and "\n" not in str(e.value)


@needs_opacus
def test_a_budget_too_small_for_one_round_is_refused(tmp_path):
    cfg = toy_cfg(*DP, "privacy.epsilon=1e-4", "privacy.delta=1e-12", rounds=1)
    with pytest.raises(ConfigError, match=r"'privacy.epsilon'.*cannot cover 1 release") as e:
        run_experiment(cfg, run_dir=tmp_path / "r", progress=False)
    assert "weights" in str(e.value) and "\n" not in str(e.value)
    assert not (tmp_path / "r" / "checkpoint.pt").exists()


@needs_opacus
def test_sample_size_weighting_is_refused_naming_the_key(tmp_path):
    cfg = toy_cfg("privacy.updates=client", "privacy.epsilon=1", rounds=1)  # FedAvg: samples
    with pytest.raises(ConfigError, match=r"'privacy.updates'.*federation.weighting=uniform"):
        run_experiment(cfg, run_dir=tmp_path / "r", progress=False)


def test_the_key_off_keeps_every_digest():
    from fedshift.core.identity import number_config

    plain = number_config(toy_cfg("privacy.epsilon=1", rounds=1).to_dict())
    off = number_config(toy_cfg("privacy.epsilon=1", "privacy.updates=none",
                                "privacy.update_clip=3", rounds=1).to_dict())  # fmt: skip
    assert off == plain and "updates" not in plain.get("privacy", {})
    on = number_config(toy_cfg(*DP, "privacy.epsilon=1", rounds=1).to_dict())
    assert on["privacy"]["updates"] == "client" and on["privacy"]["update_clip"] == 1.0


# ----------------------------------------------------------------------------- every method
#: methods whose replies are averaged weights: protected (the brief's list, and FedBN's local
#: BatchNorm layers stay out of the clipped update)
PROTECTED = {"fedavg", "fedbn", "fedprox", "fedrdn", "harmofl", "fedadam"}
#: methods that send other things the server reads per site: refused
REFUSED = {"scaffold", "fednova", "fedfa", "fedproto", "feddg_ga", "pfedme"}

SEGMENTATION = ("dataset.name=toyseg", "model.name=unet", "model.width=2")


@needs_opacus
@pytest.mark.parametrize("name", ALGORITHMS.names())
def test_every_algorithm_runs_a_protected_round_or_refuses_in_one_line(name, tmp_path):
    seg = "classification" not in ALGORITHMS.get(name).tasks
    over = [*(SEGMENTATION if seg else ()), *DP, "privacy.epsilon=50", "train.rounds=1"]
    try:
        cfg = tiny_cfg(name, *over)
        run_experiment(cfg, run_dir=tmp_path / "r", progress=False)
    except (ConfigError, FedshiftError) as e:
        msg = str(e)
        assert "\n" not in msg and ("privacy." in msg or "federation." in msg), msg
        assert name not in PROTECTED, msg
        return
    assert name not in REFUSED
    p = _summary(tmp_path / "r")["privacy"]
    assert p["records"]["weights"]["releases"] == 1


@needs_opacus
def test_a_protected_run_in_worker_processes_is_the_sequential_one(tmp_path, worker_pool):
    """Replies are clipped as they arrive from the workers; the noise is the server's."""
    cfg = toy_cfg("algorithm.name=fedbn", *DP, "privacy.epsilon=4", rounds=2)
    one = run_experiment(cfg, run_dir=tmp_path / "one", progress=False)
    run_experiment(cfg, run_dir=tmp_path / "two", progress=False, pool=worker_pool)
    assert_runs_equal(tmp_path / "two", one.run_dir)


@needs_opacus
def test_privacy_show_says_the_weights_are_protected_and_their_noise():
    from fedshift.runtime.disclosure import disclose, render

    report = disclose(toy_cfg(*DP, "privacy.epsilon=2", "privacy.update_clip=0.5"))
    text = render(report)
    assert "weights: yes: privacy.updates=client" in text
    # secure aggregation is refused together with privacy.updates: show must not offer it
    secagg = text.split("can secure aggregation")[1].split("does differential privacy")[0]
    assert "yes" not in secagg and "weights: not with privacy.updates=client" in secagg
    z = report["privacy"]["records"]["weights"]["noise_multiplier"]
    assert f"update clip 0.5, noise multiplier {z:.4g}" in text
    with pytest.raises(ConfigError, match=r"'privacy.updates'.*'generator'"):
        disclose(toy_cfg("algorithm.name=fraug", *DP, "privacy.epsilon=2"))


@needs_opacus
def test_the_server_adds_the_planned_noise_in_a_run(tmp_path):
    """Updates clipped to 1e-6 move the weights by at most 1e-6; the rest of the move is the
    server's noise: its mean square per value is (z C / m)^2 within 10 % (tens of thousands
    of values)."""
    from fedshift.runtime.simulation import Simulation

    cfg = toy_cfg(*DP, "privacy.epsilon=1", "privacy.update_clip=1e-6", rounds=1)
    sim = Simulation(cfg, tmp_path / "r", progress=False)
    start = {k: t.clone() for k, t in sim.server["weights"].items()}
    sim.run()
    plan = sim.exp.privacy
    assert plan is not None and plan.updates is not None
    std = plan.updates.mechanism(0).std(len(sim.exp.train_clients))
    floats = [k for k, t in start.items() if t.is_floating_point() and "running_var" not in k]
    d = sum(start[k].numel() for k in floats)
    moved = update_norm({k: sim.server["weights"][k] for k in floats}, start)
    assert moved**2 / (d * std**2) == pytest.approx(1.0, rel=0.1), (d, moved, std)
