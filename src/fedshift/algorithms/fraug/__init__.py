"""FRAug (Chen et al., "FRAug: Tackling Federated Learning with Non-IID Features via
Representation Augmentation", ICCV 2023): a shared embedding generator and local RTNets
whose synthetic embeddings (Eq. 2-3) train each client's prediction head (Eq. 1, 5, 6).

* :mod:`.params`: the config keys and the paper / released-code variant record;
* :mod:`.nets`: the generator and RTNet (Sec. 3.1), MMD, entropy, ramp-up, prototypes (Eq. 4);
* :mod:`.objectives`: the losses of Eq. 1-6;
* :mod:`.algorithm`: the server and client halves and the one local training loop.

docs/METHODS.md maps every equation to code and lists the released code's differences.
"""

from __future__ import annotations

from fedshift.algorithms.fraug.algorithm import NETS, FRAug
from fedshift.algorithms.fraug.nets import (
    Generator,
    RTNet,
    cyclic_labels,
    entropy,
    mmd,
    ramp_factor,
    synthetic_weight,
    update_prototypes,
)
from fedshift.algorithms.fraug.objectives import WorkingNets
from fedshift.algorithms.fraug.params import VARIANTS, FRAugParams, RoundPlan, Variant

__all__ = [
    "FRAug", "FRAugParams", "Generator", "NETS", "RTNet", "RoundPlan", "VARIANTS", "Variant",
    "WorkingNets", "cyclic_labels", "entropy", "mmd", "ramp_factor", "synthetic_weight",
    "update_prototypes",
]  # fmt: skip
