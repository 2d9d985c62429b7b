"""Issue 28, item 2: a plug-in name is code, so none runs unasked. A ``module:Class`` name
that did not come from the user's command line or own ``-c`` file (a run directory received
from someone else, a suite, a Flower run config) is listed and imported only with
``--allow-plugins`` / ``FEDSHIFT_ALLOW_PLUGINS=1``; a module that exits while imported is an
error naming it; ``python -m fedshift`` lets no file of the current folder shadow a module.

Every plug-in here writes a marker file when its module is imported: the marker is the proof
that code ran."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

import fedshift
from fedshift.algorithms import ALGORITHMS
from fedshift.augment import AUGMENTS
from fedshift.core.errors import ConfigError
from fedshift.models import MODELS

SRC = Path(fedshift.__file__).resolve().parents[1]
TOY = ["dataset.name=toyshift", "model.name=lenet5", "train.batch_size=16", "name=t"]


def plugin_source(base: str = "fedshift.algorithms.fedavg:FedAvg") -> str:
    """A plug-in module whose import appends a line to ``marker.txt`` next to it."""
    module, cls = base.split(":")
    return textwrap.dedent(
        f"""
        from pathlib import Path
        with open(Path(__file__).with_name("marker.txt"), "a") as f:
            f.write("imported\\n")
        from {module} import {cls}

        class Algo({cls}):
            pass
        """
    )


def imports(folder: Path) -> int:
    """How many times a plug-in module in ``folder`` was imported."""
    marker = folder / "marker.txt"
    return len(marker.read_text().splitlines()) if marker.is_file() else 0


def fedshift_cli(folder: Path, *args: str, env: dict | None = None):
    """``python -m fedshift ARGS`` in ``folder`` (so ``python -m`` puts it on Python's path:
    the docs' way to run a plug-in module lying there, and the worst case for one from
    elsewhere)."""
    e = {k: v for k, v in os.environ.items() if k != "FEDSHIFT_ALLOW_PLUGINS"}
    e.update({"PYTHONPATH": str(SRC), "OMP_NUM_THREADS": "1", **(env or {})})
    return subprocess.run(
        [sys.executable, "-m", "fedshift", *args], cwd=folder, env=e, capture_output=True,
        text=True, timeout=300,
    )  # fmt: skip


@pytest.fixture
def fresh_registries(monkeypatch):
    """Registries and modules as in a new process afterwards."""
    for reg in (ALGORITHMS, AUGMENTS, MODELS):
        monkeypatch.setattr(reg, "_entries", dict(reg._entries))
    monkeypatch.delenv("FEDSHIFT_ALLOW_PLUGINS", raising=False)
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        if name.startswith("fsconsent"):
            del sys.modules[name]


@pytest.mark.slow
def test_received_run_dir_imports_no_plugin_unasked(tmp_path):
    """`fedshift protocol cross-site` and `fedshift run --resume` of a run directory from
    elsewhere, whose config.yaml names a module lying next to it, imported that module
    (running its code) before checking anything; now each stops with one error listing the
    name and the module's file, and nothing is imported. --allow-plugins imports it."""
    from conftest import toy_cfg

    from fedshift.runtime.simulation import run_experiment

    folder = tmp_path / "shared"
    folder.mkdir()
    (folder / "evilmod.py").write_text(plugin_source())
    run_dir = folder / "run"
    run_experiment(toy_cfg(rounds=1), run_dir=run_dir, progress=False)
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    config["algorithm"]["name"] = "evilmod:Algo"  # what the sender put there
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config))
    for args in (
        ["protocol", "cross-site", str(run_dir), "--out", str(folder / "cs"), "--quiet"],
        ["run", "--resume", str(run_dir), "--quiet"],
    ):
        res = fedshift_cli(folder, *args)
        assert res.returncode == 2, res.stdout + res.stderr
        err = res.stderr
        assert "names plug-in code" in err and "'evilmod:Algo'" in err, err
        assert str(folder / "evilmod.py") in err and "--allow-plugins" in err
        assert "Traceback" not in err
        assert imports(folder) == 0, args
    # the user's yes imports it (then the edited config is refused: it is not the run's)
    res = fedshift_cli(folder, "protocol", "cross-site", str(run_dir), "--out",
                       str(folder / "cs"), "--quiet", "--allow-plugins")  # fmt: skip
    assert imports(folder) == 1
    assert res.returncode == 2 and "differs from the config the run was started with" in res.stderr


