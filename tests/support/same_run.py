"""One same-run harness: a config run several ways must be the same run, to the last bit.

:func:`assert_same_run` runs a config each way of ``ways`` (the first is the reference) and
:func:`assert_runs_equal` compares two run directories, for runs started some other way (a
command line, a signal, a killed process, a suite). :func:`kill_and_resume` is the "run,
stop after a round, resume" part alone, for tests that look at what a resumed run wrote.

The ways (:data:`WAYS`):

* ``native``: ``run_experiment``, every client in this process, uninterrupted;
* ``resume``: the same, stopped after round ``stop_after`` (``RunInterrupted``: a kill, so
  the state saved is the last checkpoint's) and continued with ``resume_experiment``;
* ``pool``: the clients in worker processes (:mod:`fedshift.runtime.pool.transport`): the
  ``WorkerPool`` given, or two workers started for the run; ``pool-resume``: stopped and
  resumed so;
* ``flower``: Flower's in-process simulation (``simulate(engine="in-process")``: every
  record crosses Flower's wire, client state lives in the nodes' contexts);
  ``flower-resume``: stopped and resumed so (clients restored from the nodes' snapshots).

What is compared (``compare``, default :data:`SAME`):

* ``metrics``: ``metrics.jsonl``, byte for byte;
* ``results``: the summary's results (``conftest.RESULT_KEYS``: the selected round, mean
  and per-client scores, the bytes by record), read back from ``summary.json``;
* ``ledger``: ``ledger.json``, byte for byte;
* ``state``: the final ``checkpoint.pt``: round, server state, metric records and ledger,
  and, unless one run is on Flower (its clients' state stays on the nodes, its server's RNG
  is its own), every client's state and the RNG state; tensors by dtype, shape and value;

plus ``files``: more files of the run directory, byte for byte (``metrics.csv``).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import shutil
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import torch
from conftest import results_of

from fedshift.core.config import RunConfig
from fedshift.runtime.rundir import results as result_files
from fedshift.runtime.rundir.checkpoint_io import read_checkpoint
from fedshift.runtime.rundir.results import RunResult
from fedshift.runtime.simulation import resume_experiment, run_experiment
from fedshift.runtime.stopping import RunInterrupted

#: a cheap toy run (three small ``toyshift`` clients, a 4-channel CNN, two local steps),
#: cheap enough to run every algorithm and augment every way; one of two pool workers
#: holds two of the three clients
TINY = (
    "dataset.clients=3",
    "dataset.train_size=12",
    "dataset.val_size=4",
    "dataset.test_size=4",
    "model.name=cnn",
    "model.width=4",
    "train.batch_size=4",
    "train.local_steps=2",
)

#: extra overrides for an algorithm whose objective needs per-pixel labels (``tasks`` without
#: classification: FedDG-ELCFS): toyseg and a tiny U-Net instead of the toy classifier
SEGMENTATION = ("dataset.name=toyseg", "model.name=unet", "model.width=2")


def seg_overrides(algorithm: str) -> tuple[str, ...]:
    """:data:`SEGMENTATION` for a segmentation-only algorithm, else nothing."""
    from fedshift.algorithms import ALGORITHMS

    return () if "classification" in ALGORITHMS.get(algorithm).tasks else SEGMENTATION


WAYS = ("native", "resume", "pool", "pool-resume", "flower", "flower-resume")
SAME = ("metrics", "results", "ledger", "state")
#: the parts of ``checkpoint.pt`` that ``state`` compares (not its wall time, run key or
#: config: the config of a resumed run is read back from its run directory)
STATE_KEYS = ("round", "server", "clients", "ledger", "records", "rng")

CHECKPOINT = "checkpoint.pt"


@dataclass
class Runs:
    """What :func:`assert_same_run` ran: each way's result, and for a way that was stopped
    the round of the checkpoint it resumed from (None: there was none)."""

    results: dict[str, RunResult] = field(default_factory=dict)
    saved_round: dict[str, int | None] = field(default_factory=dict)

    def __getitem__(self, way: str) -> RunResult:
        return self.results[way]

    def dir(self, way: str) -> Path:
        return Path(self.results[way].run_dir)


@contextlib.contextmanager
def compared_runs(plot: bool) -> Iterator[None]:
    """One torch thread around runs compared bit for bit (float reductions split otherwise);
    without ``plot``, no ``convergence.png``: nothing here compares it, and drawing it is
    most of a tiny run's time (test_cli.py checks the picture)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with contextlib.ExitStack() as stack:
            if not plot:
                stack.enter_context(mock.patch.object(result_files, "plot_convergence", _no_plot))
            yield
    finally:
        torch.set_num_threads(before)


def _no_plot(*args: object) -> None:
    """``plot_convergence`` skipped (:func:`compared_runs`)."""


