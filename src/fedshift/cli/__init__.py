"""The ``fedshift`` command line.

fedshift run [-c CONFIG] [key=value ...] [--out DIR]     run a config (and its sweep grid)
fedshift run ... [--jobs N] [--overwrite | --new]        runs at a time; a run dir that exists
fedshift run --resume RUN_DIR [train.rounds=N]          continue (or extend) a run
fedshift bench SUITE.yaml [key=value ...] [--workers N]  a suite: cached cells, parallel runs
fedshift list                                            components and every config key
fedshift config show [-c CONFIG] [key=value ...]         the resolved config, as YAML
fedshift report RUN_DIR... [--out DIR]                   Markdown + HTML + CSV report of runs
fedshift protocol cross-site|loco|sweep|rounds|...       the papers' evaluation protocols
fedshift data build|show|fetch ...                       offline benchmarks
fedshift data check [DATASET|CONFIG] [key=value ...]     how the sites differ: the shift report
fedshift flower simulate|certs|keys|app|submit ...       the same runs on Flower
fedshift claims [--check] | claims collect ...           the claims ledger from results/
fedshift export RUN_DIR --out model.pt                   the trained model: state_dict + predictor
fedshift predict MODEL.pt2 IMAGES... [--site-stats DIR]  an exported predictor's labels and scores
fedshift docs [GUIDE]                                    the guides shipped with fedshift
fedshift privacy show [-c CONFIG] [key=value ...]        what each site sends, record by record

One module per command group: :mod:`fedshift.cli.run` (run, bench, list, report),
:mod:`fedshift.cli.data`, :mod:`fedshift.cli.protocol`, :mod:`fedshift.cli.flower`,
:mod:`fedshift.cli.export` and :mod:`fedshift.cli.docs`.
Building the parser imports only the standard library: every handler imports what it needs
(torch, the registries, Flower...) when it runs, so ``fedshift --help`` and a mistyped command
answer at once. ``tests/cli/test_cli_speed.py`` keeps it that way.

Exit codes: 0 done; 2 an error a user can fix, printed as one ``fedshift: error: ...`` line
(a :class:`~fedshift.core.errors.FedshiftError`, or an ``OSError`` such as a full disk, a
read-only or misplaced ``--out``, named with its file and the fix); 130 interrupted; a run
stopped by SIGINT / SIGTERM after saving its state exits with the code its signal sets.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import sys
from pathlib import Path

from fedshift import __version__
from fedshift.cli import cache, claims, data, docs, export, flower, privacy, protocol, run
from fedshift.core.errors import FedshiftError

__all__ = ["build_parser", "describe_os_error", "main", "parse"]


def build_parser() -> argparse.ArgumentParser:
    """The ``fedshift`` parser; each subcommand sets ``fn`` to a handler returning the exit
    code."""
    p = argparse.ArgumentParser(prog="fedshift", description=__doc__.split("\n")[0])
    p.add_argument("--version", action="version", version=f"fedshift {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    run.add_parsers(sub)  # run, bench, list, report
    protocol.add_parser(sub)
    flower.add_parser(sub)
    data.add_parser(sub)
    cache.add_parser(sub)
    claims.add_parser(sub)
    export.add_parser(sub)
    docs.add_parser(sub)
    privacy.add_parser(sub)
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
    from fedshift.core.consent import allow_in_this_process

    args = parse(argv)
    allow_in_this_process(bool(getattr(args, "allow_plugins", False)))  # --allow-plugins
    try:
        return args.fn(args)
    except FedshiftError as e:
        print(f"fedshift: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `fedshift list | head`: the reader has all it wanted
        with contextlib.suppress(OSError):  # no second error when Python flushes at exit
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, as a shell reports a command a pipe's end stopped
    except OSError as e:  # disk full, read-only or misplaced --out, unreadable file...
        print(f"fedshift: error: {describe_os_error(e)}", file=sys.stderr)
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
    finally:
        allow_in_this_process(False)


def _file_in_the_way(path: Path) -> Path | None:
    """The regular file among ``path`` and its parents (a file where a folder must be)."""
    for p in (path, *path.parents):
        try:
            if p.exists():
                return None if p.is_dir() else p
        except OSError:
            return None
    return None


def _in_data_cache(name: str | None) -> Path | None:
    """The data cache folder (``$FEDSHIFT_CACHE`` or ``~/.cache/fedshift``) holding the
    path ``name``, if it does."""
    if not name:
        return None
    from fedshift.data.common.cache import cache_dir

    root = cache_dir().expanduser().absolute()
    path = Path(name).expanduser().absolute()
    return root if path == root or root in path.parents else None


def describe_os_error(e: OSError) -> str:
    """One line for an ``OSError``: the file it concerns, what went wrong, and the fix."""
    name = None if e.filename is None else str(e.filename)
    what = e.strerror or str(e)
    head = f"{name}: {what}" if name else what
    code = e.errno
    if code in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)):
        return (
            f"{head}: the disk is full. Free space (or choose another --out), then continue: "
            "`fedshift run --resume RUN_DIR` resumes a run from its last checkpoint, and "
            "rerunning the same `fedshift bench` keeps the finished cells"
        )
    if code in (errno.ENOTDIR, errno.EEXIST) and name:
        blocker = _file_in_the_way(Path(name))
        if blocker is not None:
            return (
                f"{blocker} is a file, not a folder, so {name} cannot be created there: "
                "choose another --out (or move the file away)"
            )
    if code in (errno.EACCES, errno.EPERM, errno.EROFS):
        cache = _in_data_cache(name)
        if cache is not None:  # not a run's folder: --out would change nothing
            return (
                f"{head}: fedshift's data cache ({cache}) is not writable here, and the "
                "dataset keeps the data it prepares there. Point FEDSHIFT_CACHE (or the "
                "dataset's cache_dir key) at a writable folder, or fix that folder's "
                "permissions"
            )
        if name and Path(name).is_file() and not os.access(name, os.R_OK):
            return f"{head}: this file cannot be read: fix its permissions (or copy it)"
        return (
            f"{head}: cannot write or read here. Choose a writable folder with --out (or "
            "fix the permissions of that path)"
        )
    if code == errno.EISDIR:
        return f"{head}: a file is expected here, not a folder"
    if code == errno.ENOENT:
        return f"{head}: check the path"
    return head
