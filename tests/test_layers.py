"""The package layers: ``core`` imports nothing above it, and no import cycle between packages.

Imports are read from the source (every ``import`` statement, module-level or inside a
function, except those under ``if TYPE_CHECKING:``), so a function-local import that only
hides a cycle fails here just like a module-level one.
"""

from __future__ import annotations

import ast
import functools
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import fedshift

SRC = Path(fedshift.__file__).parent

#: each top-level package (or module) of fedshift and its layer: a package may import only
#: packages of a lower layer (or its own). ``fedshift`` itself is the root ``__init__``.
LAYERS = {
    "fedshift": 0,
    "core": 0,
    "data": 1,
    "models": 1,
    "algorithms": 2,
    "augment": 3,
    "catalog": 4,
    "eval": 5,
    "attacks": 5,
    "shift": 5,
    "claims": 6,
    "runtime": 6,
    "flower": 7,
    "bench": 8,
    "protocols": 9,
    "studies": 9,
    "api": 9,
    "testing": 9,
    "cli": 10,
    "__main__": 11,
}

#: the root ``__init__`` re-exports the Python API (``fedshift.run``, ``fedshift.load_run``)
#: through a PEP 562 ``__getattr__``: imported on first use, never by ``import fedshift``
LAZY_EXPORTS = {("fedshift", "api")}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def _is_module(name: str) -> bool:
    return (SRC / name).is_dir() or (SRC / f"{name}.py").is_file()


def _import_nodes(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement of ``tree``, module level or inside a function or class, except
    those under ``if TYPE_CHECKING:`` (which never run)."""
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for n in ast.walk(node))
    return [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom) and id(node) not in skip
    ]


def _parse(path: Path) -> ast.Module:
    """``path`` parsed, once per process for its content (the checks below read every module
    of the source, each parse of it ~1.2 CPU s; the trees are only read)."""
    st = path.stat()
    return _parsed(str(path), st.st_mtime_ns, st.st_size)


@functools.cache
def _parsed(path: str, mtime_ns: int, size: int) -> ast.Module:
    return ast.parse(Path(path).read_text())


def _imports(path: Path) -> list[tuple[str, int]]:
    """(imported fedshift module, line) of every import in ``path`` outside TYPE_CHECKING."""
    out = []
    for node in _import_nodes(_parse(path)):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "fedshift":  # from fedshift import x: x is a package, or a
                # name of the root __init__ (__version__)
                out += [
                    (f"fedshift.{a.name}" if _is_module(a.name) else "fedshift", node.lineno)
                    for a in node.names
                ]
            elif node.module.startswith("fedshift."):
                out.append((node.module, node.lineno))
        elif isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names if a.name.startswith("fedshift")]
    return out


def _edges() -> dict[tuple[str, str], list[str]]:
    edges: dict[tuple[str, str], list[str]] = defaultdict(list)
    for path in sorted(SRC.rglob("*.py")):
        src = _package(_module_name(path))
        for target, line in _imports(path):
            dst = _package(target)
            if src != dst and (src, dst) not in LAZY_EXPORTS:
                edges[(src, dst)].append(f"{path.relative_to(SRC.parent)}:{line}")
    return edges


def test_every_package_has_a_layer():
    packages = {_package(_module_name(p)) for p in SRC.rglob("*.py")}
    missing = sorted(packages - set(LAYERS))
    assert not missing, f"add {missing} to LAYERS here and to docs/ARCHITECTURE.md"


def test_packages_import_only_lower_layers():
    wrong = [
        f"{a} (layer {LAYERS[a]}) imports {b} (layer {LAYERS[b]}) at {', '.join(where)}"
        for (a, b), where in sorted(_edges().items())
        if LAYERS.get(b, 99) > LAYERS.get(a, -1)
    ]
    assert not wrong, "imports against the layer order:\n" + "\n".join(wrong)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected sets of more than one node of ``graph`` (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def strongconnect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                strongconnect(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            strongconnect(v)
    return cycles


def test_no_import_cycle_between_packages():
    """No strongly connected set of more than one package."""
    edges = _edges()
    graph: dict[str, set[str]] = defaultdict(set)
    for a, b in edges:
        graph[a].add(b)
    cycles = _cycles(graph)
    text = "; ".join(
        ", ".join(f"{a} -> {b} ({edges[(a, b)][0]})" for a in c for b in c if (a, b) in edges)
        for c in cycles
    )
    assert not cycles, f"import cycles between packages: {text}"


def _module_graph(root: Path = SRC) -> dict[str, set[str]]:
    """Imports between the modules of the package at ``root``: every import statement outside
    ``if TYPE_CHECKING:``, a function's own included (a function-local import that closes a
    cycle only moves the cycle to the first call), without a package's ``__init__`` importing
    its own submodules (the registries' idiom: a package's ``__init__`` imports its
    components' modules and adds them to its registry)."""

    def name_of(path: Path) -> str:
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)

    paths = sorted(root.rglob("*.py"))
    modules = {name_of(p) for p in paths}
    graph: dict[str, set[str]] = defaultdict(set)
    for path in paths:
        name = name_of(path)
        init = path.name == "__init__.py"
        for node in _import_nodes(_parse(path)):
            if isinstance(node, ast.ImportFrom):
                if node.level or not node.module:
                    continue
                targets = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            else:
                targets = [a.name for a in node.names]
            for t in targets:
                if t in modules and t != name and not (init and t.startswith(name + ".")):
                    graph[name].add(t)
    return graph


