"""FedDG-GA (Zhang et al., CVPR 2023): the generalisation adjustment of the aggregation
weights (uncentred code form and centred form, sign of the metric, clip and renormalise),
the step-size decay, the payload ordering of the gaps, the base trainer, an end-to-end run."""

from __future__ import annotations

from fractions import Fraction

import pytest
import torch
from conftest import toy_cfg
from support.replies import full, reply

from fedshift.algorithms import ALGORITHMS
from fedshift.algorithms.feddg_ga import GLOBAL_SCORE, LOCAL_SCORE, adjust_weights, step_size
from fedshift.algorithms.fedprox import ANCHOR
from fedshift.core.config import FederationConfig, TrainConfig
from fedshift.core.errors import ConfigError
from fedshift.models.digits import SmallCNN
from fedshift.runtime.simulation import Simulation

THIRD = 1 / 3
TOL = 1e-12  # the weights are Python floats (float64)


def _close(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for k in want:
        assert abs(got[k] - float(want[k])) < TOL, (k, got[k], want[k])


def make(rounds=10, fraction=1.0, num_clients=3, **params):
    entry = ALGORITHMS.entry("feddg_ga")
    model = SmallCNN(width=4)
    fed = FederationConfig(sample_fraction=fraction)
    algo = entry.obj(entry.params(**params), TrainConfig(lr=0.1, rounds=rounds), fed, model,
                     num_clients)  # fmt: skip
    return algo, model


# ----------------------------------------------------------------------------- steps 3-4
def test_adjustment_code_form_by_hand():
    # K = 3, equal weights, accuracy gaps G = (-0.1, 0.05, 0.2), d = 0.3: max|G| = 0.2,
    # G~ = (-0.5, 0.25, 1); a_k += -G~_k * 0.3 / 3 -> (23/60, 37/120, 7/30), sum 37/40;
    # renormalised: (46/111, 1/3, 28/111)
    w = {"a": THIRD, "b": THIRD, "c": THIRD}
    got = adjust_weights(w, {"a": -0.1, "b": 0.05, "c": 0.2}, 0.3, "acc", centred=False)
    _close(got, {"a": Fraction(46, 111), "b": Fraction(1, 3), "c": Fraction(28, 111)})
    assert w == {"a": THIRD, "b": THIRD, "c": THIRD}  # the input is not modified


def test_adjustment_centred_form_by_hand():
    # same gaps, centred: mean 0.05 -> (-0.15, 0, 0.15), G~ = (-1, 0, 1);
    # a_k += -G~_k * 0.1 -> (13/30, 1/3, 7/30), already summing to 1
    w = {"a": THIRD, "b": THIRD, "c": THIRD}
    got = adjust_weights(w, {"a": -0.1, "b": 0.05, "c": 0.2}, 0.3, "acc", centred=True)
    _close(got, {"a": Fraction(13, 30), "b": Fraction(1, 3), "c": Fraction(7, 30)})


def test_loss_metric_gives_weight_to_the_growing_loss():
    # loss gaps (0.2, 0, -0.2): sign +1, a_k += G~_k * 0.1 -> (13/30, 1/3, 7/30)
    w = {"a": THIRD, "b": THIRD, "c": THIRD}
    got = adjust_weights(w, {"a": 0.2, "b": 0.0, "c": -0.2}, 0.3, "loss")
    _close(got, {"a": Fraction(13, 30), "b": Fraction(1, 3), "c": Fraction(7, 30)})


def test_clip_then_renormalise_by_hand():
    # a = (0.05, 0.45, 0.5), accuracy gaps (0.3, -0.3, 0), d/K = 0.6/3 = 0.2, G~ = (1, -1, 0):
    # a -> (-0.15, 0.65, 0.5) -> clip (0, 0.65, 0.5) -> / 1.15 = (0, 13/23, 10/23)
    got = adjust_weights({"a": 0.05, "b": 0.45, "c": 0.5}, {"a": 0.3, "b": -0.3, "c": 0.0}, 0.6)
    _close(got, {"a": 0, "b": Fraction(13, 23), "c": Fraction(10, 23)})


def test_equal_gaps_leave_the_weights():
    w = {"a": 0.2, "b": 0.8}
    _close(adjust_weights(w, {"a": 0.1, "b": 0.1}, 0.2, centred=True), w)
    _close(adjust_weights(w, {"a": 0.0, "b": 0.0}, 0.2), w)


# ----------------------------------------------------------------------------- step 5
def test_step_size_decays_linearly():
    # R = 10, step 0.2: linear d_r = 0.2 (10 - r + 1) / 10; code d_r = 0.2 (10 - r + 2) / 10
    assert step_size(0.2, 1, 10) == pytest.approx(0.2, abs=1e-15)
    assert step_size(0.2, 10, 10) == pytest.approx(0.02, abs=1e-15)
    assert step_size(0.2, 6, 10) == pytest.approx(0.1, abs=1e-15)
    assert step_size(0.2, 1, 10, "code") == pytest.approx(0.22, abs=1e-15)
    assert step_size(0.2, 10, 10, "code") == pytest.approx(0.04, abs=1e-15)


# ----------------------------------------------------------------------------- the server
def test_gaps_of_the_previous_round_set_this_rounds_weights():
    algo, model = make(rounds=10, step_size=0.3)
    server = algo.init_server(model)
    w = server["weights"]
    key = "stages.conv1.conv.weight"
    # round 1: weights 1/3 each (uniform): the average of 0, 3, 6 is 3
    algo.aggregate(server, 1, [
        reply("a", 10, weights=full(w, 0.0), metrics={LOCAL_SCORE: 0.9}),
        reply("b", 10, weights=full(w, 3.0), metrics={LOCAL_SCORE: 0.6}),
        reply("c", 10, weights=full(w, 6.0), metrics={LOCAL_SCORE: 0.5}),
    ])  # fmt: skip
    assert torch.allclose(server["weights"][key], torch.full_like(w[key], 3.0))
    _close(server["ga"]["weights"], {"a": THIRD, "b": THIRD, "c": THIRD})
    # round 2: the received (round-1) global model scores 0.8, 0.65, 0.7 -> gaps
    # (-0.1, 0.05, 0.2) with d_1 = 0.3: the weights of the code-form case above
    algo.aggregate(server, 2, [
        reply("a", 10, weights=full(w, 0.0), metrics={GLOBAL_SCORE: 0.8, LOCAL_SCORE: 0.9}),
        reply("b", 10, weights=full(w, 3.0), metrics={GLOBAL_SCORE: 0.65, LOCAL_SCORE: 0.6}),
        reply("c", 10, weights=full(w, 6.0), metrics={GLOBAL_SCORE: 0.7, LOCAL_SCORE: 0.5}),
    ])  # fmt: skip
    want = {"a": Fraction(46, 111), "b": Fraction(1, 3), "c": Fraction(28, 111)}
    _close(server["ga"]["weights"], want)
    # aggregated with the new weights: 3 * 37/111 + 6 * 28/111 = 279/111
    expected = torch.full_like(w[key], 279 / 111)
    assert torch.allclose(server["weights"][key], expected, atol=1e-5)
    assert server["ga"]["local_round"] == {"a": 2, "b": 2, "c": 2}


def test_needs_every_client_every_round():
    with pytest.raises(ConfigError, match="sample_fraction=1"):
        make(fraction=0.5)


def test_base_chooses_the_local_objective():
    fedavg_based, model = make()
    prox_based, _ = make(base="fedprox", mu=0.5)
    assert fedavg_based.penalty(None) is None  # FedAvg's objective: no term, no anchor read
    ctx = type("Ctx", (), {"model": model, "scratch": {}})()
    anchor = {k: p.detach() + 1.0 for k, p in model.named_parameters()}
    ctx.scratch[ANCHOR] = anchor
    n = sum(p.numel() for p in model.parameters())
    # mu/2 * ||w - (w + 1)||^2 = 0.5/2 * n
    assert float(prox_based.penalty(ctx).detach()) == pytest.approx(0.25 * n, rel=1e-5)


def test_end_to_end_weights_move_and_sum_to_one(tmp_path):
    cfg = toy_cfg("algorithm.name=feddg_ga", "algorithm.step_size=0.5", rounds=2)
    sim = Simulation(cfg, tmp_path / "ga", None, False)
    sim.run()
    ga = sim.server["ga"]
    weights = ga["weights"]
    assert len(weights) == 3 and sum(weights.values()) == pytest.approx(1.0, abs=1e-12)
    assert all(0.0 <= v <= 1.0 for v in weights.values())
    # round 2 adjusted them with round 1's gaps (the gaps differ between the toy domains)
    assert any(abs(v - THIRD) > 1e-6 for v in weights.values())
    assert set(ga["local_round"].values()) == {2}


@pytest.mark.slow
def test_flower_in_process_equals_native(tmp_path, one_thread):
    """The scores carried in the next round's reply (GA) and the bool masks (HEAL) cross
    Flower's wire unchanged: the same runs as on the native engine, exactly."""
    from support.same_run import assert_runs_equal

    from fedshift.flower.simulate import simulate
    from fedshift.runtime.simulation import run_experiment

    for algo in ("feddg_ga", "fedheal"):
        cfg = toy_cfg(f"algorithm.name={algo}", rounds=2)
        native = run_experiment(cfg, run_dir=tmp_path / algo / "native", progress=False)
        flower = simulate(cfg, run_dir=tmp_path / algo / "flower", engine="in-process",
                          progress=False)  # fmt: skip
        assert_runs_equal(flower.run_dir, native.run_dir)


def test_fedprox_keys_without_the_fedprox_base_are_refused():
    from fedshift.algorithms.feddg_ga import FedDGGA, FedDGGAParams
    from fedshift.algorithms.fedheal import FedHEAL, FedHEALParams

    for cls, params in ((FedDGGA, FedDGGAParams), (FedHEAL, FedHEALParams)):
        with pytest.raises(ConfigError, match="algorithm.base=fedprox"):
            cls.check(params(mu=0.5), TrainConfig())
        cls.check(params(mu=0.5, base="fedprox"), TrainConfig())
        cls.check(params(), TrainConfig())


def test_on_segmentation_the_score_is_the_foreground_dice():
    """``fair=acc`` scores a U-Net by the task's own metric (foreground Dice; a segmentation
    task has no accuracy): each reply's local score is the Dice of the weights it carries on
    the client's validation split, computed here a second time."""
    import copy

    from conftest import seg_cfg

    from fedshift.testing import full_round, start, tiny_federation

    cfg = seg_cfg("algorithm.name=feddg_ga", rounds=1)
    run = start(cfg, tiny_federation(cfg))
    assert run.exp.task.primary.name == "dice"
    for cid, up in full_round(run, 1):
        model = copy.deepcopy(run.exp.model)
        model.load_state_dict(up["weights"])
        client = run.exp.train_clients[cid]
        want = run.exp.task.evaluate(model, client.val, lambda x: x, cfg.train.batch_size,
                                     run.exp.device)["dice"]  # fmt: skip
        assert 0.0 <= up.metrics[LOCAL_SCORE] <= 1.0
        assert up.metrics[LOCAL_SCORE] == pytest.approx(want, abs=1e-6)
