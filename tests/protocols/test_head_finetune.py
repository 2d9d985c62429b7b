"""FRAug Sec. 3.2 / Table 1: train on a data fraction, then only the prediction head on the
embeddings of all the client's training data; the extractor must stay fixed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from fedshift.core.errors import ConfigError
from fedshift.protocols import SuiteOptions, load_run
from fedshift.protocols.head_finetune import finetune_head, head_finetune, head_table


def write_config(path: Path, **extra) -> Path:
    base = {
        "name": "hf",
        "dataset": {"name": "toyshift", "train_size": 40},
        "model": {"name": "lenet5"},
        "algorithm": {"name": "local"},
        "federation": {"data_fraction": 0.25},
        "train": {"rounds": 2, "batch_size": 8},
        "sweep": {"seed": [0, 1]},
    }
    path.write_text(yaml.safe_dump({**base, **extra}))
    return path


def test_head_finetune_runs_table_and_only_the_head_moves(tmp_path):
    cfg = write_config(tmp_path / "c.yaml")
    opts = SuiteOptions(cfg, (), 1, 1, tmp_path / "o", str(tmp_path / "r"), progress=False)
    res = head_finetune(opts, epochs=3)
    runs = res.data["runs"]
    assert len(runs) == 2
    for per_client in runs.values():
        assert list(per_client) == ["client0", "client1", "client2"]
        for c in per_client.values():
            assert 0 <= c["before"] <= 1 and 0 <= c["after"] <= 1
            assert c["train"] < c["train_full"] == 40  # the fraction, then all of it
            assert len(c["head_loss"]) == 3
    assert "w/o finetune" in res.text and "w. finetune" in res.text and "gain" in res.text
    assert res.files["md"].is_file() and json.loads(res.files["json"].read_text())["epochs"] == 3

    # the extractor is frozen: only classifier tensors change, and the run is unchanged
    run_dir = next(iter(runs))
    sim = load_run(run_dir)
    sim.model.load_state_dict(sim.weights_for("client0"))
    before = {k: v.clone() for k, v in sim.model.state_dict().items()}
    c0 = sim.fed.client("client0")
    finetune_head(sim, "client0", c0.train.x, c0.train.y, epochs=2, seed=0)
    after = sim.model.state_dict()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all(k.startswith("classifier.") for k in changed)


def test_head_table_by_hand():
    runs = {
        "a": {"x": {"before": 0.5, "after": 0.7, "train": 1, "train_full": 10}},
        "b": {"x": {"before": 0.4, "after": 0.8, "train": 1, "train_full": 10}},
    }
    text, data = head_table(runs, 5)
    assert "45.00 ± 7.07" in text and "75.00 ± 7.07" in text and "30.00 ± 14.14" in text
    assert data["paired_p"] is not None and "x 1/10" in text


def test_head_finetune_needs_a_fraction(tmp_path):
    cfg = write_config(tmp_path / "c.yaml", federation={"data_fraction": 1.0})
    with pytest.raises(ConfigError, match="data_fraction"):
        head_finetune(
            SuiteOptions(cfg, out=tmp_path / "o", runs_out=str(tmp_path / "r"), progress=False)
        )
