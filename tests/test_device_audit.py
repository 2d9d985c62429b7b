"""Issue 16, the device path: a static audit of the code that runs on a GPU with the data
and the model (``device=cuda``): algorithms, augments, the client context, the tasks'
metrics, the models and the protocols.

No GPU is needed: the modules' source is scanned (``ast``) for

* tensor factories (``torch.zeros``, ``torch.tensor``, ``torch.rand``, ...) without
  ``device=`` whose result is not moved at once (``torch.randperm(n, generator=g).to(dev)``):
  a tensor made on the host and then combined with a batch or the model's tensors raises
  "Expected all tensors to be on the same device" on a GPU;
* host syncs (``float``/``int``/``bool``/``.item()``/``.tolist()``/``.numpy()``/``.cpu()``) in
  the per-batch code: the augments' and algorithms' hooks (``train_batch``, ``loss``,
  ``forward``, ...) and the bodies of loops over ``ctx.batches()`` or over
  ``range(0, n, batch_size)`` (evaluation, prototypes, embeddings);
* random draws from a (CPU) generator asked to produce on another device than the
  generator's (``torch.rand(..., generator=g, device=x.device)`` fails on a GPU).

Every finding is either fixed or in :data:`ALLOWED` with the reviewed reason it is safe.

What it cannot catch: a host tensor that does not come from a factory call in these files
(``.cpu()`` results, ``bincount`` of host labels, a helper elsewhere, a record received on
the host), a mix of devices through variables (it checks where a tensor is made, not where
it meets another: FedAwS's ``torch.equal`` of resident labels with the server's host record
was found by reading, not by this scan), host syncs outside the per-batch code, calls
through aliases (``from torch import zeros``) or ``**kwargs``, ops that raise on a GPU for
other reasons (deterministic mode: see the pooling and cross-entropy tests below), and
anything outside the scanned modules (runtime/, data/, flower/). The runs on a GPU at the
end (every algorithm and augment, skipped without CUDA) are the check for the rest.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch
from conftest import toy_cfg

ROOT = Path(__file__).resolve().parents[1] / "src" / "fedshift"

#: the modules audited (models/__init__.py only builds models, on the host, before
#: ``.to(device)``)
FILES = sorted(
    [
        *ROOT.glob("algorithms/**/*.py"),
        *ROOT.glob("augment/*.py"),
        ROOT / "core" / "context.py",
        ROOT / "core" / "tasks.py",
        *[p for p in ROOT.glob("models/*.py") if p.name != "__init__.py"],
        *ROOT.glob("protocols/*.py"),
    ]
)

FACTORIES = frozenset({
    "zeros", "ones", "tensor", "as_tensor", "from_numpy", "full", "empty", "eye", "arange",
    "linspace", "logspace", "rand", "randn", "randint", "randperm", "normal", "bernoulli",
})  # fmt: skip
#: functions that run for every batch (and the closures installed as stage hooks)
HOT = frozenset({
    "train_batch", "eval_batch", "loss", "penalty", "before_step", "forward", "hook",
    "_pre_hook", "_post_hook", "sam_second_pass",
})  # fmt: skip
SYNC_CALLS = frozenset({"float", "int", "bool"})
SYNC_METHODS = frozenset({"item", "tolist", "numpy", "cpu"})
#: methods that put their receiver on a device (``.to(x.device)``, ``.to(x)``)
PLACING = frozenset({"to", "cuda"})

#: (file, function, call) -> why it is device-safe (reviewed)
ALLOWED: dict[tuple[str, str, str], str] = {
    ("protocols/new_site.py", "select_shots", "randperm"):
        "the labels are moved to the host first; a CPU generator picks the same shots on "
        "every device",
    # -- host-side values by design (moved with .to() where they meet device tensors)
    ("protocols/privacy.py", "domain_images", "as_tensor"):
        "the attacks on records computed from images run on the host (per-image features, "
        "phase retrieval, torchmetrics scores): a domain's images are copied there once",
    ("protocols/privacy.py", "_property", "randperm"):
        "host-side sites drawn from host images with a CPU generator (same sites on any device)",
    ("protocols/privacy.py", "_reconstruct", "randperm"):
        "host-side sites drawn from host images with a CPU generator (same sites on any device)",
    ("protocols/privacy.py", "_property", "randn"):
        "a protected record's noise, on the host record of host images (CPU generator)",
    ("protocols/privacy.py", "leakage_png", "tensor"):
        "a standard deviation for a plot's error bars, from Python floats",
    ("protocols/privacy_runs.py", "_split", "as_tensor"):
        "a site's images on the host; each batch moves to the run's device where the model "
        "reads it (_losses, _features)",
    ("algorithms/adcol.py", "ADCOLServer.server_vars", "randint"):
        "the discriminator's seed drawn from the global CPU RNG, turned into a Python int",
    ("algorithms/distrans/algorithm.py", "DisTransClient.wrap_model", "randint"):
        "a seed drawn from the global CPU RNG, turned into a Python int",
    ("augment/fedrdn.py", "Norm.site_state", "tensor"):
        "the fixed constants as host state of an exported predictor (buffers it carries; "
        "train_batch and the export move them with .to(x.device))",
    ("algorithms/fedaws.py", "FedAwS.broadcast", "tensor"):
        "class ids sent as a host record; indexing uses classes.to(w.device)",
    ("algorithms/fedproto.py", "aggregate_prototypes", "zeros"):
        "host weight totals; moved with .to(acc.device) where they meet the prototypes",
    ("algorithms/partialfed.py", "relaxed_gates", "rand"):
        "the gate logits live on the host (CPU generator, float64); never meet the model",
    ("algorithms/partialfed.py", "PartialFed.client_vars", "zeros"):
        "host gate logits (float64), updated on the host in before_step",
    ("algorithms/partialfed.py", "PartialFed._adaptive_start", "randint"):
        "a seed drawn from the client's CPU generator, turned into a Python int",
    ("algorithms/partialfed.py", "PartialFed.before_step", "tensor"):
        "host gate gradient from Python floats; combined with the host gate logits only",
    ("algorithms/partialfed.py", "PartialFed.before_step", "float"):
        "once per round (the gate update runs on the first step only)",
    ("augment/cfsi.py", "CFSI._own_amplitudes", "zeros"):
        "the client's own spectra are host state (the other branch .cpu()s them): an empty "
        "upload when the client has no training images",
    ("augment/cfsi.py", "CFSI.train_batch", "randint"):
        "source client and amplitude indices drawn on the CPU generator, turned into Python "
        "ints that pick host bank tensors (the picked spectra are moved in interpolate)",
    ("augment/cfsi.py", "CFSI.train_batch", "tolist"):
        "as CFSI.train_batch/randint: a CPU draw, no device sync",
    ("augment/cfsi.py", "CFSI.train_batch", "int"):
        "as CFSI.train_batch/randint: a CPU draw, no device sync",
    ("augment/fedrdn.py", "FedRDN.train_batch", "randint"):
        "draw=released: 0-dim CPU indices (a GPU tensor accepts them as indices)",
    ("augment/ffa.py", "FFALayer._draw_fires", "rand"):
        "a CPU scalar draw compared on the host (bool), no device tensor involved",
    ("augment/ffa.py", "_zeros_ones", "zeros"):
        "FFA's exchanged statistics are host tensors (receive/reply use .cpu()); copied "
        "into the layers' device buffers with copy_",
    ("augment/ffa.py", "_zeros_ones", "full"): "as _zeros_ones/zeros",
    ("augment/mixing.py", "sample_beta", "randint"):
        "a seed drawn from the CPU generator, turned into a Python int",
    ("augment/mixing.py", "uniform", "rand"): "a CPU scalar draw turned into a Python float",
    ("augment/mixing.py", "Mixup.train_batch", "float"): "a NumPy Beta draw, no device",
    ("augment/mixing.py", "ManifoldMixup.train_batch", "int"):
        "int() of a CPU generator draw, no device",
    ("augment/mixing.py", "ManifoldMixup.train_batch", "randint"):
        "the layer index drawn on the CPU generator, turned into a Python int",
    ("augment/mixing.py", "ManifoldMixup.train_batch", "float"): "a NumPy Beta draw, no device",
    ("protocols/tsne.py", "subsample", "arange"):
        "host indices of the images to embed (a GPU tensor accepts host indices)",
    ("protocols/tsne.py", "subsample", "randperm"): "as subsample/arange",
}  # fmt: skip


def _parents(tree: ast.AST) -> dict[ast.AST, ast.AST]:
    return {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}


def _placed(call: ast.Call, parents: dict[ast.AST, ast.AST]) -> bool:
    """Whether the result of ``call`` goes through ``.to(...)`` / ``.cuda()`` in the same
    expression (``torch.randperm(n, generator=g).float().to(x.device)``)."""
    node: ast.AST = call
    while True:
        attr = parents.get(node)
        if not isinstance(attr, ast.Attribute) or attr.value is not node:
            return False
        outer = parents.get(attr)
        if not isinstance(outer, ast.Call) or outer.func is not attr:
            return False
        if attr.attr in PLACING:
            return True
        node = outer


def _per_batch(it: ast.AST) -> bool:
    """Whether a ``for`` loop runs once per batch: over ``ctx.batches()``, or over
    ``range(start, n, batch_size)`` (evaluation, prototypes, embeddings)."""
    if "batches(" in ast.unparse(it):
        return True
    if isinstance(it, ast.Call) and ast.unparse(it.func) == "range" and len(it.args) == 3:
        step = ast.unparse(it.args[2])
        return "batch" in step or step in ("bs", "b")
    return False


def _aliases(func: ast.AST) -> dict[str, str]:
    """Names assigned in ``func`` -> the source of their value (``dev = generator.device``,
    also element-wise for tuple assignments)."""
    out: dict[str, str] = {}
    for node in ast.walk(func):
        if not isinstance(node, ast.Assign):
            continue
        for target in node.targets:
            if isinstance(target, ast.Name):
                out[target.id] = ast.unparse(node.value)
            elif isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple):
                for t, v in zip(target.elts, node.value.elts, strict=False):
                    if isinstance(t, ast.Name):
                        out[t.id] = ast.unparse(v)
    return out


class _Scan(ast.NodeVisitor):
    """The findings of one module: ``(kind, file, function, call, line)``."""

    def __init__(self, rel: str, tree: ast.AST) -> None:
        self.rel = rel
        self.parents = _parents(tree)
        self.stack: list[str] = []
        self.funcs: list[ast.AST] = []
        self.batch_loops = 0
        self.found: list[tuple[str, str, str, str, int]] = []

    def _where(self) -> str:
        return ".".join(self.stack) or "<module>"

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self.stack.append(node.name)
        self.generic_visit(node)
        self.stack.pop()

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self.stack.append(node.name)
        self.funcs.append(node)
        loops, self.batch_loops = self.batch_loops, 0
        self.generic_visit(node)
        self.batch_loops = loops
        self.funcs.pop()
        self.stack.pop()

    visit_AsyncFunctionDef = visit_FunctionDef  # type: ignore[assignment]

    def visit_For(self, node: ast.For) -> None:
        self.visit(node.iter)
        per_batch = _per_batch(node.iter)
        self.batch_loops += per_batch
        for child in [node.target, *node.body, *node.orelse]:
            self.visit(child)
        self.batch_loops -= per_batch

    def visit_Call(self, node: ast.Call) -> None:
        f, where = node.func, self._where()
        kws = {k.arg: k.value for k in node.keywords}
        is_torch = isinstance(f, ast.Attribute) and ast.unparse(f.value) == "torch"
        if is_torch and f.attr in FACTORIES:
            if "device" not in kws and not _placed(node, self.parents):
                self.found.append(("factory", self.rel, where, f.attr, node.lineno))
            if "generator" in kws and "device" in kws:
                self._check_generator_device(node, kws, where, f.attr)
        hot = (self.stack and self.stack[-1] in HOT) or self.batch_loops > 0
        if hot:
            if isinstance(f, ast.Name) and f.id in SYNC_CALLS:
                self.found.append(("sync", self.rel, where, f.id, node.lineno))
            elif isinstance(f, ast.Attribute) and f.attr in SYNC_METHODS:
                self.found.append(("sync", self.rel, where, f.attr, node.lineno))
        self.generic_visit(node)

    def _check_generator_device(self, node: ast.Call, kws: dict, where: str, name: str) -> None:
        """A draw from ``generator=g`` with ``device=`` must ask for ``g.device`` or the CPU
        (a CPU generator cannot draw on a GPU)."""
        gen, dev = ast.unparse(kws["generator"]), kws["device"]
        src = ast.unparse(dev)
        if isinstance(dev, ast.Name) and self.funcs:
            src = _aliases(self.funcs[-1]).get(dev.id, src)
        if src not in (f"{gen}.device", "'cpu'", '"cpu"'):
            self.found.append(("generator-device", self.rel, where, name, node.lineno))


def scan(source: str, rel: str = "<source>") -> list[tuple[str, str, str, str, int]]:
    tree = ast.parse(source)
    s = _Scan(rel, tree)
    s.visit(tree)
    return s.found


def audit() -> list[tuple[str, str, str, str, int]]:
    out = []
    for path in FILES:
        out += scan(path.read_text(), str(path.relative_to(ROOT)))
    return out


# ---------------------------------------------------------------------------- the audit
def test_device_audit_no_host_tensors_in_device_code():
    """Every host tensor factory / per-batch host sync / off-device generator draw in the
    GPU-path modules is fixed or allowed with a reviewed reason (issue 16, device path)."""
    bad = [f for f in audit() if f[0] == "generator-device" or f[1:4] not in ALLOWED]
    assert not bad, "\n".join(
        f"{file}:{line} {where}: {kind} {call}(...) (create it on the batch's/model's device, "
        "draw on the CPU generator then .to(device), or add a reviewed reason to ALLOWED)"
        for kind, file, where, call, line in bad
    )


def test_device_audit_allow_list_is_not_stale():
    """Every ALLOWED entry still matches a call (a fixed or moved call leaves the list)."""
    seen = {f[1:4] for f in audit()}
    assert not [k for k in ALLOWED if k not in seen]


def test_device_audit_scanner_flags_known_bad_code():
    """The scanner finds the GPU failures it is meant to find (and passes placed code)."""
    bad = """
