"""``fedshift data check``: the shift scores follow how a federation was built.

Each test builds sites that differ along one axis only (intensity, amplitude spectrum, label
mix, or the brain-mri scanner model with one parameter varied) and checks the dominant axis
and the order of the sites against the construction; the numbers compared are computed in
the test, never recorded.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fedshift.cli import main
from fedshift.core.errors import ConfigError, DataError
from fedshift.core.federation import ClientData, Federation, Split
from fedshift.data.partition import degree_of_heterogeneity
from fedshift.models import build_model
from fedshift.shift.measure import (
    FeatureProbe,
    Moments,
    amplitude_profile,
    label_descriptor,
    measure,
    ring_index,
    separation,
    spectral_centroid,
)
from fedshift.shift.report import recommend

SIDE = 28
CLASSES = 4


def protos(classes: int = CLASSES) -> torch.Tensor:
    """Smooth random class patterns in [0.25, 0.75] (no clipping under the shifts below)."""
    g = torch.Generator().manual_seed(9)
    low = torch.rand(classes, 3, 6, 6, generator=g)
    return 0.25 + 0.5 * F.interpolate(low, size=SIDE, mode="bilinear", align_corners=False)


def images(y: torch.Tensor, g: torch.Generator, patterns: torch.Tensor) -> torch.Tensor:
    """The class patterns of ``y`` plus smooth per-image noise."""
    noise = F.interpolate(torch.randn(len(y), 3, 14, 14, generator=g), size=SIDE, mode="bilinear")
    return (patterns[y] + 0.03 * noise).clamp(0, 1)


def federation(xs: list[torch.Tensor], ys: list[torch.Tensor], classes: int = CLASSES):
    clients = [
        ClientData(f"s{k}", Split(x, y), Split(x[:4], y[:4]), Split(x[:4], y[:4]))
        for k, (x, y) in enumerate(zip(xs, ys, strict=True))
    ]
    return Federation("synthetic", clients, [str(c) for c in range(classes)], (3, SIDE, SIDE))


def same_content(sites: int = 3, n: int = 120, seed: int = 0):
    """``sites`` sites drawn from one distribution (balanced labels)."""
    g = torch.Generator().manual_seed(seed)
    p = protos()
    ys = [torch.arange(n) % CLASSES for _ in range(sites)]
    return [images(y, g, p) for y in ys], ys


@pytest.fixture(scope="module")
def probe() -> FeatureProbe:
    torch.manual_seed(0)
    return FeatureProbe(build_model({"name": "cnn"}, CLASSES, (3, SIDE, SIDE)))


def blur(x: torch.Tensor, sigma: float) -> torch.Tensor:
    """Separable Gaussian blur (reflect padding)."""
    if sigma == 0:
        return x
    r = int(3 * sigma) + 1
    t = torch.arange(-r, r + 1, dtype=x.dtype)
    k = torch.exp(-(t**2) / (2 * sigma**2))
    k = (k / k.sum()).repeat(3, 1, 1, 1)
    x = F.conv2d(F.pad(x, (r, r, 0, 0), mode="reflect"), k.view(3, 1, 1, -1), groups=3)
    return F.conv2d(F.pad(x, (0, 0, r, r), mode="reflect"), k.view(3, 1, -1, 1), groups=3)


def restandardise(x: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``x`` with each image's per-channel mean and std set to those of ``like``."""
    mx, sx = x.mean((2, 3), keepdim=True), x.std((2, 3), keepdim=True, correction=0)
    ml, sl = like.mean((2, 3), keepdim=True), like.std((2, 3), keepdim=True, correction=0)
    return (x - mx) / sx * sl + ml


# ------------------------------------------------------------------------------ the score


