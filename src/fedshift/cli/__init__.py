"""The ``fedshift`` command line.

fedshift run [-c CONFIG] [key=value ...] [--out DIR]     run a config (and its sweep grid)
fedshift run --resume RUN_DIR [train.rounds=N]          continue (or extend) a run
fedshift bench SUITE.yaml [key=value ...] [--workers N]  a suite: cached cells, parallel runs
fedshift list                                            algorithms, datasets, models
fedshift report RUN_DIR... [--out DIR]                   Markdown + HTML + CSV report of runs
fedshift protocol cross-site|loco|sweep|rounds|...       the papers' evaluation protocols
fedshift data build|show|fetch ...                       offline benchmarks
fedshift flower simulate|certs|keys|app|submit ...       the same runs on Flower

One module per command group: :mod:`fedshift.cli.run` (run, bench, list, report),
:mod:`fedshift.cli.data`, :mod:`fedshift.cli.protocol` and :mod:`fedshift.cli.flower`.
Building the parser imports only the standard library: every handler imports what it needs
(torch, the registries, Flower...) when it runs, so ``fedshift --help`` and a mistyped command
answer at once. ``tests/test_cli_speed.py`` keeps it that way.
"""

from __future__ import annotations

import argparse
import sys

from fedshift.cli import data, flower, protocol, run
from fedshift.core.errors import FedshiftError

__all__ = ["build_parser", "main", "parse"]


def build_parser() -> argparse.ArgumentParser:
    """The ``fedshift`` parser; each subcommand sets ``fn`` to a handler returning the exit
    code."""
    p = argparse.ArgumentParser(prog="fedshift", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    run.add_parsers(sub)  # run, bench, list, report
    protocol.add_parser(sub)
    flower.add_parser(sub)
    data.add_parser(sub)
    return p


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse a command line; ``key=value`` words may also follow the options."""
    parser = build_parser()
    # argparse stops filling a subcommand's positional ``overrides`` at the first option, so
    # ``bench SUITE --quiet key=value`` would be refused; key=value words after options are
    # overrides too (anything else is still an error).
    args, extra = parser.parse_known_args(argv)
    if extra:
        if not hasattr(args, "overrides") or any(w.startswith("-") for w in extra):
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        args.overrides = [*(args.overrides or []), *extra]
    return args


def main(argv: list[str] | None = None) -> int:
    """Run a command line; returns the exit code (2 for a :class:`FedshiftError`, printed as
    one line on stderr)."""
    args = parse(argv)
    try:
        return args.fn(args)
    except FedshiftError as e:
        print(f"fedshift: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("fedshift: interrupted", file=sys.stderr)
        return 130
    except BaseException as e:  # a run stopped by SIGINT / SIGTERM after saving its state
        code = getattr(e, "exit_code", None)
        if code is None:
            raise
        print(f"fedshift: stopped by {e}", file=sys.stderr)
        return int(code)
