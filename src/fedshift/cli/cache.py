"""``fedshift cache list|clean``: what the data cache holds, and freeing it.

The cache (``dataset.cache_dir``, else ``$FEDSHIFT_CACHE``, else ``~/.cache/fedshift``) holds
one folder per dataset family of derived data (decoded, resized images of ``folders`` /
``pacs`` / ...; the built Digits pools; the brain-MRI template's sites), each rebuilt on the
next load when removed, and ``sources/``: files ``fedshift data fetch`` took from Debian's
packages, which need the network again. ``clean`` removes the derived folders (all, or the
ones named) and keeps ``sources/`` unless ``--sources``. It deletes only real folders inside
the cache (never through a link, never outside it: :func:`fedshift.core.files.remove_tree`).
Cleaning while a run reads the cache makes that run fail: clean between runs.
"""

from __future__ import annotations

import argparse
import os
import stat
import time
from pathlib import Path

#: the cache folder of files fetched from packages (kept by ``clean`` unless ``--sources``)
SOURCES = "sources"


def _usage(folder: Path) -> tuple[int, int, float]:
    """(files, bytes, newest modification time) below ``folder``, links not followed."""
    files, size, newest = 0, 0, 0.0
    for where, _, names in os.walk(folder):
        for n in names:
            try:
                st = os.lstat(os.path.join(where, n))
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode):
                files += 1
                size += st.st_size
                newest = max(newest, st.st_mtime)
    return files, size, newest


def _entries(root: Path) -> list[Path]:
    return sorted(p for p in root.iterdir() if not p.name.startswith(".")) if root.is_dir() else []


def _mb(n: int) -> str:
    return f"{n / 2**20:,.1f} MB"


def _cmd_list(args: argparse.Namespace) -> int:
    from fedshift.data.common.cache import cache_dir

    root = cache_dir(args.cache_dir)
    entries = _entries(root)
    if not entries:
        print(f"the cache {root} is empty (or absent)")
        return 0
    print(f"cache: {root}")
    rows, total = [], 0
    for p in entries:
        if p.is_symlink() or not p.is_dir():
            kind = "a symbolic link" if p.is_symlink() else "a file"
            rows.append((p.name, "-", "-", "-", f"{kind}: not fedshift's, left alone"))
            continue
        files, size, newest = _usage(p)
        total += size
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(newest)) if newest else "-"
        what = "fetched package files (kept by clean)" if p.name == SOURCES else "derived: rebuilt"
        rows.append((p.name, str(files), _mb(size), when, what))
    widths = [max(len(r[i]) for r in [("folder", "files", "size", "last written", ""), *rows])
              for i in range(4)]  # fmt: skip
    head = ("folder", "files", "size", "last written", "")
    for r in [head, *rows]:
        print("  ".join(c.ljust(w) for c, w in zip(r[:4], widths, strict=True)) + "  " + r[4])
    print(f"total {_mb(total)}; `fedshift cache clean` frees the derived folders")
    return 0


def _cmd_clean(args: argparse.Namespace) -> int:
    from fedshift.core.errors import FedshiftError
    from fedshift.core.files import child_path, remove_tree
    from fedshift.data.common.cache import cache_dir

    root = cache_dir(args.cache_dir)
    if args.names:
        targets = [child_path(root, n, "cache folder") for n in args.names]
        missing = [t.name for t in targets if not t.exists() and not t.is_symlink()]
        if missing:
            have = ", ".join(p.name for p in _entries(root)) or "nothing"
            raise FedshiftError(
                f"no cache folder {', '.join(missing)} in {root} (it holds: {have}); "
                "`fedshift cache list` shows them"
            )
    else:
        targets = [p for p in _entries(root) if p.name != SOURCES or args.sources]
        targets = [p for p in targets if p.is_dir() and not p.is_symlink()]
    if SOURCES in {t.name for t in targets} and not args.sources:
        raise FedshiftError(
            f"{root / SOURCES} holds files fetched from packages (`fedshift data fetch`), which "
            "need the network again: add --sources to remove them too"
        )
    freed = 0
    for t in targets:
        size = _usage(t)[1] if t.is_dir() and not t.is_symlink() else 0
        if args.dry_run:
            print(f"would remove {t} ({_mb(size)})")
            continue
        remove_tree(t, root)  # a real folder inside the cache, never through a link
        freed += size
        print(f"removed {t} ({_mb(size)})")
    if not targets:
        print(f"nothing to clean in {root}")
    elif not args.dry_run:
        print(f"freed {_mb(freed)}; each dataset rebuilds its cache on its next load")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("cache", help="what the data cache holds (list), and freeing it (clean)")
    csub = p.add_subparsers(dest="cache_command", required=True)
    ls = csub.add_parser("list", help="the cache's folders: files, size, last written")
    ls.add_argument("--cache-dir", help="the cache (default: $FEDSHIFT_CACHE or ~/.cache/fedshift)")
    ls.set_defaults(fn=_cmd_list)
    cl = csub.add_parser(
        "clean", help="remove derived cache folders (all, or those named); rebuilt on next load"
    )
    cl.add_argument("names", nargs="*", help="cache folders to remove (default: every derived one)")
    cl.add_argument("--sources", action="store_true", help="also remove fetched package files")
    cl.add_argument("--dry-run", action="store_true", help="say what would go, remove nothing")
    cl.add_argument("--cache-dir", help="the cache (default: $FEDSHIFT_CACHE or ~/.cache/fedshift)")
    cl.set_defaults(fn=_cmd_clean)
