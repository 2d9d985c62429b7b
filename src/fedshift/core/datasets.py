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

What ``load`` returns is checked before anything trains (:func:`check_loaded`, for built-in
datasets and plug-ins alike): a :class:`~fedshift.core.federation.Federation` of the
declared task, with

* ``classes``: a non-empty list of distinct strings (at most :data:`MAX_CLASSES`);
* ``clients``: at least one :class:`~fedshift.core.federation.ClientData`, named by
  distinct non-empty strings, each with a non-empty training split;
* every split's ``x``: float32 ``(N, C, H, W)`` images (or
  :class:`~fedshift.core.images.ByteImages`) of ``input_shape`` ``(C, H, W)``;
* every split's ``y``: int64 labels in ``[0, len(classes))``, ``(N,)`` for
  classification, ``(N, H, W)`` label maps (the images' size) for segmentation.

A federation that breaks one of these is a :class:`ContractError` naming the dataset, its
loader, the client and split, and the fix; the label range is read with one
``torch.aminmax`` per split (no copy of the labels), the images are never read. A loader
that calls ``sys.exit`` (:class:`SystemExit`) is the same kind of error
(:func:`loader_failed`), and so is any other exception a plug-in's loader raises.

:class:`DatasetSpec` states it as a typing protocol. A dataset is a class (or an object)
with these attributes (and an optional one-line ``description``): a built-in one is a
:class:`Dataset` beside its loader, listed in :data:`fedshift.data.BUILT_IN`; a plug-in is
found by an entry point in group ``fedshift.datasets`` or named ``module:Class``. Both are
checked by :func:`dataset_entry` when they are registered and by :func:`check_loaded` when
they load.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, ClassVar, Protocol, runtime_checkable

import torch

from fedshift.core.contract import check_params
from fedshift.core.contract_errors import GUIDE, ContractError
from fedshift.core.federation import SPLITS, TASKS, ClientData, Federation, Split
from fedshift.core.images import ByteImages
from fedshift.core.registry import Entry

#: a dataset whose ``Params`` decide its task (their ``task`` field)
TASK_FROM_PARAMS = "params"
#: what a dataset's ``task`` may be
DATASET_TASKS = (*TASKS, TASK_FROM_PARAMS)
#: the most classes a federation may have: a label of 10**12 is a mistake in the labels,
#: not a class list to allocate (ImageNet-21k has about 21,800)
MAX_CLASSES = 100_000

__all__ = [
    "DATASET_TASKS",
    "MAX_CLASSES",
    "Dataset",
    "TASK_FROM_PARAMS",
    "DatasetSpec",
    "check_federation",
    "check_loaded",
    "dataset_entry",
    "loader_failed",
    "loader_name",
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


@dataclasses.dataclass(frozen=True)
class Dataset:
    """A dataset as an object with the members of :class:`DatasetSpec` and a one-line
    ``description``: how fedshift declares its built-in datasets (each beside its loader,
    ``fedshift.data.BUILT_IN`` lists them), and one way for a plug-in to declare its own."""

    name: str
    Params: type | None  # noqa: N815 - the contract's member name
    task: str
    load: Any
    description: str = ""


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


def loader_name(load: Any) -> str:
    """``module:Qual.name`` of a dataset's ``load`` (what errors call it)."""
    return f"{getattr(load, '__module__', '?')}:{getattr(load, '__qualname__', '?')}"


def loader_failed(exc: BaseException, name: str, load: Any) -> ContractError:
    """The one-line error for dataset ``name``'s ``load`` ending in ``exc``: a ``sys.exit``
    (:class:`SystemExit`), or an exception of a plug-in's own code (a traceback from inside
    a user's loader says less than its name and message)."""
    who = loader_name(load)
    if isinstance(exc, SystemExit):
        return ContractError(
            f"dataset {name!r}: {who} called sys.exit({exc.code!r}) while loading; a "
            "dataset's load returns a Federation or raises an error, it must not end the "
            f"program (see {GUIDE})"
        )
    return ContractError(
        f"dataset {name!r}: {who} failed: {type(exc).__name__}: {exc} (call {who} with the "
        f"same Params to see where; see {GUIDE})"
    )


def check_loaded(fed: Any, name: str, task: str, load: Any) -> Federation:
    """``fed``, what dataset ``name``'s ``load`` returned, if it is a :class:`Federation` of
    the declared ``task`` that keeps the contract (module docstring:
    :func:`check_federation`); else a :class:`ContractError` naming the loader."""
    who = loader_name(load)
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
    check_federation(fed, f"dataset {name!r}: {who} returned a federation whose")
    return fed


def check_federation(fed: Federation, what: str) -> None:
    """Raise a :class:`ContractError` starting with ``what`` (e.g. ``dataset 'x': m:X.load
    returned a federation whose``) at the first rule of the module docstring ``fed`` breaks.
    Cheap: shapes and dtypes, and one ``aminmax`` over each split's labels."""

    def fail(problem: str, fix: str) -> ContractError:
        return ContractError(f"{what} {problem}; {fix} (see {GUIDE})")

    classes = fed.classes
    if not isinstance(classes, list | tuple) or not classes:
        raise fail(
            f"classes are {_shown(classes)}",
            "a federation names its classes in a non-empty list (segmentation: classes[0] is "
            "the background)",
        )
    if len(classes) > MAX_CLASSES:
        raise fail(
            f"classes are {len(classes)} names",
            f"at most {MAX_CLASSES} are taken: labels are class indices 0..C-1",
        )
    odd = next((c for c in classes if not isinstance(c, str) or not c), None)
    if odd is not None or len(set(classes)) != len(classes):
        shown = _shown(odd) if odd is not None else "a name twice"
        raise fail(f"classes hold {shown}", "class names are distinct non-empty strings")
    clients = fed.clients
    if not isinstance(clients, list | tuple) or not clients:
        raise fail(f"clients are {_shown(clients)}", "a federation has at least one client")
    seen: set[str] = set()
    for i, client in enumerate(clients):
        if not isinstance(client, ClientData):
            raise fail(f"clients[{i}] is {_shown(client)}", "each client is a ClientData")
        cname = client.name
        if not isinstance(cname, str) or not cname.strip():
            raise fail(f"clients[{i}] is named {cname!r}", "client names are non-empty strings")
        if cname in seen:
            raise fail(
                f"client name {cname!r} is given twice",
                "client names are distinct (a table row and a model per client)",
            )
        seen.add(cname)
        for split in SPLITS:
            _check_split(getattr(client, split, None), fed, f"client {cname!r} {split}", fail)
        if len(client.train) == 0:
            raise fail(
                f"client {cname!r} has an empty train split",
                "every client trains on at least one example (drop the client, or give it data)",
            )


def _check_split(part: Any, fed: Federation, where: str, fail: Any) -> None:
    """One split's images and labels against the federation's shape, task and classes."""
    if not isinstance(part, Split):
        raise fail(f"{where} split is {_shown(part)}", "each split is a Split(x, y)")
    x, y = part.x, part.y
    if isinstance(x, ByteImages):
        pass
    elif not isinstance(x, torch.Tensor) or x.dtype != torch.float32:
        got = f"{x.dtype} tensor" if isinstance(x, torch.Tensor) else type(x).__name__
        raise fail(
            f"{where} images are a {got}",
            "images are float32 tensors in [0, 1] (N, C, H, W), or ByteImages",
        )
    shape = tuple(int(s) for s in x.shape)
    want = tuple(fed.input_shape)
    if len(shape) != 4 or shape[1:] != want:
        raise fail(
            f"{where} images have shape {shape} but input_shape is {want}",
            "images are (N, C, H, W) with (C, H, W) = input_shape",
        )
    if not isinstance(y, torch.Tensor) or y.dtype != torch.int64:
        got = f"{y.dtype} tensor" if isinstance(y, torch.Tensor) else type(y).__name__
        raise fail(
            f"{where} labels are a {got}",
            "labels are int64 class indices (torch.long): convert them with y.long() after "
            "checking they are whole numbers",
        )
    n = shape[0]
    want_y = (n,) if fed.task == "classification" else (n, *shape[2:])
    if tuple(y.shape) != want_y:
        kind = "one class per image" if fed.task == "classification" else "one per pixel"
        raise fail(
            f"{where} labels have shape {tuple(y.shape)}, not {want_y}",
            f"a {fed.task} federation has {kind}",
        )
    if y.numel():
        lo, hi = (int(v) for v in torch.aminmax(y))
        classes = len(fed.classes)
        if lo < 0 or hi >= classes:
            bad = lo if lo < 0 else hi
            raise fail(
                f"{where} labels hold {bad}, outside 0..{classes - 1} ({classes} classes)",
                "labels index the classes list (0 .. len(classes) - 1)",
            )


def _shown(value: Any) -> str:
    """A short description of an unexpected value."""
    if value is None or isinstance(value, str | int | float | bool):
        return repr(value)
    if isinstance(value, list | tuple | dict) and not value:
        return f"an empty {type(value).__name__}"
    return f"a {type(value).__name__}"


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
