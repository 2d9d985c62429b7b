"""Typed components (fedshift.core.components): resolve() gives every component section as a
frozen Component once; builders take it as it is; config.yaml and every digest are what the
plain-dict sections gave."""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json

import pytest
import yaml
from conftest import ROOT

import fedshift.data
from fedshift.bench import plan
from fedshift.catalog import REGISTRIES, resolve
from fedshift.core.components import Component
from fedshift.core.config import RunConfig, build_dataclass, dump_config, load_config
from fedshift.core.config_tree import COMPONENT_SECTIONS, expand_sweep
from fedshift.core.errors import ConfigError
from fedshift.core.identity import number_config
from fedshift.core.registry import Registry
from fedshift.data import client_names, load_dataset
from fedshift.models.weights import WEIGHT_KEYS, resolve_weights
from fedshift.runtime.experiment import build_experiment
from fedshift.runtime.rundir.results import run_digest

SUITES = [ROOT / "configs/demo.yaml", *sorted((ROOT / "configs/suites").glob("*.yaml"))]
#: the default component of each section (RunConfig's documented defaults)
DEFAULT_NAMES = {"dataset": "digits", "model": "cnn", "algorithm": "fedavg", "partition": "none"}
TOY = ["dataset.name=toyshift", "dataset.train_size=8", "dataset.val_size=4",
       "dataset.test_size=4", "model.name=cnn", "model.width=4"]  # fmt: skip


def _plain_section(section: str, data: dict, prefix: str | None = None) -> dict:
    """A component section as plain data, the way resolve() made it when sections were
    dicts: the entry's Params built from the given keys, flattened by asdict."""
    entry = REGISTRIES[section].entry(str(data["name"]))
    rest = {k: v for k, v in data.items() if k != "name"}
    if section == "model":
        rest = {k: v for k, v in rest.items() if k not in WEIGHT_KEYS}
    out = {"name": entry.name}
    if entry.params is not None:
        out.update(dataclasses.asdict(build_dataclass(entry.params, rest, prefix or section)))
    if section == "model":
        out.update(resolve_weights(data))
    return out


def _plain_config(raw: dict) -> dict:
    """``raw`` resolved without typed components (see :func:`_plain_section`)."""
    fixed = build_dataclass(RunConfig, raw, skip=(*COMPONENT_SECTIONS, "augment"))
    sections = {}
    for s in COMPONENT_SECTIONS:
        given = dict(raw.get(s) or {})
        sections[s] = _plain_section(s, {"name": DEFAULT_NAMES[s], **given})
    algo = REGISTRIES["algorithm"].entry(sections["algorithm"]["name"])
    keys = {k: v for k, v in sections["algorithm"].items() if k != "name"}
    params = algo.params(**keys) if algo.params is not None else None
    given = raw.get("augment") or []
    listed = {a if isinstance(a, str) else a["name"] for a in given}
    implied = [a for a in algo.obj.implied_augments(params) if a not in listed]
    augment = []
    for item in [*implied, *given]:
        one = {"name": item} if isinstance(item, str) else item
        augment.append(_plain_section("augment", one, f"augment.{one['name']}"))
    out = {}
    for f in dataclasses.fields(RunConfig):
        if f.name in sections:
            out[f.name] = sections[f.name]
        elif f.name == "augment":
            out[f.name] = augment
        else:
            value = getattr(fixed, f.name)
            plain = dataclasses.is_dataclass(value)
            out[f.name] = dataclasses.asdict(value) if plain else copy.deepcopy(value)
    return out


def _yaml(d: dict) -> str:
    """``yaml.safe_dump`` of ``d`` in its key order, by libyaml's emitter (the same safe
    representer: a value safe_dump refuses is refused; ~250 dumps of this test were two
    thirds of its CPU in the pure-Python emitter). config.yaml itself is compared byte for
    byte with ``yaml.safe_dump`` below. A PyYAML built without libyaml: its SafeDumper."""
    return yaml.dump(d, Dumper=getattr(yaml, "CSafeDumper", yaml.SafeDumper), sort_keys=False)


def _digest(d: dict) -> str:
    return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:10]


