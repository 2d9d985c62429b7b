"""The decode cache is checked for content when it is read back (issue 48): an entry whose
bytes were changed, whose ``kept.npz`` index arrays were permuted, whose split file is a link
to another valid array (or a FIFO), or that was sealed for another entry is read again from
the image files, with a warning naming the file; the numbers are those of the images."""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from fedshift.core.errors import DataError
from fedshift.data.common import cache, sealed
from fedshift.data.common.image_files import (
    KEPT,
    ClientSource,
    SplitSource,
    materialize_client,
)

SIDE = 4


def _png(path: Path, value: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((SIDE, SIDE, 3), value, dtype=np.uint8)).save(path)
    return path


def _client(root: Path, name: str = "site", offset: int = 0) -> ClientSource:
    """Three splits of 4, 3 and 3 one-colour images; image i of split s has the value
    ``10 * (s * 4 + i) + offset`` (its label: i % 2)."""
    splits = {}
    for s, (split, n) in enumerate((("train", 4), ("val", 3), ("test", 3))):
        paths = [_png(root / name / f"{split}{i}.png", 10 * (s * 4 + i) + offset) for i in range(n)]
        splits[split] = SplitSource(paths, np.arange(n, dtype=np.int64) % 2)
    return ClientSource(name, splits)


def _load(client: ClientSource, cache_dir: Path, **kw):
    return materialize_client(
        "testset", client, SIDE, "rgb", cache_dir, "fix it", progress=False, **kw
    )


def _values(data, split: str) -> list[int]:
    x = data.split(split).x
    return [round(float(v) * 255) for v in x[:, 0, 0, 0]]


@pytest.fixture
def built(tmp_path: Path):
    """A client, its cache folder and entry, the values read from the image files."""
    client = _client(tmp_path / "img")
    data, info = _load(client, tmp_path / "cache")
    assert not info["hit"] and "rebuilt" not in info
    entry = Path(info["path"])
    assert (entry / sealed.DIGESTS).is_file()
    want = {s: _values(data, s) for s in ("train", "val", "test")}
    assert want["train"] == [0, 10, 20, 30]
    again, info = _load(client, tmp_path / "cache")
    assert info["hit"] and "rebuilt" not in info
    return client, tmp_path / "cache", entry, want


def _rebuilt(client, cache_dir: Path, want: dict, caplog, match: str) -> dict:
    """Load again: a rebuild with a warning naming ``match``, the images' own values."""
    with caplog.at_level(logging.WARNING, logger="fedshift.data"):
        data, info = _load(client, cache_dir)
    assert not info["hit"], "an altered entry was used"
    assert match in info["rebuilt"]
    assert any(match in r.getMessage() and "reading the images again" in r.getMessage()
               for r in caplog.records)  # fmt: skip
    assert {s: _values(data, s) for s in want} == want
    # the rebuilt entry is sealed again and used as it is from then on
    assert _load(client, cache_dir)[1]["hit"]
    return info


def test_inverted_bytes_are_read_again(built, caplog) -> None:
    client, cache_dir, entry, want = built
    path = entry / "train.npy"
    st = path.stat()
    raw = path.read_bytes()
    header = len(raw) - 4 * 3 * SIDE * SIDE
    path.write_bytes(raw[:header] + bytes(255 - b for b in raw[header:]))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # modification time set back
    _rebuilt(client, cache_dir, want, caplog, "train.npy")


def test_a_split_file_linked_to_another_valid_array_is_read_again(built, tmp_path, caplog):
    client, cache_dir, entry, want = built
    other = _client(tmp_path / "img2", "site", offset=1)  # same shapes, other values
    _, info = _load(other, cache_dir)
    (entry / "val.npy").unlink()
    (entry / "val.npy").symlink_to(Path(info["path"]) / "test.npy")
    _rebuilt(client, cache_dir, want, caplog, "val.npy")
    assert not (entry / "val.npy").is_symlink()


def test_a_split_file_copied_from_another_entry_is_read_again(built, tmp_path, caplog):
    client, cache_dir, entry, want = built
    other = _client(tmp_path / "img2", "site", offset=1)
    _, info = _load(other, cache_dir)
    shutil.copyfile(Path(info["path"]) / "test.npy", entry / "test.npy")
    _rebuilt(client, cache_dir, want, caplog, "test.npy")