import torch
def channel_statistics(x):
    mean = torch.zeros(x.shape[1])                                   # host, then += x
    return mean + x.mean((0, 2, 3))
class A:
    def train_batch(self, x, y, state, generator):
        noise = torch.rand(x.shape, generator=generator, device=x.device)  # CPU gen on GPU
        return x + noise, y
    def loss(self, ctx, x, y):
        return float(x.sum())                                        # sync per batch
    def local_train(self, ctx, state):
        for x, y in ctx.batches():
            total = x.sum().item()                                   # sync per batch
"""
    got = {(kind, where, call) for kind, _, where, call, _ in scan(bad)}
    assert got == {
        ("factory", "channel_statistics", "zeros"),
        ("generator-device", "A.train_batch", "rand"),
        ("sync", "A.loss", "float"),
        ("sync", "A.local_train", "item"),
    }
    good = """
import torch
def f(x, g):
    n, dev = x.shape[0], g.device
    a = torch.zeros(3, device=x.device)
    b = torch.randperm(4, generator=g).float().to(x.device)
    c = torch.rand(4, generator=g, device=dev)
    d = torch.rand(4, generator=g, device="cpu").to(x.device)
    return a, b, c, d
"""
    assert scan(good) == []


# ---------------------------------------------------------------------------- deterministic mode
def test_device_audit_adaptive_pool_without_cuda_atomics_equals_pytorch():
    """The pooling a GPU run uses in deterministic mode (PyTorch's CUDA backward of adaptive
    average pooling raises there: ResNet, AlexNet, DenseNet) equals PyTorch's, forward and
    backward, for shrinking, growing and partly-kept sizes; on the CPU the layer is PyTorch's."""
    from fedshift.models.base import AdaptiveAvgPool2d, adaptive_avg_pool2d_matmul

    g = torch.Generator().manual_seed(0)
    for shape, out in [((2, 3, 7, 5), (3, 2)), ((2, 3, 13, 13), 6), ((1, 2, 4, 4), 1),
                       ((1, 1, 5, 6), (None, 4)), ((2, 2, 3, 3), (5, 4))]:  # fmt: skip
        x = torch.randn(*shape, generator=g, dtype=torch.float64, requires_grad=True)
        ref = torch.nn.functional.adaptive_avg_pool2d(x, out)
        got = adaptive_avg_pool2d_matmul(x, out)
        grad = torch.randn(ref.shape, generator=g, dtype=torch.float64)
        (g_ref,) = torch.autograd.grad(ref, x, grad)
        (g_got,) = torch.autograd.grad(got, x, grad)
        assert got.shape == ref.shape and torch.allclose(got, ref), (shape, out)
        assert torch.allclose(g_got, g_ref), (shape, out)
    x = torch.randn(2, 3, 9, 9, generator=g)
    assert torch.equal(AdaptiveAvgPool2d(6)(x), torch.nn.AdaptiveAvgPool2d(6)(x))


