"""The one file-system layer: every file fedshift writes, appends to, locks, copies or deletes
goes through these functions, so that a name or a symbolic link planted in a folder fedshift
writes (a received run directory or suite, a shared cache) never makes it write, truncate or
delete anything else.

* **Writes are atomic** (:func:`atomic_output`, :func:`write_text_atomic`,
  :func:`write_bytes_atomic`): the content goes to a temporary file with a fresh, unique name
  in the target's folder, created with ``O_CREAT | O_EXCL | O_NOFOLLOW`` (nothing that
  exists, a link included, is ever opened for writing), is flushed and fsynced, then renamed
  over the target with ``os.replace`` (atomic on POSIX within one file system): a reader, a
  crash or a full disk sees the old file or the new one, never half of one. When writing
  fails the temporary file is removed and the error propagates; the previous file is
  untouched. A file that is rebuilt whenever it is needed again (``metrics.jsonl`` and
  ``metrics.csv``: rewritten from ``checkpoint.pt``'s rows when a run resumes, appended to
  without fsync) is written with ``durable=False``: as atomically, without the fsync that
  only a file nothing rebuilds needs.
* **No link, no special file where a regular file is expected**: a target (or a file to
  append to, lock or read back) that is a symbolic link, a FIFO, a device or a folder is
  refused with :class:`UnsafePathError` naming it and what it is, never followed
  (``O_NOFOLLOW``; FIFOs are opened with ``O_NONBLOCK`` and refused by type, so nothing
  hangs).
* **Folders fedshift makes** (:func:`ensure_dir`) are refused when the name is a link: a run
  or suite folder that points elsewhere is not written through. The root a user gives
  (``--out``, ``results/``, the cache folder) may itself be a link: that is the user's choice.
* **Names a user supplies** (a results folder name, a claims page) are resolved against their
  root by :func:`child_path` / :func:`inside`, which refuse ``..``, ``.``, absolute paths and
  anything that escapes the root.
* **Copies** (:func:`copy_regular`) take only regular files that are not links; **deletes**
  (:func:`remove_tree`) only a real folder inside the root the caller names.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import stat
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from fedshift.core.errors import FedshiftError

__all__ = [
    "UnsafePathError",
    "atomic_output",
    "check_folder",
    "check_regular",
    "child_path",
    "copy_regular",
    "ensure_dir",
    "inside",
    "open_append",
    "open_lock",
    "open_regular",
    "read_bytes",
    "read_json",
    "remove_tree",
    "save_figure",
    "temporary_name",
    "write_bytes_atomic",
    "write_text_atomic",
]

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


class UnsafePathError(FedshiftError):
    """A path fedshift will not write, read, copy or delete: a symbolic link or a special
    file where a regular file (or a real folder) is expected, or a user-supplied name that
    escapes its root."""


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "a special file"


def _refuse(path: Path, kind: str, doing: str) -> UnsafePathError:
    target = ""
    if kind == "a symbolic link":
        with contextlib.suppress(OSError):
            target = f" (to {os.readlink(path)})"
    return UnsafePathError(
        f"{path} is {kind}{target}; fedshift {doing} only regular files it made itself and "
        "never follows a link there. Remove it (or move it away) and run the command again"
    )


def check_regular(path: str | Path, doing: str = "writes", missing_ok: bool = True) -> bool:
    """Raise :class:`UnsafePathError` when ``path`` exists and is not a regular file (a link
    counts as not regular: it is not followed). Returns whether it exists."""
    path = Path(path)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        if missing_ok:
            return False
        raise
    if not stat.S_ISREG(st.st_mode):
        raise _refuse(path, _kind(st.st_mode), doing)
    return True


def ensure_dir(path: str | Path) -> Path:
    """Create the folder ``path`` (and its parents) unless it exists; refuse it when the name
    itself is a link or not a folder (its parents may be links: a root the user chose)."""
    path = Path(path)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        path.mkdir(parents=True, exist_ok=True)
        st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise _refuse(path, _kind(st.st_mode), "writes into folders")
    return path


def check_folder(folder: str | Path, what: str = "a run directory") -> None:
    """Refuse ``folder`` when any entry directly in it is a symbolic link or a special file:
    fedshift writes only regular files and folders there, so such an entry was planted (a
    received run directory, a shared suite folder). Checked before any work, so that the
    refusal does not come after hours of training. Sub-folders (a tracker's own, which may
    hold its links) are not entered."""
    folder = Path(folder)
    with os.scandir(folder) as entries:
        for e in sorted(entries, key=lambda e: e.name):
            st = e.stat(follow_symlinks=False)
            if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
                raise UnsafePathError(
                    f"{Path(e.path)} is {_kind(st.st_mode)}"
                    + (f" (to {os.readlink(e.path)})" if e.is_symlink() else "")
                    + f" in {what}; fedshift never writes through links or special files "
                    "there. Remove it (or start a new run: it gets a directory of its own)"
                )


def temporary_name(path: Path) -> Path:
    """A fresh hidden name next to ``path``, unique per process and call."""
    return path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:12]}.tmp")


def _create_exclusive(path: Path, mode: int = 0o666) -> int:
    """``path`` created anew (fails if anything, a link included, is there): its descriptor."""
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC, mode)


@contextlib.contextmanager
def atomic_output(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path to write ``path``'s new content to; on success it is fsynced
    and renamed over ``path``, on failure removed (module docstring). The temporary file
    exists (empty, made by this call) when the block starts. ``path`` itself must be absent
    or a regular file. Writers that infer a format from the file name (matplotlib's
    ``savefig``) must be given the format explicitly."""
    path = Path(path)
    check_regular(path)
    tmp = temporary_name(path)
    os.close(_create_exclusive(tmp))
    try:
        yield tmp
        check_regular(tmp)  # still the file this call made (not swapped for a link)
        fd = os.open(tmp, os.O_RDONLY | _NOFOLLOW | _CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise


def save_figure(fig: Any, path: str | Path, dpi: int = 100) -> Path:
    """A matplotlib figure as a PNG at ``path`` (its folder made), atomically and never through
    a link (:func:`atomic_output`; the format is given, not read from the temporary name)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_output(path) as tmp:
        fig.savefig(tmp, format="png", dpi=dpi)
    return path


def write_bytes_atomic(
    path: str | Path, data: bytes, mode: int = 0o666, durable: bool = True
) -> None:
    """Write ``data`` to ``path`` atomically (module docstring), through a descriptor this
    call created exclusively with permissions ``mode`` (less the umask): a private key
    written with ``0o600`` is never readable by others, not even for a moment.
    ``durable=False``: no fsync before the rename (a file that is rebuilt when needed)."""
    path = Path(path)
    check_regular(path)
    tmp = temporary_name(path)
    fd = _create_exclusive(tmp, mode)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise


def write_text_atomic(
    path: str | Path, text: str, newline: str | None = None, durable: bool = True
) -> None:
    """Write ``text`` to ``path`` atomically (:func:`write_bytes_atomic`, ``durable`` as
    there)."""
    if newline not in (None, "", "\n"):
        text = text.replace("\n", newline)
    write_bytes_atomic(path, text.encode("utf-8"), durable=durable)


def _open_checked(path: Path, flags: int, doing: str, mode: int = 0o666) -> int:
    """``os.open`` with no-follow (and non-blocking, for FIFOs) semantics; the descriptor of a
    regular file, else :class:`UnsafePathError` naming the path and what it is."""
    try:
        fd = os.open(path, flags | _NOFOLLOW | _NONBLOCK | _CLOEXEC, mode)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.EMLINK, errno.ENXIO, errno.EISDIR):
            with contextlib.suppress(OSError):
                raise _refuse(path, _kind(os.lstat(path).st_mode), doing) from None
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise _refuse(path, _kind(st.st_mode), doing)
    if _NONBLOCK:
        os.set_blocking(fd, True)
    return fd


def open_append(path: str | Path, newline: str | None = None) -> IO[str]:
    """``path`` opened for appending text (created if missing), never through a link;
    ``newline`` as :func:`open`'s (``""`` for the csv module's own line ends)."""
    fd = _open_checked(Path(path), os.O_WRONLY | os.O_APPEND | os.O_CREAT, "appends to")
    return os.fdopen(fd, "a", encoding="utf-8", newline=newline)


def open_lock(path: str | Path) -> int:
    """A read-write descriptor of the lock file ``path`` (created if missing, never
    truncated here), refused when ``path`` is a link or not a regular file."""
    return _open_checked(Path(path), os.O_RDWR | os.O_CREAT, "locks")


def open_regular(path: str | Path, follow: bool = True) -> IO[bytes]:
    """``path`` opened for reading as bytes, refused when it is not a regular file (a FIFO is
    refused by type, it never blocks); with ``follow=False`` a link is refused too."""
    path = Path(path)
    if follow:
        flags = os.O_RDONLY | _NONBLOCK | _CLOEXEC
        fd = os.open(path, flags)
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            raise _refuse(path, _kind(st.st_mode), "reads")
        if _NONBLOCK:
            os.set_blocking(fd, True)
    else:
        fd = _open_checked(path, os.O_RDONLY, "reads")
    return os.fdopen(fd, "rb")


def read_bytes(path: str | Path, follow: bool = True) -> bytes:
    """The bytes of the regular file ``path`` (:func:`open_regular`)."""
    with open_regular(path, follow=follow) as f:
        return f.read()


def copy_regular(src: str | Path, dst: str | Path) -> None:
    """Copy the regular file ``src`` (a link or special file is refused) to ``dst``
    atomically (never through a link at ``dst``)."""
    write_bytes_atomic(dst, read_bytes(src, follow=False))


def inside(root: str | Path, path: str | Path) -> Path:
    """``path`` if it lies inside ``root`` once both are resolved (links and ``..``
    followed), else :class:`UnsafePathError`."""
    real_root = Path(root).resolve()
    real = Path(path).resolve()
    if real != real_root and real_root not in real.parents:
        raise UnsafePathError(f"{path} is outside {root}; fedshift writes only under {root}")
    return Path(path)


def child_path(root: str | Path, name: str, what: str = "name", nested: bool = False) -> Path:
    """``root/name`` for a ``name`` a user supplied: refused when it is empty, ``.``, ``..``,
    absolute, holds a ``..`` part (or, unless ``nested``, any separator), or escapes ``root``
    through a link."""
    parts = Path(name).parts
    bad = (
        not name
        or os.path.isabs(name)
        or not parts
        or any(p in (".", "..") for p in name.replace(os.sep, "/").split("/"))
        or (not nested and len(parts) != 1)
    )
    if bad:
        raise UnsafePathError(
            f"{what} {name!r} must be a plain folder name inside {root} (no '..', '.', "
            f"absolute path{'' if nested else ' or /'})"
        )
    return inside(root, Path(root) / name)


def remove_tree(path: str | Path, root: str | Path) -> None:
    """Delete the folder ``path``, which must be a real folder (not a link) strictly inside
    ``root``; links inside it are removed as links, their targets untouched."""
    path = Path(path)
    inside(root, path)
    if Path(path).resolve() == Path(root).resolve():
        raise UnsafePathError(f"{path} is {root} itself; fedshift deletes only folders inside it")
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise _refuse(path, _kind(st.st_mode), "deletes")
    shutil.rmtree(path)


def read_json(path: str | Path) -> Any:
    """The JSON value in ``path``; an empty, truncated or otherwise unreadable result file is a
    :class:`~fedshift.core.errors.FedshiftError` naming it (never a bare ``JSONDecodeError``).
    fedshift writes its result files atomically, so one in that state was damaged or cut off by
    something else (a copy, another tool, a full disk before this fix). A FIFO or other special
    file is refused by type (reading it would block)."""
    path = Path(path)
    try:
        return json.loads(read_bytes(path).decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise FedshiftError(
            f"{path} is not readable JSON ({e}); it was damaged or cut off while being written. "
            "Rerun or resume the run that writes it (`fedshift run --resume DIR`; a bench "
            "suite: run the same `fedshift bench` again), or remove that run directory"
        ) from None


#: a spreadsheet takes a cell that starts with one of these as a formula (and runs it)
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
_NUMBER = re.compile(r"[+-]?((\d+\.?\d*|\.\d+)([eE][+-]?\d+)?|inf(inity)?|nan)", re.IGNORECASE)


def csv_safe(value: Any) -> Any:
    """A CSV cell that no spreadsheet runs as a formula: text starting with ``=``, ``+``,
    ``-``, ``@`` (or a tab / carriage return) gets a leading apostrophe, which spreadsheets
    show as text and do not evaluate (OWASP's "CSV injection" advice); numbers, and text that
    is a number (``-0.5``), stay as they are. A client, dataset or run folder name comes from
    files a user may have received, so every CSV fedshift writes goes through it."""
    if isinstance(value, str) and value.startswith(FORMULA_START) and not _NUMBER.fullmatch(value):
        return "'" + value
    return value
