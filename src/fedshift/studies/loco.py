"""``fedshift protocol loco``: leave-one-client-out generalisation (FedFA's Table 4;
:mod:`fedshift.protocols.loco`)."""

from __future__ import annotations

from dataclasses import dataclass

from fedshift.studies.base import StudyResult
from fedshift.studies.suite import SuiteStudyOptions


@dataclass(frozen=True, kw_only=True)
class Options(SuiteStudyOptions):
    """Each client of the config's federation held out in turn, the others training."""


def run(options: Options) -> StudyResult:
    """leave-one-client-out generalisation (FedFA Tab. 4)"""
    from fedshift.protocols.loco import loco

    return StudyResult.of(loco(options.suite_options()))
