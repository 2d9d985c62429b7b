"""brain-mri: slicing, labels, sites and splits, simulated scanners, cache, errors.

Most tests run on a generated phantom template (three small NIfTI files whose brain spans a
48-voxel cube, so ``size=48`` compares with native values exactly); one test builds the real
MNI152 template shipped with nilearn at the default parameters.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path

import nibabel
import numpy as np
import pytest
import torch

from fedshift.core.errors import ConfigError, MissingSourceError
from fedshift.data import load_dataset
from fedshift.data.medical import brain_mri as bm
from fedshift.data.medical.brain_mri import (
    SCANNERS,
    BrainMRIParams,
    Scanner,
    apply_scanner,
    build_brain_mri,
    load_brain_mri,
    load_template,
    render_slices,
    scanner_table,
    usable_slices,
)

SIDE = 48  # the phantom's cube side (its brain spans 40 voxels along y, plus 2 x 4 margin)


def write_phantom(folder: Path) -> dict[str, np.ndarray]:
    """An ellipsoidal "brain": white-matter core with a CSF "ventricle", a gray-matter shell
    with partial-volume voxels, a thin CSF rim; T1 varies along z so neighbouring slices
    differ. Files are named like the MNI152 template's."""
    folder.mkdir(parents=True, exist_ok=True)
    shape = (40, 48, 38)
    x, y, z = np.meshgrid(*(np.arange(n, dtype=np.float64) for n in shape), indexing="ij")
    r = np.sqrt(((x - 20) / 17) ** 2 + ((y - 23.5) / 20.2) ** 2 + ((z - 19) / 16) ** 2)
    gm = np.zeros(shape, np.uint8)
    wm = np.zeros(shape, np.uint8)
    t1 = np.zeros(shape, np.uint8)
    wm[(r >= 0.15) & (r < 0.5)] = 255
    gm[(r >= 0.5) & (r < 0.85)] = 255
    band = (r >= 0.45) & (r < 0.55)  # partial volume: mixtures and gm/wm ties
    gm[band] = 110
    wm[band] = np.round(125 + 20 * np.sin(x + y))[band].astype(np.uint8)  # gm + wm <= 255
    gm[(r >= 0.85) & (r < 0.9)] = 120  # background in both label sets
    gm[(r >= 0.9) & (r < 0.93)] = 128  # gray matter; brain
    tie = (r >= 0.93) & (r < 0.96)  # background/gray tie -> background; brain
    gm[tie] = 127
    wm[tie] = 1
    t1[r < 1.0] = 40
    t1[(r >= 0.85) & (r < 0.96)] = 90
    t1[wm > 128] = 200
    t1[gm == 255] = 130
    t1[band] = 165
    vols = {"t1": t1, "gm": gm, "wm": wm}
    for key, vol in vols.items():
        nibabel.save(nibabel.Nifti1Image(vol, np.eye(4)), str(folder / bm.TEMPLATE_FILES[key]))
    return vols


