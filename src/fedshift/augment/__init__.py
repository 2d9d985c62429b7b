"""Plug-ins composed with any algorithm (``augment: [...]`` in a config)."""

from __future__ import annotations

from fedshift.augment.base import Augment
from fedshift.core.components import Component
from fedshift.core.registry import Registry

AUGMENTS: Registry[type[Augment]] = Registry("augment")


def register(cls: type[Augment]) -> type[Augment]:
    AUGMENTS.add(cls.name, cls, cls.Params)
    return cls


def build_augments(
    sections: list[Component] | list[dict], seed: int, num_classes: int
) -> list[Augment]:
    """Instantiate the resolved ``augment`` components (or plain ``{name: ..., **params}``
    entries, validated first), in order."""
    out = []
    for section in sections:
        a = AUGMENTS.component(section, "augment")
        out.append(a.factory(a.params, seed, num_classes))
    return out


# Each module registers its augments with @register when imported.
from fedshift.augment import ampnorm, fedmix, fedrdn, ffa, geometric, mixing  # noqa: E402, F401

__all__ = ["AUGMENTS", "Augment", "build_augments", "register"]
