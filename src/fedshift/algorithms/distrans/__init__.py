"""DisTrans (Yuan, Hui, Yang, Burlina, Gong & Cao, "Addressing Heterogeneity in Federated
Learning via Distributional Transformation", ECCV 2022): per-client offsets applied through a
double-input-channel model (Eq. 1), trained jointly with it (Algorithm 1) and aggregated on the
server (Sec. 4.4, Table 4; the DH rule of Eq. 3-4).

* :mod:`.params`: the config keys and payload names;
* :mod:`.model`: Eq. 1 and the double-input-channel model;
* :mod:`.aggregator`: the Sec. 4.4 server network and its regression;
* :mod:`.algorithm`: the server and client halves and the one local training loop.

docs/METHODS.md maps the paper to code and lists the released code's differences.
"""

from __future__ import annotations

from fedshift.algorithms.distrans.aggregator import (
    AggPair,
    OffsetAggregator,
    class_share,
    label_proportions,
    train_aggregator,
)
from fedshift.algorithms.distrans.algorithm import DisTrans
from fedshift.algorithms.distrans.model import DisTransModel, blend, recover
from fedshift.algorithms.distrans.params import (
    DEFAULT_NORM,
    LABEL_RECORD,
    OFFSET,
    OFFSET_RECORD,
    DisTransParams,
)

__all__ = [
    "DEFAULT_NORM", "LABEL_RECORD", "OFFSET", "OFFSET_RECORD", "AggPair", "DisTrans",
    "DisTransModel", "DisTransParams", "OffsetAggregator", "blend", "class_share",
    "label_proportions", "recover", "train_aggregator",
]  # fmt: skip
