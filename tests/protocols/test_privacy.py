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
from fedshift.core.errors import ConfigError
from fedshift.protocols.privacy import METHODS, privacy


def _images(n: int = 12, seed: int = 0) -> torch.Tensor:
    return torch.rand(n, 3, 8, 8, generator=torch.Generator().manual_seed(seed))


def test_fedrdn_record_is_the_mean_of_the_attacked_features():
    """What the membership test models as a mean of per-image features is what FedRDN's own
    code sends (Eq. 5-6): mean over the site, then std, per channel."""
    x = _images()
    mean, std = channel_statistics(x)
    feats = METHODS["fedrdn"].features(x).mean(0)
    assert torch.allclose(feats.float(), torch.cat([mean, std]), atol=1e-6)


def test_harmofl_record_of_one_batch_is_the_mean_of_the_attacked_features():
    """HarmoFL's record from one mini-batch (first-batch start) is the plain mean of the
    images' amplitudes; with more batches it is a decayed mean of them (the protocol's
    number is then a lower bound)."""
    x = _images()
    feats = METHODS["harmofl"].features(x).mean(0).view(3, 8, 8)
    assert torch.allclose(feats.float(), batch_amplitude(x), rtol=1e-5, atol=1e-5)


def test_fedmix_record_is_a_group_mean_of_images():
    x = _images(10)
    y = torch.zeros(10, dtype=torch.long)
    g = torch.Generator().manual_seed(0)
    xbar, _ = group_means(x, y, METHODS["fedmix"].group, 2, g)
    order = torch.randperm(10, generator=torch.Generator().manual_seed(0))
    first = METHODS["fedmix"].features(x[order[:5]]).mean(0).view(3, 8, 8)
    assert torch.allclose(first.float(), xbar[0], atol=1e-6)


def test_privacy_protocol_writes_its_table_numbers_and_figures(tmp_path):
    cfg = toy_cfg()
    res = privacy(cfg, ["fedrdn", "harmofl", "elcfs", "fedmix"], [2, 4], [0, 1], 4, tmp_path)
    for key in ("md", "json", "png", "reconstructions"):
        assert res.files[key].is_file()
    data = json.loads(res.files["json"].read_text())
    rdn = data["results"]["fedrdn"]
    assert len(rdn["membership AUC, n=2"]) == 2  # one value per seed
    assert all(0 <= v <= 1 for v in rdn["membership AUC, n=4"])
    assert "SSIM, phase retrieval" in data["results"]["elcfs"]
    assert "membership AUC, n=5" in data["results"]["fedmix"]
    assert "**harmofl** (amplitude)" in res.text


def test_privacy_protocol_refuses_what_it_cannot_attack(tmp_path):
    cfg = toy_cfg()
    with pytest.raises(ConfigError, match="no attack for fedavg.*share weights only"):
        privacy(cfg, ["fedavg"], [2], [0], 2, tmp_path)
    with pytest.raises(ConfigError, match="give smaller --sizes"):
        privacy(cfg, ["fedrdn"], [100000], [0], 2, tmp_path)
