"""What every study shares: the :class:`Study` registry entry and :class:`StudyRegistry`,
:class:`StudyResult`, and :func:`option`, the field of an ``Options`` dataclass.

A study is a frozen, keyword-only ``Options`` dataclass and ``run(options) -> StudyResult``.
Each field is one command-line flag of ``fedshift protocol <study>``
(:mod:`fedshift.cli.studies` builds the parser from the fields): its name is the flag
(``per_client`` -> ``--per-client``), its type the argument's (``int``, ``float``, ``str``;
``bool``: a switch; ``Literal[...]``: the choices; ``tuple[int, ...]``: comma-separated
whole numbers), its default the flag's default (none: the flag is required) and its
``help`` metadata the help line; :func:`option` sets them, with the few command-line
spellings the type cannot say (``-c``, a positional argument, ``nargs``, a repeatable
flag).

This module imports only the standard library: ``fedshift --help`` builds every study's
parser, so a study module imports torch (or anything heavy) only inside ``run``.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from fedshift.core.errors import ConfigError

__all__ = [
    "Study",
    "StudyRegistry",
    "StudyResult",
    "option",
    "out_option",
    "quiet_option",
    "weights_option",
]


def option(
    default: Any = dataclasses.MISSING,
    help: str = "",  # noqa: A002 - argparse's word
    *,
    short: str | None = None,
    positional: bool = False,
    nargs: str | None = None,
    append: bool = False,
    cli_default: str | None = None,
) -> Any:
    """A field of a study's ``Options`` with its command-line spelling in the metadata.

    ``default``: the field's default (none: required); ``help``: the help line (``{study}``
    is replaced by the study's name); ``short``: a one-letter flag as well (``-c``);
    ``positional``: an argument, not a ``--flag``, with ``nargs`` (``+``, ``*``);
    ``append``: a repeatable flag collected into a tuple; ``cli_default``: the default the
    command line shows and passes where it differs from the Python default (``{study}``
    replaced: ``protocol-{study}``)."""
    meta = {
        "help": help,
        "short": short,
        "positional": positional,
        "nargs": nargs,
        "append": append,
        "cli_default": cli_default,
    }
    if isinstance(default, list | dict | set):
        raise TypeError("an Options default must be immutable (a tuple, not a list)")
    if default is dataclasses.MISSING:
        return field(metadata=meta)
    return field(default=default, metadata=meta)


def out_option() -> Any:
    """``--out``: the study's output folder (Python default None: ``./protocol-<study>``)."""
    return option(
        None, "output folder (default: ./protocol-{study})", cli_default="protocol-{study}"
    )


def quiet_option() -> Any:
    """``--quiet``: no progress bars."""
    return option(False, "no progress bars")


def weights_option() -> Any:
    """``--weights selected|last``: which state of each run a study rebuilds."""
    return option(
        "selected",
        "which state of each run: the round model selection picked on validation "
        "(selected.pt; default) or the last round",
    )


#: the values of ``weights_option``'s field
Weights = Literal["selected", "last"]


@dataclass(frozen=True)
class StudyResult:
    """What a study produced: ``out``, its output folder; ``files``, what it wrote there by
    kind (``md`` the tables, ``json`` the numbers behind them, ``png`` a figure, ``suite``
    the expanded suite it ran...); ``summary``, the numbers (``<study>.json``'s content);
    ``text``, the tables and notes as printed."""

    name: str
    out: Path
    files: Mapping[str, Path]
    summary: Mapping[str, Any]
    text: str = ""

    @classmethod
    def of(cls, result: Any, out: str | Path | None = None) -> StudyResult:
        """A protocol's :class:`~fedshift.protocols.common.ProtocolResult` as a study's
        result; ``out``: its output folder (default: the folder of its ``md`` file)."""
        files = dict(result.files)
        folder = Path(out) if out is not None else Path(files["md"]).parent
        return cls(result.name, folder, files, result.data, result.text)

    def lines(self) -> Iterator[str]:
        """What ``fedshift protocol`` prints: the text, a blank line, ``kind: path`` lines."""
        yield self.text
        yield ""
        for kind, path in self.files.items():
            yield f"{kind}: {path}"


@dataclass(frozen=True)
class Study:
    """A registered study: ``name`` (the ``fedshift protocol`` subcommand), ``run``
    (``run(options) -> StudyResult``), ``options`` (its ``Options`` dataclass) and a
    one-line ``description`` (the subcommand's help)."""

    name: str
    run: Callable[[Any], StudyResult]
    options: type
    description: str

    # the names core.registry.Entry uses, so code that lists registries reads this one too
    @property
    def obj(self) -> Callable[[Any], StudyResult]:
        return self.run

    @property
    def params(self) -> type:
        return self.options


class StudyRegistry:
    """Name -> :class:`Study`, registered the way every fedshift registry is
    (``STUDIES.add(name, run, Options, description)``, :mod:`fedshift.core.registry`'s
    call). Its own small class because the command line builds every study's parser at
    start: ``core.registry`` loads the config schema and YAML, which ``fedshift --help``
    must not wait for."""

    def __init__(self) -> None:
        self._studies: dict[str, Study] = {}

    def add(
        self, name: str, run: Callable[[Any], StudyResult], options: type, description: str = ""
    ) -> None:
        """Register the study ``name``: its ``run`` function and ``Options`` dataclass (frozen,
        keyword-only, every field an :func:`option`); ``description``: its one-line help
        (default: the first paragraph of ``run``'s docstring)."""
        if name in self._studies:
            raise ValueError(f"study {name!r} registered twice")
        params = getattr(options, "__dataclass_params__", None)
        if params is None or not params.frozen:
            raise TypeError(f"study {name!r}: Options must be a frozen dataclass")
        doc = description or " ".join((run.__doc__ or "").strip().split("\n\n")[0].split())
        self._studies[name] = Study(name, run, options, doc)

    def remove(self, name: str) -> None:
        """Unregister ``name`` (a test's toy study)."""
        del self._studies[name]

    def entry(self, name: str) -> Study:
        """The study ``name``; an unknown name is a :class:`ConfigError` listing the valid."""
        if name not in self._studies:
            hint = difflib.get_close_matches(name, list(self._studies), n=1)
            did = f" (did you mean {hint[0]!r}?)" if hint else ""
            raise ConfigError(f"unknown study {name!r}{did}; valid: {', '.join(self.names())}")
        return self._studies[name]

    def get(self, name: str) -> Study:
        return self.entry(name)

    def names(self) -> list[str]:
        """The names, sorted."""
        return sorted(self._studies)

    def entries(self) -> list[Study]:
        """Every study, in registration order (the order ``fedshift protocol --help``
        lists)."""
        return list(self._studies.values())

    def __contains__(self, name: object) -> bool:
        return name in self._studies

    def __iter__(self) -> Iterator[str]:
        return iter(self._studies)
