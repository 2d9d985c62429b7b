"""The algorithm contracts of :mod:`fedshift.core.contract`, checked for every registered
algorithm (driven by ``ALGORITHMS.names()``: a new algorithm is tested without being listed),
with the checks :mod:`fedshift.testing` gives plug-in authors:

* the runtime-facing :class:`Composition` satisfies :class:`FederatedAlgorithm` (members,
  parameter names, resolved types) and every algorithm :class:`AlgorithmSpec`;
* ``init_server`` / ``init_client`` return plain data that ``torch.save`` writes and
  ``torch.load(weights_only=True)`` reads back unchanged;
* broadcast -> local_update -> aggregate runs a round; the up payloads are finite;
* ``personal_weights(server_view(server, cid), state) == personal_weights(server, state)``;
* re-entrancy: ``broadcast`` and ``local_update`` leave the algorithm object as it was, and a
  client's round run *inside* another client's round (after its first local step, on the
  same algorithm object, each client with its own working model) gives both clients exactly
  the payloads and states of running them one after the other.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import torch

from fedshift.algorithms import ALGORITHMS
from fedshift.augment.compose import Composition
from fedshift.core.contract import AlgorithmSpec, FederatedAlgorithm
from fedshift.core.federation import Federation
from fedshift.testing import (
    ContractError,
    check_augment,
    check_model,
    check_one_round,
    check_reentrancy,
    check_spec,
    hints,
    interleave,
    protocol_members,
    tiny_cfg,
    tiny_federation,
)

NAMES = ALGORITHMS.names()

#: overrides for algorithms whose objective needs per-pixel labels (``tasks`` without
#: classification, FedDG-ELCFS): the toy config on ``toyseg`` with a tiny U-Net
SEGMENTATION = ("dataset.name=toyseg", "model.name=unet", "model.width=2")


def _seg_only(name: str) -> bool:
    return "classification" not in ALGORITHMS.get(name).tasks


def _cfg(name: str, *over: str):
    """The tiny config of ``name`` (on toyseg for a segmentation-only algorithm)."""
    return tiny_cfg(name, *(SEGMENTATION if _seg_only(name) else ()), *over)


#: options that switch an algorithm to another per-round code path (re-entrancy only)
VARIANTS = [
    ("fedproto", "algorithm.prototypes=released"),
    ("fedproto", "algorithm.share_weights=true"),
    ("partialfed", "algorithm.strategy=adaptive"),
    ("fraug", "algorithm.variant=released"),
    ("fraug", "algorithm.embeddings=agnostic"),
    ("distrans", "algorithm.aggregation=avg"),
    ("distrans", "algorithm.aggregation=nn"),
    ("fedrobust", "algorithm.affine=channel"),
    ("scaffold", "train.momentum=0.0"),
    ("pfedavg", "algorithm.finetune_epochs=1"),
    ("fedsr", "algorithm.reference=averaged"),
    ("feddg_ga", "algorithm.base=fedprox"),
    ("fedheal", "algorithm.base=fedprox"),
    ("adcol", "algorithm.averaging=fedavg"),
]


# ----------------------------------------------------------------------------- the protocols
def test_composition_has_the_runtime_protocol_exactly():
    """Every member of FederatedAlgorithm exists on Composition with the same parameters
    (names, kinds, defaults) and the same resolved types; properties stay properties."""
    for name in protocol_members(FederatedAlgorithm):
        want = inspect.getattr_static(FederatedAlgorithm, name)
        got = inspect.getattr_static(Composition, name)
        if isinstance(want, property):
            assert isinstance(got, property), name
            assert hints(got.fget, Composition) == hints(want.fget, FederatedAlgorithm), name
            continue
        ws, gs = inspect.signature(want), inspect.signature(got)
        assert [(p.name, p.kind, p.default) for p in gs.parameters.values()] == [
            (p.name, p.kind, p.default) for p in ws.parameters.values()
        ], name
        assert hints(got, Composition) == hints(want, FederatedAlgorithm), name


def test_runtime_protocol_is_what_the_runtimes_call():
    runtime = {
        "communicates", "has_global_model", "has_personal_model", "needs_setup", "algorithm",
        "init_server", "init_client", "register_clients", "setup_reply", "setup_aggregate",
        "setup_broadcast", "setup_receive", "broadcast", "local_update", "aggregate",
        "eval_broadcast", "eval_receive", "global_weights", "personal_weights", "server_view",
    }  # fmt: skip
    assert set(protocol_members(FederatedAlgorithm)) == runtime
    spec = set(protocol_members(AlgorithmSpec)) | set(AlgorithmSpec.__annotations__)
    assert {"init_client", "local_update", "reply", "broadcast", "aggregate", "check"} <= spec


@pytest.mark.parametrize("name", NAMES)
def test_algorithm_class_implements_the_author_protocol(name):
    """Every member of AlgorithmSpec is there, with the spec's parameter names (an override
    with another signature, e.g. the old ``init_client(cid, model)``, fails here)."""
    check_spec(name)


# ----------------------------------------------------------------------------- one round
@pytest.fixture(scope="module")
def feds() -> dict[bool, Federation]:
    """The tiny federations: classification (False) and segmentation (True)."""
    return {False: tiny_federation(), True: tiny_federation(tiny_cfg("fedavg", *SEGMENTATION))}


@pytest.fixture(scope="module")
def fed(feds) -> Federation:
    return feds[False]


@pytest.mark.parametrize("name", NAMES)
def test_one_round_state_payloads_and_views(name, feds, one_thread):
    check_one_round(_cfg(name), feds[_seg_only(name)])


#: the options an algorithm asks for on segmentation (its error message names them)
SEG_OPTIONS = {"moon": ("algorithm.projection=false",)}


@pytest.mark.parametrize(
    "name", [n for n in NAMES if "segmentation" in ALGORITHMS.get(n).tasks and not _seg_only(n)]
)
def test_one_round_on_segmentation_for_every_algorithm_that_claims_it(name, feds, one_thread):
    """An algorithm whose ``tasks`` name segmentation runs a round on toyseg too (its own
    metrics read the task's: FedDG-GA's validation gap once asked a U-Net for accuracy)."""
    needs = getattr(ALGORITHMS.get(name), "requires", ())  # FedWon's model keys, on the U-Net
    check_one_round(tiny_cfg(name, *SEGMENTATION, *needs, *SEG_OPTIONS.get(name, ())), feds[True])


# ----------------------------------------------------------------------------- re-entrancy
def _reentrancy_cases() -> list:
    cases = [pytest.param(n, (), id=n) for n in NAMES]
    cases += [pytest.param(n, (o,), id=f"{n}-{o}") for n, o in VARIANTS]
    return cases


@pytest.mark.parametrize(("name", "over"), _reentrancy_cases())
def test_rounds_of_two_clients_interleave_on_one_algorithm_object(name, over, feds, one_thread):
    check_reentrancy(_cfg(name, *over), feds[_seg_only(name)])


def test_the_interleaving_check_catches_round_values_on_self(fed, one_thread, monkeypatch):
    """SCAFFOLD with its round's correction c - c_i kept on ``self`` (as before the contract,
    without the clean-up): both checks see it: the attribute snapshot, and the interleaving
    (B's correction replaces A's in the middle of A's round)."""
    from fedshift.algorithms.scaffold import CORRECTION, Scaffold

    original, original_before_step = Scaffold.local_update, Scaffold.before_step

    def local_update(self, ctx, down, state):
        c, c_i = down["control"], state["control"]
        self._correction = {k: c[k] - c_i[k] for k in self.shared_param_keys}
        return original(self, ctx, down, state)

    def before_step(self, ctx):
        ctx.scratch[CORRECTION] = self._correction  # whichever client wrote it last
        original_before_step(self, ctx)

    monkeypatch.setattr(Scaffold, "local_update", local_update)
    monkeypatch.setattr(Scaffold, "before_step", before_step)
    changed, seq, got = interleave(tiny_cfg("scaffold"), fed)
    assert changed == ["_correction"]
    assert got[:2] != seq[:2]  # A trained with B's correction after its first step
    assert got[2:] == seq[2:]  # B ran whole, with its own
    with pytest.raises(ContractError, match=r"scaffold: .*changed algorithm attribute.*_correct"):
        check_reentrancy(tiny_cfg("scaffold"), fed)


def test_the_round_check_catches_state_a_checkpoint_would_not_fit(fed, one_thread, monkeypatch):
    """A state key init_server built, reshaped by aggregate: a resumed run's checkpoint is
    checked against the initial state (issue 48), so check_algorithm says so at once."""
    from fedshift.algorithms.fedavg import FedAvg

    init, aggregate = FedAvg.init_server, FedAvg.aggregate

    def init_server(self, model):
        return {**init(self, model), "count": torch.zeros(1)}

    def grown(self, server, rnd, replies):
        aggregate(self, server, rnd, replies)
        server["count"] = torch.zeros(2)

    monkeypatch.setattr(FedAvg, "init_server", init_server)
    monkeypatch.setattr(FedAvg, "aggregate", grown)
    with pytest.raises(ContractError, match=r"fedavg: after round 1, key 'server/count' must be"):
        check_one_round(tiny_cfg("fedavg"), fed)


def test_augment_and_model_checks_pass_for_built_ins_and_catch_a_broken_model(one_thread):
    """fedshift.testing's augment and model checks on built-in components, and a model whose
    forward is not head(features(x)) caught by name."""
    from torch import nn

    from fedshift.models import MODELS
    from fedshift.models.digits import LeNet5

    check_augment("fedrdn")
    check_model("lenet5")

    class Skewed(LeNet5):  # forward adds what head(features(x)) does not
        def forward(self, x):
            return super().forward(x) + 1.0

    class NoStages(LeNet5):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.stages = nn.ModuleDict()

    saved = dict(MODELS._entries)
    try:
        MODELS.add("skewed", Skewed, MODELS.entry("lenet5").params)
        MODELS.add("nostages", NoStages, MODELS.entry("lenet5").params)
        with pytest.raises(ContractError, match=r"skewed: forward\(x\) != head\(features\(x\)\)"):
            check_model("skewed")
        with pytest.raises(ContractError, match="nostages: self.stages names no stage"):
            check_model("nostages")
    finally:
        MODELS._entries = saved


def test_contract_module_sits_in_core_and_names_types_only_for_checkers():
    src = Path(inspect.getfile(FederatedAlgorithm)).read_text()
    assert "from fedshift.data" not in src.split("if TYPE_CHECKING:")[0]
    assert "from fedshift.models" not in src.split("if TYPE_CHECKING:")[0]