@pytest.mark.slow
def test_suite_plugins_need_consent_but_command_line_names_do_not(tmp_path, fresh_registries):
    """`fedshift bench SUITE` imported a plug-in the suite names; now it is listed and refused
    (nothing imported), while the same name given as key=value on the command line is the
    user's own and runs."""
    from fedshift.cli import main

    (tmp_path / "fsconsent_s.py").write_text(plugin_source())
    suite = tmp_path / "suite.yaml"
    suite.write_text(yaml.safe_dump({
        "name": "s", "dataset": {"name": "toyshift"}, "model": {"name": "lenet5"},
        "train": {"rounds": 1, "batch_size": 16},
        "sweep": {"algorithm.name": ["fedavg", "fsconsent_s:Algo"]},
    }))  # fmt: skip
    out = ["--out", str(tmp_path / "runs"), "--quiet", "--workers", "1"]
    res = fedshift_cli(tmp_path, "bench", str(suite), *out)
    assert res.returncode == 2 and "names plug-in code" in res.stderr, res.stderr
    assert f"suite {suite}" in res.stderr and "'fsconsent_s:Algo'" in res.stderr
    assert imports(tmp_path) == 0 and not (tmp_path / "runs").exists()
    sys.path.insert(0, str(tmp_path))  # as python -m fedshift in that folder
    try:
        assert main(["bench", str(suite), "sweep.algorithm.name=[fsconsent_s:Algo]", *out]) == 0
    finally:
        sys.path.remove(str(tmp_path))
    assert imports(tmp_path) == 1


def test_module_that_exits_on_import_is_an_error(tmp_path):
    """A plug-in module calling sys.exit(0) while imported made `fedshift run` exit 0 with no
    output and no run (load_object caught Exception only); now: exit 2 naming the module."""
    (tmp_path / "exitmod.py").write_text("import sys\nsys.exit(0)\n")
    res = fedshift_cli(tmp_path, "run", *TOY, "train.rounds=1", "algorithm.name=exitmod:Algo",
                       "--out", str(tmp_path / "runs"), "--quiet")  # fmt: skip
    assert res.returncode == 2, (res.returncode, res.stdout, res.stderr)
    assert "exitmod" in res.stderr and "sys.exit(0)" in res.stderr
    assert str(tmp_path / "exitmod.py") in res.stderr


def test_python_m_fedshift_lets_no_file_in_the_folder_shadow_a_module(tmp_path):
    """`python -m fedshift` put the current folder first on Python's path, so a yaml.py lying
    in a shared folder ran instead of PyYAML; now that folder comes last."""
    (tmp_path / "yaml.py").write_text(
        "from pathlib import Path\nPath(__file__).with_name('marker.txt').write_text('x\\n')\n"
    )
    res = fedshift_cli(tmp_path, "config", "show", "dataset.name=toyshift")
    assert res.returncode == 0, res.stderr
    assert "dataset:" in res.stdout and imports(tmp_path) == 0


