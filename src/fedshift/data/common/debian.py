"""Fetching files from a Debian package without installing it (``apt-get download`` +
``dpkg-deb --fsys-tarfile | tar -x``). Used by the offline benchmarks whose real data ships in
Debian packages (OpenCV's digits sheet in ``opencv-doc``, ``dataset-fashion-mnist``).

``apt-get update`` runs only when asked (``fedshift data fetch NAME --apt-update``): it
changes the system's package lists and needs root. A system without apt-get, dpkg-deb or tar
is told so before anything runs, with how to put the files in place by hand."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from fedshift.core.errors import MissingSourceError

#: what fetching needs from the system
TOOLS = ("apt-get", "dpkg-deb", "tar")


def run(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """Run a command, capturing its output (the seam tests replace)."""
    try:
        return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, check=False)
    except FileNotFoundError as exc:
        raise MissingSourceError(
            f"`{' '.join(cmd)}` failed: {cmd[0]} not found; fetching a Debian package needs "
            "a Debian/Ubuntu system (apt-get, dpkg-deb, tar)"
        ) from exc


def require_tools(package: str, manual: str) -> None:
    """Raise :class:`MissingSourceError` before anything runs when this system lacks
    apt-get, dpkg-deb or tar: what fetching needs, and ``manual``, how to put the files in
    place without them (another system, a copy from elsewhere)."""
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        raise MissingSourceError(
            f"fetching Debian's package {package} needs {', '.join(TOOLS)} (a Debian or "
            f"Ubuntu system); this system has no {', '.join(missing)}. Without them: {manual}"
        )


def apt_download(package: str, workdir: Path, update: bool = False) -> Path:
    """``apt-get download <package>`` into ``workdir`` (after ``apt-get update`` when
    ``update``: never unasked); returns the ``.deb``. Nothing is installed."""
    if update:
        result = run(["apt-get", "update"], workdir)
        if result.returncode != 0:
            tail = (result.stderr or result.stdout or "").strip()[-400:]
            raise MissingSourceError(
                f"`apt-get update` failed: {tail}. It needs root (`sudo apt-get update`) and "
                "the network"
            )
    result = run(["apt-get", "download", package], workdir)
    debs = sorted(Path(workdir).glob(f"{package}_*.deb"))
    if result.returncode != 0 or not debs:
        tail = (result.stderr or result.stdout or "").strip()[-400:]
        retry = (
            ""
            if update
            else ' If apt\'s package lists are empty or old ("Unable to locate package"), '
            "update them first: `sudo apt-get update`, or add --apt-update to the fetch "
            "command, which runs it."
        )
        raise MissingSourceError(
            f"`apt-get download {package}` failed: {tail}.{retry} Or install the package "
            f"instead (`sudo apt-get install {package}`)"
        )
    return debs[-1]


def extract_deb_members(deb: Path, members: list[str], workdir: Path) -> list[Path]:
    """Extract only ``members`` (paths as in ``dpkg-deb -c``, e.g. ``./usr/share/...``) of a
    ``.deb`` into ``workdir`` with ``dpkg-deb --fsys-tarfile | tar -x``; returns their paths."""
    try:
        dpkg = subprocess.Popen(["dpkg-deb", "--fsys-tarfile", str(deb)], stdout=subprocess.PIPE)
    except FileNotFoundError as exc:
        raise MissingSourceError(f"dpkg-deb not found; cannot unpack {deb}") from exc
    try:
        tar = subprocess.run(
            ["tar", "-x", *members],
            stdin=dpkg.stdout,
            cwd=workdir,
            capture_output=True,
            text=True,
            check=False,
        )
    finally:
        dpkg.stdout.close()
        dpkg.wait()
    paths = [Path(workdir) / m for m in members]
    missing = [m for m, p in zip(members, paths, strict=True) if not p.is_file()]
    if tar.returncode != 0 or missing:
        raise MissingSourceError(
            f"could not extract {', '.join(missing) or 'the files'} from {deb}: "
            f"{tar.stderr.strip()[-400:]}"
        )
    return paths
