"""DisTrans's config keys (``algorithm.*``) and payload names (Yuan et al., ECCV 2022).
``update`` switches the paper's alternating offset/model step (Algorithm 1) and the released
code's simultaneous one; ``nn_input`` the NN aggregator's input (Sec. 4.4 or the released
generator's); docs/METHODS.md lists every difference."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from fedshift.algorithms.base import FLParams
from fedshift.core.bounds import bounded

#: the offset's key in the wrapper's state dict (and in the ``offset`` payload record)
OFFSET = "offset"
#: payload records
OFFSET_RECORD = "offset"
LABEL_RECORD = "label_dist"
#: the normalisation assumed when the run's is unknown (fedshift's default input.mean/std)
DEFAULT_NORM = (0.5, 0.5)

Aggregation = Literal["auto", "none", "avg", "nn"]


@dataclass
class DisTransParams(FLParams):
    # a of Eq. 1, in [0, 1) (paper: 0.3; released MACFed.py: 0.2)
    alpha: float = bounded(0.3, ge=0, lt=1)
    # SGD step size of the offset (paper and released code: 1e-3)
    offset_lr: float = bounded(1e-3, gt=0)
    # momentum of the offset's SGD (released: none)
    offset_momentum: float = bounded(0.0, ge=0, lt=1)
    # "alternate": offset step then model step per batch (Algorithm 1);
    # "simultaneous": both step on one gradient (the released code)
    update: Literal["alternate", "simultaneous"] = "alternate"
    # 2: double-input-channel model; 1: single channel (Table 3 ablation)
    channels: Literal[1, 2] = 2
    # offset aggregation: auto (DH rule), none, avg, nn (Table 4)
    aggregation: Aggregation = "auto"
    # auto: aggregate when DH (percent) is below this
    dh_threshold: float = bounded(50.0, ge=0, le=100, why="a percentage")
    # auto: which aggregation to use below the threshold
    auto_aggregator: Literal["nn", "avg"] = "nn"
    # nn aggregator: passes over the uploaded offsets per round (released: 1)
    nn_steps: int = bounded(1, ge=1)
    # nn aggregator: SGD step size (released: 1e-2)
    nn_lr: float = bounded(1e-2, gt=0)
    # nn aggregator: MLP width (released: 100)
    nn_hidden: int = bounded(100, ge=1)
    # nn aggregator: channels of the last transposed conv (released ngf: 64)
    nn_width: int = bounded(64, ge=1)
    # nn aggregator input: "paper" = class-share embedding e + the client's offset
    # (Sec. 4.4); "released" = the client's own label distribution only (hyperMACFed.py)
    nn_input: Literal["paper", "released"] = "paper"
