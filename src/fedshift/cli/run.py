"""``fedshift run``, ``bench``, ``list`` and ``report``: running configs and suites, listing
the components, reporting finished runs. Handlers import the engine when they run."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable
from pathlib import Path

from fedshift.cli import keys
from fedshift.cli.options import add_config_args
from fedshift.cli.plugins import CLI_HOW, add_allow_plugins
from fedshift.core.errors import FedshiftError


def _cmd_run(args: argparse.Namespace) -> int:
    from fedshift.catalog import resolve
    from fedshift.cli.sweeps import claim_dirs, run_sweep
    from fedshift.core.config import load_config
    from fedshift.core.config_tree import expand_sweep, lookup
    from fedshift.core.logs import console
    from fedshift.eval.tables import print_tables
    from fedshift.runtime.simulation import resume_experiment

    console()  # the run's messages on the terminal: its directory, warnings
    if args.resume:
        given = [f for f in ("--new", "--overwrite", "--jobs") if getattr(args, f[2:]) is not None]
        if given:
            raise FedshiftError(
                f"--resume continues the run in its own directory; drop {' and '.join(given)}"
            )
        rounds = _resume_rounds(args)
        if args.threads is not None:
            raise FedshiftError(
                "--resume keeps the run's run.threads (another thread count changes the last "
                "bits of every later round, so the run would equal no uninterrupted run); "
                "drop --threads"
            )
        result = resume_experiment(
            args.resume, progress=not args.quiet, rounds=rounds, workers=args.workers
        )
        print_tables([result.summary])
        print(f"\nrun directory: {result.run_dir}")
        return 0
    source = args.config or "defaults"
    flags = [f"run.{k}={v}" for k in ("workers", "threads") if (v := getattr(args, k)) is not None]
    raw = load_config(args.config, [*args.overrides, *flags])
    announce_out(args.config, args.overrides, args.out)
    grid = raw.get("sweep") or {}
    raws = expand_sweep(raw, source)
    # validate every cell before running any, so a typo fails in a second, not an hour in
    cfgs = [resolve(r, source) for r in raws]
    grid_keys = [k for k in grid if k not in ("seed", "algorithm.name")]
    labels = [
        " ".join([cfg.algorithm.name, *(f"{k}={lookup(one, k)}" for k in grid_keys)])
        for cfg, one in zip(cfgs, raws, strict=True)
    ]
    exists = "overwrite" if args.overwrite else "new" if args.new else "error"
    dirs = claim_dirs(cfgs, args.out, exists)
    jobs = 1 if args.jobs is None else args.jobs
    summaries = run_sweep(cfgs, labels, dirs, bool(args.overwrite), jobs, not args.quiet)
    print_tables(summaries)
    print("\nrun directories:")
    for s in summaries:
        print(f"  {s['run_dir']}")
    return 0


def announce_out(config: str | None, overrides: list[str], out_flag: str | None) -> None:
    """An ``out:`` key inside a config file sends the runs somewhere other than ``./runs``
    without a word on the command line: say where, before anything runs (not when --out or
    an ``out=`` override chose it here)."""
    if out_flag or not config:
        return
    from fedshift.core.config import load_yaml
    from fedshift.core.presets import config_file

    out = load_yaml(config_file(config)).get("out")
    if out is None or any(o.split("=", 1)[0].strip() == "out" for o in overrides):
        return
    where = Path(str(out)).expanduser().resolve()
    print(
        f"fedshift: run directories go under {where} (key 'out' in {config}; --out DIR "
        "chooses another)",
        file=sys.stderr,
        flush=True,
    )


def count_or(word: str, minimum: int) -> Callable[[str], int | str]:
    """An argparse ``type``: a whole number of at least ``minimum``, or ``word`` itself."""

    def parse(text: str) -> int | str:
        if text == word:
            return text
        try:
            n = int(text)
        except ValueError:
            n = minimum - 1
        if n < minimum:
            raise argparse.ArgumentTypeError(
                f"expected a whole number >= {minimum} or {word!r}, got {text!r}"
            )
        return n

    return parse


#: ``--workers``: a whole number of at least 1, or ``auto``
_workers = count_or("auto", 1)


def _resume_rounds(args: argparse.Namespace) -> int | None:
    """``--resume RUN`` keeps the run's saved config; the one override it takes is
    ``train.rounds=N``, which extends the run (finished or not) to N rounds."""
    from fedshift.core.config_tree import parse_override

    if args.config:
        raise FedshiftError("--resume takes the run's saved config (its config.yaml); drop -c")
    rounds = None
    for item in args.overrides:
        key, value = parse_override(item)
        if key != "train.rounds" or not isinstance(value, int) or isinstance(value, bool):
            raise FedshiftError(
                f"--resume keeps the run's config; the only override it takes is "
                f"train.rounds=N (to extend the run), got {item!r}"
            )
        rounds = value
    return rounds


def _cmd_bench(args: argparse.Namespace) -> int:
    from fedshift.bench import run_suite
    from fedshift.core.config import load_config
    from fedshift.core.consent import plugin_names, untrusted
    from fedshift.eval.tables import print_tables

    # a suite may come from anyone: its plug-in names need --allow-plugins, the ones given
    # here as key=value do not (fedshift.core.consent)
    announce_out(args.suite, args.overrides, args.out)
    given = {name for _, name in plugin_names(load_config(None, args.overrides))}
    with untrusted(f"suite {args.suite}", [load_config(args.suite, args.overrides)], given):
        summaries = run_suite(
            args.suite,
            args.overrides,
            out=args.out,
            workers=args.workers,
            progress=not args.quiet,
            threads=args.threads,
            oversubscribe=args.oversubscribe,
            reuse=not args.fresh,
            results=args.results,
        )
    if summaries:
        print_tables(summaries)
        print(f"\nsuite folder: {Path(summaries[0]['run_dir']).parent}")
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from fedshift.core.consent import READ_ONLY, untrusted
    from fedshift.core.logs import showing_console
    from fedshift.eval.report import build_report

    # reading run directories from anywhere: a module:Class they name is not imported
    # (without --allow-plugins) but shown as a name, its keys all listed
    why = READ_ONLY.format(command="'fedshift report'")
    try:
        with untrusted("a run's config", how=CLI_HOW, reason=why), showing_console():
            files = build_report(args.runs, args.out, args.reference, args.title)
    except ValueError as e:  # an unknown reference row
        raise FedshiftError(str(e)) from None
    for key in ("md", "html", "csv"):
        print(f"{key}: {files[key]}")
    if args.screenshot:
        from fedshift.eval.report import screenshot

        print(f"screenshot: {screenshot(files['html'], Path(args.out) / 'report.png')}")
    return 0


def _cmd_list(args: argparse.Namespace) -> int:
    # the registries through the catalog: importing it lets them load installed plug-ins
    # (in a fresh process nothing else has imported it yet when `fedshift list` runs)
    from fedshift.catalog import ALGORITHMS, AUGMENTS, DATASETS, MODELS, PARTITIONS
    from fedshift.cli.keys import config_sections, one_line

    sections = (
        ("algorithms", ALGORITHMS),
        ("augments (augment: [...], composable with any algorithm)", AUGMENTS),
        ("datasets", DATASETS),
        ("partitions (partition: {name: ...}; label skew over the pooled dataset)", PARTITIONS),
        ("models", MODELS),
    )
    for title, reg in sections:
        print(f"{title}:")
        # installed plug-ins (entry points) first loaded, so they list with their keys; one
        # that fails to load is listed with the reason instead of stopping the listing
        broken = {}
        for name, values in reg.plugin_names().items():
            try:
                reg.entry(name)
            except FedshiftError as e:
                broken[name] = f"plug-in {' / '.join(values)}: {e}"
        for e in reg.entries():
            keys = ""
            if e.params is not None and dataclasses.is_dataclass(e.params):
                fields = []
                for f in dataclasses.fields(e.params):
                    if f.default is not dataclasses.MISSING:
                        fields.append(f"{f.name}={f.default!r}")
                    elif f.default_factory is not dataclasses.MISSING:  # lists, dicts
                        fields.append(f"{f.name}={f.default_factory()!r}")
                keys = f"  [{', '.join(fields)}]" if fields else ""
            module = getattr(e.obj, "__module__", "") or ""
            origin = "" if module.startswith("fedshift.") else f" (plug-in: {module})"
            print(f"  {e.name:<12} {one_line(e)}{origin}{keys}")
        for name, why in broken.items():
            print(f"  {name:<12} (cannot load) {why}")
    print()
    print("\n".join(config_sections()))
    return 0


def add_exists_options(p: argparse.ArgumentParser) -> None:
    """``--overwrite`` / ``--new``: what a command that claims a run directory does when the
    config's directory exists (``fedshift run``, ``fedshift flower simulate``)."""
    taken = p.add_mutually_exclusive_group()
    taken.add_argument(
        "--overwrite",
        action="store_const",
        const=True,
        help="a run directory of this config exists: delete it and run again (default: stop "
        "and name it, with the choices)",
    )
    taken.add_argument(
        "--new",
        action="store_const",
        const=True,
        help="a run directory of this config exists: run into a new one next to it (-2, -3...)",
    )


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """Add ``run``, ``bench``, ``list`` and ``report`` to the main parser's subcommands."""
    run = sub.add_parser("run", help="run an experiment config (and its sweep grid)")
    add_config_args(
        run,
        "key=value overrides, e.g. train.lr=0.05 (one on a key the config sweeps replaces "
        "that key's sweep)",
        "YAML config file, or a shipped config's name (demo)",
    )
    run.add_argument("--out", help="root folder for run directories (config key 'out')")
    run.add_argument(
        "--resume",
        metavar="RUN_DIR",
        help="continue a stopped run from its checkpoint; with train.rounds=N, extend a run "
        "(finished or not) to N rounds",
    )
    run.add_argument(
        "--workers",
        type=_workers,
        metavar="N|auto",
        help="processes running the clients (config key run.workers, default 1; auto: one per "
        "core); results do not depend on it. With --resume: for the rest of the run",
    )
    run.add_argument(
        "--threads",
        type=int,
        metavar="N",
        help="torch threads of every process (config key run.threads, default 1); another "
        "count changes the last bits of results",
    )
    run.add_argument(
        "--jobs",
        type=_workers,
        metavar="N|auto",
        help="runs of a sweep at a time, each in its own process (default 1; auto: as many as "
        "the cores hold); results do not depend on it",
    )
    add_exists_options(run)
    add_allow_plugins(run)
    run.add_argument("--quiet", action="store_true", help="no progress bars")
    run.set_defaults(fn=_cmd_run)

    bench = sub.add_parser("bench", help="run a suite (grid of runs) with cached cells")
    bench.add_argument(
        "suite", help="suite YAML (a run config with a sweep grid), or a shipped suite's name"
    )
    bench.add_argument(
        "overrides",
        nargs="*",
        help="key=value overrides for every cell (one on a swept key replaces its sweep)",
    )
    bench.add_argument("--out", help="root folder for run directories (config key 'out')")
    bench.add_argument(
        "--workers",
        type=int,
        help="parallel processes (default: cores // 2); results do not depend on it",
    )
    bench.add_argument(
        "--threads",
        type=int,
        help="torch threads per cell: its run.threads (default: the cell's own, 1 unless set; "
        "another count changes the last bits of results, so it is part of each cell's digest)",
    )
    bench.add_argument(
        "--oversubscribe",
        action="store_true",
        help="run --workers as given even when workers x each cell's run.workers x "
        "run.threads exceeds the cores",
    )
    bench.add_argument(
        "--fresh",
        action="store_true",
        help="run every cell here, even one whose result is committed in results/ (with the "
        "same digest; by default such a cell's numbers are taken, without its model)",
    )
    bench.add_argument(
        "--results",
        metavar="DIR",
        help="committed results to take finished cells from (default: $FEDSHIFT_RESULTS, "
        "else ./results when it exists)",
    )
    add_allow_plugins(bench)
    bench.add_argument("--quiet", action="store_true", help="no progress bar")
    bench.set_defaults(fn=_cmd_bench)

    ls = sub.add_parser(
        "list", help="list algorithms, datasets, models and every config key with its default"
    )
    ls.set_defaults(fn=_cmd_list)
    keys.add_parser(sub)  # fedshift config show

    rep = sub.add_parser("report", help="Markdown + self-contained HTML + CSV report of runs")
    rep.add_argument("runs", nargs="+", help="run directories or folders holding them")
    rep.add_argument("--out", default="report", help="output folder (default: ./report)")
    rep.add_argument(
        "--reference", help="row the p-values are also taken against: ALGO or ALGO/FLOW"
    )
    rep.add_argument("--title", help="report title")
    add_allow_plugins(
        rep,
        "import the plug-ins (module:Class names) the runs name, to tell their keys' "
        "defaults (default: not imported, every key shown; a plug-in name runs its code)",
    )
    rep.add_argument(
        "--screenshot", action="store_true", help="also render report.png in headless Chromium"
    )
    rep.set_defaults(fn=_cmd_report)
