"""``fedshift flower simulate``: a fedshift config on Flower's simulation engine.

The ServerApp (:class:`~fedshift.flower.server.FlowerServer`) runs in this process; every
client is a virtual SuperNode whose ClientApp runs in Flower's Ray backend (``engine=ray``)
or, for debugging without Ray, in this process (``engine=in-process``, :mod:`.inprocess`).
The virtual node ``partition-id=k`` is the k-th client of the federation. With the same seed
the run ends with the metrics of ``fedshift run`` (tested: ``tests/runtime/test_same_run.py``).

SIGINT and SIGTERM stop a simulation on either engine as they stop ``fedshift run``: the
round in progress is rolled back, the last whole round saved, and the command exits 130 /
143 naming ``fedshift flower simulate --resume RUN_DIR``. On Ray the ServerApp runs in a
thread while Flower's engine holds the main thread, and Ray installs its own SIGTERM handlers
(Python's and its C++ core's, which dumps a stack and aborts); so Ray is started here first,
then the main thread's handlers are set again to record the signal for the ServerApp's loop,
which acts on it while it waits for replies or between rounds
(:meth:`~fedshift.runtime.stopping.SignalGate.forwarded`).

A run directory of a native run (its checkpoint holds every client's state) is refused
before Ray starts: its clients have no SuperNode snapshots to continue from.
"""

from __future__ import annotations

import copy
import logging
import os
import tempfile
from pathlib import Path

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from fedshift.core.config import RunConfig
from fedshift.core.errors import FedshiftError
from fedshift.data import client_names as dataset_client_names
from fedshift.flower.node import build_client_app
from fedshift.flower.server import FlowerOptions, FlowerServer
from fedshift.flower.transport import refuse_native_state
from fedshift.runtime.rundir.checkpoint_io import CHECKPOINT, read_run_state
from fedshift.runtime.rundir.results import RunResult, new_run_dir
from fedshift.runtime.stopping import RunSignal, SignalGate

ENGINES = ("ray", "in-process")


def build_server_app(
    cfg: RunConfig,
    run_dir: Path,
    options: FlowerOptions,
    results: list,
    progress: bool = True,
    resume: bool = False,
    stop_after: int | None = None,
    gate: SignalGate | None = None,
) -> ServerApp:
    """A ServerApp running ``cfg`` (its result, or the exception that ended it, is appended
    to ``results``; a :class:`RunSignal` too: the run stopped cleanly)."""
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        try:
            server = FlowerServer(cfg, run_dir, options, progress, gate)
            results.append(server.run(grid, resume=resume, stop_after=stop_after))
        except (Exception, RunSignal) as e:  # handed to the caller: Flower would only log it
            results.append(e)

    return app


def client_names(cfg: RunConfig) -> list[str]:
    """The federation's clients (held-out ones too): one SuperNode each; named from the
    config's dataset and partition parameters where they name them (nothing is loaded),
    else by loading the dataset (:func:`fedshift.data.client_names`)."""
    return dataset_client_names(cfg.dataset, cfg.partition)


def simulate(
    cfg: RunConfig,
    out: str | Path | None = None,
    run_dir: Path | None = None,
    engine: str = "ray",
    options: FlowerOptions | None = None,
    cpus_per_client: float = 1.0,
    progress: bool = True,
    resume: bool = False,
    stop_after: int | None = None,
) -> RunResult:
    """Run ``cfg`` on Flower's simulation engine; returns the run directory and summary.

    The virtual SuperNodes keep per-round state snapshots under ``<run_dir>/flower-state``,
    so a simulation that was stopped continues with ``resume=True`` (from its checkpoint,
    each client from its snapshot) and ends with the numbers of an uninterrupted one.
    ``stop_after``: stop after that round (tests)."""
    if engine not in ENGINES:
        raise FedshiftError(f"--engine must be one of {ENGINES}, got {engine!r}")
    if resume and run_dir is not None and (Path(run_dir) / CHECKPOINT).is_file():
        try:  # before anything starts: a native run's checkpoint is not for Flower
            refuse_native_state(read_run_state(run_dir, map_location="cpu")["clients"])
        except FedshiftError as e:
            raise FedshiftError(f"{run_dir}: {e}") from None
    run_dir = run_dir or new_run_dir(cfg, out)
    nodes = len(client_names(cfg))
    options = options or FlowerOptions()
    options.nodes = options.nodes or nodes
    options.mode = f"simulation ({engine})"
    options.snapshot_dir = options.snapshot_dir or Path(run_dir).resolve() / "flower-state"
    results: list = []
    if engine == "in-process":
        from fedshift.flower.inprocess import InProcessGrid

        grid = InProcessGrid(build_client_app(trust_server=True), nodes)
        server = FlowerServer(cfg, run_dir, options, progress)
        return server.run(grid, resume=resume, stop_after=stop_after)

    from flwr.simulation import run_simulation

    # quiet, offline, and nothing written to ~/.flwr (run_simulation writes $FLWR_HOME/source)
    for key, value in (
        ("RAY_DEDUP_LOGS", "0"),
        ("RAY_USAGE_STATS_ENABLED", "0"),
        ("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0"),
        ("FLWR_TELEMETRY_ENABLED", "0"),
        ("FLWR_HOME", str(Path(tempfile.gettempdir()) / "fedshift-flwr-home")),
    ):
        os.environ.setdefault(key, value)
    # Flower 1.41 calls its Python simulation API deprecated in favour of `flwr run`, which
    # needs a Flower App on disk; fedshift keeps the API (same engine) and says so in the docs
    logging.getLogger("flwr").addFilter(_NoDeprecationNotice())
    backend = {
        "client_resources": {"num_cpus": cpus_per_client, "num_gpus": 0.0},
        "init_args": {"logging_level": logging.ERROR, "log_to_driver": True},
    }
    gate = SignalGate()
    server_app = build_server_app(
        cfg, run_dir, options, results, progress, resume, stop_after, gate
    )
    # one torch thread per CPU Ray reserves for a ClientApp
    client_app = build_client_app(threads=max(1, int(cpus_per_client)), trust_server=True)
    with gate.forwarded() as set_handlers:
        try:
            _start_ray(backend)
            set_handlers()  # again: Ray's start replaced the SIGTERM handler
            run_simulation(server_app, client_app, nodes, backend_config=backend)
        finally:
            _stop_ray()
    if results and isinstance(results[0], BaseException):
        raise results[0]
    if not results:
        raise FedshiftError(
            "the Flower simulation ended without a result; its log above says why (a "
            "ClientApp that failed to load, or an error in the ServerApp)"
        )
    return results[0]


def _start_ray(backend: dict) -> None:
    """Start Ray as Flower's engine would (Flower's own ``RayBackend`` start; the engine
    then finds it running and uses it), so that the signal handlers can be set after it."""
    from flwr.server.superlink.fleet.vce.backend.raybackend import RayBackend

    RayBackend(copy.deepcopy(backend))


def _stop_ray() -> None:
    import ray

    if ray.is_initialized():  # Flower's engine shuts it down, unless it never started
        ray.shutdown()


class _NoDeprecationNotice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "run_simulation" not in record.getMessage()
