"""``fedshift protocol <study>``: one subcommand per registered study
(:data:`fedshift.studies.STUDIES`), each generated from the study's ``Options`` dataclass by
:mod:`fedshift.cli.studies`. Nothing here is written per study.

Building the parser imports the studies' registry and ``Options`` only (standard library);
a study imports its protocol (torch, matplotlib) when it runs. ``tests/cli/test_cli_speed.py``
checks both, and that the choice lists below equal the protocols' own.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from fedshift.studies.cross_site import CROSS_SITE_KINDS, PIPELINES, SPLITS
from fedshift.studies.new_site import SHOTS as NEW_SITE_SHOTS

if TYPE_CHECKING:
    from fedshift.protocols.common import SuiteOptions
    from fedshift.studies.base import Study

__all__ = ["CROSS_SITE_KINDS", "NEW_SITE_SHOTS", "PIPELINES", "SPLITS", "add_parser"]


def _suite_options(args: argparse.Namespace) -> SuiteOptions:
    """The protocols' :class:`~fedshift.protocols.common.SuiteOptions` of a parsed
    ``fedshift protocol <study> -c CONFIG ...`` (a study that runs a config's grid)."""
    from fedshift.cli.studies import options_from
    from fedshift.studies import STUDIES

    return options_from(STUDIES.entry(args.study).options, args).suite_options()


def _plugins(p: argparse.ArgumentParser, study: Study) -> None:
    """``--allow-plugins`` for a study that rebuilds finished runs (their configs may name
    ``module:Class`` plug-ins)."""
    from fedshift.cli.plugins import add_allow_plugins

    if getattr(study.options, "loads_runs", False):
        add_allow_plugins(p)


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``fedshift protocol <study>`` for every registered study to the ``sub``-commands
    of the main parser; each sets ``fn`` to a handler returning the exit code."""
    from fedshift.cli.studies import add_study_parser
    from fedshift.studies import STUDIES

    names = ", ".join(STUDIES)
    p = sub.add_parser("protocol", help=f"the papers' evaluation protocols ({names})")
    ps = p.add_subparsers(dest="protocol", required=True)
    for study in STUDIES.entries():
        add_study_parser(ps, study, _plugins)
