"""``fedshift data build|show|fetch|check``: build, inspect or fetch offline benchmark data,
and check a federation's data (its sites' shift report)."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from fedshift.cli.plugins import add_allow_plugins
from fedshift.cli.run import count_or
from fedshift.core.errors import ConfigError, FedshiftError


def _dataset_params(name: str, overrides: list[str]):
    from fedshift.core.config import build_dataclass
    from fedshift.core.config_tree import parse_override
    from fedshift.data import DATASETS

    entry = DATASETS.entry(name)
    raw = dict(parse_override(o) for o in overrides)
    raw = {k.removeprefix("dataset."): v for k, v in raw.items()}
    return entry, build_dataclass(entry.params, raw, "dataset")


def _cmd_data(args: argparse.Namespace) -> int:
    if args.action == "check":
        return _check(args)
    if args.config is not None or args.name is None:
        raise FedshiftError(
            f"'fedshift data {args.action}' takes a dataset name (e.g. digits) and no -c; "
            "'fedshift data check' is the one that reads a config"
        )
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
    out = Path(args.out or f"{args.name}_montage.png")
    print(f"montage: {dataset_montage(fed, out)}")
    return 0


#: images per site in the montage of ``data show``
MONTAGE_PER_SITE = 8


def dataset_montage(fed, out: Path, per_site: int = MONTAGE_PER_SITE) -> Path:
    """``data show``'s montage of a loaded federation: one row per client, ``per_site``
    images spread evenly over its training split (its test split where it trains on
    nothing, e.g. a held-out client)."""
    from fedshift.shift.figures import site_montage

    rows = []
    for client in fed.clients:
        split = next((client.split(s) for s in ("train", "val", "test") if len(client.split(s))),
                     client.train)  # fmt: skip
        n = len(split)
        picks = sorted({round(i * (n - 1) / max(1, per_site - 1)) for i in range(min(n, per_site))})
        rows.append((client.name, [split.x[i] for i in picks]))
    return site_montage(rows, f"{fed.name}: images per client", out)


#: config sections (and keys) that change what ``data check`` measures; a sweep over one of
#: them is refused (``seed`` is not: the check uses the config's own seed)
SWEPT_DATA = ("dataset", "partition", "model", "input", "federation.data_fraction")


def _check_inputs(args: argparse.Namespace) -> tuple[str | None, list[str], str]:
    """The config and overrides ``data check`` was given: its first word is a ``key=value``
    override, a dataset name (``dataset.name=<it>``) or a config (a YAML file or a shipped
    config's name); ``-c`` names a config too. Returns them and what to call the source."""
    overrides = list(args.overrides)
    config = args.config
    word = args.name
    if word is not None:
        from fedshift.data import DATASETS

        if "=" in word:
            overrides.insert(0, word)
        elif word in DATASETS:
            overrides.insert(0, f"dataset.name={word}")
        elif config is not None:
            raise FedshiftError(
                f"'fedshift data check {word}': {word!r} is not a dataset, and -c already "
                f"names the config ({config}); give one config, then key=value overrides"
            )
        else:
            config = word
    return config, overrides, config or "defaults"


def _max_per_site(text: str) -> int | None:
    """``--max-per-site``: a whole number >= 1, or 0 / ``all`` for every image (None)."""
    n = count_or("all", 0)(text)
    return None if n in ("all", 0) else int(n)


def _bare_dataset_keys(raw: dict, overrides: list[str]) -> None:
    """A bare ``train_size=500`` (as ``data show`` takes it) is a :class:`ConfigError` that
    names the config key ``data check`` wants: ``dataset.train_size=500``."""
    import dataclasses

    from fedshift.core.config import RunConfig
    from fedshift.core.config_tree import parse_override
    from fedshift.data import DATASETS

    top = {f.name for f in dataclasses.fields(RunConfig)}
    section = raw.get("dataset")
    name = section.get("name") if isinstance(section, dict) else None
    if not isinstance(name, str) or name not in DATASETS:
        return
    params = DATASETS.entry(name).params
    keys = {f.name for f in dataclasses.fields(params)} if params is not None else set()
    for item in overrides:
        key, _ = parse_override(item)
        if "." not in key and key not in top and key in keys:
            raise ConfigError(
                f"config key '{key}': 'data check' takes config keys as 'fedshift run' does, "
                f"and this is a key of dataset {name!r}: write dataset.{item}"
            )


def _check(args: argparse.Namespace) -> int:
    """``data check``: load the config's dataset (its loader's checks first), measure how the
    sites differ and write the report (:mod:`fedshift.shift.report`)."""
    from fedshift.cli.plugins import CLI_HOW
    from fedshift.core.config import load_config
    from fedshift.core.consent import READ_ONLY, plugin_names, untrusted

    config, overrides, source = _check_inputs(args)
    if args.model_weights:
        overrides.append(f"model.weights={args.model_weights}")
    raw = load_config(config, overrides)
    # it only reads: a plug-in the config file names is imported with --allow-plugins only
    # (one typed on the command line is imported as asked)
    given = {name for _, name in plugin_names(load_config(None, overrides))}
    why = READ_ONLY.format(command="'fedshift data check'") + " (one typed here is imported)"
    with untrusted(f"config {source}", [raw], given, how=CLI_HOW, reason=why):
        return _check_config(args, raw, overrides, source)


def _check_config(args: argparse.Namespace, raw: dict, overrides: list[str], source: str) -> int:
    from fedshift.catalog import resolve
    from fedshift.shift.report import check

    _bare_dataset_keys(raw, overrides)
    cfg = resolve(raw, source)
    varied = [k for k in raw.get("sweep") or {} if k.split(".")[0] in SWEPT_DATA or k in SWEPT_DATA]
    if varied:
        raise ConfigError(
            f"{source}: config key 'sweep.{varied[0]}': the sweep varies what 'data check' "
            f"measures ({', '.join(varied)}), and it measures one federation: give one "
            f"value, e.g. {varied[0]}=VALUE"
        )
    out = Path(args.out or Path("data-check") / cfg.dataset.name)
    _, data, text = check(
        cfg,
        out,
        model_given="model" in raw,
        split=args.split,
        max_per_site=args.max_per_site,
    )
    print(text)
    files = ", ".join(p.name for p in sorted(out.glob("*")) if p.suffix in (".md", ".json", ".png"))
    print(f"report folder: {out} ({files})")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``data`` to the main parser's subcommands."""
    data = sub.add_parser(
        "data",
        help="build, inspect or fetch offline benchmark data; check a federation's shift",
        description="'check': validate a config's data and measure how its sites differ "
        "(intensity, amplitude spectrum, feature statistics, label mix): report.md, "
        "shift.json, montage.png and one PNG per axis in --out, and which methods address "
        "the dominant shift. E.g. fedshift data check digits; fedshift data check -c my.yaml "
        "dataset.size=64",
    )
    data.add_argument("action", choices=["build", "show", "fetch", "check"])
    data.add_argument(
        "name",
        nargs="?",
        help="dataset ('show': any dataset, e.g. digits, brain-mri, prostate) or what to fetch "
        "(opencv, fashion-mnist); 'check': a dataset, a config (YAML file or shipped name) or "
        "a first key=value",
    )
    data.add_argument(
        "overrides",
        nargs="*",
        help="dataset keys, e.g. train_size=500 ('check': config keys as 'fedshift run' "
        "takes them, e.g. dataset.train_size=500 model.name=lenet5)",
    )
    data.add_argument("-c", "--config", help="'check': the config whose data to check")
    data.add_argument("--force", action="store_true", help="rebuild even if cached")
    data.add_argument(
        "--out",
        help="montage PNG path for 'show'; report folder for 'check' (default: "
        "data-check/<dataset>)",
    )
    data.add_argument(
        "--split",
        default="train",
        choices=["train", "val", "test", "all"],
        help="'check': the split whose images are measured (default: train)",
    )
    data.add_argument(
        "--max-per-site",
        type=_max_per_site,
        default=2000,
        metavar="N",
        help="'check': measure a seeded sample of at most N images per site (default 2000; "
        "0 or 'all': every image)",
    )
    data.add_argument(
        "--model-weights",
        metavar="PATH",
        help="'check': the features axis uses this state dict (model.weights=PATH) instead "
        "of the model's seeded random initialisation",
    )
    add_allow_plugins(
        data,
        "'check': import the plug-ins (module:Class names) the config file names "
        "(default: refused, it only reads; a plug-in name runs its module's code)",
    )
    data.add_argument("--cache", help="cache folder for 'fetch' (default: $FEDSHIFT_CACHE)")
    data.add_argument(
        "--apt-update",
        action="store_true",
        help="'fetch': run `apt-get update` (root) before `apt-get download`; never done "
        "unasked. 'fetch' needs apt-get, dpkg-deb and tar (Debian/Ubuntu)",
    )
    data.set_defaults(fn=_cmd_data)
