"""The dataset contract: what a dataset is to fedshift, built in or a plug-in.

A dataset is a component like an algorithm: a spec with

* ``name``: its registry name (``dataset.name``); a plug-in is registered under the name it
  is asked for (its entry point's name, or ``module:Class``), which wins over its own;
* ``Params``: the dataclass of its config keys (``dataset.*``), or None for none;
* ``task``: ``classification`` (one class per image), ``segmentation`` (one class per
  pixel), or ``params`` when its ``Params`` decide (a ``task`` field, as ``arrays`` has);
  known before anything is loaded, so a config that cannot work fails at config time;
* ``load(params) -> Federation``: the clients' splits, built from the validated ``Params``
  (no download at run time: fedshift never fetches data).

:class:`DatasetSpec` states it as a typing protocol. Built-in datasets are registered with
these four facts by one ``DATASETS.add(name, load, Params, description, task=...)`` call each
(:mod:`fedshift.data`); a plug-in is a class (or an object) with these attributes, found by
an entry point in group ``fedshift.datasets`` or named ``module:Class``, checked by
:func:`dataset_entry` when it is registered and by :func:`check_loaded` when it loads.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, ClassVar, Protocol, runtime_checkable

from fedshift.core.contract import GUIDE, ContractError, check_params
from fedshift.core.federation import TASKS, Federation
from fedshift.core.registry import Entry

#: a dataset whose ``Params`` decide its task (their ``task`` field)
TASK_FROM_PARAMS = "params"
#: what a dataset's ``task`` may be
DATASET_TASKS = (*TASKS, TASK_FROM_PARAMS)

__all__ = [
    "DATASET_TASKS",
    "TASK_FROM_PARAMS",
    "DatasetSpec",
    "check_loaded",
    "dataset_entry",
    "params_task",
]


@runtime_checkable
class DatasetSpec(Protocol):
    """A dataset: its name, ``Params``, task and ``load`` (see the module docstring)."""

    #: registry name (``dataset.name``)
    name: ClassVar[str]
    #: dataclass of the dataset's config keys (``dataset.*``), None for none
    Params: ClassVar[type | None]
    #: ``classification``, ``segmentation`` or ``params`` (the Params' ``task`` field decides)
    task: ClassVar[str]

    @staticmethod
    def load(params: Any) -> Federation:
        """The federation, from the validated ``Params`` (None when ``Params`` is None)."""
        ...


def params_task(task: str, params: Any, params_type: type | None) -> str:
    """The task of a dataset declared ``task``: itself, or for ``params`` the ``task`` of
    ``params`` (the defaults of ``params_type`` when None)."""
    if task != TASK_FROM_PARAMS:
        return task
    if params is None and params_type is not None:
        params = params_type()
    return str(params.task)


def dataset_entry(name: str, obj: Any, what: str) -> Entry:
    """The registry entry of the plug-in ``obj`` (a class or an object with the members of
    :class:`DatasetSpec`), registered as ``name``; a :class:`ContractError` starting with
    ``what`` that names each member missing or wrong and how to fix it."""
    missing = [m for m in ("task", "load") if not hasattr(obj, m)]
    if missing:
        has = sorted(n for n in dir(obj) if not n.startswith("_"))
        raise ContractError(
            f"{what} is not a dataset: it has no {' and no '.join(missing)} (a dataset "
            f"declares name, Params, task and load(params) -> Federation; it has: "
            f"{', '.join(has) or 'nothing public'}; see {GUIDE})"
        )
    task = obj.task
    if task not in DATASET_TASKS:
        raise ContractError(
            f"{what}: its task is {task!r}; a dataset's task is one of "
            f"{', '.join(map(repr, DATASET_TASKS))} (see {GUIDE})"
        )
    params = getattr(obj, "Params", None)
    check_params(params, what)
    if task == TASK_FROM_PARAMS:
        fields = {f.name: f for f in dataclasses.fields(params)} if params else {}
        if "task" not in fields or fields["task"].default not in TASKS:
            raise ContractError(
                f"{what}: task 'params' means its Params decide the task, so its Params "
                f"need a field 'task' defaulting to one of {TASKS} (see {GUIDE})"
            )
    if isinstance(obj, type) and inspect.isfunction(inspect.getattr_static(obj, "load")):
        raise ContractError(
            f"{what}: load is a plain method, which needs an instance; fedshift calls "
            f"{obj.__name__}.load(params) on the class: make it a @staticmethod or "
            f"@classmethod (see {GUIDE})"
        )
    load = obj.load
    if not callable(load) or not _takes_one(load):
        shown = _signature(load)
        raise ContractError(
            f"{what}: load{shown} cannot be called as load(params), which is how fedshift "
            f"loads a dataset (see {GUIDE})"
        )
    doc = getattr(obj, "description", "") or (obj.__doc__ or "").strip().split("\n")[0]
    return Entry(name, load, params, doc, task)


def check_loaded(fed: Any, name: str, task: str, load: Any) -> Federation:
    """``fed``, what dataset ``name``'s ``load`` returned, if it is a :class:`Federation` of
    the declared ``task``; else a :class:`ContractError` naming the loader."""
    who = f"{getattr(load, '__module__', '?')}:{getattr(load, '__qualname__', '?')}"
    if not isinstance(fed, Federation):
        got = "None" if fed is None else f"a {type(fed).__name__}"
        raise ContractError(
            f"dataset {name!r}: {who} returned {got}, but a dataset's load returns a "
            f"fedshift Federation (fedshift.core.federation; see {GUIDE})"
        )
    if fed.task != task:
        raise ContractError(
            f"dataset {name!r}: {who} returned a {fed.task} federation, but the dataset "
            f"declares task {task!r}; make the two agree (see {GUIDE})"
        )
    return fed


def _takes_one(fn: Any) -> bool:
    try:
        inspect.signature(fn).bind(None)
    except TypeError:
        return False
    except ValueError:  # a builtin without a signature: nothing to compare
        return True
    return True


def _signature(fn: Any) -> str:
    try:
        return str(inspect.signature(fn))
    except (TypeError, ValueError):
        return ""
