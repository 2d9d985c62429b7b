"""Extending fedshift (issue 17): docs/EXTENDING.md's example run by ``module:Class`` name from
outside the package, entry points, the errors a user can act on, and the Python API
(``fedshift.run``, ``fedshift.load_run``)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from support.same_run import assert_runs_equal

import fedshift
from fedshift.algorithms import ALGORITHMS
from fedshift.augment import AUGMENTS
from fedshift.catalog import resolve
from fedshift.core.config import load_config
from fedshift.core.consent import allowed
from fedshift.core.errors import ConfigError, FedshiftError
from fedshift.models import MODELS

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "EXTENDING.md"
#: the folder holding the fedshift package under test (the worktree's src/)
SRC = Path(fedshift.__file__).resolve().parents[1]
TOY = ["dataset.name=toyshift", "model.name=lenet5", "train.batch_size=16", "name=test"]


def example(filename: str) -> str:
    """The code block that follows ``<!-- example: FILENAME -->`` in docs/EXTENDING.md."""
    text = GUIDE.read_text(encoding="utf-8")
    m = re.search(rf"<!-- example: {re.escape(filename)} -->\s*```\w*\n(.*?)```", text, re.S)
    assert m, f"docs/EXTENDING.md has no example block for {filename}"
    return m.group(1)


@pytest.fixture
def plugins(tmp_path, monkeypatch):
    """A folder outside the package holding the guide's modules, on ``sys.path``; the
    registries and ``sys.modules`` are restored afterwards."""
    folder = tmp_path / "plugins"
    folder.mkdir()
    for name in ("mymethods.py", "myaugments.py"):
        (folder / name).write_text(example(name))
    monkeypatch.syspath_prepend(str(folder))
    for reg in (ALGORITHMS, AUGMENTS, MODELS):
        monkeypatch.setattr(reg, "_entries", dict(reg._entries))
    before = set(sys.modules)
    yield folder
    for name in set(sys.modules) - before:
        if name.startswith(("mymethods", "myaugments", "badmod", "fsplug")):
            del sys.modules[name]


def test_extending_guide_example_runs_by_name_from_outside_the_package(tmp_path):
    """The guide's method and augment, in a folder on PYTHONPATH, run by name via the CLI."""
    folder = tmp_path / "plugins"
    folder.mkdir()
    (folder / "mymethods.py").write_text(example("mymethods.py"))
    (folder / "myaugments.py").write_text(example("myaugments.py"))
    assert len(example("mymethods.py").strip().splitlines()) <= 35  # "about 20 lines" of code
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(folder), str(SRC)])}
    argv = [
        sys.executable, "-m", "fedshift", "run", "--quiet", "--out", str(tmp_path / "runs"),
        "algorithm.name=mymethods:FadingProx", "algorithm.mu=0.05",
        'augment=["myaugments:Jitter"]', "train.rounds=2", *TOY,
    ]  # fmt: skip
    out = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    (summary_path,) = (tmp_path / "runs").rglob("summary.json")
    s = json.loads(summary_path.read_text())
    assert s["algorithm"] == "mymethods:FadingProx"
    assert s["algorithm_config"]["mu"] == 0.05 and s["algorithm_config"]["decay"] == 0.5
    assert [a["name"] for a in s["augment"]] == ["myaugments:Jitter"]
    assert s["rounds"] == 2 and s["bytes_up"] > 0


