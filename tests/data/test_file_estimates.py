"""Issue 48, item 6: estimates before allocation, and files refused by type.

A compressed ``.npz`` or ``.nii.gz`` whose header asks for far more memory than the machine
has, ``folders`` at a ``dataset.size`` too large to decode, a label of 10**12 (a class list
of that length): each is refused before anything is allocated, with the estimate and the
fix. A FIFO where an ``.npy``, ``.npz`` or NIfTI file belongs is refused by its type instead
of blocking the reader forever (each such test runs under an alarm, so a regression fails
instead of hanging)."""

from __future__ import annotations

import contextlib
import gzip
import io
import os
import signal
import struct
import zipfile
from pathlib import Path

import numpy as np
import pytest

import fedshift.core.memory as memory
from fedshift.core.errors import DataError
from fedshift.core.memory import ResourceError
from fedshift.data import load_dataset

#: what a machine with a little memory reports (the estimates are compared with it)
SMALL = 10**6


@contextlib.contextmanager
def no_hang(seconds: int = 20):
    """A blocked ``open`` (a FIFO without a writer) becomes a TimeoutError."""

    def alarm(signum, frame):
        raise TimeoutError("the loader blocked on the file")

    old = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _site(x: np.ndarray, y: np.ndarray) -> dict[str, np.ndarray]:
    return {"x": x, "y": y}


def _small_sites(root: Path, names=("a", "b")) -> None:
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for name in names:
        x = rng.integers(0, 256, (30, 8, 8), dtype=np.uint8)
        np.savez(root / f"{name}.npz", **_site(x, np.arange(30) % 3))


def _bomb_npz(path: Path, shape: tuple[int, ...]) -> None:
    """A compressed .npz whose x header claims ``shape`` (uint8) over a few real bytes."""
    head = io.BytesIO()
    fmt = {"descr": "|u1", "fortran_order": False, "shape": shape}
    np.lib.format.write_array_header_1_0(head, fmt)
    labels = io.BytesIO()
    np.save(labels, np.arange(30) % 3)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("x.npy", head.getvalue() + bytes(4096))
        z.writestr("y.npy", labels.getvalue())


def test_arrays_npz_asking_for_terabytes_is_refused_from_its_header(tmp_path):
    """A few kB of .npz whose header claims 3 TB: refused with the estimate, the file and
    the arrays' shapes, before numpy allocates (it raised MemoryError, or the OOM killer)."""
    root = tmp_path / "arrays"
    _small_sites(root, ["a"])
    _bomb_npz(root / "b.npz", (10**6, 3, 1000, 1000))
    assert (root / "b.npz").stat().st_size < 10**5
    with pytest.raises(ResourceError) as e:
        load_dataset({"name": "arrays", "root": str(root)})
    msg = str(e.value)
    assert "needs about" in msg and "TB" in msg and "an estimate" in msg
    assert f"{root / 'b.npz'}: x (1000000, 3, 1000, 1000) uint8" in msg
    assert "dataset.sites" in msg and "\n" not in msg


def test_arrays_estimate_counts_the_float_copy(tmp_path, monkeypatch):
    """A real compressed .npz (zeros compress ~1000:1) over a small memory: the estimate is
    the stored arrays plus x as float32, known before loading."""
    root = tmp_path / "arrays"
    root.mkdir()
    np.savez_compressed(root / "a.npz", x=np.zeros((64, 3, 32, 32), np.uint8), y=np.zeros(64, int))
    monkeypatch.setattr(memory, "available_bytes", lambda: SMALL)
    with pytest.raises(ResourceError, match=r"needs about 984 kB of memory"):
        load_dataset({"name": "arrays", "root": str(root)})


def test_arrays_label_of_10_to_the_12_is_refused_before_a_class_list(tmp_path):
    root = tmp_path / "arrays"
    root.mkdir()
    y = np.arange(30) % 3
    y[4] = 10**12
    np.savez(root / "a.npz", x=np.zeros((30, 8, 8), np.uint8), y=y)
    with pytest.raises(DataError, match=r"a\.npz: y holds the label 1000000000000; without "):
        load_dataset({"name": "arrays", "root": str(root)})


