"""FedRDN's Table 1 composes FedRDN (and the +norm / +FedMix flows) with eight algorithms:
every combination runs one round, or fails at config time saying why."""

from __future__ import annotations

import pytest

from fedshift.core.errors import ConfigError
from fedshift.runtime.simulation import run_experiment

TABLE1_ALGORITHMS = [
    "fedavg",
    "fedprox",
    "fednova",
    "scaffold",
    "fedavgm",
    "fedbn",
    "fedproto",
    "fedfa",
]


@pytest.mark.parametrize("algo", TABLE1_ALGORITHMS)
def test_fedrdn_on_every_table1_algorithm(make_cfg, tmp_path, algo):
    s = run_experiment(
        make_cfg(f"algorithm.name={algo}", "augment=[fedrdn]", rounds=1),
        run_dir=tmp_path / "r",
        progress=False,
    ).summary
    assert s["bytes_by_record"]["up"]["fedrdn_stats"] == 2 * 3 * 4 * 3  # 2C floats, 3 clients
    assert 0.0 <= s["test_mean"] <= 1.0


@pytest.mark.parametrize("flow", ["norm", "fedmix"])
@pytest.mark.parametrize("algo", ["fedavg", "fedprox", "fedbn", "fedfa"])
def test_table1_flows(make_cfg, tmp_path, algo, flow):
    s = run_experiment(
        make_cfg(f"algorithm.name={algo}", f"augment=[{flow}]", rounds=1),
        run_dir=tmp_path / "r",
        progress=False,
    ).summary
    assert [a["name"] for a in s["augment"]][-1] == flow


def test_fedfa_with_fedrdn_exchanges_both(make_cfg, tmp_path):
    s = run_experiment(
        make_cfg("algorithm.name=fedfa", "augment=[fedrdn]", rounds=1),
        run_dir=tmp_path / "r",
        progress=False,
    ).summary
    assert {"fedrdn_stats", "ffa_stats", "weights"} <= set(s["bytes_by_record"]["up"])


def test_presets_by_name(make_cfg):
    assert [a.name for a in make_cfg("algorithm.name=fedrdn").augment] == ["fedrdn"]
    assert [a.name for a in make_cfg("algorithm.name=fedfa").augment] == ["ffa"]
    assert [a.name for a in make_cfg("algorithm.name=harmofl").augment] == ["ampnorm"]
    # listing the implied augment sets its parameters instead of adding a second one
    cfg = make_cfg("algorithm.name=fedfa", "augment=[{name: ffa, variant: fedfa-r}]")
    assert [(a.name, a.params.variant) for a in cfg.augment] == [("ffa", "fedfa-r")]


def test_fedproto_with_label_mixing_is_rejected(make_cfg):
    with pytest.raises(ConfigError, match="fedproto"):
        make_cfg("algorithm.name=fedproto", "augment=[fedmix]")