def test_a_fifo_in_place_of_a_split_file_does_not_hang(built, caplog) -> None:
    client, cache_dir, entry, want = built
    (entry / "test.npy").unlink()
    os.mkfifo(entry / "test.npy")
    _rebuilt(client, cache_dir, want, caplog, "test.npy is not a regular file")


def test_permuted_index_arrays_are_read_again(built, caplog) -> None:
    client, cache_dir, entry, want = built
    kept = cache.load_npz(entry / KEPT)
    kept["train"] = kept["train"][::-1].copy()
    cache.save_npz(entry / KEPT, kept)
    _rebuilt(client, cache_dir, want, caplog, KEPT)


@pytest.mark.parametrize(
    "train, why",
    [
        ([3, 2, 1, 0], "not strictly increasing"),
        ([0, 1, 1, 2], "not strictly increasing"),
        ([0, 1, 2, 9], "outside [0, 4)"),
        ([0.0, 1.0, 2.0, 3.0], "integer"),
    ],
)
def test_index_arrays_are_checked_even_when_resealed(built, caplog, train, why) -> None:
    """A ``kept.npz`` rewritten and sealed again (its digest recomputed) is still refused
    when its index arrays are not what fedshift writes."""
    client, cache_dir, entry, want = built
    kept = cache.load_npz(entry / KEPT)
    kept["train"] = np.asarray(train)
    cache.save_npz(entry / KEPT, kept)
    sealed.seal(entry, ["train.npy", "val.npy", "test.npy", KEPT])
    info = _rebuilt(client, cache_dir, want, caplog, why)
    assert f"{KEPT}: the index array 'train'" in info["rebuilt"]


def test_a_seal_of_another_entry_or_none_is_read_again(built, tmp_path, caplog) -> None:
    client, cache_dir, entry, want = built
    other = _client(tmp_path / "img2", "site", offset=1)
    _, info = _load(other, cache_dir)
    theirs = Path(info["path"])
    for f in ("train.npy", "val.npy", "test.npy", KEPT, sealed.DIGESTS):  # the whole entry
        shutil.copyfile(theirs / f, entry / f)
    _rebuilt(client, cache_dir, want, caplog, f"seals the entry '{theirs.name}'")
    (entry / sealed.DIGESTS).unlink()  # an entry of an older fedshift: read again, said so
    _rebuilt(client, cache_dir, want, caplog, "digest.json is missing")


def test_an_unchanged_file_is_not_hashed_on_open(built, monkeypatch) -> None:
    """Opening an entry costs a stat per file; a file whose times changed (a copied cache)
    is hashed once, and its new record written back."""
    client, cache_dir, entry, _ = built
    hashed: list[int] = []
    real = sealed._hash
    monkeypatch.setattr(sealed, "_hash", lambda fd: hashed.append(fd) or real(fd))
    assert _load(client, cache_dir)[1]["hit"] and hashed == []
    os.utime(entry / "train.npy", ns=(1_000_000_000, 1_000_000_000))
    assert _load(client, cache_dir)[1]["hit"] and len(hashed) == 1
    assert _load(client, cache_dir)[1]["hit"] and len(hashed) == 1
    body = json.loads((entry / sealed.DIGESTS).read_text())
    assert body["files"]["train.npy"]["stat"][1] == 1_000_000_000


def test_hashing_streams_in_chunks(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(sealed, "CHUNK", 7)
    path = tmp_path / "f"
    path.write_bytes(bytes(range(100)))
    assert sealed.file_record(path)["sha256"] == cache.sha256_file(path)


def test_an_entry_that_cannot_be_repaired_is_an_error(built, monkeypatch) -> None:
    client, cache_dir, entry, _ = built
    (entry / "train.npy").write_bytes(b"damaged")
    monkeypatch.setattr(sealed, "seal", lambda folder, names: None)  # the seal cannot be written
    (entry / sealed.DIGESTS).unlink()
    with pytest.raises(DataError, match=r"cannot be read back \(.*digest\.json is missing"):
        _load(client, cache_dir)


def test_the_checked_entry_gives_the_images_values(built) -> None:
    client, cache_dir, entry, want = built
    data, _ = _load(client, cache_dir)
    assert {s: _values(data, s) for s in want} == want
    assert torch.equal(data.train.y, torch.tensor([0, 1, 0, 1]))
