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
    TASK_FROM_PARAMS,
    check_loaded,
    loader_failed,
    params_task,
)
from fedshift.core.errors import FedshiftError
from fedshift.core.federation import ClientData, Federation, Split
from fedshift.core.registry import Registry
from fedshift.data.digits import DigitsParams, load_digits
from fedshift.data.domains.arrays import ArraysParams, load_arrays
from fedshift.data.domains.cifar import CifarParams, load_cifar10, load_cifar100
from fedshift.data.domains.distrans_folders import (
    CHMNISTParams,
    CUBParams,
    load_chmnist,
    load_cub200,
)
from fedshift.data.domains.fashion import FashionParams, load_fashion
from fedshift.data.domains.fedbn_pickles import (
    Digits5Params,
    DomainNetParams,
    OfficeParams,
    load_digits5,
    load_domainnet,
    load_office,
)
from fedshift.data.domains.image_folders import (
    OfficeHomeParams,
    PACSParams,
    load_officehome,
    load_pacs,
)
from fedshift.data.domains.toy import ToyParams, ToySegParams, load_toy, load_toyseg
from fedshift.data.domains.user_folders import FoldersParams, load_folders
from fedshift.data.medical.brain_mri import BrainMRIParams, load_brain_mri
from fedshift.data.medical.camelyon import CamelyonParams, load_camelyon
from fedshift.data.medical.nuclei import NucleiParams, load_nuclei
from fedshift.data.medical.prostate import ProstateParams, load_prostate
from fedshift.data.medical.segfolders import SegFoldersParams, load_segfolders

#: every built-in dataset, by one ``DATASETS.add(name, load, Params, description, task=...)``
#: call: the dataset contract (:mod:`fedshift.core.datasets`) with ``load`` as the entry's
#: object; plug-ins come in through :func:`fedshift.core.datasets.dataset_entry`
DATASETS: Registry[Callable[..., Federation]] = Registry("dataset", tasks=DATASET_TASKS)
DATASETS.add(
    "digits",
    load_digits,
    DigitsParams,
    "offline Digits: mnist, mnistm, optdigits, synth, opencv (real data from packages)",
    task="classification",
)
DATASETS.add(
    "fashion-mnist",
    load_fashion,
    FashionParams,
    "Fashion-MNIST (Debian dataset-fashion-mnist), one client; re-split it with a partition",
    task="classification",
)
DATASETS.add(
    "brain-mri",
    load_brain_mri,
    BrainMRIParams,
    "offline segmentation: real MNI152 brain anatomy (nilearn), K sites with simulated scanners",
    task="segmentation",
)
DATASETS.add(
    "prostate",
    load_prostate,
    ProstateParams,
    "multi-site prostate MRI segmentation (your NIfTI files: BIDMC, HK, I2CVB, BMC, RUNMC, UCL)",
    task="segmentation",
)
DATASETS.add(
    "camelyon17",
    load_camelyon,
    CamelyonParams,
    "Camelyon17 histology patches, five hospitals (your WILDS or HarmoFL data.pkl folder)",
    task="classification",
)
DATASETS.add(
    "nuclei",
    load_nuclei,
    NucleiParams,
    "nuclei segmentation, one site per folder (your <site>/{train,val,test}/{images,labels})",
    task="segmentation",
)
DATASETS.add(
    "digits5",
    load_digits5,
    Digits5Params,
    "Digits-5 in FedBN's layout (your MNIST, SVHN, USPS, SynthDigits, MNIST_M pickles)",
    task="classification",
)
DATASETS.add(
    "office-caltech10",
    load_office,
    OfficeParams,
    "Office-Caltech-10 in FedBN's layout (amazon, caltech, dslr, webcam; your pickles + images)",
    task="classification",
)
DATASETS.add(
    "domainnet",
    load_domainnet,
    DomainNetParams,
    "DomainNet's 10-class subset in FedBN's layout (six domains; your pickles + images)",
    task="classification",
)
DATASETS.add(
    "pacs",
    load_pacs,
    PACSParams,
    "PACS (photo, art_painting, cartoon, sketch; your folder per domain and class)",
    task="classification",
)
DATASETS.add(
    "officehome",
    load_officehome,
    OfficeHomeParams,
    "OfficeHome (Art, Clipart, Product, Real World; your folder per domain and class)",
    task="classification",
)
DATASETS.add(
    "cifar10",
    load_cifar10,
    CifarParams,
    "CIFAR-10 (your python batches); partition it",
    task="classification",
)
DATASETS.add(
    "cifar100",
    load_cifar100,
    CifarParams,
    "CIFAR-100 (your python batches); partition it",
    task="classification",
)
DATASETS.add(
    "chmnist",
    load_chmnist,
    CHMNISTParams,
    "CH-MNIST colorectal histology, 8 classes (your Kather 2016 tile folders); partition it",
    task="classification",
)
DATASETS.add(
    "cub200",
    load_cub200,
    CUBParams,
    "CUB-200-2011 birds, official split (your CUB_200_2011 folder); partition it",
    task="classification",
)
DATASETS.add(
    "folders",
    load_folders,
    FoldersParams,
    "your images: <root>/<site>/<class>/<image>, one client per site (`fedshift docs datasets`)",
    task="classification",
)
DATASETS.add(
    "segfolders",
    load_segfolders,
    SegFoldersParams,
    "your segmentation data: <root>/<site>/{images,masks}/ (PNG/TIFF or NIfTI volumes)",
    task="segmentation",
)
DATASETS.add(
    "arrays",
    load_arrays,
    ArraysParams,
    "your numpy arrays: <root>/<site>.npz (x, y[, split]) or fedshift.run(federation=...)",
    task=TASK_FROM_PARAMS,
)
DATASETS.add(
    "toyshift",
    load_toy,
    ToyParams,
    "tiny synthetic feature-shift data for smoke tests",
    task="classification",
)
DATASETS.add(
    "toyseg",
    load_toyseg,
    ToySegParams,
    "tiny synthetic segmentation data with feature shift (tests)",
    task="segmentation",
)


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
