"""``fedshift protocol cross-site|loco|new-site|sweep|rounds|head-finetune|tsne``: the argument
parsers and handlers of the evaluation protocols in :mod:`fedshift.protocols`.

Building the parser imports nothing of the protocols (they load torch and matplotlib); each
handler imports its protocol when it runs. The choice lists below are therefore written out
here; ``tests/cli/test_cli_speed.py`` checks they equal the protocols' own.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fedshift.protocols.common import ProtocolResult, SuiteOptions

#: ``--pipeline`` of cross-site (:data:`fedshift.protocols.common.PIPELINES`)
PIPELINES = ("data", "model")
#: ``--split`` of cross-site and tsne (:data:`fedshift.protocols.common.SPLITS`)
SPLITS = ("train", "val", "test")
#: ``--kind`` of cross-site (:data:`fedshift.protocols.common.CROSS_SITE_KINDS`)
CROSS_SITE_KINDS = ("personal", "global", "local")
#: default ``--shots`` of new-site (:data:`fedshift.protocols.new_site.SHOTS`)
NEW_SITE_SHOTS = (1, 5, 10)


def _print(res: ProtocolResult) -> int:
    print(res.text)
    print()
    for k, p in res.files.items():
        print(f"{k}: {p}")
    return 0


def _cmd_cross_site(args: argparse.Namespace) -> int:
    from fedshift.protocols import cross_site

    return _print(
        cross_site(
            args.run_dir,
            args.pipeline,
            args.split,
            args.kind,
            args.out,
            not args.quiet,
            args.weights,
        )
    )


def _suite_options(args: argparse.Namespace) -> SuiteOptions:
    """The options every protocol that runs a config's grid shares."""
    from fedshift.protocols import SuiteOptions

    return SuiteOptions(
        config=args.config,
        overrides=tuple(args.overrides or ()),
        workers=args.workers,
        threads=args.threads,
        out=args.out,
        runs_out=args.runs,
        progress=not args.quiet,
        fresh=args.fresh,
    )


def _cmd_loco(args: argparse.Namespace) -> int:
    from fedshift.protocols import loco

    return _print(loco(_suite_options(args)))


def _shots(text: str) -> tuple[int, ...]:
    """``--shots 1,5,10`` -> (1, 5, 10)."""
    try:
        return tuple(int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--shots {text!r}: comma-separated whole numbers, e.g. 1,5,10"
        ) from None


def _cmd_new_site(args: argparse.Namespace) -> int:
    from fedshift.core.logs import console
    from fedshift.protocols import new_site

    console()  # its progress lines between the suite's cells and the tables
    sites = tuple(x.strip() for x in args.sites.split(",")) if args.sites else None
    return _print(new_site(_suite_options(args), args.shots, args.epochs, args.weights, sites))


def _cmd_head_finetune(args: argparse.Namespace) -> int:
    from fedshift.core.logs import console
    from fedshift.protocols import head_finetune

    console()  # its progress lines between the suite's cells and the table
    return _print(head_finetune(_suite_options(args), args.epochs, args.weights))


def _cmd_sweep(args: argparse.Namespace) -> int:
    from fedshift.protocols import sweep

    return _print(sweep(_suite_options(args), args.key, args.values))


def _cmd_rounds(args: argparse.Namespace) -> int:
    from fedshift.protocols import rounds_to_threshold

    return _print(
        rounds_to_threshold(
            args.runs, args.thresholds, args.split, args.by, args.out, not args.quiet
        )
    )


def _cmd_tsne(args: argparse.Namespace) -> int:
    from fedshift.protocols import tsne

    labels = [x.strip() for x in args.labels.split(",")] if args.labels else None
    return _print(
        tsne(
            args.runs,
            args.per_client,
            args.out,
            args.perplexity,
            args.seed,
            args.split,
            labels,
            not args.quiet,
            args.weights,
        )
    )


def _ints(text: str) -> list[int]:
    try:
        return [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        msg = f"expected comma-separated whole numbers, got {text!r}"
        raise argparse.ArgumentTypeError(msg) from None


def _cmd_privacy(args: argparse.Namespace) -> int:
    from fedshift.protocols.privacy import privacy

    options = None if args.run else _suite_options(args)
    if args.run and (args.config or args.overrides):
        raise SystemExit("fedshift protocol privacy: give -c CONFIG or --run DIR, not both")
    res = privacy(options, args.run, args.sizes, args.trials, args.out, args.weights)
    return _print(res)


def _weights_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--weights",
        choices=("selected", "last"),
        default="selected",
        help="which state of each run: the round model selection picked on validation "
        "(selected.pt; default) or the last round",
    )


