"""A run under ``privacy.epsilon`` (:mod:`fedshift.runtime.privacy`, issue 53 item 1): what the
sites release, what the run spends, refusals, resume and extension."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch
from conftest import toy_cfg
from scipy.stats import chi2
from support.same_run import assert_runs_equal

from fedshift.augment.fedrdn import channel_statistics
from fedshift.core.disclosure import When
from fedshift.core.errors import ConfigError
from fedshift.core.privacy import epsilon_spent
from fedshift.runtime.disclosure import disclose, render
from fedshift.runtime.privacy import Plan, RecordPlan
from fedshift.runtime.simulation import Simulation, resume_experiment, run_experiment
from fedshift.runtime.stopping import RunInterrupted

pytestmark = pytest.mark.usefixtures("one_thread")  # bit-for-bit comparisons
#: a planned budget needs Opacus's accountant (pip install 'fedshift[privacy]'); a refusal
#: comes before it
needs_opacus = pytest.mark.skipif(
    importlib.util.find_spec("opacus") is None, reason="Opacus is not installed"
)

FEDRDN = "augment=[fedrdn]"


def _summary(run_dir) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


@needs_opacus
def test_the_released_statistics_differ_from_the_plain_ones_by_noise_of_the_stated_scale(
    tmp_path,
):
    """FedRDN's bank at the server minus each site's own (unclipped: the default bound is no
    image's) statistics, standardised by the stated std sigma * 2 C / n, is 18 N(0, 1)
    draws: their sum of squares lies within chi-square(18)'s central 1 - 1e-6."""
    cfg = toy_cfg(FEDRDN, "privacy.epsilon=50", rounds=1)
    sim = Simulation(cfg, tmp_path / "run", progress=False)
    sim.run()
    server = sim.server["aug/fedrdn"]
    plan = sim.exp.privacy
    assert plan is not None and plan.sigma > 0
    mech = plan.mechanisms["fedrdn_stats"]
    z = []
    for i, cid in enumerate(server["clients"]):
        data = sim.exp.train_clients[cid].train.x
        mean, std = channel_statistics(data)
        scale = mech.std(1.0 / data.shape[0])
        z.append((server["mean"][i].double() - mean.double()) / scale)
        z.append((server["std"][i].double() - std.double()) / scale)
    stat = float(torch.cat(z).pow(2).sum())
    k = 18  # 3 sites x (3 means + 3 stds)
    assert torch.cat(z).numel() == k
    assert chi2.ppf(5e-7, k) < stat < chi2.ppf(1 - 5e-7, k), stat
    summary = _summary(tmp_path / "run")["privacy"]
    assert summary["records"]["fedrdn_stats"]["releases"] == 1
    assert summary["epsilon_spent"] <= 50
    assert summary["epsilon_spent"] == pytest.approx(epsilon_spent(plan.sigma, 1, 1e-5))


def test_without_a_budget_the_statistics_are_sent_as_computed(tmp_path):
    sim = Simulation(toy_cfg(FEDRDN, rounds=1), tmp_path / "run", progress=False)
    sim.run()
    cid = sim.server["aug/fedrdn"]["clients"][0]
    mean, _ = channel_statistics(sim.exp.train_clients[cid].train.x)
    assert torch.equal(sim.server["aug/fedrdn"]["mean"][0], mean)
    assert "privacy" not in _summary(tmp_path / "run")


@needs_opacus
def test_a_resumed_protected_run_spends_and_repeats_the_uninterrupted_one(tmp_path):
    cfg = toy_cfg(FEDRDN, "privacy.epsilon=2", "checkpoint.every=1", rounds=3)
    full = run_experiment(cfg, run_dir=tmp_path / "full", progress=False)
    with pytest.raises(RunInterrupted):
        run_experiment(cfg, run_dir=tmp_path / "cut", progress=False, stop_after=1)
    resume_experiment(tmp_path / "cut", progress=False)
    assert_runs_equal(tmp_path / "cut", full.run_dir)
    assert _summary(tmp_path / "cut")["privacy"] == _summary(full.run_dir)["privacy"]


@needs_opacus
def test_an_extension_of_a_setup_only_release_spends_nothing_more(tmp_path):
    cfg = toy_cfg(FEDRDN, "privacy.epsilon=2", rounds=2)
    run_experiment(cfg, run_dir=tmp_path / "run", progress=False)
    before = _summary(tmp_path / "run")["privacy"]
    resume_experiment(tmp_path / "run", progress=False, rounds=3)
    after = _summary(tmp_path / "run")["privacy"]
    assert after["epsilon_spent"] == before["epsilon_spent"]
    assert after["noise_multiplier"] == before["noise_multiplier"]


@needs_opacus
def test_an_extension_past_the_planned_releases_stops_before_its_first_round():
    per_round = RecordPlan("stats", "x", When.ROUND, 1.0, True, releases=4)
    plan = Plan(1.0, 1e-5, 5.0, rounds=4, records=(per_round,), seed=0)
    plan.check_rounds(4)  # what it was planned for
    with pytest.raises(ConfigError, match=r"stops before round 5") as e:
        plan.check_rounds(5)
    assert "privacy.epsilon=1" in str(e.value) and "\n" not in str(e.value)
    # spent after r rounds: r releases of a per-round record, 1 of a setup record
    setup = RecordPlan("s", "x", When.SETUP, 1.0, True, releases=1)
    both = Plan(1.0, 1e-5, 5.0, rounds=4, records=(per_round, setup), seed=0)
    assert both.summary(3)["releases"] == 4
    assert both.summary(3)["epsilon_spent"] == pytest.approx(epsilon_spent(5.0, 4, 1e-5))


@pytest.mark.parametrize(
    ("overrides", "record"),
    [
        (["algorithm.name=fedproto"], "'prototypes'"),
        (["augment=[cfsi]"], "'cfsi_amplitudes'"),
        (["augment=[ffa]"], "'ffa_stats'"),
    ],
)
def test_a_record_the_method_cannot_bound_is_refused_naming_it(tmp_path, overrides, record):
    cfg = toy_cfg(*overrides, "privacy.epsilon=1", rounds=1)
    with pytest.raises(ConfigError) as e:
        run_experiment(cfg, run_dir=tmp_path / "run", progress=False)
    msg = str(e.value)
    assert "'privacy.epsilon'" in msg and record in msg and "\n" not in msg
    assert not (tmp_path / "run" / "checkpoint.pt").exists()


def test_a_budget_on_a_method_sharing_only_weights_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"'privacy.epsilon'.*protect nothing"):
        run_experiment(toy_cfg("privacy.epsilon=1", rounds=1), run_dir=tmp_path / "r",
                       progress=False)  # fmt: skip


