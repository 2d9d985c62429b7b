"""Datasets: name -> loader returning a :class:`~fedshift.data.base.Federation`."""

from __future__ import annotations

from collections.abc import Callable

from fedshift.data.base import ClientData, Federation, Split
from fedshift.data.digits import DigitsParams, load_digits
from fedshift.data.fashion import FashionParams, load_fashion
from fedshift.data.toy import ToyParams, load_toy
from fedshift.registry import Registry

DATASETS: Registry[Callable[..., Federation]] = Registry("dataset")
DATASETS.add(
    "digits",
    load_digits,
    DigitsParams,
    "offline Digits: mnist, mnistm, optdigits, synth, opencv (real data from packages)",
)
DATASETS.add(
    "fashion-mnist",
    load_fashion,
    FashionParams,
    "Fashion-MNIST (Debian dataset-fashion-mnist), one client; re-split it with a partition",
)
DATASETS.add("toyshift", load_toy, ToyParams, "tiny synthetic feature-shift data for smoke tests")


def load_dataset(section: dict, partition: dict | None = None) -> Federation:
    """Load the dataset of a resolved ``dataset`` config section, then apply the resolved
    ``partition`` section (label skew across simulated clients; ``none`` by default)."""
    from fedshift.data.partition import apply_partition

    entry = DATASETS.entry(section["name"], key="dataset.name")
    params = entry.params(**{k: v for k, v in section.items() if k != "name"})
    fed = entry.obj(params)
    return apply_partition(fed, partition or {"name": "none"})


__all__ = ["DATASETS", "ClientData", "Federation", "Split", "load_dataset"]
