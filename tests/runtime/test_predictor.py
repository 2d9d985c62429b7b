"""Issue 49: the predictor ``fedshift export`` writes (``model.pt2``), loaded in a fresh
interpreter that cannot import fedshift, predicts what the run's own evaluation predicted,
for every registered algorithm and augment (driven by the registries, as
tests/core/test_contract.py: a new method is tested without being listed).

Each case trains a tiny federation (:func:`fedshift.testing.tiny_cfg`: two toyshift clients,
two rounds; toyseg for segmentation-only algorithms), exports its evaluated model (a
personalised model: the last client's; a global model whose evaluation transform is each
site's own, FedRDN: the last client as the site) and records, through ``score_client`` (the
function every runtime evaluates a client with) on the rebuilt run, the scores of every
test image of each client the predictor claims to reproduce; those metrics must equal the
ones the run wrote to metrics.jsonl for that round. One ``python -I`` subprocess, its cwd
outside the repository, no PYTHONPATH and ``fedshift`` blocked in ``sys.modules``, loads
every predictor with ``torch.export.load`` alone and scores the same images in the run's
evaluation batches. Labels must be equal; scores equal within float32 tolerance (the same
ATen operations in the same order; ``torch.testing.assert_close``'s float32 defaults).

A method whose :meth:`Algorithm.export_refusal` gives a reason (FedSR's sampled prediction)
must be refused with that reason, and nothing written.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import fedshift
from fedshift.algorithms import ALGORITHMS
from fedshift.augment import AUGMENTS
from fedshift.core.errors import FedshiftError
from fedshift.runtime.experiment import score_client
from fedshift.runtime.simulation import load_finished, run_experiment
from fedshift.testing import tiny_cfg

pytestmark = [
    pytest.mark.process,
    pytest.mark.slow,
    pytest.mark.usefixtures("one_thread"),
    # the predictor and the run's evaluation run the same ATen operations in the same order,
    # so the comparison holds or fails alike on any CPU kernels: only the KERNEL_CASES are
    # compared again under ATEN_CPU_CAPABILITY=default (make test's numerics pass)
    pytest.mark.same_kernels,
]

SEGMENTATION = ("dataset.name=toyseg", "model.name=unet", "model.width=2")

#: the cases of ``make test``'s second pass on the portable CPU kernels (marked
#: ``numerics``), one for each kind of operation a predictor's graph holds: the plain
#: classifier, the segmentation U-Net, weight-standardised convolutions without
#: normalisation, FFT / complex / float64 amplitudes, the mean of a probabilistic
#: representation, layers the export adds (adapters, LoRA), an augment's site statistics,
#: an amplitude augment's and the forward hooks of a stage-level augment
KERNEL_CASES = {
    "fedavg", "elcfs", "fedwon", "harmofl", "fedsr-mean", "trainable-adapters",
    "trainable-lora", "augment-fedrdn", "augment-ampnorm", "augment-ffa",
}  # fmt: skip


def _case(name: str, over: tuple[str, ...], id: str):
    marks = [pytest.mark.numerics] if id in KERNEL_CASES else []
    return pytest.param(name, over, id=id, marks=marks)


def _cases() -> list:
    out = [_case(name, (), id=name) for name in ALGORITHMS.names()]
    out.append(_case("fedsr", ("algorithm.prediction=mean",), id="fedsr-mean"))
    out += [  # a part of the model trained; adapters and LoRA add layers the export rebuilds
        _case("fedavg", (f"train.trainable={m}",), id=f"trainable-{m}")
        for m in ("head", "adapters", "lora")
    ]
    out += [_case("fedavg", (f"augment=[{a}]",), id=f"augment-{a}") for a in AUGMENTS.names()]
    return out


CASES = _cases()

#: the subprocess: torch alone loads each predictor and scores the images in its batches
FRESH = r"""
import json, sys
sys.modules["fedshift"] = None  # `import fedshift` fails in this interpreter
import torch
for job in json.load(open(sys.argv[1])):
    extra = {"fedshift.json": ""}
    program = torch.export.load(job["pt2"], extra_files=extra).module()
    bs = json.loads(extra["fedshift.json"])["batch_size"]
    x = torch.load(job["x"], weights_only=True)
    with torch.no_grad():
        scores = torch.cat([program(x[s : s + bs]) for s in range(0, len(x), bs)])
    torch.save(scores, job["out"])
assert all(m is None for k, m in sys.modules.items() if k.split(".")[0] == "fedshift")
print("fresh", len(sys.modules))
"""


class _Recorder(nn.Module):
    """The run's model, keeping every output of its forward pass (what ``score_client``'s
    batches produce)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        self.outputs: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.model(x)
        self.outputs.append(out.detach().float().cpu())
        return out


