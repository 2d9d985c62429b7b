"""``chmnist`` / ``cub200`` (DisTrans's CH-MNIST and Bird-200) on tiny fixtures in the real
on-disk layouts: Kather's eight class folders of .tif tiles, and CUB_200_2011's index files
with images/<class>/<file>.jpg.

Every image has a constant colour that encodes which file it is, so a test can tell which
files landed in which split (TIFF is lossless: exact; JPEG: within a few levels)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from fedshift.core.errors import ConfigError, DataError, MissingSourceError
from fedshift.data import DATASETS, load_dataset
from fedshift.data.domains.distrans_folders import (
    CHMNIST_CLASSES,
    CHMNIST_FOLDER,
    CHMNISTParams,
    CUBParams,
    load_chmnist,
    load_cub200,
)

PER_CLASS = 6


def codes(x: torch.Tensor, channel: int, step: int, tol: float = 0.0) -> list[int]:
    """Each image's constant channel value divided by ``step`` (checking it is constant)."""
    v = x[:, channel].reshape(len(x), -1) * 255
    assert float((v.max(1).values - v.min(1).values).max()) <= 2 * tol + 1e-4
    mean = v.mean(1) / step
    assert float((mean - mean.round()).abs().max()) <= tol / step + 1e-4
    return mean.round().to(torch.int64).tolist()


# --------------------------------------------------------------------------------------------
# chmnist
# --------------------------------------------------------------------------------------------


def make_chmnist(parent: Path, per_class: int = PER_CLASS) -> Path:
    """<parent>/Kather_texture_2016_image_tiles_5000/<class>/<tile>.tif; tile k of class c is
    12x10 RGB (R = 30 c, G = 40 k, B = 7)."""
    folder = parent / CHMNIST_FOLDER
    for c, name in enumerate(CHMNIST_CLASSES):
        (folder / name).mkdir(parents=True)
        for k in range(per_class):
            img = Image.new("RGB", (12, 10), (30 * c, 40 * k, 7))
            img.save(folder / name / f"{name[3:]}_{k:03d}.tif")
    return folder


def chm(root: Path, **kw) -> CHMNISTParams:
    base = dict(root=str(root), image_size=8, test_size=16, val_size=8, tiles_per_class=PER_CLASS)
    return CHMNISTParams(**{**base, "cache": False, **kw})


def test_chmnist_shapes_labels_and_stratified_splits(tmp_path: Path) -> None:
    folder = make_chmnist(tmp_path)
    (folder / "01_TUMOR" / "readme.txt").write_text("not an image")
    (folder / "01_TUMOR" / ".DS_Store").write_bytes(b"\0")
    fed = load_chmnist(chm(tmp_path))
    assert fed.name == "chmnist" and fed.client_names == ["chmnist"]
    assert fed.classes == list(CHMNIST_CLASSES) and fed.input_shape == (3, 8, 8)
    assert fed.task == "classification" and fed.info["skipped_files"] == 1
    c = fed.clients[0]
    assert (len(c.train), len(c.val), len(c.test)) == (24, 8, 16)
    assert c.train.x.shape == (24, 3, 8, 8) and c.train.x.dtype == torch.float32
    assert c.train.y.dtype == torch.int64
    # stratified: 2 test, 1 val, 3 train tiles per class
    assert torch.bincount(c.test.y, minlength=8).tolist() == [2] * 8
    assert torch.bincount(c.val.y, minlength=8).tolist() == [1] * 8
    assert torch.bincount(c.train.y, minlength=8).tolist() == [3] * 8
    # label = folder prefix - 1: the red code of every tile is its label
    seen = []
    for split in (c.train, c.val, c.test):
        red, green = codes(split.x, 0, 30), codes(split.x, 1, 40)
        assert red == split.y.tolist()
        assert (split.x[:, 2] * 255).round().eq(7).all()
        seen += list(zip(red, green, strict=True))
    # disjoint splits covering every tile
    assert sorted(seen) == [(cl, k) for cl in range(8) for k in range(PER_CLASS)]
    # train_size draws a stratified subset of what test and val leave
    fed = load_chmnist(chm(tmp_path, train_size=16))
    assert torch.bincount(fed.clients[0].train.y, minlength=8).tolist() == [2] * 8