@needs_opacus
def test_a_clip_for_a_record_the_run_does_not_protect_is_refused(tmp_path):
    cfg = toy_cfg(FEDRDN, "privacy.epsilon=1", "privacy.clip.prototypes=1", rounds=1)
    with pytest.raises(ConfigError, match=r"'privacy.clip.prototypes'.*fedrdn_stats"):
        run_experiment(cfg, run_dir=tmp_path / "r", progress=False)


@needs_opacus
def test_privacy_show_says_what_is_protected_and_its_noise():
    report = disclose(toy_cfg(FEDRDN, "privacy.epsilon=2", "privacy.clip.fedrdn_stats=0.5"))
    text = render(report)
    assert "fedrdn_stats: yes: clipped per example, Gaussian noise" in text
    assert "weights: not covered" in text
    plan = report["privacy"]
    few = next(r for r in report["records"] if r["record"] == "fedrdn_stats")["fewest_examples"]
    want = plan["noise_multiplier"] * 2 * 0.5 / few
    assert f"noise std per value at most {want:.4g}" in text
    off = render(disclose(toy_cfg("algorithm.name=fedproto")))
    assert "prototypes: no, refused: computed with the model the site trained" in off


@needs_opacus
def test_a_protected_amplitude_needs_the_sites_own_images(tmp_path):
    cfg = toy_cfg("augment=[mixup, ampnorm]", "privacy.epsilon=1", rounds=1)
    with pytest.raises(ConfigError, match=r"'privacy.epsilon'.*list 'ampnorm' first"):
        run_experiment(cfg, run_dir=tmp_path / "r", progress=False)


@needs_opacus
def test_a_protected_harmofl_run_releases_its_amplitude_once(tmp_path):
    cfg = toy_cfg("algorithm.name=harmofl", "privacy.epsilon=4", rounds=2)
    run_experiment(cfg, run_dir=tmp_path / "r", progress=False)
    rec = _summary(tmp_path / "r")["privacy"]["records"]["amplitude"]
    assert rec["releases"] == 1 and rec["component"] == "ampnorm"
    assert rec["epsilon_spent"] <= 4


@needs_opacus
def test_a_protected_run_in_worker_processes_is_the_sequential_one(tmp_path, worker_pool):
    """Every worker plans the same budget from the config and draws the same noise."""
    from fedshift.runtime.rundir.results import config_changes

    cfg = toy_cfg("augment=[{name: fedmix, m: 5}]", "privacy.epsilon=4", rounds=2)
    named = [k for k, _ in config_changes(cfg) if k.startswith("privacy")]
    assert named == ["privacy.epsilon"]  # the run's folder name: delta, clip at defaults unnamed
    one = run_experiment(cfg, run_dir=tmp_path / "one", progress=False)
    run_experiment(cfg, run_dir=tmp_path / "two", progress=False, pool=worker_pool)
    assert_runs_equal(tmp_path / "two", one.run_dir)
    assert _summary(tmp_path / "two")["privacy"] == _summary(one.run_dir)["privacy"]


def test_a_run_started_before_the_privacy_section_existed_resumes(tmp_path):
    """A checkpoint whose config has no ``privacy`` section (fedshift before it) resumes:
    the section at its off value is what such a run did."""
    from fedshift.runtime.rundir.checkpoint_io import CHECKPOINT, read_run_state, write_checkpoint

    cfg = toy_cfg(FEDRDN, "checkpoint.every=1", rounds=2)
    with pytest.raises(RunInterrupted):
        run_experiment(cfg, run_dir=tmp_path / "cut", progress=False, stop_after=1)
    path = tmp_path / "cut" / CHECKPOINT
    state = read_run_state(tmp_path / "cut", map_location="cpu")
    del state["config"]["privacy"]
    write_checkpoint(state, path)
    resume_experiment(tmp_path / "cut", progress=False)
    assert "privacy" not in _summary(tmp_path / "cut")


@needs_opacus
def test_a_budget_too_small_for_one_release_fails_before_any_client_state(tmp_path):
    cfg = toy_cfg(FEDRDN, "privacy.epsilon=1e-4", "privacy.delta=1e-12", rounds=1)
    with pytest.raises(ConfigError, match=r"'privacy.epsilon'.*cannot cover 1 release") as e:
        run_experiment(cfg, run_dir=tmp_path / "r", progress=False)
    assert "\n" not in str(e.value)
    assert not (tmp_path / "r" / "checkpoint.pt").exists()
