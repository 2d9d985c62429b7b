"""Issue 48, item 4: commands that only read never run plug-in code a config file names, and
the folder ``python -m fedshift`` runs from never stands in for a module fedshift imports.

``fedshift config show`` prints a ``module:Class`` section of a config file as written (a
comment says why, and how to allow it); ``fedshift data check`` refuses in one line;
``fedshift report`` shows the plug-in's keys without importing it; all three import with
``--allow-plugins`` (and a name typed on the command line as before). A ``wandb.py`` in the
current folder is not wandb, and a ``*.dist-info`` there declares no plug-in to ``fedshift
list``."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from conftest import fedshift_env

from fedshift.cli import main

#: a plug-in module that leaves a mark when its code runs
PLUGIN = """
    import pathlib
    pathlib.Path({marker!r}).write_text("imported")
    from fedshift.algorithms.fedavg import FedAvg
    from fedshift.data.domains.toy import ToyParams, load_toy

    class Algo(FedAvg):
        pass

    class Data:
        name = "marked"
        Params = ToyParams
        task = "classification"
        load = staticmethod(load_toy)
"""


@pytest.fixture
def received(tmp_path, monkeypatch):
    """A received folder: a config naming ``markplug:Algo`` (and a dataset plug-in), the
    module beside it on Python's path; the marker file says whether its code ran."""
    folder = tmp_path / "received"
    folder.mkdir()
    marker = tmp_path / "MARKER"
    (folder / "markplug.py").write_text(textwrap.dedent(PLUGIN.format(marker=str(marker))))
    cfg = {
        "dataset": {"name": "toyshift", "train_size": 40},
        "algorithm": {"name": "markplug:Algo"},
        "model": {"name": "lenet5"},
        "train": {"rounds": 1, "batch_size": 16},
    }
    (folder / "config.yaml").write_text(yaml.safe_dump(cfg))
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.delenv("FEDSHIFT_ALLOW_PLUGINS", raising=False)
    yield folder, marker
    sys.modules.pop("markplug", None)