def test_separation_is_eta_squared_by_hand():
    means = torch.tensor([[0.0, 1.0], [2.0, 1.0]], dtype=torch.float64)
    var = torch.tensor([[1.0, 4.0], [3.0, 4.0]], dtype=torch.float64)
    shift = separation(means, var)
    b, w = 1.0, 2.0  # dimension 0: between ((0-1)^2 + (2-1)^2) / 2, within (1 + 3) / 2
    assert shift.eta2[0] == pytest.approx(b / (b + w))
    assert shift.eta2[1] == 0.0
    assert shift.score == pytest.approx((b / (b + w) + 0.0) / 2)
    assert shift.pairwise[0][1] == pytest.approx(((2.0**2 / (b + w) + 0.0) / 2) ** 0.5)
    # with counts, the spread sampling alone gives site means is taken off B
    n = torch.tensor([10, 10])
    noisy = separation(means, var, n)
    expected = max(0.0, b - (2 - 1) / 2**2 * (1.0 / 10 + 3.0 / 10))
    assert noisy.eta2[0] == pytest.approx(expected / (b + w))


def test_streamed_moments_equal_the_whole_batch():
    x = torch.randn(50, 6, dtype=torch.float64)
    m = Moments()
    for part in torch.split(x, 7):
        m.add(part)
    assert m.n == 50
    assert torch.allclose(m.mean, x.mean(0))
    assert torch.allclose(m.var, x.var(0, correction=0))


def test_batch_size_and_the_cap(probe):
    xs, ys = same_content()
    xs[1] = (xs[1] * 0.8 + 0.1).clamp(0, 1)
    fed = federation(xs, ys)
    a = measure(fed, probe, batch_size=64)
    b = measure(fed, probe, batch_size=25)
    for axis in a.axes:
        assert a.axes[axis].score == pytest.approx(b.axes[axis].score, rel=1e-5, abs=1e-9)
    capped = measure(fed, None, max_per_site=50, seed=3)
    again = measure(fed, None, max_per_site=50, seed=3)
    other = measure(fed, None, max_per_site=50, seed=4)
    assert [s.sampled for s in capped.sites] == [50, 50, 50]
    assert capped.axes["intensity"].score == again.axes["intensity"].score
    assert capped.axes["intensity"].score != other.axes["intensity"].score
    every = measure(fed, None, split="all")
    assert [s.sampled for s in every.sites] == [sum(s.counts.values()) for s in every.sites]


# ------------------------------------------------------------------------------ one axis each


def test_identical_sites_score_about_zero(probe):
    m = measure(federation(*same_content()), probe)
    assert max(a.score for a in m.axes.values()) < 0.03
    assert recommend(m)["dominant"] is None


def test_one_site_has_nothing_to_compare():
    xs, ys = same_content(sites=1, n=8)
    m = measure(federation(xs, ys), None)
    assert all(a.score == 0.0 for a in m.axes.values())
    rec = recommend(m)
    assert rec["dominant"] is None and "nothing to compare" in rec["text"]


def test_intensity_only_shift_is_dominant_and_orders_the_sites(probe):
    xs, ys = same_content()
    # (gain about 0.5, offset): s0 unchanged, s2 changed the most
    params = [(1.0, 0.0), (0.8, 0.05), (1.25, -0.06)]
    shifted = [((x - 0.5) * a + 0.5 + b).clamp(0, 1) for x, (a, b) in zip(xs, params, strict=True)]
    m = measure(federation(shifted, ys), probe)
    scores = {a: s.score for a, s in m.axes.items()}
    assert max(scores, key=scores.get) == "intensity"
    assert scores["amplitude"] < 0.03 and scores["labels"] == 0.0
    assert m.axes["intensity"].order(m.site_names)[0] == "s2"
    # the measured std follows the gains, the measured mean the offsets' order
    std = [s.channel_std[0] for s in m.sites]
    assert sorted(range(3), key=lambda k: std[k]) == sorted(range(3), key=lambda k: params[k][0])
    rec = recommend(m)
    assert rec["dominant"] == "intensity" and "FedRDN" in rec["methods"]
    assert f"{scores['intensity']:.3f}" in rec["text"]
    # twice the shift scores higher
    double = [
        ((x - 0.5) * (1 + 2 * (a - 1)) + 0.5 + 2 * b).clamp(0, 1)
        for x, (a, b) in zip(xs, params, strict=True)
    ]
    assert measure(federation(double, ys), probe).axes["intensity"].score > scores["intensity"]


