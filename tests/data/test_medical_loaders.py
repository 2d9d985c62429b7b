"""prostate / camelyon17 / nuclei loaders and their shared readers, on tiny generated fixtures
written in the exact on-disk layouts (NIfTI via nibabel with a real affine and int16 data,
PNG / TIFF / JPEG via Pillow, HarmoFL's data.pkl via pickle, WILDS' metadata.csv by hand)."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
import torch
from PIL import Image

from fedshift.core.errors import ConfigError, DataError, MissingSourceError
from fedshift.data import DATASETS, load_dataset
from fedshift.data.common.images import read_image, resize_images, resize_labels
from fedshift.data.common.sampling import stratified_subsample
from fedshift.data.medical import camelyon as cam
from fedshift.data.medical import prostate as pro
from fedshift.data.medical.camelyon import CamelyonParams, load_camelyon
from fedshift.data.medical.nifti import read_nifti
from fedshift.data.medical.nuclei import NucleiParams, load_nuclei
from fedshift.data.medical.prostate import ProstateParams, load_prostate

# a scanner-like affine: flipped x/y (RAS <- LPS storage), 0.625 mm in-plane, 3.6 mm slices
AFFINE = np.array([[-0.625, 0, 0, 120.0], [0, -0.625, 0, -80.0], [0, 0, 3.6, 30.0], [0, 0, 0, 1.0]])
SIX_FOLDERS = {
    "BIDMC": "BIDMC",
    "HK": "HK",
    "I2CVB": "I2CVB",
    "BMC": "ISBI",
    "RUNMC": "ISBI_1.5",
    "UCL": "UCL",
}
Q99 = 0.99 * 1535  # 99th percentile (linear) of the ramp 0..1535 = 1519.65


# --------------------------------------------------------------------------------------------
# prostate fixtures
# --------------------------------------------------------------------------------------------


def ramp(nx: int = 16, ny: int = 16, nz: int = 6) -> np.ndarray:
    """int16 volume in nibabel's (x, y, z) order: v = x + 16 y + 256 z (distinct values)."""
    x, y, z = np.meshgrid(np.arange(nx), np.arange(ny), np.arange(nz), indexing="ij")
    return (x + 16 * y + 256 * z).astype(np.int16)


