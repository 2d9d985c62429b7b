"""The command line stays fast: building the parser (``fedshift --help``, a mistyped command)
loads none of the heavy libraries; every handler imports them when it runs. Deterministic
checks of ``sys.modules`` in a fresh interpreter, not timings."""

from __future__ import annotations

import ast
import subprocess
import sys

HEAVY = ("torch", "matplotlib", "flwr", "numpy")


def _loaded_after(code: str) -> list[str]:
    """The heavy top-level modules in ``sys.modules`` after running ``code`` in a fresh
    interpreter."""
    probe = f"{code}\nprint(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r}))"
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout
    return ast.literal_eval(out.strip().splitlines()[-1])


def test_building_the_parser_imports_no_heavy_library():
    assert _loaded_after("import fedshift.cli, sys; fedshift.cli.build_parser()") == []


def test_help_imports_no_heavy_library():
    """``--help`` of the top level and of every command group (argparse exits after it)."""
    helps = ([], ["protocol"], ["protocol", "tsne"], ["flower"], ["data"], ["run"], ["export"],
             ["privacy"], ["privacy", "show"])  # fmt: skip
    for argv in (*helps, ["docs"]):
        code = (
            "import sys, contextlib, io\n"
            "from fedshift.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
            f"    main({[*argv, '--help']!r})"
        )
        assert _loaded_after(code) == [], argv


def test_python_m_fedshift_cli_help():
    out = subprocess.run(
        [sys.executable, "-m", "fedshift.cli", "--help"], capture_output=True, text=True
    )
    assert out.returncode == 0
    commands = (
        "{run,bench,list,config,report,protocol,flower,data,cache,claims,export,predict,docs,"
        "privacy}"
    )
    assert commands in out.stdout


def test_protocol_choices_match_the_protocols():
    """The CLI writes the protocols' choice lists out (importing them would load torch):
    they must stay equal."""
    from fedshift.cli import protocol as cli_protocol
    from fedshift.protocols import common
    from fedshift.protocols.new_site import SHOTS

    assert cli_protocol.PIPELINES == common.PIPELINES
    assert cli_protocol.SPLITS == common.SPLITS
    assert cli_protocol.CROSS_SITE_KINDS == common.CROSS_SITE_KINDS
    assert cli_protocol.NEW_SITE_SHOTS == SHOTS
