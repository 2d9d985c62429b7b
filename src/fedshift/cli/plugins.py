"""How the command line allows plug-ins: the ``--allow-plugins`` option of the commands that
read a config from elsewhere (:mod:`fedshift.core.consent`) and the words naming it in their
errors. Imports only the standard library (the parser is built at every ``fedshift``
start)."""

from __future__ import annotations

import argparse

__all__ = ["CLI_HOW", "add_allow_plugins"]

#: how to allow plug-ins, on the command line
CLI_HOW = "--allow-plugins (or set FEDSHIFT_ALLOW_PLUGINS=1)"


#: ``--allow-plugins``' help where the config comes from a run directory or a suite
FROM_ELSEWHERE = (
    "import the plug-ins (module:Class names) that a run directory's config.yaml or a suite "
    "names; a plug-in name runs its module's code, so only for sources you trust (also: "
    "FEDSHIFT_ALLOW_PLUGINS=1)"
)


def add_allow_plugins(p: argparse.ArgumentParser, text: str = FROM_ELSEWHERE) -> None:
    """``--allow-plugins``: import the ``module:Class`` plug-ins that a config from elsewhere
    names (a run directory, a suite: :mod:`fedshift.core.consent`); ``text``, its help, says
    which plug-ins where a command reads them from a config of its own (``config show``,
    ``data check``, ``report``)."""
    p.add_argument("--allow-plugins", action="store_true", help=text)
