"""digits5 / office-caltech10 / domainnet / pacs / officehome / cifar10 / cifar100 loaders on
tiny fixtures generated in the exact on-disk layouts: FedBN's pickled tuples (uint8 arrays;
numpy string arrays of relative paths and text labels), folder-per-domain-per-class PNG/JPEG
trees, CIFAR's python-version batches (dicts with bytes keys, protocol 2 as Python 2 wrote).

Every image encodes where it came from in its (constant) colour, so a test can tell which
entries landed in which split."""

from __future__ import annotations

import datetime
import os
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from fedshift.core.errors import ConfigError, DataError, MissingSourceError
from fedshift.data import DATASETS, load_dataset
from fedshift.data.common.images import resize_uint8
from fedshift.data.common.pickles import read_array_pickle
from fedshift.data.domains import fedbn_pickles as fp
from fedshift.data.domains.cifar import CifarParams, load_cifar10, load_cifar100
from fedshift.data.domains.fedbn_pickles import (
    Digits5Params,
    DomainNetParams,
    OfficeParams,
    load_digits5,
    load_domainnet,
    load_office,
)
from fedshift.data.domains.image_folders import (
    OfficeHomeParams,
    PACSParams,
    load_officehome,
    load_pacs,
)


def dump(path: Path, obj: object, protocol: int = pickle.HIGHEST_PROTOCOL) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as fh:
        pickle.dump(obj, fh, protocol)


def png(path: Path, color, side: int = 6, mode: str = "RGB") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new(mode, (side, side), color).save(path)


def values(x: torch.Tensor, channel: int = 0) -> list[int]:
    """The constant 8-bit value of each image's channel (asserting it is constant)."""
    v = (x[:, channel] * 255).round().to(torch.int64)
    flat = v.reshape(len(v), -1)
    assert torch.equal(flat.min(1).values, flat.max(1).values)
    return flat[:, 0].tolist()


# --------------------------------------------------------------------------------------------
# digits5
# --------------------------------------------------------------------------------------------

DIGIT_SHAPES = {  # folder -> image shape after N (FedBN's data: MNIST/USPS gray, others RGB)
    "MNIST": (28, 28),
    "SVHN": (32, 32, 3),
    "USPS": (16, 16),
    "SynthDigits": (32, 32, 3),
    "MNIST_M": (28, 28, 3),
}


def digit_images(shape: tuple[int, ...], codes: np.ndarray) -> np.ndarray:
    """Constant images; gray value = code; RGB = (code, 255 - code, 77)."""
    n = len(codes)
    x = np.empty((n, *shape), dtype=np.uint8)
    if len(shape) == 2:
        x[:] = codes[:, None, None]
    else:
        x[..., 0] = codes[:, None, None]
        x[..., 1] = (255 - codes)[:, None, None]
        x[..., 2] = 77
    return x


def make_digits5(root: Path, n_part: int = 20, n_test: int = 15) -> Path:
    """Ten parts of ``n_part`` images (code = 10 part + i, label i % 10) and a test set
    (code = 200 + i) per domain."""
    for folder, shape in DIGIT_SHAPES.items():
        for k in range(10):
            codes = (10 * k + np.arange(n_part)).astype(np.uint8)
            labels = np.arange(n_part) % 10
            dump(
                root / folder / "partitions" / f"train_part{k}.pkl",
                (digit_images(shape, codes), labels),
            )
        codes = (200 + np.arange(n_test)).astype(np.uint8)
        dump(root / folder / "test.pkl", (digit_images(shape, codes), np.arange(n_test) % 10))
    return root


@pytest.fixture
def digits_root(tmp_path: Path) -> Path:
    return make_digits5(tmp_path / "data")


def test_digits5_default_percent_uses_part0_with_stratified_val(digits_root: Path) -> None:
    fed = load_digits5(Digits5Params(root=str(digits_root)))
    assert fed.client_names == ["mnist", "svhn", "usps", "synth", "mnistm"]
    assert fed.classes == [str(d) for d in range(10)] and fed.input_shape == (3, 28, 28)
    for c in fed.clients:
        # 20 images of train_part0: val = int(0.2 * 20) = 4, train 16, test = all 15
        assert (len(c.train), len(c.val), len(c.test)) == (16, 4, 15)
        for s in ("train", "val", "test"):
            split = c.split(s)
            assert split.x.shape[1:] == (3, 28, 28) and split.x.dtype == torch.float32
            assert split.y.dtype == torch.int64
        codes = sorted(values(c.train.x) + values(c.val.x))
        assert codes == list(range(20))  # part0 only, train and val disjoint
        # labels = code % 10 (image and label stay paired)
        assert [v % 10 for v in values(c.train.x)] == c.train.y.tolist()
        # 2 per class, 4 to hold out: remainders 0.4 tie, lowest classes first
        assert sorted(c.val.y.tolist()) == [0, 1, 2, 3]
        assert sorted(values(c.test.x)) == list(range(200, 215))
    assert fed.info["counts"]["usps"] == {"train": 16, "val": 4, "test": 15}


