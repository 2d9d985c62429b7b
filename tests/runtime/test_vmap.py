"""Issue 16: the vectorised executor (``run.executor=vmap``) and the device path.

vmap trains a round's clients together; it must equal the sequential executor up to float
rounding (batched convolutions sum in another order), for clients with different step counts
and trailing batches, with BN buffers, momentum and weight decay, and refuse what it cannot
compute that way. No GPU is needed: the executor's logic is the same on a CPU (where it is
slower), and the data placement is checked on torch's ``meta`` device."""

from __future__ import annotations

import os

import pytest
import torch
from conftest import metric_rows, toy_cfg

from fedshift.bench import config_digest
from fedshift.core.config import TrainConfig
from fedshift.core.errors import ConfigError
from fedshift.data import load_dataset
from fedshift.models import build_model
from fedshift.runtime import device as device_mod
from fedshift.runtime.rundir.checkpoint_io import read_checkpoint
from fedshift.runtime.simulation import run_experiment
from fedshift.runtime.transports import make_transport
from fedshift.runtime.vmap import VmapTransport, train_stacked

pytestmark = pytest.mark.usefixtures("one_thread")

#: uneven clients: a Dirichlet split gives the clients 13 to 26 examples, so 2 or 3 steps
#: and trailing batches of 3 to 8 (several vectorised groups per step). No trailing batch of
#: 2: BatchNorm over two examples is so ill-conditioned that rounding differences (1e-7)
#: grow to 1e-1 within a few steps, in any two ways of summing (threads too)
UNEVEN = (
    "dataset.clients=2",
    "dataset.train_size=48",
    "dataset.val_size=6",
    "dataset.test_size=6",
    "partition.name=dirichlet",
    "partition.clients=5",
    "partition.alpha=0.5",
    "model.name=cnn",
    "model.width=4",
    "train.batch_size=10",
)


def _close(a, b, where: str = "") -> None:
    """Equal metric rows up to float rounding as it grows over a round of training: every
    number within 2e-3 (relative; measured: up to 3e-4). On this saturated toy data (pixels
    clamped to [0, 1]) the first convolution's weight gradient is a sum of terms that nearly
    cancel, so a reordered sum (vmap's batched kernels, or the sequential executor at two
    threads: measured, the same deviations) moves it by up to 2 %, and later steps carry
    that on. A wrong batch, BN buffer or update is off by 1e-2 or more; the SGD step itself
    is checked to 1e-5 below."""
    if isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            _close(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, float):
        assert b == pytest.approx(a, rel=2e-3, abs=1e-4), where
    else:
        assert a == b, where


CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
DEVICES = ["cpu", pytest.param("cuda", marks=CUDA)]


def _pair(tmp_path, *over: str, rounds: int = 1, device: str = "cpu"):
    out = {}
    for ex in ("sequential", "vmap"):
        cfg = toy_cfg(
            *UNEVEN, *over, f"run.executor={ex}", f"name={ex}", f"device={device}", rounds=rounds
        )
        out[ex] = run_experiment(cfg, tmp_path, progress=False)
    return out


def _same_weights(a, b) -> None:
    """Two runs' final server weights equal up to the rounding :func:`_close` allows."""
    wa = read_checkpoint(a.run_dir / "checkpoint.pt")["server"]["weights"]
    wb = read_checkpoint(b.run_dir / "checkpoint.pt")["server"]["weights"]
    for k in wa:
        assert torch.allclose(wa[k].float().cpu(), wb[k].float().cpu(), atol=5e-3, rtol=1e-3), k


@pytest.mark.parametrize(
    "over",
    [
        ("algorithm.name=fedavg", "train.momentum=0.9", "train.weight_decay=0.001"),
        ("algorithm.name=fedbn", "train.local_epochs=2"),
        ("algorithm.name=fedavgm",),
        ("algorithm.name=fedrdn",),  # an input-level augment (its statistics, set-up round)
        ("algorithm.name=fedavg", "augment=[mixup]", "federation.sample_fraction=0.6"),
        ("algorithm.name=fedavg", "augment=[ampnorm]"),  # records received every round
    ],
    ids=[
        "fedavg-momentum-wd",
        "fedbn-2-epochs",
        "fedavgm",
        "fedrdn",
        "mixup-sampled",
        "ampnorm",
    ],  # fmt: skip
)
@pytest.mark.parametrize("device", DEVICES)
def test_vmap_equals_sequential_up_to_rounding(tmp_path, over, device):
    runs = _pair(tmp_path, *over, device=device)
    seq, vm = (metric_rows(runs[k].run_dir) for k in ("sequential", "vmap"))
    assert len(seq) == len(vm) > 0
    for a, b in zip(seq, vm, strict=True):
        _close(a, b)
    _same_weights(runs["sequential"], runs["vmap"])
    assert runs["vmap"].summary["runtime"]["executor"] == "vmap"
    assert runs["sequential"].summary["runtime"]["executor"] == "sequential"
    assert runs["vmap"].summary["runtime"]["device"].startswith(device)


