"""``train.trainable`` (:mod:`fedshift.algorithms.trainable`): every registered algorithm
either trains the named part of the model with the rest frozen (the frozen tensors are the
initial model's after two rounds, fewer bytes cross the wire, the frozen batch-norm layers
normalise as in evaluation) or refuses with a one-line reason naming the key."""

from __future__ import annotations

import pytest
import torch
from conftest import toy_cfg
from support.same_run import TINY, seg_overrides

from fedshift.algorithms import ALGORITHMS
from fedshift.algorithms.trainable import Frozen, frozen_keys
from fedshift.core.errors import ConfigError, FedshiftError
from fedshift.data import run_federation
from fedshift.runtime.experiment import build_experiment
from fedshift.runtime.simulation import Simulation

pytestmark = pytest.mark.usefixtures("one_thread")

ROUNDS = 2
#: (algorithm, mode) -> a phrase of the refusal; every other pair must train
REFUSED = {
    ("pfedhn", "head"): "hypernetwork",
    ("pfedhn", "bn+head"): "hypernetwork",
    ("pfedhn", "bn"): "hypernetwork",
    ("fedbn", "head"): "freezes them all",
    ("fraug", "head"): "freezes them all",
    ("fedbn", "bn"): "nothing is left to share",
    ("fedwon", "bn"): "no batch-norm layer",
    ("fedwon", "bn+head"): "no batch-norm layer",
    ("pfedhn", "adapters"): "hypernetwork",
    ("pfedhn", "lora"): "hypernetwork",
    ("fedbn", "adapters"): "freezes them all",
    ("fedbn", "lora"): "freezes them all",
    ("fedwon", "adapters"): "not weight-standardised",
    ("elcfs", "adapters"): "not stage after stage",
    ("fedclip", "adapters"): "trains its adapter and the head on a frozen trunk",
    ("fedclip", "lora"): "trains its adapter and the head on a frozen trunk",
}
#: the methods that wrap, replace or constrain the model, and the seed methods
ADDED = ("fedavg", "fedbn", "fedfa", "harmofl", "distrans", "fedsr", "fedwon", "elcfs",
         "pfedhn", "moon", "scaffold", "fedrdn", "fedclip")  # fmt: skip
CASES = (
    [(a, "head") for a in ALGORITHMS.names()]
    + [(a, "bn+head") for a in ("fedavg", "fedbn", "fedfa", "harmofl", "distrans", "fraug")]
    + [("fedavg", "bn"), ("fedbn", "bn"), ("fedwon", "bn"), ("pfedhn", "bn")]
    + [(a, m) for m in ("adapters", "lora") for a in ADDED]
)


def _cfg(algorithm: str, mode: str):
    over = (f"algorithm.name={algorithm}", *seg_overrides(algorithm),
            *ALGORITHMS.get(algorithm).requires)  # fmt: skip
    return toy_cfg(*TINY, *over, f"train.trainable={mode}", rounds=ROUNDS)


def _up_bytes(sim: Simulation) -> int:
    return sum(b for (_, _, direction, _, b) in sim.ledger.rows if direction == "up")


def _train(cfg, tmp_path) -> Simulation:
    sim = Simulation(cfg, tmp_path, progress=False)
    if sim.algo.needs_setup:
        sim.setup_exchange()
    for rnd in range(1, ROUNDS + 1):
        sim.run_round(rnd)
    return sim