def test_extending_module_class_name_resumes_and_runs_from_python(plugins, tmp_path, one_thread):
    """fedshift.run by module:Class name; --resume re-imports it and equals a straight run."""
    from fedshift.runtime.simulation import resume_experiment

    cfg = {"dataset": {"name": "toyshift"}, "algorithm": {"name": "mymethods:FadingProx"}}
    over = [*TOY, "augment=[myaugments:Jitter]"]
    straight = fedshift.run(cfg, [*over, "train.rounds=3"], out=tmp_path / "a")
    short = fedshift.run(cfg, [*over, "train.rounds=2"], out=tmp_path / "b")
    assert straight.summary["algorithm"] == "mymethods:FadingProx"
    # a fresh registry, as in a new process: the name in config.yaml is imported again,
    # with the user's yes (a run directory's config may come from anyone: issue 28)
    ALGORITHMS._entries.pop("mymethods:FadingProx")
    AUGMENTS._entries.pop("myaugments:Jitter")
    with pytest.raises(ConfigError, match="names plug-in code"):
        resume_experiment(short.run_dir, progress=False, rounds=3)
    with allowed():
        resume_experiment(short.run_dir, progress=False, rounds=3)
    assert_runs_equal(short.run_dir, straight.run_dir)
    assert ALGORITHMS.get("mymethods:FadingProx").name == "mymethods:FadingProx"

    run = fedshift.load_run(straight.run_dir)
    assert run.finished and run.summary == json.loads(json.dumps(straight.summary))
    assert run.config["algorithm"]["name"] == "mymethods:FadingProx"
    assert max(r["round"] for r in run.metrics) == 3
    # a metrics line being written (no newline yet) is left out, not an error
    with open(straight.run_dir / "metrics.jsonl", "a") as f:
        f.write('{"round": 4, "cli')
    assert len(fedshift.load_run(straight.run_dir).metrics) == len(run.metrics)
    with pytest.raises(FedshiftError, match="not a fedshift run directory"):
        fedshift.load_run(tmp_path)
    with pytest.raises(ConfigError, match="sweep grid makes 2 runs"):
        fedshift.run(cfg, [*TOY, "sweep.seed=[0, 1]"], out=tmp_path / "c")


def test_extending_entry_point_names_a_plugin(plugins, tmp_path, monkeypatch):
    """An installed package's entry point (a dist-info on sys.path) names a class by a name."""
    site = tmp_path / "site"
    info = site / "fsplug-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fsplug\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        "[fedshift.algorithms]\nfadingprox = mymethods:FadingProx\n\n"
        "[fedshift.augments]\njitter = myaugments:Jitter\n"
    )
    with pytest.raises(ConfigError, match="unknown algorithm 'fadingprox'"):
        resolve(load_config(None, [*TOY, "algorithm.name=fadingprox"]))
    monkeypatch.syspath_prepend(str(site))
    cfg = resolve(load_config(None, [*TOY, "algorithm.name=fadingprox", "augment=[jitter]"]))
    want = {"name": "fadingprox", "bn_policy": "global", "mu": 0.1, "decay": 0.5}
    assert cfg.algorithm.to_dict() == want
    assert [a.to_dict() for a in cfg.augment] == [{"name": "jitter", "strength": 0.2}]
    assert ALGORITHMS.get("fadingprox").__name__ == "FadingProx"
    assert "fedavg" in ALGORITHMS  # built-in names never look at entry points


def test_extending_list_shows_installed_plugins(plugins, tmp_path, monkeypatch, capsys):
    """`fedshift list` shows entry-point plug-ins with their keys and where they come from,
    and one that cannot load with the reason, without stopping the listing."""
    from fedshift.cli import main

    info = tmp_path / "site" / "fsplug-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fsplug\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        "[fedshift.algorithms]\nfadingprox = mymethods:FadingProx\nghost = nomodule:Nope\n\n"
        "[fedshift.augments]\njitter = myaugments:Jitter\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if ln.strip().startswith("fadingprox "))
    assert "(plug-in: mymethods)" in line and "mu=0.1" in line and "decay=0.5" in line
    line = next(ln for ln in out.splitlines() if ln.strip().startswith("jitter "))
    assert "(plug-in: myaugments)" in line and "strength=0.2" in line
    line = next(ln for ln in out.splitlines() if ln.strip().startswith("ghost "))
    assert "(cannot load)" in line and "nomodule:Nope" in line and "nomodule" in line
    assert "fedavg " in out and "(plug-in" not in next(
        ln for ln in out.splitlines() if ln.strip().startswith("fedavg ")
    )