# ---------------------------------------------------------------------------- on a GPU
#: algorithms with BN buffers kept per client, model-level augments, Fourier amplitudes and
#: weight perturbation, federation statistics: the GPU checks below run each
GPU_RUNS = [
    ("algorithm.name=fedavg", "train.momentum=0.9"),
    ("algorithm.name=fedbn", "augment=[ffa]"),
    ("algorithm.name=harmofl",),
    ("algorithm.name=fedrdn",),
    ("algorithm.name=scaffold",),
]


@CUDA
@pytest.mark.parametrize("over", GPU_RUNS, ids=lambda o: " ".join(o))
def test_cuda_run_repeats_bit_for_bit(tmp_path, over):
    """``run.deterministic`` (default): the same config twice on one GPU gives the same
    metric rows and the same weights, to the last bit."""
    runs = [
        run_experiment(toy_cfg(*UNEVEN, *over, "device=cuda", f"name=r{i}", rounds=2), tmp_path,
                       progress=False)
        for i in range(2)
    ]  # fmt: skip
    assert metric_rows(runs[0].run_dir) == metric_rows(runs[1].run_dir)
    w = [read_checkpoint(r.run_dir / "checkpoint.pt")["server"]["weights"] for r in runs]
    assert all(torch.equal(w[0][k], w[1][k]) for k in w[0])
    assert runs[0].summary["runtime"]["deterministic"] is True
    assert runs[0].summary["runtime"]["tf32"] is False


#: HarmoFL (amplitude normalisation and weight perturbation together) amplifies rounding on
#: this data: its round-1 train loss moves by up to 1e-2 between two CPU convolution kernels
#: (oneDNN on and off), 1.5e-4 between one and two threads, and 2.5e-3 between the CPU and a
#: GPU (an H100 and an H200), while each part alone moves by under 1e-5 in all three. So
#: HarmoFL is checked on the GPU by its repeat bit for bit (above) and here by its two parts:
#: amplitude normalisation (``ampnorm``) and weight perturbation (``fedsam``), each measured
#: within 1e-6 of the CPU on an H200.
CPU_GPU_RUNS = [
    *(o for o in GPU_RUNS if "augment=[ffa]" not in o and o != ("algorithm.name=harmofl",)),
    ("algorithm.name=fedavg", "augment=[ampnorm]"),
    ("algorithm.name=fedsam",),
]


@CUDA
@pytest.mark.parametrize("over", CPU_GPU_RUNS, ids=lambda o: " ".join(o))
def test_cuda_equals_cpu_up_to_rounding(tmp_path, over):
    """A GPU run computes what the CPU run computes (float32, TF32 off), up to the rounding
    that another summation order gives (:func:`_close`; one round, as for vmap: rounding
    grows with training on this saturated data). FFA's noise is drawn on the device, from
    CUDA's generator (docs/ARCHITECTURE.md), so a FedFA run is compared with itself only."""
    runs = {
        d: run_experiment(toy_cfg(*UNEVEN, *over, f"device={d}", f"name={d}", rounds=1),
                          tmp_path, progress=False)
        for d in ("cpu", "cuda")
    }  # fmt: skip
    for a, b in zip(*(metric_rows(r.run_dir) for r in runs.values()), strict=True):
        _close(a, b)
    _same_weights(runs["cpu"], runs["cuda"])
    assert runs["cuda"].summary["runtime"]["data"] == "device"


@CUDA
def test_cuda_extension_equals_the_longer_run(tmp_path):
    """A GPU run stopped after round 2 and resumed to round 4 ends bit for bit where the
    4-round run ends (checkpointed RNG and optimiser state restored on the device)."""
    from fedshift.runtime.simulation import resume_experiment

    over = (*UNEVEN, "algorithm.name=fedbn", "train.momentum=0.9",
            "train.optimizer_state=persist", "device=cuda")  # fmt: skip
    full = run_experiment(toy_cfg(*over, "name=full", rounds=4), tmp_path, progress=False)
    short = run_experiment(toy_cfg(*over, "name=short", rounds=2), tmp_path, progress=False)
    ext = resume_experiment(short.run_dir, progress=False, rounds=4)
    assert metric_rows(ext.run_dir) == metric_rows(full.run_dir)


