"""Shared fixtures: tiny configs on the synthetic ``toyshift`` data (milliseconds per round)."""

from __future__ import annotations

import pytest
import torch

from fedshift.config import load_config, resolve

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