def test_chmnist_defaults_and_root_variants(tmp_path: Path) -> None:
    p = CHMNISTParams()
    assert (p.image_size, p.test_size, p.val_size, p.train_size) == (64, 1000, 500, None)
    assert p.tiles_per_class == 625
    assert DATASETS.entry("chmnist").params is CHMNISTParams
    folder = make_chmnist(tmp_path / "kaggle" / CHMNIST_FOLDER)  # Kaggle's double nesting
    for root in (tmp_path / "kaggle", folder.parent, folder):
        fed = load_chmnist(chm(root))
        assert fed.info["folder"] == str(folder)


def test_chmnist_deterministic_and_seeded(tmp_path: Path) -> None:
    make_chmnist(tmp_path)
    a, b = (load_chmnist(chm(tmp_path, seed=3)).clients[0] for _ in range(2))
    for s in ("train", "val", "test"):
        assert torch.equal(a.split(s).x, b.split(s).x)
        assert torch.equal(a.split(s).y, b.split(s).y)
    other = load_chmnist(chm(tmp_path, seed=4)).clients[0]
    assert not torch.equal(a.test.x, other.test.x)
    # the cache gives back the same arrays
    cache = tmp_path / "cache"
    first = load_chmnist(chm(tmp_path, seed=3, cache=True, cache_dir=str(cache)))
    second = load_chmnist(chm(tmp_path, seed=3, cache=True, cache_dir=str(cache)))
    assert not first.info["cache"]["hit"] and second.info["cache"]["hit"]
    assert torch.equal(second.clients[0].train.x, a.train.x)


def test_chmnist_through_registry_and_partition(tmp_path: Path) -> None:
    make_chmnist(tmp_path)
    section = {
        "name": "chmnist",
        "root": str(tmp_path),
        "image_size": 8,
        "test_size": 16,
        "val_size": 8,
        "tiles_per_class": PER_CLASS,
        "cache": False,
    }
    fed = load_dataset(section, {"name": "one-class"})
    assert len(fed.clients) == 8
    assert all(set(c.train.y.tolist()) == {i} for i, c in enumerate(fed.clients))


