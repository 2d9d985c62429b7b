"""What a config can say: every section's keys for ``fedshift list`` (default, valid values,
one-line help from the dataclasses' comments and docstrings), and ``fedshift config show
[-c FILE] [key=value ...]``, the resolved config a run would use, as YAML.

A key's help is the comment on its line, else the comment block above it, else its entry in
the class docstring (``` ``key``: what it does ```), else its range's reason; always whole
sentences (the first one), never cut. Imports only the standard library at module level (the
parser is built at every ``fedshift`` start; ``tests/cli/test_cli_speed.py``).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import io
import json
import re
import textwrap
import tokenize
import types
import typing
from typing import Any

from fedshift.cli.options import add_config_args, add_show_parser
from fedshift.cli.plugins import add_allow_plugins

__all__ = ["add_parser", "field_help", "first_sentence", "key_lines", "one_line"]


def first_sentence(text: str) -> str:
    """The first sentence of ``text`` (whitespace joined, reST roles dropped, double
    backquotes made single): up to the first ``.``, ``!`` or ``?`` outside brackets that
    ends the text or is followed by a space and a capital letter, a digit, a quote or a
    backquote; ``e.g. X``, ``summary.json`` and ``Eq. 1`` do not end it."""
    text = " ".join(text.split())
    text = re.sub(r":\w+:`(~?)([^`]*)`", lambda m: m[2].split(".")[-1] if m[1] else m[2], text)
    text = text.replace("``", "`")
    depth = 0
    for i, ch in enumerate(text):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth = max(0, depth - 1)
        elif ch in ".!?" and depth == 0:
            rest = text[i + 1 :]
            words = text[:i].split()
            if words and words[-1].lower() in _ABBREVIATIONS:
                continue
            if not rest or (
                rest[0] == " " and (rest[1:2].isupper() or rest[1:2] in '`"0123456789')
            ):
                return text[: i + 1]
    return text


#: words whose period ends no sentence (``e.g. FedBN``, ``Fig. 2``)
_ABBREVIATIONS = {"e.g", "i.e", "vs", "cf", "eq", "fig", "al", "tab", "sec"}


def _comments(cls: type) -> dict[str, str]:
    """Each field's comment: on its own line(s), else the block right above it."""
    try:
        src = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):  # no source (a frozen build): no comments
        return {}
    lines = src.splitlines()
    found: dict[int, tuple[int, str]] = {}
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type == tokenize.COMMENT:
            found[tok.start[0]] = (tok.start[1], tok.string.lstrip("#").strip())

    def code_before(line: int) -> bool:
        return bool(lines[line - 1][: found[line][0]].strip())

    out = {}
    for node in ast.parse(src).body[0].body:  # type: ignore[attr-defined]
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        span = range(node.lineno, (node.end_lineno or node.lineno) + 1)
        trailing = [found[n][1] for n in span if n in found and code_before(n)]
        above, n = [], node.lineno - 1
        while n in found and not code_before(n):
            above.insert(0, found[n][1])
            n -= 1
        text = " ".join(trailing) or " ".join(above)
        if text:
            out[node.target.id] = text
    return out


def class_doc(cls: type) -> str:
    """The docstring a class was written with (not the signature ``@dataclass`` makes up
    for a class without one)."""
    doc = inspect.cleandoc(cls.__doc__ or "")
    return "" if doc.startswith(f"{cls.__name__}(") else doc


def _docstring_keys(cls: type, names: list[str]) -> dict[str, str]:
    """``` ``key``: text``` entries of the class docstring, for the field names given."""
    doc = " ".join(class_doc(cls).split())
    if not names:
        return {}
    alt = "|".join(re.escape(n) for n in names)
    pattern = rf"``({alt})``: (.+?)(?=\s``(?:{alt})``: |\s*$)"
    return {m.group(1): m.group(2) for m in re.finditer(pattern, doc)}


def field_help(cls: type) -> dict[str, str]:
    """One line of help per field of the dataclass ``cls`` (module docstring); fields with
    none are left out."""
    fields = dataclasses.fields(cls)
    comments = _comments(cls)
    documented = _docstring_keys(cls, [f.name for f in fields])
    out = {}
    for f in fields:
        bounds = f.metadata.get("bounds")
        text = comments.get(f.name) or documented.get(f.name) or getattr(bounds, "why", "")
        if text:
            out[f.name] = first_sentence(text)
    return out


def _literals(tp: Any) -> list[Any]:
    """The values of a ``Literal`` type, or of the ``Literal`` in a union
    (``int | Literal["auto"]``); none for anything else."""
    if typing.get_origin(tp) is typing.Literal:
        return list(typing.get_args(tp))
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return [v for arg in typing.get_args(tp) for v in _literals(arg)]
    return []


