"""Classification benchmarks of natural images, read from the user's disk or generated.

Feature-skew federations (one client per domain):

* :mod:`~fedshift.data.domains.fedbn_pickles`: ``digits5``, ``office-caltech10``,
  ``domainnet`` in FedBN's pickled layout;
* :mod:`~fedshift.data.domains.image_folders`: ``pacs`` and ``officehome``, a folder per
  domain and class;
* :mod:`~fedshift.data.domains.toy`: ``toyshift`` / ``toyseg``, tiny synthetic data for tests
  and smoke runs.

One-client datasets meant to be re-split by a label-skew ``partition``:

* :mod:`~fedshift.data.domains.fashion`: ``fashion-mnist`` (Debian's package);
* :mod:`~fedshift.data.domains.cifar`: ``cifar10`` / ``cifar100`` (python batches);
* :mod:`~fedshift.data.domains.distrans_folders`: DisTrans's ``chmnist`` and ``cub200``.

:mod:`~fedshift.data.common.image_files` holds what the image-file loaders share (here and
``camelyon17`` in :mod:`~fedshift.data.medical`): which files make up each split, reading and
resizing them, and the uint8 cache of decoded images.
"""
