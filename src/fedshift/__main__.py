"""``python -m fedshift``: the ``fedshift`` command.

``python -m`` puts the current folder first on Python's path, ahead of the standard library
and the installed packages, so a ``.py`` file lying in that folder (a shared or downloaded
one) named like a module fedshift imports (``yaml.py``, ``torch.py``...) would run in its
place. The current folder is moved to the end of the path instead (here, with ``os`` and
``sys`` only: nothing else is imported while the folder is first), and then serves
``module:Class`` plug-ins only (:mod:`fedshift.core.searchpath`): a plug-in module there is
still found by its ``module:Class`` name (docs/EXTENDING.md), and it can shadow nothing, nor
stand in for a module that is not installed (``wandb.py`` for ``track=[wandb]``).
"""

import os
import sys


def _current_folder_last() -> None:
    here = {"", ".", os.getcwd()}
    mine = [p for p in sys.path if p in here]
    if mine:
        sys.path[:] = [p for p in sys.path if p not in here] + [os.getcwd()]


_current_folder_last()

from fedshift.core.searchpath import guard_current_folder  # noqa: E402 - after the path is fixed

guard_current_folder()

from fedshift.cli import main  # noqa: E402

sys.exit(main())
