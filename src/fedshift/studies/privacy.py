"""``fedshift protocol privacy -c CONFIG | --run DIR``: attacks on what each method's site
sends (issue 51; :mod:`fedshift.protocols.privacy`)."""

from __future__ import annotations

from dataclasses import dataclass

from fedshift.core.errors import ConfigError
from fedshift.studies.base import StudyResult, Weights, option, weights_option
from fedshift.studies.suite import SuiteStudyOptions


@dataclass(frozen=True, kw_only=True)
class Options(SuiteStudyOptions):
    """The config's cells (trained, cached) or finished runs, attacked."""

    run: tuple[str, ...] = option(
        (), "a finished run directory to attack (repeatable)", append=True
    )
    sizes: tuple[int, ...] = option(
        (10, 50, 200), "site sizes for the records computed from images (default 10,50,200)"
    )
    trials: int = option(40, "sites drawn per size (40)")
    weights: Weights = weights_option()


def run(options: Options) -> StudyResult:
    """attacks on what each method's site sends: membership, site property, reconstruction
    (issue 51)"""
    from fedshift.protocols.privacy import privacy

    o = options
    if o.run and (o.config or o.overrides):
        raise ConfigError("fedshift protocol privacy: give -c CONFIG or --run DIR, not both")
    suite = None if o.run else o.suite_options()
    res = privacy(suite, list(o.run) or None, list(o.sizes), o.trials, o.out, o.weights)
    return StudyResult.of(res)