def test_device_audit_pixel_cross_entropy_without_cuda_atomics_equals_pytorch():
    """The segmentation cross-entropy a GPU run uses in deterministic mode (PyTorch's CUDA
    kernel for 2-D targets raises there) equals PyTorch's; on the CPU it is PyTorch's."""
    from fedshift.core.tasks import flat_cross_entropy, pixel_cross_entropy

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 4, 5, 6, generator=g, dtype=torch.float64, requires_grad=True)
    y = torch.randint(0, 4, (3, 5, 6), generator=g)
    ref = torch.nn.functional.cross_entropy(logits, y)
    got = flat_cross_entropy(logits, y)
    assert torch.allclose(got, ref)
    (g_ref,) = torch.autograd.grad(ref, logits)
    (g_got,) = torch.autograd.grad(got, logits)
    assert torch.allclose(g_got, g_ref)
    assert torch.equal(pixel_cross_entropy(logits, y), ref)


# ---------------------------------------------------------------------------- on a GPU
def _gpu_cases() -> list[tuple[str, ...]]:
    from support.same_run import seg_overrides

    from fedshift.algorithms import ALGORITHMS
    from fedshift.augment import AUGMENTS

    return [
        *[
            (f"algorithm.name={a}", *seg_overrides(a), *ALGORITHMS.get(a).requires)
            for a in ALGORITHMS.names()
        ],
        *[("algorithm.name=fedavg", f"augment=[{a}]") for a in AUGMENTS.names()],
        ("algorithm.name=fedavg", "augment=[{name: fedrdn, draw: released}]"),
        ("algorithm.name=fedbn", "augment=[ffa,mixstyle]", "federation.sample_fraction=0.67"),
        ("algorithm.name=harmofl", "federation.holdout=[client2]"),
        ("algorithm.name=fedavg", "model.name=resnet18"),  # adaptive pooling
    ]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("over", _gpu_cases(), ids=lambda o: " ".join(o))