def _start(way: str, cfg: RunConfig, run_dir: Path, stop_after: int | None, pool) -> RunResult:
    if way.startswith("flower"):
        from fedshift.flower.simulate import simulate

        return simulate(cfg, run_dir=run_dir, engine="in-process", progress=False,
                        stop_after=stop_after)  # fmt: skip
    if way.startswith("pool"):
        many = {"pool": pool} if pool is not None else {"workers": 2}
        return run_experiment(cfg, run_dir=run_dir, progress=False, stop_after=stop_after,
                              **many)  # fmt: skip
    return run_experiment(cfg, run_dir=run_dir, progress=False, stop_after=stop_after, workers=1)


def _continue(way: str, cfg: RunConfig, run_dir: Path, pool) -> RunResult:
    if way.startswith("flower"):
        from fedshift.flower.simulate import simulate

        return simulate(cfg, run_dir=run_dir, engine="in-process", progress=False, resume=True)
    if way.startswith("pool"):
        many = {"pool": pool} if pool is not None else {"workers": 2}
        return resume_experiment(run_dir, progress=False, **many)
    return resume_experiment(run_dir, progress=False, workers=1)


def saved_round(run_dir: Path) -> int | None:
    """The round of ``run_dir``'s checkpoint; None when there is none."""
    path = Path(run_dir) / CHECKPOINT
    return int(read_checkpoint(path)["round"]) if path.is_file() else None


def kill_and_resume(
    cfg: RunConfig,
    run_dir: Path,
    stop_after: int,
    *,
    way: str = "resume",
    at_stop: Callable[[Path], None] | None = None,
    checkpointed: bool | None = True,
    pool=None,
) -> RunResult:
    """Run ``cfg`` in ``run_dir`` the ``way`` given (``resume``, ``pool-resume`` or
    ``flower-resume``), stopped after round ``stop_after`` as a kill would stop it, then
    resumed to the end. ``checkpointed``: a checkpoint must be there at the stop (True: the
    resume continues from it), must not (False: the resume starts again), or either (None).
    ``at_stop(run_dir)`` looks at the stopped run before the resume."""
    if way not in ("resume", "pool-resume", "flower-resume"):
        raise ValueError(f"kill_and_resume: {way!r} is not a way that stops and resumes")
    if stop_after >= cfg.train.rounds:
        raise ValueError(f"stop_after={stop_after}: the run has only {cfg.train.rounds} rounds")
    run_dir = Path(run_dir)
    with pytest.raises(RunInterrupted):
        _start(way, cfg, run_dir, stop_after, pool)
    if checkpointed is not None:
        there = (run_dir / CHECKPOINT).is_file()
        if checkpointed and not there:
            pytest.fail(f"{run_dir}: no checkpoint at the stop after round {stop_after}: "
                        "the resume would start again (set checkpoint.every)")  # fmt: skip
        if there and not checkpointed:
            pytest.fail(f"{run_dir}: a checkpoint at the stop after round {stop_after}, where "
                        "the test wants a run that starts again")  # fmt: skip
    if at_stop is not None:
        at_stop(run_dir)
    return _continue(way, cfg, run_dir, pool)


def assert_same_run(
    cfg: RunConfig,
    tmp_path: Path,
    ways: Iterable[str] = ("native", "resume"),
    *,
    stop_after: int | None = None,
    compare: Iterable[str] = SAME,
    files: Iterable[str] = (),
    pool=None,
    at_stop: Callable[[Path], None] | None = None,
    checkpointed: bool | None = True,
    plot: bool = False,
    reference: RunResult | None = None,
) -> Runs:
    """Run ``cfg`` each way of ``ways`` in ``tmp_path / way`` and assert that every run is
    the first one's (see the module docstring for the ways and what is compared). The
    ways that stop do so after round ``stop_after`` (default: the round before the last);
    ``checkpointed`` and ``at_stop`` are :func:`kill_and_resume`'s. ``pool``: the
    ``WorkerPool`` the pool ways use; ``plot``: draw each run's ``convergence.png``
    (:func:`compared_runs`). ``reference``: a finished run of ``cfg`` the first way (from
    :func:`shared_run`), compared with instead of running that way again. Returns the runs,
    for the test's own checks."""
    ways = tuple(ways)
    unknown = [w for w in ways if w not in WAYS]
    if unknown or len(ways) < 2 or len(set(ways)) != len(ways):
        raise ValueError(f"ways={ways}: two or more of {WAYS}, each once")
    if reference is not None and ways[0].endswith("resume"):
        raise ValueError(f"reference: a run of the first way, {ways[0]!r}, which stops")
    stop_after = cfg.train.rounds - 1 if stop_after is None else stop_after
    runs = Runs()
    with compared_runs(plot):
        for way in ways:
            run_dir = Path(tmp_path) / way
            if reference is not None and way == ways[0]:
                result = reference
            elif way.endswith("resume"):

                def stopped(d: Path, way: str = way) -> None:
                    runs.saved_round[way] = saved_round(d)
                    if at_stop is not None:
                        at_stop(d)

                result = kill_and_resume(cfg, run_dir, stop_after, way=way, pool=pool,
                                         at_stop=stopped, checkpointed=checkpointed)  # fmt: skip
            else:
                result = _start(way, cfg, run_dir, None, pool)
            runs.results[way] = result
    for way in ways[1:]:
        assert_runs_equal(runs.dir(way), runs.dir(ways[0]), compare, files)
    return runs


