"""``fedshift protocol privacy``: the attacks read exactly what each method sends, and the
protocol writes its table, numbers and figures (issue 51)."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import toy_cfg

from fedshift.augment.ampnorm import batch_amplitude
from fedshift.augment.fedmix import group_means
from fedshift.augment.fedrdn import channel_statistics
from fedshift.core.errors import ConfigError, FedshiftError
from fedshift.protocols.common import SuiteOptions
from fedshift.protocols.privacy import SURFACES, privacy
from fedshift.runtime.simulation import run_experiment


def _images(n: int = 12, seed: int = 0) -> torch.Tensor:
    return torch.rand(n, 3, 8, 8, generator=torch.Generator().manual_seed(seed))


def test_fedrdn_record_is_the_mean_of_the_attacked_features():
    """What the membership test models as a mean of per-image features is what FedRDN's own
    code sends (Eq. 5-6): mean over the site, then std, per channel."""
    x = _images()
    mean, std = channel_statistics(x)
    feats = SURFACES["fedrdn_stats"].features(x).mean(0)
    assert torch.allclose(feats.float(), torch.cat([mean, std]), atol=1e-6)


def test_harmofl_record_of_one_batch_is_the_mean_of_the_attacked_features():
    """HarmoFL's record from one mini-batch (first-batch start) is the plain mean of the
    images' amplitudes; with more batches it is a decayed mean of them (the protocol's
    number is then a lower bound)."""
    x = _images()
    feats = SURFACES["amplitude"].features(x).mean(0).view(3, 8, 8)
    assert torch.allclose(feats.float(), batch_amplitude(x), rtol=1e-5, atol=1e-5)


def test_fedmix_record_is_a_group_mean_of_images():
    x = _images(10)
    y = torch.zeros(10, dtype=torch.long)
    g = torch.Generator().manual_seed(0)
    xbar, _ = group_means(x, y, SURFACES["fedmix_means"].group, 2, g)
    order = torch.randperm(10, generator=torch.Generator().manual_seed(0))
    first = SURFACES["fedmix_means"].features(x[order[:5]]).mean(0).view(3, 8, 8)
    assert torch.allclose(first.float(), xbar[0], atol=1e-6)


TOY = ["dataset.name=toyshift", "model.name=lenet5", "train.batch_size=16", "train.rounds=2"]


def test_privacy_protocol_over_a_grid_attacks_what_each_method_sends(tmp_path):
    """Three cells (weights only, FedRDN's statistics, FedProto's prototypes) trained and
    attacked; each method's table holds the attacks its records call for."""
    (tmp_path / "grid.yaml").write_text(
        "sweep:\n  cell:\n    - {algorithm.name: fedavg}\n"
        "    - {algorithm.name: fedavg, augment: [fedrdn]}\n    - {algorithm.name: fedproto}\n"
    )
    opts = SuiteOptions(config=tmp_path / "grid.yaml", overrides=tuple(TOY), out=tmp_path / "p",
                        runs_out=str(tmp_path / "runs"), progress=False)  # fmt: skip
    res = privacy(opts, sizes=[2, 4], trials=4)
    for key in ("md", "json", "png"):
        assert res.files[key].is_file()
    assert "reconstructions" not in res.files  # no record of these three is an image
    methods = json.loads(res.files["json"].read_text())["methods"]
    assert set(methods) == {"fedavg", "fedavg +fedrdn", "fedproto"}
    assert methods["fedavg"]["sends"] == ["weights"]
    assert "membership AUC, weights (loss threshold)" in methods["fedavg"]["rows"]
    rdn = methods["fedavg +fedrdn"]["rows"]
    assert {"membership AUC, fedrdn_stats, n=2", "membership AUC, fedrdn_stats, n=4"} <= set(rdn)
    assert all(0 <= v <= 1 for v in rdn["membership AUC, fedrdn_stats, n=4"])
    proto = methods["fedproto"]["rows"]
    assert "membership AUC, prototypes (per class)" in proto
    assert "membership AUC, weights (loss threshold)" not in proto  # it sends no weights
    assert "**fedavg** (sends: weights): weights only, the reference row" in res.text


