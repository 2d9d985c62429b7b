"""Segmentation: soft Dice / joint loss, Dice metrics, config-time task checks, and the
algorithms of FedFA's / HarmoFL's segmentation tables running end to end on ``toyseg``."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F
from conftest import seg_cfg
from support.same_run import assert_same_run

from fedshift.catalog import resolve
from fedshift.core.config import load_config
from fedshift.core.errors import ConfigError
from fedshift.core.tasks import (
    Classification,
    Segmentation,
    dice_counts,
    dice_from_counts,
    joint_loss,
    soft_dice_loss,
)
from fedshift.runtime.simulation import run_experiment


# ----------------------------------------------------------------------------- losses
def test_soft_dice_loss_by_hand():
    # one image, 2 pixels, 2 classes; logits 0 -> p = 0.5 everywhere; labels [0, 1]
    logits = torch.zeros(1, 2, 1, 2)
    y = torch.tensor([[[0, 1]]])
    # class c: inter = 0.5, sum p = 1, sum g = 1 -> D = (1 + s) / (2 + s); loss = 1 - D
    s = 1e-5
    want = 1 - (1 + s) / (2 + s)
    assert soft_dice_loss(logits, y).item() == pytest.approx(want, abs=1e-7)
    # uneven: probabilities for class 1 = [0.2, 0.9]; labels [0, 1]
    p1 = torch.tensor([0.2, 0.9])
    logits = torch.stack([torch.zeros(2), torch.log(p1 / (1 - p1))]).view(1, 2, 1, 2)
    d0 = (2 * 0.8 + s) / (0.8 + 0.1 + 1 + s)
    d1 = (2 * 0.9 + s) / (0.2 + 0.9 + 1 + s)
    assert soft_dice_loss(logits, y).item() == pytest.approx(1 - (d0 + d1) / 2, abs=1e-6)


def test_soft_dice_loss_is_zero_for_a_perfect_confident_prediction():
    y = torch.randint(0, 3, (2, 8, 8))
    logits = 50 * F.one_hot(y, 3).movedim(-1, 1).float()
    assert soft_dice_loss(logits, y).item() == pytest.approx(0, abs=1e-6)
    wrong = 50 * F.one_hot((y + 1) % 3, 3).movedim(-1, 1).float()
    assert soft_dice_loss(wrong, y).item() == pytest.approx(1, abs=1e-4)


def test_joint_loss_is_the_mean_of_ce_and_dice():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 3, 4, 4, generator=g)
    y = torch.randint(0, 3, (2, 4, 4), generator=g)
    want = (F.cross_entropy(logits, y) + soft_dice_loss(logits, y)) / 2
    assert joint_loss(logits, y).item() == pytest.approx(want.item())
    task = Segmentation("auto")
    assert task.loss(logits, y).item() == pytest.approx(want.item())
    assert Segmentation("dice").loss(logits, y).item() == pytest.approx(
        soft_dice_loss(logits, y).item()
    )
    assert Segmentation("ce").loss(logits, y).item() == pytest.approx(
        F.cross_entropy(logits, y).item()
    )


def test_soft_dice_gradient_flows():
    logits = torch.zeros(1, 2, 2, 2, requires_grad=True)
    soft_dice_loss(logits, torch.tensor([[[0, 1], [1, 1]]])).backward()
    assert logits.grad is not None and logits.grad.abs().sum() > 0


# ----------------------------------------------------------------------------- metrics
def test_dice_metrics_by_hand_including_a_skipped_empty_class():
    # image 0: gt [0 0 1 1], pred [0 1 1 1]; class 2 absent in both -> skipped
    # image 1: gt [0 2 2 2], pred [0 0 2 2]; class 1 absent in both -> skipped
    y = torch.tensor([[[0, 0, 1, 1]], [[0, 2, 2, 2]]])
    pred = torch.tensor([[[0, 1, 1, 1]], [[0, 0, 2, 2]]])
    per_class = dice_from_counts(dice_counts(pred, y, 3))
    d0 = ((2 * 1 / 3) + (2 * 1 / 3)) / 2  # image 0: |P|=1,|G|=2,I=1; image 1: |P|=2,|G|=1,I=1
    d1 = 2 * 2 / 5  # image 0 only
    d2 = 2 * 2 / 5  # image 1 only
    assert per_class.tolist() == pytest.approx([d0, d1, d2])
    # a class in neither map anywhere is NaN and left out of the means
    per4 = dice_from_counts(dice_counts(pred, y, 4))
    assert math.isnan(per4[3])


def test_segmentation_evaluate_reports_foreground_and_all_class_dice():
    from fedshift.core.federation import Split

    y = torch.tensor([[[0, 0, 1, 1]], [[0, 1, 1, 1]]])
    pred = torch.tensor([[[0, 1, 1, 1]], [[0, 1, 1, 1]]])

    class Fixed(torch.nn.Module):
        def forward(self, x):  # logits whose argmax is ``pred`` (x carries the index)
            idx = x[:, 0, 0, 0].long()
            return 10 * F.one_hot(pred[idx], 2).movedim(-1, 1).float()

    x = torch.arange(2).float().view(2, 1, 1, 1).expand(2, 1, 1, 4).contiguous()
    m = Segmentation().evaluate(Fixed(), Split(x, y), lambda t: t, 1, torch.device("cpu"))
    fg = ((2 * 2 / 5) + 1.0) / 2
    bg = ((2 * 1 / 3) + 1.0) / 2
    assert m["dice"] == pytest.approx(fg)
    assert m["dice_all"] == pytest.approx((fg + bg) / 2)
    assert m["loss"] > 0


# ----------------------------------------------------------------------------- config checks
@pytest.mark.parametrize(
    "overrides, match",
    [
        (["algorithm.name=fedproto"], "fedproto.*classification only.*segmentation"),
        (["algorithm.name=fraug"], "fraug.*classification only"),
        (["algorithm.name=distrans"], "distrans.*classification only"),
        (["augment=[mixup]"], "augment 'mixup' supports classification only"),
        (["partition.name=iid"], "partition.name.*segmentation"),
        (["model.name=cnn"], "model.name.*cnn.*classification model"),
        (["model.name=unet", "dataset.size=40"], "divisible by 16"),
    ],
)
def test_segmentation_rejects_what_needs_one_label_per_image(overrides, match):
    with pytest.raises(ConfigError, match=match):
        from fedshift.runtime.simulation import Simulation

        cfg = seg_cfg(*overrides)
        Simulation(cfg, "/tmp/unused", progress=False)


def test_classification_rejects_dice_losses():
    for loss in ("dice", "ce+dice"):
        with pytest.raises(ConfigError, match="train.loss.*segmentation loss"):
            resolve(load_config(None, ["dataset.name=toyshift", f"train.loss={loss}"]))
    with pytest.raises(ConfigError, match="train.loss"):
        Classification("dice")


def test_moon_on_segmentation_needs_projection_false(tmp_path):
    with pytest.raises(ConfigError, match="projection=false"):
        run_experiment(seg_cfg("algorithm.name=moon"), run_dir=tmp_path / "m", progress=False)


# ----------------------------------------------------------------------------- end to end
SEG_ALGORITHMS = [
    "fedavg",
    "fedprox",
    "fedavgm",
    "fedadam",
    "fednova",
    "fedbn",
    "moon algorithm.projection=false",
    "fedfa",
    "harmofl",
    "fedrdn",
]


@pytest.mark.parametrize("algo", SEG_ALGORITHMS)
def test_segmentation_algorithms_run_and_report_dice(algo, tmp_path):
    name, *rest = algo.split()
    over = [f"algorithm.name={name}", *rest]
    if name == "fednova":
        over += ["train.optimizer=sgd", "train.lr=0.05"]
    res = run_experiment(seg_cfg(*over, rounds=2), run_dir=tmp_path / name, progress=False)
    s = res.summary
    assert s["task"] == "segmentation" and s["metric"] == "dice"
    assert s["metric_label"] == "foreground Dice"
    assert set(s["metrics"]) == {"dice_all"}
    assert 0 <= s["test_mean"] <= 1 and 0 <= s["metrics"]["dice_all"]["test_mean"] <= 1
    row = json.loads((tmp_path / name / "metrics.jsonl").read_text().splitlines()[0])
    kind = s["evaluated_model"]
    assert {"val_dice", "val_dice_all", "val_loss", "test_dice", "test_dice_all"} <= set(row[kind])
    assert "dh" not in s or s["dh"] is None


def test_segmentation_learns_on_toyseg(tmp_path):
    cfg = seg_cfg("model.width=8", "train.local_epochs=2", rounds=6)
    s = run_experiment(cfg, run_dir=tmp_path / "learn", progress=False).summary
    first = s["models"]["global"]
    lines = (tmp_path / "learn/metrics.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    round1 = [r["global"]["val_dice"] for r in rows if r["round"] == 1]
    assert first["best"]["val_mean"] > sum(round1) / len(round1) + 0.1


def test_selection_uses_foreground_dice(tmp_path):
    from fedshift.eval.summary import select_round

    def row(rnd, val, val_all, test):
        m = {"val_dice": val, "val_dice_all": val_all, "test_dice": test, "test_dice_all": 0.5}
        return {"round": rnd, "client": "a", "global": m}

    records = [row(1, 0.4, 0.9, 0.1), row(2, 0.6, 0.7, 0.2)]
    sel = select_round(records, "global", "dice", ("dice_all",))
    assert sel["best"]["round"] == 2
    assert sel["best"]["metrics"]["dice_all"]["val_mean"] == pytest.approx(0.7)


def test_segmentation_resume_equals_uninterrupted(tmp_path):
    """A segmentation run (FedFA on U-Net, Dice metrics) killed after round 2 and resumed."""
    cfg = seg_cfg("algorithm.name=fedfa", "checkpoint.every=1", rounds=3)
    assert_same_run(cfg, tmp_path, stop_after=2)


def test_tables_caption_the_metric(tmp_path):
    from fedshift.eval.tables import flows_table, metric_caption, runs_table

    s = run_experiment(seg_cfg(rounds=1), run_dir=tmp_path / "t", progress=False).summary
    assert metric_caption([s]) == "Test foreground Dice (%)"
    assert metric_caption([s], "dice_all") == "Test mean Dice incl. background (%)"
    fg, all_ = runs_table([s]), runs_table([s], "dice_all")
    assert f"{100 * s['test_mean']:.2f}" in fg
    assert f"{100 * s['metrics']['dice_all']['test_mean']:.2f}" in all_
    with pytest.raises(ValueError, match="no metric 'acc'"):
        flows_table([s], "acc")


def test_site_figure_predicts_with_each_clients_evaluated_model(tmp_path):
    from fedshift.protocols.segviz import foreground_dice, predict, site_predictions_figure

    runs = []
    for algo in ("fedavg", "fedbn"):
        cfg = seg_cfg(f"algorithm.name={algo}", rounds=1)
        runs.append(run_experiment(cfg, run_dir=tmp_path / algo, progress=False).run_dir)
    out = site_predictions_figure(runs, tmp_path / "fig.png", channel=1)
    assert out.is_file() and out.stat().st_size > 10_000
    # FedBN predicts each client with its own model (shared weights + its BN layers): the
    # prediction is the run's per-client evaluation model's
    from fedshift.protocols.segviz import _load

    sim = _load(runs[1])
    x = sim.fed.clients[0].test.x[:2]
    a = predict(sim, "client0", x)
    assert a.shape == (2, 32, 32) and a.dtype == torch.long
    sim.model.load_state_dict(sim.algo.personal_weights(sim.server, sim.states["client0"]))
    sim.model.eval()
    with torch.no_grad():
        want = sim.model(sim.pipeline.eval(x, sim.states["client0"])).argmax(1)
    assert torch.equal(a, want)
    assert not torch.equal(
        sim.algo.personal_weights(sim.server, sim.states["client0"])["stages.enc1.bn1.weight"],
        sim.algo.personal_weights(sim.server, sim.states["client1"])["stages.enc1.bn1.weight"],
    )
    y = torch.tensor([[0, 1], [1, 1]])
    assert foreground_dice(torch.tensor([[0, 1], [0, 1]]), y, 2) == pytest.approx(2 * 2 / 5)


@pytest.mark.parametrize("task", ["classification", "segmentation"])
def test_nan_outputs_are_refused_not_scored(task):
    """A model whose outputs hold NaN is not scored: argmax of a NaN row is class 0, which
    would read as the accuracy / Dice of a model that predicts class 0 everywhere."""
    from fedshift.core.federation import Split
    from fedshift.core.tasks import NonFiniteOutputError, make_task

    if task == "classification":
        split = Split(torch.randn(6, 3), torch.tensor([0, 1, 2, 0, 1, 2]))
        model = torch.nn.Linear(3, 3)
    else:
        split = Split(torch.randn(4, 1, 8, 8), torch.randint(0, 2, (4, 8, 8)))
        model = torch.nn.Conv2d(1, 2, 1)
    t = make_task(task)
    ok = t.evaluate(model, split, lambda x: x, 4, torch.device("cpu"))  # finite: scored
    assert all(v == v for v in ok.values())
    with torch.no_grad():
        model.bias[0] = float("nan")
    with pytest.raises(NonFiniteOutputError, match="NaN/inf"):
        t.evaluate(model, split, lambda x: x, 4, torch.device("cpu"))
