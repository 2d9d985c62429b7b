"""``fedshift claims``: the claims ledger (docs/CLAIMS.md and the per-paper pages) computed
from ``claims/*.yaml`` and the committed ``results/``; ``collect`` copies finished suites and
protocol outputs into ``results/``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "claims",
        help="write docs/CLAIMS.md and the per-paper ledgers from claims/*.yaml and results/",
    )
    p.add_argument("--root", default=".", help="repository root (default: .)")
    p.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 when a committed page differs from what results/ gives",
    )
    p.set_defaults(fn=_cmd_claims)
    csub = p.add_subparsers(dest="claims_command")
    col = csub.add_parser("collect", help="copy finished suites / protocol outputs into results/")
    col.add_argument("folders", nargs="+", help="suite folders (cells) or protocol outputs")
    col.add_argument("--command", required=True, help="the command that produced them (recorded)")
    col.add_argument(
        "--protocol",
        metavar="NAME",
        help="the folders are one protocol's output: results/protocols/NAME",
    )
    col.add_argument("--name", help="results folder name (default: the suite folder's name)")
    col.add_argument("--results", default="results", help="results root (default: ./results)")
    col.add_argument(
        "--partial",
        action="store_true",
        help="the suite is still running: its finished cells into results/_incomplete/NAME, "
        "added to those collected before (the ledger reads none of them; a bench with "
        "--results results/_incomplete takes them)",
    )
    col.set_defaults(fn=_cmd_collect)


def _cmd_claims(args: argparse.Namespace) -> int:
    from fedshift.claims.ledger import render

    root = Path(args.root)
    pages = render(root / "claims", root / "results")
    stale = []
    for rel, text in sorted(pages.items()):
        path = root / rel
        old = path.read_text() if path.is_file() else None
        if old == text:
            continue
        stale.append(rel)
        if not args.check:
            from fedshift.core.files import inside, write_text_atomic

            inside(root, path.parent)  # no page outside the repository, even through a link
            path.parent.mkdir(parents=True, exist_ok=True)
            write_text_atomic(path, text)
    if args.check:
        if stale:
            print("differs from what results/ gives: " + ", ".join(stale), file=sys.stderr)
            print("run `fedshift claims` and commit the pages", file=sys.stderr)
            return 1
        print(f"{len(pages)} pages up to date")
        return 0
    print(
        f"{len(pages)} pages, {len(stale)} rewritten" + (": " + ", ".join(stale) if stale else "")
    )
    return 0


def _cmd_collect(args: argparse.Namespace) -> int:
    from fedshift.claims.collect import collect_protocol, collect_suite, unfinished_cells
    from fedshift.core.errors import ConfigError

    if args.partial and args.protocol:
        raise ConfigError(
            "--partial collects a suite's finished cells; a protocol's output "
            "is collected when the protocol has finished (leave out --partial)"
        )
    for folder in args.folders:
        if args.protocol:
            dest = collect_protocol(Path(folder), Path(args.results), args.command, args.protocol)
        else:
            dest = collect_suite(
                Path(folder), Path(args.results), args.command, args.name, args.partial
            )
        print(f"{folder} -> {dest}")
        if args.partial:
            left = unfinished_cells(Path(folder))
            done = json.loads((dest / "source.json").read_text())["partial"]
            print(
                f"  {done['finished']} cells finished"
                + (f" of {done['planned']} planned" if done["planned"] else "")
                + (f"; running or stopped: {', '.join(left)}" if left else "")
            )
    return 0
