"""``fedshift protocol tsne RUN_DIR...``: t-SNE of the clients' test features, coloured by
client, one panel per run (FedRDN's Fig. 3; :mod:`fedshift.protocols.tsne`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from fedshift.studies.base import (
    StudyResult,
    Weights,
    option,
    out_option,
    quiet_option,
    weights_option,
)
from fedshift.studies.cross_site import Split


@dataclass(frozen=True, kw_only=True)
class Options:
    """Finished runs' features, one panel each."""

    #: the runs' configs may name plug-ins: the command takes ``--allow-plugins``
    loads_runs: ClassVar[bool] = True

    runs: tuple[str, ...] = option(
        help="finished run directories, one panel each", positional=True, nargs="+"
    )
    per_client: int = option(150, "images per client (150)")
    perplexity: float = option(30.0, "t-SNE perplexity (30)")
    seed: int = option(0, "subsampling and t-SNE seed (0)")
    split: Split = option("test", "the clients' split (default: test)")
    labels: str | None = option(None, "comma-separated panel titles (default: run labels)")
    weights: Weights = weights_option()
    out: str | None = out_option()
    quiet: bool = quiet_option()


def run(options: Options) -> StudyResult:
    """t-SNE of test features by client (FedRDN Fig. 3)"""
    from fedshift.protocols.tsne import tsne

    o = options
    labels = [x.strip() for x in o.labels.split(",")] if o.labels else None
    res = tsne(
        list(o.runs), o.per_client, o.out, o.perplexity, o.seed, o.split, labels,
        not o.quiet, o.weights,
    )  # fmt: skip
    return StudyResult.of(res)