def test_amplitude_only_shift_is_dominant_and_orders_the_sites(probe):
    xs, ys = same_content()
    sigmas = [0.0, 1.0, 2.0]
    blurred = [restandardise(blur(x, s), x) for x, s in zip(xs, sigmas, strict=True)]
    assert all(float(x.min()) >= 0 and float(x.max()) <= 1 for x in blurred)
    m = measure(federation(blurred, ys), probe)
    scores = {a: s.score for a, s in m.axes.items()}
    assert max(scores, key=scores.get) == "amplitude"
    assert scores["intensity"] < 0.01  # each image keeps its channel means and stds
    centroid = [spectral_centroid(s.profile, m.ring_frequencies) for s in m.sites]
    assert centroid[0] > centroid[1] > centroid[2]  # more blur, lower frequencies
    rec = recommend(m)
    assert rec["dominant"] == "amplitude" and "HarmoFL" in rec["methods"]


def test_amplitude_profile_ignores_brightness_and_contrast():
    x = protos()
    rings = ring_index(SIDE, SIDE)
    a = amplitude_profile(x, rings)
    b = amplitude_profile(0.5 * x + 0.2, rings)
    assert torch.allclose(a, b, atol=1e-9)


def test_label_only_shift_is_dominant_and_dh_is_distrans_eq_3_4(probe):
    # the classes are circular shifts of one pattern: equal intensity statistics and equal
    # amplitude spectra, so only the label mix tells the sites apart
    base = protos(1)[0]
    patterns = torch.stack([torch.roll(base, shifts=7 * c, dims=-1) for c in range(CLASSES)])
    g = torch.Generator().manual_seed(1)
    n = 120

    def sites(mixes: list[list[int]]) -> Federation:
        ys = [torch.tensor(mix).repeat(n // len(mix)) for mix in mixes]
        return federation([images(y, g, patterns) for y in ys], ys)

    mild = measure(sites([[0, 1, 2, 3], [0, 1, 2, 2], [1, 2, 3, 3]]), probe)
    strong = measure(sites([[0, 1], [1, 2], [2, 3]]), probe)
    disjoint = measure(sites([[0], [1], [2, 3]]), probe)
    scores = {a: s.score for a, s in disjoint.axes.items()}
    assert max(scores, key=scores.get) == "labels"
    assert scores["intensity"] < 0.05 and scores["amplitude"] < 0.05
    labels = [m.axes["labels"].score for m in (mild, strong, disjoint)]
    assert labels[0] < labels[1] < labels[2]
    counts = torch.tensor([[f * s.counts["train"] for f in s.class_fractions] for s in mild.sites])
    assert mild.dh == degree_of_heterogeneity(counts.round())
    assert disjoint.dh == 100.0
    rec = recommend(disjoint)
    assert rec["dominant"] == "labels" and "DisTrans" in rec["methods"]
    assert "DH = 100.0 %" in rec["text"]


def test_segmentation_labels_are_pixel_fractions():
    y = torch.randint(0, 3, (5, 8, 8), generator=torch.Generator().manual_seed(0))
    d = label_descriptor(y, 3)
    for i in range(5):
        assert torch.equal(d[i], torch.bincount(y[i].flatten(), minlength=3).double() / 64)
    assert torch.equal(label_descriptor(torch.tensor([2, 0]), 3)[0], torch.tensor([0.0, 0, 1]))


# ------------------------------------------------------------------------------ brain-mri


def scanner_sites(rows: list, n: int = 20) -> Federation:
    """One smooth random 32^3 volume imaged by each scanner of ``rows`` (the brain-mri
    acquisition model), sliced along its first axis into 3-channel images."""
    from fedshift.data.medical.brain_mri.scanner import apply_scanner, noise_rng

    g = torch.Generator().manual_seed(0)
    vol = F.interpolate(torch.rand(1, 1, 8, 8, 8, generator=g), size=SIDE, mode="trilinear")
    vol = vol[0, 0].numpy().astype(np.float32)
    y = torch.from_numpy(vol[1 : n + 1] > 0.5).long()  # labels never see the scanner
    xs, ys = [], []
    for k, row in enumerate(rows):
        v = torch.from_numpy(apply_scanner(vol, row, noise_rng(0, k)))
        xs.append(torch.stack([v[i - 1 : i + 2] for i in range(1, n + 1)]))
        ys.append(y)
    clients = [
        ClientData(f"site{k + 1}", Split(x, y), Split(x[:2], y[:2]), Split(x[:2], y[:2]))
        for k, (x, y) in enumerate(zip(xs, ys, strict=True))
    ]
    return Federation("brain-like", clients, ["bg", "fg"], (3, SIDE, SIDE), task="segmentation")


def test_brain_mri_scanner_contrast_and_noise_order_the_sites(probe):
    from fedshift.data.medical.brain_mri.scanner import SCANNERS, Scanner

    identity = Scanner(1.0, 0.0, 1, 0.0, "-", 1.0, 0.0, 1.0, 0.0)
    contrasts = [row.contrast for row in SCANNERS]  # the table's display contrasts
    fed = scanner_sites([Scanner(**{**identity.__dict__, "contrast": c}) for c in contrasts])
    m = measure(fed, None)
    std = [s.channel_std[1] for s in m.sites]
    by_std = sorted(range(len(std)), key=lambda k: (std[k], k))
    by_contrast = sorted(range(len(contrasts)), key=lambda k: (contrasts[k], k))
    assert by_std == by_contrast
    scores = {a: s.score for a, s in m.axes.items()}
    assert max(scores, key=scores.get) == "intensity"
    noises = [row.noise for row in SCANNERS]  # the table's Rician noise levels
    fed = scanner_sites([Scanner(**{**identity.__dict__, "noise": s}) for s in noises])
    m = measure(fed, None)
    centroid = [spectral_centroid(s.profile, m.ring_frequencies) for s in m.sites]
    assert sorted(range(6), key=lambda k: centroid[k]) == sorted(range(6), key=lambda k: noises[k])


# ------------------------------------------------------------------------------ validation


def test_pixels_out_of_range_name_the_site_and_split(probe):
    xs, ys = same_content(sites=2, n=8)
    xs[1] = xs[1] * 300
    with pytest.raises(DataError, match=r"site 's1', train split.*\[0, 1\]"):
        measure(federation(xs, ys), probe)


def test_a_model_that_skips_its_stage_hooks_is_named(probe):
    class Skips(type(probe.model)):
        def features(self, x: torch.Tensor) -> torch.Tensor:
            for stage in self.stages.values():
                x = stage(x)
            return x

    torch.manual_seed(0)
    with pytest.raises(ConfigError, match=r"did not run the stage hooks of \['conv1', 'conv2'\]"):
        FeatureProbe(Skips())(torch.rand(2, 3, SIDE, SIDE))


def test_feature_probe_leaves_the_model_as_it_was(probe):
    before = dict(probe.model.stage_hooks)
    out = probe(torch.rand(2, 3, SIDE, SIDE))
    assert list(out) == probe.layers
    assert probe.model.stage_hooks == before
    assert not probe.model.training


# ------------------------------------------------------------------------------ the command


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FEDSHIFT_CACHE", str(tmp_path / "cache"))
    return tmp_path


def test_data_check_cli_on_toyshift(in_tmp, capsys):
    assert main(["data", "check", "toyshift", "model.name=lenet5"]) == 0
    out = capsys.readouterr().out
    folder = in_tmp / "data-check" / "toyshift"
    assert "# Shift report: toyshift" in out and "report folder: data-check/toyshift" in out
    for name in (
        "report.md",
        "shift.json",
        "montage.png",
        "intensity.png",
        "amplitude.png",
        "features.png",
        "labels.png",
    ):
        assert (folder / name).stat().st_size > 0, name
    assert not list(folder.glob("*.tmp"))
    data = json.loads((folder / "shift.json").read_text())
    for key in (
        "dataset",
        "task",
        "split",
        "input_shape",
        "classes",
        "config",
        "sites",
        "axes",
        "feature_layers",
        "ring_frequencies",
        "dh",
        "tv_heterogeneity",
        "recommendation",
    ):
        assert key in data, key
    assert set(data["axes"]) == {"intensity", "amplitude", "features", "labels"}
    assert [s["name"] for s in data["sites"]] == ["client0", "client1", "client2"]
    assert data["config"]["model"]["name"] == "lenet5"
    scores = {a: v["score"] for a, v in data["axes"].items()}
    assert data["recommendation"]["dominant"] == max(scores, key=scores.get)
    assert (folder / "report.md").read_text() in out
    # toyshift's noise grows with the client index: so does the spectral centroid
    centroid = [s["spectral_centroid"] for s in data["sites"]]
    assert centroid[0] < centroid[1] < centroid[2]


def test_data_check_takes_a_config_and_model_weights(in_tmp, capsys):
    (in_tmp / "c.yaml").write_text("dataset:\n  name: toyshift\n  train_size: 20\n")
    assert main(["data", "check", "-c", "c.yaml", "--out", "a", "--max-per-site", "10"]) == 0
    torch.manual_seed(5)
    torch.save(build_model({"name": "cnn"}, 10, (3, 28, 28)).state_dict(), in_tmp / "w.pt")
    argv = ["data", "check", "c.yaml", "--out", "b", "--max-per-site", "10"]
    assert main([*argv, "--model-weights", "w.pt"]) == 0
    a = json.loads((in_tmp / "a" / "shift.json").read_text())
    b = json.loads((in_tmp / "b" / "shift.json").read_text())
    assert [s["sampled"] for s in a["sites"]] == [10, 10, 10]
    assert a["axes"]["intensity"] == b["axes"]["intensity"]
    assert a["axes"]["features"]["score"] != b["axes"]["features"]["score"]
    assert b["config"]["model"]["weights"].endswith("w.pt")


def test_data_check_bad_key_is_a_clear_error(in_tmp, capsys):
    assert main(["data", "check", "toyshift", "dataset.train_sise=5"]) == 2
    err = capsys.readouterr().err
    assert "dataset.train_sise" in err and "train_size" in err
    assert not (in_tmp / "data-check").exists()
    assert main(["data", "check", "nothing-like-this"]) == 2
    assert "neither a file nor a config shipped" in capsys.readouterr().err
    assert main(["data", "check", "toyshift", "train_size=5"]) == 2
    assert "write dataset.train_size=5" in capsys.readouterr().err
    assert main(["data", "check", "toyshift", "sweep.dataset.clients=[2,3]"]) == 2
    assert "'sweep.dataset.clients'" in capsys.readouterr().err
    assert main(["data", "build"]) == 2
    assert "takes a dataset name" in capsys.readouterr().err


def test_data_check_resizes_as_a_run_does(in_tmp, capsys):
    """input.size: the features axis's model is built for the resized images and sees them
    resized (efficientnet_lite0 takes at least 32x32; toyshift's images are 28x28)."""
    argv = ["data", "check", "toyshift", "dataset.train_size=8", "--max-per-site", "8",
            "model.name=efficientnet_lite0", "input.mean=[0]", "input.std=[1]"]  # fmt: skip
    assert main(argv) == 2
    assert "input.size=[H, W]" in capsys.readouterr().err
    assert main([*argv, "input.size=[32, 32]"]) == 0
    data = json.loads((in_tmp / "data-check" / "toyshift" / "shift.json").read_text())
    assert data["input_shape"] == [3, 28, 28] and data["axes"]["features"]["score"] is not None