@pytest.mark.parametrize(("algorithm", "mode"), CASES, ids=[f"{a}-{m}" for a, m in CASES])
def test_a_part_trains_and_the_rest_stays_as_built(tmp_path, algorithm, mode):
    refusal = REFUSED.get((algorithm, mode))
    if refusal is not None:  # at config time or when the experiment is built
        with pytest.raises(ConfigError, match=refusal):
            Simulation(_cfg(algorithm, mode), tmp_path, progress=False)
        return
    cfg = _cfg(algorithm, mode)
    # the initial model built apart: what the frozen part is
    initial = build_experiment(cfg, run_federation(cfg, None)).model
    want = initial.state_dict()
    sim = _train(cfg, tmp_path / "part")
    frozen = sim.algo.algorithm.frozen
    assert frozen.keys and set(frozen.keys) < set(want)
    report = frozen.at_end(sim.server, sim.model)  # raises where a frozen tensor moved
    assert report is not None and report["frozen_tensors"] == len(frozen.keys)
    state = sim.model.state_dict()
    for k in frozen.keys:
        assert torch.equal(state[k], want[k]), k
        if isinstance(sim.server.get("weights"), dict) and k in sim.server["weights"]:
            assert torch.equal(sim.server["weights"][k], want[k]), k
    assert not set(frozen.keys) & set(sim.algo.algorithm.shared_keys)
    assert not set(frozen.keys) & set(sim.algo.algorithm.local_keys)
    needs_part = any(r.startswith("train.trainable=") for r in ALGORITHMS.get(algorithm).requires)
    if sim.algo.algorithm.communicates and sim.algo.algorithm.shared_keys and not needs_part:
        whole = _train(_cfg(algorithm, "all"), tmp_path / "all")
        assert _up_bytes(sim) < _up_bytes(whole)


def test_the_frozen_trunk_normalises_as_in_evaluation(tmp_path):
    """Head only: the trunk's features are the same in training and evaluation mode (its
    BN layers use their running statistics and never update them)."""
    sim = Simulation(_cfg("fedavg", "head"), tmp_path, progress=False)
    model = sim.model
    x = torch.rand(6, *sim.fed.input_shape)
    model.eval()
    with torch.no_grad():
        want = model.features(x)
    model.train()
    with torch.no_grad():
        got = model.features(x)
    assert torch.equal(got, want)
    # with every tensor trainable the same model's BN layers use the batch's statistics
    whole = Simulation(_cfg("fedavg", "all"), tmp_path / "all", progress=False).model
    whole.train()
    with torch.no_grad():
        assert not torch.equal(whole.features(x), want)


def test_a_moved_frozen_tensor_is_found(tmp_path):
    sim = Simulation(_cfg("fedavg", "head"), tmp_path, progress=False)
    frozen = sim.algo.algorithm.frozen
    key = next(k for k in frozen.keys if k.endswith("weight"))
    with torch.no_grad():
        sim.model.state_dict()[key].add_(1e-3)
    with pytest.raises(FedshiftError, match="changed 1 frozen tensor"):
        frozen.at_end(sim.server, sim.model)


def test_every_tensor_trains_by_default(tmp_path):
    sim = Simulation(_cfg("fedavg", "all"), tmp_path, progress=False)
    assert not sim.algo.algorithm.frozen
    assert sim.algo.algorithm.frozen.at_end(sim.server, sim.model) is None
    assert all(p.requires_grad for p in sim.model.parameters())


def test_the_modes_name_their_keys(tmp_path):
    model = Simulation(_cfg("fedavg", "all"), tmp_path, progress=False).model
    keys = list(model.state_dict())
    head = frozen_keys(model, "head")
    assert [k for k in keys if k not in head] == ["classifier.weight", "classifier.bias"]
    bn = set(keys) - set(frozen_keys(model, "bn"))
    assert bn and all(".bn." in k for k in bn)
    both = set(keys) - set(frozen_keys(model, "bn+head"))
    assert both == bn | {"classifier.weight", "classifier.bias"}
    with pytest.raises(ConfigError, match="'train.trainable'"):
        Frozen(model, "everything")