def _suite_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("-c", "--config", help="YAML run config (may have its own sweep grid)")
    p.add_argument("overrides", nargs="*", help="key=value overrides, e.g. train.rounds=100")
    p.add_argument("--workers", type=int, help="parallel processes (default: cores // 2)")
    p.add_argument("--threads", type=int, help="torch threads per worker")
    p.add_argument("--runs", help="root folder for the cells' run directories (config 'out')")
    p.add_argument(
        "--fresh",
        action="store_true",
        help="run every cell here, even one whose result is committed in results/ (by "
        "default such a cell's numbers are taken, as `fedshift bench` does)",
    )


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``fedshift protocol {cross-site,loco,new-site,sweep,rounds,head-finetune,tsne}`` to the
    ``sub``-commands of the main parser; each sets ``fn`` to a handler returning the exit code."""
    from fedshift.cli.plugins import add_allow_plugins

    p = sub.add_parser(
        "protocol",
        help="the papers' evaluation protocols "
        "(cross-site, loco, new-site, sweep, rounds, head-finetune, privacy, tsne)",
    )
    ps = p.add_subparsers(dest="protocol", required=True)

    def common(q: argparse.ArgumentParser, name: str) -> None:
        q.add_argument(
            "--out", default=f"protocol-{name}", help=f"output folder (default: ./protocol-{name})"
        )
        q.add_argument("--quiet", action="store_true", help="no progress bars")

    cs = ps.add_parser("cross-site", help="client i's model on client j's data (FedRDN Tab. 3)")
    cs.add_argument("run_dir", help="a finished run directory")
    cs.add_argument(
        "--pipeline",
        choices=PIPELINES,
        default="data",
        help="whose input pipeline state the data goes through (default: data)",
    )
    cs.add_argument("--split", choices=SPLITS, default="test")
    cs.add_argument(
        "--kind",
        choices=CROSS_SITE_KINDS,
        help="model kind (default: the evaluated one); local = each client's local model "
        "after one more round of its own training (FedRDN Table 3)",
    )
    _weights_arg(cs)
    add_allow_plugins(cs)
    common(cs, "cross-site")
    cs.set_defaults(fn=_cmd_cross_site)

    lo = ps.add_parser("loco", help="leave-one-client-out generalisation (FedFA Tab. 4)")
    _suite_args(lo)
    common(lo, "loco")
    lo.set_defaults(fn=_cmd_loco)

    ns = ps.add_parser(
        "new-site",
        help="each held-out site: global model, AdaBN, test-time norm, k-shot head, selection",
    )
    _suite_args(ns)
    ns.add_argument(
        "--shots",
        type=_shots,
        default=NEW_SITE_SHOTS,
        help="labelled images per class for finetune-k (default: 1,5,10)",
    )
    ns.add_argument(
        "--sites", help="comma-separated clients to hold out (default: each client in turn)"
    )
    ns.add_argument(
        "--epochs", type=int, default=50, help="head epochs over the k-shot images (default 50)"
    )
    _weights_arg(ns)
    common(ns, "new-site")
    ns.set_defaults(fn=_cmd_new_site)

    sw = ps.add_parser("sweep", help="one config key swept, mean ± std over seeds")
    _suite_args(sw)
    sw.add_argument("--key", required=True, help="dotted config key, e.g. train.local_epochs")
    sw.add_argument("--values", required=True, help="comma-separated values, e.g. 1,2,5,10")
    common(sw, "sweep")
    sw.set_defaults(fn=_cmd_sweep)

    ro = ps.add_parser("rounds", help="rounds to reach thresholds by #clients (DisTrans Tab. 5)")
    ro.add_argument("runs", nargs="+", help="run directories or folders holding them")
    ro.add_argument("--thresholds", required=True, help="fractions in (0, 1], e.g. 0.6,0.7,0.8")
    ro.add_argument("--split", choices=["val", "test"], default="test")
    ro.add_argument(
        "--by",
        default="partition.clients",
        help="config key of the row's setting (default: partition.clients)",
    )
    common(ro, "rounds")
    ro.set_defaults(fn=_cmd_rounds)

    hf = ps.add_parser(
        "head-finetune", help="train on a data fraction, retrain only the head (FRAug Tab. 1)"
    )
    _suite_args(hf)
    hf.add_argument("--epochs", type=int, default=10, help="head epochs (default 10)")
    _weights_arg(hf)
    common(hf, "head-finetune")
    hf.set_defaults(fn=_cmd_head_finetune)

    pv = ps.add_parser(
        "privacy",
        help="attacks on what each method's site sends: membership, site property, "
        "reconstruction (issue 51)",
    )
    _suite_args(pv)
    pv.add_argument(
        "--run", action="append", help="a finished run directory to attack (repeatable)"
    )
    pv.add_argument(
        "--sizes",
        type=_ints,
        default=[10, 50, 200],
        help="site sizes for the records computed from images (default 10,50,200)",
    )
    pv.add_argument("--trials", type=int, default=40, help="sites drawn per size (40)")
    _weights_arg(pv)
    common(pv, "privacy")
    pv.set_defaults(fn=_cmd_privacy)

    ts = ps.add_parser("tsne", help="t-SNE of test features by client (FedRDN Fig. 3)")
    ts.add_argument("runs", nargs="+", help="finished run directories, one panel each")
    ts.add_argument("--per-client", type=int, default=150, help="images per client (150)")
    ts.add_argument("--perplexity", type=float, default=30.0)
    ts.add_argument("--seed", type=int, default=0, help="subsampling and t-SNE seed (0)")
    ts.add_argument("--split", choices=SPLITS, default="test")
    ts.add_argument("--labels", help="comma-separated panel titles (default: run labels)")
    _weights_arg(ts)
    add_allow_plugins(ts)
    common(ts, "tsne")
    ts.set_defaults(fn=_cmd_tsne)