def _shown(value: Any) -> str:
    """A default as it would be written in YAML or on the command line."""
    if isinstance(value, str):
        return value or '""'
    return json.dumps(value)


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def key_lines(cls: type, prefix: str, skip: tuple[str, ...] = ()) -> list[str]:
    """``prefix.key = default  help [valid values]`` for each field of the dataclass ``cls``."""
    helps = field_help(cls)
    try:
        hints = typing.get_type_hints(cls)
    except Exception:  # noqa: BLE001 - an annotation that does not evaluate: no choices
        hints = {}
    rows = []
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        valid = []
        bounds = f.metadata.get("bounds")
        if bounds is not None:
            valid.append(bounds.describe())
        choices = " | ".join(map(_shown, _literals(hints.get(f.name))))
        if choices:
            valid.append(f"or {choices}" if valid else choices)
        key = f"{prefix}{f.name} = {_shown(_default(f))}"
        extra = f"[{' '.join(valid)}]" if valid else ""
        rows.append((key, " ".join(x for x in (helps.get(f.name, ""), extra) if x)))
    width = max((len(k) for k, _ in rows), default=0)
    return [f"{k:<{width}}  {h}".rstrip() for k, h in rows]


def one_line(entry: Any) -> str:
    """A registry entry's description, as its first whole sentence when it comes from its
    docstring (whose first line may end mid-sentence)."""
    doc = inspect.getdoc(entry.obj) or ""
    if doc and doc.split("\n")[0].strip() == entry.description:
        return first_sentence(doc.split("\n\n")[0])
    return entry.description


def config_sections() -> list[str]:
    """``fedshift list``'s part on config keys: the top-level keys, then every section's."""
    from fedshift.core.config import RunConfig
    from fedshift.core.config_tree import COMPONENT_SECTIONS

    sections = [
        f
        for f in dataclasses.fields(RunConfig)
        if f.default_factory is not dataclasses.MISSING
        and dataclasses.is_dataclass(f.default_factory)
    ]
    skip = (*COMPONENT_SECTIONS, *(f.name for f in sections))
    out = ["config keys (in the YAML file, or key=value on the command line):", "  top level:"]
    out += [f"    {line}" for line in key_lines(RunConfig, "", skip)]
    for f in sections:
        cls = f.default_factory
        doc = first_sentence(class_doc(cls).split("\n\n")[0])  # type: ignore[arg-type]
        out.append(f"  {f.name}:" + (f" {doc}" if doc else ""))
        out += [f"    {line}" for line in key_lines(cls, f"{f.name}.")]  # type: ignore[arg-type]
    return out


def _cmd_show(args: argparse.Namespace) -> int:
    """``config show``: the resolved config. It only reads, so a ``module:Class`` plug-in
    that the config file names (not the command line) is not imported unless
    ``--allow-plugins``: its section is printed as written, with a comment saying so."""
    import yaml

    from fedshift.catalog import shown
    from fedshift.cli.plugins import CLI_HOW
    from fedshift.core.config import load_config
    from fedshift.core.config_tree import expand_sweep
    from fedshift.core.consent import held_back, listing, plugin_names

    source = args.config or "defaults"
    given = {name for _, name in plugin_names(load_config(None, args.overrides))}
    raws = expand_sweep(load_config(args.config, args.overrides), source)
    held = held_back(raws, given)
    docs = [shown(r, source, held) for r in raws]
    if held:
        print(
            f"# not imported: {listing(held)}. 'fedshift config show' only reads, so it runs "
            "no plug-in code a config file names: shown as written, its keys unchecked; "
            f"to import and check it, run again with {CLI_HOW}"
        )
    for i, doc in enumerate(docs, 1):
        if len(docs) > 1:
            print(f"{'---' + chr(10) if i > 1 else ''}# run {i}/{len(docs)} of the sweep")
        print(yaml.safe_dump(doc, sort_keys=False), end="")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """``fedshift config show``."""
    show = add_show_parser(
        sub,
        "config",
        "show the resolved config a run would use",
        "print the resolved config as YAML (component defaults filled in; one document "
        "per run of a sweep)",
    )
    add_config_args(show, "key=value overrides, e.g. train.lr=0.05")
    add_allow_plugins(
        show,
        "import the plug-ins (module:Class names) the config file names, to check their "
        "keys (default: shown as written; a plug-in name runs its module's code)",
    )
    show.set_defaults(fn=_cmd_show)