def case_mask(case: int, nx=16, ny=16, nz=6, slices=(0, 2, 3, 4, 5)) -> np.ndarray:
    """A blob at rows (y) 1 + 2 case .. 2 + 2 case, columns (x) 3 .. 4 + z (wider on later
    slices), on ``slices``; one voxel labelled 2 (must become 1). Slices 0 and nz-1 are edges,
    slice 1 is empty: with the defaults only slices 2, 3, 4 are kept."""
    m = np.zeros((nx, ny, nz), dtype=np.uint8)
    for z in slices:
        m[3 : 5 + z, 1 + 2 * case : 3 + 2 * case, z] = 1
    m[4, 1 + 2 * case, slices[len(slices) // 2]] = 2
    return m


def save_nii(path: Path, data: np.ndarray) -> None:
    img = nib.Nifti1Image(data, AFFINE)
    img.header.set_data_dtype(data.dtype)
    nib.save(img, str(path))


def write_case(folder: Path, name: str, vol: np.ndarray, mask: np.ndarray, suffix: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    save_nii(folder / f"{name}.nii.gz", vol)
    save_nii(folder / f"{name}{suffix}.nii.gz", mask)


def write_prostate(root: Path, folders: dict[str, str] | None = None, cases=None) -> Path:
    """One folder per site; ``cases[site]`` cases each (default 2), ISBI_1.5 masks named
    ``_Segmentation`` as in HarmoFL's data."""
    folders = folders or SIX_FOLDERS
    for site, folder in folders.items():
        suffix = "_Segmentation" if folder == "ISBI_1.5" else "_segmentation"
        for c in range((cases or {}).get(site, 2)):
            write_case(root / folder, f"Case{c:02d}", ramp(), case_mask(c), suffix)
    return root


def params(root: Path, tmp_path: Path, **kw) -> ProstateParams:
    kw.setdefault("size", 16)
    kw.setdefault("cache_dir", str(tmp_path / "cache"))
    return ProstateParams(root=str(root), **kw)


def z_of(x: torch.Tensor) -> int:
    """The slice z of a (3, H, W) image: pixel (0, 0) of the centre channel is 256 z / Q99."""
    return int(round(float(x[1, 0, 0]) * Q99 / 256))


def case_of(label: torch.Tensor) -> int:
    rows = torch.nonzero(label)[:, 0]
    return (int(rows.min()) - 1) // 2


def slice_ids(split) -> list[tuple[int, int]]:
    return [(case_of(split.y[i]), z_of(split.x[i])) for i in range(len(split))]


# --------------------------------------------------------------------------------------------
# shared readers
# --------------------------------------------------------------------------------------------


def test_read_nifti_returns_simpleitk_order_and_keeps_int16(tmp_path):
    vol = ramp(nx=4, ny=3, nz=2)
    save_nii(tmp_path / "v.nii.gz", vol)
    arr = read_nifti(tmp_path / "v.nii.gz")
    assert arr.shape == (2, 3, 4) and arr.dtype == np.int16
    assert arr[1, 2, 3] == 3 + 16 * 2 + 256 * 1  # [z, y, x]
    with pytest.raises(DataError, match="not a readable NIfTI"):
        (tmp_path / "bad.nii.gz").write_bytes(b"nope")
        read_nifti(tmp_path / "bad.nii.gz")


def test_read_nifti_matches_simpleitk_when_installed(tmp_path):
    sitk = pytest.importorskip("SimpleITK")  # HarmoFL reads with SimpleITK; fedshift does not
    th = np.deg2rad(7.0)
    rot = np.array([[np.cos(th), -np.sin(th), 0], [np.sin(th), np.cos(th), 0], [0, 0, 1]])
    affine = np.eye(4)
    affine[:3, :3] = np.diag([-1, -1, 1]) @ rot @ np.diag([0.6, 0.6, 3.0])
    vol = np.random.default_rng(0).integers(-50, 3000, size=(5, 4, 3)).astype(np.int16)
    img = nib.Nifti1Image(vol, affine)
    img.header.set_data_dtype(np.int16)
    nib.save(img, str(tmp_path / "r.nii.gz"))
    ref = sitk.GetArrayFromImage(sitk.ReadImage(str(tmp_path / "r.nii.gz")))
    got = read_nifti(tmp_path / "r.nii.gz")
    assert got.dtype == ref.dtype and np.array_equal(got, ref)


def test_resize_helpers_hand_values():
    x = torch.tensor([[[[0.0, 1.0], [0.0, 1.0]]]])
    out = resize_images(x, 4)
    # align_corners=False: output column centres at input coordinates -0.25, 0.25, 0.75, 1.25
    assert torch.allclose(out[0, 0, 0], torch.tensor([0.0, 0.25, 0.75, 1.0]))
    y = torch.tensor([[[0, 1], [2, 3]]])
    lab = resize_labels(y, 4)
    assert lab.dtype == torch.int64
    assert lab[0].tolist() == [[0, 0, 1, 1], [0, 0, 1, 1], [2, 2, 3, 3], [2, 2, 3, 3]]
    assert resize_images(x, 2) is x  # same size: untouched


def test_stratified_subsample_hand_quota():
    labels = np.array([0] * 6 + [1] * 3)
    idx = stratified_subsample(labels, 4, np.random.default_rng(0))
    # quotas 4*6/9 = 2.67 -> 3 (largest remainder), 4*3/9 = 1.33 -> 1
    assert np.bincount(labels[idx]).tolist() == [3, 1]
    assert list(idx) == sorted(set(idx.tolist()))
    assert stratified_subsample(labels, None, np.random.default_rng(0)).tolist() == list(range(9))


def test_read_image_modes(tmp_path):
    rgba = np.zeros((4, 5, 4), dtype=np.uint8)
    rgba[..., 0], rgba[..., 1], rgba[..., 2], rgba[..., 3] = 10, 20, 30, 0
    Image.fromarray(rgba, "RGBA").save(tmp_path / "a.png")
    a = read_image(tmp_path / "a.png")
    assert a.shape == (3, 4, 5) and a.dtype == np.float32
    assert np.allclose(a[:, 0, 0], np.array([10, 20, 30]) / 255)  # alpha dropped, not composited
    g16 = np.array([[0, 32768], [65535, 1000]], dtype=np.uint16)
    Image.fromarray(g16).save(tmp_path / "g.png")
    g = read_image(tmp_path / "g.png")
    assert g.shape == (3, 2, 2) and np.allclose(g[2], g16 / 65535.0)
    with pytest.raises(DataError, match="cannot read"):
        (tmp_path / "x.png").write_bytes(b"garbage")
        read_image(tmp_path / "x.png")


# --------------------------------------------------------------------------------------------
# prostate
# --------------------------------------------------------------------------------------------


def test_prostate_six_sites_both_folder_names_and_casings(tmp_path):
    root = write_prostate(tmp_path / "data")
    fed = load_dataset({"name": "prostate", "root": str(root), "size": 16, "cache": False})
    assert fed.client_names == list(pro.SITES)
    assert fed.task == "segmentation" and fed.classes == ["background", "prostate"]
    assert fed.input_shape == (3, 16, 16)
    assert fed.info["site_folders"]["BMC"] == "ISBI"
    assert fed.info["site_folders"]["RUNMC"] == "ISBI_1.5"
    for client in fed.clients:
        # 2 cases x 3 kept slices = 6 -> int(0.64*6)=3, int(0.8*6)=4: 3 / 1 / 2
        assert fed.counts()[client.name] == {"train": 3, "val": 1, "test": 2}
        for split in (client.train, client.val, client.test):
            assert split.x.dtype == torch.float32 and split.y.dtype == torch.int64
            assert split.x.shape[1:] == (3, 16, 16) and split.y.shape[1:] == (16, 16)
            assert float(split.x.min()) >= 0.0 and float(split.x.max()) <= 1.0
    assert fed.info["counts"] == fed.counts()


def test_prostate_intensity_orientation_and_channels_hand_values(tmp_path):
    root = write_prostate(tmp_path / "d", {"HK": "HK"})
    for quantize in (True, False):
        fed = load_prostate(params(root, tmp_path, sites=["HK"], quantize=quantize))
        c = fed.clients[0]
        x = torch.cat([c.train.x, c.val.x, c.test.x])
        y = torch.cat([c.train.y, c.val.y, c.test.y])
        # kept slices: z = 2, 3, 4 of each case (0 and 5 are edges, 1 has an empty mask)
        assert sorted(z_of(s) for s in x) == [2, 2, 3, 3, 4, 4]
        s = next(i for i in range(len(x)) if z_of(x[i]) == 3)
        # voxel (row y=2, col x=5) of slices 2, 3, 4: v = 5 + 16*2 + 256 z = 549, 805, 1061
        got = x[s, :, 2, 5].double()
        exact = torch.tensor([549, 805, 1061], dtype=torch.float64) / Q99
        if quantize:  # floor(255 * 549/1519.65) = floor(92.12) = 92, 135.08 -> 135, 178.04 -> 178
            assert torch.allclose(
                got, torch.tensor([92.0, 135.0, 178.0], dtype=torch.float64) / 255, atol=1e-7
            )
        else:
            assert torch.allclose(got, exact, atol=1e-6)
        # channel 2 of the z=4 image is slice 5: voxel (row 15, col 14) = 14 + 240 + 1280 =
        # 1534 > 1519.65 -> clipped to 1; (row 14, col 15) = 1519 < 1519.65 -> just below 1
        s4 = next(i for i in range(len(x)) if z_of(x[i]) == 4)
        assert float(x[s4, 2, 15, 14]) == 1.0 and float(x[s4, 2, 15, 15]) == 1.0
        below = 254 / 255 if quantize else 1519 / Q99  # floor(255 * 0.99957) = 254
        assert abs(float(x[s4, 2, 14, 15]) - below) < 1e-6
        # mask of slice 3 (not 2 or 4): value 2 -> 1, blob of 2 x 5 voxels at rows (y)
        # 1 + 2 case, columns (x) 3..7
        assert set(y.unique().tolist()) == {0, 1}
        assert int(y[s].sum()) == 10 and int(y[s4].sum()) == 12
        case = case_of(y[s])
        assert y[s, 1 + 2 * case : 3 + 2 * case, 3:8].all()


def test_prostate_resize_nearest_labels_and_bad_size(tmp_path):
    root = tmp_path / "d"
    vol = ramp(nx=32, ny=48)
    mask = np.zeros((32, 48, 6), dtype=np.uint8)
    mask[8:24, 10:30, 1:5] = 1
    for c in range(2):
        write_case(root / "UCL", f"Case{c}", vol, mask, "_segmentation")
    fed = load_prostate(params(root, tmp_path, sites=["UCL"], size=16))
    train = fed.clients[0].train
    # mask on slices 1..4 of 6: all of i = 1..4 kept (8 slices for 2 cases) -> 5 / 1 / 2
    assert fed.info["slices"]["UCL"] == 8 and fed.counts()["UCL"]["train"] == 5
    assert train.x.shape[1:] == (3, 16, 16)
    assert set(train.y.unique().tolist()) == {0, 1}
    # nearest on centres: output row r reads input row floor(3 (r + 0.5)) = 3 r + 1, which
    # is in 10..29 for r = 3..9 (7 rows); column c reads 2 c + 1, in 8..23 for c = 4..11 (8)
    assert train.y[0].sum() == 7 * 8
    with pytest.raises(ConfigError, match="dataset.size.*multiple of 16"):
        load_prostate(params(root, tmp_path, sites=["UCL"], size=40))


def test_prostate_slice_split_is_a_seeded_partition(tmp_path):
    root = write_prostate(tmp_path / "d", {"HK": "HK"}, cases={"HK": 3})
    fed = load_prostate(params(root, tmp_path, sites=["HK"]))
    c = fed.clients[0]
    ids = [slice_ids(c.train), slice_ids(c.val), slice_ids(c.test)]
    assert [len(i) for i in ids] == [5, 2, 2]  # n = 9: int(5.76) = 5, int(7.2) = 7
    everything = sorted(i for part in ids for i in part)
    assert everything == sorted((case, z) for case in range(3) for z in (2, 3, 4))
    again = load_prostate(params(root, tmp_path, sites=["HK"]))
    assert torch.equal(again.clients[0].train.x, c.train.x)
    others = [
        slice_ids(load_prostate(params(root, tmp_path, sites=["HK"], seed=s)).clients[0].train)
        for s in (1, 2, 3)
    ]
    assert any(o != ids[0] for o in others)
    assert fed.info["split"]["leaks_adjacent_slices"] is True


def test_prostate_case_split_keeps_cases_whole(tmp_path):
    root = write_prostate(tmp_path / "d", {"HK": "HK"}, cases={"HK": 5})
    fed = load_prostate(params(root, tmp_path, sites=["HK"], split_by="cases"))
    c = fed.clients[0]
    cases = [{case for case, _ in slice_ids(s)} for s in (c.train, c.val, c.test)]
    # 5 cases: int(3.2) = 3 train, int(4.0) = 4 -> 1 val, 1 test; each with 3 slices
    assert [len(s) for s in cases] == [3, 1, 1]
    assert set.union(*cases) == set(range(5)) and sum(len(s) for s in cases) == 5
    assert fed.counts()["HK"] == {"train": 9, "val": 3, "test": 3}
    names = fed.info["split_cases"]["HK"]
    assert names["val"] == [f"Case{next(iter(cases[1])):02d}"]


def test_prostate_harmofl_index_dir_gives_its_exact_order(tmp_path):
    root = write_prostate(tmp_path / "d", {"HK": "HK", "BMC": "ISBI"})
    index_dir = tmp_path / "index"
    index_dir.mkdir()
    # slices enumerate case by case, z ascending: (0,2) (0,3) (0,4) (1,2) (1,3) (1,4)
    np.save(index_dir / "HK-index.npy", np.array([5, 4, 3, 2, 1, 0], dtype=np.int32))
    np.save(index_dir / "ISBI-index.npy", np.array([0, 2, 4, 1, 3, 5], dtype=np.int32))
    fed = load_prostate(
        params(root, tmp_path, sites=["HK", "BMC"], index_dir=str(index_dir), truncate_train=False)
    )
    hk, bmc = fed.clients
    assert slice_ids(hk.train) == [(1, 4), (1, 3), (1, 2)]
    assert slice_ids(hk.val) == [(0, 4)]
    assert slice_ids(hk.test) == [(0, 3), (0, 2)]
    assert slice_ids(bmc.train) == [(0, 2), (0, 4), (1, 3)]
    np.save(index_dir / "HK-index.npy", np.arange(5))
    with pytest.raises(DataError, match="not a permutation of the 6 slices"):
        load_prostate(params(root, tmp_path, sites=["HK"], index_dir=str(index_dir)))
    with pytest.raises(ConfigError, match="index_dir"):
        load_prostate(params(root, tmp_path, index_dir=str(index_dir), split_by="cases"))


def test_prostate_truncate_train_to_smallest_site(tmp_path):
    root = write_prostate(tmp_path / "d", {"BIDMC": "BIDMC", "HK": "HK"}, cases={"HK": 1})
    cut = load_prostate(params(root, tmp_path, sites=["BIDMC", "HK"]))
    full = load_prostate(params(root, tmp_path, sites=["BIDMC", "HK"], truncate_train=False))
    # HK: 3 slices -> 1 / 1 / 1; BIDMC: 6 slices -> 3 / 1 / 2
    assert {k: v["train"] for k, v in full.counts().items()} == {"BIDMC": 3, "HK": 1}
    assert {k: v["train"] for k, v in cut.counts().items()} == {"BIDMC": 1, "HK": 1}
    assert torch.equal(cut.clients[0].train.x, full.clients[0].train.x[:1])
    assert cut.counts()["BIDMC"]["test"] == 2
    assert cut.info["split"]["train_before_truncation"] == {"BIDMC": 3, "HK": 1}


def test_prostate_cache_hit_identical_and_invalidated_by_a_changed_file(tmp_path, monkeypatch):
    root = write_prostate(tmp_path / "d", {"HK": "HK", "UCL": "UCL"})
    p = params(root, tmp_path, sites=["HK", "UCL"])
    first = load_prostate(p)
    assert [first.info["cache"][s]["hit"] for s in ("HK", "UCL")] == [False, False]
    cached = Path(first.info["cache"]["HK"]["path"])
    assert (cached / "volumes.npz").is_file() and cached.parent.name == "prostate"

    def no_reads(path):
        raise AssertionError(f"read {path} despite a cache hit")

    monkeypatch.setattr(pro, "read_nifti", no_reads)
    second = load_prostate(p)
    assert [second.info["cache"][s]["hit"] for s in ("HK", "UCL")] == [True, True]
    for a, b in zip(first.clients, second.clients, strict=True):
        for s in ("train", "val", "test"):
            assert torch.equal(a.split(s).x, b.split(s).x)
            assert torch.equal(a.split(s).y, b.split(s).y)
    monkeypatch.undo()
    # rewrite one HK image with other content (same size); bump its mtime to be sure
    path = root / "HK" / "Case01.nii.gz"
    save_nii(path, (ramp() // 2).astype(np.int16))
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    third = load_prostate(p)
    assert third.info["cache"]["HK"]["hit"] is False
    assert third.info["cache"]["UCL"]["hit"] is True
    assert third.info["cache"]["HK"]["path"] != str(cached)
    hk_before = torch.cat([first.clients[0].split(s).x for s in ("train", "val", "test")])
    hk_after = torch.cat([third.clients[0].split(s).x for s in ("train", "val", "test")])
    assert not torch.equal(hk_before.sort(0).values, hk_after.sort(0).values)
    # quantize is part of the key
    assert (
        load_prostate(params(root, tmp_path, sites=["UCL"], quantize=False)).info["cache"]["UCL"][
            "hit"
        ]
        is False
    )
    off = load_prostate(params(root, tmp_path, sites=["HK"], cache=False, cache_dir=None))
    assert off.info["cache"] is None


def test_prostate_missing_root_shows_layout(tmp_path):
    for root in (None, str(tmp_path / "nowhere")):
        with pytest.raises(MissingSourceError) as err:
            load_prostate(ProstateParams(root=root))
        assert "dataset.root" in str(err.value)
        assert "Case00_segmentation.nii.gz" in str(err.value) and "ISBI_1.5/" in str(err.value)


def test_prostate_missing_site_folder(tmp_path):
    root = write_prostate(tmp_path / "d", {"HK": "HK"})
    with pytest.raises(DataError, match=r"site folder .*UCL is missing.*dataset.sites"):
        load_prostate(params(root, tmp_path, sites=["HK", "UCL"]))
    with pytest.raises(DataError, match=r"BMC.*\(or ISBI/\) is missing"):
        load_prostate(params(root, tmp_path, sites=["BMC"]))


def test_prostate_both_names_of_a_site(tmp_path):
    root = write_prostate(tmp_path / "d", {"BMC": "BMC"})
    write_prostate(root, {"BMC": "ISBI"})
    with pytest.raises(DataError, match="both BMC/ and ISBI/"):
        load_prostate(params(root, tmp_path, sites=["BMC"]))


def test_prostate_case_without_segmentation(tmp_path):
    root = write_prostate(tmp_path / "d", {"HK": "HK"})
    save_nii(root / "HK" / "Case07.nii.gz", ramp())
    with pytest.raises(DataError, match=r"Case07.nii.gz has no segmentation"):
        load_prostate(params(root, tmp_path, sites=["HK"]))


def test_prostate_segmentation_without_image(tmp_path):
    root = write_prostate(tmp_path / "d", {"HK": "HK"})
    save_nii(root / "HK" / "Case07_segmentation.nii.gz", case_mask(0))
    with pytest.raises(DataError, match=r"Case07_segmentation.nii.gz has no image"):
        load_prostate(params(root, tmp_path, sites=["HK"]))


def test_prostate_two_mask_casings_for_one_case(tmp_path):
    root = write_prostate(tmp_path / "d", {"HK": "HK"})
    save_nii(root / "HK" / "Case00_Segmentation.nii.gz", case_mask(0))
    with pytest.raises(DataError, match="two masks"):
        load_prostate(params(root, tmp_path, sites=["HK"]))


def test_prostate_image_label_shape_mismatch(tmp_path):
    root = write_prostate(tmp_path / "d", {"HK": "HK"})
    save_nii(root / "HK" / "Case01_segmentation.nii.gz", case_mask(1, ny=12))
    with pytest.raises(DataError, match=r"Case01.nii.gz has shape \(6, 16, 16\).*\(6, 12, 16\)"):
        load_prostate(params(root, tmp_path, sites=["HK"]))


def test_prostate_empty_split(tmp_path):
    root = tmp_path / "d"
    write_case(root / "HK", "Case00", ramp(), case_mask(0, slices=(2,)), "_segmentation")
    with pytest.raises(DataError, match="HK: the train split is empty"):
        load_prostate(params(root, tmp_path, sites=["HK"]))


def test_prostate_constant_volume(tmp_path):
    root = write_prostate(tmp_path / "d", {"HK": "HK"})
    save_nii(root / "HK" / "Case00.nii.gz", np.full((16, 16, 6), 7, dtype=np.int16))
    with pytest.raises(DataError, match="Case00.nii.gz: the volume is constant"):
        load_prostate(params(root, tmp_path, sites=["HK"]))


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"sites": ["ISBI"]}, "read as site 'BMC'"),
        ({"sites": ["HK", "HK"]}, "more than once"),
        ({"fractions": [0.5, 0.5, 0.5]}, "dataset.fractions"),
        ({"size": 0}, "dataset.size"),
    ],
)
def test_prostate_bad_params(tmp_path, kw, match):
    with pytest.raises(ConfigError, match=match):
        load_prostate(ProstateParams(root=str(tmp_path), **kw))


def test_fedfa_prostate_split_table13_and_mini_set(tmp_path):
    from fedshift.data.medical.prostate import fedfa_cuts, load_prostate

    # Table 13 (train) and Table 2 (mini train) from the slice counts of HarmoFL's index files;
    # (n, Table 13 train, Table 2 train). FedFA's tables list 384 slices as BMC and 411 as RUNMC.
    rows = [(261, 156, 32), (157, 94, 32), (468, 280, 46), (384, 230, 38), (411, 246, 41)]
    for n, train13, mini in [*rows, (175, 105, 32)]:
        cuts = fedfa_cuts(n, "fedfa")
        assert cuts["train"] == (0, train13), n
        assert cuts["val"][1] - cuts["val"][0] == int(0.2 * n) == cuts["test"][1] - cuts["test"][0]
        assert fedfa_cuts(n, "fedfa", 1 / 6)["train"][1] == mini, n
        assert fedfa_cuts(n, "fedfa-released", 1 / 6)["train"][1] == mini, n

    # the loader on a 7-case fixture (21 slices): 12 / 4 / 4 on the same permutation as
    # HarmoFL's 64/16/20 (13 / 3 / 5), no truncation
    root = write_prostate(tmp_path / "d", {"HK": "HK"}, cases={"HK": 7})
    full = load_prostate(params(root, tmp_path, sites=["HK"], split="fedfa"))
    assert full.counts()["HK"] == {"train": 12, "val": 4, "test": 4}
    assert full.info["split"]["truncate_train"] is False
    harmofl = load_prostate(params(root, tmp_path, sites=["HK"]))
    f, h = full.clients[0], harmofl.clients[0]
    assert harmofl.counts()["HK"] == {"train": 13, "val": 3, "test": 5}
    order = slice_ids(h.train) + slice_ids(h.val) + slice_ids(h.test)
    assert slice_ids(f.train) == order[:12] and slice_ids(f.val) == order[12:16]
    assert slice_ids(f.test) == order[17:]  # the last int(0.2 n); slice 16 is in no split
    # released slicing: at least 32 train slices, val right after them (empty here: an error)
    with pytest.raises(DataError, match="val split is empty"):
        load_prostate(params(root, tmp_path, sites=["HK"], split="fedfa-released"))
    with pytest.raises(ConfigError, match="train_fraction"):
        load_prostate(params(root, tmp_path, sites=["HK"], train_fraction=0.5))
    with pytest.raises(ConfigError, match="fractions"):
        load_prostate(
            params(root, tmp_path, sites=["HK"], split="fedfa", fractions=[0.5, 0.3, 0.2])
        )


# --------------------------------------------------------------------------------------------
# camelyon17 fixtures
# --------------------------------------------------------------------------------------------

SLIDES_PER_HOSPITAL = 8


def patch(value: int, tumor: int, center: int, side: int = 96) -> Image.Image:
    """A flat patch whose red channel is the row number, green the label, blue the center."""
    arr = np.zeros((side, side, 3), dtype=np.uint8)
    arr[..., 0], arr[..., 1], arr[..., 2] = value, 200 * tumor, 40 * center
    return Image.fromarray(arr, "RGB")


def write_wilds(root: Path) -> list[dict]:
    """WILDS layout: metadata.csv with its real header, 8 slides per hospital, 2-4 patches per
    slide, patient ids written zero-padded as in the real file."""
    rows = []
    for center in range(5):
        for j in range(SLIDES_PER_HOSPITAL):
            patient, node = 10 * center + j // 2, j % 2
            for k in range(2 + (j % 3)):
                rows.append(
                    dict(
                        patient=patient,
                        node=node,
                        x=32 * k,
                        y=64 * j,
                        tumor=(j + k) % 2,
                        slide=SLIDES_PER_HOSPITAL * center + j,
                        center=center,
                    )
                )
    lines = [",patient,node,x_coord,y_coord,tumor,slide,center,split"]
    for i, r in enumerate(rows):
        lines.append(
            f"{i},{r['patient']:03d},{r['node']},{r['x']},{r['y']},{r['tumor']},{r['slide']},"
            f"{r['center']},{i % 2}"
        )
        rel = cam.wilds_path(r["patient"], r["node"], r["x"], r["y"])
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        patch(i, r["tumor"], r["center"]).save(root / rel)
    (root / "metadata.csv").write_text("\n".join(lines) + "\n")
    return rows


def row_of(x: torch.Tensor) -> int:
    return int(round(float(x[0, 0, 0]) * 255))


def test_wilds_path_format():
    assert cam.wilds_path(4, 4, 3328, 21792) == (
        "patches/patient_004_node_4/patch_patient_004_node_4_x_3328_y_21792.png"
    )


def test_camelyon_wilds_layout_labels_hospitals_and_slide_split(tmp_path):
    root = tmp_path / "camelyon17_v1.0"
    rows = write_wilds(root)
    fed = load_dataset({"name": "camelyon17", "root": str(root)})
    assert fed.info["layout"] == "wilds"
    assert fed.client_names == [f"hospital{k}" for k in range(1, 6)]
    assert fed.task == "classification" and fed.classes == ["normal", "tumor"]
    assert fed.input_shape == (3, 96, 96)
    for k, client in enumerate(fed.clients):
        seen_slides = []
        total = 0
        for split in ("train", "val", "test"):
            sp = client.split(split)
            assert len(sp) > 0 and sp.x.dtype == torch.float32 and sp.y.dtype == torch.int64
            ids = [row_of(x) for x in sp.x]
            assert [rows[i]["center"] for i in ids] == [k] * len(ids)  # hospital = center + 1
            assert sp.y.tolist() == [rows[i]["tumor"] for i in ids]  # label follows the file
            assert torch.allclose(sp.x[:, 1, 0, 0], sp.y.float() * 200 / 255)
            seen_slides.append({rows[i]["slide"] for i in ids})
            total += len(ids)
        a, b, c = seen_slides
        assert not (a & b or a & c or b & c)  # no slide in two splits
        assert a | b | c == set(range(8 * k, 8 * k + SLIDES_PER_HOSPITAL))
        assert total == sum(1 for r in rows if r["center"] == k)  # caps above the sizes
        assert fed.info["slides"][f"hospital{k + 1}"]["val"] == sorted(b)
    again = load_camelyon(CamelyonParams(root=str(root)))
    assert torch.equal(again.clients[2].test.x, fed.clients[2].test.x)


def test_split_by_slide_hand_assignment():
    class Identity:
        def permutation(self, n):
            return np.arange(n)

    slides = np.repeat([0, 1, 2, 3, 4], [10, 2, 2, 3, 3])
    got = cam.split_by_slide(slides, (0.64, 0.16, 0.2), Identity())
    # targets 12.8 / 3.2 / 4: slide0 -> train (def. 2.8, 3.2, 4) -> slide1 -> test (2.8, 3.2, 2)
    # -> slide2 -> val (2.8, 1.2, 2) -> slide3 -> train (-0.2, 1.2, 2) -> slide4 -> test
    assert got.tolist() == [0] * 10 + [2] * 2 + [1] * 2 + [0] * 3 + [2] * 3


def test_camelyon_caps_are_stratified_and_recorded(tmp_path):
    root = tmp_path / "w"
    write_wilds(root)
    fed = load_camelyon(CamelyonParams(root=str(root), train_size=4, val_size=None, test_size=2))
    info = fed.info
    for client in fed.clients:
        avail = info["available"][client.name]
        assert len(client.train) == min(4, avail["train"])
        assert len(client.val) == avail["val"]
        assert len(client.test) == min(2, avail["test"])
    assert info["caps"] == {"train": 4, "val": None, "test": 2}
    assert "stratified" in info["subsample"]
    # the test set does not move when only train_size changes
    other = load_camelyon(CamelyonParams(root=str(root), train_size=3, val_size=None, test_size=2))
    assert torch.equal(other.clients[0].test.x, fed.clients[0].test.x)


def write_harmofl(root: Path, n_train: int = 10, n_test: int = 4, protocol: int = 2) -> dict:
    data = {}
    value = 0
    for h in range(1, 6):
        entry = {}
        for split, n in (("train", n_train), ("test", n_test)):
            paths, labels = [], []
            for i in range(n):
                folder = f"patient_{h:03d}_node_0"
                rel = f"patches/{folder}/patch_{folder}_x_{i}_y_{split}.png"
                (root / rel).parent.mkdir(parents=True, exist_ok=True)
                patch(value, i % 2, h - 1).save(root / rel)
                paths.append(rel)
                labels.append([i % 2])
                value += 1
            entry[split] = (np.array(paths), np.array(labels, dtype=np.int64))
        data[f"hospital{h}"] = entry
    with open(root / "data.pkl", "wb") as fh:
        pickle.dump(data, fh, protocol=protocol)
    return data


def test_camelyon_harmofl_layout_val_is_last_fifth_of_train(tmp_path):
    root = tmp_path / "h"
    write_harmofl(root)
    fed = load_camelyon(CamelyonParams(root=str(root), train_size=None, val_size=None))
    assert fed.info["layout"] == "harmofl"
    for h, client in enumerate(fed.clients):
        base = h * 14  # 10 train + 4 test patches per hospital, numbered in order
        # floor(0.2 * 10) = 2: train = entries 0..7, val = entries 8, 9 (HarmoFL fed_train.py)
        assert [row_of(x) for x in client.train.x] == list(range(base, base + 8))
        assert [row_of(x) for x in client.val.x] == [base + 8, base + 9]
        assert [row_of(x) for x in client.test.x] == list(range(base + 10, base + 14))
        assert client.train.y.tolist() == [i % 2 for i in range(8)]
        assert client.val.y.dtype == torch.int64
    with pytest.raises(ConfigError, match="WILDS layout only"):
        load_camelyon(CamelyonParams(root=str(root), fractions=[0.5, 0.3, 0.2]))


def test_camelyon_harmofl_pickle_refuses_other_objects(tmp_path):
    class Evil:
        def __reduce__(self):
            return (os.getcwd, ())

    root = tmp_path / "h"
    root.mkdir()
    (root / "data.pkl").write_bytes(pickle.dumps({"hospital1": Evil()}))
    with pytest.raises(DataError, match="refusing to build"):
        load_camelyon(CamelyonParams(root=str(root)))
    (root / "data.pkl").write_bytes(pickle.dumps({"hospital1": {"train": ([], [])}}))
    with pytest.raises(DataError, match="'hospital1' entry with 'train' and 'test'"):
        load_camelyon(CamelyonParams(root=str(root)))


def test_camelyon_layout_detection_errors(tmp_path):
    with pytest.raises(MissingSourceError, match="(?s)dataset.root.*metadata.csv"):
        load_camelyon(CamelyonParams(root=None))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(MissingSourceError, match="neither metadata.csv .* nor data.pkl"):
        load_camelyon(CamelyonParams(root=str(empty)))
    both = tmp_path / "both"
    write_wilds(both)
    (both / "data.pkl").write_bytes(b"")
    with pytest.raises(DataError, match="dataset.layout=wilds or dataset.layout=harmofl"):
        load_camelyon(CamelyonParams(root=str(both)))
    assert load_camelyon(CamelyonParams(root=str(both), layout="wilds")).info["layout"] == "wilds"
    with pytest.raises(MissingSourceError, match="data.pkl is missing"):
        load_camelyon(CamelyonParams(root=str(tmp_path / "both" / "patches"), layout="harmofl"))


def test_camelyon_patch_of_wrong_size(tmp_path):
    root = tmp_path / "w"
    rows = write_wilds(root)
    r = rows[0]
    bad = root / cam.wilds_path(r["patient"], r["node"], r["x"], r["y"])
    patch(0, r["tumor"], 0, side=100).save(bad)
    with pytest.raises(
        DataError, match=r"patch_patient_000_node_0_x_0_y_0.png is 100x100.*dataset.size"
    ):
        load_camelyon(CamelyonParams(root=str(root)))
    fed = load_camelyon(CamelyonParams(root=str(root), size=32))
    assert fed.input_shape == (3, 32, 32) and fed.clients[0].train.x.shape[1:] == (3, 32, 32)
    assert fed.info["resized"] is True


def test_camelyon_missing_patch_and_bad_metadata(tmp_path):
    root = tmp_path / "w"
    rows = write_wilds(root)
    r = rows[5]
    (root / cam.wilds_path(r["patient"], r["node"], r["x"], r["y"])).unlink()
    with pytest.raises(
        DataError, match=r"x_0_y_128.png is missing \(listed in .*metadata.csv, line 7\)"
    ):
        load_camelyon(CamelyonParams(root=str(root)))
    text = (root / "metadata.csv").read_text().replace(",slide,", ",slide_id,", 1)
    (root / "metadata.csv").write_text(text)
    with pytest.raises(DataError, match=r"missing column\(s\) \['slide'\]"):
        load_camelyon(CamelyonParams(root=str(root)))


def test_camelyon_empty_split_when_a_hospital_has_one_slide(tmp_path):
    root = tmp_path / "w"
    write_wilds(root)
    lines = (root / "metadata.csv").read_text().splitlines()
    keep = [lines[0]] + [
        ln for ln in lines[1:] if ln.split(",")[7] != "2" or ln.split(",")[6] == "16"
    ]
    (root / "metadata.csv").write_text("\n".join(keep) + "\n")
    with pytest.raises(DataError, match="hospital3: splitting its 1 slide.*split empty"):
        load_camelyon(CamelyonParams(root=str(root)))


# --------------------------------------------------------------------------------------------
# nuclei fixtures
# --------------------------------------------------------------------------------------------


def rgb(h: int, w: int, value: int) -> np.ndarray:
    arr = np.zeros((h, w, 3), dtype=np.uint8)
    arr[..., 0] = value
    arr[..., 1] = np.arange(w, dtype=np.uint8)[None, :]
    arr[..., 2] = np.arange(h, dtype=np.uint8)[:, None]
    return arr


def instance_mask(h: int, w: int) -> np.ndarray:
    m = np.zeros((h, w), dtype=np.uint8)
    m[2:5, 2:6] = 1
    m[8:12, 9:14] = 2
    m[13:15, 1:3] = 3
    return m


def write_pair(
    split_dir: Path,
    stem: str,
    image: Image.Image,
    label: Image.Image,
    ext: str,
    label_ext: str = ".png",
) -> None:
    (split_dir / "images").mkdir(parents=True, exist_ok=True)
    (split_dir / "labels").mkdir(parents=True, exist_ok=True)
    image.save(split_dir / "images" / f"{stem}{ext}")
    label.save(split_dir / "labels" / f"{stem}{label_ext}")


def write_nuclei(root: Path) -> Path:
    """SiteA: mixed formats and sizes; SiteB: plain 16x16 PNGs."""
    a = root / "SiteA"
    m16 = Image.fromarray(instance_mask(16, 16))
    write_pair(a / "train", "rgb", Image.fromarray(rgb(16, 16, 50)), m16, ".png")
    gray = np.tile(np.arange(16, dtype=np.uint8)[None, :] * 10, (16, 1))
    write_pair(a / "train", "gray", Image.fromarray(gray, "L"), m16, ".tif", ".tif")
    rgba = np.dstack([rgb(16, 16, 70), np.full((16, 16), 9, np.uint8)])
    write_pair(a / "train", "rgba", Image.fromarray(rgba, "RGBA"), m16, ".png")
    big = Image.fromarray(rgb(32, 48, 90))
    big_mask = np.zeros((32, 48), np.uint8)
    big_mask[:, 24:] = 255
    write_pair(a / "val", "big", big, Image.fromarray(big_mask), ".png")
    write_pair(a / "test", "photo", Image.fromarray(rgb(16, 16, 120)), m16, ".jpg")
    m16_16bit = Image.fromarray(instance_mask(16, 16).astype(np.uint16) * 300)
    write_pair(a / "test", "deep", Image.fromarray(rgb(16, 16, 130)), m16_16bit, ".png", ".tif")
    b = root / "SiteB"
    for split, n in (("train", 2), ("val", 1), ("test", 1)):
        for i in range(n):
            write_pair(b / split, f"s{i}", Image.fromarray(rgb(16, 16, 10 + i)), m16, ".png")
    return root


def test_nuclei_layout_formats_and_binarised_instance_masks(tmp_path):
    root = write_nuclei(tmp_path / "nuclei")
    fed = load_dataset({"name": "nuclei", "root": str(root), "size": 16})
    assert fed.client_names == ["SiteA", "SiteB"] and fed.task == "segmentation"
    assert fed.classes == ["background", "nucleus"] and fed.input_shape == (3, 16, 16)
    assert fed.counts() == {
        "SiteA": {"train": 3, "val": 1, "test": 2},
        "SiteB": {"train": 2, "val": 1, "test": 1},
    }
    a = fed.client("SiteA")
    binary = torch.from_numpy((instance_mask(16, 16) > 0).astype(np.int64))
    # sorted by stem: gray, rgb, rgba
    assert all(torch.equal(a.train.y[i], binary) for i in range(3))
    gray, colour, rgba = a.train.x
    assert torch.allclose(gray[0, 0], torch.arange(16.0) * 10 / 255)
    assert torch.equal(gray[0], gray[1]) and torch.equal(gray[1], gray[2])
    assert torch.allclose(colour, torch.from_numpy(rgb(16, 16, 50)).permute(2, 0, 1) / 255.0)
    assert torch.allclose(rgba, torch.from_numpy(rgb(16, 16, 70)).permute(2, 0, 1) / 255.0)
    # 32x48 -> 16x16 (aspect not kept); label 0/255 -> 0/1, right half foreground
    assert a.val.x.shape == (1, 3, 16, 16)
    assert a.val.y[0, :, :8].sum() == 0 and bool(a.val.y[0, :, 8:].all())
    assert fed.info["original_sizes"]["SiteA"]["val"] == ["32x48"]
    # JPEG is lossy: close to the source; the 16-bit TIFF instance mask binarised too
    deep, photo = a.test.x
    assert (photo - torch.from_numpy(rgb(16, 16, 120)).permute(2, 0, 1) / 255).abs().max() < 0.1
    assert torch.equal(a.test.y[0], binary)


def test_nuclei_sites_param_and_size(tmp_path):
    root = write_nuclei(tmp_path / "n")
    fed = load_nuclei(NucleiParams(root=str(root), sites=["SiteB"], size=32))
    assert fed.client_names == ["SiteB"] and fed.clients[0].train.x.shape[1:] == (3, 32, 32)
    assert set(fed.clients[0].train.y.unique().tolist()) == {0, 1}
    with pytest.raises(DataError, match=r"SiteC is missing.*dataset.sites"):
        load_nuclei(NucleiParams(root=str(root), sites=["SiteC"], size=16))
    with pytest.raises(ConfigError, match="dataset.size.*multiple of 16"):
        load_nuclei(NucleiParams(root=str(root), size=20))


def test_nuclei_missing_root_shows_layout():
    with pytest.raises(MissingSourceError, match=r"dataset.root(.|\n)*labels/"):
        load_nuclei(NucleiParams(root=None))


def _site_b(tmp_path: Path) -> Path:
    root = write_nuclei(tmp_path / "n")
    return root / "SiteB"


def test_nuclei_image_without_label(tmp_path):
    site = _site_b(tmp_path)
    (site / "train" / "labels" / "s1.png").unlink()
    with pytest.raises(DataError, match=r"images/s1.png has no label"):
        load_nuclei(NucleiParams(root=str(site.parent), sites=["SiteB"], size=16))


def test_nuclei_label_without_image(tmp_path):
    site = _site_b(tmp_path)
    (site / "test" / "images" / "s0.png").unlink()
    with pytest.raises(DataError, match=r"labels/s0.png has no image"):
        load_nuclei(NucleiParams(root=str(site.parent), sites=["SiteB"], size=16))


def test_nuclei_shape_mismatch(tmp_path):
    site = _site_b(tmp_path)
    Image.fromarray(instance_mask(12, 16)).save(site / "val" / "labels" / "s0.png")
    with pytest.raises(DataError, match=r"images/s0.png is 16x16 .*labels/s0.png is 16x12"):
        load_nuclei(NucleiParams(root=str(site.parent), sites=["SiteB"], size=16))


def test_nuclei_site_without_a_split(tmp_path):
    site = _site_b(tmp_path)
    for p in sorted((site / "val").rglob("*"), reverse=True):
        p.unlink() if p.is_file() else p.rmdir()
    (site / "val").rmdir()
    with pytest.raises(DataError, match=r"SiteB/val is missing"):
        load_nuclei(NucleiParams(root=str(site.parent), size=16))


def test_nuclei_empty_split(tmp_path):
    site = _site_b(tmp_path)
    for name in ("images", "labels"):
        (site / "val" / name / "s0.png").unlink()
    with pytest.raises(DataError, match=r"SiteB/val is an empty split"):
        load_nuclei(NucleiParams(root=str(site.parent), size=16))


def test_nuclei_unsupported_files(tmp_path):
    site = _site_b(tmp_path)
    Image.fromarray(rgb(16, 16, 1)).save(site / "train" / "images" / "odd.bmp")
    with pytest.raises(DataError, match=r"odd.bmp: images must be"):
        load_nuclei(NucleiParams(root=str(site.parent), sites=["SiteB"], size=16))
    (site / "train" / "images" / "odd.bmp").unlink()
    Image.fromarray(instance_mask(16, 16)).save(site / "train" / "labels" / "s9.jpg")
    with pytest.raises(DataError, match=r"s9.jpg: labels must be .*lossless"):
        load_nuclei(NucleiParams(root=str(site.parent), sites=["SiteB"], size=16))
    (site / "train" / "labels" / "s9.jpg").unlink()
    Image.fromarray(rgb(16, 16, 1)).save(site / "train" / "images" / "s0.tif")
    with pytest.raises(DataError, match=r"s0.png and s0.tif share the stem"):
        load_nuclei(NucleiParams(root=str(site.parent), sites=["SiteB"], size=16))


def test_registry_has_the_three_loaders():
    for name, params_cls in (
        ("prostate", ProstateParams),
        ("camelyon17", CamelyonParams),
        ("nuclei", NucleiParams),
    ):
        assert DATASETS.entry(name).params is params_cls
