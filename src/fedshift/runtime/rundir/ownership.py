"""Who owns a run directory: claimed atomically, locked for the life of the process using it.

* :func:`claim_run_dir` creates ``<root>/<base>`` (or ``<base>-2``, ``-3``...) with a plain
  ``mkdir``, which fails when the directory exists: of two runs started together, each gets
  its own directory, never both the same. With ``exists="error"`` a taken ``<base>`` is a
  :class:`RunDirExists` naming what it holds (:func:`describe_run_dir`) and the three ways
  on (``fedshift run``'s default: resume, ``--overwrite`` or ``--new``); with
  ``exists="overwrite"`` it is returned as is, for its new owner to empty while holding its
  lock (:func:`clear_run_dir`).
* :func:`hold_run` holds an exclusive ``flock`` on ``<run_dir>/run.lock`` while a process
  runs, resumes or (as a bench cell) writes the run; a second process that tries gets a
  :class:`~fedshift.core.errors.FedshiftError` naming the holder (pid, host, since when,
  command) from the lock file's contents. :func:`hold_lock` is the same for any lock file
  (``fedshift bench`` holds ``<out>/<name>/bench.lock`` for a whole suite).
* :func:`clear_run_dir` deletes only what fedshift made (:func:`check_clearable`): never
  through a symbolic link (a link is refused, a link inside is removed as a link, its target
  untouched), and only a directory that carries fedshift's own marks (:func:`fedshift_marks`:
  its lock file and a ``config.yaml`` that parses as a run config, or a checkpoint with
  fedshift's header, or a bench cell's ``cell.json``); anything else is refused with its path.
  ``fedshift run --overwrite``, ``fedshift bench``, ``fedshift flower simulate --overwrite``
  and the Python API all clear through it.

The operating system releases a ``flock`` when the process holding it exits, however it exits
(``kill -9`` included), so a lock is never stale: the lock file stays in the directory after a
run and means nothing until a process locks it again; never delete it by hand while a run is
going (a new file would be a second, independent lock). Locks are reentrant within one process
(a bench worker holds its cell's lock while the round loop takes it again): a per-process
registry counts the holds of each lock file, and only the last release unlocks it.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import socket
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from fedshift.core.errors import FedshiftError
from fedshift.core.files import ensure_dir, open_lock

try:  # POSIX; elsewhere runs are not locked (see _lock_fd)
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "EXISTS",
    "LOCK_FILE",
    "NotClearable",
    "RunDirExists",
    "check_clearable",
    "claim_run_dir",
    "compare_config",
    "describe_run_dir",
    "clear_run_dir",
    "fedshift_marks",
    "hold_lock",
    "hold_run",
    "is_empty",
    "is_run_dir",
    "lock_holder",
]

#: the lock file inside a run directory
LOCK_FILE = "run.lock"
#: what :func:`claim_run_dir` does with a directory that exists (see its docstring)
EXISTS = ("new", "error", "overwrite")

_registry_lock = threading.Lock()
#: (device, inode) of each lock file this process holds -> [fd, holds]
_held: dict[tuple[int, int], list[int]] = {}


def _forget_after_fork() -> None:
    # a forked child shares its parent's locks (same open files); it must not unlock them
    global _registry_lock
    _registry_lock = threading.Lock()
    _held.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)


def claim_run_dir(root: Path, base: str, exists: str = "new") -> Path:
    """Create and return ``root/base``; the ``mkdir`` is the claim, so no two callers get the
    same directory. When it exists, ``exists`` says what happens: ``new``: the first of
    ``base-2``, ``base-3``... that does not exist yet; ``error``: :class:`RunDirExists`,
    unless it holds nothing (a claim whose run never started: it is taken as is; of two runs
    started together in it, the run lock lets one run); ``overwrite``: ``root/base`` itself,
    as it is (its new owner empties it while holding its lock: :func:`hold_run`, then
    :func:`clear_run_dir`)."""
    if exists not in EXISTS:
        raise ValueError(f"exists must be one of {EXISTS}, got {exists!r}")
    root.mkdir(parents=True, exist_ok=True)
    path, i = root / base, 1
    while True:
        try:
            path.mkdir()
            return path
        except FileExistsError:
            if path.is_symlink() and exists != "new":
                raise NotClearable(path, "a symbolic link", "claim") from None
            if exists == "overwrite" and path.is_dir():
                return path
            if exists == "error" and is_empty(path):
                return path
            if exists != "new":
                raise RunDirExists([path]) from None
            i += 1
            path = root / f"{base}-{i}"


def describe_run_dir(path: Path) -> str:
    """What a run directory holds, in a few words: ``a finished run``, ``a stopped run``
    (a checkpoint to resume), ``a run started but not checkpointed yet``, ``nothing``, or
    ``no fedshift run``."""
    names = {p.name for p in path.iterdir()} if path.is_dir() else {"?"}
    if "summary.json" in names:
        return "a finished run"
    if "checkpoint.pt" in names:
        return "a stopped run with a checkpoint to resume"
    if "config.yaml" in names:
        return "a run started but not checkpointed yet"
    if names <= {LOCK_FILE}:
        return "nothing (an empty run directory)"
    return "files but no fedshift run (no config.yaml)"


def is_empty(path: Path) -> bool:
    """Whether ``path`` is a directory holding nothing but (maybe) its lock file."""
    try:
        return path.is_dir() and {p.name for p in path.iterdir()} <= {LOCK_FILE}
    except OSError:
        return False


def is_run_dir(path: Path) -> bool:
    """Whether ``path`` is a directory fedshift may delete the content of (``--overwrite``):
    not a symbolic link, and empty but for its lock file or carrying fedshift's marks
    (:func:`fedshift_marks`)."""
    return not path.is_symlink() and (is_empty(path) or bool(fedshift_marks(path)))


#: the top-level keys every run's ``config.yaml`` has, as fedshift writes it (every section
#: of the resolved config; a config a user writes by hand names a few)
_CONFIG_KEYS = {
    "name", "seed", "device", "dataset", "model", "algorithm", "partition", "augment",
    "train", "federation", "input", "eval", "checkpoint", "out",
}  # fmt: skip


def fedshift_marks(path: Path) -> list[str]:
    """The marks that show fedshift made the directory ``path`` (empty: none, or ``path`` is
    a symbolic link): ``run.lock + config.yaml`` (its lock file, and a ``config.yaml`` that
    parses as a resolved run config: a mapping with every section fedshift writes),
    ``checkpoint.pt`` / ``selected.pt`` (fedshift's checkpoint header) or ``cell.json`` (a
    bench cell's record: a JSON object with its ``digest``). Reads a few bytes of each;
    never follows a link."""
    if path.is_symlink() or not path.is_dir():
        return []
    marks = []

    def regular(name: str) -> Path | None:
        f = path / name
        return f if f.is_file() and not f.is_symlink() else None

    config, lock = regular("config.yaml"), regular(LOCK_FILE)
    if config is not None and lock is not None and _parses_as_config(config):
        marks.append(f"{LOCK_FILE} + config.yaml")
    for name in ("checkpoint.pt", "selected.pt"):
        f = regular(name)
        if f is not None and _has_checkpoint_header(f):
            marks.append(name)
    cell = regular("cell.json")
    if cell is not None:
        try:
            meta = json.loads(cell.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            meta = None
        if isinstance(meta, dict) and isinstance(meta.get("digest"), str):
            marks.append("cell.json")
    return marks


def _parses_as_config(path: Path) -> bool:
    from fedshift.core.yamlsafe import load_text

    try:
        if path.stat().st_size > 1_000_000:  # a run's config.yaml is a few KB
            return False
        data = load_text(path.read_text(encoding="utf-8"))
    except Exception:  # any read or parse failure: not a config fedshift wrote
        return False
    return isinstance(data, dict) and set(data) >= _CONFIG_KEYS


def _has_checkpoint_header(path: Path) -> bool:
    from fedshift.runtime.rundir.checkpoint_io import MAGIC

    try:
        with open(path, "rb") as f:
            return f.read(len(MAGIC)) == MAGIC
    except OSError:
        return False


class NotClearable(FedshiftError):
    """A directory fedshift was asked to empty (or write a run into) that it did not make:
    a symbolic link, or a directory without fedshift's marks. Nothing was deleted."""

    def __init__(self, path: Path, what: str, action: str = "overwrite") -> None:
        self.path = path
        verb = {
            "overwrite": "--overwrite deletes only run directories fedshift made",
            "bench": "fedshift bench clears only cell directories fedshift made",
            "claim": "fedshift writes a run only into a directory of its own",
        }.get(action, "fedshift deletes only run directories it made")
        super().__init__(
            f"{path} is {what}; {verb}, never through a symbolic link, so nothing was "
            "deleted or written. Move it away (or remove the link), or choose another --out "
            "or name"
        )


def check_clearable(path: Path, action: str = "overwrite") -> None:
    """Raise :class:`NotClearable` unless fedshift may delete the content of ``path``: a
    directory, not a symbolic link, holding nothing but its lock file or carrying
    fedshift's marks (:func:`fedshift_marks`)."""
    if path.is_symlink():
        raise NotClearable(path, "a symbolic link", action)
    if not path.is_dir():
        raise NotClearable(path, "not a directory", action)
    if is_empty(path) or fedshift_marks(path):
        return
    names = sorted(p.name for p in path.iterdir())
    shown = ", ".join(names[:5]) + (", ..." if len(names) > 5 else "")
    raise NotClearable(
        path,
        f"not a fedshift run directory (it holds {shown} but no fedshift marks: run.lock with "
        "a config.yaml that parses, a checkpoint with fedshift's header, or cell.json)",
        action,
    )


def compare_config(path: Path, new: dict, extend: bool = True) -> str:
    """How the config stored in run directory ``path`` (its ``config.yaml``) compares with
    ``new`` (a resolved config as a dict), in words: the same config, the same up to keys that
    change no number, up to ``train.rounds`` (the run can be extended to the new count), or
    another config, with every differing key (``key: there -> new``); ``extend``: say how
    ``fedshift run --resume`` extends it. ``""`` when ``path`` holds no readable
    ``config.yaml``."""
    from fedshift.core.config import load_yaml
    from fedshift.core.errors import ConfigError
    from fedshift.core.identity import EXECUTION_KEYS, config_diff, number_config

    try:
        old = load_yaml(path / "config.yaml")
    except (ConfigError, OSError):
        return ""
    located = ("name", "out", "sweep")  # where the run is, not what it is
    diff = [d for d in config_diff(old, new) if d[0].split(".")[0] not in located]
    numbers = {k for k, _, _ in config_diff(number_config(old), number_config(new))}
    numbers = {f"run.{k}" if k in EXECUTION_KEYS else k for k in numbers}
    shown = "; ".join(f"{k}: {a} -> {b}" for k, a, b in diff)
    if not diff:
        return "with the same config"
    if not numbers & {k for k, _, _ in diff}:
        return f"with the same config up to keys that change no number ({shown})"
    if {k for k, _, _ in diff} & numbers == {"train.rounds"}:
        rounds = next(b for k, _, b in diff if k == "train.rounds")
        how = (
            f"; `fedshift run --resume {path} train.rounds={rounds}` extends it to the "
            f"numbers of a new run of {rounds} rounds"
            if extend
            else ""
        )
        return f"with the same config but train.rounds ({shown}{how})"
    return f"with another config, which differs from this one in {shown}"


class RunDirExists(FedshiftError):
    """The run directories a new run would write hold something already: the message names
    each with what it holds and, given the new ``configs`` (one per path), how its stored
    config differs (:func:`compare_config`), and the three ways on (resume it, overwrite,
    new). ``command`` is the command the advice names: ``fedshift run`` (the default) and
    ``fedshift flower simulate`` take ``--overwrite`` / ``--new``; ``fedshift.run`` (the
    Python API) ``exists="overwrite"`` / ``exists="new"``; ``flwr run`` (a Flower App's
    ServerApp) the run config keys ``resume`` and ``exists``."""

    def __init__(
        self,
        paths: list[Path],
        command: str = "fedshift run",
        configs: list[dict] | None = None,
    ) -> None:
        self.paths = list(paths)
        flower = command.startswith("fedshift flower") or command == "flwr run"
        notes = (
            [compare_config(p, c, not flower) for p, c in zip(self.paths, configs, strict=True)]
            if configs is not None
            else [""] * len(self.paths)
        )
        each = "; ".join(
            f"{p} holds {describe_run_dir(p)}" + (f" {n}" if n else "")
            for p, n in zip(self.paths, notes, strict=True)
        )
        one = len(self.paths) == 1
        it = "it" if one else "them"
        cli = command if command.startswith("fedshift flower") else "fedshift run"
        resume = f"`{cli} --resume {self.paths[0]}`" if one else f"`{cli} --resume DIR` for each"
        if command.startswith("fedshift."):  # the Python API
            overwrite, new = f"{command}(..., exists='overwrite')", f"{command}(..., exists='new')"
        elif command == "flwr run":  # a Flower App's ServerApp: its run config says
            app = "`flwr run APP_DIR --run-config"
            resume = f"{app} \"resume='{self.paths[0]}'\"`" if one else f"{app} \"resume='DIR'\"`"
            overwrite = f"{app} \"exists='overwrite'\"`"
            new = f"{app} \"exists='new'\"`"
        else:
            overwrite, new = "the same command with --overwrite", "with --new"
        # a Flower App's resume takes the saved config as it is: nothing to extend it with
        extend = "" if command == "flwr run" else "(or, with train.rounds=N, extend) "
        super().__init__(
            f"{each}. Choose: {resume} to continue {extend}{it}; "
            f"{overwrite} to delete {it} and run again; or {new} to run into a new directory "
            f"next to {'it' if one else 'each'} (-2, -3...)"
        )


def lock_holder(lock_path: Path) -> dict | None:
    """What the holder of ``lock_path`` wrote into it (pid, host, since, command), if
    readable; the file may also be a leftover of a process that has exited."""
    try:
        info = json.loads(Path(lock_path).read_text() or "null")
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) else None