def shared_run(cfg: RunConfig, root: Path, way: str = "native") -> RunResult:
    """``cfg`` run ``way`` (``native`` or ``pool`` with two workers of its own: a way that
    does not stop) once under ``root``, whichever test or pytest-xdist worker asks first:
    the other tests asking for the same config (the same ``cfg.to_dict()``) and way get the
    finished run. ``root`` is shared by the workers of one pytest session (see
    ``tests/conftest.py``'s ``session_dir``); a lock file per run makes a second worker
    wait for the first. A run that failed left no ``summary.json``: it runs again.

    For a reference every test compares with but none changes: the test suite's runs of a
    config are deterministic, so the run another test made is the run this one would make
    (and one made in another worker process is a stricter reference)."""
    if way not in ("native", "pool"):
        raise ValueError(f"shared_run: way {way!r} stops; only 'native' or 'pool'")
    text = json.dumps(cfg.to_dict(), sort_keys=True, default=str)
    key = f"{way}-{hashlib.sha256(text.encode()).hexdigest()[:20]}"
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    run_dir = root / key
    with open(root / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not (run_dir / "summary.json").is_file():
            shutil.rmtree(run_dir, ignore_errors=True)
            with compared_runs(plot=False):
                _start(way, cfg, run_dir, None, None)
    return RunResult(run_dir, _summary(run_dir))


def assert_runs_equal(
    run_dir: Path, reference: Path, compare: Iterable[str] = SAME, files: Iterable[str] = ()
) -> None:
    """Assert that the run in ``run_dir`` is the run in ``reference`` (``compare`` and
    ``files`` as for :func:`assert_same_run`); the message names the first differences."""
    run_dir, reference = Path(run_dir), Path(reference)
    compare = tuple(compare)
    unknown = set(compare) - set(SAME)
    if unknown:
        raise ValueError(f"compare={compare}: each one of {SAME}")
    label = f"{run_dir} vs {reference}"
    if "metrics" in compare:
        _same_bytes(run_dir, reference, "metrics.jsonl")
    if "results" in compare:
        got, want = (results_of(_summary(d)) for d in (run_dir, reference))
        diffs = [k for k in want if got[k] != want[k]]
        assert not diffs, f"{label}: summary results differ in {diffs}: " + "; ".join(
            f"{k}: {got[k]!r} != {want[k]!r}" for k in diffs[:3]
        )
    if "ledger" in compare:
        _same_bytes(run_dir, reference, "ledger.json")
    if "state" in compare:
        got, want = (read_checkpoint(d / CHECKPOINT) for d in (run_dir, reference))
        diffs: list[str] = []
        flower = got["clients"] is None or want["clients"] is None
        for key in STATE_KEYS:
            if flower and key in ("clients", "rng"):
                # a Flower run's client state stays on its nodes, and its server's RNG is
                # its own (in-process, the ClientApps share it, restoring lazily on resume)
                continue
            diffs += differences(got[key], want[key], key)
        assert not diffs, f"{label}: final {CHECKPOINT} differs at " + ", ".join(diffs[:8])
    for name in files:
        _same_bytes(run_dir, reference, name)


def _summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def _same_bytes(run_dir: Path, reference: Path, name: str) -> None:
    got, want = ((d / name).read_bytes() for d in (run_dir, reference))
    if got != want:
        lines = zip(got.splitlines(), want.splitlines(), strict=False)
        first = next((i for i, (a, b) in enumerate(lines) if a != b), None)
        where = f"line {first + 1}" if first is not None else "length"
        pytest.fail(f"{run_dir / name} differs from {reference / name} ({where})")


def differences(got: Any, want: Any, where: str = "") -> list[str]:
    """The paths at which two nested states differ (tensors: dtype, shape and values,
    exactly; NaNs equal where both have them)."""
    if isinstance(want, torch.Tensor) or isinstance(got, torch.Tensor):
        if not (isinstance(got, torch.Tensor) and isinstance(want, torch.Tensor)):
            return [where]
        if got.dtype != want.dtype or got.shape != want.shape:
            return [f"{where} ({got.dtype}{list(got.shape)} != {want.dtype}{list(want.shape)})"]
        same = torch.equal(got, want) or (
            got.is_floating_point() and bool(torch.equal(got.isnan(), want.isnan()))
            and torch.equal(got.nan_to_num(), want.nan_to_num())
        )  # fmt: skip
        return [] if same else [where]
    if isinstance(want, Mapping):
        if not isinstance(got, Mapping):
            return [where]
        if list(got) != list(want):
            return [f"{where} (keys {sorted(map(str, got))} != {sorted(map(str, want))})"]
        return [d for k in want for d in differences(got[k], want[k], f"{where}/{k}")]
    if isinstance(want, list | tuple):
        if not isinstance(got, list | tuple) or len(got) != len(want):
            return [where]
        pairs = enumerate(zip(got, want, strict=True))
        return [d for i, (a, b) in pairs for d in differences(a, b, f"{where}[{i}]")]
    return [] if got == want or (got != got and want != want) else [where]
