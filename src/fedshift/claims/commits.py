"""Which fedshift commits a git repository holds: a committed run records the commit it ran
at (``summary.json``'s ``provenance.git.commit``), and one that the repository does not hold
cannot be checked out to see what code made the numbers. The claims ledger flags such runs
on their pages (issue 50)."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterable
from pathlib import Path

__all__ = ["commit_checker", "run_commit"]


def run_commit(summary: dict) -> str | None:
    """The commit a run's summary records (without ``+dirty``), or None."""
    prov = summary.get("provenance")
    git = prov.get("git") if isinstance(prov, dict) else None
    commit = git.get("commit") if isinstance(git, dict) else None
    return str(commit) if commit else None


def _git(root: Path, args: list[str], stdin: str | None = None) -> str | None:
    try:
        done = subprocess.run(
            ["git", "-C", str(root), *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def commit_checker(root: Path) -> Callable[[Iterable[str]], set[str]] | None:
    """A function giving the commits (of those asked) that the git repository at ``root``
    does not hold (``git cat-file --batch-check``), or None when ``root`` is no git work
    tree with its full history (no git, not a repository, a shallow clone): then nothing can
    be said of a commit, and the ledger says nothing of any."""
    shallow = _git(root, ["rev-parse", "--is-shallow-repository"])
    if shallow is None or shallow.strip() != "false":
        return None

    def missing(commits: Iterable[str]) -> set[str]:
        asked = sorted(set(commits))
        if not asked:
            return set()
        out = _git(root, ["cat-file", "--batch-check"], "".join(f"{c}^{{commit}}\n" for c in asked))
        if out is None:
            raise OSError(f"git cat-file failed in {root}")
        lines = out.splitlines()
        return {c for c, line in zip(asked, lines, strict=True) if line.endswith(" missing")}

    return missing
