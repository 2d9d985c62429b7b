"""``fedshift flower simulate``: a fedshift config on Flower's simulation engine.

The ServerApp (:class:`~fedshift.flower.server.FlowerServer`) runs in this process; every
client is a virtual SuperNode whose ClientApp runs in Flower's Ray backend (``engine=ray``)
or, for debugging without Ray, in this process (``engine=in-process``, :mod:`.inprocess`).
The virtual node ``partition-id=k`` is the k-th client of the federation. With the same seed
the run ends with the metrics of ``fedshift run`` (tested: ``tests/test_flower.py``).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from fedshift.config import RunConfig
from fedshift.data import load_dataset
from fedshift.engine.simulation import RunResult, new_run_dir
from fedshift.errors import FedshiftError
from fedshift.flower.node import build_client_app
from fedshift.flower.server import FlowerOptions, FlowerServer

ENGINES = ("ray", "in-process")


def build_server_app(
    cfg: RunConfig,
    run_dir: Path,
    options: FlowerOptions,
    results: list[RunResult],
    progress: bool = True,
) -> ServerApp:
    """A ServerApp running ``cfg`` (its result is appended to ``results``)."""
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        results.append(FlowerServer(cfg, run_dir, options, progress).run(grid))

    return app


def count_clients(cfg: RunConfig) -> int:
    """How many virtual SuperNodes the federation needs (its clients, held-out ones too)."""
    return len(load_dataset(cfg.dataset, cfg.partition).clients)


def simulate(
    cfg: RunConfig,
    out: str | Path | None = None,
    run_dir: Path | None = None,
    engine: str = "ray",
    options: FlowerOptions | None = None,
    cpus_per_client: float = 1.0,
    progress: bool = True,
) -> RunResult:
    """Run ``cfg`` on Flower's simulation engine; returns the run directory and summary."""
    if engine not in ENGINES:
        raise FedshiftError(f"--engine must be one of {ENGINES}, got {engine!r}")
    run_dir = run_dir or new_run_dir(cfg, out)
    nodes = count_clients(cfg)
    options = options or FlowerOptions()
    options.nodes = options.nodes or nodes
    options.mode = f"simulation ({engine})"
    results: list[RunResult] = []
    if engine == "in-process":
        from fedshift.flower.inprocess import InProcessGrid

        grid = InProcessGrid(build_client_app(), nodes)
        results.append(FlowerServer(cfg, run_dir, options, progress).run(grid))
        return results[0]

    from flwr.simulation import run_simulation

    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    backend = {
        "client_resources": {"num_cpus": cpus_per_client, "num_gpus": 0.0},
        "init_args": {"logging_level": logging.ERROR, "log_to_driver": True},
    }
    server_app = build_server_app(cfg, run_dir, options, results, progress)
    run_simulation(server_app, build_client_app(), nodes, backend_config=backend)
    if not results:
        raise FedshiftError(
            "the Flower simulation ended without a result; its log above says why (a "
            "ClientApp that failed to load, or an error in the ServerApp)"
        )
    return results[0]