def test_extending_report_needs_no_plugin(plugins, tmp_path, monkeypatch, one_thread):
    """`fedshift report` on a plug-in's runs, where the plug-in cannot be imported (another
    machine, a deleted module): the run recorded its components' defaults, so the report
    labels what it changed (it failed with 'cannot import module' before)."""
    from fedshift.cli import main

    cfg = {"dataset": {"name": "toyshift"}, "algorithm": {"name": "mymethods:FadingProx"}}
    over = [*TOY, "train.rounds=1", "augment=[{name: myaugments:Jitter, strength: 0.3}]"]
    res = fedshift.run(cfg, [*over, "algorithm.mu=0.2"], out=tmp_path / "runs")
    assert res.summary["defaults"]["algorithm"]["mu"] == 0.1
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p != str(plugins)])
    for name in ("mymethods", "myaugments"):
        monkeypatch.delitem(sys.modules, name)
    ALGORITHMS._entries.pop("mymethods:FadingProx")
    AUGMENTS._entries.pop("myaugments:Jitter")
    with pytest.raises(ConfigError, match="cannot import module 'mymethods'"):
        ALGORITHMS.get("mymethods:FadingProx")  # the plug-in is really gone
    assert main(["report", str(tmp_path / "runs"), "--out", str(tmp_path / "rep")]) == 0
    text = (tmp_path / "rep" / "report.md").read_text()
    assert "mu=0.2" in text and "myaugments:Jitter(strength=0.3)" in text
    assert "decay=" not in text  # unchanged keys are not labels


def _error(*overrides: str) -> str:
    with pytest.raises(ConfigError) as e:
        resolve(load_config(None, [*TOY, *overrides]))
    return str(e.value)


def test_extending_errors_a_user_can_act_on(plugins):
    """Unimportable module, missing attribute, wrong base class, failing module: each says why."""
    msg = _error("algorithm.name=nosuchmod:Algo")
    assert "config key 'algorithm.name'" in msg and "cannot import module 'nosuchmod'" in msg
    assert "No module named 'nosuchmod'" in msg and "PYTHONPATH" in msg
    msg = _error("algorithm.name=mymethods:Nope")
    assert "has no attribute 'Nope'" in msg and "FadingProx" in msg and "mymethods.py" in msg
    msg = _error("algorithm.name=myaugments:Jitter")
    assert "not a subclass of fedshift.algorithms.base.Algorithm" in msg
    msg = _error("augment=[mymethods:FadingProx]")
    assert "not a subclass of fedshift.augment.base.Augment" in msg
    msg = _error("algorithm.name=mymethods:ANCHOR")
    assert "is a str, not a subclass" in msg
    msg = _error("algorithm.name=mymethods:Fading:Prox")
    assert "expected 'module:Class'" in msg
    (plugins / "badmod.py").write_text("import not_installed_anywhere\n")
    msg = _error("algorithm.name=badmod:X")
    assert "importing module 'badmod' failed" in msg and "not_installed_anywhere" in msg
    (plugins / "badmod2.py").write_text("raise RuntimeError('boom at import')\n")
    msg = _error("algorithm.name=badmod2:X")
    assert "RuntimeError: boom at import" in msg
    msg = _error("algorithm.name=mymethods:FadingProx", "algorithm.mu=abc")
    assert "algorithm.mu" in msg
    msg = _error("algorithm.name=fedavgg")
    assert "did you mean 'fedavg'" in msg and "'module:Class'" in msg


def test_extending_import_fedshift_stays_light():
    """``import fedshift`` loads no torch; fedshift.run / load_run come from fedshift.api on use."""
    code = textwrap.dedent(
        """
        import sys
        import fedshift
        assert "torch" not in sys.modules, "import fedshift loaded torch"
        assert fedshift.run.__module__ == "fedshift.api"
        assert fedshift.load_run.__module__ == "fedshift.api"
        assert "torch" not in sys.modules, "fedshift.run loaded torch before it ran"
        assert "run" in dir(fedshift)
        print("ok")
        """
    )
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


