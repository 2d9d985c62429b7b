"""The component catalog: config section -> registry, and config resolution against it.

This module sits above the components (data, models, algorithms, augments): it imports them
all, so :func:`resolve` can check a ``{name: ..., **params}`` section against its component's
parameter dataclass and the algorithm/augment/dataset combination against each other. The
config *schema* (:mod:`fedshift.core.config`) knows nothing of the components. Each section
resolves to a typed :class:`~fedshift.core.components.Component` (the name, the registered
class or loader, the validated ``Params``), which the builders take as it is.

Algorithms, augments, models and datasets may also be a user's own classes, named
``module:Class`` or by an entry point (:meth:`~fedshift.core.registry.Registry.accept_plugins`,
switched on below), and every ``model`` section takes pretrained weights (``model.weights``,
:mod:`fedshift.models.weights`), resolved to the file's path and SHA-256.
"""

from __future__ import annotations

import contextlib
from collections.abc import Collection
from typing import Any

from fedshift.algorithms import ALGORITHMS, Algorithm
from fedshift.augment import AUGMENTS, Augment
from fedshift.core.components import Component
from fedshift.core.config import RunConfig, build_dataclass, check_ranges
from fedshift.core.config_tree import COMPONENT_SECTIONS
from fedshift.core.context import model_input_shape
from fedshift.core.datasets import DatasetSpec, dataset_entry
from fedshift.core.errors import ConfigError
from fedshift.core.registry import Registry
from fedshift.core.tasks import check_task
from fedshift.core.yamlsafe import short_repr
from fedshift.data import DATASETS, dataset_task
from fedshift.data.domains.user_folders import DEFAULT_SIZE as FOLDERS_DEFAULT_SIZE
from fedshift.data.partition import PARTITIONS
from fedshift.models import MODEL_INPUTS, MODELS, FedModel, check_model_input
from fedshift.models.weights import WEIGHT_KEYS, resolve_weights

REGISTRIES: dict[str, Registry] = {
    "algorithm": ALGORITHMS,
    "model": MODELS,
    "augment": AUGMENTS,
    "dataset": DATASETS,
    "partition": PARTITIONS,
}

# Components of your own, by 'module:Class' or an entry point in these groups
# (fedshift.core.registry, docs/EXTENDING.md); partitions are built in only. A dataset
# plug-in follows the DatasetSpec contract (no base class): dataset_entry checks it.
ALGORITHMS.accept_plugins(Algorithm, "fedshift.algorithms")
AUGMENTS.accept_plugins(Augment, "fedshift.augments")
MODELS.accept_plugins(FedModel, "fedshift.models")
DATASETS.accept_plugins(DatasetSpec, "fedshift.datasets", dataset_entry)


def registry_for(section: str) -> Registry:
    """The registry of a component config section (``algorithm``, ``model``, ...)."""
    try:
        return REGISTRIES[section]
    except KeyError:
        raise ConfigError(f"no registry for config section {section!r}") from None


def component(section: str, data: Any, prefix: str | None = None) -> Component:
    """A ``{name: ..., **params}`` section validated into its typed component (errors name
    keys as ``<prefix>.<key>``, default: the section); a model's weights keys resolved
    (:func:`~fedshift.models.weights.resolve_weights`)."""
    if section != "model":
        return registry_for(section).component(data, section, prefix)
    found = MODELS.component(data, section, prefix, WEIGHT_KEYS)
    weights = tuple(resolve_weights(dict(found.extra)).items())
    return Component(found.name, found.params, found.obj, weights)


def resolve(raw: dict, source: str = "config") -> RunConfig:
    """Validate a raw nested dict into a :class:`RunConfig` whose component sections are
    typed :class:`~fedshift.core.components.Component` values (``augment`` a list of them)."""
    try:
        sections = {s: _given(raw, s) for s in COMPONENT_SECTIONS}
        augment = raw.get("augment", [])
        if not isinstance(augment, list):
            raise ConfigError(
                f"config key 'augment': expected a list of names or {{name: ..., **params}} "
                f"mappings (augment=[ffa]), got {short_repr(augment)}"
            )
        cfg = build_dataclass(RunConfig, raw, skip=(*COMPONENT_SECTIONS, "augment"))
        for section in COMPONENT_SECTIONS:
            setattr(cfg, section, component(section, sections[section]))
        check_ranges(cfg)
        algo = cfg.algorithm
        algo.factory.check(algo.params, cfg.train)
        given = [x.get("name") if isinstance(x, dict) else x for x in augment]
        implied = [a for a in algo.factory.implied_augments(algo.params) if a not in given]
        cfg.augment = _resolve_augments([*implied, *augment], algo.name)
        _check_task(cfg)
        _fit_images(cfg)
    except ConfigError as e:
        raise ConfigError(f"{source}: {e}") from None
    return cfg


