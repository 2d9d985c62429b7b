"""benchmarks/privacy_price.py: the cells' configs, the break-even rule on a hand-made grid,
and the grid run end to end on toyshift (run, refused, resumed)."""

from __future__ import annotations

import json
import math
import os
import sys

import pytest
import yaml
from conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
import privacy_price as pp  # noqa: E402


def _t2_one_sided(t: float) -> float:
    """P(T > t) for Student's t with 2 degrees of freedom (closed form)."""
    return 0.5 - t / (2 * math.sqrt(2 + t * t))


def test_compare_is_a_one_sided_paired_t_test():
    # differences 0.1, 0.1, 0.05: mean 1/12, sd 0.05/sqrt(3), so t = 5 exactly (df 2)
    c = pp.compare({0: 0.6, 1: 0.7, 2: 0.8}, {0: 0.5, 1: 0.6, 2: 0.75}, alpha=0.05)
    assert c.n == 3 and c.mean_diff == pytest.approx(1 / 12)
    assert c.p == pytest.approx(_t2_one_sided(5.0)) and c.beats  # p ~ 0.019
    assert not pp.compare({0: 0.6, 1: 0.7, 2: 0.8}, {0: 0.5, 1: 0.6, 2: 0.75}, 0.01).beats
    # the same differences, negative: the mean is below zero, p = 1 - 0.019
    c = pp.compare({0: 0.5, 1: 0.6, 2: 0.75}, {0: 0.6, 1: 0.7, 2: 0.8}, alpha=0.05)
    assert c.p == pytest.approx(1 - _t2_one_sided(5.0)) and not c.beats
    # equal differences: p 0 when positive, 1 when zero; pairs only over common seeds
    assert pp.compare({0: 0.7, 1: 0.8, 5: 0.1}, {0: 0.6, 1: 0.7}, 0.05) == pp.Comparison(
        2, pytest.approx(0.1), 0.0, True
    )
    assert pp.compare({0: 0.7, 1: 0.8}, {0: 0.7, 1: 0.8}, 0.05).beats is False
    # one common seed: not tested, so not beating
    one = pp.compare({0: 0.9}, {0: 0.1}, 0.05)
    assert one.p is None and not one.beats and one.n == 1


def test_break_even_is_the_smallest_eps_beaten_from_the_top():
    inf = math.inf
    assert pp.break_even({0.5: False, 1: True, 2: True, 4: True, 8: True, inf: True}) == 1
    # beaten at 0.5 but not at 1: the run of wins from the top stops at 2
    assert pp.break_even({0.5: True, 1: False, 2: True, 4: True, 8: True}) == 2
    assert pp.break_even({0.5: True, 8: False, inf: True}) is None  # inf is not a budget
    assert pp.break_even({0.5: True, 1: True}) == 0.5


def _cell(method: str, eps: str, seed: int, score: float) -> dict:
    return {"dataset": "d", "method": method, "eps": eps, "seed": seed, "score": score,
            "metric": "acc", "membership_auc": 0.5}  # fmt: skip


def test_analysis_and_tables_on_a_hand_made_grid():
    grid = pp.Grid(("d",), ("fedavg", "fedrdn", "fedfa"), (1.0, 8.0, math.inf), (0, 1, 2), 5)
    base = {"1": 0.3, "8": 0.5, "inf": 0.6}
    cells = [_cell("fedavg", e, s, v + 0.01 * s) for e, v in base.items() for s in range(3)]
    # FedRDN: behind at eps 1, ahead by 0.1, 0.1, 0.05 at 8 and inf (t = 5: beats)
    gains = {"1": (-0.05, 0.0, 0.01), "8": (0.1, 0.1, 0.05), "inf": (0.1, 0.1, 0.05)}
    cells += [_cell("fedrdn", e, s, base[e] + 0.01 * s + g[s]) for e, g in gains.items()
              for s in range(3)]  # fmt: skip
    cells += [{**_cell("fedfa", e, s, 0), "refused": "no"} for e in ("1", "8") for s in range(3)]
    for c in cells[-6:]:
        del c["score"], c["membership_auc"]
    cells += [_cell("fedfa", "inf", s, base["inf"] + 0.01 * s) for s in range(3)]
    a = pp.analyse(cells, grid, alpha=0.05)
    assert a["d/fedrdn"]["break_even"] == 8.0
    assert [a["d/fedrdn"]["comparisons"][e]["beats"] for e in base] == [False, True, True]
    assert a["d/fedfa"]["break_even"] is None and a["d/fedfa"]["refused"] == ["no"]
    assert a["d/fedfa"]["comparisons"]["inf"]["p"] == 1.0  # equal to FedAvg
    text = pp.tables(cells, grid, a, 0.05)
    assert "| fedrdn | 8 | -1.3 (p=" in text and "| fedfa | refused under DP | - | - |" in text
    assert "| fedfa | refused | refused | 61.0 ± 1.0 |" in text


