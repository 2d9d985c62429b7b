"""The dataset contract (issue 30): every built-in dataset's registry entry states it (name,
Params, task, load); a plug-in dataset in a separate tiny package (tests/data/fsdataplug/)
installed by entry point runs by name, and by ``module:Class``; one that breaks the contract
fails with an error naming it and what is missing; ``fedshift list`` shows it."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import results_of

import fedshift
from fedshift.catalog import resolve
from fedshift.core.config import load_config
from fedshift.core.datasets import DATASET_TASKS, TASK_FROM_PARAMS, DatasetSpec
from fedshift.core.errors import ConfigError, FedshiftError
from fedshift.core.federation import Federation
from fedshift.core.federation import Federation as CoreFederation
from fedshift.core.registry import Registry
from fedshift.data import DATASETS, dataset_task, load_dataset

PLUGIN = Path(__file__).resolve().parent / "fsdataplug"
SRC = Path(fedshift.__file__).resolve().parents[1]
RUN = ["model.name=cnn", "train.batch_size=8", "train.rounds=1", "name=t"]


def _install(site: Path) -> Path:
    """``fsdataplug`` as pip installs it, without building: its entry points as a dist-info
    in ``site`` (what importlib.metadata reads), its module beside it."""
    info = site / "fsdataplug-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fsdataplug\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        "[fedshift.datasets]\nstripes = fsdataplug:Stripes\nghost = fsdataplug:Nothing\n"
    )
    (site / "fsdataplug.py").write_text((PLUGIN / "fsdataplug.py").read_text())
    return site


@pytest.fixture
def installed(tmp_path, monkeypatch):
    """The plug-in package installed on ``sys.path``; DATASETS restored afterwards."""
    site = _install(tmp_path / "site")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setattr(DATASETS, "_entries", dict(DATASETS._entries))
    monkeypatch.setattr(DATASETS, "_plugins", set(DATASETS._plugins))
    yield site
    sys.modules.pop("fsdataplug", None)


def test_every_builtin_dataset_states_the_contract():
    """Each entry carries its task (the SEGMENTATION tuple is gone), a Params dataclass and
    a load; the federation and model types are core's, re-exported where they were."""
    from fedshift.core.model import FedModel
    from fedshift.models.base import FedModel as ModelsFedModel

    assert Federation is CoreFederation and ModelsFedModel is FedModel
    assert len(DATASETS.names()) >= 20
    for e in DATASETS.entries():
        assert e.task in DATASET_TASKS, e.name
        assert e.params is not None and dataclasses.is_dataclass(e.params), e.name
        assert callable(e.obj) and e.description, e.name
    tasks = {e.name: e.task for e in DATASETS.entries()}
    assert {n for n, t in tasks.items() if t == "segmentation"} == {
        "brain-mri", "prostate", "nuclei", "segfolders", "toyseg",
    }  # fmt: skip
    assert tasks["arrays"] == TASK_FROM_PARAMS
    arrays = DATASETS.entry("arrays").params
    assert dataset_task("arrays") == "classification"
    assert dataset_task("arrays", arrays(task="segmentation")) == "segmentation"
    assert dataset_task("toyseg") == "segmentation" and dataset_task("digits") == "classification"


def test_registering_needs_the_task_where_the_registry_has_tasks():
    """One registration style, ``Registry.add``: a dataset without a task is refused, and a
    task on a registry without tasks too."""
    reg: Registry = Registry("dataset", tasks=DATASET_TASKS)
    with pytest.raises(ValueError, match="needs task= one of"):
        reg.add("x", print, None, "d")
    with pytest.raises(ValueError, match="needs task= one of"):
        reg.add("x", print, None, "d", task="detection")
    with pytest.raises(ValueError, match="needs no task"):
        Registry("model").add("y", print, None, "d", task="classification")
    reg.add("x", print, None, "d", task="segmentation")
    assert reg.entry("x").task == "segmentation"


