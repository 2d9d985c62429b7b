"""Shared fixtures: tiny configs on the synthetic ``toyshift`` data (milliseconds per round)."""

from __future__ import annotations

import functools
import inspect
import json
import os
import shutil
import tempfile
import types
from pathlib import Path

import pytest
import torch
import yaml

import fedshift
from fedshift.catalog import resolve
from fedshift.core.config import load_config
from fedshift.eval.plots import render_png as _REAL_RENDER_PNG

torch.set_num_threads(1)

#: the repository root (tests in subfolders find configs/, docs/ and src/ from here)
ROOT = Path(__file__).resolve().parents[1]
#: the folder holding the fedshift package the tests import
SRC = Path(fedshift.__file__).resolve().parents[1]


def fedshift_env(**extra: str) -> dict[str, str]:
    """The environment of a subprocess that runs the fedshift these tests import."""
    return {**os.environ, "PYTHONPATH": str(SRC), **extra}


def write_suite(tmp_path: Path, name: str = "suite", **keys) -> Path:
    """A tiny suite file, ``<tmp_path>/<name>.yaml``, its runs under ``<tmp_path>/runs``:
    toyshift on LeNet-5, 2 rounds, a checkpoint every round, seeds 0 and 1; ``keys``
    replace its top-level keys (None drops one)."""
    raw = {
        "name": name,
        "out": str(tmp_path / "runs"),
        "dataset": {"name": "toyshift"},
        "model": {"name": "lenet5"},
        "train": {"rounds": 2, "batch_size": 16},
        "checkpoint": {"every": 1},
        "sweep": {"seed": [0, 1]},
        **keys,
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({k: v for k, v in raw.items() if v is not None}))
    return path


def toy_cfg(*overrides: str, rounds: int = 3):
    base = [
        "dataset.name=toyshift",
        "model.name=lenet5",
        f"train.rounds={rounds}",
        "train.batch_size=16",
        "name=test",
    ]
    return resolve(load_config(None, [*base, *overrides]))


#: a tiny segmentation run: ``toyseg`` (12 training images a client), a 4-channel U-Net, Adam
SEG = [
    "dataset.name=toyseg",
    "dataset.train_size=12",
    "dataset.val_size=4",
    "dataset.test_size=4",
    "model.name=unet",
    "model.width=4",
    "train.batch_size=6",
    "train.optimizer=adam",
    "train.lr=0.003",
    "name=test",
]


def seg_cfg(*overrides: str, rounds: int = 2):
    return resolve(load_config(None, [*SEG, f"train.rounds={rounds}", *overrides]))


@pytest.fixture(autouse=True)
def _registries_restored():
    """Every test leaves the component registries as it found them: a plug-in registered by
    one test (a doc example run in-process, an EXTENDING case) is never seen by the next one
    on the same worker."""
    from fedshift.algorithms import ALGORITHMS
    from fedshift.augment import AUGMENTS
    from fedshift.data import DATASETS
    from fedshift.data.partition import PARTITIONS
    from fedshift.models import MODELS

    regs = (ALGORITHMS, AUGMENTS, DATASETS, PARTITIONS, MODELS)
    saved = [dict(r._entries) for r in regs]
    yield
    for r, entries in zip(regs, saved, strict=True):
        r._entries = entries


#: a 1x1 PNG: the ``convergence.png`` of a run in a test that does not look at the picture
UNRENDERED_PNG = bytes.fromhex(
    "89504e470d0a1a0a0000000d49484452000000010000000108000000003a7e9b55"
    "0000000a49444154789c63f80f0001010100b138f6140000000049454e44ae426082"
)


def _unrendered_png(fig, path) -> None:
    """``fedshift.eval.plots.render_png`` in tests: the figure is built (every curve, label
    and legend of ``plot_convergence``) but not drawn: drawing and PNG encoding were ~0.24
    CPU s of every run, about half of a tiny run's CPU."""
    Path(path).write_bytes(UNRENDERED_PNG)


@pytest.fixture(scope="session", autouse=True)
def _convergence_figures_unrendered():
    """Runs in the pytest processes (module and session fixtures' runs too) write a 1x1
    ``convergence.png``; a test marked ``png`` gets the real picture (:func:`_png_marked`).
    Processes a test starts (the CLI in a subprocess, Flower's ServerApp) draw it."""
    from fedshift.eval import plots

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(plots, "render_png", _unrendered_png)
        yield