def test_device_audit_every_algorithm_and_augment_runs_on_cuda(tmp_path, over):
    """Every algorithm and augment runs with the data resident on a GPU (device=cuda,
    deterministic mode)."""
    from fedshift.runtime.simulation import run_experiment

    cfg = toy_cfg(
        "device=cuda", "run.data=device", "dataset.clients=3", "dataset.train_size=12",
        "dataset.val_size=4", "dataset.test_size=4", "model.name=cnn", "model.width=4",
        "train.batch_size=4", "train.local_steps=2", *over, rounds=2,
    )  # fmt: skip
    res = run_experiment(cfg, run_dir=tmp_path / "run", progress=False, workers=1)
    assert res.summary["runtime"]["device"].startswith("cuda")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_device_audit_segmentation_runs_on_cuda(tmp_path):
    """A segmentation run (pixel cross-entropy, Dice on the device) in deterministic mode."""
    from fedshift.catalog import resolve
    from fedshift.core.config import load_config
    from fedshift.runtime.simulation import run_experiment

    cfg = resolve(load_config(None, [
        "dataset.name=toyseg", "dataset.train_size=12", "dataset.val_size=4",
        "dataset.test_size=4", "model.name=unet", "model.width=4", "train.rounds=2",
        "train.batch_size=6", "device=cuda", "run.data=device", "name=test",
    ]))  # fmt: skip
    res = run_experiment(cfg, run_dir=tmp_path / "run", progress=False, workers=1)
    assert res.summary["runtime"]["device"].startswith("cuda")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_device_audit_pool_messages_carry_gpu_tensors_through_the_host():
    """A pool message with GPU tensors: host bytes out of band, back on the GPU, shared."""
    from fedshift.runtime.pool import worker as pool_worker

    base = torch.randn(6, 5, device="cuda")
    frames = pool_worker.dumps({"w": base, "view": base[2:4, 1:]})
    assert len(frames) == 2  # the storage once, as host bytes
    got = pool_worker.loads(frames)
    assert got["w"].device == base.device and torch.equal(got["w"], base)
    assert got["view"].untyped_storage().data_ptr() == got["w"].untyped_storage().data_ptr()
