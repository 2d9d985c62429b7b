"""The helpers every dataset loader shares (``fedshift.data.common``) and the layout rule of
the ``fedshift.data`` subpackages."""

from __future__ import annotations

import ast
import io
import os
import zlib
from pathlib import Path

import numpy as np
import pytest

import fedshift.data
from fedshift.data.common import cache
from fedshift.data.common.seeding import seeded_rng, stable_hash

DATA = Path(fedshift.data.__file__).parent


# --------------------------------------------------------------------------------------------
# cache folder
# --------------------------------------------------------------------------------------------


def test_cache_dir_override_then_env_then_home(monkeypatch, tmp_path):
    monkeypatch.setenv("FEDSHIFT_CACHE", str(tmp_path / "env"))
    assert cache.cache_dir() == tmp_path / "env"
    assert cache.cache_dir(str(tmp_path / "mine")) == tmp_path / "mine"
    assert cache.cache_dir(None) == tmp_path / "env"
    assert cache.cache_dir("~/x") == Path.home() / "x"  # ~ expanded
    monkeypatch.delenv("FEDSHIFT_CACHE")
    assert cache.cache_dir() == Path.home() / ".cache" / "fedshift"


# --------------------------------------------------------------------------------------------
# atomic writes
# --------------------------------------------------------------------------------------------


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


def test_atomic_write_creates_parents_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "a" / "b" / "file.bin"
    cache.atomic_write(path, b"one")
    cache.atomic_write(path, b"two")  # replaces
    assert path.read_bytes() == b"two"
    cache.atomic_write_text(tmp_path / "t.json", "{}\n")
    assert (tmp_path / "t.json").read_text() == "{}\n"
    assert _leftovers(path.parent) == [] and _leftovers(tmp_path) == []


def test_failed_atomic_write_keeps_the_old_file(tmp_path, monkeypatch):
    path = tmp_path / "file.bin"
    cache.atomic_write(path, b"old")

    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk full"):
        cache.atomic_write(path, b"new")
    with pytest.raises(OSError, match="disk full"):
        cache.save_npz(tmp_path / "arrays.npz", {"x": np.zeros(3)})
    monkeypatch.undo()
    assert path.read_bytes() == b"old"  # a reader never sees a half-written file
    assert not (tmp_path / "arrays.npz").exists()
    assert _leftovers(tmp_path) == []  # the temporary files are cleaned up


# --------------------------------------------------------------------------------------------
# arrays in and out
# --------------------------------------------------------------------------------------------


def test_npz_round_trip_is_exact(tmp_path):
    arrays = {
        "site1/train/x": np.random.default_rng(0).random((2, 3, 4, 4), dtype=np.float32),
        "y": np.arange(5, dtype=np.uint8),
        "names": np.array(["Case00", "Case01"]),
    }
    path = tmp_path / "sub" / "c.npz"
    cache.save_npz(path, arrays)
    got = cache.load_npz(path)
    assert got is not None and sorted(got) == sorted(arrays)
    for k, v in arrays.items():
        assert got[k].dtype == v.dtype and np.array_equal(got[k], v)
    assert _leftovers(path.parent) == []


class _Trap:
    """Unpickling this object records that code ran."""

    ran: list[str] = []

    def __reduce__(self):
        return (_Trap.ran.append, ("unpickled",))


def test_load_npz_refuses_pickles_and_damaged_files(tmp_path):
    assert cache.load_npz(tmp_path / "absent.npz") is None
    pickled = tmp_path / "pickled.npz"
    with open(pickled, "wb") as fh:
        np.savez(fh, bad=np.array([_Trap()], dtype=object))
    _Trap.ran.clear()
    assert cache.load_npz(pickled) is None  # refused: the caller rebuilds the entry
    assert _Trap.ran == []  # and nothing was unpickled
    truncated = tmp_path / "truncated.npz"
    cache.save_npz(truncated, {"x": np.arange(1000)})
    truncated.write_bytes(truncated.read_bytes()[:100])
    assert cache.load_npz(truncated) is None
    (tmp_path / "text.npz").write_text("not a zip")
    assert cache.load_npz(tmp_path / "text.npz") is None


def test_npy_bytes_round_trip_and_refuse_pickles():
    x = np.arange(12, dtype=np.int64).reshape(3, 4)[:, ::2]  # not contiguous
    data = cache.npy_bytes(x)
    assert np.array_equal(cache.load_npy_bytes(data), x)
    assert cache.npy_bytes(x) == data  # deterministic bytes (the digits manifest hashes them)
    with pytest.raises(ValueError):
        cache.npy_bytes(np.array([object()], dtype=object))  # never writes a pickle
    buf = io.BytesIO()
    np.save(buf, np.array([_Trap()], dtype=object), allow_pickle=True)
    _Trap.ran.clear()
    with pytest.raises(ValueError):
        cache.load_npy_bytes(buf.getvalue())
    assert _Trap.ran == []


def test_json_digest_is_sorted_key_sha256():
    a = cache.json_digest({"b": 1, "a": [1, 2]}, 24)
    assert a == cache.json_digest({"a": [1, 2], "b": 1}, 24) and len(a) == 24
    # sha256 of the bytes '{"a": 1}' (json.dumps with sorted keys), as the cache names use
    assert cache.json_digest({"a": 1}, 20) == "f9d86028c6e0d64e2251"


# --------------------------------------------------------------------------------------------
# seeding
# --------------------------------------------------------------------------------------------


def test_seeded_rng_is_the_published_recipe():
    """The recipe every cached pool and split was drawn with: default_rng([seed, crc32(tag)])."""
    assert stable_hash("mnistm") == zlib.crc32(b"mnistm")
    want = np.random.default_rng([3, zlib.crc32(b"camelyon17/hospital1/train")]).random(5)
    assert np.array_equal(seeded_rng(3, "camelyon17/hospital1/train").random(5), want)
    want = np.random.default_rng([0, zlib.crc32(b"mnist"), zlib.crc32(b"split")]).random(5)
    assert np.array_equal(seeded_rng(0, "mnist", "split").random(5), want)
    want = np.random.default_rng([1, zlib.crc32(b"brain-mri/noise"), 4]).random(5)
    assert np.array_equal(seeded_rng(1, "brain-mri/noise", 4).random(5), want)


# --------------------------------------------------------------------------------------------
# layout
# --------------------------------------------------------------------------------------------


def _data_imports(path: Path) -> set[str]:
    """The ``fedshift.data.<sub>`` subpackages/modules a file imports (any import statement)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        for name in names:
            parts = name.split(".")
            if parts[:2] == ["fedshift", "data"] and len(parts) > 2:
                out.add(parts[2])
    return out


@pytest.mark.parametrize("sub", ["common", "digits", "medical", "domains"])
def test_data_subpackages_import_only_common_and_base(sub):
    """``common`` imports only ``base``; each dataset subpackage imports only itself,
    ``common`` and ``base`` (never another dataset subpackage or the registry)."""
    allowed = {"base"} | ({sub} if sub == "common" else {sub, "common"})
    for path in sorted((DATA / sub).rglob("*.py")):
        bad = _data_imports(path) - allowed
        assert not bad, f"{path.relative_to(DATA)} imports fedshift.data.{sorted(bad)}"
