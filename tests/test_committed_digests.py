"""Every committed results folder is what its recorded command plans at HEAD.

``results/<folder>/source.json`` records the command(s) that made the folder; planning them
again here (``fedshift bench``'s :func:`~fedshift.bench.plan`, or the protocol's own grid:
loco / new-site hold each site out, sweep adds its key) must give exactly the committed
cells' folder names, which end with each cell's config digest. A key added to the config
schema without its "off" value in :data:`fedshift.core.identity.LATER_DEFAULTS` changes
the digests of the cells run before it: ``fedshift bench`` would then run every such cell
again instead of taking the committed one, and this test names the folder."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from fedshift.bench import plan
from fedshift.cli import parse
from fedshift.eval.cells import read_object

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results"
FOLDERS = sorted(
    p.name
    for p in RESULTS.iterdir()
    if p.is_dir() and p.name not in ("protocols", "benchmarks") and not p.name.startswith("_")
)


def _options(args):
    from fedshift.protocols import SuiteOptions

    return SuiteOptions(
        config=args.config, overrides=tuple(args.overrides or ()), threads=args.threads
    )


#: the one data-making step a recorded command may start with: its generated folder (under
#: the run's current folder) is made again where the planning runs
MAKE_SITES = "python benchmarks/make_sites.py"


def make_data(command: str, work: Path) -> None:
    """Run the recorded ``benchmarks/make_sites.py`` step into ``work`` (the folder the
    planning then runs in, with ``configs`` reached through a link), so that a suite whose
    ``dataset.root`` names generated data plans its sites as the recorded run did."""
    words = shlex.split(command)
    assert command.startswith(MAKE_SITES), command
    work.mkdir(exist_ok=True)
    if not (work / "configs").exists():
        (work / "configs").symlink_to(ROOT / "configs")
    subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "make_sites.py"), *words[2:]],
        cwd=work, check=True, capture_output=True,
    )
    os.chdir(work)


def planned_names(command: str, tmp: Path) -> set[str]:
    """The cell folder names one recorded command plans at HEAD (nothing runs)."""
    words = shlex.split(command)
    assert words[0] == "fedshift", command
    args = parse(words[1:])
    if args.command == "bench":
        cells = plan(args.suite, args.overrides, threads=args.threads)
        return {c.run_dir.name for c in cells}
    assert args.command == "protocol", command
    options = _options(args)
    if args.protocol in ("loco", "new-site"):
        from fedshift.protocols.loco import held_out_grid

        sites = [s.strip() for s in args.sites.split(",")] if getattr(args, "sites", None) else None
        _, _, grid = held_out_grid(options, args.protocol, args.protocol == "new-site", sites)
    elif args.protocol == "sweep":
        from fedshift.protocols.sweep import sweep_grid

        _, _, grid = sweep_grid(options, args.key, args.values)
    elif args.protocol in ("head-finetune", "privacy"):  # the config's own grid
        grid = options.load()
    else:
        raise AssertionError(f"{command}: no planner for protocol {args.protocol}")
    suite = tmp / f"{args.protocol}-suite.yaml"
    suite.write_text(yaml.safe_dump(grid, sort_keys=False))
    return {c.run_dir.name for c in plan(suite, None, threads=args.threads)}


@pytest.mark.parametrize("folder", FOLDERS)
def test_committed_cells_are_what_their_command_plans_at_head(folder, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)  # the commands name configs/... from the repository root
    source = read_object(RESULTS / folder / "source.json")
    assert source is not None, f"results/{folder}/source.json is missing or unreadable"
    planned: set[str] = set()
    for command in str(source["command"]).split("; "):  # a folder made by two commands
        if command.startswith(MAKE_SITES):  # its data first, made again in tmp_path
            make_data(command, tmp_path / "work")
            continue
        planned |= planned_names(command, tmp_path)
    committed = {p.name for p in (RESULTS / folder).iterdir() if (p / "cell.json").is_file()}
    stale = sorted(committed - planned)
    assert not stale, (
        f"results/{folder}: {len(stale)} of {len(committed)} committed cells are not what "
        f"`{source['command']}` plans at HEAD (e.g. {stale[0]}): a key added since without its "
        "'off' value in fedshift.core.identity.LATER_DEFAULTS, or a changed suite; "
        f"planned e.g. {sorted(planned - committed)[:1]}"
    )
    missing = sorted(planned - committed)
    assert not missing, f"results/{folder}: planned cells not committed: {missing[:3]}"
