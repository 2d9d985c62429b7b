"""A cache entry sealed with the digests of its files: what is read back is what was built.

A loader that caches a folder of files (the decode cache of the image-file loaders,
:mod:`fedshift.data.common.image_files`) seals it once every file is written
(:func:`seal`): ``digest.json`` records, per file, the SHA-256 of its bytes, its size and the
file system's ``(mtime, ctime, inode)`` of the file as it was hashed, and the entry's own
name (the digest of what it was built from). :func:`check` is called before the entry is
used and returns what is wrong with it, naming the file, or ``None``:

* ``digest.json`` missing (an entry of an older fedshift, or a build cut short), unreadable,
  or naming another entry (a folder copied or renamed from elsewhere);
* a file missing, a symbolic link or not a regular file (a FIFO would hang the reader);
* a file whose content no longer gives its recorded SHA-256 (bytes changed in place, a file
  swapped for another valid array, index arrays permuted).

Cost: hashing a multi-GB file on every open would cost as much as reading it. A file whose
size, modification time, status-change time and inode are those recorded is taken as
unchanged without being read: writing to a file, replacing or relinking it changes its ctime
or inode, which no user-level tool can set back (``touch`` sets the modification time, not
the status-change time). Any difference (a tampered file, or only a copied or restored cache)
hashes the file in full, in 1 MiB chunks, whatever its size; when the content still matches,
the new file-system record is written back to ``digest.json`` so the next open is cheap again
(where the folder is writable: a read-only shared cache is simply verified again on each
open). Files are opened without following links (``O_NOFOLLOW``) and checked with ``fstat``
on the open descriptor, so what is hashed is the file that was checked.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
from pathlib import Path

from fedshift.data.common import cache

__all__ = ["DIGESTS", "check", "file_record", "seal"]

#: the seal of a cache entry, written last (its presence marks the entry complete)
DIGESTS = "digest.json"
#: bumped if what digest.json records changes
FORMAT = 1
#: bytes read per step while hashing
CHUNK = 2**20


class Unsealed(Exception):
    """What is wrong with one file of an entry (its message names the file)."""


def _open(path: Path) -> int:
    """A read-only descriptor of ``path``, a regular file that is not a link."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise Unsealed(f"{path} is missing") from None
    except OSError as e:
        if path.is_symlink():
            raise Unsealed(f"{path} is a symbolic link, not a file the cache wrote") from None
        raise Unsealed(f"{path} cannot be read ({e.strerror or e})") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise Unsealed(f"{path} is not a regular file")
    return fd


def _signature(st: os.stat_result) -> list[int]:
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


def _hash(fd: int) -> str:
    h = hashlib.sha256()
    while chunk := os.read(fd, CHUNK):
        h.update(chunk)
    return h.hexdigest()


def file_record(path: str | os.PathLike) -> dict:
    """``{"sha256", "stat"}`` of the regular file ``path`` (not followed if a link:
    :class:`Unsealed`), its bytes hashed in chunks."""
    fd = _open(Path(path))
    try:
        return {"sha256": _hash(fd), "stat": _signature(os.fstat(fd))}
    finally:
        os.close(fd)


def seal(folder: str | os.PathLike, names: list[str]) -> None:
    """Record the digests of ``names`` (files in ``folder``) in ``folder/digest.json``: call
    it after every file of the entry is written, and only then."""
    folder = Path(folder)
    files = {name: file_record(folder / name) for name in names}
    body = {"format": FORMAT, "entry": folder.name, "files": files}
    cache.atomic_write_text(folder / DIGESTS, json.dumps(body, indent=1, sort_keys=True) + "\n")


def _read_seal(folder: Path, names: list[str]) -> dict:
    path = folder / DIGESTS
    try:
        if path.is_symlink() or (path.exists() and not path.is_file()):
            raise Unsealed(f"{path} is not a regular file")
        body = json.loads(path.read_text())
    except FileNotFoundError:
        raise Unsealed(f"{path} is missing (an entry of an older fedshift, or cut short)") from None
    except (OSError, ValueError) as e:
        raise Unsealed(f"{path} is unreadable ({e})") from None
    files = body.get("files") if isinstance(body, dict) else None
    if not isinstance(files, dict) or body.get("format") != FORMAT:
        raise Unsealed(f"{path} is not a seal this fedshift writes")
    if body.get("entry") != folder.name:
        raise Unsealed(
            f"{path} seals the entry {body.get('entry')!r}, not {folder.name!r}: the folder was "
            "copied or renamed from another entry"
        )
    for name in names:
        rec = files.get(name)
        if not (
            isinstance(rec, dict)
            and isinstance(rec.get("sha256"), str)
            and isinstance(rec.get("stat"), list)
        ):
            raise Unsealed(f"{path} has no digest of {name}")
    return body


def check(folder: str | os.PathLike, names: list[str]) -> str | None:
    """What is wrong with the sealed entry ``folder`` (its files ``names``), naming the
    file, or ``None`` if every file is the one sealed (module docstring)."""
    folder = Path(folder)
    try:
        body = _read_seal(folder, names)
        refreshed = False
        for name in names:
            rec = body["files"][name]
            fd = _open(folder / name)
            try:
                sig = _signature(os.fstat(fd))
                if sig == rec["stat"]:
                    continue  # unchanged since it was hashed
                if sig[0] != rec["stat"][0] or _hash(fd) != rec["sha256"]:
                    raise Unsealed(
                        f"{folder / name}: its content is not what the cache wrote (the SHA-256 "
                        f"recorded in {DIGESTS} when the entry was built does not match: the file "
                        "was changed, replaced or damaged)"
                    )
                rec["stat"] = sig
                refreshed = True
            finally:
                os.close(fd)
    except Unsealed as e:
        return str(e)
    if refreshed:  # the same bytes in another file (a copied cache): cheap again next time
        with contextlib.suppress(OSError):
            text = json.dumps(body, indent=1, sort_keys=True) + "\n"
            cache.atomic_write_text(folder / DIGESTS, text)
    return None
