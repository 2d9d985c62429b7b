"""Datasets: name -> loader returning a :class:`~fedshift.core.federation.Federation`.

The loaders live in subpackages: :mod:`~fedshift.data.digits` (the offline digits
benchmark), :mod:`~fedshift.data.medical` (brain-mri, prostate, camelyon17, nuclei) and
:mod:`~fedshift.data.domains` (FedBN's pickles, PACS/OfficeHome, CIFAR, DisTrans's folders,
Fashion-MNIST, the synthetic toys); what they share is in :mod:`~fedshift.data.common`.
:mod:`~fedshift.core.federation` holds the federation types and :mod:`~fedshift.data.partition`
the label-skew partitions. This module keeps the registry :data:`DATASETS`,
:func:`load_dataset` and :func:`dataset_task`. A dataset follows the contract of
:mod:`fedshift.core.datasets` (name, Params, task, load); the federation types live in
:mod:`fedshift.core.federation`.
"""

from __future__ import annotations

from collections.abc import Callable

from fedshift.core.components import Component
from fedshift.core.config import RunConfig
from fedshift.core.datasets import (
    DATASET_TASKS,
    Dataset,
    check_loaded,
    dataset_entry,
    loader_failed,
    params_task,
)
from fedshift.core.errors import FedshiftError
from fedshift.core.federation import ClientData, Federation, Split
from fedshift.core.registry import Registry
from fedshift.data.digits import DIGITS_DATASET
from fedshift.data.domains.arrays import ARRAYS_DATASET
from fedshift.data.domains.cifar import CIFAR10_DATASET, CIFAR100_DATASET
from fedshift.data.domains.distrans_folders import CHMNIST_DATASET, CUB200_DATASET
from fedshift.data.domains.fashion import FASHION_MNIST_DATASET
from fedshift.data.domains.fedbn_pickles import (
    DIGITS5_DATASET,
    DOMAIN_NET_DATASET,
    OFFICE_CALTECH10_DATASET,
)
from fedshift.data.domains.image_folders import OFFICE_HOME_DATASET, PACS_DATASET
from fedshift.data.domains.toy import TOYSEG_DATASET, TOYSHIFT_DATASET
from fedshift.data.domains.user_folders import FOLDERS_DATASET
from fedshift.data.medical.brain_mri.build import BRAIN_MRI_DATASET
from fedshift.data.medical.camelyon import CAMELYON17_DATASET
from fedshift.data.medical.nuclei import NUCLEI_DATASET
from fedshift.data.medical.prostate import PROSTATE_DATASET
from fedshift.data.medical.segfolders import SEG_FOLDERS_DATASET

#: every built-in dataset: a :class:`~fedshift.core.datasets.Dataset` beside its loader with
#: the four facts of the dataset contract (name, Params, task, load) and a description, the
#: shape a plug-in has, checked by the plug-ins' :func:`~fedshift.core.datasets.dataset_entry`
BUILT_IN: tuple[Dataset, ...] = (
    DIGITS_DATASET,
    FASHION_MNIST_DATASET,
    BRAIN_MRI_DATASET,
    PROSTATE_DATASET,
    CAMELYON17_DATASET,
    NUCLEI_DATASET,
    DIGITS5_DATASET,
    OFFICE_CALTECH10_DATASET,
    DOMAIN_NET_DATASET,
    PACS_DATASET,
    OFFICE_HOME_DATASET,
    CIFAR10_DATASET,
    CIFAR100_DATASET,
    CHMNIST_DATASET,
    CUB200_DATASET,
    FOLDERS_DATASET,
    SEG_FOLDERS_DATASET,
    ARRAYS_DATASET,
    TOYSHIFT_DATASET,
    TOYSEG_DATASET,
)
DATASETS: Registry[Callable[..., Federation]] = Registry("dataset", tasks=DATASET_TASKS)
for _spec in BUILT_IN:
    _entry = dataset_entry(_spec.name, _spec, f"built-in dataset {_spec.name!r}")
    DATASETS.add(_entry.name, _entry.obj, _entry.params, _entry.description, task=_entry.task)


