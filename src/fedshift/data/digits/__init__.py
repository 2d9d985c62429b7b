"""The offline ``digits`` benchmark: five digit domains made from data shipped in packages.

* :mod:`~fedshift.data.digits.sources`: the raw sources and the image recipe of each domain
  (MNIST halves, MNIST-M blends, optdigits, synth font renders, OpenCV's sheet), each
  returning a :class:`~fedshift.data.digits.sources.Pool`;
* :mod:`~fedshift.data.digits.benchmark`: the parameters, the cached pools (checksummed
  ``.npy`` files), the stratified client splits, :func:`load_digits` and the montage.
"""

from fedshift.data.digits.benchmark import (
    CLASSES,
    DIGITS_DATASET,
    DOMAINS,
    DigitsParams,
    build_digits,
    load_digits,
    pool_dir,
    show_digits,
)
from fedshift.data.digits.sources import fetch_opencv

__all__ = [
    "CLASSES",
    "DOMAINS",
    "DIGITS_DATASET",
    "DigitsParams",
    "build_digits",
    "fetch_opencv",
    "load_digits",
    "pool_dir",
    "show_digits",
]
