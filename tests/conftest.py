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