def dataset_task(name: str, params: object = None) -> str:
    """The task of a registered dataset, known before loading it (config-time checks): its
    registry entry's, or for a dataset whose Params decide (``arrays``) the ``task`` of
    ``params`` (their defaults when None)."""
    entry = DATASETS.entry(name, "dataset.name")
    assert entry.task is not None  # DATASETS is made with tasks: every entry has one
    return params_task(entry.task, params, entry.params)


def load_dataset(
    section: Component | dict, partition: Component | dict | None = None
) -> Federation:
    """Load the dataset of a resolved ``dataset`` component, check what its loader returned
    against the dataset contract (:func:`fedshift.core.datasets.check_loaded`; a loader's
    ``sys.exit`` or a plug-in's exception is one error naming it), then apply the resolved
    ``partition`` (label skew across simulated clients; ``none`` by default). A plain
    ``{name: ..., **params}`` section is validated into its component first."""
    from fedshift.core.memory import check_fits
    from fedshift.data.partition import apply_partition

    dataset = DATASETS.component(section, "dataset")
    estimate = getattr(dataset.params, "memory_bytes", None)  # generated data: known early
    if callable(estimate):
        keys = ", ".join(f"dataset.{k}={v}" for k, v in dataset.to_dict().items() if k != "name")
        check_fits(
            estimate(),
            f"dataset {dataset.name!r} ({keys})",
            "lower dataset.train_size / val_size / test_size (or clients)",
        )
    if dataset.task is None:  # a component made without its registry entry
        task = dataset_task(dataset.name, dataset.params)
    else:  # resolved: the entry's task came with it, no second lookup
        task = params_task(dataset.task, dataset.params, type(dataset.params))
    load = dataset.factory
    try:
        fed = load(dataset.params)
    except SystemExit as e:  # a loader ending the program: one line naming it, no empty run
        raise loader_failed(e, dataset.name, load) from None
    except FedshiftError:
        raise
    except Exception as e:  # a plug-in's own code failed: named (built-ins: the traceback)
        if not DATASETS.is_plugin(dataset.name):
            raise
        raise loader_failed(e, dataset.name, load) from e
    fed = check_loaded(fed, dataset.name, task, load)
    return apply_partition(fed, partition or {"name": "none"})


def run_federation(cfg: RunConfig, preloaded: Federation | None = None) -> Federation:
    """The federation a run's clients hold: the config's dataset (or a ``preloaded``
    federation, e.g. the Python API's) through its ``partition``, then each client's
    ``federation.data_fraction`` of its training split. Every transport connects through this
    one function (in-process, the pool and its workers, a Flower SuperNode)."""
    from fedshift.data.partition import apply_partition

    if preloaded is None:
        fed = load_dataset(cfg.dataset, cfg.partition)
    else:
        fed = apply_partition(preloaded, cfg.partition)
    return fed.with_train_fraction(cfg.federation.data_fraction)


def federation_key(cfg: RunConfig) -> str:
    """What :func:`run_federation` depends on, as a string: a process that serves several
    runs (a pool worker, a SuperNode) reloads its federation only when it changes."""
    import json

    sections = [cfg.dataset.to_dict(), cfg.partition.to_dict(), cfg.federation.data_fraction]
    return json.dumps(sections, default=str)


def client_names(section: Component | dict, partition: Component | dict | None = None) -> list[str]:
    """The clients of the federation :func:`load_dataset` would load, named from the
    components' parameters where those name them (a partition's ``clients``, a dataset
    Params' ``client_names()``: ``toyshift``, ``toyseg``, ``digits``); loaded otherwise."""
    from fedshift.data.partition import PARTITIONS, dealt_client_names

    dataset = DATASETS.component(section, "dataset")
    part = PARTITIONS.component(partition or {"name": "none"}, "partition")
    if part.name != "none":
        names = dealt_client_names(part.params)
    else:
        declared = getattr(dataset.params, "client_names", None)
        names = declared() if callable(declared) else None
    return names if names is not None else load_dataset(dataset, part).client_names


__all__ = [
    "DATASETS",
    "ClientData",
    "Federation",
    "Split",
    "client_names",
    "dataset_task",
    "federation_key",
    "load_dataset",
    "run_federation",
]