@pytest.fixture(autouse=True)
def _png_marked(request):
    """A test marked ``png`` (it looks at a run's ``convergence.png``) draws it for real."""
    if request.node.get_closest_marker("png") is None:
        yield
        return
    from fedshift.eval import plots

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(plots, "render_png", _REAL_RENDER_PNG)
        yield


@pytest.fixture
def make_cfg():
    return toy_cfg


def toy_dir(*overrides: str) -> str:
    """The run directory name ``fedshift run`` gives :func:`toy_cfg` with ``overrides``
    (``train.rounds`` and ``name`` do not enter it)."""
    from fedshift.runtime.rundir.results import run_dir_name

    return run_dir_name(toy_cfg(*overrides))


#: the summary keys that must not differ between two runs that should be the same run
#: (resumed vs uninterrupted, extended vs longer, Flower vs native)
RESULT_KEYS = (
    "best_round",
    "val_mean",
    "test_mean",
    "test_per_client",
    "val_per_client",
    "final_test_mean",
    "models",
    "metrics",
    "bytes_up",
    "bytes_down",
    "bytes_by_record",
    "bytes_setup",
    "rounds",
)


def results_of(summary: dict) -> dict:
    """The parts of a summary that are results (no wall time, no run directory)."""
    return {k: summary.get(k) for k in RESULT_KEYS}


def metric_rows(run_dir: Path) -> list[dict]:
    """A run's ``metrics.jsonl`` rows."""
    return [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]


def ledger(run_dir: Path) -> dict:
    """A run's ``ledger.json`` (the bytes on the wire, per round and client)."""
    return json.loads((Path(run_dir) / "ledger.json").read_text())


@pytest.fixture(scope="session")
def worker_pool():
    """Two pool workers (``run.workers``) shared by every run of a pytest process that
    asks for them (each run rebuilds its experiment in them, so no run sees another's
    state): starting the two workers costs ~9 CPU s (each imports torch and fedshift), a
    run on them milliseconds. Session-wide, since the modules that use it (test_pool,
    test_same_run's pool cases, the privacy tests' pool runs) are interleaved with other
    modules on each xdist worker: a module-wide pool was started again each time."""
    from fedshift.runtime.pool.transport import WorkerPool

    with WorkerPool(2) as pool:
        yield pool


@pytest.fixture(scope="session")
def session_dir(tmp_path_factory) -> Path:
    """A folder shared by every test of this pytest session, in every pytest-xdist worker
    (the workers' own temporary folders are its subfolders), for what is built once per
    session and read by many tests (``support.same_run.shared_run``); what is built there
    must be locked against a second worker building it at the same time."""
    base = tmp_path_factory.getbasetemp()
    root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "shared"
    root.mkdir(exist_ok=True)
    return root


@pytest.fixture
def one_thread():
    """One torch thread for the test, whatever ran before: runs compared bit for bit must use
    the same thread count (float reductions split differently otherwise)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# ---------------------------------------------------------------------------- pytest-xdist
# `make test` runs the tests in parallel worker processes (pyproject.toml: -n auto --dist
# loadgroup). Every test gives the same result in any worker, in any order and alone; the
# scheduler below only decides which tests share a worker and which start first.

#: tests that run one after the other in one worker: node id prefix -> group. The Flower
#: deployment tests share one local deployment (a module fixture: seconds to start, and its
#: processes poll while they live); while a killed-SuperNode test waits out its round
#: timeout, the other workers have the CPUs
GROUPS = {
    "tests/flower/test_flower_deploy.py": "deploy",
    # the other tests of Flower's and Ray's processes, after them in the same worker: their
    # daemons poll (~0.4 cores a deployment) for as long as the test lasts, so three of them
    # side by side at the start, each slowed by the others, cost more CPU than one by one
    "tests/flower/test_flower_local_stop.py": "deploy",
    "tests/flower/test_ray_signals.py": "deploy",
    # modules whose tests share a module fixture of finished runs (seconds to make): one
    # worker makes it once instead of each worker making it
    "tests/eval/test_report.py": "report",
    "tests/eval/test_runs_identity.py": "runs-identity",
    # every algorithm and augment trained, exported and scored in one module fixture (the
    # suite's costliest fixture: split over the workers, each worker built all of it)
    "tests/runtime/test_predictor.py": "predictor",
}


def pytest_xdist_auto_num_workers(config) -> int:
    """``-n auto``: one worker per CPU this process may run on (``os.sched_getaffinity``
    where there is one: psutil, xdist's default, counts every CPU of the host in a
    container), plus one: the workers running the Flower deployment groups mostly wait
    for their SuperNodes' processes (on 2 CPUs, 3 workers finish about 10 % sooner)."""
    affinity = getattr(os, "sched_getaffinity", None)
    cpus = len(affinity(0)) if affinity else os.cpu_count() or 1
    return max(1, cpus) + 1


