"""The Flower App folder ``flwr run`` takes (``fedshift flower app``, ``submit``, ``local``).

Only a ``pyproject.toml`` (its components are fedshift's installed ServerApp and ClientApp,
:mod:`fedshift.flower.apps`; its run config holds the experiment) and a README saying how to
run it, where its runs go and what a taken run directory does. No
``[tool.flwr.federations]``: Flower 1.41 calls that section legacy and, on the app's first
``flwr run``, moves it into the user's Flower config (``$FLWR_HOME/config.toml``) as a
SuperLink connection made the default; Flower 1.28+ sets a simulation's size per run
(``flwr run --federation-config "num-supernodes=N"``) or at the SuperLink (``flwr federation
simulation-config``), which is what the README gives.
"""

from __future__ import annotations

import re
from pathlib import Path

import tomli_w
import yaml

from fedshift.core.config import RunConfig
from fedshift.core.files import write_text_atomic
from fedshift.flower.apps import RUN_CONFIG_DEFAULTS
from fedshift.flower.server import FlowerOptions


def simulation_command(folder: Path, nodes: int) -> str:
    """The ``flwr run`` that runs the app in ``folder`` on Flower's local simulation with one
    virtual SuperNode per client: Flower's ``local`` connection (in every Flower config it
    creates) and this run's ``num-supernodes`` (``--federation-config``, Flower 1.41's
    per-run simulation setting: the app and the user's Flower config stay as they are)."""
    return f'flwr run {folder} local --federation-config "num-supernodes={nodes}" --stream'


def write_app(
    folder: Path,
    cfg: RunConfig,
    options: FlowerOptions,
    out: str | None = None,
    local_nodes: int | None = None,
    resume: str | None = None,
    exists: str = "error",
) -> Path:
    """A Flower App folder for ``flwr run``: a ``pyproject.toml`` naming fedshift's
    ServerApp/ClientApp, its run config holding ``cfg`` and ``options``, and a README.

    ``out``: the folder for run directories on the ServerApp's machine (run config ``out``;
    ``fedshift flower app`` gives an absolute path, which the README states; a relative one
    is taken from the ServerApp's working folder). ``exists``: what a run directory of the
    same config that holds a run does (``error``, ``new``, ``overwrite``; run config
    ``exists``). ``local_nodes``: the app is also for Flower's local simulation with that
    many SuperNodes, one per client of the config; the README gives the command
    (:func:`simulation_command`). The app has no ``[tool.flwr.federations]`` (Flower 1.41
    moves such a section into the user's Flower config, making it the default connection):
    nothing here or in ``flwr run`` of the app changes the user's Flower config. ``resume``:
    a run directory on the SuperLink machine the run continues (run config ``resume``);
    ``options.continue_with``: the command a stopped run prints (run config
    ``continue-with``)."""
    folder.mkdir(parents=True, exist_ok=True)
    run_config = dict(RUN_CONFIG_DEFAULTS)
    run_config.update(
        {
            "fedshift-config": yaml.safe_dump(cfg.to_dict(), sort_keys=False),
            "out": str(out or ""),
            "exists": exists,
            "nodes": int(options.nodes or 1),
            "node-wait": float(options.node_wait),
            "round-timeout": float(options.round_timeout),
            "min-clients": int(options.min_clients or 0),
            "resume": str(resume or ""),
            "continue-with": str(options.continue_with or ""),
        }
    )
    name = re.sub(r"[^a-z0-9-]", "-", f"fedshift-{cfg.name}".lower())
    project = {
        "build-system": {"requires": ["hatchling"], "build-backend": "hatchling.build"},
        "project": {
            "name": name,
            "version": "1.0.0",
            "description": f"fedshift run: {cfg.algorithm.name} on {cfg.dataset.name}",
            "license": "Apache-2.0",
            # the code is the fedshift installed on every machine, not shipped in the app
            "dependencies": [],
        },
        "tool": {
            "hatch": {"build": {"targets": {"wheel": {"packages": ["."]}}}},
            "flwr": {
                "app": {
                    "publisher": "fedshift",
                    "components": {
                        "serverapp": "fedshift.flower.apps:server_app",
                        "clientapp": "fedshift.flower.apps:client_app",
                    },
                    "config": run_config,
                }
            },
        },
    }
    write_text_atomic(folder / "pyproject.toml", tomli_w.dumps(project))
    write_text_atomic(folder / "README.md", app_readme(folder, name, run_config, local_nodes))
    return folder


def app_readme(folder: Path, name: str, rc: dict, local_nodes: int | None) -> str:
    """The generated app's README: how to run it, where its runs go, what a taken run
    directory does."""
    nodes = int(rc["nodes"])  # type: ignore[call-overload]
    out = str(rc["out"]) or "runs"
    where = (
        f"`{out}`" if Path(out).is_absolute() else
        f"`{out}`, relative to the working folder of the SuperLink that runs the ServerApp"
    )  # fmt: skip
    text = [
        f"# {name}\n",
        "A fedshift experiment as a Flower App, written by `fedshift flower app`; the code is "
        "the fedshift installed where the ServerApp and ClientApps run, the run config "
        "(`pyproject.toml`) holds the experiment.\n",
    ]
    if local_nodes is not None:
        text.append(
            f"Run it on Flower's local simulation, one SuperNode per client of the config "
            f"({local_nodes}):\n\n    {simulation_command(folder.resolve(), local_nodes)}\n\n"
            "`local` is the local-simulation connection of Flower's own config; the "
            "SuperNode count is set for this run only, and neither the app nor your Flower "
            "config (`$FLWR_HOME/config.toml`, by default `~/.flwr/config.toml`) is changed. "
            f"Without it Flower simulates 2 SuperNodes, and the ServerApp refuses the run at "
            f"once, naming `num-supernodes`.\n"
        )
    text.append(
        f"Submit it to a SuperLink with `flwr run {folder.resolve()} <connection>`; the "
        f"ServerApp waits up to {float(rc['node-wait']):g} s for {nodes} SuperNodes, one per "  # type: ignore[arg-type]
        "client (`fedshift docs deploy`).\n"
    )
    text.append(
        f"Runs are written under {where} (run config `out`; change it with `--run-config "
        f"\"out='/abs/folder'\"`), one run directory per config and seed, "
        "`<out>/<config name>/<algorithm>-<dataset>-...-seed<seed>-<digest>`; the ServerApp's "
        "log names it (`fedshift: run directory ...`). If that directory already holds a run, "
        f"the run config `exists` (here `{rc['exists']}`) decides, as `fedshift run`'s options "
        "do: `error` refuses the run, naming what the directory holds; `new` writes to the "
        "next free `-2`, `-3`...; `overwrite` deletes the old run first. To continue a stopped "
        "run instead: `--run-config \"resume='RUN_DIR'\"`.\n"
    )
    return "\n".join(text)
