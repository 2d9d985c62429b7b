"""``fedshift protocol sweep -c CONFIG --key K --values ...``: one config key swept, mean ±
std over seeds per value (:mod:`fedshift.protocols.sweep`)."""

from __future__ import annotations

from dataclasses import dataclass

from fedshift.studies.base import StudyResult, option
from fedshift.studies.suite import SuiteStudyOptions


@dataclass(frozen=True, kw_only=True)
class Options(SuiteStudyOptions):
    """The config's grid with one more key swept."""

    key: str = option(help="dotted config key, e.g. train.local_epochs")
    values: str = option(help="comma-separated values, e.g. 1,2,5,10")


def run(options: Options) -> StudyResult:
    """one config key swept, mean ± std over seeds"""
    from fedshift.protocols.sweep import sweep

    return StudyResult.of(sweep(options.suite_options(), options.key, options.values))