#: the process-level tests (node id prefixes): Flower deployments and Ray simulations, worker
#: pools, real processes killed, signalled and resumed, wheels built and installed. ``make
#: check`` (the everyday loop) leaves them out; ``make test`` (and CI) runs them.
PROCESS = (
    "tests/flower/test_flower_deploy.py",
    "tests/flower/test_flower.py::test_client_errors_and_bad_nodes_are_reported",
    "tests/flower/test_flower.py::test_node_state_can_live_on_disk",
    "tests/flower/test_ray_signals.py::test_sigint_and_sigterm_stop_a_ray_simulation_cleanly",
    "tests/runtime/test_pool.py",
    "tests/runtime/test_same_run.py::test_same_run[pool-",
    "tests/runtime/test_privacy_budget.py::test_a_protected_run_in_worker_processes_is_the_seq",
    "tests/runtime/test_dp_updates.py::test_a_protected_run_in_worker_processes_is_the_seq",
    "tests/runtime/test_dpsgd.py::test_a_protected_run_in_worker_processes_is_the_seq",
    "tests/test_packaging.py",
    "tests/runtime/test_tracking_services.py",
    "tests/runtime/test_resume.py::test_signal_at_a_random_moment",
    "tests/runtime/test_resume.py::test_flower_",
    "tests/runtime/test_rundir.py::test_new_run_dirs_are_claimed_atomically",
    "tests/runtime/test_rundir.py::test_second_process_is_refused",
    "tests/runtime/test_rundir.py::test_lock_dies_with_its_process",
    "tests/test_bench.py::test_bench_results_do_not_depend_on_workers",
    "tests/test_bench.py::test_failing_cell_does_not_stop_the_others",
    "tests/test_bench.py::test_signal_stops_the_suite_and_is_not_a_failure",
    "tests/test_bench.py::test_killed_bench_leaves_no_worker",
    "tests/test_bench.py::test_cli_bench",
    "tests/cli/test_ux.py::test_long_runs_run_jobs_equal_sequential",
    "tests/cli/test_ux.py::test_long_runs_flower_simulate",
    "tests/cli/test_ux.py::test_long_runs_bench_shows_rounds_and_eta_inside_cells[2]",
    "tests/test_extending.py::test_extending_plugin_package_from_the_guide_installs_lists_and_runs",
    # fresh Python processes (plug-in consent, entry points, the guide's examples run from
    # outside the package): each starts an interpreter and imports torch
    "tests/test_extending.py::test_extending_guide_example_runs_by_name_from_outside_the_package",
    "tests/core/test_consent.py::test_received_run_dir_imports_no_plugin_unasked",
    "tests/core/test_consent.py::test_suite_plugins_need_consent_but_command_line_names_do_not",
    "tests/core/test_consent.py::test_module_that_exits_on_import_is_an_error",
    "tests/core/test_consent.py::test_python_m_fedshift_lets_no_file_in_the_folder_shadow_a_module",
    "tests/data/test_dataset_plugins.py::test_installed_dataset_runs_by_name_from_the_cli",
    "tests/data/test_dataset_plugins.py::test_the_guide_dataset_runs_by_module_class",
    "tests/test_suite_cost.py::test_the_script_charges_each_test_its_cpu",
    # `python -m fedshift` in a folder holding a wandb.py, a *.dist-info or a plug-in module
    "tests/cli/test_read_only.py::test_a_wandb_py_in_the_current_folder_is_not_wandb",
    "tests/cli/test_read_only.py::test_list_reads_no_plugin_metadata_from_the_current_folder",
    "tests/cli/test_read_only.py::test_a_plugin_module_in_the_current_folder_still_runs",
    # the Flower ways of the same-run matrix (its ``resume`` way, every algorithm and augment
    # killed and resumed in-process, is the fast tier's: `make check` runs it)
    "tests/runtime/test_same_run.py::test_same_run[flower-",
)

