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
import contextlib
import shlex
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

from fedshift.cli.options import add_config_args
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
    from fedshift.core.config import load_config
    from fedshift.core.config_tree import single_cell

    source = args.config or "defaults"
    raw = load_config(args.config, args.overrides)  # key=value on a swept key replaces it
    cell = single_cell(
        raw,
        source,
        lambda n, keys: (
            f"the config has a sweep grid ({n} runs over {keys}); `fedshift flower` "
            "runs one experiment: give each swept key one value with key=value (it replaces "
            "the key's sweep), or run the grid natively with `fedshift run -c` / `fedshift "
            "bench`"
        ),
        FedshiftError,
    )
    return resolve(cell, source)


def _cmd_simulate(args: argparse.Namespace) -> int:
    """One run on Flower's simulation engine, into its run directory as ``fedshift run``
    claims one: an existing directory of the same config stops the command naming what it
    holds, unless ``--overwrite`` (deleted, holding its lock, just before the run) or
    ``--new`` (the next free ``-2``, ``-3``...)."""
    from fedshift.cli.run import announce_out
    from fedshift.cli.sweeps import claim_dirs, release
    from fedshift.eval.tables import print_tables
    from fedshift.flower.simulate import simulate
    from fedshift.runtime.rundir.ownership import clear_run_dir, hold_run

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
    (``--nodes`` where the config's data is not on this machine to count them) and writes its
    runs under ``--out`` (else the config's ``out``), made absolute here."""
    from fedshift.flower.deploy import simulation_command, write_app
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
    out = Path(args.out or cfg.out).expanduser().resolve()
    exists = "overwrite" if args.overwrite else "new" if args.new else "error"
    path = write_app(Path(args.dir), cfg, options, str(out), local_nodes=nodes, exists=exists)
    print(
        f"Flower App: {path}, for {nodes} SuperNodes (one per client); runs go under {out} "
        f"(see {path / 'README.md'}). On Flower's local simulation: "
        f"{simulation_command(path.resolve(), nodes)}; on a SuperLink: `flwr run {path} "
        "<connection>`"
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


class _Stop(Exception):
    """SIGINT or SIGTERM reached ``fedshift flower local``."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


@contextlib.contextmanager
def _signals(handler) -> Iterator[None]:
    """SIGINT and SIGTERM handled by ``handler`` (a function, or ``signal.SIG_IGN``) inside
    the block; the previous handlers after it."""
    sigs = (signal.SIGINT, signal.SIGTERM)
    old = {s: signal.signal(s, handler) for s in sigs}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def _raise_stop(signum: int, frame: object) -> None:
    raise _Stop(signum)


def _continue_command(args: argparse.Namespace, base: Path) -> str:
    """The ``fedshift flower local`` that continues this one's run (``{run_dir}`` for its
    directory): the same SuperNode state folder (``--dir``) and options."""
    parts = ["fedshift flower local --resume {run_dir}", f"--dir {shlex.quote(str(base))}"]
    if args.insecure:
        parts.append("--insecure")
    if args.min_clients is not None:
        parts.append(f"--min-clients {args.min_clients}")
    for flag, value, default in (
        ("--round-timeout", args.round_timeout, 3600.0),
        ("--node-wait", args.node_wait, 120.0),
    ):
        if value != default:
            parts.append(f"{flag} {value:g}")
    return " ".join(parts)


def _local_config(args: argparse.Namespace):
    """The config of ``flower local``: the run's saved one with ``--resume`` (nothing else
    may be given then), else ``-c`` and ``key=value``."""
    if not args.resume:
        return _config(args)
    from fedshift.runtime.simulation import saved_config

    if args.config or args.overrides or args.out or args.new or args.overwrite:
        raise FedshiftError(
            "--resume takes the run's saved config and directory; drop -c, key=value, --out, "
            "--new and --overwrite"
        )
    if not args.dir:
        raise FedshiftError(
            "--resume needs the --dir the stopped run used (its SuperNodes keep each client's "
            "state there): run the command the stopped run printed"
        )
    return saved_config(args.resume)


def _cmd_local(args: argparse.Namespace) -> int:
    """A SuperLink and one SuperNode per client here, the run submitted and its ServerApp's
    log streamed. SIGINT (Ctrl-C) or SIGTERM stops it as a native run stops: the ServerApp
    saves its last whole round, every process the command started ends (SuperLink,
    SuperExecs, ServerApp, SuperNodes, ClientApps), and the command that continues it is
    printed (exit 130 / 143). Each SuperNode keeps its client's state in ``--dir``/state, so
    ``--resume`` continues to the numbers of an uninterrupted run."""
    import json
    import tempfile

    from fedshift.core.consent import plugin_names
    from fedshift.eval.tables import print_tables
    from fedshift.flower.deploy import LocalDeployment
    from fedshift.flower.simulate import client_names

    cfg = _local_config(args)
    names = client_names(cfg)
    out = Path(args.out or "runs").resolve()
    exists = "overwrite" if args.overwrite else "new" if args.new else "error"
    if not args.resume and exists == "error":  # before any process starts
        from fedshift.runtime.rundir.ownership import RunDirExists, is_empty
        from fedshift.runtime.rundir.results import planned_dirs

        [planned] = planned_dirs([cfg], out)
        if planned.exists() and not is_empty(planned):
            raise RunDirExists([planned], "fedshift flower local", [cfg.to_dict()])
    base = Path(args.dir or tempfile.mkdtemp(prefix="fedshift-sites-")).resolve()
    print(f"starting a SuperLink and {len(names)} SuperNodes ({', '.join(names)}) under {base}")
    # the user's own config, run on the user's own machine: its plug-ins are theirs
    mine = bool(plugin_names(cfg.to_dict()))
    # each SuperNode computes with the config's run.threads (as a native run does: the same
    # numbers) and keeps its client's state on disk (what --resume continues from)
    threads = cfg.run.threads
    nodes = [{"client": n, "state-dir": str(base / "state" / n), "threads": threads} for n in names]
    options = _options(args)
    options.continue_with = _continue_command(args, base)
    dep = LocalDeployment(base, nodes, tls=not args.insecure, allow_plugins=mine)
    shown = _LogFilter()
    stopped, status = None, "unknown"
    try:
        with _signals(_raise_stop):
            dep.start()
            _, status, _ = dep.submit(
                cfg, options, out, log=shown, resume=args.resume, exists=exists
            )
    except _Stop as stop:
        stopped = stop.signum
        with _signals(signal.SIG_IGN):  # a second Ctrl-C must not cut the saving short
            name = signal.Signals(stop.signum).name
            print(f"\nfedshift: {name}: stopping the run (the ServerApp saves its last whole "
                  "round), then every process this command started", flush=True)  # fmt: skip
            dep.stop_runs()
    finally:
        with _signals(signal.SIG_IGN):
            dep.close()
    run_dir = Path(shown.run_dir) if shown.run_dir else None
    if stopped is not None:
        return _stopped(stopped, run_dir, options.continue_with, base)
    summary = run_dir / "summary.json" if run_dir else None
    if status == "finished:completed" and summary is not None and summary.is_file():
        print()
        print_tables([json.loads(summary.read_text())])
    else:
        _failed(run_dir, shown, options.continue_with)
    print(f"\nfedshift: Flower run {status}; logs of every process: {base / 'logs'}")
    return 0 if status == "finished:completed" else 1


class _LogFilter:
    """The ServerApp's streamed log, shown without Python tracebacks (a failed run's cause is
    one line at the end, :func:`_failed`; the whole log stays in the ServerApp's log file):
    remembers the run directory the ServerApp names."""

    MARK = "fedshift: run directory "

    def __init__(self) -> None:
        self.run_dir = ""
        self.in_traceback = False
        self.hidden = 0

    def __call__(self, line: str) -> None:
        if self.MARK in line and not self.run_dir:
            self.run_dir = line.split(self.MARK, 1)[1].strip()
        if "Traceback (most recent call last)" in line:
            self.in_traceback = True
        elif self.in_traceback and line[:1] not in (" ", "\t", "") and ":" in line:
            self.in_traceback = False  # the exception's own line ends the block
            self.hidden += 1
            return
        if self.in_traceback:
            self.hidden += 1
            return
        print(line, flush=True)


def _stop_reason(run_dir: Path | None) -> str:
    """The last ``stopped: ...`` line of the run's ``run.log`` (what the ServerApp raised)."""
    log = run_dir / "run.log" if run_dir else None
    if log is None or not log.is_file():
        return ""
    lines = [ln for ln in log.read_text().splitlines() if " stopped: " in ln]
    return lines[-1].split(" stopped: ", 1)[1] if lines else ""


def _failed(run_dir: Path | None, shown: _LogFilter, continue_with: str | None) -> None:
    """A failed run's cause in one line (from its ``run.log``), and how to continue it."""
    reason = _stop_reason(run_dir)
    if reason:
        print(f"fedshift: error: {reason}", file=sys.stderr)
    elif shown.hidden:
        print("fedshift: error: the ServerApp failed (its traceback is in the logs below)",
              file=sys.stderr)  # fmt: skip
    saved = run_dir is not None and (run_dir / "checkpoint.pt").is_file()
    if saved and continue_with and "continue with" not in reason:
        cmd = continue_with.replace("{run_dir}", shlex.quote(str(run_dir)))
        print(f"fedshift: continue with: {cmd}", file=sys.stderr)


def _stopped(signum: int, run_dir: Path | None, continue_with: str | None, base: Path) -> int:
    """What a stopped ``flower local`` prints: where the state is and how to continue."""
    if run_dir is not None and (run_dir / "checkpoint.pt").is_file() and continue_with:
        cmd = continue_with.replace("{run_dir}", shlex.quote(str(run_dir)))
        print(f"fedshift: stopped; the last whole round is saved in {run_dir / 'checkpoint.pt'}"
              f". Continue with: {cmd}", file=sys.stderr)  # fmt: skip
    else:
        print("fedshift: stopped before a round was saved; nothing to continue: run the "
              "command again", file=sys.stderr)  # fmt: skip
    print(f"fedshift: every process it started has ended; logs: {base / 'logs'}",
          file=sys.stderr)  # fmt: skip
    return 128 + signum


def _experiment_args(p: argparse.ArgumentParser) -> None:
    add_config_args(
        p,
        "key=value overrides, e.g. train.rounds=20 (one on a key the config sweeps "
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
    from fedshift.cli.plugins import add_allow_plugins
    from fedshift.cli.run import add_exists_options

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
    app.add_argument(
        "--out",
        help="folder for run directories on the ServerApp's machine, written into the app as "
        "an absolute path (a relative one from this folder; default: the config's out, runs)",
    )
    add_exists_options(app)
    app.set_defaults(fn=_cmd_app)

    loc = fsub.add_parser(
        "local", help="a SuperLink + one SuperNode per client on this machine, then submit"
    )
    _experiment_args(loc)
    loc.add_argument("--dir", help="folder for certificates, keys, homes and logs (temp)")
    loc.add_argument("--out", help="root folder for run directories (default: ./runs)")
    loc.add_argument("--insecure", action="store_true", help="no TLS, no SuperNode auth")
    loc.add_argument(
        "--resume",
        metavar="RUN_DIR",
        help="continue a stopped run from its checkpoint (give the same --dir: the SuperNodes' "
        "client state is there); the command a stopped run prints",
    )
    add_exists_options(loc)
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
