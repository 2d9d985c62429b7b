"""Every page a message of fedshift points to opens with ``fedshift docs`` (issue 49).

The messages are the string literals of ``src/fedshift`` that are not docstrings (an error,
a warning, a help text, a registry description); a reference is ``fedshift docs NAME`` or a
path ``docs/...`` (a pip user has no docs/ folder, but ``fedshift docs`` takes the path as the
message names it). Modules that write docs/ pages (``fedshift claims``) name files, not
pages to read, and are left out.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest

from fedshift.cli import main
from fedshift.cli.docs import FOLDERS, GUIDES, docs_root, resolve_page
from fedshift.core.errors import FedshiftError

SRC = Path(__file__).resolve().parents[2] / "src" / "fedshift"
REF = re.compile(r"fedshift docs ([A-Za-z0-9_./-]*[A-Za-z0-9_/-])|(docs/[A-Za-z0-9_./-]*\.md)")
#: modules whose docs/ paths are files `fedshift claims` writes into a repository
WRITERS = {"cli/claims.py", "claims/ledger.py", "claims/spec.py"}
#: placeholders in the messages that explain `fedshift docs` itself
PLACEHOLDERS = {"NAME"}


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


@functools.cache
def message_refs() -> list[tuple[str, int, str]]:
    """(module, line, reference) for every docs reference in a message of the source. A
    module whose text has no match of :data:`REF` anywhere has none in a message: it is not
    parsed (this runs while every pytest worker collects; parsing all ~280 modules was a
    fifth of a worker's collection)."""
    found = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if rel in WRITERS or rel.startswith("docs/"):
            continue
        text = path.read_text(encoding="utf-8")
        if not REF.search(text):
            continue
        tree = ast.parse(text)
        skip = _docstrings(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                if id(node) in skip:
                    continue
                for name, page in REF.findall(node.value):
                    ref = name or page
                    if ref not in PLACEHOLDERS:
                        found.append((rel, node.lineno, ref))
    return found


def test_the_source_points_to_pages_and_the_scan_finds_them():
    refs = {r for _, _, r in message_refs()}
    # the scan sees what it is meant to see (a regex that matched nothing would pass below)
    assert {"extending", "deploy", "datasets", "parts/harmofl-methods"} <= refs, refs


@pytest.mark.parametrize("ref", sorted({r for _, _, r in message_refs()}))
def test_every_page_a_message_names_opens_with_fedshift_docs(ref, capsys):
    path = resolve_page(ref)
    assert path.resolve().is_relative_to(docs_root().resolve())
    assert main(["docs", ref]) == 0
    out = capsys.readouterr().out
    if path.is_dir():  # `fedshift docs parts`: the folder's pages, each one to open
        assert (
            ref in FOLDERS
            and out.splitlines()
            and all(resolve_page(line.strip()).is_file() for line in out.splitlines())
        )
    else:
        assert out.lstrip().startswith("#")  # the page's Markdown


def test_pages_resolve_as_messages_name_them(capsys):
    root = docs_root()
    assert resolve_page("docs/METHODS.md") == root / "METHODS.md" == resolve_page("methods")
    page = root / "parts" / "harmofl-methods.md"
    for text in ("parts/harmofl-methods", "docs/parts/harmofl-methods.md", "harmofl-methods"):
        assert resolve_page(text) == page
    assert resolve_page("results") == root / GUIDES["results"][0]  # the guide
    assert resolve_page("docs/results/") == root / "results"  # the folder
    assert main(["docs", "parts"]) == 0
    assert "  parts/harmofl-methods" in capsys.readouterr().out.splitlines()
    for bad in ("../README", "parts/../../README", "nosuchpage", "/etc/passwd"):
        with pytest.raises(FedshiftError, match="no guide or page"):
            resolve_page(bad)