@pytest.mark.parametrize("mode", ["adapters", "lora"])
def test_added_layers_start_as_the_identity(tmp_path, mode):
    """Adapters and LoRA start as the model they are added to: the same outputs as the
    model built without them (same seed, so the same backbone), before any training."""
    sim = Simulation(_cfg("fedavg", "all"), tmp_path / "all", progress=False)
    base = sim.model
    added = Simulation(_cfg("fedavg", mode), tmp_path / mode, progress=False).model
    assert set(base.state_dict()) < set(added.state_dict())
    for k, v in base.state_dict().items():
        assert torch.equal(added.state_dict()[k], v), k
    x = torch.rand(5, *sim.fed.input_shape)
    base.eval()
    added.eval()
    with torch.no_grad():
        assert torch.equal(added(x), base(x))
    trained = set(added.state_dict()) - set(Frozen(added, mode).keys)
    assert any(k.startswith(f"{mode}.") for k in trained)
    assert {"classifier.weight", "classifier.bias"} <= trained


def test_adapters_name_their_stages(tmp_path):
    def cfg(stages: str):
        return toy_cfg(*TINY, "train.trainable=adapters", f"train.adapter_stages=[{stages}]",
                       rounds=ROUNDS)  # fmt: skip

    sim = Simulation(cfg("conv2"), tmp_path, progress=False)
    assert list(sim.model.adapters) == ["conv2"]
    with pytest.raises(ConfigError, match="'train.adapter_stages'.*nope"):
        Simulation(cfg("nope"), tmp_path / "bad", progress=False)


def test_lora_refuses_a_model_without_plain_layers():
    """LoRA takes plain ``nn.Linear`` and ungrouped ``nn.Conv2d`` outside the classifier only:
    a model whose only convolution is grouped (depthwise) is refused in one line naming the
    key and the modes that work."""
    from torch import nn

    from fedshift.models.base import FedModel
    from fedshift.models.peft import add_lora

    class Depthwise(FedModel):
        def __init__(self) -> None:
            super().__init__()
            self.stages = nn.ModuleDict({"dw": nn.Conv2d(4, 4, 3, groups=4)})
            self.embed = nn.Flatten()
            self.classifier = nn.Linear(4, 2)

    with pytest.raises(ConfigError) as e:
        add_lora(Depthwise(), rank=2)
    msg = str(e.value)
    assert "'train.trainable=lora'" in msg and "train.trainable=adapters" in msg
    assert "Conv2d" in msg and "\n" not in msg


def test_lora_on_efficientnet_starts_as_the_identity_and_trains():
    """EfficientNet-Lite0 pads TF "SAME" in a step of its own (``SamePad``) before plain
    convolutions: LoRA wraps its 33 ungrouped ones (stem, 15 expand, 16 project, top) and none
    of its 16 depthwise ones, the model with LoRA computes the same bits as without it on an
    odd-sized image (asymmetric padding on the way), and a few steps on the LoRA tensors
    (the backbone frozen) change its output."""
    import copy

    from torch import nn

    from fedshift.models.efficientnet import EfficientNetLite0
    from fedshift.models.peft import add_lora, added_layers_rng

    torch.manual_seed(0)
    base = EfficientNetLite0(num_classes=3).eval()
    model = copy.deepcopy(base)
    with added_layers_rng(0, "lora"):
        n = add_lora(model, rank=2)
    grouped = [m for m in model.modules() if isinstance(m, nn.Conv2d) and m.groups > 1]
    assert n == 33 and len(grouped) == 16
    assert not any("depthwise" in k for k in model.lora)
    x = torch.rand(4, 3, 45, 37, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(model.eval()(x), base(x))
    trained = [p for k, p in model.named_parameters() if k.startswith("lora.")]
    for k, p in model.named_parameters():
        p.requires_grad_(k.startswith("lora."))
    opt = torch.optim.SGD(trained, lr=0.5)
    y = torch.tensor([0, 1, 2, 0])
    model.train()
    for _ in range(3):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    with torch.no_grad():
        assert not torch.equal(model.eval()(x), base(x))
    for k, v in base.state_dict().items():  # the backbone's tensors stay as built
        if "running" not in k and "num_batches" not in k:
            assert torch.equal(model.state_dict()[k], v), k