def test_supernode_and_serverapp_import_no_plugin_unasked(tmp_path, monkeypatch, fresh_registries):
    """A Flower run config comes from whoever submitted the run: the ServerApp and every
    SuperNode imported any plug-in it named. Now both refuse, naming how their operator
    allows it (the SuperNode's allow-plugins node-config key, or the environment)."""
    from flwr.app import ConfigRecord, Context, RecordDict

    from fedshift.catalog import resolve
    from fedshift.core.config import load_config
    from fedshift.flower import apps, node

    (tmp_path / "fsconsent_a.py").write_text(plugin_source())
    monkeypatch.syspath_prepend(str(tmp_path))
    raw = load_config(None, [*TOY, "train.rounds=1"])
    raw["algorithm"] = {"name": "fsconsent_a:Algo"}
    text = yaml.safe_dump(raw)
    run = ConfigRecord({"config": text})
    ctx = Context(run_id=1, node_id=1, node_config={"partition-id": 0}, state=RecordDict(),
                  run_config={})  # fmt: skip
    with pytest.raises(ConfigError, match="names plug-in code.*allow-plugins=true"):
        node.runtime(run, ctx)
    server_ctx = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(),
                         run_config={"fedshift-config": text})  # fmt: skip
    with pytest.raises(ConfigError, match="names plug-in code.*SuperLink"):
        apps.main(None, server_ctx)
    assert imports(tmp_path) == 0
    ctx = Context(run_id=1, node_id=1, node_config={"partition-id": 0, "allow-plugins": True},
                  state=RecordDict(), run_config={})  # fmt: skip
    rt = node.runtime(run, ctx)
    assert rt.cfg.algorithm.name == "fsconsent_a:Algo" and imports(tmp_path) == 1
    assert resolve(raw).algorithm.name == "fsconsent_a:Algo"  # given in Python: as asked


def test_load_run_rebuild_needs_allow_plugins(tmp_path, monkeypatch, fresh_registries):
    """LoadedRun.rebuild imported the run's plug-ins; now only with allow_plugins=True."""
    (tmp_path / "fsconsent_b.py").write_text(plugin_source())
    monkeypatch.syspath_prepend(str(tmp_path))
    res = fedshift.run({"algorithm": {"name": "fsconsent_b:Algo"}}, [*TOY, "train.rounds=1"],
                       out=tmp_path / "runs")  # fmt: skip
    ALGORITHMS._entries.pop("fsconsent_b:Algo")  # as in a new process
    del sys.modules["fsconsent_b"]
    (tmp_path / "marker.txt").unlink()
    run = fedshift.load_run(res.run_dir)
    with pytest.raises(ConfigError, match="names plug-in code"):
        run.rebuild()
    assert imports(tmp_path) == 0
    assert run.rebuild(allow_plugins=True).round == 1
    assert imports(tmp_path) == 1
    ALGORITHMS._entries.pop("fsconsent_b:Algo")
    del sys.modules["fsconsent_b"]
    monkeypatch.setenv("FEDSHIFT_ALLOW_PLUGINS", "1")  # the environment's yes
    assert run.rebuild().round == 1 and imports(tmp_path) == 2


def test_every_place_a_config_names_a_plugin_is_listed(tmp_path, monkeypatch, fresh_registries):
    """The listing finds module:Class names in every section and grid that takes one, and
    the registry refuses an import inside an untrusted scope even for a name the listing was
    not shown (the backstop)."""
    from fedshift.core.consent import plugin_names, untrusted

    raw = {
        "algorithm": {"name": "a.b:Algo"},
        "model": {"name": "m:Net", "width": 3},
        "augment": ["fedrdn", {"name": "x:Aug", "p": 0.5}],
        "sweep": {
            "algorithm.name": ["fedavg", "s:One"],
            "augment": [["y:Two"], []],
            "cell": [{"model.name": "c:Three", "train.lr": 0.1}],
        },
    }
    names = {n for _, n in plugin_names(raw)}
    assert names == {"a.b:Algo", "m:Net", "x:Aug", "s:One", "y:Two", "c:Three"}
    (tmp_path / "fsconsent_c.py").write_text(plugin_source())
    monkeypatch.syspath_prepend(str(tmp_path))
    with untrusted("somewhere"), pytest.raises(ConfigError, match="somewhere names plug-in code"):
        ALGORITHMS.get("fsconsent_c:Algo")
    assert imports(tmp_path) == 0
    with untrusted("somewhere", trusted={"fsconsent_c:Algo"}):  # the user gave this name
        assert ALGORITHMS.get("fsconsent_c:Algo").__name__ == "Algo"
    assert imports(tmp_path) == 1
