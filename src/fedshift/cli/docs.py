"""``fedshift docs [GUIDE]``: the guides shipped with fedshift, readable from an installed
package (a wheel holds ``fedshift/docs/*.md``; in a source checkout that folder is a link to
the repository's ``docs/``). Error messages point here (``fedshift docs extending``) rather
than to a path in a clone that a pip user does not have."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

#: the shipped guides: name -> (file, what it covers)
GUIDES = {
    "usage": ("USAGE.md", "running experiments, run directories, resume, tracking, protocols"),
    "architecture": ("ARCHITECTURE.md", "the pieces, the payload protocol, client state"),
    "methods": ("METHODS.md", "each method, its paper default and its released-code option"),
    "extending": ("EXTENDING.md", "your own method, augment or model; plug-ins; the Python API"),
    "deploy": ("DEPLOY.md", "deploying across sites on Flower"),
    "datasets": ("DATASETS.md", "every dataset, the layouts the loaders expect"),
    "results": ("RESULTS.md", "measured figures and the commands behind them"),
    "claims": ("CLAIMS.md", "the papers' claims, the suites that run them, what was measured"),
    "privacy": ("PRIVACY.md", "what each method's records say about a site; fedshift privacy"),
}


def docs_root() -> Path:
    """The folder holding the shipped guides."""
    return Path(__file__).resolve().parent.parent / "docs"


def guide_path(name: str) -> Path:
    """The file of the guide ``name`` (a key of :data:`GUIDES`)."""
    return docs_root() / GUIDES[name][0]


def see(name: str) -> str:
    """How an error message points to a guide: the command that shows it."""
    return f"`fedshift docs {name}`"


def _cmd_docs(args: argparse.Namespace) -> int:
    from fedshift.core.errors import FedshiftError

    if args.guide is None:
        width = max(map(len, GUIDES))
        for name, (_, what) in GUIDES.items():
            print(f"  {name:<{width}}  {what}")
        print(f"\n`fedshift docs NAME` prints one; the files are in {docs_root()}")
        return 0
    name = args.guide.lower().removesuffix(".md")
    if name not in GUIDES:
        raise FedshiftError(
            f"no guide {args.guide!r}; the guides are: {', '.join(GUIDES)} (`fedshift docs` "
            "lists them)"
        )
    path = guide_path(name)
    if args.path:
        print(path)
        return 0
    if not path.is_file():
        raise FedshiftError(f"{path} is missing: this installation of fedshift lacks its guides")
    sys.stdout.write(path.read_text(encoding="utf-8"))
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``docs`` to the main parser's subcommands."""
    p = sub.add_parser("docs", help="the guides shipped with fedshift (list, or print one)")
    p.add_argument("guide", nargs="?", help=f"a guide: {', '.join(GUIDES)}")
    p.add_argument("--path", action="store_true", help="print the guide's file path only")
    p.set_defaults(fn=_cmd_docs)