def test_digits5_channels_gray_copied_rgb_kept(digits_root: Path) -> None:
    fed = load_digits5(Digits5Params(root=str(digits_root)))
    for name in ("mnist", "usps"):  # gray (USPS resized 16 -> 28): three equal channels
        x = fed.client(name).test.x
        assert torch.equal(x[:, 0], x[:, 1]) and torch.equal(x[:, 0], x[:, 2])
        assert values(x) == list(range(200, 215))
    for name in ("svhn", "synth", "mnistm"):  # RGB (SVHN/Synth resized 32 -> 28)
        x = fed.client(name).test.x
        assert values(x, 0) == list(range(200, 215))
        assert values(x, 1) == [255 - v for v in range(200, 215)]
        assert values(x, 2) == [77] * 15


def test_digits5_percent_rules(digits_root: Path) -> None:
    fed = load_digits5(Digits5Params(root=str(digits_root), percent=0.3, domains=["usps"]))
    c = fed.client("usps")
    assert (len(c.train), len(c.val)) == (48, 12)  # 3 parts = 60, val int(0.2 * 60) = 12
    assert sorted(values(c.train.x) + values(c.val.x)) == sorted(
        10 * k + i for k in range(3) for i in range(20)
    )
    # percent < 0.1: the first int(20 * 0.05 * 10) = 10 images of train_part0
    fed = load_digits5(Digits5Params(root=str(digits_root), percent=0.05, domains=["mnist"]))
    c = fed.client("mnist")
    assert (len(c.train), len(c.val)) == (8, 2)
    assert sorted(values(c.train.x) + values(c.val.x)) == list(range(10))
    assert fed.info["sources"]["mnist"]["kept_of_part0"] == 10


def test_digits5_domains_order_test_cap_and_seed(digits_root: Path) -> None:
    p = Digits5Params(root=str(digits_root), domains=["mnistm", "mnist"], test_size=10)
    fed = load_digits5(p)
    assert fed.client_names == ["mnistm", "mnist"]
    assert torch.bincount(fed.clients[0].test.y, minlength=10).tolist() == [1] * 10
    a = load_digits5(p)
    assert torch.equal(a.clients[0].val.x, fed.clients[0].val.x)  # deterministic
    other = load_digits5(Digits5Params(root=str(digits_root), domains=["mnist"], seed=3))
    assert sorted(values(other.clients[0].val.x)) != sorted(values(fed.client("mnist").val.x))


def test_digits5_missing_layout(digits_root: Path, tmp_path: Path) -> None:
    with pytest.raises(MissingSourceError, match=r"(?s)dataset.root.*partitions"):
        load_digits5(Digits5Params())
    with pytest.raises(MissingSourceError, match="does not exist"):
        load_digits5(Digits5Params(root=str(tmp_path / "nowhere")))
    (digits_root / "USPS" / "partitions" / "train_part0.pkl").unlink()
    with pytest.raises(MissingSourceError, match=r"USPS/partitions/train_part0\.pkl"):
        load_digits5(Digits5Params(root=str(digits_root)))
    os.rename(digits_root / "SVHN", digits_root / "svhn_old")
    with pytest.raises(MissingSourceError, match=r"'svhn'.*SVHN"):
        load_digits5(Digits5Params(root=str(digits_root), domains=["svhn"]))


@pytest.mark.parametrize(
    "content, match",
    [
        ({"images": 1}, "holds a dict"),
        ((np.zeros((4, 28, 28), np.float32), np.zeros(4)), "float32, expected a uint8"),
        ((np.zeros((4, 28, 28, 2), np.uint8), np.zeros(4)), r"shape \(4, 28, 28, 2\)"),
        ((np.zeros((4, 28, 28), np.uint8), np.zeros(3)), "4 images but labels"),
        ((np.zeros((4, 28, 28), np.uint8), np.array([0, 1, 11, 2])), "label 11 at entry 2"),
        ((np.zeros((4, 28, 28), np.uint8), np.array([0.5, 1, 1, 2])), "expected integers"),
        ((np.zeros((4, 28, 28), np.uint8), datetime.date(2020, 1, 1)), "refusing"),
    ],
)
def test_digits5_malformed_pickle(digits_root: Path, content, match) -> None:
    bad = digits_root / "MNIST" / "test.pkl"
    dump(bad, content)
    with pytest.raises(DataError, match=match) as err:
        load_digits5(Digits5Params(root=str(digits_root), domains=["mnist"]))
    assert str(bad) in str(err.value)


def test_digits5_truncated_pickle(digits_root: Path) -> None:
    bad = digits_root / "MNIST" / "partitions" / "train_part0.pkl"
    bad.write_bytes(bad.read_bytes()[:100])
    with pytest.raises(DataError, match="not a pickle of numpy arrays") as err:
        load_digits5(Digits5Params(root=str(digits_root), domains=["mnist"]))
    assert str(bad) in str(err.value)


@pytest.mark.parametrize(
    "kw, key",
    [
        ({"percent": 0.0}, "dataset.percent"),
        ({"percent": 1.5}, "dataset.percent"),
        ({"val_fraction": 1.0}, "dataset.val_fraction"),
        ({"domains": ["mnist", "emnist"]}, "dataset.domains"),
        ({"domains": ["mnist", "mnist"]}, "dataset.domains"),
        ({"test_size": 0}, "dataset.test_size"),
        ({"seed": -1}, "dataset.seed"),
    ],
)
def test_digits5_bad_params(digits_root: Path, kw, key) -> None:
    with pytest.raises(ConfigError, match=key):
        load_digits5(Digits5Params(root=str(digits_root), **kw))


