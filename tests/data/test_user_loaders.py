"""The generic loaders of users' data (``folders``, ``segfolders``, ``arrays``, and
``fedshift.run(federation=...)``) on trees generated here with Pillow and nibabel: PNG, JPEG,
TIFF, NIfTI; every bad input a clear error naming the file (or an explicit skip count); an
end-to-end run of each."""

from __future__ import annotations

import io
import os
import re
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
import torch
from PIL import Image

from fedshift.core.errors import ConfigError, DataError, MissingSourceError
from fedshift.data import dataset_task, load_dataset

# --------------------------------------------------------------------------------------------
# generated trees
# --------------------------------------------------------------------------------------------

CLASSES = ("cat", "dog")


def red(cls: int) -> int:
    """The red value of the images of class ``cls`` (so a test can read the label back)."""
    return 40 + 150 * cls


def save_image(path: Path, cls: int, i: int, site: int, kind: str, side: int = 16) -> Path:
    """A ``side x side`` image of class ``cls`` (red channel ``red(cls)``) as ``kind``: png,
    jpg, tif (8-bit RGB), tif16 (16-bit gray), gray (8-bit gray PNG), rgba."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rgb = np.zeros((side, side, 3), dtype=np.uint8)
    rgb[..., 0] = red(cls)
    rgb[..., 1] = 10 * i
    rgb[..., 2] = 100 * site
    if kind == "tif16":
        gray = np.full((side, side), red(cls) * 257, dtype=np.uint16)
        Image.fromarray(gray).save(path.with_suffix(".tif"))
        return path.with_suffix(".tif")
    if kind == "gray":
        Image.fromarray(rgb[..., 0]).save(path.with_suffix(".png"))
        return path.with_suffix(".png")
    if kind == "rgba":
        Image.fromarray(np.dstack([rgb, rgb[..., :1]])).save(path.with_suffix(".png"))
        return path.with_suffix(".png")
    out = path.with_suffix(f".{kind}")
    Image.fromarray(rgb).save(out, **({"quality": 95} if kind == "jpg" else {}))
    return out


def make_folders(root: Path, sites: dict[str, tuple[str, ...]], n: int = 12) -> Path:
    """``root/<site>/<class>/img_<i>``: per site, the kinds of image to cycle through; side
    16, or 20 for every third image (sizes differ)."""
    for s, (site, kinds) in enumerate(sites.items()):
        for c, cls in enumerate(CLASSES):
            for i in range(n):
                side = 20 if i % 3 == 2 else 16
                save_image(root / site / cls / f"img_{i:02d}", c, i, s, kinds[i % len(kinds)], side)
    return root


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """Two sites x two classes x 12 images: PNG and RGBA/gray PNG in one, JPEG and 8- and
    16-bit TIFF in the other (named with a space and capitals)."""
    return make_folders(
        tmp_path / "data", {"A": ("png", "gray", "rgba"), "Site B": ("jpg", "tif", "tif16")}
    )


def folders(root: Path, tmp_path: Path, **kw) -> dict:
    return {
        "name": "folders",
        "root": str(root),
        "size": 16,
        "cache_dir": str(tmp_path / "c"),
        **kw,
    }


# --------------------------------------------------------------------------------------------
# folders
# --------------------------------------------------------------------------------------------


def test_folders_reads_png_jpeg_tiff_and_splits_per_class(tree: Path, tmp_path: Path) -> None:
    fed = load_dataset(folders(tree, tmp_path))
    assert fed.client_names == ["a", "site_b"] and fed.classes == list(CLASSES)
    assert fed.input_shape == (3, 16, 16) and fed.task == "classification"
    # 12 per class: cut at int(0.64 12) = 7 and int(0.8 12) = 9 -> 7 / 2 / 3 per class
    assert fed.counts() == {c: {"train": 14, "val": 4, "test": 6} for c in ("a", "site_b")}
    for client in fed.clients:
        for split in ("train", "val", "test"):
            s = client.split(split)
            assert s.x.dtype == torch.float32 and s.x.min() >= 0 and s.x.max() <= 1
            reds = s.x[:, 0].mean(dim=(1, 2)) * 255  # the label is in the red channel
            want = torch.tensor([red(int(y)) for y in s.y], dtype=torch.float32)
            assert torch.allclose(reds, want, atol=3)  # JPEG moves a value by a few levels
    assert fed.info["site_folders"]["site_b"] == str(tree / "Site B")
    assert fed.info["skipped_files"] == {"a": 0, "site_b": 0}
    again = load_dataset(folders(tree, tmp_path, cache=False))
    assert all(
        torch.equal(a.train.x, b.train.x) for a, b in zip(fed.clients, again.clients, strict=True)
    )
    other = load_dataset(folders(tree, tmp_path, seed=1, cache=False))
    assert not torch.equal(fed.clients[0].test.x, other.clients[0].test.x)
    gray = load_dataset(folders(tree, tmp_path, channels=1, size=8, sites=["Site B"]))
    assert gray.input_shape == (1, 8, 8) and gray.client_names == ["site_b"]


def test_folders_sites_are_domains_for_the_domains_partition(tree: Path, tmp_path: Path) -> None:
    """A users' `folders` federation is dealt like digits and brain-mri (issue 31, Bai et
    al.'s partition): at lam 0 every client holds one site's images, at lam 1 every client
    holds an equal share of both; the clients partition the training images exactly."""
    from fedshift.data.partition import apply_partition

    fed = load_dataset(folders(tree, tmp_path))
    n = {s: len(fed.client(s).train) for s in fed.client_names}
    one = apply_partition(fed, {"name": "domains", "clients": 4, "lam": 0})
    for client, shares in one.info["domain_mix"].items():
        held = [s for s, k in shares.items() if k]
        assert len(held) == 1 and shares[held[0]] == n[held[0]] // 2, (client, shares)
    equal = apply_partition(fed, {"name": "domains", "clients": 4, "lam": 1})
    for shares in equal.info["domain_mix"].values():
        assert set(shares) == set(n) and all(abs(shares[s] - n[s] / 4) < 1 for s in n)
    for part in (one, equal):
        assert sum(len(c.train) for c in part.clients) == sum(n.values())


def test_folders_counts_and_names_skipped_files(tree: Path, tmp_path: Path, caplog) -> None:
    (tree / "A" / "cat" / "Thumbs.db").write_bytes(b"x")
    (tree / "A" / "dog" / "notes.txt").write_text("not an image")
    (tree / "A" / "dog" / ".hidden.png").write_bytes(b"x")  # hidden: ignored, not counted
    fed = load_dataset(folders(tree, tmp_path))
    assert re.search(r"skipped files that are not images: a: 2 \(.*Thumbs\.db", caplog.text)
    assert fed.info["skipped_files"] == {"a": 2, "site_b": 0}
    assert fed.info["skipped"]["not_images"]["a"][1].endswith("notes.txt")


@pytest.mark.parametrize("content", [b"", b"\xff\xd8 not really a jpeg"], ids=["0-byte", "corrupt"])
def test_folders_unreadable_image_is_an_error_or_an_explicit_skip(
    tree: Path, tmp_path: Path, content: bytes, caplog
) -> None:
    bad = tree / "Site B" / "dog" / "broken.jpg"
    bad.write_bytes(content)
    why = "the file is empty" if not content else "Pillow cannot read"
    with pytest.raises(DataError, match=rf"Site B/dog/broken\.jpg: {why}"):
        load_dataset(folders(tree, tmp_path))
    fed = load_dataset(folders(tree, tmp_path, skip_unreadable=True))
    assert re.search(r"unreadable images .* site_b: 1 \(.*broken\.jpg", caplog.text)
    assert fed.info["skipped_files"] == {"a": 0, "site_b": 1}
    assert fed.info["skipped"]["unreadable"]["site_b"] == [str(bad)]
    assert sum(fed.counts()["site_b"].values()) == 24  # 25 listed, one dropped
    cached = load_dataset(folders(tree, tmp_path, skip_unreadable=True))  # the cache knows it too
    assert cached.info["cache"]["site_b"]["hit"] and cached.info["skipped_files"]["site_b"] == 1
    assert torch.equal(cached.clients[1].train.x, fed.clients[1].train.x)


def test_folders_symlink_loop_is_an_error_naming_the_link(tree: Path, tmp_path: Path) -> None:
    link = tree / "A" / "cat" / "more"
    os.symlink(tree / "A", link)  # leads back to the site folder
    with pytest.raises(DataError, match=rf"{link} and {tree / 'A'} are one folder"):
        load_dataset(folders(tree, tmp_path))
    link.unlink()
    os.symlink(tree / "A" / "cat", link)  # to its own class folder
    with pytest.raises(DataError, match="symlink loop"):
        load_dataset(folders(tree, tmp_path))
    link.unlink()
    os.symlink(tmp_path / "gone.png", tree / "A" / "cat" / "dangling.png")
    with pytest.raises(DataError, match=r"cat/dangling\.png is a broken symbolic link"):
        load_dataset(folders(tree, tmp_path))
    (tree / "A" / "cat" / "dangling.png").unlink()
    extra = tmp_path / "elsewhere"
    make_folders(extra, {"x": ("png",)}, n=2)
    os.symlink(extra / "x" / "cat", tree / "A" / "cat" / "linked")  # a real folder: followed
    fed = load_dataset(folders(tree, tmp_path, cache=False))
    assert fed.info["available"]["a"]["train"] == 14 + 1  # 14 cats -> int(0.64 14) = 8


def test_folders_missing_class_names_site_and_class(tree: Path, tmp_path: Path) -> None:
    for f in (tree / "Site B" / "dog").iterdir():
        f.unlink()
    with pytest.raises(DataError, match=r"Site B/dog holds no image file.*allow_missing_classes"):
        load_dataset(folders(tree, tmp_path))
    (tree / "Site B" / "dog").rmdir()
    with pytest.raises(DataError, match=r"site 'site_b' \(.*Site B\) lacks \['dog'\]"):
        load_dataset(folders(tree, tmp_path))
    fed = load_dataset(folders(tree, tmp_path, allow_missing_classes=True))
    assert fed.classes == ["cat", "dog"] and fed.info["missing_classes"] == {"site_b": ["dog"]}
    assert set(fed.client("site_b").train.y.tolist()) == {0}
    # classes given: a node that loads one site has the same label space as the others
    kw = {"sites": ["Site B"], "classes": ["dog", "cat"]}
    alone = load_dataset(folders(tree, tmp_path, allow_missing_classes=True, **kw))
    assert alone.classes == ["dog", "cat"] and set(alone.clients[0].train.y.tolist()) == {1}
    with pytest.raises(DataError, match=r"'site_b' \(.*\) lacks \['dog'\] of dataset.classes"):
        load_dataset(folders(tree, tmp_path, **kw))
    save_image(tree / "Site B" / "bird" / "b0", 0, 0, 1, "png")
    with pytest.raises(DataError, match=r"lacks \['dog'\] and has extra \['bird'\]"):
        load_dataset(folders(tree, tmp_path))
    with pytest.raises(
        DataError, match=r"has the class folder\(s\) \['bird'\], which dataset.classes"
    ):
        load_dataset(folders(tree, tmp_path, classes=["cat", "dog"], allow_missing_classes=True))


def test_folders_layout_errors(tmp_path: Path) -> None:
    with pytest.raises(MissingSourceError, match=r"(?s)set dataset.root.*<site>/"):
        load_dataset({"name": "folders"})
    (tmp_path / "empty").mkdir()
    with pytest.raises(MissingSourceError, match="has no site folders"):
        load_dataset({"name": "folders", "root": str(tmp_path / "empty")})
    root = make_folders(tmp_path / "d", {"Site 1": ("png",), "site_1": ("png",)}, n=3)
    with pytest.raises(DataError, match=r"sites 'Site 1' and 'site_1' .* both give .* 'site_1'"):
        load_dataset(folders(root, tmp_path))
    with pytest.raises(MissingSourceError, match=r"site folder .*d/site 2 is missing"):
        load_dataset(folders(root, tmp_path, sites=["site_1", "site 2"]))
    with pytest.raises(ConfigError, match="dataset.channels"):
        load_dataset(folders(root, tmp_path, channels=2))


def test_folders_split_lists(tree: Path, tmp_path: Path) -> None:
    site = tree / "A"
    (site / "train.txt").write_text("# train\ncat/img_00.png\n./dog/img_00.png\ncat/img_03.png\n")
    (site / "val.txt").write_text("cat/img_06.png\n\ndog/img_06.png\n")
    (site / "test.txt").write_text("cat/img_09.png\ndog\\img_09.png\n")
    fed = load_dataset(folders(tree, tmp_path))
    a = fed.client("a")
    assert [len(a.train), len(a.val), len(a.test)] == [3, 2, 2]
    assert a.train.y.tolist() == [0, 1, 0] and a.test.y.tolist() == [0, 1]
    assert fed.info["unlisted"] == {"a": 24 - 7} and fed.counts()["site_b"]["train"] == 14
    assert fed.info["split"]["a"].startswith("lists")
    (site / "val.txt").write_text("cat/img_06.png\ncat/img_99.png\n")
    with pytest.raises(DataError, match=r"val\.txt, line 2: 'cat/img_99\.png' is not an image"):
        load_dataset(folders(tree, tmp_path))
    (site / "val.txt").write_text("cat/img_00.png\n")
    with pytest.raises(
        DataError, match=r"val\.txt, line 1: .* listed already \(train\.txt, line 2\)"
    ):
        load_dataset(folders(tree, tmp_path))
    (site / "val.txt").unlink()
    with pytest.raises(DataError, match=r"A lacks the split list\(s\) val\.txt"):
        load_dataset(folders(tree, tmp_path))
    fed = load_dataset(folders(tree, tmp_path, splits="fractions"))  # lists ignored
    assert fed.counts()["a"]["train"] == 14
    (site / "train.txt").unlink()
    (site / "test.txt").unlink()
    with pytest.raises(DataError, match="dataset.splits=lists needs them in every site"):
        load_dataset(folders(tree, tmp_path, splits="lists"))


def test_folders_cap_and_cache(tree: Path, tmp_path: Path) -> None:
    first = load_dataset(folders(tree, tmp_path, max_per_split=4))
    second = load_dataset(folders(tree, tmp_path, max_per_split=4))
    assert not first.info["cache"]["a"]["hit"] and second.info["cache"]["a"]["hit"]
    assert [len(c.train) for c in second.clients] == [4, 4]
    assert torch.bincount(second.clients[0].train.y).tolist() == [2, 2]  # stratified
    for a, b in zip(first.clients, second.clients, strict=True):
        assert torch.equal(a.train.x, b.train.x) and torch.equal(a.test.y, b.test.y)


# --------------------------------------------------------------------------------------------
# segfolders
# --------------------------------------------------------------------------------------------


def save_pair(site: Path, name: str, k: int, image_kind: str = "png", mask_kind: str = "png"):
    """A 16x20 image and its mask: values 0, 128 (rows 2-5) and 255 (rows 8-11, from column k)."""
    rgb = np.random.default_rng(k).integers(0, 255, (16, 20, 3), dtype=np.uint8)
    mask = np.zeros((16, 20), dtype=np.uint8)
    mask[2:6] = 128
    mask[8:12, k:] = 255
    for sub in ("images", "masks"):
        (site / sub).mkdir(parents=True, exist_ok=True)
    Image.fromarray(rgb).save(site / "images" / f"{name}.{image_kind}")
    Image.fromarray(mask).save(site / "masks" / f"{name}.{mask_kind}")


def save_volume(site: Path, name: str, shape=(16, 16, 10), fg=range(3, 7), scale=1.0) -> None:
    """A NIfTI volume (i, j, k) and its mask: class 1 in a box on slices ``fg`` of axis k,
    class 2 on slice fg[0] only."""
    for sub in ("images", "masks"):
        (site / sub).mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(len(name))
    vol = (rng.normal(size=shape) * scale + 100).astype(np.float32)
    mask = np.zeros(shape, dtype=np.uint8)
    for k in fg:
        mask[4:10, 5:12, k] = 1
    mask[1:3, 1:3, fg[0]] = 2
    nib.save(nib.Nifti1Image(vol, np.eye(4)), str(site / "images" / f"{name}.nii.gz"))
    nib.save(nib.Nifti1Image(mask, np.eye(4)), str(site / "masks" / f"{name}.nii.gz"))


@pytest.fixture
def segtree(tmp_path: Path) -> Path:
    root = tmp_path / "seg"
    for k in range(6):
        save_pair(root / "A", f"img{k}", k)
        save_pair(root / "B", f"img{k}", k, "tif", "tif")
    return root


def seg(root: Path, **kw) -> dict:
    return {"name": "segfolders", "root": str(root), "size": 16, **kw}


def test_segfolders_png_tiff_pairs_and_label_map(segtree: Path) -> None:
    fed = load_dataset(seg(segtree))
    assert fed.task == "segmentation" and dataset_task("segfolders") == "segmentation"
    assert fed.classes == ["background", "128", "255"] and fed.info["labels"] == [0, 128, 255]
    assert fed.input_shape == (3, 16, 16)
    # 6 images: cut at int(3.84) = 3, int(4.8) = 4 -> 3 / 1 / 2
    assert fed.counts() == {c: {"train": 3, "val": 1, "test": 2} for c in ("a", "b")}
    y = fed.client("a").train.y
    assert y.shape == (3, 16, 16) and set(y.unique().tolist()) == {0, 1, 2}
    named = load_dataset(seg(segtree, labels=[0, 255, 128], classes=["bg", "x", "y"]))
    assert named.classes == ["bg", "x", "y"]
    # the same pixels, classes 1 and 2 swapped by the labels' order
    assert torch.equal(named.client("a").train.y, torch.tensor([0, 2, 1])[y])
    with pytest.raises(DataError, match=r"img\d\.png \(the mask of .*img\d\.png\) holds the value"):
        load_dataset(seg(segtree, labels=[0, 255]))


def test_segfolders_nifti_slices_along_an_axis(tmp_path: Path) -> None:
    root = tmp_path / "vol"
    for c in range(5):
        save_volume(root / "ct", f"case{c}", scale=1 + c)
    fed = load_dataset(seg(root))
    # 5 volumes cut 3 / 1 / 1, 4 foreground slices each along k (the default axis 2)
    assert fed.counts() == {"ct": {"train": 12, "val": 4, "test": 4}}
    assert fed.classes == ["background", "1", "2"] and fed.info["pairs"]["ct"]["volumes"] == 5
    x = fed.clients[0].train.x
    assert x.min() >= 0 and x.max() <= 1 and torch.equal(x[:, 0], x[:, 2])  # gray copied
    every = load_dataset(seg(root, slices="all", channels=1))
    assert every.counts()["ct"] == {"train": 30, "val": 10, "test": 10}
    assert every.input_shape == (1, 16, 16)
    across = load_dataset(seg(root, axis=0))  # i: rows 4-9 and 1-2 hold a label
    assert across.counts()["ct"]["train"] == 3 * 8
    save_volume(root / "ct", "case5", shape=(16, 16, 9))
    (root / "ct" / "masks" / "case5.nii.gz").unlink()
    save_volume(tmp_path / "other", "case5", shape=(16, 15, 9))
    os.replace(
        tmp_path / "other" / "masks" / "case5.nii.gz", root / "ct" / "masks" / "case5.nii.gz"
    )
    with pytest.raises(
        DataError,
        match=r"case5\.nii\.gz has shape \(16, 16, 9\).*its mask .*case5\.nii\.gz has \(16, 15, 9",
    ):
        load_dataset(seg(root))


#: (damage, what the error says) for the test below
SEG_CASES = [
    ("size", r"A/images/img1\.png is 20x16 .* its mask .*A/masks/img1\.png is 12x16"),
    ("orphan image", r"A/images/img9\.png has no mask"),
    ("orphan mask", r"A/masks/img9\.png has no image"),
    ("jpeg mask", r"A/masks/img1\.jpg: a JPEG mask"),
    ("colour mask", r"A/masks/img1\.png: a colour mask"),
    ("0-byte image", r"A/images/img1\.png: the file is empty"),
    ("two names", r"img1\.png and .*img1\.tif are two images"),
    ("symlink loop", r"A/images/loop and .*A/images are one folder"),
    ("2-D with volume", r"img1\.png and its mask .*img1\.nii\.gz must both"),
    ("float mask", r"img1\.nii\.gz \(the mask of .*img1\.nii\.gz\) holds values that are not"),
    ("no masks folder", r"A/masks is missing"),
]


@pytest.mark.parametrize("damage, match", SEG_CASES, ids=[d for d, _ in SEG_CASES])
def test_segfolders_bad_inputs_name_the_files(segtree: Path, damage: str, match: str) -> None:
    site = segtree / "A"
    if damage == "size":
        Image.fromarray(np.zeros((16, 12), np.uint8)).save(site / "masks" / "img1.png")
    elif damage == "orphan image":
        save_pair(site, "img9", 1)
        (site / "masks" / "img9.png").unlink()
    elif damage == "orphan mask":
        save_pair(site, "img9", 1)
        (site / "images" / "img9.png").unlink()
    elif damage == "jpeg mask":
        (site / "masks" / "img1.png").rename(site / "masks" / "img1.jpg")
    elif damage == "colour mask":
        colour = np.zeros((16, 20, 3), np.uint8)
        colour[2:5, :, 0] = 255
        colour[6:9, :, 1] = 255
        Image.fromarray(colour).save(site / "masks" / "img1.png")
    elif damage == "0-byte image":
        (site / "images" / "img1.png").write_bytes(b"")
    elif damage == "two names":
        Image.fromarray(np.zeros((16, 20), np.uint8)).save(site / "images" / "img1.tif")
    elif damage == "symlink loop":
        os.symlink(site / "images", site / "images" / "loop")
    elif damage in ("2-D with volume", "float mask"):
        (site / "masks" / "img1.png").unlink()
        data = np.zeros((16, 20, 1), np.float32) + (0.5 if damage == "float mask" else 0)
        if damage == "float mask":
            (site / "images" / "img1.png").unlink()
            nib.save(nib.Nifti1Image(data + 1, np.eye(4)), str(site / "images" / "img1.nii.gz"))
        nib.save(nib.Nifti1Image(data, np.eye(4)), str(site / "masks" / "img1.nii.gz"))
    elif damage == "no masks folder":
        for f in (site / "masks").iterdir():
            f.unlink()
        (site / "masks").rmdir()
    with pytest.raises(DataError, match=match):
        load_dataset(seg(segtree))


def test_segfolders_split_lists_by_name(segtree: Path) -> None:
    site = segtree / "B"
    (site / "train.txt").write_text("img0\nimg1.tif\nimg2\n")
    (site / "val.txt").write_text("img3\n")
    (site / "test.txt").write_text("img4\n")
    fed = load_dataset(seg(segtree))
    assert fed.counts()["b"] == {"train": 3, "val": 1, "test": 1}
    assert fed.info["split"]["b"] == "lists"
    (site / "test.txt").write_text("img4\nimg0\n")
    with pytest.raises(DataError, match=r"test\.txt, line 2: 'img0' is listed already"):
        load_dataset(seg(segtree))


# --------------------------------------------------------------------------------------------
# arrays
# --------------------------------------------------------------------------------------------


def class_images(n: int, seed: int, nhwc: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """uint8 images whose red channel is ``red(label)``."""
    y = np.arange(n) % 3
    x = np.random.default_rng(seed).integers(0, 255, (n, 3, 12, 12), dtype=np.uint8)
    x[:, 0] = np.asarray([red(int(v) % 2) for v in y], dtype=np.uint8)[:, None, None]
    return (x.transpose(0, 2, 3, 1).copy() if nhwc else x), y


def test_arrays_npz_and_npy_sites(tmp_path: Path) -> None:
    root = tmp_path / "arr"
    root.mkdir()
    x, y = class_images(30, 0, nhwc=True)
    split = np.asarray(["train"] * 18 + ["val"] * 6 + ["test"] * 6)
    np.savez(root / "Hospital 1.npz", x=x, y=y, split=split)
    (root / "h2").mkdir()
    x2, y2 = class_images(25, 1)
    np.save(root / "h2" / "x.npy", x2)
    np.save(root / "h2" / "y.npy", y2)
    fed = load_dataset({"name": "arrays", "root": str(root)})
    assert fed.client_names == ["hospital_1", "h2"] and fed.input_shape == (3, 12, 12)
    assert fed.classes == ["0", "1", "2"]
    assert fed.counts()["hospital_1"] == {"train": 18, "val": 6, "test": 6}
    # 25 examples, classes of 9 / 8 / 8: cut per class at int(0.64 n), int(0.8 n)
    assert fed.counts()["h2"] == {"train": 5 + 5 + 5, "val": 2 + 1 + 1, "test": 2 + 2 + 2}
    h1 = fed.client("hospital_1").train
    assert torch.equal(h1.x, torch.from_numpy(x[:18].transpose(0, 3, 1, 2)).float() / 255)
    assert (
        fed.info["fingerprint"]
        == load_dataset({"name": "arrays", "root": str(root)}).info["fingerprint"]
    )
    np.save(root / "h2" / "split.npy", np.asarray([0] * 20 + [1, 1, 2, 2, 2]))
    fed = load_dataset({"name": "arrays", "root": str(root), "sites": ["h2"], "size": 8})
    assert fed.counts() == {"h2": {"train": 20, "val": 2, "test": 3}}
    assert fed.input_shape == (3, 8, 8)


def test_arrays_segmentation_channels_and_resize(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    root = tmp_path / "seg"
    root.mkdir()
    gray = rng.random((10, 16, 16)).astype(np.float32)
    masks = (gray > 0.5).astype(np.int64)
    np.savez(root / "a.npz", x=gray, y=masks)
    np.savez(root / "b.npz", x=rng.integers(0, 255, (10, 16, 16, 3), dtype=np.uint8), y=masks)
    section = {"name": "arrays", "root": str(root), "task": "segmentation"}
    fed = load_dataset(section)
    assert fed.task == "segmentation" and fed.input_shape == (3, 16, 16)  # gray copied
    assert fed.classes == ["background", "1"]
    a = fed.client("a")
    assert torch.equal(a.train.x[:, 0], a.train.x[:, 1])
    assert torch.equal(a.train.y, (a.train.x[:, 0] > 0.5).long())  # labels stay paired
    small = load_dataset({**section, "size": 8, "channels": 1, "max_per_split": 2})
    assert small.input_shape == (1, 8, 8) and small.clients[0].train.y.shape == (2, 8, 8)
    with pytest.raises(
        DataError, match=r"a\.npz: y has shape \(10, 16, 16\).*set dataset.task=segmentation"
    ):
        load_dataset({"name": "arrays", "root": str(root)})


@pytest.mark.parametrize(
    "arrays, match",
    [
        (
            {"x": np.full((6, 8, 8), 2.0), "y": np.zeros(6, int)},
            r"s\.npz: x is float with values outside \[0, 1\]",
        ),
        (
            {"x": np.zeros((6, 3, 8, 3), np.uint8), "y": np.zeros(6, int)},
            r"s\.npz: x has shape .*cannot tell which axis",
        ),
        (
            {"x": np.zeros((6, 8, 8), np.uint8), "y": np.zeros(5, int)},
            r"s\.npz: y has shape \(5,\)",
        ),
        (
            {"x": np.zeros((6, 8, 8), np.uint8), "y": -np.ones(6, int)},
            r"s\.npz: y holds the negative label -1",
        ),
        (
            {"x": np.zeros((6, 8, 8), np.uint8), "y": np.zeros(6, np.float32)},
            r"s\.npz: y has dtype float32",
        ),
        (
            {
                "x": np.zeros((6, 8, 8), np.uint8),
                "y": np.zeros(6, int),
                "split": np.asarray(["train", "dev"] * 3),
            },
            r"s\.npz: split holds \['dev'\]",
        ),
        (
            {"x": np.zeros((6, 8, 8), np.uint8), "y": np.zeros(6, int), "split": np.zeros(6, int)},
            r"s\.npz: site 's' \(6 examples\) gets an empty val split",
        ),
        (
            {"x": np.zeros((6, 8, 8), np.uint8), "y": np.zeros(6, int), "labels": np.zeros(6)},
            r"s\.npz holds the arrays .*rename or drop \['labels'\]",
        ),
        ({"x": np.zeros((6, 8, 8), np.int32), "y": np.zeros(6, int)}, r"s\.npz: x has dtype int32"),
        (
            {"x": np.array([None] * 6, dtype=object), "y": np.zeros(6, int)},
            r"s\.npz: not a readable \.npz of plain arrays",
        ),
    ],
    ids=[
        "float-range",
        "layout",
        "y-length",
        "negative",
        "y-float",
        "split-name",
        "empty-split",
        "extra-array",
        "x-int32",
        "object-array",
    ],
)
def test_arrays_bad_inputs_name_the_file(tmp_path: Path, arrays: dict, match: str) -> None:
    np.savez(tmp_path / "s.npz", **arrays)
    with pytest.raises(DataError, match=match):
        load_dataset({"name": "arrays", "root": str(tmp_path)})


def test_arrays_classes_bound_the_labels_and_files_errors(tmp_path: Path) -> None:
    x, y = class_images(12, 0)
    np.savez(tmp_path / "s.npz", x=x, y=y)
    with pytest.raises(
        DataError, match=r"s\.npz: y holds the label 2, but dataset.classes names 2"
    ):
        load_dataset({"name": "arrays", "root": str(tmp_path), "classes": ["a", "b"]})
    (tmp_path / "t.npz").write_bytes(b"")
    with pytest.raises(DataError, match=r"t\.npz: not a readable \.npz"):
        load_dataset({"name": "arrays", "root": str(tmp_path)})
    (tmp_path / "empty").mkdir()
    with pytest.raises(MissingSourceError, match="holds no <site>.npz"):
        load_dataset({"name": "arrays", "root": str(tmp_path / "empty")})
    with pytest.raises(
        DataError, match="dataset.source=python: this run's arrays were given in Python"
    ):
        load_dataset({"name": "arrays", "source": "python", "fingerprint": "0" * 64})


# --------------------------------------------------------------------------------------------
# end to end: fedshift run on folders and segfolders, fedshift.run(federation=...)
# --------------------------------------------------------------------------------------------


def cli(*argv: str) -> tuple[int, str]:
    from fedshift.cli import main

    out = io.StringIO()
    with redirect_stdout(out), redirect_stderr(out):
        code = main(list(argv))
    return code, out.getvalue()


TINY = ("train.rounds=1", "train.batch_size=8", "train.local_steps=2", "--quiet")


@pytest.mark.slow
def test_fedshift_run_on_folders_and_segfolders(
    tree: Path, segtree: Path, tmp_path: Path, monkeypatch, one_thread
) -> None:
    monkeypatch.setenv("FEDSHIFT_CACHE", str(tmp_path / "cache"))
    out = str(tmp_path / "runs")
    code, text = cli(
        "run", "dataset.name=folders", f"dataset.root={tree}", "dataset.size=28",
        "model.name=cnn", "model.width=4", "--out", out, *TINY,
    )  # fmt: skip
    assert code == 0, text
    code, text = cli(
        "run", "dataset.name=segfolders", f"dataset.root={segtree}", "dataset.size=16",
        "model.name=unet", "model.width=4", "--out", out, *TINY,
    )  # fmt: skip
    assert code == 0, text
    assert len(list(Path(out).glob("*/*/summary.json"))) == 2
    (tree / "A" / "cat" / "img_00.png").write_bytes(b"")  # a bad file: a message, no traceback
    code, text = cli("run", "dataset.name=folders", f"dataset.root={tree}", "--out", out, *TINY)
    assert code == 2 and "A/cat/img_00.png: the file is empty" in text and "Traceback" not in text


def test_run_with_arrays_records_the_data_and_resumes_with_it(tmp_path: Path, one_thread) -> None:
    import fedshift
    from fedshift.runtime.simulation import resume_experiment

    xa, ya = class_images(30, 0, nhwc=True)
    xb, yb = class_images(30, 1)
    data = {
        "Site A": (xa, ya),
        "b": {
            "train": (torch.from_numpy(xb[:18]).float() / 255, torch.from_numpy(yb[:18])),
            "val": (torch.from_numpy(xb[18:24]).float() / 255, torch.from_numpy(yb[18:24])),
            "test": (torch.from_numpy(xb[24:]).float() / 255, torch.from_numpy(yb[24:])),
        },
    }
    config = {
        "model": {"name": "cnn", "width": 4},
        "dataset": {"size": 28},
        "train": {"rounds": 2, "batch_size": 8, "local_steps": 2},
    }
    out = tmp_path / "runs"
    first = fedshift.run(config, federation=data, out=out)
    dataset = first.summary["config"]["dataset"]
    assert dataset["name"] == "arrays" and dataset["source"] == "python"
    assert len(dataset["fingerprint"]) == 64 and first.summary["clients"] == ["site_a", "b"]
    assert "source: python" in (first.run_dir / "config.yaml").read_text()
    again = fedshift.run(config, federation=data, out=out, exists="new")
    assert again.summary["test_mean"] == first.summary["test_mean"]  # reproducible
    longer = fedshift.run(config, ["train.rounds=3"], federation=data, out=tmp_path / "long")
    resumed = fedshift.resume(first.run_dir, federation=data, rounds=3)
    keys = ("best_round", "test_mean", "val_mean", "test_per_client", "models")
    assert {k: resumed.summary[k] for k in keys} == {k: longer.summary[k] for k in keys}
    with pytest.raises(DataError, match="are not the ones this run was started with"):
        fedshift.resume(first.run_dir, federation={"Site A": (xa, ya)}, rounds=4)
    with pytest.raises(DataError, match=r"fedshift.resume\(run_dir, federation=...\)"):
        resume_experiment(first.run_dir, rounds=4, progress=False)
    saved = fedshift.load_run(first.run_dir).rebuild(federation=data)
    assert saved.fed.client_names == ["site_a", "b"]
    with pytest.raises(ConfigError, match="the config names dataset 'toyshift'"):
        fedshift.run({"dataset": {"name": "toyshift"}}, federation=data, out=out)
    with pytest.raises(DataError, match=r"federation\['b'\]: expected \(x, y\)"):
        fedshift.run(config, federation={"b": [xa]}, out=out)