def _describe(info: dict | None) -> str:
    if not info:
        return "another process (it has not written its name into the lock file yet)"
    host = info.get("host", "?")
    where = "" if host == socket.gethostname() else f" on host {host}"
    return (
        f"process {info.get('pid', '?')}{where}, running since {info.get('since', '?')}: "
        f"{info.get('command', '?')}"
    )


def _command() -> str:
    """This process's command line, ``fedshift ...`` for ``python -m fedshift ...``."""
    argv = list(sys.argv) or [sys.executable]
    if Path(argv[0]).name == "__main__.py" and Path(argv[0]).parent.name == "fedshift":
        argv[0] = "fedshift"
    return shlex.join(argv)


def _lock_fd(fd: int) -> bool:
    """Try to lock ``fd`` exclusively without waiting; False if another process holds it."""
    if fcntl is None:  # pragma: no cover - no flock on this platform: nothing is locked
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


@contextmanager
def hold_lock(lock_path: str | Path, what: str, advice: str) -> Iterator[None]:
    """Hold an exclusive lock on ``lock_path`` (created if missing) for the ``with`` block.

    Another process holding it: :class:`FedshiftError` "``what`` is in use by <holder>;
    ``advice``". Reentrant within this process (module docstring)."""
    lock_path = Path(lock_path)
    ensure_dir(lock_path.parent)
    fd = open_lock(lock_path)  # a link or special file planted as the lock is refused
    st = os.fstat(fd)
    key = (st.st_dev, st.st_ino)
    with _registry_lock:
        entry = _held.get(key)
        if entry is not None:  # this process holds it already: count one more hold
            os.close(fd)
            entry[1] += 1
        elif _lock_fd(fd):
            me = {
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "since": time.strftime("%Y-%m-%d %H:%M:%S %z"),
                "command": _command(),
            }
            os.ftruncate(fd, 0)
            os.lseek(fd, 0, os.SEEK_SET)
            os.write(fd, (json.dumps(me) + "\n").encode())
            _held[key] = [fd, 1]
        else:
            os.close(fd)
            raise FedshiftError(
                f"{what} is in use by {_describe(lock_holder(lock_path))}. {advice}. "
                f"(Its lock, {lock_path}, goes when that process exits, even if killed: "
                "there is nothing stale to delete.)"
            )
    try:
        yield
    finally:
        with _registry_lock:
            entry = _held[key]
            entry[1] -= 1
            if entry[1] == 0:
                del _held[key]
                os.close(entry[0])  # closing the last descriptor releases the flock


@contextmanager
def hold_run(run_dir: str | Path) -> Iterator[Path]:
    """Own ``run_dir`` (created if missing) for the ``with`` block: run, resume or write it.
    A second process gets a :class:`FedshiftError` naming the one that owns it."""
    run_dir = ensure_dir(run_dir)  # a run directory that is a link is not written through
    advice = (
        "Two processes must never write one run directory: wait for that run to finish, or "
        "stop it (Ctrl-C or kill, and it saves its last whole round) and continue it with "
        f"`fedshift run --resume {run_dir}`; to run the config again, start a new run (it gets "
        "a directory of its own)"
    )
    with hold_lock(run_dir / LOCK_FILE, f"run directory {run_dir}", advice):
        yield run_dir


def clear_run_dir(run_dir: Path, action: str = "overwrite") -> None:
    """Delete everything in ``run_dir`` but its lock file (call it while holding the lock:
    deleting the lock file would let another process lock a new one), once
    :func:`check_clearable` says fedshift made it. A symbolic link inside is removed as a
    link (its target is untouched); ``shutil.rmtree`` follows none either."""
    check_clearable(run_dir, action)
    for child in run_dir.iterdir():
        if child.name == LOCK_FILE:
            continue
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()
