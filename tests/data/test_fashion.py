"""Fashion-MNIST: IDX reading, stratified splits, errors, fetching, CLI (generated fixtures)."""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from fedshift.cli import main
from fedshift.core.errors import DataError, MissingSourceError
from fedshift.data import load_dataset
from fedshift.data.common import debian
from fedshift.data.domains import fashion as fm
from fedshift.data.domains.fashion import FashionParams, load_fashion, locate_fashion

TRAIN_PER_CLASS, TEST_PER_CLASS = 6, 3


def idx_bytes(array: np.ndarray, magic: int) -> bytes:
    header = magic.to_bytes(4, "big") + b"".join(d.to_bytes(4, "big") for d in array.shape)
    return header + array.astype(np.uint8).tobytes()


def write_gz(path: Path, data: bytes) -> None:
    with gzip.open(path, "wb") as fh:
        fh.write(data)


def write_fixture(folder: Path, first_value: int = 0) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Four IDX.gz files: image i of a set is filled with the value ``first_value + i`` and
    labelled ``i % 10``, so every image is identifiable from its pixels."""
    folder.mkdir(parents=True, exist_ok=True)
    out = {}
    start = first_value
    for which, per_class in (("train", TRAIN_PER_CLASS), ("test", TEST_PER_CLASS)):
        n = 10 * per_class
        values = np.arange(start, start + n)
        start += n
        x = np.broadcast_to(values[:, None, None], (n, 28, 28)).astype(np.uint8)
        y = (np.arange(n) % 10).astype(np.uint8)
        images, labels = fm.FILES[which]
        write_gz(folder / images, idx_bytes(x, fm.IDX_IMAGES))
        write_gz(folder / labels, idx_bytes(y, fm.IDX_LABELS))
        out[which] = (x, y)
    return out


@pytest.fixture
def fixture_dir(tmp_path):
    folder = tmp_path / "fm"
    write_fixture(folder)
    return folder


def pixel_ids(split) -> list[int]:
    return (split.x[:, 0, 0, 0] * 255).round().long().tolist()


def test_reads_fixture_with_values_shapes_three_channels_and_strata(fixture_dir):
    params = FashionParams(train_size=20, val_size=10, test_size=10, data_dir=str(fixture_dir))
    fed = load_fashion(params)
    assert fed.name == "fashion-mnist" and fed.client_names == ["fashion-mnist"]
    assert fed.classes[0] == "T-shirt/top" and fed.classes[9] == "Ankle boot"
    assert fed.input_shape == (3, 28, 28) and fed.num_classes == 10
    c = fed.clients[0]
    assert c.train.x.shape == (20, 3, 28, 28) and c.train.x.dtype == torch.float32
    assert c.val.x.shape == (10, 3, 28, 28) and c.test.x.shape == (10, 3, 28, 28)
    for split, per_class in ((c.train, 2), (c.val, 1), (c.test, 1)):
        assert torch.bincount(split.y, minlength=10).tolist() == [per_class] * 10
        assert split.y.dtype == torch.int64
        assert torch.equal(split.x[:, 0], split.x[:, 1]) and torch.equal(
            split.x[:, 0], split.x[:, 2]
        )
        # every pixel of image i is i/255, and its label is i % 10
        ids = pixel_ids(split)
        assert torch.allclose(split.x, torch.tensor(ids)[:, None, None, None] / 255.0)
        assert [i % 10 for i in ids] == split.y.tolist()
    train, val, test = (set(pixel_ids(s)) for s in (c.train, c.val, c.test))
    assert not train & val  # disjoint, both from the 60-image training set
    assert max(train | val) < 60 <= min(test)  # test from the t10k set (ids 60..89)


def test_seed_moves_the_draw(fixture_dir):
    def draw(seed):
        p = FashionParams(train_size=20, val_size=10, test_size=10, seed=seed)
        p.data_dir = str(fixture_dir)
        return pixel_ids(load_fashion(p).clients[0].train)

    assert draw(0) == draw(0)
    assert sorted(draw(0)) != sorted(draw(1))


@pytest.mark.parametrize(
    ("name", "data", "match"),
    [
        ("train-images-idx3-ubyte.gz", b"not gzip at all", "not a readable gzip"),
        ("train-images-idx3-ubyte.gz", "magic", "magic number"),
        ("train-images-idx3-ubyte.gz", "truncated", "holds"),
        ("t10k-labels-idx1-ubyte.gz", "short", "images but"),
        ("train-images-idx3-ubyte.gz", "side", "expected 28x28"),
    ],
)
def test_malformed_file_is_a_data_error_naming_it(fixture_dir, name, data, match):
    path = fixture_dir / name
    if data == "magic":
        write_gz(path, idx_bytes(np.zeros((60, 28, 28)), fm.IDX_LABELS))
    elif data == "truncated":
        write_gz(path, idx_bytes(np.zeros((60, 28, 28)), fm.IDX_IMAGES)[:-5])
    elif data == "short":
        write_gz(path, idx_bytes(np.zeros(29), fm.IDX_LABELS))
    elif data == "side":
        write_gz(path, idx_bytes(np.zeros((60, 28, 27)), fm.IDX_IMAGES))
    else:
        path.write_bytes(data)
    params = FashionParams(train_size=20, val_size=10, test_size=10, data_dir=str(fixture_dir))
    with pytest.raises(DataError, match=match) as err:
        load_fashion(params)
    assert name in str(err.value)


def test_missing_files_name_the_apt_command_and_fetch(tmp_path, monkeypatch):
    with pytest.raises(MissingSourceError) as err:
        locate_fashion(tmp_path / "nowhere")
    msg = str(err.value)
    assert "sudo apt-get install dataset-fashion-mnist" in msg
    assert "fedshift data fetch fashion-mnist" in msg and "nowhere" in msg
    monkeypatch.setattr(fm, "SYSTEM_DIR", tmp_path / "system")
    monkeypatch.setenv("FEDSHIFT_CACHE", str(tmp_path / "cache"))
    with pytest.raises(MissingSourceError, match="apt-get install"):
        load_fashion(FashionParams())
    write_fixture(tmp_path / "cache" / "fashion-mnist")  # the cache is the fallback
    assert locate_fashion() == tmp_path / "cache" / "fashion-mnist"
    write_fixture(tmp_path / "system")  # the installed package comes first
    assert locate_fashion() == tmp_path / "system"


def test_sizes_beyond_a_class_are_refused(fixture_dir):
    with pytest.raises(DataError, match="dataset.train_size=50 \\+ dataset.val_size=20"):
        load_fashion(FashionParams(train_size=50, val_size=20, data_dir=str(fixture_dir)))
    with pytest.raises(DataError, match="dataset.test_size"):
        load_fashion(
            FashionParams(train_size=10, val_size=10, test_size=40, data_dir=str(fixture_dir))
        )
    with pytest.raises(DataError, match="dataset.val_size"):
        load_fashion(FashionParams(val_size=0, data_dir=str(fixture_dir)))


def test_registered_and_partitionable(fixture_dir):
    section = {"name": "fashion-mnist", "train_size": 40, "val_size": 20, "test_size": 20}
    section["data_dir"] = str(fixture_dir)
    fed = load_dataset(section, {"name": "classes", "clients": 5, "classes_per_client": 2})
    assert fed.client_names == [f"client0{i}" for i in range(5)]
    assert fed.info["dh"] == pytest.approx(100.0)  # 5 x 2 = 10 classes, none shared
    assert sum(len(c.train) for c in fed.clients) == 40


needs_dpkg = pytest.mark.skipif(shutil.which("dpkg-deb") is None, reason="needs dpkg-deb")


@needs_dpkg
def test_fetch_extracts_the_package_files_into_the_cache(tmp_path, monkeypatch, capsys):
    root = tmp_path / "pkg"
    write_fixture(root / "usr/share/datasets/fashion-mnist")
    (root / "usr/share/doc/x").mkdir(parents=True)
    (root / "usr/share/doc/x/README").write_text("not extracted")
    (root / "DEBIAN").mkdir()
    (root / "DEBIAN/control").write_text(
        "Package: dataset-fashion-mnist\nVersion: 1\nArchitecture: all\n"
        "Maintainer: test <t@example.org>\nDescription: fixture\n"
    )
    deb = tmp_path / "dataset-fashion-mnist_1_all.deb"
    subprocess.run(["dpkg-deb", "--build", str(root), str(deb)], check=True, capture_output=True)
    calls = []

    def fake_download(package, workdir, update=False):
        assert not update  # never apt-get update unasked
        calls.append(package)
        return Path(shutil.copy(deb, workdir))

    monkeypatch.setattr(fm, "apt_download", fake_download)
    monkeypatch.setattr(fm, "require_tools", lambda package, manual: None)
    cache = tmp_path / "cache"
    assert main(["data", "fetch", "fashion-mnist", "--cache", str(cache)]) == 0
    folder = cache / "fashion-mnist"
    assert sorted(p.name for p in folder.iterdir()) == sorted(fm.ALL_FILES)  # no .deb, no docs
    assert calls == ["dataset-fashion-mnist"]
    assert fm.fetch_fashion(cache) == folder and calls == ["dataset-fashion-mnist"]  # cached
    fed = load_fashion(
        FashionParams(train_size=10, val_size=10, test_size=10, data_dir=str(folder))
    )
    assert len(fed.clients[0].train) == 10
    assert "fashion-mnist files" in capsys.readouterr().out


def test_failed_download_names_the_install_command(tmp_path, monkeypatch):
    def fake_run(cmd, cwd):
        return subprocess.CompletedProcess(cmd, 100, "", "E: Unable to locate package")

    monkeypatch.setattr(debian, "run", fake_run)
    monkeypatch.setattr(debian.shutil, "which", lambda name: f"/usr/bin/{name}")
    with pytest.raises(MissingSourceError, match="sudo apt-get install dataset-fashion-mnist"):
        fm.fetch_fashion(tmp_path)


def test_cli_show_writes_a_montage_and_counts(fixture_dir, tmp_path, capsys):
    out = tmp_path / "m.png"
    args = ["train_size=20", "val_size=10", "test_size=10", f"data_dir={fixture_dir}"]
    assert main(["data", "show", "fashion-mnist", *args, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    report = json.loads(printed[: printed.rindex("}") + 1])
    assert report["sizes"] == {"train": 20, "val": 10, "test": 10}
    assert report["class_counts"]["train"] == [2] * 10
    assert out.stat().st_size > 1000
    assert main(["data", "build", "fashion-mnist"]) == 2


def test_real_package_files_if_present():
    try:
        folder = locate_fashion()
    except MissingSourceError:
        pytest.skip("Fashion-MNIST is not installed or fetched here")
    for which, n in (("train", 60000), ("test", 10000)):
        x, y = fm.load_source(folder, which)
        assert x.shape == (n, 28, 28)
        assert np.bincount(y, minlength=10).tolist() == [n // 10] * 10
