"""``fedshift flower ...``: simulate on Flower, and deploy across machines.

fedshift flower simulate [-c CONFIG] [key=value ...]   Flower's simulation engine (Ray)
fedshift flower certs DIR [--host NAME ...]            self-signed CA + SuperLink certificate
fedshift flower keys DIR NAME [NAME ...]               SuperNode authentication key pairs
fedshift flower local [-c CONFIG] [key=value ...]      SuperLink + SuperNodes here, then submit
fedshift flower app DIR [-c CONFIG] [key=value ...]    write the Flower App `flwr run` takes
fedshift flower submit [-c CONFIG] [key=value ...] --superlink HOST:PORT --root-cert CA
                                                        submit a run to a SuperLink

The handlers import :mod:`fedshift.flower` (and so ``flwr``) only when they run.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from fedshift.core.errors import FedshiftError


def _options(args: argparse.Namespace):
    from fedshift.flower.server import FlowerOptions

    return FlowerOptions(
        nodes=getattr(args, "nodes", None),
        node_wait=args.node_wait,
        round_timeout=args.round_timeout,
        min_clients=args.min_clients,
    )


def _config(args: argparse.Namespace):
    from fedshift.catalog import resolve
    from fedshift.core.config import expand_sweep, load_config

    source = args.config or "defaults"
    raw = load_config(args.config, args.overrides)  # key=value on a swept key replaces it
    cells = expand_sweep(raw, source)
    if len(cells) != 1:
        keys = ", ".join(raw.get("sweep") or {})
        raise FedshiftError(
            f"the config has a sweep grid ({len(cells)} runs over {keys}); `fedshift flower` "
            "runs one experiment: give each swept key one value with key=value (it replaces "
            "the key's sweep), or run the grid natively with `fedshift run -c` / `fedshift "
            "bench`"
        )
    return resolve(cells[0], source)


def _cmd_simulate(args: argparse.Namespace) -> int:
    """One run on Flower's simulation engine, into its run directory as ``fedshift run``
    claims one: an existing directory of the same config stops the command naming what it
    holds, unless ``--overwrite`` (deleted, holding its lock, just before the run) or
    ``--new`` (the next free ``-2``, ``-3``...)."""
    from fedshift.cli.run import announce_out
    from fedshift.cli.sweeps import claim_dirs, release
    from fedshift.eval.tables import print_tables
    from fedshift.flower.simulate import simulate
    from fedshift.runtime.rundir import clear_run_dir, hold_run

    if args.resume:  # the run's saved config; nothing else may change
        from fedshift.runtime.simulation import saved_config

        given = [
            what
            for what, on in (
                ("-c and key=value", args.config or args.overrides),
                ("--new", args.new),
                ("--overwrite", args.overwrite),
            )
            if on
        ]
        if given:
            raise FedshiftError(
                f"--resume takes the run's saved config and directory; drop {' and '.join(given)}"
            )
        cfg, run_dir = saved_config(args.resume), Path(args.resume)
    else:
        cfg = _config(args)
        announce_out(args.config, args.overrides, args.out)
        exists = "overwrite" if args.overwrite else "new" if args.new else "error"
        [run_dir] = claim_dirs([cfg], args.out, exists, "fedshift flower simulate")
    try:
        with hold_run(run_dir):
            if args.overwrite:
                clear_run_dir(run_dir)
            result = simulate(
                cfg,
                out=args.out,
                run_dir=run_dir,
                engine=args.engine,
                options=_options(args),
                cpus_per_client=args.cpus_per_client,
                progress=not args.quiet,
                resume=bool(args.resume),
            )
    finally:
        if not args.resume:
            release([run_dir])  # a run that never started leaves no empty directory
    print_tables([result.summary])
    rt = result.summary["runtime"]
    print(f"\nFlower {rt['flwr']}, {rt['mode']}, {result.summary['wall_s']:.1f} s")
    if rt["lost"]:
        print(f"lost clients (round first lost): {rt['lost']}")
    print(f"run directory: {result.run_dir}")
    return 0


def _cmd_certs(args: argparse.Namespace) -> int:
    from fedshift.flower.deploy import make_certificates

    paths = make_certificates(Path(args.dir), args.host or ["127.0.0.1", "localhost"])
    for k, v in paths.items():
        print(f"{k:12s} {v}")
    return 0


def _cmd_keys(args: argparse.Namespace) -> int:
    from fedshift.flower.deploy import make_node_keys

    for name, (private, public) in make_node_keys(Path(args.dir), args.names).items():
        print(f"{name}: {private} (stays on the SuperNode), {public} (register at the SuperLink)")
    return 0


def _cmd_app(args: argparse.Namespace) -> int:
    """Write the Flower App; its ServerApp waits for one SuperNode per client of the config
    and its local simulation federation has that many (``--nodes`` where the config's data
    is not on this machine to count them)."""
    from fedshift.flower.deploy import local_federation, write_app
    from fedshift.flower.simulate import client_names

    cfg = _config(args)
    try:
        clients: int | None = len(client_names(cfg))
    except (FedshiftError, OSError, ValueError) as e:  # the data is on the sites, not here
        if args.nodes is None:
            raise FedshiftError(
                f"cannot load the config's dataset here to count its clients ({e}); give "
                "--nodes N, one SuperNode per client"
            ) from None
        clients = None
    if clients is not None and args.nodes is not None and args.nodes != clients:
        raise FedshiftError(
            f"--nodes {args.nodes}: the config's federation has {clients} clients, and "
            f"fedshift runs one client per SuperNode; give --nodes {clients} (or leave it out)"
        )
    nodes = int(args.nodes or clients)  # type: ignore[arg-type]
    options = _options(args)
    options.nodes = nodes
    path = write_app(Path(args.dir), cfg, options, out=args.out, local_nodes=nodes)
    print(
        f"Flower App: {path}, for {nodes} SuperNodes (one per client). `flwr run {path}` runs "
        f"it on a local simulation of {nodes} SuperNodes (its pinned federation "
        f"{local_federation(nodes)}); `flwr run {path} <connection>` submits it to a SuperLink"
    )
    return 0


def _cmd_submit(args: argparse.Namespace) -> int:
    from fedshift.flower.deploy import submit

    return submit(
        _config(args),
        _options(args),
        superlink=args.superlink,
        root_cert=Path(args.root_cert) if args.root_cert else None,
        insecure=args.insecure,
        out=args.out,
        stream=not args.no_stream,
        app_dir=Path(args.app_dir) if args.app_dir else None,
    )


def _cmd_local(args: argparse.Namespace) -> int:
    import json
    import tempfile

    from fedshift.core.consent import plugin_names
    from fedshift.eval.tables import print_tables
    from fedshift.flower.deploy import LocalDeployment
    from fedshift.flower.simulate import client_names

    cfg = _config(args)
    names = client_names(cfg)
    base = Path(args.dir or tempfile.mkdtemp(prefix="fedshift-sites-"))
    out = Path(args.out or "runs").resolve()
    print(f"starting a SuperLink and {len(names)} SuperNodes ({', '.join(names)}) under {base}")
    # the user's own config, run on the user's own machine: its plug-ins are theirs
    mine = bool(plugin_names(cfg.to_dict()))
    nodes = [{"client": n} for n in names]
    with LocalDeployment(base, nodes, tls=not args.insecure, allow_plugins=mine) as dep:
        _, status, log = dep.submit(cfg, _options(args), out, log=print)
    marker = "fedshift: run directory "
    run_dir = next((ln.split(marker, 1)[1].strip() for ln in log.splitlines() if marker in ln), "")
    summary = Path(run_dir) / "summary.json"
    if status == "finished:completed" and summary.is_file():
        print()
        print_tables([json.loads(summary.read_text())])
    print(f"\nfedshift: Flower run {status}; logs of every process: {base / 'logs'}")
    return 0 if status == "finished:completed" else 1


def _experiment_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("-c", "--config", help="YAML config file")
    p.add_argument(
        "overrides",
        nargs="*",
        help="key=value overrides, e.g. train.rounds=20 (one on a key the config sweeps "
        "replaces that key's sweep: one run)",
    )
    p.add_argument(
        "--min-clients",
        type=int,
        help="replies a round needs to complete when SuperNodes are lost (default: every "
        "sampled client, so results never change silently)",
    )
    p.add_argument(
        "--round-timeout",
        type=float,
        default=3600.0,
        help="seconds to wait for a round's replies before the silent clients count as lost",
    )
    p.add_argument(
        "--node-wait", type=float, default=120.0, help="seconds to wait for the SuperNodes"
    )


def add_parser(sub: argparse._SubParsersAction) -> None:
    from fedshift.cli.run import add_allow_plugins, add_exists_options

    fl = sub.add_parser("flower", help="run on Flower: simulation and deployment")
    fsub = fl.add_subparsers(dest="flower_command", required=True)

    sim = fsub.add_parser("simulate", help="run a config on Flower's simulation engine")
    _experiment_args(sim)
    sim.add_argument("--out", help="root folder for run directories (config key 'out')")
    sim.add_argument(
        "--engine",
        choices=["ray", "in-process"],
        default="ray",
        help="ray: Flower's simulation engine; in-process: no Ray, for debugging",
    )
    sim.add_argument(
        "--cpus-per-client", type=float, default=1.0, help="Ray CPUs reserved per ClientApp"
    )
    sim.add_argument("--quiet", action="store_true", help="no progress bar")
    sim.add_argument(
        "--resume",
        metavar="RUN_DIR",
        help="continue a stopped simulation from its checkpoint (clients from their snapshots)",
    )
    add_exists_options(sim)
    add_allow_plugins(sim)
    sim.set_defaults(fn=_cmd_simulate)

    certs = fsub.add_parser("certs", help="self-signed CA + SuperLink TLS certificate")
    certs.add_argument("dir", help="output folder")
    certs.add_argument(
        "--host",
        action="append",
        help="SuperLink host name or IP the certificate is valid for (repeat; default "
        "127.0.0.1 and localhost)",
    )
    certs.set_defaults(fn=_cmd_certs)

    keys = fsub.add_parser("keys", help="SuperNode authentication key pairs")
    keys.add_argument("dir", help="output folder")
    keys.add_argument("names", nargs="+", help="one name per SuperNode, e.g. site1 site2")
    keys.set_defaults(fn=_cmd_keys)

    app = fsub.add_parser("app", help="write the Flower App (FAB source) of a config")
    app.add_argument("dir", help="output folder")
    _experiment_args(app)
    app.add_argument(
        "--nodes",
        type=int,
        help="SuperNodes the ServerApp waits for: one per client of the config (default: the "
        "config's clients, counted from its dataset; needed where the data is not here)",
    )
    app.add_argument("--out", help="run folder on the SuperLink machine (default: runs)")
    app.set_defaults(fn=_cmd_app)

    loc = fsub.add_parser(
        "local", help="a SuperLink + one SuperNode per client on this machine, then submit"
    )
    _experiment_args(loc)
    loc.add_argument("--dir", help="folder for certificates, keys, homes and logs (temp)")
    loc.add_argument("--out", help="root folder for run directories (default: ./runs)")
    loc.add_argument("--insecure", action="store_true", help="no TLS, no SuperNode auth")
    loc.set_defaults(fn=_cmd_local)

    sm = fsub.add_parser("submit", help="submit a config as a run to a SuperLink")
    _experiment_args(sm)
    sm.add_argument("--superlink", required=True, help="SuperLink control API, HOST:PORT")
    sm.add_argument("--root-cert", help="CA certificate that signed the SuperLink's (TLS)")
    sm.add_argument("--insecure", action="store_true", help="no TLS (local tests only)")
    sm.add_argument("--nodes", type=int, required=True, help="SuperNodes to wait for")
    sm.add_argument("--out", help="run folder on the SuperLink machine (default: runs)")
    sm.add_argument("--app-dir", help="where to write the Flower App (default: a temp folder)")
    sm.add_argument("--no-stream", action="store_true", help="return once the run is submitted")
    sm.set_defaults(fn=_cmd_submit)
