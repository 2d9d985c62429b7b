"""``fedshift protocol new-site -c CONFIG``: each held-out site of loco's cells scored with
the global model, AdaBN, the method's test-time normalisation, k-shot head finetuning and
entropy-based selection (:mod:`fedshift.protocols.new_site`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from fedshift.studies.base import StudyResult, Weights, option, weights_option
from fedshift.studies.suite import SuiteStudyOptions

#: default ``--shots`` (:data:`fedshift.protocols.new_site.SHOTS`)
SHOTS = (1, 5, 10)


@dataclass(frozen=True, kw_only=True)
class Options(SuiteStudyOptions):
    """Loco's cells, each held-out site adapted and scored."""

    #: its progress lines go to the terminal between the suite's cells and the tables
    logs_progress: ClassVar[bool] = True

    shots: tuple[int, ...] = option(
        SHOTS, "labelled images per class for finetune-k (default: 1,5,10)"
    )
    sites: str | None = option(
        None, "comma-separated clients to hold out (default: each client in turn)"
    )
    epochs: int = option(50, "head epochs over the k-shot images (default 50)")
    weights: Weights = weights_option()


def run(options: Options) -> StudyResult:
    """each held-out site: global model, AdaBN, test-time norm, k-shot head, selection"""
    from fedshift.protocols.new_site import new_site

    o = options
    sites = tuple(x.strip() for x in o.sites.split(",")) if o.sites else None
    res = new_site(o.suite_options(), tuple(o.shots), o.epochs, o.weights, sites)
    return StudyResult.of(res)
