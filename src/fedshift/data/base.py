"""The federation types, re-exported from :mod:`fedshift.core.federation` (where the dataset
and algorithm contracts name them): ``from fedshift.data.base import Federation`` keeps
working."""

from fedshift.core.federation import SPLITS, TASKS, ClientData, Federation, Split

__all__ = ["SPLITS", "TASKS", "ClientData", "Federation", "Split"]
