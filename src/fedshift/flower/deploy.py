"""Deployment across machines: TLS certificates, SuperNode keys, the Flower App, submission,
and a local SuperLink + SuperNodes for trying (and testing) all of it on one machine.

Flower 1.41's deployment runtime, as fedshift uses it (docs/DEPLOY.md has the commands):

- one ``flower-superlink`` serves the Fleet, Control and Runtime APIs on one HTTPS port;
  TLS from ``--ssl-ca-certfile/--ssl-certfile/--ssl-keyfile`` (:func:`make_certificates`);
  ``--enable-supernode-auth`` admits only SuperNodes whose public key was registered with
  ``flwr supernode register KEY.pub`` (:func:`make_node_keys`: ECDSA P-384, OpenSSH format);
- one ``flower-supernode`` per client, ``--root-certificates ca.crt
  --auth-supernode-private-key KEY --node-config "client='site1' dataset.root='/data'"``;
  each message starts a fresh ClientApp process; the client state is kept in the node's
  Flower context between messages (and on disk with ``state-dir``);
- ``flwr run APP CONNECTION`` submits a Flower App (:func:`write_app`) whose components are
  fedshift's installed ServerApp/ClientApp and whose run config carries the experiment;
  :func:`submit` (``fedshift flower submit``) does it and streams the ServerApp's log.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import ipaddress
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import tomli_w

from fedshift.core.config import RunConfig
from fedshift.core.consent import ALLOW_ENV
from fedshift.core.errors import FedshiftError
from fedshift.core.files import open_append, write_bytes_atomic, write_text_atomic
from fedshift.flower.appfolder import simulation_command, write_app
from fedshift.flower.proctree import command, descendants, stop_all
from fedshift.flower.server import FlowerOptions

__all__ = ["simulation_command", "write_app"]  # the app folder: fedshift.flower.appfolder

CONNECTION = "fedshift"
ANSI = re.compile(r"\x1b\[[0-9;]*m")


# ---------------------------------------------------------------------------- TLS and keys
def make_certificates(folder: Path, hosts: list[str], days: int = 365) -> dict[str, Path]:
    """A self-signed CA (``ca.crt``/``ca.key``) and a SuperLink certificate signed by it
    (``server.pem``/``server.key``) valid for ``hosts`` (IPs and DNS names). The CA
    certificate goes to every SuperNode and to whoever submits runs; the keys stay put."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    folder.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP384R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fedshift federation CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )  # fmt: skip
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP384R1())
    names: list[x509.GeneralName] = []
    for h in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            names.append(x509.DNSName(h))
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    plain = serialization.NoEncryption()
    pkcs8 = serialization.PrivateFormat.PKCS8
    out = {
        "ca.crt": ca.public_bytes(pem),
        "ca.key": ca_key.private_bytes(pem, pkcs8, plain),
        "server.pem": cert.public_bytes(pem),
        "server.key": key.private_bytes(pem, pkcs8, plain),
    }
    paths = {}
    for name, data in out.items():
        path = folder / name
        write_bytes_atomic(path, data, 0o600 if name.endswith(".key") else 0o666)
        paths[name] = path
    return paths


