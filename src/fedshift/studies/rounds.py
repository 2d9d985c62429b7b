"""``fedshift protocol rounds RUN_ROOT... --thresholds``: the first evaluated round at which
the mean score over clients reaches each threshold (DisTrans's Table 5;
:mod:`fedshift.protocols.rounds`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from fedshift.studies.base import StudyResult, option, out_option, quiet_option


@dataclass(frozen=True, kw_only=True)
class Options:
    """Finished runs' curves against thresholds."""

    runs: tuple[str, ...] = option(
        help="run directories or folders holding them", positional=True, nargs="+"
    )
    thresholds: str = option(help="fractions in (0, 1], e.g. 0.6,0.7,0.8")
    split: Literal["val", "test"] = option("test", "the curves' split (default: test)")
    by: str = option(
        "partition.clients", "config key of the row's setting (default: partition.clients)"
    )
    out: str | None = out_option()
    quiet: bool = quiet_option()


def run(options: Options) -> StudyResult:
    """rounds to reach thresholds by #clients (DisTrans Tab. 5)"""
    from fedshift.protocols.rounds import rounds_to_threshold

    o = options
    res = rounds_to_threshold(list(o.runs), o.thresholds, o.split, o.by, o.out, not o.quiet)
    return StudyResult.of(res)
