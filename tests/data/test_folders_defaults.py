"""Issue 49, item 2: a user's own folders with the defaults. `fedshift run dataset.name=folders
dataset.root=DIR` works as typed (the image size follows the default model: cnn takes 28x28);
a size the model cannot take is refused when the config is resolved, before any image is
decoded, naming the ways out; a root one level too high (one site, whose classes would be
the sites) and class folders holding the same folders are refused naming the layout meant."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_user_loaders import make_folders

from fedshift.catalog import resolve
from fedshift.cli import main
from fedshift.core.config import load_config
from fedshift.core.errors import ConfigError, DataError
from fedshift.data import load_dataset


def _cfg(*over: str):
    return resolve(load_config(None, ["dataset.name=folders", *over]))


def test_the_size_follows_the_model(tmp_path):
    """Unset, dataset.size is the model's input size where it has one (cnn: 28), else 224;
    an explicit size is kept."""
    root = str(tmp_path)
    assert _cfg(f"dataset.root={root}").dataset.params.size == 28
    assert _cfg(f"dataset.root={root}", "model.name=resnet18").dataset.params.size == 224
    kept = _cfg(f"dataset.root={root}", "model.name=resnet18", "dataset.size=64")
    assert kept.dataset.params.size == 64


def test_a_size_the_model_cannot_take_is_refused_before_decoding(tmp_path):
    """cnn at 224 (or at one channel): one ConfigError naming dataset.size and the models
    that take any size; the cache folder stays empty (nothing decoded)."""
    root = make_folders(tmp_path / "data", {"a": ("png",), "b": ("png",)}, n=6)
    cache = tmp_path / "cache"
    for over in (["dataset.size=224"], ["dataset.channels=1"]):
        with pytest.raises(ConfigError) as e:
            _cfg(f"dataset.root={root}", f"dataset.cache_dir={cache}", *over)
        text = str(e.value)
        assert "dataset.size" in text and "resnet18" in text and "3x28x28" in text, text
    assert not cache.exists() or not any(cache.rglob("*"))


def test_fedshift_run_folders_as_typed_trains(tmp_path, capsys, monkeypatch):
    """The command as a user types it (one round here: the rest is the default config), on a
    generated three-site tree of 16/20-pixel images: exit 0, a table with every site."""
    root = make_folders(tmp_path / "data", {"a": ("png",), "b": ("jpg",), "c": ("png",)}, n=6)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FEDSHIFT_CACHE", str(tmp_path / "cache"))
    argv = ["run", "dataset.name=folders", f"dataset.root={root}", "train.rounds=1"]
    assert main([*argv, "--quiet"]) == 0
    out = capsys.readouterr().out
    assert all(f"| {s} " in out or f" {s} |" in out for s in ("a", "b", "c")), out
    assert "dataset.size=28" in out  # the run directory names the size it took


def test_a_root_one_level_too_high_is_refused_naming_the_root_meant(tmp_path):
    """<top>/<root>/<site>/<class>/<image> given as dataset.root=<top>: one site whose class
    folders hold the same folders; the error names <top>/<root>. A root with one site of
    plain classes: refused naming dataset.sites=[...] for loading one site on purpose."""
    top = tmp_path / "top"
    make_folders(top / "study", {"a": ("png",), "b": ("png",)}, n=4)
    with pytest.raises(DataError, match=f"dataset.root={top / 'study'}"):
        load_dataset({"name": "folders", "root": str(top), "size": 16, "cache": False})
    single = make_folders(tmp_path / "single", {"only": ("png",)}, n=4)
    with pytest.raises(DataError, match=r"holds one site folder \(only\).*dataset.sites=\[only\]"):
        load_dataset({"name": "folders", "root": str(single), "size": 16, "cache": False})
    fed = load_dataset(
        {"name": "folders", "root": str(single), "sites": ["only"], "size": 16, "cache": False}
    )
    assert fed.client_names == ["only"] and fed.classes == ["cat", "dog"]


def test_nested_folders_that_differ_per_class_are_still_read(tmp_path):
    """<site>/<class>/<patient>/<image> with other patients in each class is a layout of its
    own (images listed recursively), not refused."""
    root = tmp_path / "data"
    for site in ("a", "b"):
        for cls in ("cat", "dog"):
            make_folders(root / site / cls, {f"patient_{cls}": ("png",)}, n=3)
    # make_folders adds its own class level: <site>/<class>/patient_<class>/<cat|dog>/img
    fed = load_dataset({"name": "folders", "root": str(root), "size": 16, "cache": False})
    assert fed.classes == ["cat", "dog"] and len(fed.client_names) == 2


def test_a_layout_error_is_one_line_from_the_cli(tmp_path, capsys, monkeypatch):
    """The same refusal from `fedshift run`: one error line, no run trained."""
    monkeypatch.chdir(tmp_path)
    top = tmp_path / "top"
    make_folders(top / "study", {"a": ("png",), "b": ("png",)}, n=4)
    assert main(["run", "dataset.name=folders", f"dataset.root={top}", "train.rounds=1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("fedshift: error:"), err
    assert not any(Path(tmp_path).rglob("checkpoint.pt"))
