"""The component catalog: config section -> registry, and config resolution against it.

This module sits above the components (data, models, algorithms, augments): it imports them
all, so :func:`resolve` can check a ``{name: ..., **params}`` section against its component's
parameter dataclass and the algorithm/augment/dataset combination against each other. The
config *schema* (:mod:`fedshift.core.config`) knows nothing of the components.

Algorithms, augments and models may also be a user's own classes, named ``module:Class`` or
by an entry point (:meth:`~fedshift.core.registry.Registry.accept_plugins`, switched on
below), and every ``model`` section takes pretrained weights (``model.weights``,
:mod:`fedshift.models.weights`), resolved to the file's path and SHA-256.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

from fedshift.algorithms import ALGORITHMS, Algorithm
from fedshift.augment import AUGMENTS, Augment
from fedshift.core.config import (
    COMPONENT_SECTIONS,
    RunConfig,
    build_dataclass,
    check_ranges,
    unknown_key_error,
)
from fedshift.core.errors import ConfigError
from fedshift.core.registry import Registry
from fedshift.core.tasks import check_task
from fedshift.core.yamlsafe import short_repr
from fedshift.data import DATASETS, dataset_task
from fedshift.data.partition import PARTITIONS
from fedshift.models import MODELS, FedModel
from fedshift.models.weights import WEIGHT_KEYS, resolve_weights

REGISTRIES: dict[str, Registry] = {
    "algorithm": ALGORITHMS,
    "model": MODELS,
    "augment": AUGMENTS,
    "dataset": DATASETS,
    "partition": PARTITIONS,
}

# Components of your own, by 'module:Class' or an entry point in these groups
# (fedshift.core.registry, docs/EXTENDING.md); datasets and partitions are built in only.
ALGORITHMS.accept_plugins(Algorithm, "fedshift.algorithms")
AUGMENTS.accept_plugins(Augment, "fedshift.augments")
MODELS.accept_plugins(FedModel, "fedshift.models")


def registry_for(section: str) -> Registry:
    """The registry of a component config section (``algorithm``, ``model``, ...)."""
    try:
        return REGISTRIES[section]
    except KeyError:
        raise ConfigError(f"no registry for config section {section!r}") from None


def component_params(section: str, data: dict, prefix: str | None = None) -> tuple[str, Any]:
    """Validate a ``{name: ..., **params}`` section against the component's registry entry;
    errors name keys as ``<prefix>.<key>`` (default: the section)."""
    if not isinstance(data, dict) or "name" not in data:
        raise ConfigError(f"config section '{section}' needs a 'name' key, got {short_repr(data)}")
    reg = registry_for(section)
    entry = reg.entry(str(data["name"]), key=f"{section}.name")
    params_cls = entry.params
    rest = {k: v for k, v in data.items() if k != "name"}
    if section == "model":  # every model takes pretrained weights (resolve_weights)
        rest = {k: v for k, v in rest.items() if k not in WEIGHT_KEYS}
    prefix = prefix or section
    if params_cls is None:
        if rest:
            raise unknown_key_error(f"{prefix}.{next(iter(rest))}", ["name"])
        return entry.name, None
    return entry.name, build_dataclass(params_cls, rest, prefix)


def resolve(raw: dict, source: str = "config") -> RunConfig:
    """Validate a raw nested dict into a :class:`RunConfig` (component sections resolved)."""
    raw = dict(raw)
    defaults = RunConfig()
    for section in COMPONENT_SECTIONS:
        given = raw.get(section)
        if isinstance(given, dict) and "name" not in given:
            raw[section] = {"name": getattr(defaults, section)["name"], **given}
    try:
        cfg = build_dataclass(RunConfig, raw)
        objs = {}
        for section in COMPONENT_SECTIONS:
            name, params = component_params(section, getattr(cfg, section))
            objs[section] = params
            resolved = {"name": name}
            if params is not None:
                resolved.update(dataclasses.asdict(params))
            if section == "model":
                resolved.update(resolve_weights(getattr(cfg, section)))
            setattr(cfg, section, resolved)
        check_ranges(cfg)
        algo_cls = registry_for("algorithm").get(cfg.algorithm["name"])
        algo_cls.check(objs["algorithm"], cfg.train)
        implied = [
            a
            for a in algo_cls.implied_augments(objs["algorithm"])
            if a not in {x if isinstance(x, str) else x.get("name") for x in cfg.augment}
        ]
        cfg.augment = _resolve_augments([*implied, *cfg.augment], cfg.algorithm["name"])
        _check_task(cfg, algo_cls)
    except ConfigError as e:
        raise ConfigError(f"{source}: {e}") from None
    return cfg


def _resolve_augments(items: list, algorithm: str) -> list[dict]:
    """Each ``augment`` entry (a name or ``{name: ..., **params}``) validated and completed."""
    out, params_objs = [], []
    for i, item in enumerate(items):
        section = {"name": item} if isinstance(item, str) else item
        if not isinstance(section, dict):
            raise ConfigError(f"config key 'augment[{i}]': expected a name or a mapping")
        name = section.get("name") if isinstance(section.get("name"), str) else None
        if name is not None and name not in registry_for("augment"):
            with contextlib.suppress(ConfigError):  # a plug-in: loaded now, named below
                registry_for("augment").entry(name)
        # keys named as 'augment.<name>.<key>', the augments' own convention
        prefix = f"augment.{name}" if name in registry_for("augment") else "augment"
        name, params = component_params("augment", section, prefix)
        resolved = {"name": name}
        if params is not None:
            resolved.update(dataclasses.asdict(params))
        out.append(resolved)
        params_objs.append(params)
    names = [a["name"] for a in out]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise ConfigError(f"config key 'augment': {sorted(dup)} listed more than once")
    reg = registry_for("augment")
    for name, params in zip(names, params_objs, strict=True):
        reg.get(name).check(params, algorithm, [n for n in names if n != name])
    return out


def _check_task(cfg: RunConfig, algo_cls: Any) -> None:
    """The algorithm, augments, loss and partition must fit the dataset's task."""
    dataset = cfg.dataset["name"]
    augments = registry_for("augment")
    check_task(
        dataset_task(dataset),
        dataset,
        cfg.algorithm["name"],
        algo_cls.tasks,
        {a["name"]: augments.get(a["name"]).tasks for a in cfg.augment},
        cfg.train.loss,
        cfg.partition["name"],
    )