def test_digits5_too_few_for_val(digits_root: Path) -> None:
    # 20 * 0.02 * 10 = 4 images, val int(0.2 * 4) = 0
    with pytest.raises(DataError, match="val_fraction"):
        load_digits5(Digits5Params(root=str(digits_root), percent=0.02, domains=["mnist"]))


# --------------------------------------------------------------------------------------------
# office-caltech10 and domainnet (path pickles)
# --------------------------------------------------------------------------------------------


def make_path_pickles(
    root: Path, folder: str, sizes: dict[str, tuple[int, int]], classes: list[str]
) -> Path:
    """``root/<folder>/<domain>_{train,test}.pkl`` of numpy string arrays; entry i of domain d
    is ``<folder>/<domain>/<class>/{train,test}_<i>.png``, colour (10 i + 5, 40 d + 10, 0)
    (train) or (..., 255) (test), label ``classes[i % 10]``."""
    for d, (domain, (n_train, n_test)) in enumerate(sizes.items()):
        for which, n, blue in (("train", n_train, 0), ("test", n_test, 255)):
            paths, labels = [], []
            for i in range(n):
                cls = classes[i % len(classes)]
                rel = f"{folder}/{domain}/{cls}/{which}_{i}.png"
                png(root / rel, (10 * i + 5, 40 * d + 10, blue), side=4)
                paths.append(rel)
                labels.append(cls)
            dump(root / folder / f"{domain}_{which}.pkl", (np.array(paths), np.array(labels)))
    return root


OFFICE_SIZES = {"amazon": (12, 4), "caltech": (14, 3), "dslr": (10, 4), "webcam": (11, 2)}


@pytest.fixture
def office_root(tmp_path: Path) -> Path:
    return make_path_pickles(
        tmp_path / "data", "office_caltech_10", OFFICE_SIZES, fp.OFFICE_CLASSES
    )