def _sgd_per_client(model, starts, batches, train: TrainConfig):
    """The reference: ``torch.optim.SGD`` on each client in turn, with its mean loss."""
    finals, losses = [], []
    for start, bs in zip(starts, batches, strict=True):
        model.load_state_dict(start)
        model.train()
        opt = torch.optim.SGD(
            model.parameters(),
            lr=train.lr,
            momentum=train.momentum,
            weight_decay=train.weight_decay,
        )
        total = 0.0
        for x, y in bs:
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            total += float(loss.detach())
        finals.append({k: v.detach().clone() for k, v in model.state_dict().items()})
        losses.append(total / max(len(bs), 1))
    return finals, losses


def _as64(state: dict) -> dict:
    return {k: v.double() if v.is_floating_point() else v.clone() for k, v in state.items()}


@pytest.mark.numerics
def test_train_stacked_is_sgd_per_client():
    """The stacked step is ``torch.optim.SGD`` on each client, for clients of different step
    counts and batch sizes (the BN buffers included).

    In float64 both sum in their own orders with 2^-53 rounding, so they agree to 1e-9
    relative, while a missing weight-decay or momentum term is off by about 1e-3. In float32
    the batched and unbatched kernels round differently (by how much depends on the CPU's
    kernel path), so the stacked result is held to the float64 reference no further than
    8 times the float32 loop's own rounding error (plus 16 float32 ulps of the weights)."""
    torch.manual_seed(0)
    model = build_model({"name": "cnn", "width": 4}, 10, (3, 28, 28), "classification")
    train = TrainConfig(lr=0.05, momentum=0.9, weight_decay=0.01)
    starts, batches = [], []
    for i, sizes in enumerate([(5, 5, 3), (5,), (5, 2), ()]):
        torch.manual_seed(i)
        for p in model.parameters():
            p.data.add_(0.01 * torch.randn_like(p))
        starts.append({k: v.detach().clone() for k, v in model.state_dict().items()})
        batches.append([(torch.randn(n, 3, 28, 28), torch.randint(0, 10, (n,))) for n in sizes])
    loss_fn = torch.nn.functional.cross_entropy
    model64 = build_model({"name": "cnn", "width": 4}, 10, (3, 28, 28), "classification").double()
    starts64 = [_as64(s) for s in starts]
    batches64 = [[(x.double(), y) for x, y in bs] for bs in batches]
    finals64, losses64 = train_stacked(model64, loss_fn, train, starts64, batches64)
    ref64, ref_losses64 = _sgd_per_client(model64, starts64, batches64, train)
    finals32, losses32 = train_stacked(model, loss_fn, train, starts, batches)
    ref32, _ = _sgd_per_client(model, starts, batches, train)
    eps32 = torch.finfo(torch.float32).eps
    for i, bs in enumerate(batches):
        # the stacked loss is accumulated in float32 (its returned dtype)
        assert losses64[i] == pytest.approx(ref_losses64[i], rel=4 * eps32, abs=1e-12)
        assert losses32[i] == pytest.approx(ref_losses64[i], rel=64 * eps32, abs=1e-6)
        for k, want in ref64[i].items():
            assert torch.allclose(finals64[i][k], want, rtol=1e-9, atol=1e-12), k
            if not want.is_floating_point():
                assert torch.equal(finals32[i][k], ref32[i][k]), k  # step counters
                continue
            own = (ref32[i][k].double() - want).abs().max()
            err = (finals32[i][k].double() - want).abs().max()
            tol = 8 * own + 16 * eps32 * want.abs().max()
            assert err <= tol, f"client {i} {k}: {err:.3g} > {tol:.3g}"
        if not bs:  # no step: the start, untouched
            assert all(torch.equal(starts[i][k], finals32[i][k]) for k in starts[i])


@pytest.mark.parametrize(
    ("over", "says"),
    [
        (("algorithm.name=fedprox",), "'fedprox'"),
        (("algorithm.name=scaffold",), "'local_update'"),
        (("algorithm.name=fedsam",), "SAM"),
        (("augment=[ffa]",), "augment 'ffa'"),
        (("augment=[mixstyle]",), "augment 'mixstyle'"),
        (("train.optimizer=adam",), "train.optimizer=sgd"),
        (("train.optimizer_state=persist",), "optimizer_state"),
        (("run.workers=2",), "run.workers"),
    ],
)
def test_vmap_refuses_what_it_cannot_compute(tmp_path, over, says):
    cfg = toy_cfg(*UNEVEN, "run.executor=vmap", *over, rounds=1)
    with pytest.raises(ConfigError, match="run.executor") as e:
        run_experiment(cfg, tmp_path, progress=False)
    assert says in str(e.value)
    assert "run.executor=sequential" in str(e.value) or "run.workers=1" in str(e.value)


