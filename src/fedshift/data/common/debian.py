"""Fetching files from a Debian package without installing it (``apt-get download`` +
``dpkg-deb --fsys-tarfile | tar -x``). Used by the offline benchmarks whose real data ships in
Debian packages (OpenCV's digits sheet in ``opencv-doc``, ``dataset-fashion-mnist``)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from fedshift.core.errors import MissingSourceError


def run(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """Run a command, capturing its output (the seam tests replace)."""
    try:
        return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, check=False)
    except FileNotFoundError as exc:
        raise MissingSourceError(
            f"`{' '.join(cmd)}` failed: {cmd[0]} not found; fetching a Debian package needs "
            "a Debian/Ubuntu system (apt-get, dpkg-deb, tar)"
        ) from exc


def apt_download(package: str, workdir: Path) -> Path:
    """``apt-get download <package>`` into ``workdir`` (one ``apt-get update`` and a retry
    if it fails); returns the ``.deb``. Nothing is installed."""
    cmd = ["apt-get", "download", package]
    result = run(cmd, workdir)
    if result.returncode != 0:
        run(["apt-get", "update"], workdir)
        result = run(cmd, workdir)
    debs = sorted(Path(workdir).glob(f"{package}_*.deb"))
    if result.returncode != 0 or not debs:
        tail = (result.stderr or result.stdout or "").strip()[-400:]
        raise MissingSourceError(
            f"`apt-get download {package}` failed (also after `apt-get update`): {tail}. "
            f"Install the package instead (`sudo apt-get install {package}`)"
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
