"""Waiting for the SuperNodes a run needs, and refusing at once a simulation that has too few.

In a deployment, SuperNodes connect over time: the ServerApp waits up to ``node_wait``
seconds for ``nodes`` of them. On Flower's simulation runtime (``flwr run`` on a simulation
SuperLink, ``fedshift flower simulate``) every virtual SuperNode is registered at once, right
after the ServerApp starts, and none ever joins later: a simulation with another number of
SuperNodes than the run needs (Flower's default is 2) would wait the whole ``node_wait`` for
nothing, so it is refused as soon as its node count has settled, before the run directory
exists, naming Flower's ``num-supernodes`` setting.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from flwr.serverapp import Grid
from flwr.superlink.grid.inmemory_grid import InMemoryGrid

from fedshift.core.errors import FedshiftError

if TYPE_CHECKING:
    from fedshift.flower.transport import FlowerOptions

#: seconds a simulation's node count must stay the same to count as settled (Flower
#: registers every virtual SuperNode in one loop, in microseconds)
SETTLE_S = 0.3
POLL_S = 0.1


def is_simulation(grid: Grid) -> bool:
    """Whether ``grid`` is a simulation's: Flower's in-memory grid (only its simulation
    runtime uses one) or fedshift's in-process grid of ``partition-id`` nodes."""
    return isinstance(grid, InMemoryGrid) or bool(getattr(grid, "simulation", False))


def simulation_mismatch(have: int, want: int) -> str:
    """The refusal of a simulation of ``have`` SuperNodes for a run that needs ``want``."""
    return (
        f"the Flower simulation has {have} SuperNode(s) but the run needs {want}, one per "
        f"client of the config's federation (run config 'nodes' = {want}; fedshift runs one "
        f"client per SuperNode); set Flower's num-supernodes to {want}: `flwr run APP_DIR "
        f'local --federation-config "num-supernodes={want}"` (this run; the README of an app '
        "written by `fedshift flower app` gives the command), or the simulation SuperLink's "
        "default with flwr federation simulation-config. Refused before anything ran; "
        "nothing was written"
    )


def wait_for_nodes(
    grid: Grid,
    options: FlowerOptions,
    stop_check: Callable[[], None] = lambda: None,
    clock: Callable[[], float] = time.monotonic,
) -> list[int]:
    """The node ids of the run's SuperNodes. A deployment: wait up to ``options.node_wait``
    seconds for ``options.nodes`` of them. A simulation (:func:`is_simulation`): its nodes
    once their count has settled; with ``options.nodes`` set, another count is refused at
    once (:func:`simulation_mismatch`)."""
    want = options.nodes or 1
    t0 = clock()
    simulation = is_simulation(grid)
    fixed = simulation and bool(getattr(grid, "registered", False))
    seen: tuple[int, float] | None = None  # (count, since)
    while True:
        nodes = sorted(grid.get_node_ids())
        now = clock()
        if simulation and nodes:
            if seen is None or seen[0] != len(nodes):
                seen = (len(nodes), now)
            if fixed or now - seen[1] >= SETTLE_S:
                if options.nodes is not None and len(nodes) != options.nodes:
                    raise FedshiftError(simulation_mismatch(len(nodes), options.nodes))
                return nodes
        elif not simulation and len(nodes) >= want:
            return nodes
        if now - t0 > options.node_wait:
            raise FedshiftError(
                f"only {len(nodes)} of {want} SuperNodes connected after "
                f"{options.node_wait:g} s; start the missing SuperNodes (or lower "
                "--nodes / run-config nodes)"
            )
        stop_check()
        time.sleep(POLL_S if simulation else 0.5)