def _python_m_fedshift(cwd: Path, *argv: str) -> subprocess.CompletedProcess:
    """``python -m fedshift ARGV`` in ``cwd`` (the way that puts ``cwd`` on the path)."""
    return subprocess.run(
        [sys.executable, "-m", "fedshift", *argv],
        cwd=cwd,
        env=fedshift_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_config_show_prints_a_plugin_as_a_name(received, capsys):
    folder, marker = received
    assert main(["config", "show", "-c", str(folder / "config.yaml")]) == 0
    out = capsys.readouterr().out
    assert not marker.exists()  # no plug-in code ran
    first = out.splitlines()[0]
    assert first.startswith("# not imported: algorithm.name 'markplug:Algo' (module 'markplug'")
    assert "--allow-plugins" in first and str(folder / "markplug.py") in first
    shown = yaml.safe_load(out)
    assert shown["algorithm"] == {"name": "markplug:Algo"}  # as written
    assert shown["dataset"]["train_size"] == 40 and shown["dataset"]["clients"] == 3  # resolved
    assert shown["train"]["rounds"] == 1


def test_config_show_imports_with_allow_plugins_or_a_name_typed_here(received, capsys):
    folder, marker = received
    assert main(["config", "show", "-c", str(folder / "config.yaml"), "--allow-plugins"]) == 0
    shown = yaml.safe_load(capsys.readouterr().out)
    assert marker.exists()
    assert shown["algorithm"] == {"name": "markplug:Algo", "bn_policy": "global"}
    marker.unlink()
    sys.modules.pop("markplug", None)
    from fedshift.algorithms import ALGORITHMS

    ALGORITHMS._entries.pop("markplug:Algo")
    argv = ["config", "show", "-c", str(folder / "config.yaml"), "algorithm.name=markplug:Algo"]
    assert main(argv) == 0  # typed on the command line: imported as asked
    assert marker.exists() and not capsys.readouterr().out.startswith("#")


def test_config_show_holds_back_a_dataset_plugin_too(received, capsys):
    """``dataset.name`` is a plug-in key like the others (it was not listed)."""
    folder, marker = received
    cfg = yaml.safe_load((folder / "config.yaml").read_text())
    cfg["dataset"] = {"name": "markplug:Data", "train_size": 40}
    cfg["algorithm"] = {"name": "fedavg"}
    (folder / "config.yaml").write_text(yaml.safe_dump(cfg))
    assert main(["config", "show", "-c", str(folder / "config.yaml")]) == 0
    out = capsys.readouterr().out
    assert not marker.exists() and "# not imported: dataset.name 'markplug:Data'" in out
    assert yaml.safe_load(out)["dataset"] == {"name": "markplug:Data", "train_size": 40}


def test_data_check_refuses_a_plugin_in_one_line(received, tmp_path, capsys):
    folder, marker = received
    argv = ["data", "check", "-c", str(folder / "config.yaml"), "--out", str(tmp_path / "dc")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert not marker.exists() and err.count("\n") == 1
    assert "algorithm.name 'markplug:Algo'" in err and "only reads" in err
    assert "run again with --allow-plugins" in err and not (tmp_path / "dc").exists()


def test_report_names_a_plugin_without_importing_it(received, tmp_path, capsys, one_thread):
    """A received run whose summary does not record its components' defaults (written by an
    older fedshift): the report lists the plug-in's keys as they are instead of importing it
    to learn its defaults (it imported it before)."""
    import fedshift
    from fedshift.algorithms import ALGORITHMS

    folder, marker = received
    cfg = yaml.safe_load((folder / "config.yaml").read_text())
    res = fedshift.run(cfg, [], out=tmp_path / "runs")  # the sender's run
    (path,) = (tmp_path / "runs").rglob("summary.json")
    summary = json.loads(path.read_text())
    del summary["defaults"]
    path.write_text(json.dumps(summary))
    marker.unlink()
    sys.modules.pop("markplug", None)
    ALGORITHMS._entries.pop("markplug:Algo")
    assert res.summary["algorithm"] == "markplug:Algo"

    assert main(["report", str(tmp_path / "runs"), "--out", str(tmp_path / "rep")]) == 0
    captured = capsys.readouterr()
    assert not marker.exists()
    assert "markplug:Algo" in (tmp_path / "rep" / "report.md").read_text()
    assert "'fedshift report' only reads" in captured.err and "--allow-plugins" in captured.err


FAKE = """
import pathlib
pathlib.Path("MARKER").write_text("imported from the current folder")
__version__ = "99.0.0"
"""

#: ``python -m fedshift`` as ``-c`` (the current folder first on the path, as ``-m`` puts it)
#: where the installed wandb is invisible: what a machine without wandb sees
WITHOUT_WANDB = """
import importlib.machinery as m, runpy, sys, sysconfig
site = sysconfig.get_path("purelib")
inner = m.FileFinder(site, (m.ExtensionFileLoader, m.EXTENSION_SUFFIXES),
                     (m.SourceFileLoader, m.SOURCE_SUFFIXES),
                     (m.SourcelessFileLoader, m.BYTECODE_SUFFIXES))
class Hide:
    def find_spec(self, name, target=None):
        return None if name.partition(".")[0] == "wandb" else inner.find_spec(name, target)
    def invalidate_caches(self):
        inner.invalidate_caches()
sys.path_importer_cache[site] = Hide()
sys.argv = ["fedshift", *sys.argv[1:]]
runpy.run_module("fedshift", run_name="__main__", alter_sys=True)
"""


def test_a_wandb_py_in_the_current_folder_is_not_wandb(tmp_path):
    """`python -m fedshift run track=[wandb]` from a folder holding a wandb.py, on a machine
    without wandb: the file ran (it was found last on the path, as the stand-in of the
    missing package); now wandb is reported missing and the file never runs."""
    (tmp_path / "wandb.py").write_text(FAKE)
    argv = ["run", "dataset.name=toyshift", "train.rounds=1", "track=[wandb]", "--quiet"]
    out = subprocess.run(
        [sys.executable, "-c", WITHOUT_WANDB, *argv, "--out", "r"],
        cwd=tmp_path,
        env=fedshift_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert not (tmp_path / "MARKER").exists(), out.stderr
    assert out.returncode == 2, out.stderr
    assert "wandb is asked for but the wandb package is not installed" in out.stderr


def test_list_reads_no_plugin_metadata_from_the_current_folder(tmp_path):
    """A received folder holding a ``*.dist-info`` whose entry point names a module beside
    it: `python -m fedshift list` there loaded (ran) it as an installed plug-in."""
    info = tmp_path / "evil-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: evil\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[fedshift.algorithms]\nsneaky = evilmod:Algo\n")
    (tmp_path / "evilmod.py").write_text(FAKE)
    out = _python_m_fedshift(tmp_path, "list")
    assert out.returncode == 0, out.stderr
    assert not (tmp_path / "MARKER").exists() and "sneaky" not in out.stdout
    assert "fedavg " in out.stdout


def test_a_plugin_module_in_the_current_folder_still_runs(tmp_path):
    """The guard lets the current folder serve what a `module:Class` name asks for (and what
    that module imports while it loads): docs/EXTENDING.md's `python -m fedshift run
    algorithm.name=mymod:Class` from the module's folder."""
    (tmp_path / "helper_mod.py").write_text("NAME = 'helped'\n")
    (tmp_path / "cwdalgo.py").write_text(
        "import helper_mod\nfrom fedshift.algorithms.fedavg import FedAvg\n"
        "class Algo(FedAvg):\n    pass\n"
    )
    argv = ["run", "dataset.name=toyshift", "train.rounds=1", "algorithm.name=cwdalgo:Algo"]
    out = _python_m_fedshift(tmp_path, *argv, "--quiet", "--out", "r")
    assert out.returncode == 0, out.stderr
    (summary,) = Path(tmp_path / "r").rglob("summary.json")
    assert json.loads(summary.read_text())["algorithm"] == "cwdalgo:Algo"