@pytest.mark.slow
def test_the_grid_runs_refuses_and_resumes_on_toyshift(tmp_path, monkeypatch):
    """FedAvg at eps 1 and inf and FedFA (refused under DP) on toyshift, one round: the
    protected cell runs DP-FedAvg with uniform weighting, the inf cell no DP but uniform
    weighting too; a second call reruns nothing; the outputs are written."""
    grid = pp.Grid(("toyshift",), ("fedavg", "fedfa"), (1.0, math.inf), (0,), rounds=1)
    cells = pp.run_grid(grid, tmp_path, log=lambda s: None)
    by = {(c["method"], c["eps"]): c for c in cells}
    assert set(by) == {("fedavg", "1"), ("fedavg", "inf"), ("fedfa", "1"), ("fedfa", "inf")}
    assert "ffa_stats" in by["fedfa", "1"]["refused"]
    assert by["fedavg", "1"]["weights_noise_multiplier"] > 0
    assert by["fedavg", "inf"]["weights_noise_multiplier"] is None
    for c in (by["fedavg", "1"], by["fedavg", "inf"], by["fedfa", "inf"]):
        assert 0 <= c["score"] <= 1 and 0 <= c["membership_auc"] <= 1
    cfg = yaml.safe_load((tmp_path / "runs/toyshift-fedavg-eps1-seed0/config.yaml").read_text())
    assert cfg["privacy"]["updates"] == "client" and cfg["privacy"]["epsilon"] == 1
    assert cfg["federation"]["weighting"] == "uniform"
    cfg = yaml.safe_load((tmp_path / "runs/toyshift-fedfa-epsinf-seed0/config.yaml").read_text())
    assert cfg["privacy"]["epsilon"] is None and cfg["federation"]["weighting"] == "uniform"

    def no_run(*args, **kwargs):
        raise AssertionError("a finished or refused cell ran again")

    monkeypatch.setattr("fedshift.runtime.simulation.run_experiment", no_run)
    monkeypatch.setattr("fedshift.runtime.simulation.resume_experiment", no_run)
    again = pp.run_grid(grid, tmp_path, log=lambda s: None)
    assert [c.get("score") for c in again] == [c.get("score") for c in cells]
    # a cell another live process holds is left out; a lock of a process gone is taken over
    (tmp_path / "runs/toyshift-fedavg-eps1-seed0.lock").write_text(str(os.getpid()))
    (tmp_path / "runs/toyshift-fedavg-epsinf-seed0.lock").write_text("99999999")
    held = pp.run_grid(grid, tmp_path, log=lambda s: None)
    assert [(c["method"], c["eps"]) for c in held] == [("fedavg", "inf"), ("fedfa", "1"),
                                                       ("fedfa", "inf")]  # fmt: skip
    assert not (tmp_path / "runs/toyshift-fedavg-epsinf-seed0.lock").exists()
    text = pp.write_outputs(again, grid, tmp_path, 0.05, "python benchmarks/privacy_price.py")
    assert "| fedfa | refused under DP |" in text
    data = json.loads((tmp_path / "privacy_price.json").read_text())
    assert data["eps"] == ["1", "inf"] and len(data["cells"]) == 4
    assert (tmp_path / "privacy_price.png").stat().st_size > 0


def test_the_noisy_record_attack_has_known_answers():
    """A mean over one example, released without noise, is the example: AUC 1; with noise
    far above the features' spread the test is at chance."""
    import torch

    feats = torch.randn(400, 6, generator=torch.Generator().manual_seed(0))
    assert pp.noisy_membership_auc(feats, n=1, noise=0.0, trials=20) == 1.0
    assert abs(pp.noisy_membership_auc(feats, n=5, noise=100.0, trials=40) - 0.5) < 0.15
    assert pp.noisy_membership_auc(feats, n=5, noise=0.0) > 0.7  # 6 features over 5 examples


