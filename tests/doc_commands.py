"""Finding the commands of README.md and docs/*.md (used by tests/test_docs.py).

What counts as a command a reader would run:

* in a fenced block marked ``bash`` / ``sh`` / ``shell`` / ``console``: every logical line
  (a line ending in ``\\`` continues on the next; ``for ... done`` is one command; comments
  after `` #`` and comment-only lines are dropped; a leading ``$ `` is dropped);
* in a fenced block without a language: every line that starts with a program of
  :data:`PROGRAMS` (so the results tables' command blocks count, the ASCII diagrams and
  sample output do not);
* in a fenced ``python`` block: the block, named by the ``<!-- example: NAME -->`` mark in
  front of it (a block without one is an error: every snippet has a name to be marked by);
* in the prose: every inline code span that starts with a program of :data:`PROGRAMS`,
  except a bare name: the program alone (`fedshift`, `flwr`) or ``fedshift`` followed only
  by its subcommand names (`fedshift run`, `fedshift flower simulate`).

Blocks of other languages (``yaml``, ``toml``, ``text``) are files and output, not commands.
A command is identified by its text with whitespace collapsed (the same command in two
documents is one command).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: the documents whose commands must be run or marked
DOCS = ("README.md", "docs/*.md")

#: programs whose invocations are commands (a line or inline span starting with one)
PROGRAMS = (
    "fedshift", "python", "python3", "pip", "make", "flwr", "flower-superlink",
    "flower-supernode", "tensorboard", "mlflow", "wandb", "sudo", "apt-get", "bash", "git",
    "uv", "for", ".",
)  # fmt: skip

SHELL_LANGS = ("bash", "sh", "shell", "console")
FENCE = re.compile(r"^\s*(```+|~~~+)\s*([\w+-]*)")
EXAMPLE = re.compile(r"<!--\s*example:\s*(\S+)\s*-->")
ENV_WORD = re.compile(r"^[A-Z_][A-Z0-9_]*=\S*$")


@dataclass
class Found:
    """One command (or Python snippet) and where it was found."""

    text: str
    doc: str
    line: int
    kind: str  # "block" (fenced shell), "python" (a named snippet) or "inline"
    #: the document's lines around it (for the duration check of long commands)
    context: str = ""


def doc_files(root: Path = ROOT) -> list[Path]:
    files: list[Path] = []
    for pattern in DOCS:
        files += sorted(root.glob(pattern))
    return files


def _strip_comment(line: str) -> str:
    """``line`` without a trailing `` # comment`` outside quotes."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
    return line.rstrip()


def _program(text: str) -> str | None:
    """The program a command line starts with (after ``VAR=value`` words), if known."""
    words = text.split()
    while words and ENV_WORD.match(words[0]):
        words = words[1:]
    if not words:
        return None
    first = words[0]
    if first in PROGRAMS or first.startswith((".venv/", "./")):
        return first
    return None


def _collapse(text: str) -> str:
    return " ".join(text.split())


def _shell_commands(lines: list[tuple[int, str]], every_line: bool) -> list[tuple[int, str]]:
    """Logical command lines of a block: (first line number, text)."""
    out: list[tuple[int, str]] = []
    pending: tuple[int, str] | None = None
    loop: tuple[int, list[str]] | None = None
    for num, raw in lines:
        line = raw.strip()
        if line.startswith("$ "):
            line = line[2:]
        code = _strip_comment(line)
        if pending is not None:
            start, text = pending
            text = text + " " + code.rstrip("\\").strip()
            pending = (start, text) if code.endswith("\\") else None
            if pending is None:
                out.append((start, text))
            continue
        if loop is not None:
            loop[1].append(code)
            if code.split()[:1] == ["done"]:
                text = ""
                for part in (c for c in loop[1] if c):
                    text += part if not text else (" " if text.endswith(" do") else "; ") + part
                out.append((loop[0], text))
                loop = None
            continue
        if not code:
            continue
        if code.startswith(("for ", "while ")):
            loop = (num, [code])
            continue
        if not every_line and _program(code) is None:
            continue
        if code.endswith("\\"):
            pending = (num, code.rstrip("\\").strip())
        else:
            out.append((num, code))
    return [(n, _collapse(t)) for n, t in out]


def _fedshift_commands() -> set[tuple[str, ...]]:
    """Every subcommand path of the ``fedshift`` parser: ('run',), ('flower', 'simulate')."""
    import argparse

    from fedshift.cli import build_parser

    paths: set[tuple[str, ...]] = {()}

    def walk(parser: argparse.ArgumentParser, prefix: tuple[str, ...]) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    paths.add((*prefix, name))
                    walk(sub, (*prefix, name))
            elif action.choices and not action.option_strings and prefix:
                # positional choices (`fedshift data build|show|fetch`, protocol names)
                for choice in action.choices:
                    paths.add((*prefix, str(choice)))

    walk(build_parser(), ())
    return paths


def _bare_name(text: str, fedshift_paths: set[tuple[str, ...]]) -> bool:
    words = text.split()
    if len(words) == 1:
        return True
    return words[0] == "fedshift" and tuple(words[1:]) in fedshift_paths


def find_commands(root: Path = ROOT) -> list[Found]:
    """Every command of :data:`DOCS`, in document order."""
    paths = _fedshift_commands()
    found: list[Found] = []
    for path in doc_files(root):
        doc = str(path.relative_to(root))
        lines = path.read_text(encoding="utf-8").splitlines()

        def context(num: int, lines: list[str] = lines) -> str:
            return "\n".join(lines[max(0, num - 3) : num + 3])

        prose: list[tuple[int, str]] = []
        i = 0
        while i < len(lines):
            m = FENCE.match(lines[i])
            if not m:
                prose.append((i + 1, lines[i]))
                i += 1
                continue
            fence, lang = m.group(1), m.group(2).lower()
            start = i
            i += 1
            body: list[tuple[int, str]] = []
            while i < len(lines) and not lines[i].strip().startswith(fence[:3]):
                body.append((i + 1, lines[i]))
                i += 1
            i += 1  # the closing fence
            if lang == "python":
                before = "\n".join(lines[max(0, start - 2) : start])
                name = EXAMPLE.search(before)
                text = f"example: {name.group(1)}" if name else f"python block at line {start + 1}"
                found.append(Found(text, doc, start + 1, "python", "\n".join(b for _, b in body)))
            elif lang in SHELL_LANGS or lang == "":
                for num, text in _shell_commands(body, every_line=lang in SHELL_LANGS):
                    found.append(Found(text, doc, num, "block", context(num)))
        # inline spans: a span may run over a line break inside a paragraph
        text = "\n".join(t for _, t in prose)
        nums = [n for n, _ in prose]
        for m in re.finditer(r"(?<!`)`([^`\n]+(?:\n[^`\n]+)?)`(?!`)", text):
            span = _collapse(m.group(1))
            if _program(span) is None or _bare_name(span, paths):
                continue
            num = nums[text.count("\n", 0, m.start())]
            found.append(Found(span, doc, num, "inline", context(num)))
    return found
