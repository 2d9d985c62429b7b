"""Studies: the papers' evaluation protocols, each one file here and one registration below.

A study is a frozen ``Options`` dataclass (its fields are the ``fedshift protocol <study>``
flags: :mod:`fedshift.studies.base`) and ``run(options) -> StudyResult``; the command line
is generated from the ``Options`` (:mod:`fedshift.cli.studies`). The work itself is in
:mod:`fedshift.protocols` (torch, matplotlib), which a study imports inside ``run``, so
importing this package (every ``fedshift`` start) loads only the standard library.

A new study: ``studies/<name>.py`` with ``Options`` and ``run``, and one ``STUDIES.add``
line here (docs/ARCHITECTURE.md, "Where a new piece goes").
"""

from __future__ import annotations

from fedshift.studies import (
    cross_site,
    head_finetune,
    loco,
    new_site,
    privacy,
    rounds,
    sweep,
    tsne,
)
from fedshift.studies.base import Study, StudyRegistry, StudyResult, option
from fedshift.studies.suite import SuiteStudyOptions

__all__ = [
    "STUDIES",
    "Study",
    "StudyRegistry",
    "StudyResult",
    "SuiteStudyOptions",
    "option",
    "run_study",
]

STUDIES = StudyRegistry()
STUDIES.add("cross-site", cross_site.run, cross_site.Options)
STUDIES.add("loco", loco.run, loco.Options)
STUDIES.add("new-site", new_site.run, new_site.Options)
STUDIES.add("sweep", sweep.run, sweep.Options)
STUDIES.add("rounds", rounds.run, rounds.Options)
STUDIES.add("head-finetune", head_finetune.run, head_finetune.Options)
STUDIES.add("privacy", privacy.run, privacy.Options)
STUDIES.add("tsne", tsne.run, tsne.Options)


def run_study(name: str, /, **options: object) -> StudyResult:
    """Run the registered study ``name`` from Python with its ``Options`` built from the
    keywords (``run_study("loco", config="configs/demo.yaml", workers=1)``); an unknown
    study is a :class:`~fedshift.core.errors.ConfigError`, an unknown keyword a
    ``TypeError`` naming it."""
    study = STUDIES.entry(name)
    return study.run(study.options(**options))
