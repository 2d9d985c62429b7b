"""The trackers a run uses: the registry of ``track``'s names (:data:`TRACKERS`), the check
that each can run here, and :class:`Tracking`, which calls a run's trackers together.

It sits above the trackers' modules (:mod:`fedshift.runtime.track`: the interface, CSV,
TensorBoard; :mod:`fedshift.runtime.track_services`: W&B, MLflow), which import nothing of
it, so no module imports one that imports it back.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from fedshift.core.errors import ConfigError
from fedshift.runtime.track import CsvTracker, RoundRecord, TensorBoardTracker, Tracker
from fedshift.runtime.track_services import MlflowTracker, WandbTracker

__all__ = ["TRACKERS", "Tracking", "check_trackers"]

#: the optional trackers, by their name in the ``track`` key (CSV always runs); none imports
#: its package before a run opens it
TRACKERS: dict[str, type[Tracker]] = {
    "tensorboard": TensorBoardTracker,
    "wandb": WandbTracker,
    "mlflow": MlflowTracker,
}


def check_trackers(names: Iterable[str]) -> None:
    """Every tracker ``names`` asks for can run here (else a :class:`ConfigError`)."""
    for name in dict.fromkeys(names):
        if name not in TRACKERS:
            raise ConfigError(
                f"config key 'track': unknown tracker {name!r}; choose from {sorted(TRACKERS)}"
            )
        TRACKERS[name].check()


class Tracking:
    """The trackers of one run: CSV and those the config's ``track`` names, called together;
    ``close`` closes every one that opened. ``config``: the run's resolved config, for the
    trackers that record it."""

    def __init__(self, run_dir: Path, names: Iterable[str], config: dict | None = None) -> None:
        self.trackers: list[Tracker] = [CsvTracker(run_dir, config)]
        self.trackers += [TRACKERS[n](run_dir, config) for n in dict.fromkeys(names)]
        self._opened: list[Tracker] = []

    def open(self, last_round: int, records: list[dict], resumed: bool) -> None:
        for t in self.trackers:
            t.open(last_round, records, resumed)
            self._opened.append(t)

    def log_round(self, record: RoundRecord) -> None:
        for t in self.trackers:
            t.log_round(record)

    def checkpointed(self, rnd: int) -> None:
        """The checkpoint now holds every round up to ``rnd`` (:meth:`Tracker.checkpointed`)."""
        for t in self._opened:
            t.checkpointed(rnd)

    def close(self) -> None:
        while self._opened:
            self._opened.pop().close()


# ----------------------------------------------------------------------------- provenance
