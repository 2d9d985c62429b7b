"""``fedshift protocol head-finetune -c CONFIG``: train on a data fraction, then retrain only
the prediction head (FRAug's Table 1; :mod:`fedshift.protocols.head_finetune`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from fedshift.studies.base import StudyResult, Weights, option, weights_option
from fedshift.studies.suite import SuiteStudyOptions


@dataclass(frozen=True, kw_only=True)
class Options(SuiteStudyOptions):
    """The config's cells, each client's head finetuned on all its training data."""

    #: its progress lines go to the terminal between the suite's cells and the table
    logs_progress: ClassVar[bool] = True

    epochs: int = option(10, "head epochs (default 10)")
    weights: Weights = weights_option()


def run(options: Options) -> StudyResult:
    """train on a data fraction, retrain only the head (FRAug Tab. 1)"""
    from fedshift.protocols.head_finetune import head_finetune

    o = options
    return StudyResult.of(head_finetune(o.suite_options(), o.epochs, o.weights))
