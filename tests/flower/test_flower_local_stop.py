"""Issue 48, item 5: `fedshift flower local` stops as a native run does. SIGINT (as Ctrl-C
sends it, to the command's process group) and SIGTERM (to the fedshift process alone) each
stop the run mid-way: the ServerApp saves its last whole round, no process the command
started is left (the SuperExec and ServerApp live in sessions of their own: a process-group
kill missed them and they kept training), the command exits 130 / 143 and prints the command
that continues; running that command twice more ends with the numbers of an uninterrupted
native run, byte for byte."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import fedshift_env
from support.same_run import assert_runs_equal

from fedshift.flower.proctree import alive, command, descendants

#: three rounds: stopped after round 1, resumed and stopped after round 2, resumed to the end
#: (every message of a `flower local` run starts a ClientApp process on its node: about 5 s
#: of CPU each; evaluated in the last round only, each node gets a hello and a train
#: message an invocation and one evaluate message in all: 4 ClientApps fewer)
ARGS = ["dataset.name=toyshift", "dataset.clients=2", "model.name=lenet5",
        "train.batch_size=16", "train.rounds=3", "eval.every=3",
        "algorithm.name=fedbn"]  # fmt: skip


def _fedshift(args: list[str], cwd: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "fedshift", *args],
        cwd=cwd,
        env=fedshift_env(PYTHONUNBUFFERED="1"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group, as a terminal's foreground job
    )


def _stop_after(proc: subprocess.Popen, rnd: int, sig: int, to_group: bool) -> tuple[str, set]:
    """Read ``proc``'s output until round ``rnd`` is reported, note every process it started,
    send ``sig`` (to its group, as Ctrl-C does, or to it alone) and read to the end."""
    lines, tree = [], set()
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line)
        if f"round {rnd}/" in line:
            tree = {(p, command(p)) for p in descendants(proc.pid)}
            if to_group:
                os.killpg(proc.pid, sig)
            else:
                proc.send_signal(sig)
            break
    lines += list(proc.stdout)
    proc.wait(timeout=300)
    return "".join(lines), tree


def _continuation(out: str) -> list[str]:
    m = re.search(r"Continue with: fedshift (flower local --resume .*)$", out, re.MULTILINE)
    assert m, out[-3000:]
    return shlex.split(m.group(1))


@pytest.mark.process
@pytest.mark.slow
def test_sigint_and_sigterm_stop_every_process_and_the_run_continues(tmp_path, capsys):
    base, out = tmp_path / "sites", tmp_path / "runs"
    first = ["flower", "local", *ARGS, "--insecure", "--dir", str(base), "--out", str(out)]
    stops = [(signal.SIGTERM, 1, False), (signal.SIGINT, 2, True)]
    argv = first
    for sig, rnd, to_group in stops:
        proc = _fedshift(argv, tmp_path)
        text, tree = _stop_after(proc, rnd, sig, to_group)
        assert proc.returncode == 128 + sig, text[-3000:]
        assert any("flwr-serverapp" in cmd for _, cmd in tree), tree  # it was running
        left = [(p, cmd) for p, cmd in tree if alive(p) and command(p) == cmd]
        assert not left, left  # SuperLink, SuperExecs, ServerApp, SuperNodes, ClientApps
        assert "Traceback" not in text, text[-3000:]
        argv = _continuation(text)
        run_dir = Path(argv[argv.index("--resume") + 1])
        assert (run_dir / "checkpoint.pt").is_file()
    proc = _fedshift(argv, tmp_path)
    text, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, text[-3000:]
    # the reference: `fedshift run` of the same arguments, in this process (what the test is
    # about, the processes of `flower local`, is above; one interpreter importing torch less)
    from fedshift.cli import main

    capsys.readouterr()
    assert main(["run", *ARGS, "--out", str(tmp_path / "native"), "--quiet"]) == 0
    native_dir = Path(re.search(r"run directory (\S+)", capsys.readouterr().out).group(1))
    assert_runs_equal(run_dir, native_dir)


def test_a_failed_run_is_one_line_with_a_continuation(tmp_path, capsys):
    """The streamed log without the ServerApp's traceback; the cause from run.log as one
    `fedshift: error:` line; the command that continues it when a checkpoint exists."""
    from fedshift.cli.flower import _failed, _LogFilter

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "checkpoint.pt").write_bytes(b"x")
    (run_dir / "run.log").write_text(
        "2026-01-01T00:00:00Z INFO    fedshift.runtime: round 1/2: 2 replies\n"
        "2026-01-01T00:00:09Z ERROR   fedshift.runtime: stopped: round 2: aggregation needs 2 "
        "of the 2 sampled clients but only 1 replied (lost: client1)\n"
    )
    shown = _LogFilter()
    for line in [
        f"fedshift: run directory {run_dir}",
        "fedshift: round 1/2: 2 replies",
        "ERROR :     ServerApp raised an exception",
        "Traceback (most recent call last):",
        '  File "/x/flwr/serverapp.py", line 1, in run',
        "    main(grid, context)",
        "fedshift.core.errors.FedshiftError: round 2: aggregation needs 2",
        "INFO :      run finished",
    ]:
        shown(line)
    out = capsys.readouterr().out
    assert "Traceback" not in out and "File " not in out and "FedshiftError" not in out
    assert "round 1/2" in out and "run finished" in out and shown.run_dir == str(run_dir)
    _failed(run_dir, shown, "fedshift flower local --resume {run_dir} --dir /s")
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("fedshift: error: round 2: aggregation needs 2 of the 2")
    assert err[1] == f"fedshift: continue with: fedshift flower local --resume {run_dir} --dir /s"
