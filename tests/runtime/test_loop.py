"""The round loop: determinism, resume equality, ledger, sampling, evaluation, errors."""

from __future__ import annotations

import json

import pytest
from conftest import results_of
from support.same_run import assert_runs_equal, assert_same_run

from fedshift.core.errors import TrainingError
from fedshift.data.domains.toy import ToyParams, load_toy
from fedshift.runtime.rundir.checkpoint_io import read_checkpoint
from fedshift.runtime.simulation import (
    Simulation,
    run_experiment,
)


def test_same_seed_same_numbers_and_other_seed_differs(make_cfg, tmp_path):
    cfg = make_cfg("algorithm.name=fedavg", "train.momentum=0.9")
    a = run_experiment(cfg, run_dir=tmp_path / "a", progress=False)
    run_experiment(cfg, run_dir=tmp_path / "b", progress=False)
    assert_runs_equal(tmp_path / "b", a.run_dir)
    c = run_experiment(
        make_cfg("algorithm.name=fedavg", "train.momentum=0.9", "seed=1"),
        run_dir=tmp_path / "c",
        progress=False,
    )
    assert results_of(c.summary) != results_of(a.summary)


@pytest.mark.parametrize("algo", ["fedbn", "scaffold", "fedadam"])
def test_killed_between_checkpoints_resumes_to_the_uninterrupted_run(make_cfg, tmp_path, algo):
    """Killed after round 5 with the checkpoint from round 4: round 5 is redone after the
    kill (sampled clients, persisted momentum) and the run ends as the uninterrupted one."""
    over = [
        f"algorithm.name={algo}",
        "checkpoint.every=2",
        "train.optimizer_state=persist",
        "train.momentum=0.5",
        "federation.sample_fraction=0.67",
    ]
    runs = assert_same_run(make_cfg(*over, rounds=6), tmp_path, stop_after=5)
    assert runs.saved_round["resume"] == 4


def test_ledger_bytes(make_cfg, tmp_path):
    res = {}
    for algo in ("fedavg", "fedbn", "scaffold", "local", "central"):
        res[algo] = run_experiment(
            make_cfg(f"algorithm.name={algo}", rounds=2), run_dir=tmp_path / algo, progress=False
        ).summary
    s = res["fedavg"]
    n_clients, rounds = 3, 2
    assert s["bytes_down"] == s["model_bytes"] * n_clients * rounds
    assert s["bytes_up"] == s["model_bytes"] * n_clients * rounds
    assert s["bytes_by_record"]["up"] == {"weights": s["bytes_up"]}
    # FedBN: BN tensors never cross the wire
    assert res["fedbn"]["bytes_up"] < s["bytes_up"]
    from fedshift.algorithms.base import bn_keys
    from fedshift.models import build_model

    model = build_model({"name": "lenet5", "bn": True}, 10, (3, 28, 28))
    sd = model.state_dict()
    bn_bytes = sum(sd[k].numel() * sd[k].element_size() for k in bn_keys(model, "local"))
    assert res["fedbn"]["bytes_up"] == (s["model_bytes"] - bn_bytes) * n_clients * rounds
    # SCAFFOLD: weights + control down; delta + control delta + buffers up
    assert set(res["scaffold"]["bytes_by_record"]["down"]) == {"weights", "control"}
    assert set(res["scaffold"]["bytes_by_record"]["up"]) == {"delta", "control_delta", "buffers"}
    assert res["local"]["bytes_up"] == res["local"]["bytes_down"] == 0
    assert res["central"]["bytes_up"] == 0


def test_evaluated_models(make_cfg, tmp_path):
    kinds = {}
    for algo in ("fedavg", "fedbn", "local", "central"):
        s = run_experiment(
            make_cfg(f"algorithm.name={algo}", rounds=1), run_dir=tmp_path / algo, progress=False
        ).summary
        kinds[algo] = (s["evaluated_model"], sorted(s["models"]))
        assert set(s["test_per_client"]) == {"client0", "client1", "client2"}
    assert kinds["fedavg"] == ("global", ["global"])
    assert kinds["fedbn"] == ("personal", ["personal"])
    assert kinds["local"] == ("personal", ["personal"])
    assert kinds["central"] == ("global", ["global"])


def test_model_selection_uses_validation_not_test(make_cfg, tmp_path):
    s = run_experiment(
        make_cfg("algorithm.name=fedavg", rounds=4), run_dir=tmp_path / "r", progress=False
    ).summary
    rows = [json.loads(x) for x in (tmp_path / "r/metrics.jsonl").read_text().splitlines()]
    per_round = {}
    for r in rows:
        per_round.setdefault(r["round"], []).append(r["global"])
    val = {k: sum(m["val_acc"] for m in v) / len(v) for k, v in per_round.items()}
    best = max(val, key=lambda k: (val[k], -k))
    assert s["best_round"] == best
    assert s["test_mean"] == pytest.approx(
        sum(m["test_acc"] for m in per_round[best]) / len(per_round[best])
    )


