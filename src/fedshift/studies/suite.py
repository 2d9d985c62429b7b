"""The options every study that runs a config's grid shares (``-c CONFIG key=value ...
--workers --threads --runs --fresh --out --quiet``): :class:`SuiteStudyOptions`, a base
class a study's ``Options`` extends with its own fields."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from fedshift.studies.base import option, out_option, quiet_option

if TYPE_CHECKING:
    from fedshift.protocols.common import SuiteOptions


@dataclass(frozen=True, kw_only=True)
class SuiteStudyOptions:
    """A config (and its sweep grid), run as a cached bench suite."""

    config: str | None = option(None, "YAML run config (may have its own sweep grid)", short="-c")
    overrides: tuple[str, ...] = option(
        (), "key=value overrides, e.g. train.rounds=100", positional=True, nargs="*"
    )
    workers: int | None = option(None, "parallel processes (default: cores // 2)")
    threads: int | None = option(None, "torch threads per worker")
    runs: str | None = option(None, "root folder for the cells' run directories (config 'out')")
    fresh: bool = option(
        False,
        "run every cell here, even one whose result is committed in results/ (by default "
        "such a cell's numbers are taken, as `fedshift bench` does)",
    )
    out: str | None = out_option()
    quiet: bool = quiet_option()

    def suite_options(self) -> SuiteOptions:
        """The protocols' :class:`~fedshift.protocols.common.SuiteOptions` of these options."""
        from fedshift.protocols.common import SuiteOptions

        return SuiteOptions(
            config=self.config,
            overrides=tuple(self.overrides),
            workers=self.workers,
            threads=self.threads,
            out=self.out,
            runs_out=self.runs,
            progress=not self.quiet,
            fresh=self.fresh,
        )