def _fit_images(cfg: RunConfig) -> None:
    """A dataset whose image size is a config key (``folders``: ``size`` and ``channels``)
    and the model, chosen together before any image is decoded: an unset ``size`` takes the
    model's input size where the model has a fixed one (``cnn``, ``digitmodel``, ``lenet5``:
    28), else 224; a size the model cannot take is a :class:`ConfigError` naming the ways
    out (:func:`fedshift.models.check_model_input`)."""
    params = cfg.dataset.params
    shape_of = getattr(params, "input_shape", None)
    if shape_of is None:
        return
    if params.size is None:
        fixed = MODEL_INPUTS.get(cfg.model.name)
        params.size = fixed[-1] if fixed is not None else FOLDERS_DEFAULT_SIZE
    task = dataset_task(cfg.dataset.name, params)
    shape = model_input_shape(shape_of(), cfg.input.size)  # the model sees input.size
    check_model_input(cfg.model.name, cfg.model.factory, shape, task, "dataset.size")


def shown(raw: dict, source: str = "config", names: Collection[str] = ()) -> dict:
    """The config ``fedshift config show`` prints: ``resolve(raw).to_dict()``, except that
    every component named by one of ``names`` (plug-ins a read-only command does not import)
    is shown as written, its keys unchecked. Every other section is resolved and checked as
    :func:`resolve` does; the checks that need a held-back component's code (the algorithm
    against the augments and the dataset's task; an algorithm's implied augments) are not
    made."""
    if not names:
        return resolve(raw, source).to_dict()
    try:
        cfg = build_dataclass(RunConfig, raw, skip=(*COMPONENT_SECTIONS, "augment"))
        check_ranges(cfg)
        out = cfg.to_dict()
        for section in COMPONENT_SECTIONS:
            given = _given(raw, section)
            held = given.get("name") in names
            out[section] = dict(given) if held else component(section, given).to_dict()
        augment = raw.get("augment", [])
        if not isinstance(augment, list):
            augment = [augment]
        items = [x.get("name") if isinstance(x, dict) else x for x in augment]
        implied: list = []
        if out["algorithm"]["name"] not in names:
            algo = component("algorithm", _given(raw, "algorithm"))
            implied = [a for a in algo.factory.implied_augments(algo.params) if a not in items]
        rows = []
        for item in [*implied, *augment]:
            section = {"name": item} if isinstance(item, str) else item
            name = section.get("name") if isinstance(section, dict) else None
            if name in names:
                rows.append(dict(section))
            else:
                rows.append(component("augment", section, f"augment.{name}").to_dict())
        out["augment"] = rows
    except ConfigError as e:
        raise ConfigError(f"{source}: {e}") from None
    return out


def _given(raw: dict, section: str) -> dict:
    """The ``section`` a raw config gives (its default component's name filled in)."""
    if section not in raw:
        return {"name": getattr(RunConfig(), section).name}
    given = raw[section]
    if not isinstance(given, dict):
        raise ConfigError(f"config key '{section}': expected dict, got {short_repr(given)}")
    if "name" not in given:
        return {"name": getattr(RunConfig(), section).name, **given}
    return given


def _resolve_augments(items: list, algorithm: str) -> list[Component]:
    """Each ``augment`` entry (a name or ``{name: ..., **params}``) validated and completed."""
    out: list[Component] = []
    reg = registry_for("augment")
    for i, item in enumerate(items):
        section = {"name": item} if isinstance(item, str) else item
        if not isinstance(section, dict):
            raise ConfigError(f"config key 'augment[{i}]': expected a name or a mapping")
        name = section.get("name") if isinstance(section.get("name"), str) else None
        if name is not None and name not in reg:
            with contextlib.suppress(ConfigError):  # a plug-in: loaded now, named below
                reg.entry(name)
        # keys named as 'augment.<name>.<key>', the augments' own convention
        prefix = f"augment.{name}" if name in reg else "augment"
        out.append(component("augment", section, prefix))
    names = [a.name for a in out]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise ConfigError(f"config key 'augment': {sorted(dup)} listed more than once")
    for a in out:
        a.factory.check(a.params, algorithm, [n for n in names if n != a.name])
    return out


def _check_task(cfg: RunConfig) -> None:
    """The algorithm, augments, loss and partition must fit the dataset's task."""
    dataset = cfg.dataset.name
    check_task(
        dataset_task(dataset, cfg.dataset.params),
        dataset,
        cfg.algorithm.name,
        cfg.algorithm.factory.tasks,
        {a.name: a.factory.tasks for a in cfg.augment},
        cfg.train.loss,
        cfg.partition.name,
    )
    if cfg.input.size is not None and dataset_task(dataset, cfg.dataset.params) != "classification":
        raise ConfigError(
            f"config key 'input.size': it resizes the images, not their per-pixel masks, so "
            f"it is for classification only (dataset {dataset!r} is segmentation); drop "
            "input.size and set the dataset's own image size"
        )