#: tests that ``make test`` runs and ``make check`` (the everyday loop, <= 3 min on 2 cores)
#: leaves out, marked ``full`` (node id prefixes): in-process but seconds of CPU each
#: (``python benchmarks/suite_cost.py -m "not process"`` lists what the fast tier costs),
#: where a cheaper test of the fast tier runs the same code. Each group says which.
FULL = (
    # the documents' commands, in document order (the check tier's costliest file: a digits
    # build, demo runs, benches and protocols): the commands' code is tested in tests/cli/,
    # tests/protocols/ and test_bench.py; what only these show, a document gone stale, shows
    # in make test
    "tests/test_docs.py::test_doc_commands_run",
    # killed after round 3 (checkpoint of round 2) and resumed, with options: every
    # algorithm's kill and resume is the fast tier's same-run case (test_same_run[resume-*])
    "tests/algorithms/test_distrans.py::test_resumed_run_equals_uninterrupted",
    "tests/algorithms/test_fedaws_advprop.py::test_pfedhn_resume_equals_uninterrupted",
    "tests/algorithms/test_fedfa.py::test_killed_then_resumed_equals_uninterrupted",
    "tests/algorithms/test_fraug.py::test_killed_then_resumed_equals_uninterrupted",
    "tests/algorithms/test_personalized.py::test_killed_then_resumed_equals_uninterrupted",
    # on Flower in-process, as the same-run matrix's Flower ways (make test too)
    "tests/algorithms/test_feddg_ga.py::test_flower_in_process_equals_native",
    # end-to-end runs of options and ablations (several runs each): the algorithm's own
    # terms are the module's unit tests, its end-to-end run the same-run case
    "tests/algorithms/test_fraug.py::test_ablations_run_end_to_end_and_differ",
    "tests/algorithms/test_fpl.py::test_fpl_without_its_terms_is_fedavg_and_options",
    "tests/algorithms/test_fedmix_fedproto.py::test_fedproto_end_to_end_personal_models",
    "tests/algorithms/test_fedmix_fedproto.py::test_fedmix_end_to_end",
    "tests/algorithms/test_fedmix_fedproto.py::test_fedmix_gradient_term_takes_part_in_training",
    "tests/algorithms/test_adcol.py::test_adcol_end_to_end_personal_default_and_fedavg_option",
    "tests/algorithms/test_fedfa.py::test_fedrobust_learns_an_adversarial_affine_shift[full]",
    # every committed claim page and results cell read and compared whole (results/,
    # claims/): the claims code is the module's other tests', on small ledgers
    "tests/claims/test_claims.py::test_the_committed_ledger_is_what_results_give",
    "tests/claims/test_claims.py::test_no_committed_run_in_a_claims_reach_is_left_uncompared",
    # the new-site protocol over four methods and three held-out sites, and over a suite
    # adapting as it trains: the module's other tests run it on one method and site
    "tests/protocols/test_new_site.py::test_new_site_every_method_every_variant_and_global_is_locos",
    "tests/protocols/test_new_site.py::test_each_run_adapts_as_it_trains_and_a_committed_table",
)

#: in-process tests measured as costly on an idle machine of 2 cores (tests/costly.json,
#: node id -> CPU s; rewritten by ``python benchmarks/suite_cost.py -m "not process"
#: --write-costly tests/costly.json``, chosen by benchmarks/fast_tier.py: CPU over a
#: threshold, but for those running lines no cheaper test runs), marked ``full``: ``make
#: check`` (<= 3 min on 2 cores) leaves them out, ``make test`` runs all. A test not in the
#: file (a new one) is in the fast tier until the file is measured again
COSTLY: dict[str, float] = json.loads((ROOT / "tests" / "costly.json").read_text())["tests"]

#: tests ``make check`` keeps whatever they cost (node id prefixes): the same-run matrix's
#: in-process way, every registered algorithm and augment run, killed after a round and
#: resumed to the uninterrupted run's numbers (what the fast tier keeps of every method)
FAST = ("tests/runtime/test_same_run.py::test_same_run[resume-",)


def is_full(nodeid: str) -> bool:
    """``make check`` leaves the test out: listed in :data:`FULL` (with a reason), or measured
    costly (:data:`COSTLY`) and not one of the :data:`FAST`."""
    if nodeid.startswith(FULL):
        return True
    return nodeid in COSTLY and not nodeid.startswith(FAST)


