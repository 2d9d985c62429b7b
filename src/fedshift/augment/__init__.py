"""Plug-ins composed with any algorithm (``augment: [...]`` in a config), each registered
below by one :meth:`~fedshift.core.registry.Registry.add` call (the style every registry
uses: algorithms, models, datasets)."""

from __future__ import annotations

from fedshift.augment.ampnorm import AmpNorm
from fedshift.augment.base import Augment
from fedshift.augment.cfsi import CFSI
from fedshift.augment.fedmix import FedMix
from fedshift.augment.fedrdn import FedRDN, FedRDNV, Norm
from fedshift.augment.ffa import FFA
from fedshift.augment.geometric import FlipRotate, Rot90Flip
from fedshift.augment.mixing import ManifoldMixup, MixStyle, Mixup, MoEx
from fedshift.core.components import Component
from fedshift.core.registry import Registry

AUGMENTS: Registry[type[Augment]] = Registry("augment")
# an augment class carries its registry name and Params (what a plug-in class declares)
for _cls in (
    AmpNorm, FedMix, Norm, FedRDN, FedRDNV, FFA, FlipRotate, Rot90Flip, Mixup, ManifoldMixup,
    MixStyle, MoEx, CFSI,
):  # fmt: skip
    AUGMENTS.add(_cls.name, _cls, _cls.Params)


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


__all__ = ["AUGMENTS", "Augment", "build_augments"]
