"""The ServerApp and ClientApp a fedshift Flower App names (``fedshift flower app``).

``pyproject.toml`` of the app::

    [tool.flwr.app.components]
    serverapp = "fedshift.flower.apps:server_app"
    clientapp = "fedshift.flower.apps:client_app"

The code is the fedshift installed on each machine (the ServerApp checks at ``hello`` that
every SuperNode runs the same version); the app itself carries only the run config:

============== ======================================================================
run config key meaning
============== ======================================================================
fedshift-config the resolved experiment config, YAML text (``fedshift flower app/submit``)
out            folder for run directories on the ServerApp's machine; ``fedshift flower app``
               writes an absolute path (a relative one is taken from the working folder
               of the ServerApp's process: the SuperLink's; "": ``runs`` there)
exists         what a run directory of the same config that holds a run does: ``error``
               (the default: the run is refused, naming what it holds), ``new`` (the next
               free ``-2``, ``-3``...) or ``overwrite``, as ``fedshift run``'s options
nodes          SuperNodes to wait for before round 1
node-wait      seconds to wait for them
round-timeout  seconds to wait for one exchange's replies
min-clients    replies a round needs when SuperNodes are lost (0: every sampled client)
resume         a run directory on the SuperLink machine to continue from its checkpoint
               ("": a new run); the SuperNodes need their state-dir snapshots
continue-with  the command a stopped run prints to continue it, ``{run_dir}`` standing for
               its directory ("": a Flower run of the same app with ``resume``)
============== ======================================================================
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

import yaml
from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from fedshift.catalog import resolve
from fedshift.core.consent import ALLOW_ENV, untrusted
from fedshift.core.errors import ConfigError, FedshiftError
from fedshift.flower.node import build_client_app
from fedshift.flower.supernodes import is_simulation, wait_for_nodes
from fedshift.runtime.rundir.ownership import EXISTS

if TYPE_CHECKING:
    from fedshift.flower.server import FlowerOptions

# The server side (round loop, results, plots) is imported in ``main``: every Flower message
# to a SuperNode starts a fresh ClientApp process that imports this module, and the client
# needs none of it (about 0.7 s of imports, matplotlib included, per message).

#: the run config an app declares, with its defaults (Flower refuses undeclared keys)
RUN_CONFIG_DEFAULTS: dict[str, object] = {
    "fedshift-config": "",
    "out": "",
    "exists": "error",
    "nodes": 1,
    "node-wait": 120.0,
    "round-timeout": 3600.0,
    "min-clients": 0,
    "resume": "",
    "continue-with": "",
}


def options_from_run_config(rc: dict) -> FlowerOptions:
    from fedshift.flower.server import FlowerOptions

    def get(key: str) -> object:
        return rc.get(key, RUN_CONFIG_DEFAULTS[key])

    return FlowerOptions(
        nodes=int(get("nodes")) or None,  # type: ignore[arg-type]
        node_wait=float(get("node-wait")),  # type: ignore[arg-type]
        round_timeout=float(get("round-timeout")),  # type: ignore[arg-type]
        min_clients=int(get("min-clients")) or None,  # type: ignore[arg-type]
        mode="deployment",
        continue_with=str(get("continue-with")) or None,
    )


#: how the SuperLink's operator allows the plug-ins a submitted run config names
SERVER_YES = f"{ALLOW_ENV}=1 in the environment of the SuperLink (its ServerApp processes)"

server_app = ServerApp()


class OneLineErrors(logging.Filter):
    """On Flower's logger: a ServerApp that ended with a :class:`FedshiftError` (a refusal
    that names its fix) is logged as that one line, ``fedshift: error: ...``, without
    Flower's traceback; every other record passes as it is."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, FedshiftError):
            record.msg, record.args = "fedshift: error: %s", (str(exc),)
            record.exc_info, record.exc_text = None, None
        return True


def one_line_errors() -> None:
    """Install :class:`OneLineErrors` on Flower's logger (once per process)."""
    flwr_log = logging.getLogger("flwr")
    if not any(isinstance(f, OneLineErrors) for f in flwr_log.filters):
        flwr_log.addFilter(OneLineErrors())


def run_out(rc: dict) -> Path:
    """The run config's ``out`` as an absolute path (a relative one from this process's
    working folder, which the run directory line then names)."""
    return Path(str(rc.get("out") or "runs")).expanduser().resolve()


def run_exists(rc: dict) -> str:
    """The run config's ``exists`` (checked)."""
    value = str(rc.get("exists") or RUN_CONFIG_DEFAULTS["exists"])
    if value not in EXISTS:
        raise ConfigError(
            f"run config 'exists' = {value!r}: use one of {', '.join(EXISTS)} "
            "(`flwr run APP_DIR --run-config \"exists='new'\"`)"
        )
    return value


@server_app.main()
def main(grid: Grid, context: Context) -> None:
    from fedshift.flower.server import FlowerServer
    from fedshift.runtime.rundir.ownership import clear_run_dir, hold_run
    from fedshift.runtime.rundir.results import claim_dirs, release
    from fedshift.runtime.simulation import saved_config

    one_line_errors()
    rc = dict(context.run_config)
    text = str(rc.get("fedshift-config") or "")
    if not text.strip():
        raise ConfigError(
            "run config 'fedshift-config' is empty: write the app with `fedshift flower app` "
            "or submit with `fedshift flower submit`, which put the experiment config there"
        )
    options = options_from_run_config(rc)
    options.check()
    resume = str(rc.get("resume") or "")
    exists = run_exists(rc)
    if resume:  # continue a stopped run with the config it was started with
        run_dir = Path(resume)
        with untrusted(f"run directory {run_dir}", how=SERVER_YES):
            cfg = saved_config(run_dir)
    else:
        raw = yaml.safe_load(text)
        # the run config comes from whoever submitted the run: its plug-ins need this
        # machine's yes (fedshift.core.consent)
        with untrusted("the Flower run config 'fedshift-config'", [raw], how=SERVER_YES):
            cfg = resolve(raw, source="run config 'fedshift-config'")
    # the SuperNodes before anything is written: a simulation with another number of them
    # is refused at once, a deployment waits up to node-wait seconds for the missing ones
    wait_for_nodes(grid, options)
    if is_simulation(grid):
        options.mode = "simulation (flwr run)"
    claimed = [] if resume else claim_dirs([cfg], run_out(rc), exists, "flwr run")
    run_dir = run_dir if resume else claimed[0]
    print(f"fedshift: run directory {Path(run_dir).resolve()}", flush=True)
    try:
        with hold_run(run_dir):
            if exists == "overwrite" and not resume:
                clear_run_dir(run_dir)
            server = FlowerServer(cfg, run_dir, options, progress=False)
            result = server.run(grid, resume=bool(resume))
    finally:
        release(claimed)  # a run that never started leaves no empty directory
    s = result.summary
    print(
        f"fedshift: done. {s['metric_label']} test mean {100 * s['test_mean']:.2f} at round "
        f"{s['best_round']} (selected on validation); lost clients: "
        f"{s['runtime']['lost'] or 'none'}; summary: {Path(run_dir).resolve() / 'summary.json'}",
        flush=True,
    )


client_app = build_client_app()