def test_chmnist_errors(tmp_path: Path) -> None:
    folder = make_chmnist(tmp_path)
    with pytest.raises(MissingSourceError, match=r"(?s)set dataset.root.*01_TUMOR"):
        load_chmnist(CHMNISTParams(cache=False))
    with pytest.raises(MissingSourceError, match=r"dataset.root=.*nowhere.*does not exist"):
        load_chmnist(chm(tmp_path / "nowhere"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(MissingSourceError, match=r"(?s)holds neither Kather.*extract"):
        load_chmnist(chm(tmp_path / "empty"))
    # the release has 625 tiles per class: a partial folder is an error, not a smaller dataset
    with pytest.raises(DataError, match=r"01_TUMOR holds 6 image files, expected 625"):
        load_chmnist(chm(tmp_path, tiles_per_class=625))
    load_chmnist(chm(tmp_path, tiles_per_class=None))  # null: any non-zero count
    with pytest.raises(ConfigError, match=r"dataset.test_size'=48"):
        load_chmnist(chm(tmp_path, test_size=48))
    with pytest.raises(ConfigError, match=r"dataset.val_size'=32"):
        load_chmnist(chm(tmp_path, val_size=32))
    with pytest.raises(ConfigError, match=r"dataset.train_size'=25"):
        load_chmnist(chm(tmp_path, train_size=25))
    with pytest.raises(ConfigError, match=r"dataset.image_size"):
        load_chmnist(chm(tmp_path, image_size=0))
    with pytest.raises(ConfigError, match=r"dataset.test_size.*no official test split"):
        load_chmnist(chm(tmp_path, test_size=None))
    with pytest.raises(ConfigError, match=r"dataset.tiles_per_class"):
        load_chmnist(chm(tmp_path, tiles_per_class=0))
    for f in (folder / "08_EMPTY").iterdir():
        f.unlink()
    with pytest.raises(DataError, match=r"08_EMPTY holds no image file"):
        load_chmnist(chm(tmp_path))
    shutil.rmtree(folder / "05_DEBRIS")
    with pytest.raises(MissingSourceError, match=r"05_DEBRIS is missing.*re-extract"):
        load_chmnist(chm(tmp_path))


# --------------------------------------------------------------------------------------------
# cub200
# --------------------------------------------------------------------------------------------

CUB_CLASSES = ["001.Alpha_bird", "002.Beta_bird", "003.Gamma_bird"]


def make_cub(parent: Path) -> Path:
    """<parent>/CUB_200_2011 with 3 classes x 4 images (ids 1..12, class (id - 1) // 4 + 1);
    the last image of each class is in the official test split. Image id i is a 16x12 JPEG
    with R = 18 i; image 6 is grayscale (all channels 18 i)."""
    folder = parent / "CUB_200_2011"
    (folder / "images").mkdir(parents=True)
    lines = {"images.txt": [], "image_class_labels.txt": [], "train_test_split.txt": []}
    for i in range(1, 13):
        cls = (i - 1) // 4 + 1
        rel = f"{CUB_CLASSES[cls - 1]}/{CUB_CLASSES[cls - 1][4:]}_{i:04d}.jpg"
        (folder / "images" / rel).parent.mkdir(exist_ok=True)
        if i == 6:
            img = Image.new("L", (16, 12), 18 * i)
        else:
            img = Image.new("RGB", (16, 12), (18 * i, 128, 64))
        img.save(folder / "images" / rel, quality=95)
        lines["images.txt"].append(f"{i} {rel}")
        lines["image_class_labels.txt"].append(f"{i} {cls}")
        lines["train_test_split.txt"].append(f"{i} {0 if i % 4 == 0 else 1}")
    for name, rows in lines.items():
        (folder / name).write_text("\n".join(reversed(rows)) + "\n")  # order must not matter
    classes = "".join(f"{k} {n}\n" for k, n in enumerate(CUB_CLASSES, 1))
    (folder / "classes.txt").write_text(classes)
    return folder


def cub(root: Path, **kw) -> CUBParams:
    return CUBParams(**{"root": str(root), "image_size": 8, "val_size": 3, "cache": False, **kw})


def test_cub200_official_split_labels_and_shapes(tmp_path: Path) -> None:
    make_cub(tmp_path)
    fed = load_cub200(cub(tmp_path))
    assert fed.name == "cub200" and fed.classes == CUB_CLASSES
    assert fed.input_shape == (3, 8, 8)
    c = fed.clients[0]
    assert (len(c.train), len(c.val), len(c.test)) == (6, 3, 3)
    assert c.test.x.shape == (3, 3, 8, 8) and c.test.y.dtype == torch.int64
    ids = {s: codes(c.split(s).x, 0, 18, tol=3) for s in ("train", "val", "test")}
    # official split: the test split is exactly the images marked 0
    assert ids["test"] == [4, 8, 12]
    assert not set(ids["train"]) & set(ids["val"])
    assert sorted(ids["train"] + ids["val"]) == [i for i in range(1, 13) if i % 4]
    # 1-based class ids -> 0-based labels
    for s in ("train", "val", "test"):
        assert [(i - 1) // 4 for i in ids[s]] == c.split(s).y.tolist()
    # stratified val: one per class; train keeps two per class
    assert torch.bincount(c.val.y, minlength=3).tolist() == [1, 1, 1]
    assert torch.bincount(c.train.y, minlength=3).tolist() == [2, 2, 2]
    # the grayscale image comes back with three equal channels
    for s in ("train", "val", "test"):
        split = c.split(s)
        for j, i in enumerate(ids[s]):
            if i == 6:
                assert torch.equal(split.x[j, 0], split.x[j, 1])
                assert torch.equal(split.x[j, 1], split.x[j, 2])
    assert fed.info["source_sizes"] == {"train": 9, "test": 3}
    # test_size / train_size draw stratified subsets of their pools
    fed = load_cub200(cub(tmp_path, train_size=3, test_size=3))
    assert torch.bincount(fed.clients[0].train.y, minlength=3).tolist() == [1, 1, 1]


def test_cub200_defaults_root_variants_and_determinism(tmp_path: Path) -> None:
    p = CUBParams()
    assert (p.image_size, p.val_size, p.train_size, p.test_size) == (128, 600, None, None)
    assert DATASETS.entry("cub200").params is CUBParams
    folder = make_cub(tmp_path)
    a = load_cub200(cub(tmp_path, seed=5)).clients[0]
    b = load_cub200(cub(folder, seed=5)).clients[0]  # root = CUB_200_2011 itself
    for s in ("train", "val", "test"):
        assert torch.equal(a.split(s).x, b.split(s).x)
        assert torch.equal(a.split(s).y, b.split(s).y)
    vals = {
        tuple(codes(load_cub200(cub(tmp_path, seed=s)).clients[0].val.x, 0, 18, 3))
        for s in range(6)
    }
    assert len(vals) > 1  # the seed picks the val images


def test_cub200_errors(tmp_path: Path) -> None:
    folder = make_cub(tmp_path)
    with pytest.raises(MissingSourceError, match=r"(?s)set dataset.root.*images.txt"):
        load_cub200(CUBParams(cache=False))
    (tmp_path / "empty").mkdir()
    with pytest.raises(MissingSourceError, match=r"(?s)holds neither CUB_200_2011.*extract"):
        load_cub200(cub(tmp_path / "empty"))
    with pytest.raises(ConfigError, match=r"dataset.val_size'=9"):
        load_cub200(cub(tmp_path, val_size=9))
    with pytest.raises(ConfigError, match=r"dataset.train_size'=7"):
        load_cub200(cub(tmp_path, train_size=7))
    with pytest.raises(ConfigError, match=r"dataset.test_size'=4"):
        load_cub200(cub(tmp_path, test_size=4))
    # index files that disagree on the images
    labels = folder / "image_class_labels.txt"
    good = labels.read_text()
    labels.write_text("".join(good.splitlines(keepends=True)[1:]))
    with pytest.raises(DataError, match=r"image_class_labels.txt lists 11 images.*lacks 1 id"):
        load_cub200(cub(tmp_path))
    labels.write_text(good.replace("7 2\n", "7 4\n"))
    with pytest.raises(DataError, match=r"id 7 has value '4', expected an integer in 1..3"):
        load_cub200(cub(tmp_path))
    labels.write_text(good + "oops\n")
    with pytest.raises(DataError, match=r"image_class_labels.txt, line 13: 'oops'"):
        load_cub200(cub(tmp_path))
    labels.write_text(good)
    image = next((folder / "images" / CUB_CLASSES[1]).glob("*0005.jpg"))
    image.unlink()
    with pytest.raises(DataError, match=r"0005.jpg is missing \(listed in images.txt, image id 5"):
        load_cub200(cub(tmp_path))
    (folder / "train_test_split.txt").unlink()
    with pytest.raises(MissingSourceError, match=r"train_test_split.txt is missing.*re-extract"):
        load_cub200(cub(tmp_path))
    shutil.rmtree(folder / "images")
    (folder / "train_test_split.txt").write_text("1 1\n")
    with pytest.raises(MissingSourceError, match=r"images is missing"):
        load_cub200(cub(tmp_path))


def test_fixture_pixels_are_what_the_tests_assume(tmp_path: Path) -> None:
    """The JPEG fixture keeps its colour codes within the tolerance the tests use."""
    folder = make_cub(tmp_path)
    for path in sorted((folder / "images").rglob("*.jpg")):
        arr = np.asarray(Image.open(path).convert("RGB"), dtype=np.int64)
        i = int(path.stem[-4:])
        assert np.abs(arr[..., 0] - 18 * i).max() <= 3
