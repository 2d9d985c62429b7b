"""Where the config sections find their components."""

from __future__ import annotations

from fedshift.errors import ConfigError
from fedshift.registry import Registry


def registry_for(section: str) -> Registry:
    if section == "algorithm":
        from fedshift.algorithms import ALGORITHMS

        return ALGORITHMS
    if section == "model":
        from fedshift.models import MODELS

        return MODELS
    if section == "augment":
        from fedshift.augment import AUGMENTS

        return AUGMENTS
    if section == "dataset":
        from fedshift.data import DATASETS

        return DATASETS
    if section == "partition":
        from fedshift.data.partition import PARTITIONS

        return PARTITIONS
    raise ConfigError(f"no registry for config section {section!r}")
