"""``fedshift export RUN_DIR --out model.pt``: a run's trained model as a plain ``state_dict``
plus its description (:mod:`fedshift.runtime.export`) and the self-contained predictor
``model.pt2`` (:mod:`fedshift.runtime.predictor`); ``fedshift predict MODEL IMAGES...``: that
predictor's labels and scores for image files."""

from __future__ import annotations

import argparse


def _cmd_export(args: argparse.Namespace) -> int:
    from fedshift.runtime.export import export_model

    done = export_model(
        args.run_dir,
        args.out,
        args.weights,
        args.client,
        args.kind,
        site_stats=args.site_stats,
        adabn=args.adabn,
    )
    src = done.config["source"]
    who = f"client {src['client']}'s {src['kind']}" if src["client"] else src["kind"]
    if src["kind"] == "adabn":
        who = "a new site's (BN statistics re-estimated on its images: AdaBN)"
    print(f"{who} model of round {src['round']} ({src['weights']}): {done.path}")
    print(f"description (model config, classes, input normalisation): {done.config_path}")
    print(
        f"load the weights with torch.load({str(done.path)!r}, weights_only=True), or "
        f"fedshift.load_exported({str(done.path)!r})"
    )
    print(
        f"predictor (input transform and model, for {src['site']}; torch.export, loads "
        f"without fedshift): {done.predictor_path}"
    )
    print(
        f"predict with: fedshift predict {done.predictor_path} IMAGES..., or "
        f"torch.export.load({str(done.predictor_path)!r}).module()(images)"
    )
    return 0


def _cmd_predict(args: argparse.Namespace) -> int:
    import json
    import sys

    import torch

    from fedshift.runtime.predictor import load_predictor

    pred = load_predictor(args.model, args.site_stats)
    files, labels, scores = pred.predict_files(args.images)
    if pred.meta.get("batch_dependent"):
        print(
            f"fedshift: note: this model normalises with each batch's statistics at evaluation "
            f"(BatchNorm without running statistics): an image's scores depend on the images "
            f"batched with it (batches of {pred.meta['batch_size']}, in the order given)",
            file=sys.stderr,
        )
    segmentation = pred.meta["task"] == "segmentation"
    rows = []
    for path, label, score in zip(files, labels, scores, strict=True):
        if segmentation:
            counts = torch.bincount(label.flatten(), minlength=len(pred.classes)).tolist()
            row = {"file": str(path), "pixels": dict(zip(pred.classes, counts, strict=True))}
        else:
            prob = torch.softmax(score.double(), 0)
            row = {
                "file": str(path),
                "label": pred.classes[int(label)],
                "score": float(prob[int(label)]),
                "scores": [float(v) for v in score],
            }
        rows.append(row)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    for row in rows:
        if segmentation:
            pixels = ", ".join(f"{k} {v}" for k, v in row["pixels"].items())
            print(f"{row['file']}\t{pixels}")
        else:
            print(f"{row['file']}\t{row['label']}\t{row['score']:.4f}")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``export`` and ``predict`` to the main parser's subcommands."""
    p = sub.add_parser(
        "export",
        help="a run's trained model: a plain state_dict + JSON description, and a predictor "
        "(.pt2) that loads without fedshift",
    )
    p.add_argument("run_dir", help="a finished run directory")
    p.add_argument(
        "--out",
        required=True,
        help="the weights file to write, e.g. model.pt (+ model.json, + the predictor model.pt2)",
    )
    p.add_argument(
        "--weights",
        choices=("selected", "last"),
        default="selected",
        help="the round model selection picked on validation (default) or the last round",
    )
    p.add_argument(
        "--client",
        help="whose personalised model, for runs that keep one per client (FedBN); for a "
        "global model whose evaluation is each site's own (FedRDN), whose site",
    )
    p.add_argument(
        "--kind",
        choices=("personal", "global"),
        help="which model of a run that has both (default: the one its tables evaluate)",
    )
    p.add_argument(
        "--site-stats",
        metavar="DIR",
        help="a new site's images: its statistics for a method that normalises each site "
        "with its own (FedRDN), instead of --client",
    )
    p.add_argument(
        "--adabn",
        metavar="DIR",
        help="a new site's images: the model that site takes with its BatchNorm statistics "
        "re-estimated on them (AdaBN, as protocol new-site's adabn variant)",
    )
    p.set_defaults(fn=_cmd_export)
    q = sub.add_parser(
        "predict",
        help="labels and scores of image files from a predictor fedshift export wrote",
    )
    q.add_argument("model", help="the predictor, model.pt2")
    q.add_argument("images", nargs="+", help="image files or folders of them")
    q.add_argument(
        "--site-stats",
        metavar="DIR",
        help="a new site's images: replace the predictor's per-site statistics (FedRDN)",
    )
    q.add_argument("--json", action="store_true", help="one JSON list, with every score")
    q.set_defaults(fn=_cmd_predict)
