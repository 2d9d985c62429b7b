"""The trackers a run uses: the registry of ``track``'s names (:data:`TRACKERS`), the check
that each can run here, and :func:`trackers`, a run's trackers (hooks of its loop).

It sits above the trackers' modules (:mod:`fedshift.runtime.tracking.trackers`: the interface, CSV,
TensorBoard; :mod:`fedshift.runtime.tracking.services`: W&B, MLflow), which import nothing of
it, so no module imports one that imports it back.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from fedshift.core.registry import Registry
from fedshift.runtime.tracking.services import MlflowTracker, WandbTracker
from fedshift.runtime.tracking.trackers import CsvTracker, TensorBoardTracker, Tracker

__all__ = ["TRACKERS", "check_trackers", "trackers"]

#: the optional trackers, by their name in the ``track`` key (CSV always runs), registered as
#: every component is (:class:`~fedshift.core.registry.Registry`); none imports its package
#: before a run opens it
TRACKERS: Registry[type[Tracker]] = Registry("tracker")
for _name, _cls in (
    ("tensorboard", TensorBoardTracker),
    ("wandb", WandbTracker),
    ("mlflow", MlflowTracker),
):
    TRACKERS.add(_name, _cls)


def check_trackers(names: Iterable[str]) -> None:
    """Every tracker ``names`` asks for is registered and can run here (else a
    :class:`~fedshift.core.errors.ConfigError` naming the ``track`` key)."""
    for name in dict.fromkeys(names):
        TRACKERS.entry(name, key="track").obj.check()


def trackers(run_dir: Path, names: Iterable[str], config: dict | None = None) -> list[Tracker]:
    """The trackers of one run, as hooks of its loop (:mod:`fedshift.runtime.hooks`): CSV and
    those the config's ``track`` names. ``config``: the run's resolved config, for the
    trackers that record it."""
    out: list[Tracker] = [CsvTracker(run_dir, config)]
    return out + [TRACKERS.get(n, key="track")(run_dir, config) for n in dict.fromkeys(names)]
