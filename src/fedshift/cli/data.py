"""``fedshift data build|show|fetch``: build, inspect or fetch offline benchmark data."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from fedshift.core.errors import FedshiftError


def _dataset_params(name: str, overrides: list[str]):
    from fedshift.core.config import build_dataclass, parse_override
    from fedshift.data import DATASETS

    entry = DATASETS.entry(name)
    raw = dict(parse_override(o) for o in overrides)
    raw = {k.removeprefix("dataset."): v for k, v in raw.items()}
    return entry, build_dataclass(entry.params, raw, "dataset")


def _cmd_data(args: argparse.Namespace) -> int:
    from fedshift.data import digits
    from fedshift.data.domains import fashion

    if args.action == "fetch":
        cache = Path(args.cache) if args.cache else None
        if args.name == "opencv":
            print(f"opencv digits sheet: {digits.fetch_opencv(cache, args.apt_update)}")
        elif args.name == "fashion-mnist":
            print(f"fashion-mnist files: {fashion.fetch_fashion(cache, args.apt_update)}")
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
    shown = {"task": fed.task, "classes": fed.classes, "counts": fed.counts()}
    if "skipped_files" in fed.info:  # what a user's folder held that is not data
        shown["skipped_files"] = fed.info["skipped_files"]
    print(json.dumps(shown, indent=2))
    if args.name == "brain-mri":
        from fedshift.data.medical.brain_mri import scanner_preview

        out = Path(args.out or "brain_mri_scanners.png")
        scanner_preview(params, out)
        print(f"scanner preview: {out}")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``data`` to the main parser's subcommands."""
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
    data.add_argument(
        "--apt-update",
        action="store_true",
        help="'fetch': run `apt-get update` (root) before `apt-get download`; never done "
        "unasked. 'fetch' needs apt-get, dpkg-deb and tar (Debian/Ubuntu)",
    )
    data.set_defaults(fn=_cmd_data)
