"""The ``fedshift`` command line.

fedshift run [-c CONFIG] [key=value ...] [--out DIR]     run a config (and its sweep grid)
fedshift run --resume RUN_DIR                            continue a killed run
fedshift bench SUITE.yaml [key=value ...] [--workers N]  a suite: cached cells, parallel runs
fedshift list                                            algorithms, datasets, models
fedshift data build|show|fetch ...                       offline benchmarks
fedshift flower simulate|certs|keys|app|submit ...       the same runs on Flower
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from fedshift.core.errors import FedshiftError


def _cmd_run(args: argparse.Namespace) -> int:
    from fedshift.catalog import resolve
    from fedshift.core.config import expand_sweep, load_config, lookup
    from fedshift.eval.tables import print_tables
    from fedshift.runtime.simulation import resume_experiment, run_experiment

    if args.resume:
        if args.config or args.overrides:
            raise FedshiftError("--resume takes the run's saved config; drop -c and key=value")
        result = resume_experiment(args.resume, progress=not args.quiet)
        print_tables([result.summary])
        print(f"\nrun directory: {result.run_dir}")
        return 0
    source = args.config or "defaults"
    raw = load_config(args.config, args.overrides)
    grid = raw.get("sweep") or {}
    raws = expand_sweep(raw, source)
    # validate every cell before running any, so a typo fails in a second, not an hour in
    cfgs = [resolve(r, source) for r in raws]
    summaries = []
    for i, (cfg, one) in enumerate(zip(cfgs, raws, strict=True), 1):
        if len(cfgs) > 1 and not args.quiet:
            print(f"[{i}/{len(cfgs)}] {cfg.algorithm['name']} seed={cfg.seed}", file=sys.stderr)
        result = run_experiment(cfg, out=args.out, progress=not args.quiet)
        labels = [f"{k}={lookup(one, k)}" for k in grid if k != "seed" and k != "algorithm.name"]
        result.summary["label"] = " ".join([cfg.algorithm["name"], *labels])
        summaries.append(result.summary)
    print_tables(summaries)
    print("\nrun directories:")
    for s in summaries:
        print(f"  {s['run_dir']}")
    return 0


def _cmd_bench(args: argparse.Namespace) -> int:
    from fedshift.bench import run_suite
    from fedshift.eval.tables import print_tables

    summaries = run_suite(
        args.suite,
        args.overrides,
        out=args.out,
        workers=args.workers,
        progress=not args.quiet,
        threads=args.threads,
    )
    if summaries:
        print_tables(summaries)
        print(f"\nsuite folder: {Path(summaries[0]['run_dir']).parent}")
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from fedshift.eval.report import build_report

    try:
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
    from fedshift.algorithms import ALGORITHMS
    from fedshift.augment import AUGMENTS
    from fedshift.data import DATASETS
    from fedshift.data.partition import PARTITIONS
    from fedshift.models import MODELS

    sections = (
        ("algorithms", ALGORITHMS),
        ("augments (augment: [...], composable with any algorithm)", AUGMENTS),
        ("datasets", DATASETS),
        ("partitions (partition: {name: ...}; label skew over the pooled dataset)", PARTITIONS),
        ("models", MODELS),
    )
    for title, reg in sections:
        print(f"{title}:")
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
            print(f"  {e.name:<12} {e.description}{keys}")
    return 0


def _dataset_params(name: str, overrides: list[str]):
    from fedshift.core.config import build_dataclass, parse_override
    from fedshift.data import DATASETS

    entry = DATASETS.entry(name)
    raw = dict(parse_override(o) for o in overrides)
    raw = {k.removeprefix("dataset."): v for k, v in raw.items()}
    return entry, build_dataclass(entry.params, raw, "dataset")


def _cmd_data(args: argparse.Namespace) -> int:
    from fedshift.data import digits, fashion

    if args.action == "fetch":
        cache = Path(args.cache) if args.cache else None
        if args.name == "opencv":
            print(f"opencv digits sheet: {digits.fetch_opencv(cache)}")
        elif args.name == "fashion-mnist":
            print(f"fashion-mnist files: {fashion.fetch_fashion(cache)}")
        else:
            raise FedshiftError(
                f"nothing to fetch for {args.name!r}; fetchable: fashion-mnist, opencv"
            )
        return 0
    if args.name == "fashion-mnist":
        if args.action == "build":
            raise FedshiftError(
                "fashion-mnist has nothing to build (splits are drawn at load time); "
                "get its files with 'fedshift data fetch fashion-mnist'"
            )
        _, params = _dataset_params(args.name, args.overrides)
        out = Path(args.out or "fashion_montage.png")
        print(json.dumps(fashion.show_fashion(params, out), indent=2))
        print(f"montage: {out}")
        return 0
    if args.name != "digits":
        return _show_other(args)
    entry, params = _dataset_params(args.name, args.overrides)
    if args.action == "build":
        path = digits.build_digits(params, progress=True, force=args.force)
        print(f"built digits pools in {path}")
        return 0
    out = Path(args.out or "digits_montage.png")
    counts = digits.show_digits(params, out)
    print(json.dumps(counts, indent=2))
    print(f"montage: {out}")
    return 0


def _show_other(args: argparse.Namespace) -> int:
    """``data show`` for any other dataset: load it (checking a user's folder layout) and print
    the per-client split counts and what the loader recorded; ``brain-mri`` also saves the
    scanner preview (the same slice under every site's scanner)."""
    from fedshift.data import load_dataset

    if args.action == "build":
        raise FedshiftError(
            f"'fedshift data build' is for digits; {args.name!r} is built (and cached) when "
            f"loaded: use 'fedshift data show {args.name}'"
        )
    entry, params = _dataset_params(args.name, args.overrides)
    section = {"name": args.name, **dataclasses.asdict(params)}
    fed = load_dataset(section)
    print(json.dumps({"task": fed.task, "classes": fed.classes, "counts": fed.counts()}, indent=2))
    if args.name == "brain-mri":
        from fedshift.data.brain_mri import scanner_preview

        out = Path(args.out or "brain_mri_scanners.png")
        scanner_preview(params, out)
        print(f"scanner preview: {out}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fedshift", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run an experiment config (and its sweep grid)")
    run.add_argument("-c", "--config", help="YAML config file")
    run.add_argument("overrides", nargs="*", help="key=value overrides, e.g. train.lr=0.05")
    run.add_argument("--out", help="root folder for run directories (config key 'out')")
    run.add_argument("--resume", metavar="RUN_DIR", help="continue a killed run")
    run.add_argument("--quiet", action="store_true", help="no progress bars")
    run.set_defaults(fn=_cmd_run)

    bench = sub.add_parser("bench", help="run a suite (grid of runs) with cached cells")
    bench.add_argument("suite", help="suite YAML (a run config with a sweep grid)")
    bench.add_argument("overrides", nargs="*", help="key=value overrides for every cell")
    bench.add_argument("--out", help="root folder for run directories (config key 'out')")
    bench.add_argument("--workers", type=int, help="parallel processes (default: cores // 2)")
    bench.add_argument(
        "--threads", type=int, help="torch threads per worker (default: cores // workers)"
    )
    bench.add_argument("--quiet", action="store_true", help="no progress bar")
    bench.set_defaults(fn=_cmd_bench)

    ls = sub.add_parser("list", help="list algorithms, datasets and models")
    ls.set_defaults(fn=_cmd_list)

    rep = sub.add_parser("report", help="Markdown + self-contained HTML + CSV report of runs")
    rep.add_argument("runs", nargs="+", help="run directories or folders holding them")
    rep.add_argument("--out", default="report", help="output folder (default: ./report)")
    rep.add_argument(
        "--reference", help="row the p-values are also taken against: ALGO or ALGO/FLOW"
    )
    rep.add_argument("--title", help="report title")
    rep.add_argument(
        "--screenshot", action="store_true", help="also render report.png in headless Chromium"
    )
    rep.set_defaults(fn=_cmd_report)

    from fedshift.protocols import add_parser as add_protocol_parser

    add_protocol_parser(sub)

    from fedshift.flower.cli import add_parser as add_flower_parser

    add_flower_parser(sub)

    data = sub.add_parser("data", help="build, inspect or fetch offline benchmark data")
    data.add_argument("action", choices=["build", "show", "fetch"])
    data.add_argument(
        "name",
        help="dataset ('show': any dataset, e.g. digits, brain-mri, prostate) or what to fetch "
        "(opencv, fashion-mnist)",
    )
    data.add_argument("overrides", nargs="*", help="dataset keys, e.g. train_size=500")
    data.add_argument("--force", action="store_true", help="rebuild even if cached")
    data.add_argument("--out", help="montage PNG path for 'show'")
    data.add_argument("--cache", help="cache folder for 'fetch' (default: $FEDSHIFT_CACHE)")
    data.set_defaults(fn=_cmd_data)
    return p


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse a command line; ``key=value`` words may also follow the options."""
    parser = build_parser()
    # argparse stops filling a subcommand's positional ``overrides`` at the first option, so
    # ``bench SUITE --quiet key=value`` would be refused; key=value words after options are
    # overrides too (anything else is still an error).
    args, extra = parser.parse_known_args(argv)
    if extra:
        if not hasattr(args, "overrides") or any(w.startswith("-") for w in extra):
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        args.overrides = [*(args.overrides or []), *extra]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    try:
        return args.fn(args)
    except FedshiftError as e:
        print(f"fedshift: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("fedshift: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
