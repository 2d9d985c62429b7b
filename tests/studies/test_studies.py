"""Studies: one file + one registration each, their command line generated from the
``Options`` dataclass (fedshift.studies, fedshift.cli.studies)."""

from __future__ import annotations

import dataclasses
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import pytest
from doc_commands import find_commands

from fedshift.cli import build_parser, main, parse
from fedshift.core.errors import ConfigError
from fedshift.studies import STUDIES, StudyResult, option, run_study
from fedshift.studies.base import out_option


@dataclass(frozen=True, kw_only=True)
class ToyOptions:
    """A toy study's options: every kind of field the generator reads."""

    runs: tuple[str, ...] = option(help="run folders", positional=True, nargs="+")
    rate: float = option(0.5, "a rate")
    mode: Literal["a", "b"] = option("a", "which mode")
    ks: tuple[int, ...] = option((1, 2), "sizes, comma-separated")
    dry: bool = option(False, "only plan")
    name: str = option(help="a required name")
    tag: tuple[str, ...] = option((), "a tag (repeatable)", append=True)
    out: str | None = out_option()


def toy_run(options: ToyOptions) -> StudyResult:
    """a toy study for the tests"""
    out = Path(options.out or "protocol-toy")
    out.mkdir(parents=True, exist_ok=True)
    md = out / "toy.md"
    md.write_text(f"{options}\n")
    return StudyResult("toy", out, {"md": md}, {"options": repr(options)}, f"toy {options.name}")


@pytest.fixture
def toy():
    STUDIES.add("toy", toy_run, ToyOptions)
    yield STUDIES.entry("toy")
    STUDIES.remove("toy")


def _subcommand(parser, *names):
    """The sub-parser ``names`` leads to."""
    for name in names:
        action = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
        parser = action.choices[name]
    return parser


def test_a_registered_study_gets_its_subcommand_and_flags(toy):
    """Registering a study in-process is all the command line needs: the subcommand, a flag
    per field with its type, choices, default and help."""
    p = _subcommand(build_parser(), "protocol", "toy")
    flags = {s for a in p._actions for s in a.option_strings}
    assert {"--rate", "--mode", "--ks", "--dry", "--name", "--tag", "--out"} <= flags
    text = p.format_help()
    assert "a toy study for the tests" in text and "a required name" in text
    assert "output folder (default: ./protocol-toy)" in text
    a = parse(["protocol", "toy", "A", "B", "--name", "n", "--ks", "3,4", "--mode", "b",
               "--dry", "--tag", "x", "--tag", "y", "--rate", "0.25"])  # fmt: skip
    assert (a.runs, a.name, a.ks, a.mode, a.dry, a.tag, a.rate, a.out) == (
        ["A", "B"], "n", (3, 4), "b", True, ["x", "y"], 0.25, "protocol-toy",
    )  # fmt: skip
    a = parse(["protocol", "toy", "A", "--name", "n"])
    assert (a.rate, a.mode, a.ks, a.dry, a.tag) == (0.5, "a", (1, 2), False, None)
    for bad in (
        ["protocol", "toy", "A"],  # --name is required (no default)
        ["protocol", "toy", "--name", "n"],  # runs: one or more
        ["protocol", "toy", "A", "--name", "n", "--mode", "c"],
        ["protocol", "toy", "A", "--name", "n", "--ks", "1,x"],
        ["protocol", "toy", "A", "--name", "n", "--rate", "fast"],
    ):
        with pytest.raises(SystemExit):
            parse(bad)


def test_the_generated_handler_builds_the_options_and_runs(toy, tmp_path, capsys):
    out = tmp_path / "toy"
    code = main(["protocol", "toy", "A", "--name", "n", "--tag", "x", "--out", str(out)])
    assert code == 0
    printed = capsys.readouterr().out
    assert printed == f"toy n\n\nmd: {out / 'toy.md'}\n"
    want = ToyOptions(runs=("A",), name="n", tag=("x",), out=str(out))
    assert (out / "toy.md").read_text() == f"{want}\n"
    main(["protocol", "toy", "A", "--name", "n", "--out", str(out)])
    assert (out / "toy.md").read_text() == f"{ToyOptions(runs=('A',), name='n', out=str(out))}\n"