@pytest.fixture(autouse=True)
def _cache_env(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDSHIFT_CACHE", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def phantom(tmp_path_factory) -> tuple[str, dict[str, np.ndarray]]:
    folder = tmp_path_factory.mktemp("phantom")
    return str(folder), write_phantom(folder)


def params(phantom, **kw) -> BrainMRIParams:
    base = {"nifti_dir": phantom[0], "size": 32, "sites": 2, "block": 2, "cache": False}
    return BrainMRIParams(**{**base, **kw})


def all_ids(fed) -> list[tuple[str, str, str]]:
    """(site, split, slice id) of every example."""
    return [
        (site, split, sid)
        for site, splits in fed.info["slices"].items()
        for split, ids in splits.items()
        for sid in ids
    ]


def native_labels(vols, labels: str) -> np.ndarray:
    """The phantom's cube of class indices by the documented argmax rule (ties: lower)."""
    g, w = vols["gm"].astype(np.int32), vols["wm"].astype(np.int32)
    bg = np.clip(255 - g - w, 0, None)
    stack = np.stack([bg, g, w]) if labels == "tissue" else np.stack([bg, g + w])
    return np.argmax(stack, axis=0)


def cube(template, native: np.ndarray) -> np.ndarray:
    """Crop and pad a native array the way the template was."""
    part = native[tuple(slice(a, b) for a, b in template.crop)]
    pad = [((SIDE - n) // 2, SIDE - n - (SIDE - n) // 2) for n in part.shape]
    return np.pad(part, pad)


# ------------------------------------------------------------------------------ real template


def test_real_template_defaults_give_every_site_enough_slices_and_all_classes():
    if importlib.util.find_spec("nilearn") is None:
        pytest.skip("nilearn is not installed")
    p = dataclasses.replace(BrainMRIParams(), size=32, cache=False)  # counts do not depend on size
    fed = build_brain_mri(p)
    assert fed.task == "segmentation" and fed.name == "brain-mri"
    assert fed.classes == ["background", "gray matter", "white matter"]
    assert fed.client_names == [f"site{k}" for k in range(1, 7)]
    assert fed.info["cube_side"] == 192
    assert fed.info["usable_slices"] == {"axial": 136, "coronal": 167}
    assert "real anatomy (MNI152 2009a template), simulated scanners" in fed.info["description"]
    assert set(fed.info["source"]) == {"t1", "gm", "wm"}
    for c in fed.clients:
        n = {s: len(c.split(s)) for s in ("train", "val", "test")}
        assert n["train"] >= 20 and n["val"] >= 5 and n["test"] >= 6, (c.name, n)
        assert set(torch.unique(c.train.y).tolist()) == {0, 1, 2}, c.name
        assert c.train.x.shape[1:] == (3, 32, 32) and c.train.x.dtype == torch.float32


# ------------------------------------------------------------------------------ structure


def test_shapes_dtypes_ranges_and_classes(phantom):
    fed = load_brain_mri(params(phantom))
    assert fed.task == "segmentation"
    assert fed.input_shape == (3, 32, 32) and fed.classes[0] == "background"
    for c in fed.clients:
        for s in ("train", "val", "test"):
            sp = c.split(s)
            assert len(sp) > 0
            assert sp.x.dtype == torch.float32 and sp.x.shape[1:] == (3, 32, 32)
            assert sp.y.dtype == torch.int64 and sp.y.shape[1:] == (32, 32)
            assert float(sp.x.min()) >= 0.0 and float(sp.x.max()) <= 1.0
            assert int(sp.y.min()) >= 0 and int(sp.y.max()) <= 2
        assert set(torch.unique(c.train.y).tolist()) == {0, 1, 2}
    assert fed.info["counts"] == fed.counts()


def test_slices_are_disjoint_across_sites_and_splits_and_cover_every_usable_slice(phantom):
    p = params(phantom, sites=3, orientations=["axial", "coronal", "sagittal"])
    fed = load_brain_mri(p)
    ids = [sid for _, _, sid in all_ids(fed)]
    assert len(ids) == len(set(ids))
    usable = usable_slices(load_template(p.nifti_dir), p)
    expected = {f"{o}:{int(i)}" for o, idx in usable.items() for i in idx}
    assert set(ids) == expected
    assert fed.info["usable_slices"] == {o: len(v) for o, v in usable.items()}


def test_blocks_of_consecutive_slices_stay_together(phantom):
    p = params(phantom, block=3)
    fed = load_brain_mri(p)
    where = {sid: (site, split) for site, split, sid in all_ids(fed)}
    usable = usable_slices(load_template(p.nifti_dir), p)
    places = set()
    for o in p.orientations:
        idx = [f"{o}:{int(i)}" for i in usable[o]]
        for j in range(0, len(idx), 3):
            homes = {where[sid] for sid in idx[j : j + 3]}
            assert len(homes) == 1, idx[j : j + 3]
            places |= homes
    assert {site for site, _ in places} == {"site1", "site2"}
    for site in ("site1", "site2"):  # dealt round-robin: both halves of the range
        for o in p.orientations:
            mine = [int(s.split(":")[1]) for s, (k, _) in where.items() if k == site and o in s]
            mid = (int(usable[o][0]) + int(usable[o][-1])) / 2
            assert min(mine) < mid < max(mine), (site, o)


def test_split_sizes_follow_the_fractions_in_blocks(phantom):
    fed = load_brain_mri(params(phantom, block=1, sites=1))
    n = sum(fed.counts()["site1"].values())
    counts = fed.counts()["site1"]
    assert counts["val"] == int(np.floor(0.16 * n + 0.5))
    assert counts["test"] == int(np.floor(0.20 * n + 0.5))
    assert counts["train"] == n - counts["val"] - counts["test"]


def test_usable_slices_follow_min_foreground_and_need_both_neighbours(phantom):
    p = params(phantom, orientations=["axial"], min_foreground=0.1)
    template = load_template(p.nifti_dir)
    fg = cube(template, native_labels(phantom[1], "tissue")) > 0
    frac = fg.sum(axis=(0, 1)) / SIDE**2  # axial = along z
    expected = [i for i in range(1, SIDE - 1) if frac[i] >= 0.1]
    assert usable_slices(template, p)["axial"].tolist() == expected
    assert 0 < len(expected) < int((frac > 0).sum())
    for t in sorted(set(frac.tolist())):  # exactly at and just above every slice's fraction
        for thr in (t, t + 1e-9):
            if 0 <= thr < 1:
                q = dataclasses.replace(p, min_foreground=thr)
                want = [i for i in range(1, SIDE - 1) if frac[i] >= thr]
                assert usable_slices(template, q)["axial"].tolist() == want, thr
    every = dataclasses.replace(p, min_foreground=0.0)
    assert usable_slices(template, every)["axial"].tolist() == list(range(1, SIDE - 1))


# ------------------------------------------------------------------------------ labels


@pytest.mark.parametrize("labels", ["tissue", "brain"])
def test_labels_at_native_size_are_the_argmax_rule(phantom, labels):
    p = params(phantom, size=SIDE, labels=labels, orientations=["axial"], sites=1)
    fed = load_brain_mri(p)
    assert fed.classes == bm.LABEL_SETS[labels]
    template = load_template(p.nifti_dir)
    lab = cube(template, native_labels(phantom[1], labels))
    c = fed.clients[0]
    for split in ("train", "val", "test"):
        for n, sid in enumerate(fed.info["slices"]["site1"][split]):
            i = int(sid.split(":")[1])
            expected = lab[:, :, i].T[::-1]  # axial display: rows anterior first
            assert np.array_equal(c.split(split).y[n].numpy(), expected), sid


def test_downsampled_labels_average_probabilities_not_nearest(phantom):
    p = params(phantom, size=16, orientations=["axial"], sites=1)
    fed = load_brain_mri(p)
    template = load_template(p.nifti_dir)
    g = cube(template, phantom[1]["gm"]).astype(np.float64) / 255
    w = cube(template, phantom[1]["wm"]).astype(np.float64) / 255
    probs = np.stack([np.clip(1 - g - w, 0, None), g, w])
    sid = fed.info["slices"]["site1"]["train"][0]
    i = int(sid.split(":")[1])
    sl = probs[:, :, :, i].transpose(0, 2, 1)[:, ::-1]  # (C, rows, cols)
    mean = sl.reshape(3, 16, 3, 16, 3).mean(axis=(2, 4))  # 48 -> 16: 3x3 areas
    top2 = np.sort(mean, axis=0)[-2:]
    clear = top2[1] - top2[0] > 1e-4  # leave float32-vs-float64 near-ties out
    got = fed.clients[0].train.y[0].numpy()
    assert clear.mean() > 0.9
    assert np.array_equal(got[clear], mean.argmax(0)[clear])


def test_labels_never_depend_on_the_scanner(phantom):
    ys = []
    for s in (0.0, 0.5, 1.0, 2.0):
        fed = load_brain_mri(params(phantom, scanner_strength=s))
        ys.append([c.split(sp).y for c in fed.clients for sp in ("train", "val", "test")])
    for other in ys[1:]:
        assert all(torch.equal(a, b) for a, b in zip(ys[0], other, strict=True))


# ------------------------------------------------------------------------------ images


def test_channels_are_neighbouring_slices(phantom):
    p = params(phantom, size=SIDE, scanner_strength=1.0)
    fed = load_brain_mri(p)
    found = 0
    for c in fed.clients:
        images = {}
        for split in ("train", "val", "test"):
            for n, sid in enumerate(fed.info["slices"][c.name][split]):
                images[sid] = c.split(split).x[n]
        for sid, x in images.items():
            o, i = sid.split(":")
            nxt = images.get(f"{o}:{int(i) + 1}")
            if nxt is not None:
                found += 1
                assert torch.equal(x[1], nxt[0]) and torch.equal(x[2], nxt[1]), sid
                assert not torch.equal(x[0], x[1])
    assert found > 10


def test_images_at_strength_zero_are_the_windowed_template(phantom):
    p = params(phantom, size=SIDE, scanner_strength=0.0, orientations=["coronal"], sites=1)
    fed = load_brain_mri(p)
    template = load_template(p.nifti_dir)
    t1 = cube(template, phantom[1]["t1"]).astype(np.float32) / 255
    lo, hi = np.percentile(t1[t1 > 0], [1, 99])
    norm = np.clip((t1 - np.float32(lo)) / np.float32(hi - lo), 0, 1)
    sid = fed.info["slices"]["site1"]["train"][0]
    i = int(sid.split(":")[1])
    for ch, j in enumerate((i - 1, i, i + 1)):
        expected = norm[:, j, :].T[::-1]  # coronal display: rows superior first
        np.testing.assert_allclose(fed.clients[0].train.x[0, ch].numpy(), expected, atol=1e-6)


def test_loaded_images_equal_render_slices(phantom):
    p = params(phantom)
    fed = load_brain_mri(p)
    for c in fed.clients:
        ids = fed.info["slices"][c.name]["val"]
        assert torch.equal(render_slices(p, c.name, ids), c.val.x)


def test_strength_zero_gives_identical_sites_and_strength_one_different_ones(phantom):
    ids = [f"axial:{i}" for i in (18, 19, 20)] + ["coronal:24"]
    p0 = params(phantom, sites=6, scanner_strength=0.0)
    p1 = dataclasses.replace(p0, scanner_strength=1.0)
    same = [render_slices(p0, k, ids) for k in range(6)]
    assert all(torch.equal(same[0], x) for x in same[1:])
    diff = [render_slices(p1, k, ids) for k in range(6)]
    for a in range(6):
        for b in range(a + 1, 6):
            assert float((diff[a] - diff[b]).abs().mean()) > 0.01, (a, b)
    half = render_slices(dataclasses.replace(p0, scanner_strength=0.5), 5, ids)
    d_half = float((half - same[0]).abs().mean())
    d_full = float((diff[5] - same[0]).abs().mean())
    assert 0 < d_half < d_full


def test_scaled_scanner_is_identity_at_zero_and_the_row_at_one():
    row = SCANNERS[5]
    assert row.scaled(1.0) == row
    zero = row.scaled(0.0)
    assert (zero.gamma, zero.bias, zero.blur, zero.thickness) == (1.0, 0.0, 0.0, 1.0)
    assert (zero.noise, zero.contrast, zero.brightness) == (0.0, 1.0, 0.0)
    half = row.scaled(0.5)
    assert half.gamma == pytest.approx(1.6**0.5) and half.thickness == pytest.approx(1.5)
    assert half.contrast == pytest.approx(0.9) and half.brightness == pytest.approx(0.04)


def test_apply_scanner_gamma_window_and_display_by_hand():
    v = np.linspace(0, 1, 101, dtype=np.float32).reshape(101, 1, 1)
    s = Scanner(2.0, 0.0, 1, 0.0, "-", 1.0, 0.0, 0.5, 0.1)
    out = apply_scanner(v, s, np.random.default_rng(0))[:, 0, 0]
    sq = v[:, 0, 0].astype(np.float64) ** 2
    lo, hi = np.percentile(sq, [1, 99])
    expected = np.clip(0.5 * np.clip((sq - lo) / (hi - lo), 0, 1) + 0.1, 0, 1)
    np.testing.assert_allclose(out, expected, atol=1e-6)


def test_thick_slices_average_then_interpolate_by_hand():
    v = np.array([0, 0, 6, 6, 12, 12], np.float32).reshape(1, 1, 6)
    out = bm.thick_slices(v, 2, 2.0)[0, 0]
    np.testing.assert_allclose(out, [0, 1.5, 4.5, 7.5, 10.5, 12], atol=1e-6)


def test_bias_field_spans_exp_minus_to_plus_amplitude():
    f = bm.bias_field(12, 0.3, 4)
    assert float(np.abs(np.log(f)).max()) == pytest.approx(0.3, abs=1e-6)
    assert float(f.min()) < 1 < float(f.max())
    assert not np.allclose(f, bm.bias_field(12, 0.3, 5))
    assert np.array_equal(bm.bias_field(12, 0.0, 4), np.ones((12, 12, 12), np.float32))


def test_rician_noise_follows_its_law():
    rng = np.random.default_rng(0)
    zero = bm.rician_noise(np.zeros((50, 50, 40), np.float32), 0.1, rng)
    assert float(zero.mean()) == pytest.approx(0.1 * np.sqrt(np.pi / 2), rel=0.01)  # Rayleigh
    assert float((zero**2).mean()) == pytest.approx(2 * 0.1**2, rel=0.01)
    high = bm.rician_noise(np.full((50, 50, 40), 5.0, np.float32), 0.1, rng)
    assert float(high.mean()) == pytest.approx(5.0 + 0.1**2 / 10, abs=2e-3)  # ~A + s^2/(2A)
    assert float(high.std()) == pytest.approx(0.1, rel=0.02)


# ------------------------------------------------------------------------------ sites


def test_more_than_six_sites_get_deterministic_extra_scanners(phantom):
    table = scanner_table(8)
    assert table[:6] == list(SCANNERS) and scanner_table(8) == table
    assert table[6] != table[7] and table[6] not in SCANNERS
    assert scanner_table(7)[6] == table[6]
    fed = load_brain_mri(params(phantom, sites=8, block=1))
    assert fed.client_names[-1] == "site8"
    assert set(fed.info["scanners"]) == {f"site{k}" for k in range(1, 9)}


def test_determinism_and_the_seed(phantom):
    a = load_brain_mri(params(phantom))
    b = load_brain_mri(params(phantom))
    c = load_brain_mri(params(phantom, seed=1))
    for ca, cb in zip(a.clients, b.clients, strict=True):
        for s in ("train", "val", "test"):
            assert torch.equal(ca.split(s).x, cb.split(s).x)
            assert torch.equal(ca.split(s).y, cb.split(s).y)
    assert a.info["slices"] == b.info["slices"] != c.info["slices"]
    ids = a.info["slices"]["site1"]["train"][:3]
    p0, p1 = params(phantom), params(phantom, seed=1)
    assert not torch.equal(render_slices(p0, 0, ids), render_slices(p1, 0, ids))  # noise


def test_cache_round_trip_is_bit_identical_and_survives_corruption(phantom):
    p = params(phantom, cache=True)
    first = load_brain_mri(p)
    path = Path(first.info["cache"])
    assert path.is_file() and path.parent.name == "brain-mri"
    again = load_brain_mri(p)
    fresh = build_brain_mri(p)
    for x, y, z in zip(first.clients, again.clients, fresh.clients, strict=True):
        for s in ("train", "val", "test"):
            assert torch.equal(x.split(s).x, y.split(s).x) and torch.equal(
                y.split(s).x, z.split(s).x
            )
            assert torch.equal(y.split(s).y, z.split(s).y) and y.split(s).y.dtype == torch.int64
    assert again.info["slices"] == fresh.info["slices"]
    assert bm.cache_path(params(phantom, cache=True, seed=3)) != path
    path.write_bytes(b"not a zip")
    rebuilt = load_brain_mri(p)
    assert torch.equal(rebuilt.clients[0].train.x, fresh.clients[0].train.x)
    assert not list(path.parent.glob("*.tmp"))


def test_scanner_preview_writes_a_png(phantom, tmp_path):
    out = bm.scanner_preview(params(phantom, sites=3), tmp_path / "p.png")
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(out["slices"]) == 2


def test_registered_dataset_loads_through_load_dataset(phantom):
    fed = load_dataset(
        {"name": "brain-mri", "nifti_dir": phantom[0], "size": 16, "sites": 2, "block": 2}
    )
    assert fed.task == "segmentation" and len(fed.clients) == 2


# ------------------------------------------------------------------------------ errors


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("size", 40),
        ("size", 8),
        ("orientations", ["axial", "oblique"]),
        ("orientations", []),
        ("orientations", ["axial", "axial"]),
        ("fractions", [0.6, 0.2, 0.3]),
        ("fractions", [0.8, 0.2]),
        ("fractions", [0.8, 0.2, 0.0]),
        ("sites", 0),
        ("block", 0),
        ("labels", "lobes"),
        ("min_foreground", 1.0),
        ("scanner_strength", -0.1),
        ("seed", -1),
    ],
)
def test_bad_params_name_the_key(phantom, key, value):
    with pytest.raises(ConfigError, match=rf"dataset\.{key}"):
        load_brain_mri(params(phantom, **{key: value}))


def test_size_error_says_multiple_of_16(phantom):
    with pytest.raises(ConfigError, match="multiple of 16"):
        load_brain_mri(params(phantom, size=40))


def test_too_few_slices_for_the_sites_is_a_config_error(phantom):
    with pytest.raises(ConfigError, match="dataset.sites"):
        load_brain_mri(params(phantom, sites=20, block=4, orientations=["axial"]))


def test_missing_files_raise_missing_source_error(tmp_path, phantom, monkeypatch):
    with pytest.raises(MissingSourceError, match="dataset.nifti_dir"):
        load_brain_mri(params(phantom, nifti_dir=str(tmp_path / "empty")))
    partial = tmp_path / "partial"
    partial.mkdir()
    src = Path(phantom[0]) / bm.TEMPLATE_FILES["t1"]
    (partial / src.name).write_bytes(src.read_bytes())
    with pytest.raises(MissingSourceError, match=bm.TEMPLATE_FILES["gm"]):
        load_brain_mri(params(phantom, nifti_dir=str(partial)))
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(MissingSourceError, match="pip install nilearn"):
        load_brain_mri(params(phantom, nifti_dir=None))
