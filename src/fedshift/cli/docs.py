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


#: the folders of pages besides the guides: per-paper pages and measured tables
FOLDERS = ("parts", "results")


def resolve_page(text: str) -> Path:
    """The shipped page ``fedshift docs TEXT`` means, as a message may name it: a guide
    (``methods``, ``METHODS.md``, ``docs/METHODS.md``), a page of a folder
    (``parts/harmofl-methods``, ``docs/parts/harmofl-methods.md``, or its bare name
    ``harmofl-methods`` where one folder has it) or a folder (``parts``: its pages are
    listed). Anything else, or a path leaving the docs folder, is a :class:`FedshiftError`
    listing what there is."""
    from fedshift.core.errors import FedshiftError

    folder = text.strip().endswith("/")  # ``docs/results/``: the folder, not the guide
    name = text.strip().removeprefix("./").removeprefix("docs/").rstrip("/")
    name = name[:-3] if name.lower().endswith(".md") else name
    if name.lower() in GUIDES and not (folder and name in FOLDERS):
        return guide_path(name.lower())
    parts = name.split("/")
    if name and not any(p in ("", ".", "..") or "\\" in p for p in parts):
        root = docs_root()
        inside = root.resolve()
        if name in FOLDERS and (root / name).is_dir():
            return root / name
        page = root / f"{name}.md"
        if page.is_file() and page.resolve().is_relative_to(inside):
            return page
        if len(parts) == 1:  # a page's bare name, in one of the folders
            found = [p for f in FOLDERS if (p := root / f / f"{name}.md").is_file()]
            if len(found) == 1:
                return found[0]
    raise FedshiftError(
        f"no guide or page {text!r}; the guides are: {', '.join(GUIDES)}; pages: "
        f"{', '.join(f + '/NAME' for f in FOLDERS)} (`fedshift docs parts` lists them)"
    )


def _cmd_docs(args: argparse.Namespace) -> int:
    from fedshift.core.errors import FedshiftError

    if args.guide is None:
        width = max(map(len, GUIDES))
        for name, (_, what) in GUIDES.items():
            print(f"  {name:<{width}}  {what}")
        pages = {f: len(list((docs_root() / f).glob("*.md"))) for f in FOLDERS}
        print(
            f"\n`fedshift docs NAME` prints one; per-paper pages ({pages['parts']}) and measured "
            f"tables ({pages['results']}): `fedshift docs parts`, `fedshift docs results`; the "
            f"files are in {docs_root()}"
        )
        return 0
    path = resolve_page(args.guide)
    if args.path:
        print(path)
        return 0
    if path.is_dir():
        names = sorted(p.stem for p in path.glob("*.md"))
        rel = path.relative_to(docs_root()).as_posix()
        print("\n".join(f"  {rel}/{n}" for n in names))
        return 0
    if not path.is_file():
        raise FedshiftError(f"{path} is missing: this installation of fedshift lacks its guides")
    sys.stdout.write(path.read_text(encoding="utf-8"))
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``docs`` to the main parser's subcommands."""
    p = sub.add_parser("docs", help="the guides shipped with fedshift (list, or print one)")
    p.add_argument(
        "guide",
        nargs="?",
        help=f"a guide ({', '.join(GUIDES)}), a page (parts/NAME, results/NAME, or a path "
        "under docs/ as a message names it) or a folder (parts, results: list its pages)",
    )
    p.add_argument("--path", action="store_true", help="print the guide's file path only")
    p.set_defaults(fn=_cmd_docs)