def test_run_study_from_python(toy, tmp_path):
    res = run_study("toy", runs=("A",), name="n", out=str(tmp_path / "o"))
    assert res.out == tmp_path / "o" and res.files["md"].is_file() and res.text == "toy n"
    with pytest.raises(TypeError, match="nme"):
        run_study("toy", runs=("A",), nme="n")


def test_registration_is_checked(toy):
    with pytest.raises(ValueError, match="registered twice"):
        STUDIES.add("toy", toy_run, ToyOptions)

    @dataclass
    class Mutable:
        x: int = 1

    with pytest.raises(TypeError, match="frozen"):
        STUDIES.add("mutable", toy_run, Mutable)
    with pytest.raises(TypeError, match="immutable"):
        option([1, 2])
    with pytest.raises(ConfigError, match="did you mean 'loco'"):
        STUDIES.entry("lcoo")


@pytest.mark.parametrize("name", STUDIES.names())
def test_every_study_options_is_typed_with_help(name):
    """Each built-in study: a frozen keyword-only Options whose every field has help and a
    type the generator reads; its subcommand exists with a flag or argument per field."""
    study = STUDIES.entry(name)
    assert study.options.__dataclass_params__.frozen, name
    assert all(f.kw_only for f in dataclasses.fields(study.options)), name
    p = _subcommand(build_parser(), "protocol", name)
    dests = {a.dest: a for a in p._actions}
    for f in dataclasses.fields(study.options):
        assert f.name in dests, (name, f.name)
        assert dests[f.name].help, (name, f.name)
    assert study.run.__module__ == f"fedshift.studies.{name.replace('-', '_')}"


def test_the_architecture_example_is_a_working_study(tmp_path, capsys):
    """docs/ARCHITECTURE.md's "Where a new study goes" snippet, executed as written: its one
    registration puts `fedshift protocol finished` on the command line, and it runs."""
    (snippet,) = [f for f in find_commands() if f.text == "example: new-study"]
    assert "STUDIES.add(" in snippet.context
    module = types.ModuleType("doc_new_study")  # as the file it stands for is a module
    sys.modules[module.__name__] = module
    try:
        code = compile(snippet.context, "ARCHITECTURE.md:new-study", "exec", dont_inherit=True)
        exec(code, module.__dict__)
        p = _subcommand(build_parser(), "protocol", "finished")
        assert "--min-rounds" in p.format_help()
        runs = tmp_path / "runs"
        for name, rounds in (("a", 3), ("b", 6)):
            (runs / name).mkdir(parents=True)
            (runs / name / "summary.json").write_text(f'{{"rounds": {rounds}}}')
        out = tmp_path / "out"
        assert (
            main(["protocol", "finished", str(runs), "--min-rounds", "5", "--out", str(out)]) == 0
        )
        assert capsys.readouterr().out.startswith("1 finished runs\n")
        assert (out / "finished.md").is_file()
    finally:
        del sys.modules[module.__name__]
        if "finished" in STUDIES:
            STUDIES.remove("finished")


def test_the_generated_choices_are_the_protocols():
    """The parser's choices come from the Options' Literal types, written where the CLI can
    read them without torch: they must equal the protocols' own lists."""
    from fedshift.protocols import common
    from fedshift.protocols.new_site import SHOTS

    def action(study, dest):
        p = _subcommand(build_parser(), "protocol", study)
        return next(a for a in p._actions if a.dest == dest)

    assert tuple(action("cross-site", "pipeline").choices) == common.PIPELINES
    assert tuple(action("cross-site", "split").choices) == common.SPLITS
    assert tuple(action("tsne", "split").choices) == common.SPLITS
    assert tuple(action("cross-site", "kind").choices) == common.CROSS_SITE_KINDS
    assert action("new-site", "shots").default == SHOTS
