"""The configs shipped with fedshift, found by name: ``fedshift run -c demo``.

The package holds ``fedshift/configs/*.yaml`` (``demo``) and ``fedshift/configs/suites/*.yaml``
(the papers' suites, e.g. ``fedrdn_table1``); in a source checkout that folder is a link to the
repository's ``configs/``, in an installed wheel a copy of it. A ``-c`` value that names an
existing file is that file, always; a bare name (no folder, no ``.yaml``) that is not a file
is looked up here, and an unknown one is an error listing the shipped names.
"""

from __future__ import annotations

from pathlib import Path

from fedshift.core.errors import ConfigError

#: the shipped configs: ``<root>/*.yaml`` and ``<root>/suites/*.yaml``
CONFIG_ROOT = Path(__file__).resolve().parent.parent / "configs"
SUFFIXES = (".yaml", ".yml")

__all__ = ["CONFIG_ROOT", "config_file", "is_config_name", "packaged_configs", "shipped_hint"]


def packaged_configs() -> dict[str, Path]:
    """Shipped config name -> file, top-level configs first, then the suites (sorted)."""
    found: dict[str, Path] = {}
    for folder in (CONFIG_ROOT, CONFIG_ROOT / "suites"):
        if folder.is_dir():
            for path in sorted(folder.glob("*.yaml")):
                found.setdefault(path.stem, path)
    return found


def is_config_name(text: str) -> bool:
    """``text`` is a bare config name: no folder part and no YAML suffix."""
    path = Path(text)
    return bool(text) and path.name == text and path.suffix.lower() not in SUFFIXES


def config_file(path: str | Path) -> Path:
    """The file a ``-c`` value means: ``path`` itself if it exists or is not a bare name,
    else the shipped config of that name (raises :class:`ConfigError` listing them)."""
    p = Path(path)
    if p.exists() or not is_config_name(str(path)):
        return p
    shipped = packaged_configs()
    if str(path) in shipped:
        return shipped[str(path)]
    names = ", ".join(shipped) or "none (the package's configs folder is missing)"
    raise ConfigError(
        f"config {str(path)!r} is neither a file nor a config shipped with fedshift; give a "
        f"YAML file (-c path/to/config.yaml) or one of the shipped names: {names}"
    )


def shipped_hint(path: str | Path) -> str:
    """What a missing config file's error adds: where a relative path was looked for, and,
    when a shipped config has its name (``configs/demo.yaml`` typed from the repository's
    docs by a user whose fedshift is pip-installed, without that folder), ``-c <name>``."""
    p = Path(path)
    out = "" if p.is_absolute() else f" (looked for {p.absolute()})"
    shipped = packaged_configs().get(p.stem)
    if p.suffix.lower() in SUFFIXES and shipped is not None:
        use = f"`fedshift bench {p.stem}`" if shipped.parent.name == "suites" else f"`-c {p.stem}`"
        out += (
            f"; fedshift ships a config of that name: give the name, {use} (an installed "
            "fedshift has its configs by name, not the repository's configs/ folder)"
        )
    return out
