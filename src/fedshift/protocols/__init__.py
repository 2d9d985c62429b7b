"""The papers' evaluation protocols, each one function here and one registered study
(:mod:`fedshift.studies`: its ``Options`` and ``run``, from which ``fedshift protocol
<study>`` is generated).

* :func:`cross_site` (``cross_site.py``; ``fedshift protocol cross-site RUN_DIR``): the
  cross-site matrix of FedRDN's Table 3, client *i*'s model on client *j*'s data.
* :func:`loco` (``loco.py``; ``fedshift protocol loco -c CONFIG``): leave-one-client-out
  federated domain generalisation (FedFA's Table 4).
* :func:`new_site` (``new_site.py``; ``fedshift protocol new-site -c CONFIG``): each
  held-out site of loco's cells scored with the global model as is, AdaBN, the method's
  test-time normalisation, k-shot head finetuning and entropy-based selection among the
  sources' models; FedBN, FRAug and DisTrans get the sources' mean local tensors.
* :func:`sweep` (``sweep.py``; ``fedshift protocol sweep -c CONFIG --key K --values ...``):
  one config key swept through the cached bench machinery, mean ± std over seeds per value
  (FedFA's Fig. 2 / Table 16, FedRDN's Fig. 2, HarmoFL's Fig. 5b).
* :func:`rounds_to_threshold` (``rounds.py``; ``fedshift protocol rounds RUN_ROOT...
  --thresholds``): the first evaluated round at which the mean score over clients reaches
  each threshold, as the number of clients grows (DisTrans's Table 5).
* :func:`tsne` (``tsne.py``; ``fedshift protocol tsne RUN_DIR...``): t-SNE of the clients'
  test features, coloured by client, one panel per run (FedRDN's Fig. 3).
* :func:`head_finetune` (``head_finetune.py``; ``fedshift protocol head-finetune``): train on
  a data fraction, then retrain only the prediction head (FRAug's Table 1).
* ``segviz.py``: per-site segmentation pictures of finished runs
  (:func:`fedshift.protocols.segviz.site_predictions_figure`, ``benchmarks/seg_figure.py``);
  not imported here, so importing this package does not load the runtime.

``common.py`` holds what they share (:class:`ProtocolResult`, the output files, run labels,
:func:`load_run`, :class:`SuiteOptions`: how :func:`loco`, :func:`sweep` and
:func:`head_finetune` read a config and run its grid as a cached suite).

The functions are re-exported here under the names of their modules, so
``fedshift.protocols.sweep`` is the *function*; import a module's other names from the module
(``from fedshift.protocols.sweep import sweep_table``).
"""

from fedshift.protocols.common import (
    CROSS_SITE_KINDS,
    KINDS,
    PIPELINES,
    SPLITS,
    ProtocolResult,
    SuiteOptions,
    load_run,
    run_label,
)
from fedshift.protocols.cross_site import cross_site, local_models
from fedshift.protocols.head_finetune import finetune_head, finetune_run, head_finetune, head_table
from fedshift.protocols.loco import loco, loco_table
from fedshift.protocols.new_site import new_site, new_site_tables
from fedshift.protocols.rounds import (
    first_round_reaching,
    mean_curve,
    metric_rows,
    parse_thresholds,
    rounds_to_threshold,
)
from fedshift.protocols.sweep import parse_values, sweep, sweep_table
from fedshift.protocols.tsne import features_of, subsample, tsne

__all__ = [
    "CROSS_SITE_KINDS",
    "KINDS",
    "PIPELINES",
    "SPLITS",
    "ProtocolResult",
    "SuiteOptions",
    "cross_site",
    "features_of",
    "finetune_head",
    "finetune_run",
    "first_round_reaching",
    "head_finetune",
    "head_table",
    "load_run",
    "local_models",
    "loco",
    "loco_table",
    "mean_curve",
    "metric_rows",
    "new_site",
    "new_site_tables",
    "parse_thresholds",
    "parse_values",
    "rounds_to_threshold",
    "run_label",
    "subsample",
    "sweep",
    "sweep_table",
    "tsne",
]