def test_example_updates_put_dp_sgd_and_the_model_without_norm_in_every_cell():
    """--updates example: DP-SGD at a finite eps and model.norm=none in every cell, inf too
    (the same model with and without noise); the default stays the committed DP-FedAvg grid."""
    from fedshift.catalog import resolve
    from fedshift.core.config import load_config

    client = pp.Grid(("digits",), ("fedavg",), (1.0, math.inf), (0,), rounds=3)
    example = pp.Grid(("digits",), ("fedavg",), (1.0, math.inf), (0,), rounds=3,
                      updates="example")  # fmt: skip
    over = pp.cell_overrides("digits", "fedavg", 1.0, 0, client)
    assert "privacy.updates=client" in over and not any("model.norm" in o for o in over)
    for eps, updates in ((1.0, "example"), (math.inf, "none")):
        cfg = resolve(load_config(None, pp.cell_overrides("digits", "fedrdn", eps, 2, example)))
        assert cfg.model.params.norm == "none" and cfg.privacy.updates == updates
        assert cfg.federation.weighting == "uniform" and cfg.seed == 2
    assert cfg.privacy.epsilon is None
    with pytest.raises(SystemExit):
        pp.main(["--out", "/nonexistent", "--updates", "sample"])


@pytest.mark.slow
def test_the_example_grid_runs_dp_sgd_and_records_refusals_on_toyshift(tmp_path):
    """--updates example on toyshift, one round: FedAvg's eps-1 cell trains with DP-SGD
    (unit example) on the model without normalisation, HarmoFL is refused with DP-SGD's
    reason, and the break-even table says so."""
    grid = pp.Grid(("toyshift",), ("fedavg", "harmofl"), (1.0, math.inf), (0,), rounds=1,
                   updates="example")  # fmt: skip
    cells = pp.run_grid(grid, tmp_path, log=lambda s: None)
    by = {(c["method"], c["eps"]): c for c in cells}
    assert "privacy.updates" in by["harmofl", "1"]["refused"]
    assert 0 <= by["harmofl", "inf"]["score"] <= 1
    summary = json.loads((tmp_path / "runs/toyshift-fedavg-eps1-seed0/summary.json").read_text())
    assert summary["privacy"]["records"]["weights"]["unit"] == "example"
    assert by["fedavg", "1"]["weights_noise_multiplier"] == max(
        s["noise_multiplier"] for s in summary["privacy"]["records"]["weights"]["sites"].values()
    )
    cfg = yaml.safe_load((tmp_path / "runs/toyshift-fedavg-epsinf-seed0/config.yaml").read_text())
    assert cfg["model"]["norm"] == "none" and cfg["privacy"]["updates"] == "none"
    text = pp.write_outputs(cells, grid, tmp_path, 0.05, "python benchmarks/privacy_price.py")
    assert "| harmofl | refused under DP-SGD |" in text
    assert json.loads((tmp_path / "privacy_price.json").read_text())["updates"] == "example"


def test_a_cell_whose_outputs_overflow_is_recorded_diverged_not_scored(tmp_path, monkeypatch):
    """A run whose evaluation meets NaN/inf outputs (NonFiniteOutputError) is recorded as
    diverged with the round it stopped in, read back without running again, and shown as
    such in the tables instead of a score."""
    from fedshift.core.tasks import NonFiniteOutputError

    def overflow(cfg, run_dir, **kwargs):
        run_dir.mkdir(parents=True)
        (run_dir / "metrics.jsonl").write_text('{"round": 1}\n{"round": 2}\n')
        raise NonFiniteOutputError("client 'c0', val split: the model's outputs hold NaN")

    monkeypatch.setattr("fedshift.runtime.simulation.run_experiment", overflow)
    grid = pp.Grid(("toyshift",), ("fedavg",), (1.0,), (0,), rounds=3)
    [cell] = pp.run_grid(grid, tmp_path, log=lambda s: None)
    assert "NaN" in cell["diverged"] and cell["round"] == 3 and "score" not in cell

    def no_run(*args, **kwargs):
        raise AssertionError("a diverged cell ran again")

    monkeypatch.setattr("fedshift.runtime.simulation.run_experiment", no_run)
    assert pp.run_grid(grid, tmp_path, log=lambda s: None) == [cell]
    text = pp.write_outputs([cell], grid, tmp_path, 0.05, "python benchmarks/privacy_price.py")
    assert "| fedavg | diverged |" in text
    assert "toyshift fedavg eps 1 seed 0: at round 3's evaluation" in text
