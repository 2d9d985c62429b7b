"""Label-skew partitions: re-split a dataset's pooled examples across simulated clients.

A partition is a config section ``partition: {name: ..., **params}``. ``none`` keeps the
dataset's own clients (its domains, the feature-skew setting). The others pool every client's
train/val/test splits and deal them out to ``clients`` new clients.
"""

from __future__ import annotations

from collections.abc import Callable

from fedshift.data.base import Federation
from fedshift.registry import Registry

PartitionFn = Callable[[Federation, object], Federation]
PARTITIONS: Registry[PartitionFn] = Registry("partition")


def keep(fed: Federation, params: object) -> Federation:
    """The dataset's own clients, unchanged."""
    return fed


PARTITIONS.add("none", keep, None, "keep the dataset's own clients (domains)")


def apply_partition(fed: Federation, section: dict) -> Federation:
    """Apply the resolved ``partition`` config section to a loaded federation."""
    entry = PARTITIONS.entry(section["name"], key="partition.name")
    rest = {k: v for k, v in section.items() if k != "name"}
    params = entry.params(**rest) if entry.params is not None else None
    return entry.obj(fed, params)
