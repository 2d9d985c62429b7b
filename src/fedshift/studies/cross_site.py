"""``fedshift protocol cross-site RUN_DIR``: client *i*'s model on client *j*'s data
(FedRDN's Table 3; :mod:`fedshift.protocols.cross_site`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal, get_args

from fedshift.studies.base import (
    StudyResult,
    Weights,
    option,
    out_option,
    quiet_option,
    weights_option,
)

Pipeline = Literal["data", "model"]
Split = Literal["train", "val", "test"]
Kind = Literal["personal", "global", "local"]
#: ``--pipeline`` (:data:`fedshift.protocols.common.PIPELINES`)
PIPELINES: tuple[str, ...] = get_args(Pipeline)
#: ``--split`` (:data:`fedshift.protocols.common.SPLITS`)
SPLITS: tuple[str, ...] = get_args(Split)
#: ``--kind`` (:data:`fedshift.protocols.common.CROSS_SITE_KINDS`)
CROSS_SITE_KINDS: tuple[str, ...] = get_args(Kind)


@dataclass(frozen=True, kw_only=True)
class Options:
    """One finished run's cross-site matrix."""

    #: the run's config may name plug-ins: the command takes ``--allow-plugins``
    loads_runs: ClassVar[bool] = True

    run_dir: str = option(help="a finished run directory", positional=True)
    pipeline: Pipeline = option(
        "data", "whose input pipeline state the data goes through (default: data)"
    )
    split: Split = option("test", "the clients' split (default: test)")
    kind: Kind | None = option(
        None,
        "model kind (default: the evaluated one); local = each client's local model after "
        "one more round of its own training (FedRDN Table 3)",
    )
    weights: Weights = weights_option()
    out: str | None = out_option()
    quiet: bool = quiet_option()


def run(options: Options) -> StudyResult:
    """client i's model on client j's data (FedRDN Tab. 3)"""
    from fedshift.protocols.cross_site import cross_site

    o = options
    res = cross_site(o.run_dir, o.pipeline, o.split, o.kind, o.out, not o.quiet, o.weights)
    return StudyResult.of(res)