@pytest.mark.parametrize("suite", SUITES, ids=lambda p: p.name)
def test_typed_config_serialises_as_the_plain_one(suite, tmp_path):
    """config.yaml, the bench cell digest and folder and the run digest of every cell of every
    shipped suite: the typed components give what the plain sections give."""
    raws = expand_sweep(load_config(suite), str(suite))
    cells = plan(suite)
    assert len(cells) == len(raws)
    for i, (raw, cell) in enumerate(zip(raws, cells, strict=True)):
        plain = _plain_config(raw)
        typed = cell.cfg.to_dict()
        assert _yaml(typed) == _yaml(plain)
        digest = _digest(number_config(plain))
        assert cell.digest == digest
        head = f"{plain['algorithm']['name'].replace(':', '.')}-{plain['dataset']['name']}"
        assert cell.run_dir.name == f"{head}-seed{plain['seed']}-{digest}"
        no_seed = number_config(plain)
        no_seed.pop("seed")
        no_seed["train"].pop("rounds")
        assert run_digest(cell.cfg) == _digest(no_seed)
        if i == 0:  # the file a run writes, byte for byte
            dump_config(cell.cfg, tmp_path / "config.yaml")
            written = (tmp_path / "config.yaml").read_bytes()
            assert written == yaml.safe_dump(plain, sort_keys=False).encode()


def test_resolve_gives_frozen_typed_components():
    cfg = resolve(load_config(None, [*TOY, "algorithm.name=fedprox", "algorithm.mu=0.1"]))
    for section in COMPONENT_SECTIONS:
        assert isinstance(getattr(cfg, section), Component)
    algo = cfg.algorithm
    assert algo.name == "fedprox" and algo.params.mu == 0.1
    assert algo.factory is REGISTRIES["algorithm"].get("fedprox")
    with pytest.raises(dataclasses.FrozenInstanceError):
        algo.name = "fedavg"  # type: ignore[misc]
    fedfa = resolve(load_config(None, [*TOY, "algorithm.name=fedfa"]))
    assert [a.name for a in fedfa.augment] == ["ffa"]  # the implied augment, typed too
    assert all(isinstance(a, Component) for a in fedfa.augment)
    assert fedfa.augment[0].defaults() == dataclasses.asdict(type(fedfa.augment[0].params)())


def test_unresolved_component_says_so():
    with pytest.raises(ConfigError, match="never resolved"):
        _ = RunConfig().algorithm.factory
    assert RunConfig().to_dict()["algorithm"] == {"name": "fedavg"}


def test_builders_never_look_components_up(monkeypatch):
    """Once resolved, loading the data and building the experiment use the components as
    they are: no registry lookup (which would also validate the keys again)."""
    cfg = resolve(load_config(None, [*TOY, "algorithm.name=fedbn", "augment=[fedrdn]"]))

    def no_lookup(self, name, key=None):
        raise AssertionError(f"{self.kind} {name!r} looked up again")

    monkeypatch.setattr(Registry, "entry", no_lookup)
    fed = load_dataset(cfg.dataset, cfg.partition)
    exp = build_experiment(cfg, fed)
    assert [a.name for a in exp.augments] == ["fedrdn"]
    assert type(exp.algo.algo) is cfg.algorithm.factory


def test_plain_sections_are_validated_once_at_the_builder():
    """A builder given a plain {name: ..., **params} mapping validates it into a component."""
    with pytest.raises(ConfigError, match="dataset.train_size"):
        load_dataset({"name": "toyshift", "train_size": 0})
    with pytest.raises(ConfigError, match="unknown config key 'dataset.size'"):
        load_dataset({"name": "toyshift", "size": 3})


@pytest.mark.parametrize(
    ("dataset", "partition"),
    [
        ({"name": "toyshift", "clients": 4}, {"name": "none"}),
        ({"name": "toyseg", "clients": 2, "size": 16}, {"name": "none"}),
        ({"name": "toyshift", "clients": 1, "train_size": 40}, {"name": "iid", "clients": 3}),
        ({"name": "toyshift", "clients": 2, "train_size": 60}, {"name": "classes", "clients": 11}),
        ({"name": "toyshift", "clients": 1, "train_size": 80},
         {"name": "dirichlet", "clients": 4, "min_size": 1}),
        ({"name": "toyshift", "clients": 1, "classes": 4}, {"name": "one-class", "clients": 6}),
        ({"name": "toyshift", "clients": 1, "classes": 4}, {"name": "one-class"}),  # loads
    ],
)  # fmt: skip
def test_client_names_without_loading_match_the_loaded(dataset, partition, monkeypatch):
    """flower simulate counts its SuperNodes from the parameters where they name the
    clients (nothing loaded): the names are those of the federation loading gives."""
    loaded = load_dataset(dataset, partition).client_names
    named = partition["name"] != "one-class" or "clients" in partition
    if named:
        monkeypatch.setattr(fedshift.data, "load_dataset", _no_loading)
    assert client_names(dataset, partition) == loaded


def _no_loading(*args, **kwargs):
    raise AssertionError("the dataset was loaded to name its clients")
