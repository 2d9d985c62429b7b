"""Plug-ins composed with any algorithm (``augment: [...]`` in a config)."""

from __future__ import annotations

from fedshift.augment.base import Augment
from fedshift.core.registry import Registry

AUGMENTS: Registry[type[Augment]] = Registry("augment")


def register(cls: type[Augment]) -> type[Augment]:
    AUGMENTS.add(cls.name, cls, cls.Params)
    return cls


def build_augments(sections: list[dict], seed: int, num_classes: int) -> list[Augment]:
    """Instantiate the resolved ``augment`` config entries, in order."""
    out = []
    for section in sections:
        entry = AUGMENTS.entry(section["name"], key="augment")
        params = {k: v for k, v in section.items() if k != "name"}
        obj = entry.params(**params) if entry.params is not None else None
        out.append(entry.obj(obj, seed, num_classes))
    return out


# Each module registers its augments with @register when imported.
from fedshift.augment import ampnorm, fedmix, fedrdn, ffa, geometric, mixing  # noqa: E402, F401

__all__ = ["AUGMENTS", "Augment", "build_augments", "register"]