def _evaluation(sim, kind: str, client: str | None, cid: str) -> tuple[dict, torch.Tensor]:
    """``score_client`` of client ``cid`` on the rebuilt run with the exported model: its
    metrics and the scores of its test images."""
    sim.model.load_state_dict(sim.weights_for(client or cid, kind))
    rec = _Recorder(sim.model)
    exp = dataclasses.replace(sim.exp, model=rec)
    data = sim.fed.client(cid)
    metrics = score_client(exp, data, sim.states.get(cid), sim.exp.eval_batch_size)
    n_val = len(data.split("val"))
    outs, seen = [], 0
    for out in rec.outputs:  # val batches first, then test
        if seen >= n_val:
            outs.append(out)
        seen += len(out)
    return metrics, torch.cat(outs)


def _recorded(run_dir: Path, cid: str, kind: str) -> dict:
    """The metrics the run wrote for ``cid`` at the selected round."""
    best = json.loads((run_dir / "summary.json").read_text())["best_round"]
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        if row.get("round") == best and row.get("client") == cid and kind in row:
            return row[kind]
    raise AssertionError(f"no metrics row for {cid} at round {best}")


def _export(run_dir: Path, out: Path):
    """Export as a user would: without --client, then naming the last client where asked."""
    try:
        return fedshift.export_model(run_dir, out)
    except FedshiftError as e:
        if "--client NAME" not in str(e):
            raise
    last = load_finished(run_dir).fed.client_names[-1]
    return fedshift.export_model(run_dir, out, client=last)


def _selected(session: pytest.Session) -> set[str]:
    """The case ids of this module's tests that this pytest session runs (``-m``, ``-k`` or
    node ids may select a few; the numerics pass selects the :data:`KERNEL_CASES`)."""
    test = test_predictor_in_a_fresh_interpreter_predicts_what_the_run_evaluated
    return {
        item.callspec.id
        for item in session.items
        if getattr(item, "function", None) is test and hasattr(item, "callspec")
    }


@pytest.fixture(scope="module")
def exported(tmp_path_factory, request) -> dict:
    """Every selected case trained, exported (or refused) and scored by the fresh
    interpreter (every case when the session's items name none)."""
    root = tmp_path_factory.mktemp("predictor")
    torch.set_num_threads(1)
    results, jobs = {}, []
    wanted = _selected(request.session) or {p.id for p in CASES}
    for param in (p for p in CASES if p.id in wanted):
        name, over = param.values
        seg = "classification" not in ALGORITHMS.get(name).tasks
        cfg = tiny_cfg(name, *(SEGMENTATION if seg else ()), *over)
        case = root / param.id
        run_dir = run_experiment(cfg, run_dir=case / "run", progress=False).run_dir
        why = cfg.algorithm.factory.export_refusal(cfg.algorithm.params)
        if why:
            with pytest.raises(FedshiftError) as err:
                _export(run_dir, case / "m.pt")
            results[param.id] = {"refused": str(err.value), "why": why, "dir": case}
            continue
        done = _export(run_dir, case / "m.pt")
        src = done.config["source"]
        meta_clients = _meta(done.predictor_path)["clients"]
        checks = []
        sim = load_finished(run_dir)
        for cid in meta_clients:
            metrics, want = _evaluation(sim, src["kind"], src["client"], cid)
            x = sim.fed.client(cid).split("test").x
            torch.save(torch.as_tensor(x).float().clone(), case / f"{cid}.x.pt")
            jobs.append({"pt2": str(done.predictor_path), "x": str(case / f"{cid}.x.pt"),
                         "out": str(case / f"{cid}.got.pt")})  # fmt: skip
            checks.append((cid, metrics, _recorded(run_dir, cid, src["kind"]), want, len(x)))
        results[param.id] = {"done": done, "checks": checks, "dir": case}
    (root / "jobs.json").write_text(json.dumps(jobs))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    proc = subprocess.run(
        [sys.executable, "-I", "-c", FRESH, str(root / "jobs.json")],
        cwd=root, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return results


def _meta(path: Path) -> dict:
    extra = {"fedshift.json": ""}
    torch.export.load(str(path), extra_files=extra)
    return json.loads(extra["fedshift.json"])


@pytest.mark.parametrize(("name", "over"), CASES)
def test_predictor_in_a_fresh_interpreter_predicts_what_the_run_evaluated(
    exported, name, over, request
):
    case = exported[request.node.callspec.id]
    if "refused" in case:
        assert f"algorithm {name!r} cannot be exported faithfully" in case["refused"]
        assert case["why"] in case["refused"]
        assert not list(case["dir"].glob("m.*"))  # nothing written
        return
    assert case["checks"], "the predictor claims no client of the run"
    for cid, metrics, recorded, want, n in case["checks"]:
        # the rebuilt evaluation is the run's: the metrics it wrote for that round
        assert metrics == pytest.approx(recorded, rel=1e-6, nan_ok=True), cid
        got = torch.load(case["dir"] / f"{cid}.got.pt", weights_only=True)
        assert got.shape == want.shape and len(got) == n
        assert torch.equal(got.argmax(1), want.argmax(1)), cid
        torch.testing.assert_close(got, want)


def test_the_kernel_cases_are_cases():
    """A case renamed or removed must not leave the numerics pass silently without it."""
    missing = KERNEL_CASES - {p.id for p in CASES}
    assert not missing, f"KERNEL_CASES names no case {sorted(missing)}"
