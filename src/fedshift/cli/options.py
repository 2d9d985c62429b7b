"""Arguments several subcommands share. Imports only the standard library (the parser is
built at every ``fedshift`` start)."""

from __future__ import annotations

import argparse

__all__ = ["add_config_args", "add_show_parser"]


def add_config_args(
    p: argparse.ArgumentParser, overrides_help: str, config_help: str = "YAML config file"
) -> None:
    """``-c/--config`` (``config_help``) and the positional ``overrides``, any number of
    ``key=value`` strings (``overrides_help``), in that order: the config of a command that
    reads one and applies overrides on top."""
    p.add_argument("-c", "--config", help=config_help)
    p.add_argument("overrides", nargs="*", help=overrides_help)


def add_show_parser(
    sub: argparse._SubParsersAction, command: str, command_help: str, show_help: str
) -> argparse.ArgumentParser:
    """``fedshift <command> show``: a ``command`` subcommand (``command_help``) whose one
    sub-subcommand, ``show`` (``show_help``), is required (``<command>_command`` in the
    parsed arguments); returns the ``show`` parser."""
    p = sub.add_parser(command, help=command_help)
    inner = p.add_subparsers(dest=f"{command}_command", required=True)
    return inner.add_parser("show", help=show_help)
