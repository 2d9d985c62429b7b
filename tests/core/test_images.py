"""uint8 images read as float (fedshift.core.images.ByteImages): every way of keeping the bytes
(in memory, read per batch from the cache file, pickled to another process) indexes as the
float tensor that converting the whole array gives, bit for bit; and a run over a user's
folders gives the same numbers whether its images are streamed from the cache, held in
memory, or converted to float32 up front."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from fedshift.core.images import ByteImages, MemoryBudget, cat_images, open_npy, write_npy
from fedshift.data.common.images import to_float


@pytest.fixture
def u8() -> np.ndarray:
    return np.random.default_rng(0).integers(0, 256, size=(23, 3, 5, 4), dtype=np.uint8)


@pytest.fixture
def kinds(u8: np.ndarray, tmp_path: Path) -> dict[str, ByteImages]:
    path = tmp_path / "x.npy"
    write_npy(path, u8)
    out = {
        "memory": ByteImages(u8),
        "file": open_npy(path, in_memory_max=0),
        "small file": open_npy(path),
    }
    out["pickled file"] = pickle.loads(pickle.dumps(out["file"]))
    return out


def test_every_kind_indexes_as_the_converted_array(u8, kinds):
    ref = to_float(u8)
    assert kinds["file"].storage == "file" and kinds["small file"].storage == "memory"
    idx = torch.tensor([5, 0, 22, 5, -1])
    for name, x in kinds.items():
        assert x.shape == ref.shape and len(x) == 23 and x.dim() == 4, name
        assert x.dtype == torch.float32 and x.device == torch.device("cpu")
        assert x.numel() == ref.numel() and x.size() == ref.size() and x.size(1) == 3, name
        assert torch.equal(x[3], ref[3]) and torch.equal(x[-2], ref[-2]), name
        assert torch.equal(x[4:17], ref[4:17]) and torch.equal(x[::5], ref[::5]), name
        assert torch.equal(x[idx], ref[idx]), name
        assert torch.equal(x[idx.view(1, 5)], ref[idx.view(1, 5)]), name  # FedMix's groups
        assert torch.equal(x[np.array([2, 9])], ref[[2, 9]]), name
        assert torch.equal(x[:, 1], ref[:, 1]) and torch.equal(x[2, 0], ref[2, 0]), name
        assert torch.equal(x.float(), ref) and torch.equal(x[:0], ref[:0]), name
        # other torch functions and methods see the whole float tensor
        assert torch.equal(x, ref) and float(x.max()) == float(ref.max()), name
        assert torch.equal(torch.cat([x, ref]), torch.cat([ref, ref])), name
        with pytest.raises(IndexError):
            x[23]
        with pytest.raises(IndexError):
            x[torch.tensor([0, 23])]


def test_views_copy_no_bytes_and_compose(u8, kinds):
    ref = to_float(u8)
    first = torch.tensor([20, 3, 7, 7, 1, 0])
    second = torch.tensor([4, 0, 2])
    for name, x in kinds.items():
        v = x.index_select(0, first)
        assert isinstance(v, ByteImages) and v.shape[0] == 6, name
        assert torch.equal(v[:], ref.index_select(0, first)), name
        w = v.index_select(0, second)
        assert torch.equal(w[:], ref.index_select(0, first).index_select(0, second)), name
        assert torch.equal(pickle.loads(pickle.dumps(w))[:], w[:]), name
        assert w.element_size() * w.nelement() == 3 * 3 * 5 * 4  # bytes where they are kept


def test_cat_and_channel_statistics_do_not_depend_on_the_kind(u8, kinds):
    from fedshift.augment.fedrdn import channel_statistics

    ref = to_float(u8)
    mean, std = channel_statistics(ref, batch=7)
    for name, x in kinds.items():
        m, s = channel_statistics(x, batch=7)
        assert torch.equal(m, mean) and torch.equal(s, std), name
    both = cat_images([kinds["file"], kinds["memory"]])
    assert both.storage == "memory" and torch.equal(both[:], torch.cat([ref, ref]))
    assert torch.equal(cat_images([ref, ref]), torch.cat([ref, ref]))
    assert torch.equal(cat_images([kinds["memory"], ref])[:], torch.cat([ref, ref]))
    with pytest.raises(ValueError, match="not 8-bit"):
        cat_images([kinds["memory"], ref + 0.001])


def test_a_load_holds_at_most_its_budget_in_memory(u8, tmp_path, monkeypatch):
    """Files are read whole while they fit in what is left of one budget, the rest per batch:
    however many sites (and worker processes) there are, a load holds at most the budget."""
    paths = []
    for i in range(4):
        paths.append(tmp_path / f"{i}.npy")
        write_npy(paths[-1], u8)
    size = paths[0].stat().st_size
    budget = MemoryBudget(total=2 * size + 1)
    assert [budget.open(p).storage for p in paths] == ["memory", "memory", "file", "file"]
    assert budget.remaining == 1
    monkeypatch.setenv("FEDSHIFT_IN_MEMORY_MAX_BYTES", "0")
    assert [MemoryBudget().open(p).storage for p in paths] == ["file"] * 4
    monkeypatch.setenv("FEDSHIFT_IN_MEMORY_MAX_BYTES", str(size))
    one = MemoryBudget()
    assert [one.open(p).storage for p in paths] == ["memory", "file", "file", "file"]


def test_bad_input_is_refused(tmp_path):
    with pytest.raises(ValueError, match="uint8"):
        ByteImages(np.zeros((2, 3, 4, 4), dtype=np.float32))
    np.save(tmp_path / "f.npy", np.zeros((2, 3, 4, 4), dtype=np.float32))
    with pytest.raises(ValueError, match="not a C-order uint8"):
        ByteImages(path=tmp_path / "f.npy")
    truncated = tmp_path / "t.npy"
    write_npy(truncated, np.zeros((4, 1, 8, 8), dtype=np.uint8))
    truncated.write_bytes(truncated.read_bytes()[:-70])
    with pytest.raises(OSError, match="delete the cache"):
        ByteImages(path=truncated)[3]
    with pytest.raises(TypeError, match="boolean masks"):
        ByteImages(np.zeros((2, 1, 2, 2), dtype=np.uint8))[np.array([True, False])]


# --------------------------------------------------------------------------------------------
# a run: the numbers do not depend on where the bytes are kept
# --------------------------------------------------------------------------------------------


def _site_images(root: Path) -> Path:
    from PIL import Image

    rng = np.random.default_rng(1)
    for s, site in enumerate(("north", "south")):
        for c, cls in enumerate(("dark", "light")):
            folder = root / site / cls
            folder.mkdir(parents=True)
            for i in range(14):
                base = 60 + 120 * c + 25 * s
                img = np.clip(base + rng.normal(0, 30, (12, 12, 3)), 0, 255).astype(np.uint8)
                Image.fromarray(img).save(folder / f"{i}.png")
    return root


def test_a_run_is_the_same_streamed_in_memory_and_as_float32(tmp_path, monkeypatch, one_thread):
    import fedshift
    from fedshift.catalog import resolve
    from fedshift.core.config import load_config
    from fedshift.data import load_dataset

    root = _site_images(tmp_path / "sites")
    common = [
        "dataset.name=folders", f"dataset.root={root}", "dataset.size=28", "model.name=cnn",
        "model.width=4", "train.rounds=2", "train.batch_size=8", "algorithm.name=fedavg",
        "augment=[fedrdn]", f"dataset.cache_dir={tmp_path / 'cache'}",
    ]  # fmt: skip
    runs = {}
    for name, limit in (("file", "0"), ("memory", "")):
        monkeypatch.setenv("FEDSHIFT_IN_MEMORY_MAX_BYTES", limit)
        runs[name] = fedshift.run(None, common, out=tmp_path / name).run_dir
    # the same federation converted to float32 up front (the in-memory float path)
    cfg = resolve(load_config(None, common))
    fed = load_dataset(cfg.dataset)
    fed = {
        c.name: {s: (c.split(s).x.float(), c.split(s).y) for s in ("train", "val", "test")}
        for c in fed.clients
    }
    arrays = [o for o in common if not o.startswith("dataset.")]
    runs["float32"] = fedshift.run(None, arrays, federation=fed, out=tmp_path / "f").run_dir

    def numbers(run) -> tuple[str, dict]:
        run = Path(run)
        summary = json.loads((run / "summary.json").read_text())
        return (run / "metrics.jsonl").read_text(), summary

    metrics, summary = numbers(runs["file"])
    assert summary["runtime"]["data_storage"]["file"]["splits"] == 6
    for name in ("memory", "float32"):
        other_metrics, other = numbers(runs[name])
        assert other_metrics == metrics, name
        assert other["test_mean"] == summary["test_mean"], name
    assert numbers(runs["memory"])[1]["runtime"]["data_storage"] == {
        "memory": {"splits": 6, "bytes": summary["runtime"]["data_storage"]["file"]["bytes"]}
    }
    assert "data_storage" not in numbers(runs["float32"])[1]["runtime"]


def test_to_a_device_keeps_the_bytes_and_the_values(u8, kinds):
    """``to(device)``: the same device gives the same object; a torch uint8 copy (what a GPU
    gets) indexes as the converted array, views included."""
    ref = to_float(u8)
    x = kinds["file"]
    assert x.to("cpu") is x
    as_tensor = ByteImages(torch.from_numpy(u8))  # the form .to("cuda") makes
    assert as_tensor.storage == "memory" and torch.equal(as_tensor[[4, 1]], ref[[4, 1]])
    view = x.index_select(0, torch.tensor([3, 3, 0]))
    if torch.cuda.is_available():
        on_gpu = view.to("cuda")
        assert on_gpu.storage == "device" and on_gpu.element_size() * on_gpu.nelement() == (
            3 * 3 * 5 * 4
        )
        idx = torch.tensor([2, 0], device="cuda")
        assert torch.equal(on_gpu[idx].cpu(), ref[[0, 3]])
        assert torch.equal(pickle.loads(pickle.dumps(on_gpu))[:], ref[[3, 3, 0]])
