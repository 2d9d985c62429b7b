"""Tests of the offline digits benchmark (no network, no opencv-doc needed)."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from fedshift.core.errors import DataError, MissingSourceError
from fedshift.core.federation import SPLITS, Federation
from fedshift.data.common import debian
from fedshift.data.common.cache import cache_dir
from fedshift.data.common.sampling import class_quota, split_indices
from fedshift.data.digits import (
    CLASSES,
    DOMAINS,
    DigitsParams,
    build_digits,
    fetch_opencv,
    load_digits,
    pool_dir,
    show_digits,
)
from fedshift.data.digits import sources as ds

LOCAL = ["mnist", "mnistm", "optdigits", "synth"]  # domains that need no download
GRAY = ("mnist", "optdigits", "opencv")


def _clear_caches() -> None:
    """Forget in-process caches so that a build really re-reads and re-renders everything."""
    for fn in (ds.load_mnist_source, ds.usable_fonts, ds.reference_features, ds._font):
        fn.cache_clear()


@pytest.fixture(scope="module")
def params(tmp_path_factory) -> DigitsParams:
    cache = tmp_path_factory.mktemp("cache")
    return DigitsParams(
        domains=list(LOCAL),
        train_size=100,
        val_size=50,
        test_size=100,
        seed=0,
        synth_pool=500,
        cache_dir=str(cache),
    )


@pytest.fixture(scope="module")
def fed(params) -> Federation:
    return load_digits(params, progress=False)


@pytest.fixture
def no_system_opencv(monkeypatch, tmp_path):
    """Pretend the Debian opencv-doc package is not installed."""
    monkeypatch.setattr(ds, "OPENCV_SYSTEM_PNG", tmp_path / "absent" / "digits.png")


def _pool(folder: Path, domain: str) -> tuple[np.ndarray, np.ndarray]:
    return np.load(folder / f"{domain}_x.npy"), np.load(folder / f"{domain}_y.npy")


def _image_keys(split) -> set[bytes]:
    pixels = (split.x * 255).round().to(torch.uint8).numpy()
    return {img.tobytes() for img in pixels}


# ------------------------------------------------------------------------------ federation


def test_federation_shapes_dtypes_and_range(fed, params):
    assert fed.name == "digits"
    assert fed.client_names == LOCAL
    assert fed.classes == CLASSES and fed.input_shape == (3, 28, 28)
    for client in fed.clients:
        for name in SPLITS:
            split = client.split(name)
            assert len(split) == params.sizes()[name]
            assert split.x.dtype == torch.float32 and split.y.dtype == torch.int64
            assert split.x.shape[1:] == (3, 28, 28)
            assert split.x.min() >= 0.0 and split.x.max() <= 1.0
            assert split.x.max() > 0.9  # scaled from 0-255, not left in raw units
            assert set(split.y.tolist()) <= set(range(10))
        gray = torch.equal(client.train.x[:, 0], client.train.x[:, 1])
        assert gray == (client.name in GRAY), client.name


def test_pool_sizes_and_info(fed, params):
    assert fed.info["pool_sizes"] == {
        "mnist": 2500,
        "mnistm": 2500,
        "optdigits": 1797,
        "synth": 500,
    }
    assert Path(fed.info["cache"]) == pool_dir(params)
    assert fed.info["sources"]["mnist"][0]["path"] == "data/data/mnist_5k.csv.gz"
    assert pool_dir(params).name == "v1-seed0-synth500"


def test_label_balance_per_split(fed, params):
    for client in fed.clients:
        for name in SPLITS:
            counts = np.bincount(client.split(name).y.numpy(), minlength=10)
            assert counts.tolist() == class_quota(params.sizes()[name]).tolist(), client.name


def test_class_quota_uneven_is_even_and_deterministic():
    assert class_quota(43).tolist() == [5, 5, 5, 4, 4, 4, 4, 4, 4, 4]
    y = np.repeat(np.arange(10), 30)
    idx = split_indices(y, {"train": 43, "val": 17, "test": 21}, np.random.default_rng(1))
    again = split_indices(y, {"train": 43, "val": 17, "test": 21}, np.random.default_rng(1))
    for name, size in (("train", 43), ("val", 17), ("test", 21)):
        assert len(idx[name]) == size
        counts = np.bincount(y[idx[name]], minlength=10)
        assert counts.max() - counts.min() <= 1
        assert np.array_equal(idx[name], again[name])
    assert not set(idx["train"]) & set(idx["val"]) and not set(idx["val"]) & set(idx["test"])
    assert not set(idx["train"]) & set(idx["test"])


def test_no_image_shared_between_splits(fed):
    for client in fed.clients:
        keys = {name: _image_keys(client.split(name)) for name in SPLITS}
        for name in SPLITS:
            assert len(keys[name]) == len(client.split(name)), f"{client.name} {name} repeats"
        assert not keys["train"] & keys["val"], client.name
        assert not keys["train"] & keys["test"], client.name
        assert not keys["val"] & keys["test"], client.name


def test_splits_are_seeded_and_test_set_is_stable(fed, params):
    again = load_digits(params, progress=False)
    assert torch.equal(again.client("synth").train.x, fed.client("synth").train.x)
    bigger = load_digits(replace(params, train_size=150), progress=False)
    assert torch.equal(bigger.client("mnist").test.x, fed.client("mnist").test.x)
    assert len(bigger.client("mnist").train) == 150
    reordered = load_digits(replace(params, domains=["synth", "mnist"]), progress=False)
    assert reordered.client_names == ["synth", "mnist"]
    assert torch.equal(reordered.client("mnist").val.x, fed.client("mnist").val.x)


def test_clients_get_different_splits_by_domain_name(fed):
    # same pool size and labels for mnist and mnistm: a domain-independent seed would give the
    # same index order for both
    a, b = fed.client("mnist").train.y, fed.client("mnistm").train.y
    assert not torch.equal(a, b)


# ------------------------------------------------------------------------------ recipes


def test_mnist_and_mnistm_use_disjoint_halves(tmp_path, monkeypatch):
    """With a constant photo the MNIST-M blend is invertible: recover its source digits."""
    photo = np.empty((64, 64, 3), np.uint8)
    photo[..., 0], photo[..., 1], photo[..., 2] = 255, 0, 100
    monkeypatch.setattr(ds, "load_photos", lambda: ([photo], []))
    params = DigitsParams(domains=["mnist", "mnistm"], cache_dir=str(tmp_path))
    folder = build_digits(params, progress=False)
    mx, my = _pool(folder, "mnist")
    nx, ny = _pool(folder, "mnistm")
    digit = nx[:, 1]  # |0 - d| = d
    assert np.array_equal(nx[:, 0], 255 - digit)  # |255 - d|
    assert np.array_equal(nx[:, 2].astype(int), np.abs(100 - digit.astype(int)))
    src_x, src_y = ds.load_mnist_source()
    source = {img.tobytes(): int(lab) for img, lab in zip(src_x, src_y, strict=True)}
    first = {img.tobytes() for img in mx[:, 0]}
    second = {img.tobytes() for img in digit}
    assert len(first) == len(second) == 2500
    assert not first & second
    assert first | second == set(source)
    assert all(source[img.tobytes()] == lab for img, lab in zip(digit, ny, strict=True))
    assert np.bincount(my).tolist() == np.bincount(ny).tolist() == [250] * 10


def test_real_mnistm_is_coloured_digit_texture(params, fed):
    x, _ = _pool(pool_dir(params), "mnistm")
    assert (x[:, 0] != x[:, 1]).mean() > 0.3  # colour photo patches, not gray
    assert fed.info["sources"]["mnistm"][1]["package"] in {"matplotlib", "scikit-image"}


def test_optdigits_is_bilinear_upsample_of_8x8(params):
    x, y = _pool(pool_dir(params), "optdigits")
    images, labels = ds.load_optdigits_source()
    assert np.array_equal(y, labels)
    assert images.shape == (1797, 8, 8) and images.max() == 16
    scaled = torch.from_numpy(images[:, None] * 255.0 / 16.0)
    up = torch.nn.functional.interpolate(
        scaled, size=(28, 28), mode="bilinear", align_corners=False
    )
    expected = up[:, 0].round().clamp(0, 255).numpy()
    assert np.abs(x[:, 0].astype(float) - expected).max() <= 1
    assert x.max() == 255


def test_byte_identical_rebuild(params, fed, tmp_path):
    _clear_caches()
    other = replace(params, cache_dir=str(tmp_path))
    folder_a = build_digits(params, progress=False)
    folder_b = build_digits(other, progress=False)
    names_a = sorted(p.name for p in folder_a.iterdir())
    assert names_a == sorted(p.name for p in folder_b.iterdir())
    assert "manifest.json" in names_a and "synth_x.npy" in names_a
    for name in names_a:
        assert (folder_a / name).read_bytes() == (folder_b / name).read_bytes(), name


def test_seed_changes_the_pools(params, tmp_path):
    other = replace(params, domains=["mnist"], seed=1, cache_dir=str(tmp_path))
    x1, _ = _pool(build_digits(other, progress=False), "mnist")
    x0, _ = _pool(pool_dir(params), "mnist")
    assert not np.array_equal(x0, x1)


def test_checksum_mismatch_raises_and_force_repairs(params, fed, tmp_path):
    shutil.copytree(params.cache_root(), tmp_path, dirs_exist_ok=True)
    copy = replace(params, cache_dir=str(tmp_path))
    target = pool_dir(copy) / "mnist_x.npy"
    data = bytearray(target.read_bytes())
    data[-1] ^= 0xFF
    target.write_bytes(bytes(data))
    with pytest.raises(DataError, match="fedshift data build digits --force"):
        load_digits(copy, progress=False)
    build_digits(replace(copy, domains=["mnist"]), progress=False, force=True)
    assert torch.equal(
        load_digits(copy, progress=False).client("mnist").test.x, fed.client("mnist").test.x
    )


# ------------------------------------------------------------------------------ fonts


@pytest.mark.parametrize(
    "name", ["cmsy10.ttf", "cmex10.ttf", "DejaVuSansDisplay.ttf", "STIXSizOneSymReg.ttf"]
)
def test_glyph_check_rejects_fonts_without_real_digits(name):
    path = ds.font_dir() / name
    assert path.is_file()
    check = ds.check_font(path)
    assert not check.ok, check.reason
    assert path not in ds.usable_fonts()


@pytest.mark.parametrize("name", ["DejaVuSans.ttf", "DejaVuSerif.ttf", "DejaVuSans-Oblique.ttf"])
def test_glyph_check_accepts_digit_fonts(name):
    path = ds.font_dir() / name
    assert ds.check_font(path).ok
    assert path in ds.usable_fonts()


def test_glyph_check_rejects_remapped_digits(tmp_path, monkeypatch):
    """A font that draws real digits under the wrong codes (1 for 0, 2 for 1...) fails."""
    ds.reference_features()  # the reference itself is rendered unpatched
    real = ds.render_glyph
    path = ds.font_dir() / "DejaVuSans.ttf"
    monkeypatch.setattr(ds, "render_glyph", lambda p, c: real(p, str((int(c) + 1) % 10)))
    assert not ds.check_font(path).ok


def test_glyph_check_rejects_identical_digits(monkeypatch):
    """A font that draws one glyph for every digit (like LastResort's boxes) fails as such."""
    ds.reference_features()
    real = ds.render_glyph
    monkeypatch.setattr(ds, "render_glyph", lambda p, c: real(p, "8"))
    check = ds.check_font(ds.font_dir() / "DejaVuSans.ttf")
    assert not check.ok and "look the same" in check.reason


# ------------------------------------------------------------------------------ opencv


def _fake_sheet() -> np.ndarray:
    """A 1000x2000 sheet whose cell (r, c) is filled with a value coding (r, c)."""
    rows, cols = np.meshgrid(np.arange(50), np.arange(100), indexing="ij")
    values = (1 + (rows * 100 + cols) % 250).astype(np.uint8)
    return np.kron(values, np.ones((20, 20), np.uint8))


def test_opencv_sheet_parser(tmp_path, no_system_opencv):
    sheet = _fake_sheet()
    png = ds.opencv_cache_png(tmp_path)
    png.parent.mkdir(parents=True)
    Image.fromarray(sheet).save(png)
    params = DigitsParams(domains=["opencv"], cache_dir=str(tmp_path))
    x, y = _pool(build_digits(params, progress=False), "opencv")
    assert x.shape == (5000, 3, 28, 28) and x.dtype == np.uint8
    assert np.bincount(y).tolist() == [500] * 10
    i = np.arange(5000)
    r, c = i // 100, i % 100
    assert np.array_equal(y, r // 5)
    expected = (1 + (r * 100 + c) % 250).astype(np.uint8)
    assert (x[:, :, 4:24, 4:24] == expected[:, None, None, None]).all()
    border = x.copy()
    border[:, :, 4:24, 4:24] = 0
    assert not border.any()  # 20x20 cell centred with a 4 px zero frame
    fed = load_digits(params, progress=False)
    assert fed.counts() == {"opencv": {"train": 750, "val": 250, "test": 500}}


def test_opencv_sheet_of_wrong_size_is_rejected():
    with pytest.raises(DataError, match="fedshift data fetch opencv"):
        ds.parse_opencv_sheet(np.zeros((1000, 1000), np.uint8))


def test_missing_opencv_names_the_fetch_command(tmp_path, no_system_opencv):
    params = DigitsParams(domains=["mnist", "opencv"], cache_dir=str(tmp_path))
    with pytest.raises(MissingSourceError, match="fedshift data fetch opencv") as err:
        load_digits(params, progress=False)
    assert "opencv-doc" in str(err.value)
    assert not (pool_dir(params) / "mnist_x.npy").exists()  # fails before building anything


@pytest.fixture
def apt_tools(monkeypatch):
    """apt-get, dpkg-deb and tar present (the commands themselves are faked by each test)."""
    real = shutil.which
    monkeypatch.setattr(
        debian.shutil, "which", lambda n: f"/usr/bin/{n}" if n in debian.TOOLS else real(n)
    )


def _fake_apt(calls: list, lists_current: bool):
    """``debian.run`` standing in for apt-get: ``download`` succeeds once the package lists
    are current (from the start, or after an ``update``)."""
    state = {"current": lists_current}

    def fake_run(cmd, cwd):
        calls.append(cmd[1])
        if cmd[1] == "update":
            state["current"] = True
            return subprocess.CompletedProcess(cmd, 0, "", "")
        if state["current"]:
            (cwd / "opencv-doc_4.6.0_all.deb").write_bytes(b"deb")
            return subprocess.CompletedProcess(cmd, 0, "", "")
        return subprocess.CompletedProcess(cmd, 100, "", "E: Unable to locate package opencv-doc")

    return fake_run


def _fake_extract(deb, workdir):
    assert deb.is_file()
    png = workdir / "digits.png"
    Image.fromarray(_fake_sheet()).save(png)
    return png


def test_fetch_opencv_downloads_and_cleans_up_without_apt_update(tmp_path, monkeypatch, apt_tools):
    """`apt-get download` only (never `apt-get update` unasked); the sheet lands in the cache,
    the .deb and the temporary folder are gone; a second fetch downloads nothing."""
    calls: list = []
    monkeypatch.setattr(debian, "run", _fake_apt(calls, lists_current=True))
    monkeypatch.setattr(ds, "extract_opencv_png", _fake_extract)
    dest = fetch_opencv(tmp_path)
    assert dest == tmp_path / "sources" / "opencv" / "digits.png"
    assert calls == ["download"]
    assert ds.read_opencv_sheet(dest).shape == (1000, 2000)
    assert not list(tmp_path.rglob("*.deb")) and not list(tmp_path.rglob(".fetch-*"))
    assert fetch_opencv(tmp_path) == dest and calls == ["download"]  # cached


def test_fetch_opencv_with_old_lists_says_how_to_update_and_apt_update_does(
    tmp_path, monkeypatch, apt_tools, capsys
):
    """Package lists that lack the package: the error names `sudo apt-get update` and
    --apt-update, and runs no update itself; `fedshift data fetch opencv --apt-update`
    updates, then downloads."""
    from fedshift.cli import main

    calls: list = []
    monkeypatch.setattr(debian, "run", _fake_apt(calls, lists_current=False))
    monkeypatch.setattr(ds, "extract_opencv_png", _fake_extract)
    with pytest.raises(MissingSourceError, match=r"sudo apt-get update.*--apt-update") as err:
        fetch_opencv(tmp_path)
    assert "Unable to locate package" in str(err.value)
    assert calls == ["download"]
    calls.clear()
    assert main(["data", "fetch", "opencv", "--cache", str(tmp_path), "--apt-update"]) == 0
    assert calls == ["update", "download"]
    assert "opencv digits sheet:" in capsys.readouterr().out


def test_fetch_without_apt_says_what_it_needs_and_how_to_do_without(tmp_path, monkeypatch, capsys):
    """On a system without apt-get (or dpkg-deb, tar), `fedshift data fetch` runs nothing and
    says what it needs and where to put the files by hand, for both fetchable sources."""
    from fedshift.cli import main

    real = shutil.which
    monkeypatch.setattr(debian.shutil, "which", lambda n: None if n == "apt-get" else real(n))
    monkeypatch.setattr(debian, "run", lambda cmd, cwd: pytest.fail(f"ran {cmd}"))
    assert main(["data", "fetch", "opencv", "--cache", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "needs apt-get, dpkg-deb, tar (a Debian or Ubuntu system)" in err
    assert "this system has no apt-get" in err
    assert str(tmp_path / "sources" / "opencv" / "digits.png") in err
    assert "dataset.domains=[mnist,mnistm,optdigits,synth]" in err
    assert main(["data", "fetch", "fashion-mnist", "--cache", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "dataset-fashion-mnist needs apt-get" in err
    assert "train-images-idx3-ubyte.gz" in err and "dataset.data_dir" in err


def test_fetch_opencv_failure_is_a_missing_source(tmp_path, monkeypatch, apt_tools):
    def failing(cmd, cwd):
        return subprocess.CompletedProcess(cmd, 100, "", "E: no network")

    monkeypatch.setattr(debian, "run", failing)
    with pytest.raises(MissingSourceError, match="apt-get download opencv-doc"):
        fetch_opencv(tmp_path)


@pytest.mark.skipif(not (shutil.which("dpkg-deb") and shutil.which("tar")), reason="no dpkg")
def test_extract_opencv_png_from_a_deb(tmp_path):
    root = tmp_path / "pkg"
    (root / "DEBIAN").mkdir(parents=True)
    (root / "DEBIAN" / "control").write_text(
        "Package: opencv-doc\nVersion: 0.0\nArchitecture: all\n"
        "Maintainer: test <t@example.org>\nDescription: test\n"
    )
    target = root / ds.OPENCV_MEMBER
    target.parent.mkdir(parents=True)
    Image.fromarray(_fake_sheet()).save(target)
    (root / "usr/share/doc/opencv-doc/other.txt").write_text("not extracted")
    deb = tmp_path / "opencv-doc_0.0_all.deb"
    subprocess.run(["dpkg-deb", "--build", str(root), str(deb)], check=True, capture_output=True)
    work = tmp_path / "work"
    work.mkdir()
    png = ds.extract_opencv_png(deb, work)
    assert png.read_bytes() == target.read_bytes()
    assert not (work / "usr/share/doc/opencv-doc/other.txt").exists()


# ------------------------------------------------------------------------------ params


@pytest.mark.parametrize(
    ("changes", "pattern"),
    [
        ({"domains": ["mnist", "svhn"]}, r"dataset\.domains.*svhn.*mnistm"),
        ({"domains": []}, r"dataset\.domains is empty"),
        ({"domains": ["mnist", "mnist"]}, r"dataset\.domains.*more than once"),
        ({"val_size": 0}, r"dataset\.val_size"),
        ({"train_size": -5}, r"dataset\.train_size"),
        ({"domains": ["optdigits"], "train_size": 1500}, r"'optdigits'.*dataset\.train_size"),
        ({"domains": ["mnist"], "test_size": 2000}, r"'mnist' has 250 .*dataset\.test_size"),
        ({"domains": ["synth"], "synth_pool": 500}, r"'synth'.*dataset\.synth_pool"),
    ],
)
def test_bad_params_raise_data_error(tmp_path, changes, pattern):
    params = replace(DigitsParams(cache_dir=str(tmp_path)), **changes)
    with pytest.raises(DataError, match=pattern):
        load_digits(params, progress=False)
    assert not (tmp_path / "digits").exists()  # nothing built, nothing shrunk silently


def test_default_params_and_cache_dir(monkeypatch, tmp_path):
    p = DigitsParams()
    assert p.domains == list(DOMAINS) and DOMAINS[-1] == "opencv"
    assert (p.train_size, p.val_size, p.test_size, p.synth_pool) == (750, 250, 500, 5000)
    monkeypatch.setenv("FEDSHIFT_CACHE", str(tmp_path))
    assert cache_dir() == tmp_path
    monkeypatch.delenv("FEDSHIFT_CACHE")
    assert cache_dir() == Path.home() / ".cache" / "fedshift"


def test_show_digits_writes_montage(params, fed, tmp_path):
    out = tmp_path / "sub" / "montage.png"
    counts = show_digits(params, out, per_domain=5)
    assert counts == fed.counts()
    with Image.open(out) as im:
        assert im.format == "PNG" and im.size[0] > 200 and im.size[1] > 200