@pytest.mark.parametrize("where", ["x.npy", "y.npy", "split.npy", "site.npz"])
def test_arrays_fifo_in_place_of_a_file_is_refused_by_type(tmp_path, where):
    root = tmp_path / "arrays"
    _small_sites(root, ["a"])
    if where == "site.npz":
        os.mkfifo(root / "b.npz")
        fifo = root / "b.npz"
    else:
        folder = root / "b"
        folder.mkdir()
        for key in ("x", "y"):
            np.save(folder / f"{key}.npy", np.zeros((30, 8, 8), np.uint8) if key == "x" else
                    np.arange(30) % 3)  # fmt: skip
        fifo = folder / where
        fifo.unlink(missing_ok=True)
        os.mkfifo(fifo)
    with no_hang(), pytest.raises(DataError) as e:
        load_dataset({"name": "arrays", "root": str(root)})
    assert str(e.value).startswith(f"{fifo} is a named pipe (FIFO), not a regular file")


def _nifti_bomb(path: Path, dims: tuple[int, int, int]) -> None:
    """A .nii.gz whose header claims ``dims`` int16 voxels over a 4x4x4 volume's bytes."""
    import nibabel

    buf = io.BytesIO()
    img = nibabel.Nifti1Image(np.zeros((4, 4, 4), np.int16), np.eye(4))
    img.to_file_map({"image": nibabel.FileHolder(fileobj=buf)})
    raw = bytearray(buf.getvalue())
    struct.pack_into("<8h", raw, 40, 3, *dims, 1, 1, 1, 1)
    path.write_bytes(gzip.compress(bytes(raw)))


def test_nifti_header_asking_for_terabytes_is_refused(tmp_path):
    """A 4.4 MB .nii.gz asked for 7.6 GB: the header's dimensions give the estimate."""
    from fedshift.data.medical.nifti import read_nifti

    path = tmp_path / "case1.nii.gz"
    _nifti_bomb(path, (30000, 30000, 30000))
    with pytest.raises(ResourceError) as e:
        read_nifti(path)
    msg = str(e.value)
    assert msg.startswith(f"{path} (a 30000x30000x30000 int16 volume) needs about")
    assert "header" in msg and "\n" not in msg


def test_segfolders_volume_bomb_stops_the_loader(tmp_path):
    root = tmp_path / "seg"
    for kind in ("images", "masks"):
        (root / "s1" / kind).mkdir(parents=True)
        for i in range(5):
            _nifti_bomb(root / "s1" / kind / f"case{i}.nii.gz", (30000, 30000, 30000))
    with pytest.raises(ResourceError, match=r"case\d\.nii\.gz \(a 30000x30000x30000 int16"):
        load_dataset({"name": "segfolders", "root": str(root)})


def test_nifti_fifo_is_refused_by_type(tmp_path):
    from fedshift.data.medical.nifti import read_nifti

    os.mkfifo(tmp_path / "case1.nii.gz")
    with no_hang(), pytest.raises(DataError, match=r"case1\.nii\.gz is a named pipe \(FIFO\)"):
        read_nifti(tmp_path / "case1.nii.gz")


def _folders(root: Path) -> None:
    from PIL import Image

    for site in ("s1", "s2"):
        for cls in ("a", "b"):
            (root / site / cls).mkdir(parents=True)
            for i in range(5):
                Image.new("RGB", (8, 8), (40 * i, 0, 0)).save(root / site / cls / f"{i}.png")


@pytest.mark.parametrize("cache", [True, False])
def test_folders_size_is_estimated_before_decoding(tmp_path, monkeypatch, cache):
    """``dataset.size`` x the images: refused with the estimate and the key to lower before
    an image is decoded (with the cache one client at a time is held, without it all)."""
    root = tmp_path / "folders"
    _folders(root)
    monkeypatch.setattr(memory, "available_bytes", lambda: SMALL)
    section = {"name": "folders", "root": str(root), "size": 224, "cache": cache,
               "cache_dir": str(tmp_path / "cache")}  # fmt: skip
    with pytest.raises(ResourceError) as e:
        load_dataset(section)
    msg = str(e.value)
    held = "the 10 images of client 's1'" if cache else "all 20 images"
    assert msg.startswith(f"dataset 'folders': {held} decoded at dataset.size=224")
    assert "lower dataset.size" in msg
    assert not (tmp_path / "cache").exists()  # nothing decoded, nothing cached
    monkeypatch.setattr(memory, "available_bytes", lambda: 10**12)
    fed = load_dataset({**section, "size": 16})
    assert fed.counts()["s1"]["train"] > 0
