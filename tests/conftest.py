"""Shared fixtures: tiny configs on the synthetic ``toyshift`` data (milliseconds per round)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from fedshift.catalog import resolve
from fedshift.core.config import load_config

torch.set_num_threads(1)


def toy_cfg(*overrides: str, rounds: int = 3):
    base = [
        "dataset.name=toyshift",
        "model.name=lenet5",
        f"train.rounds={rounds}",
        "train.batch_size=16",
        "name=test",
    ]
    return resolve(load_config(None, [*base, *overrides]))


@pytest.fixture
def make_cfg():
    return toy_cfg


#: the summary keys that must not differ between two runs that should be the same run
#: (resumed vs uninterrupted, extended vs longer, Flower vs native)
RESULT_KEYS = (
    "best_round",
    "val_mean",
    "test_mean",
    "test_per_client",
    "val_per_client",
    "final_test_mean",
    "models",
    "metrics",
    "bytes_up",
    "bytes_down",
    "bytes_by_record",
    "bytes_setup",
    "rounds",
)


def results_of(summary: dict) -> dict:
    """The parts of a summary that are results (no wall time, no run directory)."""
    return {k: summary.get(k) for k in RESULT_KEYS}


def metric_rows(run_dir: Path) -> list[dict]:
    """A run's ``metrics.jsonl`` rows."""
    return [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture
def one_thread():
    """One torch thread for the test, whatever ran before: runs compared bit for bit must use
    the same thread count (float reductions split differently otherwise)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
