"""``python -m fedshift.cli``: the same as the ``fedshift`` console script, with the current
folder that ``python -m`` puts first on the path moved last and guarded, as ``python -m
fedshift`` does (:mod:`fedshift.__main__`, :mod:`fedshift.core.searchpath`)."""

import os
import sys

_here = {"", ".", os.getcwd()}
if any(p in _here for p in sys.path):
    sys.path[:] = [p for p in sys.path if p not in _here] + [os.getcwd()]

from fedshift.core.searchpath import guard_current_folder  # noqa: E402 - after the path is fixed

guard_current_folder()

from fedshift.cli import main  # noqa: E402

sys.exit(main())
