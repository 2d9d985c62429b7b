"""``fedshift protocol <study>``, generated from each registered study's ``Options``
dataclass (:mod:`fedshift.studies`): one flag per field, its type, choices, default and help
read the way ``fedshift list`` reads config dataclasses (:mod:`fedshift.cli.keys`).

A field ``per_client: int = option(150, "...")`` becomes ``--per-client`` (``type=int``,
default 150); ``bool``: a switch; ``Literal[...]``: ``choices``; ``tuple[int, ...]``:
comma-separated whole numbers; ``option(positional=True, nargs=...)``: an argument;
``option(append=True)``: a repeatable flag; no default: a required flag. The parsed
namespace holds each field under its own name, so :func:`options_from` builds the
``Options`` from it (lists become tuples; a repeatable flag never given, its default).

Imports only the standard library and the studies' registry (no torch: ``fedshift --help``
builds every study's parser; ``tests/cli/test_cli_speed.py``).
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from typing import Any

from fedshift.cli.keys import _literals, field_help

__all__ = ["add_study_parser", "options_from", "run_study"]


def _optional(tp: Any) -> Any:
    """``X`` of ``X | None`` (anything else as it is)."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return tp


def _whole_numbers(flag: str) -> Any:
    """An argparse ``type``: ``1,5,10`` -> ``(1, 5, 10)``, an error naming ``flag``."""

    def parse(text: str) -> tuple[int, ...]:
        try:
            return tuple(int(v) for v in text.split(",") if v.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{flag} {text!r}: comma-separated whole numbers, e.g. 1,5,10"
            ) from None

    return parse


def _argument(f: dataclasses.Field, tp: Any, study: str, helps: dict[str, str]) -> tuple:
    """The ``add_argument`` names and keywords of the field ``f`` (type ``tp``)."""
    meta = f.metadata
    flag = "--" + f.name.replace("_", "-")
    kw: dict[str, Any] = {}
    text = (meta.get("help") or helps.get(f.name, "")).replace("{study}", study)
    if text:
        kw["help"] = text
    has_default = f.default is not dataclasses.MISSING
    default = f.default if has_default else None
    if meta.get("cli_default") is not None:
        default = meta["cli_default"].replace("{study}", study)
    base = _optional(tp)
    choices = _literals(tp)
    if meta.get("positional"):
        if meta.get("nargs"):
            kw["nargs"] = meta["nargs"]
        if has_default and meta.get("nargs") not in ("*", "?"):
            kw["nargs"] = "?"
        if has_default and meta.get("nargs") != "*":  # argparse's own: [] when none given
            kw["default"] = default
        return (f.name,), kw
    names = (meta["short"], flag) if meta.get("short") else (flag,)
    if not has_default:
        kw["required"] = True
    if base is bool:
        kw["action"] = "store_true"
        return names, kw
    if meta.get("append"):
        kw["action"] = "append"
    elif choices:
        kw["choices"] = choices
    elif typing.get_origin(base) is tuple and typing.get_args(base)[:1] == (int,):
        kw["type"] = _whole_numbers(flag)
    elif base in (int, float):
        kw["type"] = base
    if has_default and not meta.get("append"):
        kw["default"] = default
    return names, kw


def add_study_parser(
    sub: argparse._SubParsersAction, study: Any, extra: Any = None
) -> argparse.ArgumentParser:
    """The subcommand ``study.name`` (a registered :class:`~fedshift.studies.base.Study`)
    with a flag per field of its ``Options``; ``extra(parser, study)`` adds what is not an
    option of the study (``--allow-plugins``). Its handler is :func:`run_study`."""
    cls = study.options
    hints = typing.get_type_hints(cls)
    fields = dataclasses.fields(cls)
    # a field's help is its option(help=...); the comments and docstring `fedshift list` reads
    # are parsed only for a field without (reading a class's source takes a while)
    helps = field_help(cls) if any(not f.metadata.get("help") for f in fields) else {}
    p = sub.add_parser(study.name, help=study.description, description=study.description)
    for f in fields:
        names, kw = _argument(f, hints[f.name], study.name, helps)
        p.add_argument(*names, **kw)
    if extra is not None:
        extra(p, study)
    p.set_defaults(fn=run_study, study=study.name)
    return p


def options_from(cls: type, args: argparse.Namespace) -> Any:
    """The ``Options`` ``cls`` from a namespace :func:`add_study_parser`'s parser filled."""
    values = {}
    for f in dataclasses.fields(cls):
        if not f.init or not hasattr(args, f.name):
            continue
        v = getattr(args, f.name)
        if v is None and f.metadata.get("append"):
            continue  # a repeatable flag not given: its default
        values[f.name] = tuple(v) if isinstance(v, list) else v
    return cls(**values)


def run_study(args: argparse.Namespace) -> int:
    """The handler of every ``fedshift protocol <study>``: its ``Options`` from ``args``,
    ``run``, the tables and the files written printed; exit code 0."""
    from fedshift.studies import STUDIES

    study = STUDIES.entry(args.study)
    options = options_from(study.options, args)
    if getattr(study.options, "logs_progress", False):
        from fedshift.core.logs import console

        console()  # its progress lines between the suite's cells and the tables
    result = study.run(options)
    print("\n".join(result.lines()))
    return 0