def test_client_sampling_fraction(make_cfg, tmp_path):
    cfg = make_cfg("federation.sample_fraction=0.34", "dataset.clients=6", rounds=3)
    sim = Simulation(cfg, tmp_path / "s", progress=False)
    picks = [sim.sample(r) for r in (1, 2, 3)]
    assert all(len(p) == 2 for p in picks)
    assert picks == [sim.sample(r) for r in (1, 2, 3)]  # deterministic
    assert len({tuple(p) for p in picks}) > 1  # not always the same clients
    res = sim.run()
    assert res.summary["bytes_up"] == res.summary["model_bytes"] * 2 * 3


def test_non_finite_update_names_client(make_cfg, tmp_path):
    fed = load_toy(ToyParams())
    fed.clients[1].train.x[0, 0, 0, 0] = float("nan")
    with pytest.raises(TrainingError, match="client1"):
        run_experiment(
            make_cfg("algorithm.name=fedavg"),
            run_dir=tmp_path / "n",
            federation=fed,
            progress=False,
        )


def test_first_non_finite_names_the_first_bad_tensor_in_record_order():
    """The reply check (one sync per device): the first NaN/inf tensor in record and key
    order, integer tensors skipped, None when all are finite."""
    import torch

    from fedshift.core.payload import Payload

    ok = torch.ones(3)
    p = Payload({"a": {"w": ok, "n": torch.tensor([1, 2])}, "b": {"e": torch.empty(0), "v": ok}})
    assert p.first_non_finite() is None
    assert Payload({}).first_non_finite() is None
    for bad in (float("nan"), float("inf"), -float("inf")):
        t = torch.tensor([0.0, bad])
        assert Payload({"a": {"w": ok, "x": t}, "b": {"y": t}}).first_non_finite() == "a/x"
        assert Payload({"a": {"w": ok}, "b": {"y": ok, "z": t}}).first_non_finite() == "b/z"
        assert Payload({"a": {"h": t.half(), "x": t}}).first_non_finite() == "a/h"
    big = torch.tensor([1e300, -1e300], dtype=torch.float64)  # finite, beyond float32's range
    assert Payload({"a": {"big": big, "h": torch.ones(2).bfloat16()}}).first_non_finite() is None


def test_seed_global_seeds_as_torch_manual_seed_does():
    """seed_global skips the back-ends fedshift never runs on, but the CPU generator (and a
    GPU's, where there is one) gets the seed ``torch.manual_seed`` would give it."""
    import torch

    from fedshift.core.seeding import derive_seed, seed_global

    seed_global(3, "x", 1)
    ours = torch.rand(4)
    torch.manual_seed(derive_seed(3, "x", 1))
    assert torch.equal(ours, torch.rand(4))


def test_local_training_steps(make_cfg, tmp_path):
    cfg = make_cfg("algorithm.name=fedavg", "train.local_steps=3", rounds=1)
    sim = Simulation(cfg, tmp_path / "x", progress=False)
    metrics = sim.run_round(1)
    assert all(m["steps"] == 3 for m in metrics.values())
    cfg = make_cfg("algorithm.name=fedavg", "train.local_epochs=2", rounds=1)
    sim = Simulation(cfg, tmp_path / "y", progress=False)
    metrics = sim.run_round(1)
    # 60 examples, batch 16: 4 batches per epoch (the last one has 12)
    assert all(m["steps"] == 8 for m in metrics.values())


def test_resume_without_checkpoint_starts_again_with_the_same_numbers(make_cfg, tmp_path):
    """A run killed before its first checkpoint has nothing to continue from: --resume starts
    it again from its saved config and ends with the uninterrupted run's numbers."""
    cfg = make_cfg("algorithm.name=fedavg", "checkpoint.every=0", "checkpoint.minutes=0", rounds=3)
    assert_same_run(cfg, tmp_path, stop_after=1, checkpointed=False)


def test_checkpoint_holds_all_state(make_cfg, tmp_path):
    cfg = make_cfg(
        "algorithm.name=scaffold", "train.optimizer_state=persist", "train.momentum=0.9", rounds=2
    )
    run_experiment(cfg, run_dir=tmp_path / "c", progress=False)
    ck = read_checkpoint(tmp_path / "c/checkpoint.pt")
    assert ck["round"] == 2
    assert {"weights", "control"} <= set(ck["server"])
    state = ck["clients"]["client0"]
    assert {"control", "optimizer", "local"} <= set(state)
    assert {"torch", "numpy", "python"} <= set(ck["rng"])


def test_select_round_picks_best_validation_even_when_test_disagrees():
    from fedshift.eval.summary import select_round

    def row(rnd, client, val, test):
        return {"round": rnd, "client": client, "global": {"val_acc": val, "test_acc": test}}

    records = [
        row(1, "a", 0.50, 0.90),
        row(1, "b", 0.50, 0.90),  # best test, worse validation
        row(2, "a", 0.80, 0.60),
        row(2, "b", 0.70, 0.70),  # best validation
        row(3, "a", 0.75, 0.80),
        row(3, "b", 0.75, 0.80),  # ties round 2 on validation
    ]
    sel = select_round(records, "global")
    assert sel["best"]["round"] == 2  # 0.75 mean validation; earliest of the tie
    assert sel["best"]["test_mean"] == pytest.approx(0.65)
    assert sel["best"]["test_per_client"] == {"a": 0.60, "b": 0.70}
    assert sel["final"]["round"] == 3
