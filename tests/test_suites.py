"""Every shipped suite (configs/suites/*.yaml) expands into valid cells, so a typo in a key or
a method name fails here rather than hours into a benchmark; and the real-data suites say how
to point them at the data."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedshift.bench import plan
from fedshift.data import DATASETS

SUITES = sorted((Path(__file__).parents[1] / "configs" / "suites").glob("*.yaml"))


@pytest.mark.parametrize("suite", SUITES, ids=lambda p: p.stem)
def test_suite_plans(suite):
    cells = plan(suite)
    assert cells and len({c.digest for c in cells}) == len(cells)
    names = {c.cfg.dataset.name for c in cells}
    for name in names:
        params = DATASETS.entry(name).params
        if params is not None and "root" in getattr(params, "__dataclass_fields__", {}):
            # a users'-data suite: its header tells how to give the data folder
            assert "dataset.root=" in suite.read_text(), f"{suite.name} must show dataset.root"


def test_every_paper_has_a_suite():
    stems = {p.stem for p in SUITES}
    for required in (
        "fedrdn_table1",
        "fedfa_table1",
        "harmofl_table1",
        "fraug_table2",
        "distrans_table1",
    ):
        assert required in stems