def make_node_keys(folder: Path, names: list[str]) -> dict[str, tuple[Path, Path]]:
    """One ECDSA P-384 key pair per SuperNode in OpenSSH format (``<name>`` private, stays on
    the node; ``<name>.pub``, registered at the SuperLink with ``flwr supernode register``)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    folder.mkdir(parents=True, exist_ok=True)
    out = {}
    for name in names:
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
            raise FedshiftError(f"SuperNode name {name!r}: use letters, digits, . _ - only")
        key = ec.generate_private_key(ec.SECP384R1())
        private = folder / name
        public = folder / f"{name}.pub"
        pem = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.OpenSSH,
            serialization.NoEncryption(),
        )
        write_bytes_atomic(private, pem, 0o600)
        openssh = key.public_key().public_bytes(
            serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
        )
        write_bytes_atomic(public, openssh + f" {name}\n".encode())
        out[name] = (private, public)
    return out


def write_connection(
    home: Path, address: str, root_cert: Path | None, insecure: bool = False
) -> None:
    """``$FLWR_HOME/config.toml`` with one SuperLink connection named ``fedshift``."""
    if root_cert is None and not insecure:
        raise FedshiftError(
            "TLS is on by default: pass --root-cert CA.crt (the CA that signed the "
            "SuperLink's certificate; `fedshift flower certs` makes one), or --insecure"
        )
    conn: dict[str, object] = {"address": address}
    if insecure:
        conn["insecure"] = True
    else:
        conn["root-certificates"] = str(Path(root_cert).resolve())  # type: ignore[arg-type]
    home.mkdir(parents=True, exist_ok=True)
    doc = {"superlink": {"default": CONNECTION, CONNECTION: conn}}
    write_text_atomic(home / "config.toml", tomli_w.dumps(doc))


def flower_bin(name: str) -> str:
    """A Flower executable next to this Python's (the venv's), else on PATH."""
    local = Path(sys.executable).parent / name
    if local.is_file():
        return str(local)
    found = shutil.which(name)
    if found is None:
        raise FedshiftError(f"{name} not found: install Flower (`pip install 'fedshift[flower]'`)")
    return found


#: Flower's SuperExec checks for an app to start (a ServerApp or ClientApp process) every
#: this many seconds; this variable sets it (Flower's default: 1 s)
TASK_POLL_VARIABLE = "FLWR_SUPEREXEC_TASK_POLL_INTERVAL"


def _env(home: Path | None = None, task_poll: float | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    env["PYTHONUNBUFFERED"] = "1"
    if home is not None:
        env["FLWR_HOME"] = str(home)
    if task_poll is not None:
        env.setdefault(TASK_POLL_VARIABLE, f"{task_poll:g}")
    return env


def flwr(args: list[str], home: Path, check: bool = True) -> str:
    """Run the ``flwr`` CLI with ``home`` as FLWR_HOME; its output without colours."""
    proc = subprocess.run(
        [flower_bin("flwr"), *args], env=_env(home), capture_output=True, text=True
    )
    text = ANSI.sub("", proc.stdout + proc.stderr)
    if check and proc.returncode != 0:
        raise FedshiftError(f"`flwr {' '.join(args)}` failed ({proc.returncode}):\n{text}")
    return text


def run_status(run_id: str, home: Path) -> str:
    text = flwr(["ls", CONNECTION, "--run-id", run_id, "--format", "json"], home, check=False)
    try:
        return str(json.loads(text[text.index("{") :])["runs"][0]["status"])
    except (ValueError, KeyError, IndexError):
        return "unknown"


def submit_app(
    app: Path, home: Path, stream: bool = True, timeout: float | None = None, log=None
) -> tuple[str, str, str]:
    """``flwr run`` the app; with ``stream``, follow the ServerApp's log until the run ends.
    Returns (run id, final status, log text)."""
    text = flwr(["run", str(app), CONNECTION, "--format", "json"], home)
    try:
        run_id = str(json.loads(text[text.index("{") :])["run-id"])
    except (ValueError, KeyError) as e:
        raise FedshiftError(f"`flwr run` gave no run id:\n{text}") from e
    if not stream:
        return run_id, "submitted", ""
    proc = subprocess.Popen(
        [flower_bin("flwr"), "log", run_id, CONNECTION, "--stream"],
        env=_env(home),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines = []
    t0 = time.monotonic()
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            line = ANSI.sub("", line)
            lines.append(line)
            if log is not None:
                log(line.rstrip("\n"))
            if timeout is not None and time.monotonic() - t0 > timeout:
                break
    finally:  # also when a signal stops the caller: the log stream never outlives it
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    status = "unknown"
    for _ in range(40):  # the log ends as the run finishes; its status follows shortly
        status = run_status(run_id, home)
        if status.startswith("finished"):
            break
        time.sleep(0.5)
    return run_id, status, "".join(lines)


def insecure_warning(superlink: str) -> str:
    """What ``submit --insecure`` gives up, printed before anything is sent."""
    return (
        f"fedshift: warning: --insecure: no TLS to the SuperLink at {superlink}. The "
        "connection is unencrypted and the SuperLink is not authenticated: the run's config "
        "and app, its log and results travel in clear text, and anyone on the network path "
        "can read or alter them or pose as the SuperLink (a SuperLink that accepts this was "
        "started with --insecure, so its SuperNodes' model updates are unencrypted too). Use "
        "it only on a trusted local network or for testing; otherwise pass --root-cert CA.crt "
        "(`fedshift flower certs` makes one; `fedshift docs deploy`)"
    )


def submit(
    cfg: RunConfig,
    options: FlowerOptions,
    superlink: str,
    root_cert: Path | None,
    insecure: bool = False,
    out: str | None = None,
    stream: bool = True,
    app_dir: Path | None = None,
) -> int:
    """``fedshift flower submit``: write the app, submit it, stream the ServerApp's log.
    With ``insecure``, a warning on stderr first (:func:`insecure_warning`)."""
    if insecure:
        print(insecure_warning(superlink), file=sys.stderr, flush=True)
    with tempfile.TemporaryDirectory(prefix="fedshift-flower-") as tmp:
        home = Path(tmp) / "flwr-home"
        write_connection(home, superlink, root_cert, insecure)
        app = write_app(app_dir or Path(tmp) / "app", cfg, options, out)
        run_id, status, _ = submit_app(app, home, stream=stream, log=print)
        print(f"fedshift: Flower run {run_id}: {status}")
        return 0 if status in ("finished:completed", "submitted") else 1


# ---------------------------------------------------------------------------- local sites
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return True
        except OSError:
            time.sleep(0.3)
    return False


@dataclass
class LocalDeployment:
    """A SuperLink and one SuperNode per client on 127.0.0.1, TLS and SuperNode
    authentication on, each process with its own FLWR_HOME under ``base`` (nothing is
    written to ``~/.flwr``). For trying the deployment path on one machine and for the
    tests; real sites run the same commands (docs/DEPLOY.md)."""

    base: Path
    node_configs: list[dict[str, object]]
    tls: bool = True
    port: int = 0
    #: seconds between the SuperExec's checks for an app to start, in the SuperLink and in
    #: every SuperNode (Flower's default is 1 s; ``$FLWR_SUPEREXEC_TASK_POLL_INTERVAL``
    #: wins when set)
    task_poll: float = 0.25
    #: every process may import the plug-ins the run's config names (the user's own config,
    #: on the user's own machine: ``FEDSHIFT_ALLOW_PLUGINS=1``, :mod:`fedshift.core.consent`)
    allow_plugins: bool = False
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.base = Path(self.base).resolve()
        self.logs = self.base / "logs"
        self.home = self.base / "cli"

    # -- start ---------------------------------------------------------------------------
    def start(self, timeout: float = 120.0) -> LocalDeployment:
        self.logs.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        cmd = [flower_bin("flower-superlink"), "--host", "127.0.0.1", "--port", str(self.port),
               "--disable-runtime-dependency-installation"]  # fmt: skip
        if self.tls:
            certs = make_certificates(self.base / "certs", ["127.0.0.1", "localhost"])
            cmd += ["--ssl-ca-certfile", str(certs["ca.crt"]), "--ssl-certfile",
                    str(certs["server.pem"]), "--ssl-keyfile", str(certs["server.key"]),
                    "--enable-supernode-auth"]  # fmt: skip
        else:
            cmd += ["--insecure"]
        self._spawn("superlink", cmd, self.base / "superlink")
        if not wait_port(self.port, timeout):
            raise FedshiftError(f"the SuperLink did not start:\n{self.log('superlink')}")
        root = self.base / "certs" / "ca.crt" if self.tls else None
        write_connection(self.home, f"127.0.0.1:{self.port}", root, insecure=not self.tls)
        names = [f"node{i}" for i in range(len(self.node_configs))]
        if self.tls:
            keys = make_node_keys(self.base / "keys", names)
            for name in names:
                flwr(["supernode", "register", str(keys[name][1]), CONNECTION,
                      "--name", name], self.home)  # fmt: skip
        for i in range(len(names)):
            self.start_node(i)
        self.wait_online(len(names), timeout)
        return self

    def start_node(self, i: int) -> None:
        """Start (or restart) SuperNode ``i`` with its node config (and key)."""
        name = f"node{i}"
        cmd = [flower_bin("flower-supernode"), "--superlink", f"127.0.0.1:{self.port}",
               "--host", "127.0.0.1", "--port", str(free_port()),
               "--node-config", node_config_arg(self.node_configs[i])]  # fmt: skip
        if self.tls:
            cmd += ["--root-certificates", str(self.base / "certs" / "ca.crt"),
                    "--auth-supernode-private-key", str(self.base / "keys" / name)]  # fmt: skip
        else:
            cmd += ["--insecure"]
        self._spawn(name, cmd, self.base / name)

    def _spawn(self, name: str, cmd: list[str], home: Path) -> None:
        home.mkdir(parents=True, exist_ok=True)
        log = open_append(self.logs / f"{name}.log")  # never through a link
        env = _env(home, self.task_poll)
        if self.allow_plugins:
            env[ALLOW_ENV] = "1"
        self.procs[name] = subprocess.Popen(
            cmd,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def wait_online(self, n: int, timeout: float) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            text = flwr(["supernode", "ls", CONNECTION, "--format", "json"], self.home, False)
            if text.count('"online"') >= n:
                return
            for name, p in self.procs.items():
                if p.poll() is not None:
                    raise FedshiftError(f"{name} exited ({p.returncode}):\n{self.log(name)}")
            time.sleep(0.5)
        raise FedshiftError(f"{n} SuperNodes were not online after {timeout:g} s:\n{text}")

    # -- use -----------------------------------------------------------------------------
    def submit(
        self,
        cfg: RunConfig,
        options: FlowerOptions,
        out: Path,
        timeout: float | None = None,
        log=None,
        resume: Path | None = None,
        exists: str = "error",
    ) -> tuple[str, str, str]:
        """Submit ``cfg`` (or, with ``resume``, continue that run directory) and stream the
        ServerApp's log until the run ends: (run id, status, log). ``exists``: what a run
        directory of the config that holds a run does (run config ``exists``)."""
        options.nodes = options.nodes or len(self.node_configs)
        app = write_app(
            self.base / f"app-{cfg.algorithm.name}",
            cfg,
            options,
            str(out),
            resume=str(Path(resume).resolve()) if resume else None,
            exists=exists,
        )
        return submit_app(app, self.home, stream=True, timeout=timeout, log=log)

    def stop_runs(self, grace: float = 120.0) -> bool:
        """Ask every running ServerApp to stop (SIGTERM: it rolls back the round in progress
        and saves the last whole one in the run's ``checkpoint.pt``) and wait up to ``grace``
        seconds for it to end. Returns whether a ServerApp was running."""
        link = self.procs.get("superlink")
        if link is None:
            return False
        apps = [p for p in descendants(link.pid) if "flwr-serverapp" in command(p)]
        stop_all(apps, grace)
        return bool(apps)

    def kill(self, i: int) -> None:
        """SIGKILL SuperNode ``i`` and its ClientApp processes (a site that crashed)."""
        p = self.procs[f"node{i}"]
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()

    def log(self, name: str) -> str:
        path = self.logs / f"{name}.log"
        return ANSI.sub("", path.read_text()) if path.is_file() else ""

    def close(self) -> None:
        """Stop every process this deployment started and every process those started (the
        SuperExecs, ServerApps and ClientApps live in sessions of their own: a process
        group kill misses them, :mod:`fedshift.flower.proctree`): SIGTERM, up to 10 s, then
        SIGKILL."""
        tree = [d for p in self.procs.values() for d in descendants(p.pid)]
        for p in self.procs.values():
            if p.poll() is None:
                p.terminate()
        end = time.monotonic() + 10
        for p in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=max(0.1, end - time.monotonic()))
        stop_all(tree, max(0.5, end - time.monotonic()))
        for p in self.procs.values():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGKILL)

    def __enter__(self) -> LocalDeployment:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def node_config_arg(cfg: dict[str, object]) -> str:
    """A ``--node-config`` string (TOML values: strings quoted, lists as arrays)."""
    parts = []
    for k, v in cfg.items():
        value = tomli_w.dumps({"v": v}).strip()[len("v = ") :]
        parts.append(f"{k}={value}")
    return " ".join(parts)