def test_vmap_transport_and_digest():
    cfg = toy_cfg("run.executor=vmap", "run.workers=auto")
    assert isinstance(make_transport(cfg), VmapTransport)  # auto: one process
    seq = toy_cfg()
    assert config_digest(seq) != config_digest(cfg)  # rounding differs: another cell
    assert config_digest(seq) == config_digest(toy_cfg("run.executor=sequential"))


# ---------------------------------------------------------------------------- the device path
def test_resolve_device():
    want = "cuda" if torch.cuda.is_available() else "cpu"
    assert device_mod.resolve_device("auto").type == want
    assert device_mod.resolve_device("cpu") == torch.device("cpu")
    for bad, says in [("gpu0", "device"), ("mps", "not supported")]:
        with pytest.raises(ConfigError, match=says):
            device_mod.resolve_device(bad)
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="CUDA is not available"):
            device_mod.resolve_device("cuda")


def test_place_data_resident_or_host(monkeypatch):
    """``run.data``: the splits copied to the device once (``device``; ``auto`` when they fit
    in half the free memory) or left in host memory; checked on the ``meta`` device."""
    fed = load_dataset({"name": "toyshift", "clients": 2, "train_size": 8})
    cpu = torch.device("cpu")
    assert device_mod.place_data(fed, cpu, "device") == (fed, "host")  # a CPU run: as is
    meta = torch.device("meta")
    need = device_mod.data_bytes(fed)
    monkeypatch.setattr(device_mod, "_free_bytes", lambda d: 4 * need)
    placed, where = device_mod.place_data(fed, meta, "auto")
    assert where == "device"
    assert all(s.x.is_meta and s.y.is_meta for c in placed.clients for s in (c.train, c.test))
    assert placed.client_names == fed.client_names and fed.clients[0].train.x.device == cpu
    monkeypatch.setattr(device_mod, "_free_bytes", lambda d: need)  # half of it: too little
    assert device_mod.place_data(fed, meta, "auto") == (fed, "host")
    assert device_mod.place_data(fed, meta, "host") == (fed, "host")
    assert device_mod.place_data(fed, meta, "device")[1] == "device"  # asked: always


def test_deterministic_mode_and_tf32_settings(monkeypatch):
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    assert device_mod.set_precision(torch.device("cpu"), True, True) == {}
    assert "CUBLAS_WORKSPACE_CONFIG" not in os.environ
    before = (torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.benchmark,
              torch.backends.cudnn.deterministic, torch.backends.cudnn.allow_tf32,
              torch.backends.cuda.matmul.allow_tf32)  # fmt: skip
    try:
        got = device_mod.set_precision(torch.device("cuda"), True, False)
        assert got == {"deterministic": True, "cublas_workspace": ":4096:8", "tf32": False}
        assert torch.are_deterministic_algorithms_enabled()
        assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
        # PyTorch's default lets cuDNN convolutions use TF32: a run turns it off
        assert not torch.backends.cudnn.allow_tf32
        assert not torch.backends.cuda.matmul.allow_tf32
        got = device_mod.set_precision(torch.device("cuda"), False, True)
        assert not torch.are_deterministic_algorithms_enabled() and got["tf32"]
        assert torch.backends.cudnn.allow_tf32 and torch.backends.cuda.matmul.allow_tf32
    finally:
        torch.use_deterministic_algorithms(before[0])
        (
            torch.backends.cudnn.benchmark,
            torch.backends.cudnn.deterministic,
            torch.backends.cudnn.allow_tf32,
            torch.backends.cuda.matmul.allow_tf32,
        ) = before[1:]


def test_tf32_enters_the_digest_only_when_on():
    off, on = toy_cfg(), toy_cfg("run.tf32=true")
    assert config_digest(off) == config_digest(toy_cfg("run.tf32=false"))
    assert config_digest(on) != config_digest(off)


def test_vmap_and_gpu_cells_get_one_process_in_a_suite(monkeypatch):
    """Bench shares the cores among cells' workers: a vmap cell (one vectorised process) and
    a GPU cell get one process each, whatever the cores left; ``device=auto`` counts as a GPU
    only where CUDA is available."""
    from types import SimpleNamespace

    from fedshift.runtime import cores

    monkeypatch.setattr(cores, "usable_cores", lambda: 8)
    cells = [
        SimpleNamespace(cfg=toy_cfg(*over), run_dir=name)
        for name, over in [
            ("cpu", ("run.workers=auto",)),
            ("vmap", ("run.workers=auto", "run.executor=vmap")),
            ("auto", ("run.workers=auto", "device=auto")),
        ]
    ]
    n, per_cell = cores.share_cores(cells, workers=2)
    assert n == 2 and per_cell["cpu"] == 4 and per_cell["vmap"] == 1
    assert per_cell["auto"] == (1 if torch.cuda.is_available() else 4)
    assert cores.on_gpu("cuda:0") and not cores.on_gpu("cpu")
