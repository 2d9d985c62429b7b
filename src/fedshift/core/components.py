"""Resolved component sections: a registered component's name, its implementation and its
validated parameters, as one frozen value (:class:`Component`).

A config names its components in ``{name: ..., **params}`` sections (``dataset``, ``model``,
``algorithm``, ``partition``, every ``augment`` entry). :func:`fedshift.catalog.resolve`
turns each into a :class:`Component` once: the registry entry is looked up, the parameters
validated into the component's ``Params`` dataclass
(:meth:`fedshift.core.registry.Registry.component`). Every builder
(``load_dataset``, ``apply_partition``, ``build_model``, ``build_augments``,
``build_experiment``) then takes the component as it is: no second registry lookup, no second
validation.

:meth:`Component.to_dict` is the section as ``config.yaml`` holds it, ``{name, **params,
**extra}`` (``extra``: keys every component of a section takes besides its own, a model's
pretrained-weights keys), so run directories, their config files and every digest made from
them are what they were when the sections were plain dicts.

A builder also takes a plain ``{name: ..., **params}`` mapping (a test, an exported model's
description read from disk): the builder's registry turns it into a component at that
boundary, once (:meth:`~fedshift.core.registry.Registry.component`).
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from fedshift.core.errors import ConfigError

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

#: the component's ``Params`` dataclass (an algorithm's ``FedProxParams``, ...)
P = TypeVar("P", bound="DataclassInstance")
#: what its registry holds (the class or loader function the builders call)
T = TypeVar("T")


@dataclass(frozen=True)
class Component(Generic[P, T]):
    """One resolved component section (see the module docstring).

    Generic in its ``Params`` dataclass ``P`` and in its implementation ``T``:
    ``Component[FedProxParams, type[FedProx]]``. A section resolved from a config by name
    (:meth:`fedshift.core.registry.Registry.component`) is ``Component[Any, T]``: which
    ``Params`` it holds is known only when the name is read.

    ``obj`` is what the registry holds under ``name`` (the class or loader function the
    builders call); ``None`` only in the default sections of a :class:`RunConfig` that was
    never resolved (``RunConfig()`` names its default components, nothing more)."""

    name: str
    #: the component's validated ``Params`` dataclass; None: it takes no keys
    params: P | None = None
    obj: T | None = field(default=None, repr=False)
    #: ``(key, value)`` pairs every component of its section takes besides its own
    #: parameters (a model's ``weights``, ``weights_sha256``, ``weights_skip``), resolved
    extra: tuple[tuple[str, Any], ...] = ()
    #: the registry entry's task (datasets: ``classification``, ``segmentation`` or
    #: ``params``); None where the registry has no tasks. Not part of the section's values
    task: str | None = field(default=None, compare=False, repr=False)

    @property
    def factory(self) -> T:
        """The registered implementation; a :class:`ConfigError` if never resolved."""
        if self.obj is None:
            raise ConfigError(
                f"component {self.name!r} was never resolved against its registry: pass the "
                "config through fedshift.catalog.resolve (or build it with Registry.component)"
            )
        return self.obj

    @property
    def extras(self) -> dict[str, Any]:
        """:attr:`extra` as a mapping (a copy)."""
        return copy.deepcopy(dict(self.extra))

    def to_dict(self) -> dict[str, Any]:
        """The section as a config file holds it: ``{name, **params, **extra}``."""
        out: dict[str, Any] = {"name": self.name}
        if self.params is not None:
            out.update(dataclasses.asdict(self.params))
        out.update(self.extras)
        return out

    def defaults(self) -> dict[str, Any]:
        """The default keys of this component's ``Params`` (``{}``: it takes none)."""
        return dataclasses.asdict(type(self.params)()) if self.params is not None else {}
