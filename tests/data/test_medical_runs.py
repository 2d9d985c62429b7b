"""End to end on the users'-data loaders: a federated run straight from fixture folders in the
exact on-disk layouts (prostate NIfTI sites -> U-Net + Dice; Camelyon17 WILDS patches ->
DenseNet), as a user would start one."""

from __future__ import annotations

from test_medical_loaders import write_prostate, write_wilds

from fedshift.catalog import resolve
from fedshift.core.config import load_config
from fedshift.runtime.simulation import run_experiment


def test_prostate_folder_to_dice_table(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDSHIFT_CACHE", str(tmp_path / "cache"))
    root = write_prostate(tmp_path / "ProstateMRI")
    cfg = resolve(
        load_config(
            None,
            [
                "dataset.name=prostate",
                f"dataset.root={root}",
                "dataset.size=16",
                "dataset.truncate_train=false",
                "model.name=unet",
                "model.width=4",
                "algorithm.name=harmofl",
                "train.rounds=1",
                "train.batch_size=4",
                "train.optimizer=adam",
                "train.lr=0.0001",
            ],
        )
    )
    s = run_experiment(cfg, run_dir=tmp_path / "run", progress=False).summary
    assert s["clients"] == ["BIDMC", "HK", "I2CVB", "BMC", "RUNMC", "UCL"]
    assert s["metric"] == "dice" and "dice_all" in s["metrics"]


def test_camelyon_wilds_folder_to_densenet_run(tmp_path):
    root = tmp_path / "camelyon17_v1.0"
    root.mkdir()
    write_wilds(root)
    cfg = resolve(
        load_config(
            None,
            [
                "dataset.name=camelyon17",
                f"dataset.root={root}",
                "model.name=densenet121",
                "model.blocks=[1,1,1,1]",
                "model.growth=4",
                "model.init_features=8",
                "algorithm.name=fedbn",
                "train.rounds=1",
                "train.batch_size=4",
            ],
        )
    )
    s = run_experiment(cfg, run_dir=tmp_path / "run", progress=False).summary
    assert s["clients"] == [f"hospital{k}" for k in range(1, 6)]
    assert s["metric"] == "acc" and 0 <= s["test_mean"] <= 1