def test_privacy_protocol_over_run_directories_names_what_it_does_not_attack(tmp_path):
    run = run_experiment(toy_cfg("algorithm.name=scaffold", rounds=2), run_dir=tmp_path / "r",
                         progress=False)  # fmt: skip
    res = privacy(None, [run.run_dir], sizes=[2], trials=2, out=tmp_path / "p")
    data = json.loads(res.files["json"].read_text())["methods"]["scaffold"]
    assert data["not_attacked"] and "weights" not in data["not_attacked"]
    assert "Not attacked: " in res.text


def test_privacy_protocol_refuses_what_it_cannot_do(tmp_path):
    with pytest.raises(FedshiftError, match="give a config"):
        privacy(None, [], sizes=[2])
    with pytest.raises(ConfigError, match="sizes must be >= 1"):
        privacy(None, [tmp_path], sizes=[0])
    with pytest.raises(FedshiftError, match="does not exist"):
        privacy(None, [tmp_path / "nothing"], sizes=[2])


def test_privacy_protocol_reconstructs_from_harmofl_amplitudes(tmp_path):
    run = run_experiment(toy_cfg("algorithm.name=harmofl", rounds=1), run_dir=tmp_path / "h",
                         progress=False)  # fmt: skip
    res = privacy(None, [run.run_dir], sizes=[2, 4], trials=2, out=tmp_path / "p")
    rows = json.loads(res.files["json"].read_text())["methods"]["harmofl"]["rows"]
    assert {"SSIM, phase retrieval, amplitude", "PSNR dB, inversion, amplitude"} <= set(rows)
    assert "membership AUC, amplitude, n=4" in rows
    assert res.files["reconstructions"].is_file()


def test_privacy_protocol_refuses_a_run_of_another_checkpoint_format(tmp_path):
    import struct

    run = run_experiment(toy_cfg("algorithm.name=fedavg", rounds=1), run_dir=tmp_path / "r",
                         progress=False)  # fmt: skip
    for name in ("checkpoint.pt", "selected.pt"):
        path = run.run_dir / name
        if path.is_file():
            data = bytearray(path.read_bytes())
            data[8:12] = struct.pack("<I", 99)
            path.write_bytes(bytes(data))
    with pytest.raises(FedshiftError, match="format 99"):
        privacy(None, [run.run_dir], sizes=[2], trials=2, out=tmp_path / "p")


def test_privacy_protocol_attacks_a_protected_record_as_released(tmp_path):
    """A run protected by privacy.epsilon had its statistics attacked as computed, without
    the run's noise (the unprotected numbers under a protected run's name). Now each record
    is clipped and noised as the run's plan releases it, the noise std is a row, and the run
    is not pooled with unprotected ones."""
    from fedshift.protocols.common import load_run
    from fedshift.protocols.privacy import domain_images, record_attacks

    cfg = toy_cfg("augment=[fedrdn]", "privacy.epsilon=0.1", rounds=1)
    run = run_experiment(cfg, run_dir=tmp_path / "r", progress=False)
    res = privacy(None, [run.run_dir], sizes=[2], trials=40, out=tmp_path / "p")
    data = json.loads(res.files["json"].read_text())
    assert set(data["methods"]) == {"fedavg +fedrdn (privacy.epsilon=0.1)"}
    found = data["runs"][str(run.run_dir)]
    plan = json.loads((run.run_dir / "summary.json").read_text())["privacy"]
    clip = plan["records"]["fedrdn_stats"]["clip"]
    assert found["protected"] == {"fedrdn_stats": {"clip": clip, "sigma": plan["noise_multiplier"]}}
    std = found["rows"]["noise std per value, fedrdn_stats, n=2"]
    assert std == pytest.approx(plan["noise_multiplier"] * 2 * clip / 2, rel=1e-12)
    assert "Attacked as released through privacy.epsilon's noise: fedrdn_stats (clip" in res.text
    # the same record at the same sites without the noise, and chance: at epsilon 0.1 the
    # noise (std ~ clip) drowns sites of 2 images, which give themselves away without it
    images = domain_images(load_run(run.run_dir).fed)
    bare, _ = record_attacks(images, found["site"], "fedrdn_stats", [2], cfg.seed, trials=40)
    auc = found["rows"]["membership AUC, fedrdn_stats, n=2"]
    null_sd = ((80 + 80 + 1) / (12 * 80 * 80)) ** 0.5  # AUC's sd at chance, 80 vs 80 scores
    assert abs(auc - 0.5) < 4 * null_sd < bare["membership AUC, fedrdn_stats, n=2"] - 0.5