def test_no_import_cycle_between_modules():
    """No two modules import each other, directly or through others, at module level or in a
    function (a cycle makes the import order matter: a half-initialised module's names are
    missing; hidden in a function it is still a cycle, only later)."""
    cycles = _cycles(_module_graph())
    assert not cycles, "module import cycles: " + "; ".join(" <-> ".join(c) for c in cycles)


def test_the_module_cycle_check_catches_a_cycle(tmp_path):
    pkg = tmp_path / "fedshift" / "runtime"
    pkg.mkdir(parents=True)
    (pkg / "a.py").write_text("from fedshift.runtime.b import x\n")
    (pkg / "b.py").write_text("x = 1\n")
    assert not _cycles(_module_graph(tmp_path / "fedshift"))
    (pkg / "b.py").write_text("def f():\n    from fedshift.runtime import a\n")
    assert _cycles(_module_graph(tmp_path / "fedshift"))  # hidden in a function: still one
    (pkg / "b.py").write_text("from fedshift.runtime import a\n")
    assert _cycles(_module_graph(tmp_path / "fedshift"))
    typing_only = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
    (pkg / "b.py").write_text(typing_only + "    from fedshift.runtime import a\n")
    assert not _cycles(_module_graph(tmp_path / "fedshift"))  # types only: never runs


def test_core_sources_import_only_core():
    bad = [
        f"{path.relative_to(SRC.parent)}:{line} imports {target}"
        for path in sorted((SRC / "core").rglob("*.py"))
        for target, line in _imports(path)
        if not target.startswith("fedshift.core")
    ]
    assert not bad, "fedshift.core must import nothing above it:\n" + "\n".join(bad)


