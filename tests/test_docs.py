"""The documents' commands: every command of README.md and docs/*.md (found as
tests/doc_commands.py says) is marked in tests/doc_marks.py, and the commands marked
:class:`~doc_marks.Run` run here, in document order, each as written plus the small overrides
its mark adds (one round, one seed, two small digit domains).

A command added to a document without a mark fails ``test_every_doc_command_is_marked``; to
see the commands that need one, with a stub to paste into tests/doc_marks.py, and the whole
list (every command, where it is, run or not and why)::

    .venv/bin/python tests/test_docs.py
    .venv/bin/python tests/test_docs.py --list
"""

from __future__ import annotations

import contextlib
import io
import re
import shlex
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest
from doc_commands import ROOT, Found, find_commands
from doc_marks import MARKS, ByTest, Long, NotRun, Prose, Run, Synopsis

#: a placeholder of a synopsis: an upper-case word (DIR, N, RUN_DIR), <run>, or ...
PLACEHOLDER = re.compile(r"\b[A-Z][A-Z_]*\b|<[^>]+>|\.\.\.")
#: where a long command's duration must be stated: its line and the lines around it
CONTEXT_BEFORE, CONTEXT_AFTER = 3, 12


def _stub(f: Found) -> str:
    return f"    {f.text!r}: Run(),  # or Long('N min'), NotRun('why'), ... ({f.doc}:{f.line})"


def _context(f: Found) -> str:
    lines = (ROOT / f.doc).read_text(encoding="utf-8").splitlines()
    return "\n".join(lines[max(0, f.line - 1 - CONTEXT_BEFORE) : f.line + CONTEXT_AFTER])


def _test_exists(ref: str) -> bool:
    path, _, name = ref.partition("::")
    file = ROOT / path
    return file.is_file() and re.search(rf"^def {re.escape(name)}\(", file.read_text(), re.M)


@pytest.fixture(scope="module")
def found() -> list[Found]:
    return find_commands()


def test_every_doc_command_is_marked(found):
    """Each command is marked; each mark's command is still in a document; each mark is
    consistent: a long command's duration is stated next to it in every code block that
    shows it (prose that mentions it is not checked), a synopsis has
    placeholders, a named test exists, a substituted word is in the command."""
    texts = {f.text for f in found}
    unmarked = {f.text: f for f in found if f.text not in MARKS}
    assert not unmarked, (
        "commands in the documents without a mark in tests/doc_marks.py (run them there, or "
        "say why not):\n" + "\n".join(_stub(f) for f in unmarked.values())
    )
    stale = sorted(t for t in MARKS if t not in texts)
    assert not stale, f"marks in tests/doc_marks.py for commands no document has: {stale}"
    unnamed = [f"{f.doc}:{f.line}" for f in found if f.kind == "python" and ":" not in f.text]
    assert not unnamed, f"python blocks without an <!-- example: NAME --> mark: {unnamed}"
    problems = []
    for f in found:
        mark = MARKS[f.text]
        where = f"{f.doc}:{f.line} `{f.text}`"
        if isinstance(mark, Long) and f.kind == "block" and mark.duration not in _context(f):
            problems.append(f"{where}: the document does not state its duration {mark.duration!r}")
        if isinstance(mark, Synopsis) and not PLACEHOLDER.search(f.text):
            problems.append(f"{where}: marked a synopsis but has no placeholder")
        if isinstance(mark, ByTest) and not _test_exists(mark.test):
            problems.append(f"{where}: {mark.test} does not exist")
        if isinstance(mark, NotRun) and mark.reason.startswith("reads the runs of `"):
            before = mark.reason.split("`")[1]
            if not isinstance(MARKS.get(before), Long):
                problems.append(f"{where}: reads the runs of {before!r}, which is not a Long mark")
        if isinstance(mark, Run) and f.kind != "python":
            words = shlex.split(f.text)
            missing = [w for w in mark.sub if w not in words]
            if missing:
                problems.append(f"{where}: its mark replaces {missing}, not in the command")
    assert not problems, "\n".join(problems)


