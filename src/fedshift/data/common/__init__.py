"""What every dataset loader shares, written once.

* :mod:`~fedshift.data.common.cache`: the cache folder (:func:`cache_dir`, honouring
  ``$FEDSHIFT_CACHE``) and atomic, pickle-free saving and loading of cached arrays;
* :mod:`~fedshift.data.common.seeding`: :func:`seeded_rng`, the one numpy generator recipe
  of the loaders (data seed + stable hash of a text tag);
* :mod:`~fedshift.data.common.sampling`: class quotas, stratified splits and subsamples, cut
  points of ordered lists;
* :mod:`~fedshift.data.common.checks`: ``dataset.*`` parameter checks and folder checks whose
  errors name the config key or the file and say how to fix it;
* :mod:`~fedshift.data.common.images`: reading image and mask files, resizing in torch;
* :mod:`~fedshift.data.common.image_files`: what the image-file loaders share (``folders``,
  ``pacs``, ``officehome``, ``camelyon17``, FedBN's pickles, DisTrans's folders): the files
  of each split, reading them, the uint8 decode cache and its memory budget;
* :mod:`~fedshift.data.common.pickles`: unpickling that builds numpy arrays and plain
  containers only (users' FedBN / CIFAR / HarmoFL pickles);
* :mod:`~fedshift.data.common.debian`: fetching files from a Debian package without
  installing it (OpenCV's digits sheet, Fashion-MNIST).

The dataset subpackages (:mod:`~fedshift.data.digits`, :mod:`~fedshift.data.medical`,
:mod:`~fedshift.data.domains`) import from here, from :mod:`fedshift.core.federation` and from
:mod:`fedshift.core`, never from each other.
"""