def test_importing_core_loads_nothing_above_it():
    """Import every module of core in a fresh interpreter; none of the upper packages may
    appear in ``sys.modules`` (a check at run time, beside the source walk above)."""
    modules = sorted(_module_name(p) for p in (SRC / "core").rglob("*.py"))
    code = (
        "import importlib, sys\n"
        f"for m in {modules!r}: importlib.import_module(m)\n"
        "above = [p for p in ('algorithms', 'augment', 'runtime', 'flower', 'eval', 'data',"
        " 'models', 'catalog', 'cli', 'protocols', 'bench', 'attacks', 'shift', 'claims')]\n"
        "print(sorted(m for m in sys.modules if m.split('.')[1:2] and m.split('.')[1] in above"
        " and m.startswith('fedshift.')))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert out == "[]", f"importing fedshift.core loaded {out}"


def test_the_layer_check_catches_a_violation(tmp_path):
    """The walker sees a function-local import (the kind that used to hide cycles)."""
    f = tmp_path / "m.py"
    f.write_text("def f():\n    from fedshift.runtime.loop import RoundLoop\n")
    assert _imports(f) == [("fedshift.runtime.loop", 2)]
    g = tmp_path / "n.py"
    g.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import fedshift.cli\n")
    assert _imports(g) == []


# ---------------------------------------------------------------------------- module size
#: modules past MAX_LINES, each with the reason it is one module (a new one fails the test
#: below until it is split or given its reason here)
MAX_LINES = 500
LONG_MODULES = {
    "data/digits/sources.py": "the five digit domains' recipes from five package sources, "
    "each a short reader; one file keeps the benchmark's construction readable in one place",
    "data/domains/fedbn_pickles.py": "FedBN's three pickled layouts (Digits-5, Office-Caltech-10, "
    "DomainNet) share one reader; the layouts are documented where they are read",
    "core/config.py": "the config schema: every fixed section's dataclass and its checks, "
    "the one place a key's meaning is defined",
    "data/medical/prostate.py": "the six sites' NIfTI layouts and the per-site label and "
    "orientation fixes of the SAML release, documented next to the code that applies them",
    "data/domains/distrans_folders.py": "CH-MNIST and CUB-200 as DisTrans uses them, with their "
    "split rules documented beside the readers",
    "shift/measure.py": "the four shift axes of `fedshift data check` and their one score "
    "(HarmoFL Eq. 2, DisTrans Eq. 3-4), read against each other",
    "augment/ffa.py": "FedFA's FFA layer (Eq. 5-9) and the augment that exchanges its "
    "statistics: one method, readable top to bottom against the paper",
    "data/domains/arrays.py": "the arrays loader's checks (layout, channels, labels, splits) "
    "for files and for Python arrays, one set of rules for both",
}


def test_no_module_over_500_lines_without_a_reason():
    sizes = {
        p.relative_to(SRC).as_posix(): len(p.read_text().splitlines())
        for p in sorted(SRC.rglob("*.py"))
    }
    long = {m: n for m, n in sizes.items() if n > MAX_LINES}
    unexplained = sorted(set(long) - set(LONG_MODULES))
    assert not unexplained, (
        f"modules over {MAX_LINES} lines without a reason in LONG_MODULES: "
        + ", ".join(f"{m} ({long[m]})" for m in unexplained)
        + "; split them, or say why each is one module"
    )
    stale = sorted(m for m in LONG_MODULES if sizes.get(m, 0) <= MAX_LINES)
    assert not stale, f"LONG_MODULES lists modules no longer over {MAX_LINES} lines: {stale}"


# ------------------------------------------------------------------ function and class size
#: functions past MAX_FUNCTION_LINES (``module:qualified name``), each with its reason
MAX_FUNCTION_LINES = 80
LONG_FUNCTIONS = {
    "cli/run.py:add_parsers": "the options of `fedshift run` and `bench` in the order "
    "`--help` lists them: a flat declaration, one call per option",
    "cli/flower.py:add_parser": "the options of `fedshift flower simulate|deploy|node` in the "
    "order `--help` lists them: a flat declaration, one call per option",
}
#: classes with more than MAX_METHODS methods of their own, each with its reason
MAX_METHODS = 20
LARGE_CLASSES = {
    "algorithms/base.py:Algorithm": "the one-class algorithm contract that both halves "
    "(algorithms/halves.py) subclass, with its declared state and defaults: a method "
    "overrides a few hooks of it (docs/ARCHITECTURE.md, 'The algorithm contract')",
    "augment/compose.py:Composition": "the one object the loop sees for an algorithm with its "
    "augments: it forwards every Algorithm hook to each part, one short method per hook",
    "augment/base.py:Augment": "the augment contract (its declared state, its hooks into "
    "training, evaluation and the exchange): an augment overrides a few of them",
    "core/images.py:ByteImages": "a uint8 image array that behaves as a float tensor where "
    "the runtime reads one (indexing, shapes, device moves): the tensor protocol it needs",
}


def _definitions(kind: type) -> dict[str, ast.AST]:
    """Every function (``kind`` = ast.FunctionDef) or class in src/fedshift, by
    ``module:qualified name``."""
    found: dict[str, ast.AST] = {}

    def visit(node: ast.AST, module: str, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = f"{prefix}{child.name}"
                if isinstance(child, kind):
                    found[f"{module}:{name}"] = child
                visit(child, module, f"{name}.")
            else:
                visit(child, module, prefix)

    for p in sorted(SRC.rglob("*.py")):
        visit(_parse(p), p.relative_to(SRC).as_posix(), "")
    return found


def _check_listed(sizes: dict[str, int], limit: int, listed: dict[str, str], what: str) -> None:
    """Every entry of ``sizes`` over ``limit`` has its reason in ``listed`` (named ``what``),
    and ``listed`` names none that is not over it any more."""
    over = {k: n for k, n in sizes.items() if n > limit}
    unexplained = sorted(set(over) - set(listed))
    assert not unexplained, f"{what} without a reason: " + ", ".join(
        f"{k} ({over[k]})" for k in unexplained
    )
    stale = sorted(set(listed) - set(over))
    assert not stale, f"listed as {what} but no longer: {stale}"


def test_no_function_over_80_lines_without_a_reason():
    """Each function a reader can hold at once; the few flat declarations past the limit
    say why in LONG_FUNCTIONS."""
    defs = _definitions(ast.FunctionDef) | _definitions(ast.AsyncFunctionDef)
    sizes = {k: n.end_lineno - n.lineno + 1 for k, n in defs.items()}
    _check_listed(
        sizes, MAX_FUNCTION_LINES, LONG_FUNCTIONS, "LONG_FUNCTIONS: functions over 80 lines"
    )


def test_no_class_over_20_methods_without_a_reason():
    methods = {
        k: sum(isinstance(b, ast.FunctionDef | ast.AsyncFunctionDef) for b in node.body)
        for k, node in _definitions(ast.ClassDef).items()
    }
    _check_listed(methods, MAX_METHODS, LARGE_CLASSES, "LARGE_CLASSES: classes over 20 methods")


def test_the_size_checks_see_nested_functions(tmp_path, monkeypatch):
    body = "\n".join(f"        x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    (tmp_path / "m.py").write_text(f"class C:\n    def f(self):\n{body}\n")
    monkeypatch.setattr(sys.modules[__name__], "SRC", tmp_path)
    defs = _definitions(ast.FunctionDef)
    assert list(defs) == ["m.py:C.f"]
    node = defs["m.py:C.f"]
    assert node.end_lineno - node.lineno + 1 == MAX_FUNCTION_LINES + 1


def test_no_function_over_80_lines_in_protocols():
    """The protocols are read as recipes: each step a function a reader can hold at once."""
    long = []
    for p in sorted((SRC / "protocols").rglob("*.py")):
        for node in ast.walk(_parse(p)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = node.end_lineno - node.lineno + 1
                if n > 80:
                    long.append(f"{p.relative_to(SRC)}:{node.lineno} {node.name} ({n} lines)")
    assert not long, "functions over 80 lines in protocols/: " + ", ".join(long)