# ------------------------------------------------------------------- a plug-in package
def _site_packages(python: Path) -> Path:
    out = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True,
        text=True,
        check=True,
    )
    return Path(out.stdout.strip())


@pytest.mark.slow
def test_extending_plugin_package_from_the_guide_installs_lists_and_runs(tmp_path):
    """docs/EXTENDING.md's package, written from the guide's text (pyproject.toml, the
    method, augment and model modules in a src layout, its contract tests), built into a
    wheel and installed into a fresh virtual environment: `fedshift list` shows its three
    components as plug-ins, a run names them by their short names, and the package's tests
    (fedshift.testing's checks) pass there."""
    pkg = tmp_path / "fedshift-mylab"
    files = {
        "pyproject.toml": example("fedshift-mylab/pyproject.toml"),
        "src/mylab/__init__.py": "",
        "src/mylab/methods.py": example("mymethods.py"),
        "src/mylab/augments.py": example("myaugments.py"),
        "src/mylab/models.py": example("fedshift-mylab/src/mylab/models.py"),
        "tests/test_contract.py": example("fedshift-mylab/tests/test_contract.py"),
    }
    for rel, text in files.items():
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text(text)
    tree = GUIDE.read_text(encoding="utf-8")
    assert all(Path(rel).name in tree for rel in files)  # the guide's tree names each file

    # the wheel, built offline with this environment's setuptools (what `pip install .` does)
    pip = [sys.executable, "-m", "pip"]
    build = [*pip, "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index"]
    out = subprocess.run([*build, "-w", tmp_path / "dist", pkg], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    (wheel,) = (tmp_path / "dist").glob("fedshift_mylab-0.1.0-*.whl")

    # a fresh venv that sees this environment's packages (fedshift, torch) as a site dir,
    # the plug-in installed into it alone
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True)
    vpy = venv / "bin" / "python"
    here = _site_packages(Path(sys.executable))
    (_site_packages(vpy) / "outer.pth").write_text(f"import site; site.addsitedir({str(here)!r})\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    out = subprocess.run(
        [*pip, "--python", vpy, "install", "-q", "--no-deps", "--no-index", wheel],
        capture_output=True,
        text=True,
        env=env,
    )
    assert out.returncode == 0, out.stderr
    work = tmp_path / "work"  # no plug-in module here: only the installed package has them
    work.mkdir()

    def fedshift_cmd(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [vpy, "-m", "fedshift", *args], cwd=work, env=env, capture_output=True, text=True
        )

    out = fedshift_cmd("list")
    assert out.returncode == 0, out.stderr
    lines = {ln.split()[0]: ln for ln in out.stdout.splitlines() if ln.startswith("  ")}
    assert "(plug-in: mylab.methods)" in lines["fadingprox"] and "mu=0.1" in lines["fadingprox"]
    assert "(plug-in: mylab.augments)" in lines["jitter"] and "strength=0.2" in lines["jitter"]
    assert "(plug-in: mylab.models)" in lines["mynet"] and "width=16" in lines["mynet"]

    run = ["run", "algorithm.name=fadingprox", "augment=[jitter]", "model.name=mynet"]
    out = fedshift_cmd(*run, "dataset.name=toyshift", "train.rounds=2", "--quiet", "--out", "r")
    assert out.returncode == 0, out.stderr
    (summary_path,) = (work / "r").rglob("summary.json")
    s = json.loads(summary_path.read_text())
    assert s["algorithm"] == "fadingprox" and s["rounds"] == 2
    assert [a["name"] for a in s["augment"]] == ["jitter"]
    assert s["algorithm_config"] == {"name": "fadingprox", "bn_policy": "global", "mu": 0.1,
                                     "decay": 0.5}  # fmt: skip

    tests = subprocess.run(
        [vpy, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0", "tests"],
        cwd=pkg,
        env=env,
        capture_output=True,
        text=True,
    )
    assert tests.returncode == 0, tests.stdout[-3000:] + tests.stderr[-2000:]
    assert "3 passed" in tests.stdout
