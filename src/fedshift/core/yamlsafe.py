"""Reading config YAML defensively, and printing config values briefly.

* :func:`load_text`: YAML through :class:`StrictLoader`, a ``SafeLoader`` that refuses a key
  written twice in one mapping (PyYAML keeps the last one, so a second ``train:`` section
  would silently replace the first), naming the key and both lines;
* :func:`plain_tree`: the loaded value checked and copied: at most :data:`MAX_NODES` values
  once every alias is expanded, at most :data:`MAX_DEPTH` levels of nesting, no cycles. YAML
  aliases (``*name``) share one object, so a "billion laughs" file of nested aliases loads in
  a millisecond as a small graph but is astronomically large as the tree that merging,
  deep copies, ``dataclasses.asdict`` and printing walk. The size is counted on the graph
  (each shared node once), so the check itself is linear in the file; the copy then gives
  every alias its own containers, so setting a key in one place never changes another;
* :func:`short_repr`: a bounded ``repr`` for error messages (never the whole of a big value).
"""

from __future__ import annotations

import reprlib
from typing import Any

import yaml

from fedshift.core.errors import ConfigError

__all__ = [
    "MAX_DEPTH",
    "MAX_NODES",
    "DuplicateKeyError",
    "StrictLoader",
    "load_text",
    "plain_tree",
    "short_repr",
]

#: values (scalars, lists and mappings, aliases expanded) a config may hold; the suites in
#: configs/ hold a few hundred
MAX_NODES = 100_000
#: levels of nesting a config may have (the deepest real one has about five)
MAX_DEPTH = 64

_MERGE_TAG = "tag:yaml.org,2002:merge"

_repr = reprlib.Repr()
_repr.maxlevel = 3
_repr.maxlist = _repr.maxtuple = _repr.maxset = _repr.maxdict = 6
_repr.maxstring = _repr.maxother = 80
_repr.maxlong = 40


def short_repr(value: Any) -> str:
    """``repr(value)`` cut to a few elements per level, three levels deep and 80 characters
    per string: safe to put in a message whatever the value's size."""
    return _repr.repr(value)


class DuplicateKeyError(yaml.YAMLError):
    """A key appears twice in one YAML mapping."""

    def __init__(self, key: Any, line: int, first_line: int) -> None:
        super().__init__(f"duplicate key {short_repr(key)} at line {line} (first at {first_line})")
        self.key, self.line, self.first_line = key, line, first_line


class StrictLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that raises :class:`DuplicateKeyError` for a key written twice in
    one mapping (keys brought in by a ``<<:`` merge may still be overridden)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        if isinstance(node, yaml.MappingNode):
            first: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == _MERGE_TAG:
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    hash(key)
                except TypeError:
                    continue  # SafeLoader's own error ("found unhashable key") follows
                line = key_node.start_mark.line + 1
                if key in first:
                    raise DuplicateKeyError(key, line, first[key])
                first[key] = line
        return super().construct_mapping(node, deep=deep)


def load_text(text: str) -> Any:
    """Parse YAML ``text`` with :class:`StrictLoader`. Raises :class:`DuplicateKeyError`,
    ``yaml.YAMLError``, or :class:`ConfigError` for nesting too deep for the parser."""
    try:
        return yaml.load(text, Loader=StrictLoader)  # noqa: S506 (a SafeLoader subclass)
    except RecursionError:
        raise ConfigError(
            f"nested more than the YAML parser can follow (a config has at most {MAX_DEPTH} levels)"
        ) from None


def plain_tree(data: Any, source: str) -> Any:
    """``data`` (as loaded from YAML) copied into fresh, unshared dicts and lists, after
    checking its expanded size (:data:`MAX_NODES`), depth (:data:`MAX_DEPTH`) and that no
    alias contains itself. Raises :class:`ConfigError` naming ``source``."""
    sizes: dict[int, int] = {}
    active: set[int] = set()

    def size(x: Any, depth: int) -> int:
        if not isinstance(x, dict | list):
            return 1
        if depth >= MAX_DEPTH:
            raise ConfigError(
                f"{source}: nested more than {MAX_DEPTH} levels deep; a config's sections "
                "are a few levels of mappings and lists"
            )
        i = id(x)
        if i in sizes:
            return sizes[i]
        if i in active:
            raise ConfigError(
                f"{source}: a YAML alias (*name) refers to a mapping or list that contains "
                "it, which has no end; copy the values instead"
            )
        active.add(i)
        n = 1
        for child in x.values() if isinstance(x, dict) else x:
            n += size(child, depth + 1)
            if n > MAX_NODES:
                break
        active.discard(i)
        sizes[i] = n
        return n

    if size(data, 0) > MAX_NODES:
        raise ConfigError(
            f"{source}: the config holds more than {MAX_NODES:,} values once its YAML aliases "
            "(*name) are expanded (nested aliases multiply: a 'billion laughs' file); a config "
            "has a few hundred, so remove the repeated aliases"
        )
    return _copy(data)


def _copy(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _copy(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_copy(v) for v in x]
    return x
