"""The attacks of issue 51, each on a case where the answer is known: a site of one image is
reconstructed from its amplitude, a mean over one example gives membership AUC 1, a property
written into the statistic is read back; and what must not succeed does not."""

from __future__ import annotations

import pytest
import torch

from fedshift.attacks.membership import llr, membership_by_size
from fedshift.attacks.scores import nearest_image, roc_score
from fedshift.attacks.site_property import probe_accuracy
from fedshift.attacks.spectra import align, amplitude, invert_amplitude, phase_retrieval


def _object(seed: int, size: int = 8) -> torch.Tensor:
    """A smooth image of ``size`` x ``size`` in [0, 1]."""
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(1, 1, size + 2, size + 2, generator=g)
    return torch.nn.functional.avg_pool2d(x, 3, 1)[0, 0]


def _framed(obj: torch.Tensor, frame: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """``obj`` in the middle of a zero frame, and its support."""
    s, o = obj.shape[0], (frame - obj.shape[0]) // 2
    img = torch.zeros(frame, frame)
    img[o : o + s, o : o + s] = obj
    support = torch.zeros(frame, frame, dtype=torch.bool)
    support[o : o + s, o : o + s] = True
    return img, support


@pytest.mark.parametrize("attack", [phase_retrieval, invert_amplitude])
def test_a_site_of_one_image_is_reconstructed_from_its_amplitude(attack):
    img, support = _framed(_object(0))
    others = torch.stack([_framed(_object(s))[0] for s in (1, 2, 3)])
    images = torch.cat([others[:1], img[None], others[1:]])
    recon = attack(amplitude(img), support)
    match = nearest_image(recon, images, ambiguous=True)
    assert match.index == 1 and match.ssim > 0.95, match
    # unaligned, the same reconstruction may sit anywhere the amplitude allows: never better
    assert nearest_image(recon, images).ssim <= match.ssim + 1e-6


def test_align_undoes_a_shift_and_the_point_reflection():
    img = _object(4, 12)
    moved = torch.roll(torch.flip(img, (0, 1)), shifts=(3, 5), dims=(0, 1))
    assert torch.equal(amplitude(moved).round(decimals=6), amplitude(img).round(decimals=6))
    assert torch.allclose(align(moved, img), img)


def test_membership_of_a_one_example_mean_is_certain_and_fades_with_site_size():
    g = torch.Generator().manual_seed(0)
    feats = torch.randn(4000, 6, generator=g) * torch.tensor([1, 2, 3, 1, 2, 3.0]) + 5
    res = membership_by_size(feats, [1, 10, 500], trials=40, seed=1)
    one, ten, many = (r.roc for r in res)
    assert one.auc == 1.0 and one.tpr == 1.0
    assert 0.5 < ten.auc < 1.0
    assert many.auc < ten.auc and abs(many.auc - 0.5) < 0.1
    assert (one.positives, one.negatives) == (40, 40)


def test_llr_ranks_the_member_above_a_stranger():
    mu, var = torch.zeros(3), torch.ones(3)
    site = torch.tensor([[3.0, -2.0, 1.0], [0.5, 0.5, 0.5]])
    stranger = torch.tensor([[-3.0, 2.0, -1.0]])
    stat = site.mean(0)
    assert llr(stat, site[:1], mu, var, 2) > llr(stat, stranger, mu, var, 2)


def test_roc_score_known_cases():
    perfect = roc_score(torch.tensor([2.0, 3.0]), torch.tensor([0.0, 1.0]))
    assert (perfect.auc, perfect.tpr) == (1.0, 1.0)
    swapped = roc_score(torch.tensor([0.0, 1.0]), torch.tensor([2.0, 3.0]))
    assert (swapped.auc, swapped.tpr) == (0.0, 0.0)


def test_a_property_written_into_the_statistic_is_read_back_and_noise_is_not():
    g = torch.Generator().manual_seed(0)
    labels = ["a", "b", "c"] * 6
    centre = {"a": 0.0, "b": 3.0, "c": 6.0}
    stats = torch.stack([torch.randn(5, generator=g) * 0.3 + centre[v] for v in labels])
    hit = probe_accuracy(stats, labels)
    assert hit.accuracy == 1.0 and hit.chance == pytest.approx(1 / 3)
    noise = probe_accuracy(torch.randn(18, 5, generator=g), labels)
    assert noise.accuracy < 0.8


def test_per_class_means_leak_membership_per_class():
    """Prototypes: one mean per class. Classes of one example each give AUC 1 (each class's
    record is its example); ungrouped, the same site's single mean leaks less."""
    g = torch.Generator().manual_seed(0)
    labels = torch.arange(4000) % 8
    feats = torch.randn(4000, 5, generator=g) + labels[:, None].double()
    grouped = membership_by_size(feats, [8, 80], trials=30, seed=2, labels=labels)
    plain = membership_by_size(feats, [8, 80], trials=30, seed=2)
    assert grouped[0].roc.auc > plain[0].roc.auc
    assert grouped[1].roc.auc > plain[1].roc.auc


def test_an_invertible_representation_gives_back_its_image():
    """Features that keep the image (a fixed random orthogonal map of its pixels) are
    inverted to the image; a representation of 4 numbers is not."""
    from fedshift.attacks.inversion import invert_features

    img = torch.stack([_object(s) for s in range(2)])[:, None]  # (2, 1, 8, 8)
    q, _ = torch.linalg.qr(torch.randn(64, 64, generator=torch.Generator().manual_seed(0)))

    def keep(x: torch.Tensor) -> torch.Tensor:
        return x.flatten(1) @ q

    rec = invert_features(keep, keep(img), (1, 8, 8), steps=400, tv=0.0)
    assert nearest_image(rec[0, 0], img[:, 0]).ssim > 0.95

    def pool(x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.adaptive_avg_pool2d(x, 2).flatten(1)

    lossy = invert_features(pool, pool(img), (1, 8, 8), steps=400, tv=0.0)
    assert nearest_image(lossy[0, 0], img[:, 0]).ssim < 0.9


def test_tracing_separates_members_of_small_sites_and_fades():
    from fedshift.attacks.membership import tracing

    g = torch.Generator().manual_seed(3)
    ref = torch.randn(2000, 50, generator=g)
    mu, var = ref.mean(0), ref.var(0)
    aucs = []
    for n in (1, 10, 400):
        site, others = torch.randn(n, 50, generator=g), torch.randn(400, 50, generator=g)
        stat = site.mean(0)
        aucs.append(roc_score(tracing(stat, site, mu, var), tracing(stat, others, mu, var)).auc)
    assert aucs[0] > 0.99 and aucs[0] >= aucs[1] > aucs[2]
    assert abs(aucs[2] - 0.5) < 0.1
