"""``fedshift export RUN_DIR --out model.pt``: a run's trained model as a plain ``state_dict``
plus its description (:mod:`fedshift.runtime.export`)."""

from __future__ import annotations

import argparse


def _cmd_export(args: argparse.Namespace) -> int:
    from fedshift.runtime.export import export_model

    done = export_model(args.run_dir, args.out, args.weights, args.client, args.kind)
    src = done.config["source"]
    who = f"client {src['client']}'s {src['kind']}" if src["client"] else src["kind"]
    print(f"{who} model of round {src['round']} ({src['weights']}): {done.path}")
    print(f"description (model config, classes, input normalisation): {done.config_path}")
    print(
        f"load it with torch.load({str(done.path)!r}, weights_only=True), or "
        f"fedshift.load_exported({str(done.path)!r})"
    )
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``export`` to the main parser's subcommands."""
    p = sub.add_parser(
        "export",
        help="a run's trained model as a plain state_dict (torch.load(weights_only=True)) "
        "plus a JSON description",
    )
    p.add_argument("run_dir", help="a finished run directory")
    p.add_argument(
        "--out", required=True, help="the weights file to write, e.g. model.pt (+ model.json)"
    )
    p.add_argument(
        "--weights",
        choices=("selected", "last"),
        default="selected",
        help="the round model selection picked on validation (default) or the last round",
    )
    p.add_argument(
        "--client", help="whose personalised model, for runs that keep one per client (FedBN)"
    )
    p.add_argument(
        "--kind",
        choices=("personal", "global"),
        help="which model of a run that has both (default: the one its tables evaluate)",
    )
    p.set_defaults(fn=_cmd_export)