def entries(x: torch.Tensor) -> list[int]:
    return [(v - 5) // 10 for v in values(x, 0)]


def office(root: Path, tmp_path: Path, **kw) -> OfficeParams:
    return OfficeParams(
        **{"root": str(root), "size": 8, "cache_dir": str(tmp_path / "cache"), **kw}
    )


def test_office_fedbn_split(office_root: Path, tmp_path: Path) -> None:
    fed = load_office(office(office_root, tmp_path))
    assert fed.client_names == ["amazon", "caltech", "dslr", "webcam"]
    assert fed.classes == fp.OFFICE_CLASSES and fed.input_shape == (3, 8, 8)
    # m = 10 (dslr): train = first int(0.5 m) = 5, val = last int(0.4 m) = 4, test = test pkl
    for d, (domain, (n, n_test)) in enumerate(OFFICE_SIZES.items()):
        c = fed.client(domain)
        assert entries(c.train.x) == [0, 1, 2, 3, 4]
        assert entries(c.val.x) == list(range(n - 4, n))
        assert entries(c.test.x) == list(range(n_test))
        assert values(c.test.x, 2) == [255] * n_test and values(c.train.x, 2) == [0] * 5
        assert values(c.train.x, 1) == [40 * d + 10] * 5
        assert c.train.y.tolist() == [0, 1, 2, 3, 4] and c.train.y.dtype == torch.int64
        assert c.val.y.tolist() == [i % 10 for i in range(n - 4, n)]
    assert fed.info["min_train_pickle"] == 10
    assert fed.info["counts"]["caltech"] == {"train": 5, "val": 4, "test": 3}


def test_office_min_len_over_loaded_domains_and_fedfa(office_root: Path, tmp_path: Path) -> None:
    fed = load_office(office(office_root, tmp_path, domains=["caltech", "amazon"]))
    # m = 12: train int(6.0) = 6, val int(4.8) = 4
    assert entries(fed.client("amazon").train.x) == list(range(6))
    assert entries(fed.client("caltech").val.x) == [10, 11, 12, 13]
    fed = load_office(office(office_root, tmp_path, split="fedfa"))
    # FedFA: train = first int(0.6 n) of the domain's own pickle, val = the rest
    assert entries(fed.client("amazon").train.x) == list(range(7))  # int(7.2)
    assert entries(fed.client("amazon").val.x) == list(range(7, 12))
    assert entries(fed.client("webcam").train.x) == list(range(6))  # int(6.6)
    assert entries(fed.client("webcam").val.x) == list(range(6, 11))


def test_office_root_may_be_pickle_folder(office_root: Path, tmp_path: Path) -> None:
    fed = load_office(office(office_root / "office_caltech_10", tmp_path, domains=["dslr"]))
    assert (len(fed.clients[0].train), len(fed.clients[0].val)) == (5, 4)


def test_office_gray_rule_of_fedbn(office_root: Path, tmp_path: Path) -> None:
    # test entry 1 of amazon as RGBA and entry 2 as palette: FedBN makes both gray
    base = office_root / "office_caltech_10" / "amazon"
    png(base / "bike" / "test_1.png", (200, 100, 50, 255), side=4, mode="RGBA")
    pal = Image.new("RGB", (4, 4), (200, 100, 50)).convert("P", palette=Image.ADAPTIVE)
    pal.save(base / "calculator" / "test_2.png")
    fed = load_office(office(office_root, tmp_path, domains=["amazon"], cache=False))
    x = fed.client("amazon").test.x
    # ITU-R 601-2 luma: 0.299 200 + 0.587 100 + 0.114 50 = 124.2 -> 124
    for i in (1, 2):
        assert [values(x[i : i + 1], ch)[0] for ch in range(3)] == [124, 124, 124]
    assert [values(x[0:1], ch)[0] for ch in range(3)] == [5, 10, 255]  # RGB kept


def test_office_max_per_split_stratified(office_root: Path, tmp_path: Path) -> None:
    fed = load_office(office(office_root, tmp_path, max_per_split=2))
    for c in fed.clients:
        assert len(c.train) == len(c.val) == 2
        assert len(c.test) == min(2, OFFICE_SIZES[c.name][1])
        assert set(entries(c.train.x)) <= {0, 1, 2, 3, 4}
    assert fed.info["available"]["amazon"] == {"train": 5, "val": 4, "test": 4}


def test_office_cache_hit_and_invalidation(office_root: Path, tmp_path: Path) -> None:
    p = office(office_root, tmp_path, domains=["dslr"])
    first = load_office(p)
    assert first.info["cache"]["dslr"]["hit"] is False
    assert Path(first.info["cache"]["dslr"]["path"]).joinpath("kept.npz").is_file()
    second = load_office(p)
    assert second.info["cache"]["dslr"]["hit"] is True
    for s in ("train", "val", "test"):
        assert torch.equal(first.clients[0].split(s).x, second.clients[0].split(s).x)
    img = office_root / "office_caltech_10" / "dslr" / "back_pack" / "train_0.png"
    png(img, (99, 0, 0), side=4)
    os.utime(img, ns=(1_000_000_000, 1_000_000_000))
    third = load_office(p)
    assert third.info["cache"]["dslr"]["hit"] is False
    assert values(third.clients[0].train.x)[0] == 99
    assert load_office(p).info["cache"]["dslr"]["hit"] is True


def test_office_missing_and_malformed(office_root: Path, tmp_path: Path) -> None:
    with pytest.raises(MissingSourceError, match=r"(?s)dataset.root.*office_caltech_10"):
        load_office(OfficeParams())
    with pytest.raises(MissingSourceError, match="holds neither office_caltech_10"):
        load_office(office(tmp_path, tmp_path))
    pkl = office_root / "office_caltech_10" / "webcam_test.pkl"
    pkl.unlink()
    with pytest.raises(MissingSourceError, match=r"webcam_test\.pkl is missing"):
        load_office(office(office_root, tmp_path))
    # a pickled path that does not exist: named with the pickle and the entry
    img = office_root / "office_caltech_10" / "amazon" / "bike" / "train_1.png"
    img.unlink()
    with pytest.raises(DataError, match=r"train_1\.png is missing.*amazon_train\.pkl, entry 1"):
        load_office(office(office_root, tmp_path, domains=["amazon"]))


@pytest.mark.parametrize(
    "content, match",
    [
        ((np.array(["a.png"]), np.array(["sofa"])), "label 'sofa'"),
        ((np.array(["a.png", "b.png"]), np.array(["bike"])), "2 paths but 1 labels"),
        ([np.array(["a.png"])], "expected a tuple"),
        ((np.array([1, 2]), np.array(["bike", "mug"])), "entry 0's path is int"),
    ],
)
def test_office_malformed_pickle(office_root: Path, tmp_path: Path, content, match) -> None:
    pkl = office_root / "office_caltech_10" / "dslr_train.pkl"
    dump(pkl, content)
    with pytest.raises(DataError, match=match) as err:
        load_office(office(office_root, tmp_path, domains=["dslr"]))
    assert str(pkl) in str(err.value)


def test_office_too_small_and_bad_params(office_root: Path, tmp_path: Path) -> None:
    small = {"amazon": (2, 1)}
    make_path_pickles(tmp_path / "small", "office_caltech_10", small, fp.OFFICE_CLASSES)
    with pytest.raises(DataError, match="val split empty"):  # int(0.4 * 2) = 0
        load_office(office(tmp_path / "small", tmp_path, domains=["amazon"]))
    for kw, key in (
        ({"split": "fedavg"}, "dataset.split"),
        ({"size": 0}, "dataset.size"),
        ({"max_per_split": 0}, "dataset.max_per_split"),
        ({"domains": ["amazon", "real"]}, "dataset.domains"),
        ({"cache": "yes"}, "dataset.cache"),
    ):
        with pytest.raises(ConfigError, match=key):
            load_office(office(office_root, tmp_path, **kw))


DOMAINNET_SIZES = {
    "clipart": (22, 2),
    "infograph": (25, 2),
    "painting": (21, 2),
    "quickdraw": (20, 3),
    "real": (24, 2),
    "sketch": (23, 2),
}


def test_domainnet_fedbn_and_fedfa_splits(tmp_path: Path) -> None:
    root = make_path_pickles(tmp_path / "data", "DomainNet", DOMAINNET_SIZES, fp.DOMAINNET_CLASSES)
    p = DomainNetParams(root=str(root), size=8, cache=False)
    fed = load_domainnet(p)
    assert fed.client_names == list(DOMAINNET_SIZES) and fed.classes == fp.DOMAINNET_CLASSES
    # m = 20: train = first int(0.05 m) = 1, val = last 1
    for domain, (n, n_test) in DOMAINNET_SIZES.items():
        c = fed.client(domain)
        assert entries(c.train.x) == [0] and entries(c.val.x) == [n - 1]
        assert len(c.test) == n_test
    p.split, p.fedfa_train = "fedfa", "released"
    fed = load_domainnet(p)
    # FedFA released: train = first int(0.8 0.6 n), val = last int(0.2 n)
    c = fed.client("quickdraw")  # n = 20: int(9.6) = 9, int(4.0) = 4
    assert entries(c.train.x) == list(range(9)) and entries(c.val.x) == [16, 17, 18, 19]
    c = fed.client("infograph")  # n = 25: int(12.0) = 12 (0.48 25 = 12.000000000000002), 5
    assert entries(c.train.x) == list(range(12)) and entries(c.val.x) == list(range(20, 25))
    assert c.val.y.tolist() == [0, 1, 2, 3, 4]  # labels follow FedBN's class order


def test_domainnet_registry_and_missing_pickle(tmp_path: Path) -> None:
    root = make_path_pickles(tmp_path / "data", "DomainNet", DOMAINNET_SIZES, fp.DOMAINNET_CLASSES)
    section = {"name": "domainnet", "root": str(root), "size": 8, "domains": ["real"]}
    fed = load_dataset({**section, "cache": False})
    assert fed.name == "domainnet" and fed.counts()["real"] == {"train": 1, "val": 1, "test": 2}
    assert DATASETS.entry("domainnet").params is DomainNetParams
    (root / "DomainNet" / "real_train.pkl").unlink()
    with pytest.raises(MissingSourceError, match=r"(?s)real_train\.pkl is missing.*DomainNet/"):
        load_dataset({**section, "cache": False})


# --------------------------------------------------------------------------------------------
# pacs and officehome (folder per domain and class)
# --------------------------------------------------------------------------------------------

# class -> images per domain; created in unsorted order on purpose
PACS_COUNTS = {"giraffe": 3, "dog": 10, "elephant": 5}


def make_folders(base: Path, folders: list[str], counts: dict[str, int], ext: str = ".png"):
    """``base/<folder>/<class>/img_<i><ext>``, colour (10 i + 5, 40 d + 10, 60 class)."""
    for d, folder in enumerate(folders):
        for k, (cls, n) in enumerate(counts.items()):
            for i in range(n):
                png(base / folder / cls / f"img_{i:02d}{ext}", (10 * i + 5, 40 * d + 10, 60 * k))
    return base


@pytest.fixture
def pacs_root(tmp_path: Path) -> Path:
    folders = ["photo", "art_painting", "cartoon", "sketch"]
    return make_folders(tmp_path / "PACS", folders, PACS_COUNTS)


def pacs(root: Path, tmp_path: Path, **kw) -> PACSParams:
    return PACSParams(**{"root": str(root), "size": 8, "cache_dir": str(tmp_path / "cache"), **kw})


def test_pacs_classes_split_sizes_and_disjointness(pacs_root: Path, tmp_path: Path) -> None:
    fed = load_pacs(pacs(pacs_root, tmp_path))
    assert fed.client_names == ["photo", "art_painting", "cartoon", "sketch"]
    assert fed.classes == ["dog", "elephant", "giraffe"] and fed.input_shape == (3, 8, 8)
    blue_of = {"giraffe": 0, "dog": 60, "elephant": 120}
    # per class: cut at int(0.64 n), int(0.8 n): n=10 -> 6/2/2, n=5 -> 3/1/1, n=3 -> 1/1/1
    expected = {"train": [6, 3, 1], "val": [2, 1, 1], "test": [2, 1, 1]}
    for c in fed.clients:
        seen = []
        for s in ("train", "val", "test"):
            split = c.split(s)
            assert torch.bincount(split.y, minlength=3).tolist() == expected[s]
            blues = values(split.x, 2)
            assert blues == [blue_of[fed.classes[int(y)]] for y in split.y]  # labels paired
            seen += list(zip(blues, entries(split.x), strict=True))
        assert len(set(seen)) == len(seen) == 18  # disjoint, and every image is used
    assert fed.info["available"]["photo"] == {"train": 10, "val": 4, "test": 4}


def test_pacs_seeded_split_and_fractions(pacs_root: Path, tmp_path: Path) -> None:
    a = load_pacs(pacs(pacs_root, tmp_path, domains=["sketch"], cache=False))
    b = load_pacs(pacs(pacs_root, tmp_path, domains=["sketch"], cache=False))
    assert torch.equal(a.clients[0].test.x, b.clients[0].test.x)
    picks = {
        tuple(
            entries(
                load_pacs(pacs(pacs_root, tmp_path, domains=["sketch"], seed=s, cache=False))
                .clients[0]
                .test.x
            )
        )
        for s in range(4)
    }
    assert len(picks) > 1  # the seed moves the split
    fed = load_pacs(pacs(pacs_root, tmp_path, domains=["sketch"], fractions=[0.5, 0.2, 0.3]))
    # n=10 -> 5/2/3, n=5 -> int(2.5)=2, int(3.5)=3 -> 2/1/2, n=3 -> 1/1/1 (int(0.6), int(2.1))
    assert len(fed.clients[0].train) == 5 + 2 + 1 and len(fed.clients[0].test) == 3 + 2 + 1


def test_pacs_kfold_layout_and_skipped_files(tmp_path: Path) -> None:
    root = tmp_path / "PACS"
    make_folders(root / "kfold", ["photo", "sketch"], PACS_COUNTS, ext=".jpg")
    (root / "kfold" / "photo" / "dog" / "Thumbs.db").write_bytes(b"x")
    (root / "kfold" / "photo" / "dog" / ".hidden.png").write_bytes(b"x")
    fed = load_pacs(pacs(root, tmp_path, domains=["photo", "sketch"], max_per_split=3))
    assert fed.info["layout_base"] == str(root / "kfold")
    assert fed.info["skipped_files"] == {"photo": 1, "sketch": 0}
    assert [len(c.train) for c in fed.clients] == [3, 3]
    # the cap keeps class shares: 3 of (6, 3, 1) -> 2, 1, 0 (largest remainder)
    assert torch.bincount(fed.clients[0].train.y, minlength=3).tolist() == [2, 1, 0]


def test_pacs_layout_errors(pacs_root: Path, tmp_path: Path) -> None:
    with pytest.raises(MissingSourceError, match=r"(?s)dataset.root.*kfold"):
        load_pacs(PACSParams())
    with pytest.raises(MissingSourceError, match="holds none of the pacs domain folders"):
        load_pacs(pacs(tmp_path / "PACS" / "photo", tmp_path))
    # class folders differing across domains: named domain and difference
    os.rename(pacs_root / "cartoon" / "elephant", pacs_root / "cartoon" / "horse")
    with pytest.raises(DataError, match=r"'cartoon'.*lacks \['elephant'\].*extra \['horse'\]"):
        load_pacs(pacs(pacs_root, tmp_path))
    os.rename(pacs_root / "cartoon" / "horse", pacs_root / "cartoon" / "elephant")
    for f in (pacs_root / "art_painting" / "giraffe").iterdir():
        f.unlink()
    with pytest.raises(DataError, match=r"art_painting/giraffe holds no image file"):
        load_pacs(pacs(pacs_root, tmp_path))
    for f in (pacs_root / "art_painting" / "giraffe").iterdir():
        f.unlink()
    (pacs_root / "art_painting" / "giraffe").rmdir()
    os.rename(pacs_root / "art_painting", tmp_path / "moved")
    with pytest.raises(MissingSourceError, match=r"domain 'art_painting' needs the folder"):
        load_pacs(pacs(pacs_root, tmp_path))
    (pacs_root / "kfold" / "photo").mkdir(parents=True)
    with pytest.raises(DataError, match="point dataset.root at the one"):
        load_pacs(pacs(pacs_root, tmp_path, domains=["photo"]))


def test_pacs_unreadable_image_and_empty_split(pacs_root: Path, tmp_path: Path) -> None:
    bad = pacs_root / "photo" / "giraffe" / "img_00.png"
    bad.write_bytes(b"not an image")
    with pytest.raises(DataError, match=r"img_00\.png: Pillow cannot read"):
        load_pacs(pacs(pacs_root, tmp_path, domains=["photo"]))
    few = make_folders(tmp_path / "few", ["photo"], {"dog": 2})
    with pytest.raises(DataError, match="empty val split"):  # n=2: int(1.28), int(1.6) -> 1, 1
        load_pacs(pacs(few, tmp_path, domains=["photo"]))
    with pytest.raises(ConfigError, match="dataset.fractions"):
        load_pacs(pacs(pacs_root, tmp_path, fractions=[0.7, 0.2, 0.2]))


def test_officehome_folder_names(tmp_path: Path) -> None:
    root = tmp_path / "OfficeHome"
    make_folders(root, ["Art", "Clipart", "Product", "Real World"], {"Bike": 4, "Alarm_Clock": 5})
    fed = load_officehome(OfficeHomeParams(root=str(root), size=8, cache=False))
    assert fed.client_names == ["art", "clipart", "product", "real_world"]
    assert fed.classes == ["Alarm_Clock", "Bike"] and fed.input_shape == (3, 8, 8)
    assert values(fed.client("real_world").train.x, 1) == [130] * len(fed.clients[3].train)
    os.rename(root / "Real World", root / "Real_World")
    fed = load_officehome(OfficeHomeParams(root=str(root), size=8, cache=False))
    assert fed.info["domain_folders"]["real_world"] == str(root / "Real_World")
    # default image size is 224
    assert OfficeHomeParams().size == 224 and PACSParams().size == 224


# --------------------------------------------------------------------------------------------
# cifar
# --------------------------------------------------------------------------------------------


def cifar_rows(codes: np.ndarray) -> np.ndarray:
    """(N, 3072) rows: R plane = code, G plane = row index r of the pixel, B plane = col c."""
    r, c = np.meshgrid(np.arange(32), np.arange(32), indexing="ij")
    rows = np.empty((len(codes), 3, 32, 32), dtype=np.uint8)
    rows[:, 0] = codes[:, None, None]
    rows[:, 1] = r * 7
    rows[:, 2] = c * 3
    return rows.reshape(len(codes), 3072)


def make_cifar10(root: Path, per_batch: int = 20) -> Path:
    folder = root / "cifar-10-batches-py"
    for k in range(1, 6):
        codes = (per_batch * (k - 1) + np.arange(per_batch)).astype(np.uint8)
        batch = {
            b"batch_label": b"training batch",
            b"labels": [int(v) % 10 for v in codes],
            b"data": cifar_rows(codes),
            b"filenames": [b"f.png"] * per_batch,
        }
        dump(folder / f"data_batch_{k}", batch, protocol=2)
    codes = (200 + np.arange(20)).astype(np.uint8)
    test = {b"labels": [int(v) % 10 for v in codes], b"data": cifar_rows(codes)}
    dump(folder / "test_batch", test, protocol=2)
    names = [n.encode() for n in ["airplane", "automobile", "bird", "cat", "deer"]]
    names += [n.encode() for n in ["dog", "frog", "horse", "ship", "truck"]]
    dump(folder / "batches.meta", {b"label_names": names, b"num_vis": 3072}, protocol=2)
    return root


def test_cifar10_layout_channels_and_splits(tmp_path: Path) -> None:
    root = make_cifar10(tmp_path / "data")
    fed = load_cifar10(CifarParams(root=str(root), val_size=20))
    assert fed.client_names == ["cifar10"] and fed.input_shape == (3, 32, 32)
    assert fed.classes[:3] == ["airplane", "automobile", "bird"] and len(fed.classes) == 10
    c = fed.clients[0]
    assert (len(c.train), len(c.val), len(c.test)) == (80, 20, 20)
    assert torch.bincount(c.val.y, minlength=10).tolist() == [2] * 10
    codes = values(c.train.x, 0) + values(c.val.x, 0)
    assert sorted(codes) == list(range(100))  # disjoint, all used
    assert [v % 10 for v in values(c.train.x, 0)] == c.train.y.tolist()
    # row-major planes: G = 7 r (rows), B = 3 c (columns)
    assert c.test.x[0, 1, 5, 0] * 255 == pytest.approx(35) and c.test.x[0, 1, 0, 5] == 0
    assert c.test.x[0, 2, 0, 4] * 255 == pytest.approx(12) and c.test.x[0, 2, 4, 0] == 0
    assert c.train.y.dtype == torch.int64 and c.train.x.dtype == torch.float32
    # root may be the batches folder itself; sizes draw stratified subsets
    fed = load_cifar10(
        CifarParams(
            root=str(root / "cifar-10-batches-py"), val_size=10, train_size=30, test_size=10
        )
    )
    c = fed.clients[0]
    assert torch.bincount(c.train.y, minlength=10).tolist() == [3] * 10
    assert torch.bincount(c.test.y, minlength=10).tolist() == [1] * 10
    assert not set(values(c.train.x, 0)) & set(values(c.val.x, 0))


def test_cifar10_errors(tmp_path: Path) -> None:
    root = make_cifar10(tmp_path / "data")
    folder = root / "cifar-10-batches-py"
    with pytest.raises(MissingSourceError, match=r"(?s)dataset.root.*data_batch_1"):
        load_cifar10(CifarParams())
    with pytest.raises(MissingSourceError, match="holds neither cifar-10-batches-py"):
        load_cifar10(CifarParams(root=str(tmp_path)))
    with pytest.raises(ConfigError, match="dataset.label_kind"):
        load_cifar10(CifarParams(root=str(root), label_kind="coarse"))
    with pytest.raises(ConfigError, match="dataset.val_size"):
        load_cifar10(CifarParams(root=str(root), val_size=100))
    with pytest.raises(ConfigError, match="dataset.train_size"):
        load_cifar10(CifarParams(root=str(root), val_size=20, train_size=81))
    with pytest.raises(ConfigError, match="dataset.test_size"):
        load_cifar10(CifarParams(root=str(root), val_size=20, test_size=21))
    bad = folder / "data_batch_3"
    dump(bad, {b"data": cifar_rows(np.arange(4, dtype=np.uint8)), b"labelz": [0] * 4}, 2)
    with pytest.raises(DataError, match=r"data_batch_3: no key\(s\) \[b'labels'\]"):
        load_cifar10(CifarParams(root=str(root), val_size=20))
    dump(bad, {b"data": np.zeros((4, 1024), np.uint8), b"labels": [0] * 4}, 2)
    with pytest.raises(DataError, match=r"data_batch_3: b'data' rows have 1024 values"):
        load_cifar10(CifarParams(root=str(root), val_size=20))
    dump(bad, {b"data": cifar_rows(np.arange(4, dtype=np.uint8)), b"labels": [0, 1, 2]}, 2)
    with pytest.raises(DataError, match=r"data_batch_3: b'labels' has shape \(3,\)"):
        load_cifar10(CifarParams(root=str(root), val_size=20))
    dump(bad, {b"data": cifar_rows(np.arange(4, dtype=np.uint8)), b"labels": [0, 1, 2, 10]}, 2)
    with pytest.raises(DataError, match=r"labels span 0\.\.10 but .*batches.meta names 10"):
        load_cifar10(CifarParams(root=str(root), val_size=20))
    dump(bad, {b"data": datetime.date(2020, 1, 1)}, 2)
    with pytest.raises(DataError, match="refusing to build datetime.date"):
        load_cifar10(CifarParams(root=str(root), val_size=20))
    bad.unlink()
    with pytest.raises(MissingSourceError, match=r"data_batch_3 is missing"):
        load_cifar10(CifarParams(root=str(root), val_size=20))


def test_cifar100_fine_and_coarse(tmp_path: Path) -> None:
    folder = tmp_path / "cifar-100-python"
    n = 200
    codes = np.arange(n)
    data = cifar_rows((codes % 256).astype(np.uint8))
    train = {b"data": data, b"fine_labels": list(codes % 100), b"coarse_labels": list(codes % 20)}
    dump(folder / "train", train, protocol=2)
    test = {
        b"data": data[:50],
        b"fine_labels": list(codes[:50] % 100),
        b"coarse_labels": list(codes[:50] % 20),
    }
    dump(folder / "test", test, protocol=2)
    meta = {
        b"fine_label_names": [f"f{i}".encode() for i in range(100)],
        b"coarse_label_names": [f"c{i}".encode() for i in range(20)],
    }
    dump(folder / "meta", meta, protocol=2)
    fed = load_cifar100(CifarParams(root=str(tmp_path), val_size=100))
    assert len(fed.classes) == 100 and fed.classes[7] == "f7"
    c = fed.clients[0]
    assert (len(c.train), len(c.val), len(c.test)) == (100, 100, 50)
    assert torch.bincount(c.val.y, minlength=100).tolist() == [1] * 100
    assert [v % 100 for v in values(c.val.x, 0)] == c.val.y.tolist()
    fed = load_cifar100(CifarParams(root=str(folder), val_size=40, label_kind="coarse"))
    assert fed.classes == [f"c{i}" for i in range(20)]
    c = fed.clients[0]
    assert torch.bincount(c.val.y, minlength=20).tolist() == [2] * 20
    assert [v % 20 for v in values(c.train.x, 0)] == c.train.y.tolist()


def test_read_array_pickle_accepts_numpy_protocols(tmp_path: Path) -> None:
    arrays = (np.arange(6, dtype=np.uint8).reshape(2, 3), np.array(["a", "bc"]))
    for protocol in (2, 4, 5):
        path = tmp_path / f"p{protocol}.pkl"
        dump(path, arrays, protocol)
        got = read_array_pickle(path, "arrays")
        assert np.array_equal(got[0], arrays[0]) and list(got[1]) == ["a", "bc"]


def test_resize_uint8_matches_pillow_on_gradients() -> None:
    """Antialiased bilinear + 8-bit rounding agrees with Pillow's bilinear resize within 1."""
    rng = np.random.default_rng(0)
    img = rng.integers(0, 256, size=(32, 32), dtype=np.uint8)
    ours = resize_uint8(img[None, None], 28)[0, 0].astype(int)
    pil = np.asarray(Image.fromarray(img).resize((28, 28), Image.BILINEAR)).astype(int)
    assert np.abs(ours - pil).max() <= 1


@pytest.mark.parametrize(
    "overrides, key",
    [
        (["dataset.name=pacs", "dataset.domains=[photo,foo]"], "dataset.domains"),
        (["dataset.name=officehome", "dataset.max_per_split=0"], "dataset.max_per_split"),
        (["dataset.name=office-caltech10", "dataset.split=fedavg"], "dataset.split"),
        (["dataset.name=domainnet", "dataset.size=0"], "dataset.size"),
        (["dataset.name=digits5", "dataset.val_fraction=0"], "dataset.val_fraction"),
        (["dataset.name=cifar100", "dataset.val_size=0"], "dataset.val_size"),
    ],
)
def test_config_time_checks_name_the_key(overrides: list[str], key: str) -> None:
    from fedshift.catalog import resolve
    from fedshift.core.config import load_config

    with pytest.raises(ConfigError, match=key):
        resolve(load_config(None, [*overrides, "model.name=cnn"]))


def test_fedfa_domainnet_split_table12(tmp_path):
    from fedshift.data.domains import fedbn_pickles as fp
    from fedshift.data.domains.fedbn_pickles import DomainNetParams, load_domainnet, split_bounds

    # Table 12 from the released train pickles (clipart 2,103 ... real 4,864 entries)
    sizes = {
        "clipart": 2103,
        "infograph": 2626,
        "painting": 2472,
        "quickdraw": 4000,
        "real": 4864,
        "sketch": 2213,
    }
    train = {
        "clipart": 672,
        "infograph": 840,
        "painting": 791,
        "quickdraw": 1280,
        "real": 1556,
        "sketch": 708,
    }
    val = {
        "clipart": 420,
        "infograph": 525,
        "painting": 494,
        "quickdraw": 800,
        "real": 972,
        "sketch": 442,
    }
    for d, n in sizes.items():
        b = split_bounds("domainnet", "fedfa", n, 0)
        assert b["train"] == (0, train[d]) and b["val"] == (n - val[d], n), d
        assert split_bounds("domainnet", "fedfa", n, 0, "released")["train"][1] == int(0.48 * n)
    root = make_path_pickles(tmp_path / "data", "DomainNet", DOMAINNET_SIZES, fp.DOMAINNET_CLASSES)
    fed = load_domainnet(DomainNetParams(root=str(root), size=8, cache=False, split="fedfa"))
    c = fed.client("infograph")  # n = 25: int(8.0) = 8 train, last int(5.0) = 5 val
    assert entries(c.train.x) == list(range(8)) and entries(c.val.x) == list(range(20, 25))
    with pytest.raises(ConfigError, match="fedfa_train"):
        load_domainnet(DomainNetParams(root=str(root), size=8, fedfa_train="released"))