def test_the_marks_are_kinds_the_documents_explain():
    """Each mark is one of the kinds tests/doc_marks.py describes, with a reason where one
    is needed."""
    for text, mark in MARKS.items():
        assert isinstance(mark, Run | ByTest | Long | NotRun | Synopsis | Prose), text
        if isinstance(mark, NotRun):
            assert len(mark.reason) > 10, text
        if isinstance(mark, Long):
            assert re.search(r"\d", mark.duration), f"{text}: {mark.duration!r} is no duration"


def test_the_list_prints_every_command_and_how_it_is_covered(found):
    """`python tests/test_docs.py --list` (the README points to it): every command, where it
    is and how it is covered."""
    import subprocess

    out = subprocess.run(
        [sys.executable, "tests/test_docs.py", "--list"], cwd=ROOT, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert "NOT MARKED" not in out.stdout
    for f in found:
        assert f"{f.text}\n" in out.stdout and f"{f.doc}:{f.line}" in out.stdout


# ------------------------------------------------------------------------------- running
def _expand(words: list[str]) -> list[str]:
    """``*`` patterns expanded as the shell does (sorted; kept as written if nothing
    matches)."""
    out: list[str] = []
    for w in words:
        matches = sorted(str(p) for p in Path().glob(w)) if "*" in w else []
        out += matches or [w]
    return out


def _argv(text: str, mark: Run | None) -> list[str]:
    words = shlex.split(text)
    if mark is not None:
        words = [mark.sub.get(w, w) if w in mark.sub else w for w in words]
        words = [w for w in words if w is not None] + list(mark.add)
    return _expand(words)


def _fedshift(argv: list[str]) -> tuple[int, str]:
    """``fedshift ARGV`` in this process (the same ``main`` the console script calls)."""
    from fedshift.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            code = main(argv)
        except SystemExit as e:  # argparse
            code = e.code if isinstance(e.code, int) else 2
    return code, out.getvalue()


def _shell(text: str, mark: Run | None = None) -> tuple[int, str, list[str]]:
    argv = _argv(text, mark)
    if argv[:3] == ["python", "-m", "fedshift"]:
        argv = ["fedshift", *argv[3:]]  # python -m fedshift: the current folder is importable
    if argv[0] == "python" and len(argv) > 1 and argv[1].startswith("benchmarks/"):
        # a script of the repository's benchmarks/ (linked into the scratch folder)
        proc = subprocess.run([sys.executable, *argv[1:]], capture_output=True, text=True)
        return proc.returncode, proc.stdout + proc.stderr, argv
    if argv[0] != "fedshift":
        raise AssertionError(
            f"the doc test runs fedshift commands and benchmarks/ scripts only, not {argv[0]!r}"
        )
    code, out = _fedshift(argv[1:])
    return code, out, argv


def _python(f: Found, mark: Run, examples: dict[str, str]) -> tuple[int, str, list[str]]:
    """A Python snippet with the text substitutions of its mark, in this process, with the
    document's other examples written as modules into the current folder."""
    for name, code in examples.items():
        if name.endswith(".py") and "/" not in name and name != f.text.split(": ", 1)[1]:
            Path(name).write_text(code)
    code = f.context
    for old, new in mark.sub.items():
        assert old in code, f"{f.text}: its mark replaces {old!r}, not in the snippet"
        code = code.replace(old, new or "")
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            exec(compile(code, f"{f.doc}:{f.text}", "exec"), {"__name__": "__doc_snippet__"})
    except Exception as e:  # noqa: BLE001 - reported with the snippet
        return 1, f"{out.getvalue()}\n{type(e).__name__}: {e}", [f.text]
    return 0, out.getvalue(), [f.text]


def _runs_by_doc() -> dict[str, list[Found]]:
    """The commands marked Run, each under the first document that has it, in order."""
    seen: set[str] = set()
    by_doc: dict[str, list[Found]] = defaultdict(list)
    for f in find_commands():
        if isinstance(MARKS.get(f.text), Run) and f.text not in seen:
            seen.add(f.text)
            by_doc[f.doc].append(f)
    return dict(by_doc)


RUNS = _runs_by_doc()


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """A scratch folder holding links to configs/ and benchmarks/, an empty data cache, and
    itself on ``sys.path`` (as ``python -m`` puts the current folder)."""
    for name in ("configs", "benchmarks"):
        (tmp_path / name).symlink_to(ROOT / name)
    monkeypatch.setenv("FEDSHIFT_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    before = set(sys.modules)
    yield tmp_path
    for name in set(sys.modules) - before:
        if name.startswith(("mymethods", "myaugments", "mymodels")):
            del sys.modules[name]


@pytest.mark.slow
@pytest.mark.parametrize("doc", sorted(RUNS))
def test_doc_commands_run(doc, workdir, one_thread):
    """Every command of ``doc`` marked Run exits 0, in document order (a later command uses
    what an earlier one made, as a reader's would)."""
    examples = {
        f.text.split(": ", 1)[1]: f.context
        for f in find_commands()
        if f.doc == doc and f.kind == "python"
    }
    failures, expected, timings = [], [], []
    for f in RUNS[doc]:
        mark = MARKS[f.text]
        assert isinstance(mark, Run)
        start = time.perf_counter()
        for pre in mark.before:
            code, out, argv = _shell(pre)
            assert code == 0, f"{doc}: `{pre}` (before `{f.text}`) exited {code}:\n{out[-3000:]}"
        if f.kind == "python":
            code, out, argv = _python(f, mark, examples)
        else:
            code, out, argv = _shell(f.text, mark)
        timings.append(f"{time.perf_counter() - start:6.1f} s  {shlex.join(argv)[:110]}")
        if code != 0:
            failure = f"{doc}:{f.line}: `{shlex.join(argv)}` exited {code}:\n{out[-3000:]}"
            (expected if mark.xfail else failures).append(failure)
    print("\n".join(timings))
    assert not failures, "\n\n".join(failures)
    if expected:
        pytest.xfail("; ".join(MARKS[f.text].xfail for f in RUNS[doc] if MARKS[f.text].xfail))


def describe(mark: object) -> str:
    """One line saying how a command is covered."""
    if isinstance(mark, Run):
        extra = " ".join([*mark.add, *(f"{k}->{v}" for k, v in mark.sub.items())])
        why = f"; {mark.why}" if mark.why else ""
        return "run here" + (f" (+ {extra})" if extra else "") + why
    if isinstance(mark, ByTest):
        return f"run by {mark.test}: {mark.how}"
    if isinstance(mark, Long):
        note = f" ({mark.note})" if mark.note else ""
        return f"not run: takes {mark.duration} on 2 cores{note}"
    if isinstance(mark, NotRun):
        return f"not run: {mark.reason}"
    if isinstance(mark, Synopsis):
        return "a synopsis with placeholders" + (f" ({mark.note})" if mark.note else "")
    return "named in prose" + (f" ({mark.note})" if getattr(mark, "note", "") else "")


if __name__ == "__main__":
    # no argument: the commands that still need a mark, as stubs to paste;
    # --list: every command, where it is and how it is covered
    found = find_commands()
    if "--list" in sys.argv:
        where = defaultdict(list)
        for f in found:
            where[f.text].append(f"{f.doc}:{f.line}")
        for text, places in where.items():
            mark = MARKS.get(text)
            how = describe(mark) if mark else "NOT MARKED"
            print(f"{text}\n    {', '.join(places)}\n    {how}")
    else:
        missing = {f.text: f for f in found if f.text not in MARKS}
        print("\n".join(_stub(f) for f in missing.values()) or "every command is marked")