def test_entry_point_dataset_resolves_and_loads_by_name(installed):
    with pytest.raises(ConfigError, match="unknown dataset 'nosuch'.*fedshift.datasets"):
        resolve(load_config(None, ["dataset.name=nosuch"]))
    cfg = resolve(load_config(None, [*RUN, "dataset.name=stripes", "dataset.clients=3"]))
    assert cfg.dataset.to_dict() == {"name": "stripes", "clients": 3, "per_class": 4, "seed": 0}
    assert DATASETS.is_plugin("stripes") and dataset_task("stripes") == "classification"
    fed = load_dataset(cfg.dataset)
    assert fed.client_names == ["c0", "c1", "c2"] and fed.counts()["c2"]["train"] == 12
    with pytest.raises(ConfigError, match=r"dataset\.per_clas"):
        resolve(load_config(None, [*RUN, "dataset.name=stripes", "dataset.per_clas=2"]))
    assert isinstance(__import__("fsdataplug").Stripes, DatasetSpec)


def test_installed_dataset_runs_by_name_from_the_cli(installed, tmp_path):
    """`fedshift run dataset.name=stripes` in a fresh process: the entry point names it."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(installed), str(SRC)])}
    argv = [sys.executable, "-m", "fedshift", "run", "--quiet", "--out", str(tmp_path / "r")]
    out = subprocess.run(
        [*argv, *RUN, "dataset.name=stripes"], cwd=tmp_path, env=env, capture_output=True,
        text=True,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    (path,) = (tmp_path / "r").rglob("summary.json")
    s = json.loads(path.read_text())
    assert s["dataset"] == "stripes" and s["rounds"] == 1
    assert sorted(s["test_per_client"]) == ["c0", "c1"]


def test_module_class_dataset_runs(installed, tmp_path, one_thread):
    """``dataset.name=fsdataplug:Stripes`` runs as the entry point does, to the same
    numbers: the name changes, the dataset does not."""
    fedshift.run(None, [*RUN, "dataset.name=stripes"], out=tmp_path / "a")
    fedshift.run(None, [*RUN, "dataset.name=fsdataplug:Stripes"], out=tmp_path / "b")
    assert DATASETS.is_plugin("fsdataplug:Stripes")
    (a,), (b,) = ((tmp_path / d).rglob("summary.json") for d in "ab")
    sa, sb = json.loads(a.read_text()), json.loads(b.read_text())
    assert sb["dataset"] == "fsdataplug:Stripes" and sb["clients"] == sa["clients"]
    assert results_of(sb) == results_of(sa) and sb["metrics"] == sa["metrics"]


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("fsdataplug:NoLoad", r"'fsdataplug:NoLoad' is not a dataset: it has no load"),
        ("fsdataplug:BadTask", r"its task is 'detection'; a dataset's task is one of"),
        ("fsdataplug:PlainMethodLoad", r"load is a plain method.*@staticmethod or @classmethod"),
        ("fsdataplug:Missing", r"has no attribute 'Missing'"),
    ],
)
def test_a_plugin_breaking_the_contract_is_named(installed, spec, match):
    with pytest.raises(FedshiftError, match=match) as e:
        resolve(load_config(None, [*RUN, f"dataset.name={spec}"]))
    assert spec in str(e.value)


def test_a_plugin_loading_what_it_did_not_declare_is_named(installed):
    """What ``load`` returns is checked: a Federation, of the declared task."""
    cfg = resolve(load_config(None, [*RUN, "dataset.name=fsdataplug:NotAFederation"]))
    with pytest.raises(FedshiftError, match=r"fsdataplug:NotAFederation.load returned a dict"):
        load_dataset(cfg.dataset)
    section = {"name": "fsdataplug:WrongTask"}
    with pytest.raises(FedshiftError, match="returned a classification federation, but the"):
        load_dataset(section)


def test_list_shows_installed_dataset_plugins(installed, capsys):
    from fedshift.cli import main

    assert main(["list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    line = next(ln for ln in lines if ln.strip().startswith("stripes "))
    assert "(plug-in: fsdataplug)" in line and "per_class=4" in line
    assert "striped images" in line
    line = next(ln for ln in lines if ln.strip().startswith("ghost "))
    assert "(cannot load)" in line and "fsdataplug:Nothing" in line


def test_the_guide_dataset_runs_by_module_class(tmp_path):
    """docs/EXTENDING.md's dataset, saved as mydatasets.py, runs with the guide's command."""
    import re

    guide = (Path(__file__).resolve().parents[2] / "docs" / "EXTENDING.md").read_text()
    code = re.search(r"<!-- example: mydatasets.py -->\s*```python\n(.*?)```", guide, re.S)
    cmd = re.search(r"python -m fedshift run (dataset.name=mydatasets:Stripes[^\n]*)", guide)
    assert code and cmd
    (tmp_path / "mydatasets.py").write_text(code.group(1))
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    argv = [sys.executable, "-m", "fedshift", "run", *cmd.group(1).split(), "--quiet"]
    out = subprocess.run([*argv, "--out", "r"], cwd=tmp_path, env=env, capture_output=True,
                         text=True)  # fmt: skip
    assert out.returncode == 0, out.stderr
    (path,) = (tmp_path / "r").rglob("summary.json")
    s = json.loads(path.read_text())
    assert s["dataset"] == "mydatasets:Stripes" and sorted(s["test_per_client"]) == [
        "c0", "c1", "c2",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("fault", "match"),
    [
        ("high", r"client 'c0' train labels hold 3, outside 0\.\.2 \(3 classes\)"),
        ("negative", r"client 'c0' train labels hold -1, outside 0\.\.2"),
        ("huge", r"client 'c0' train labels hold 1000000000000, outside 0\.\.2"),
        ("float", r"client 'c0' train labels are a torch\.float32 tensor; labels are int64"),
        ("no_classes", r"classes are an empty list; a federation names its classes"),
        ("same_names", r"client name 'c0' is given twice; client names are distinct"),
        ("empty_name", r"clients\[0\] is named ''; client names are non-empty strings"),
        ("empty_train", r"client 'c0' has an empty train split"),
        ("seg_shape", r"client 'c0' test labels have shape \(12, 1\), not \(12,\)"),
        ("exit", r"fsdataplug:Broken\.load called sys\.exit\(0\) while loading"),
        ("raise", r"fsdataplug:Broken\.load failed: ValueError: the plug-in's own bug"),
    ],
)
def test_what_a_plugin_loads_is_checked_against_the_contract(installed, fault, match):
    """Issue 48: labels out of range, negative, float or huge, no classes, a client name twice
    or empty, an empty training split, a label map of the wrong shape, a loader calling
    sys.exit or failing: one ContractError naming the plug-in's loader, before any training
    (the loader returned; nothing was built from it)."""
    from fedshift.core.contract_errors import ContractError

    with pytest.raises(ContractError, match=match) as e:
        load_dataset({"name": "fsdataplug:Broken", "fault": fault})
    assert str(e.value).startswith("dataset 'fsdataplug:Broken': fsdataplug:Broken.load ")
    assert "\n" not in str(e.value)
    load_dataset({"name": "fsdataplug:Broken"})  # the same plug-in, unbroken, loads


@pytest.mark.parametrize("fault", ["exit", "huge", "same_names"])
def test_a_broken_plugin_stops_the_run_in_one_line_and_leaves_no_run(
    installed, tmp_path, capsys, fault
):
    """`fedshift run` with a plug-in whose load calls sys.exit(0) exited 0 with no run (and
    one whose labels are out of range failed deep in training): now exit code 2, one line
    naming the plug-in, and no run directory."""
    from fedshift.cli import main

    out = tmp_path / "runs"
    argv = ["run", "--quiet", "--out", str(out), *RUN, "dataset.name=fsdataplug:Broken"]
    assert main([*argv, f"dataset.fault={fault}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fedshift: error: dataset 'fsdataplug:Broken': fsdataplug:Broken.load")
    assert err.count("\n") == 1 and "Traceback" not in err
    assert not [p for p in out.rglob("*") if p.is_file()]  # nothing written: no run started
    assert not list(out.rglob("*-seed0-*"))  # and no (empty) run directory
