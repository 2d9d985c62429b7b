"""``fedshift privacy show [-c CONFIG] [key=value ...] [--all] [--format text|json]``: what
each site of a run would send, from the records' declarations
(:mod:`fedshift.core.disclosure`, :mod:`fedshift.runtime.disclosure`): kind, receiver, how
often, bytes and the fewest examples a statistic summarises. It loads the federation (the
sites' sizes and label counts) and builds the model and the algorithm; it trains nothing.
Imports only the standard library at module level (``tests/cli/test_cli_speed.py``).
"""

from __future__ import annotations

import argparse
import json

from fedshift.cli.options import add_config_args, add_show_parser

__all__ = ["add_parser"]


def _configs(args: argparse.Namespace) -> list:
    """The resolved configs: the config's runs (one per cell of a sweep), or with ``--all``
    every registered algorithm and FedAvg with every augment on the config's data."""
    from fedshift.algorithms import ALGORITHMS
    from fedshift.augment import AUGMENTS
    from fedshift.catalog import resolve
    from fedshift.core.config import load_config
    from fedshift.core.config_tree import expand_sweep
    from fedshift.core.errors import FedshiftError

    source = args.config or "defaults"
    raw = load_config(args.config, args.overrides)
    if not args.all:
        return [resolve(r, source) for r in expand_sweep(raw, source)]
    resolve(raw, source)  # the config itself must be valid
    variants = [
        [f"algorithm.name={a}", "augment=[]", *ALGORITHMS.get(a).requires]
        for a in ALGORITHMS.names()
    ]
    variants += [["algorithm.name=fedavg", f"augment=[{a}]"] for a in AUGMENTS.names()]
    out = []
    for extra in variants:
        try:
            out.append(resolve(load_config(args.config, [*args.overrides, *extra]), source))
        except FedshiftError as e:  # a component this data cannot run (its task): say so
            print(f"# {' '.join(extra)}: not shown ({e})")
    return out


def _cmd_show(args: argparse.Namespace) -> int:
    from fedshift.core.errors import FedshiftError
    from fedshift.runtime.disclosure import disclose, render

    reports = []
    for cfg in _configs(args):
        try:
            reports.append(disclose(cfg))
        except FedshiftError as e:
            if not args.all:
                raise
            print(f"# {cfg.algorithm.name}: not shown ({e})")
    if args.format == "json":
        print(json.dumps(reports if len(reports) != 1 else reports[0], indent=2))
        return 0
    print("\n\n".join(render(r) for r in reports))
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """``fedshift privacy show``."""
    show = add_show_parser(
        sub,
        "privacy",
        "what each site of a run sends: the records' disclosure",
        "per record a site sends: its kind, who receives it, how often, its bytes and the "
        "fewest examples a statistic summarises (loads the data's sizes and labels; trains "
        "nothing)",
    )
    add_config_args(show, "key=value overrides, e.g. algorithm.name=fedrdn")
    show.add_argument(
        "--all",
        action="store_true",
        help="every registered algorithm, and FedAvg with every augment, on the config's data",
    )
    show.add_argument("--format", choices=("text", "json"), default="text")
    show.set_defaults(fn=_cmd_show)