#: the names of a test that compares floats by tolerance: it holds on every CPU only if its
#: tolerance comes from float rounding, not from one machine's numbers (``numerics`` marker)
_FLOAT_COMPARISONS = frozenset({"approx", "allclose", "assert_close", "isclose"})


def _compares_floats(item) -> bool:
    """The test's code calls a float comparison by tolerance, and it is not marked
    ``same_kernels`` (both sides computed by the same kernels in the same order: another
    CPU's kernels move both alike, so a second pass would compare nothing new)."""
    if item.get_closest_marker("same_kernels") is not None:
        return False
    fn = getattr(item, "function", None)
    code = getattr(inspect.unwrap(fn), "__code__", None) if fn is not None else None
    return code is not None and bool(_FLOAT_COMPARISONS & _global_and_attribute_names(code))


@functools.cache
def _global_and_attribute_names(code: types.CodeType) -> frozenset[str]:
    """The global and attribute names ``code`` and the functions, lambdas and comprehensions
    inside it use (``pytest.approx(...)`` uses ``approx``): read from the compiled code, not
    the source (tokenising every test's source was ~1 CPU s of each collection)."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _global_and_attribute_names(const)
    return frozenset(names)


def pytest_collection_modifyitems(config, items) -> None:
    """Tests marked ``slow`` first (a stable sort: otherwise in file order), so that no
    worker starts a long test while the others are running out of work. :data:`PROCESS`
    tests are marked ``process``. Every test that
    compares floats by a tolerance is marked ``numerics`` as well as those marked by hand:
    ``make test`` runs them a second time on another CPU kernel path
    (``ATEN_CPU_CAPABILITY=default``), so that a tolerance or constant that only holds for
    this machine's kernels fails here, not on a user's machine; a test marked
    ``same_kernels`` is not marked so (its params marked ``numerics`` by hand are).
    :data:`FULL` and :data:`COSTLY` tests are marked ``full`` (``make check`` leaves them out;
    :func:`is_full`)."""
    for item in items:
        if item.get_closest_marker("numerics") is None and _compares_floats(item):
            item.add_marker(pytest.mark.numerics)
        if item.nodeid.startswith(PROCESS):
            item.add_marker(pytest.mark.process)
        if is_full(item.nodeid):
            item.add_marker(pytest.mark.full)
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


def pytest_xdist_make_scheduler(config, log):
    """``--dist loadgroup`` as xdist means it, but grouped by :data:`GROUPS`: each group is
    one unit of work, every other test its own; bigger units first. (xdist's loadgroup
    groups by ``xdist_group`` marks, passed on by rewriting node ids, which pytest 9.2
    ignores: the groups silently fall apart.) Other ``--dist`` modes are xdist's."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class Groups(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            if nodeid.rfind("@") > nodeid.rfind("]"):  # an xdist_group mark (pytest < 9.2)
                return nodeid.rsplit("@", 1)[1]
            return next((g for p, g in GROUPS.items() if nodeid.startswith(p)), nodeid)

    return Groups(config, log)


#: below this many free bytes where the suite writes, a failure may be the disk's: at its
#: peak ``make test`` holds ~1.5 GB of run folders, checkpoints and wheels in the
#: temporary folder (pytest keeps the last three sessions' folders)
LOW_DISK = 1 << 30


def low_disk(paths: dict[str, str]) -> list[str]:
    """A line for each place in ``paths`` (what -> folder) with under :data:`LOW_DISK` free,
    one per file system (the first place named on it)."""
    lines, seen = [], set()
    for what, path in paths.items():
        try:
            device, free = os.stat(path).st_dev, shutil.disk_usage(path).free
        except OSError:  # a folder gone by now: nothing to say of it
            continue
        if device in seen:
            continue
        seen.add(device)
        if free < LOW_DISK:
            lines.append(
                f"disk: {free / 2**20:.0f} MiB free in the {what} ({path}) after the tests; "
                f"they write ~1.5 GB there at their peak: an OSError 'No space left on "
                f"device' or a worker's INTERNALERROR above is the disk, not the code"
            )
    return lines


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    """Where tests failed on a nearly full disk, say so last (CI shows the output's tail):
    a full disk fails tests at random, and xdist reports a worker's ``OSError`` from its
    output capture as an INTERNALERROR that names no test."""
    if exitstatus != 0:
        temp = tempfile.gettempdir()
        for line in low_disk({"temporary folder": temp, "repository's disk": str(ROOT)}):
            terminalreporter.write_line(line, red=True, bold=True)
