"""Issue 49, item 5: `data show --out` writes a montage for every registered dataset (or
refuses, saying why); a stray image beside the class folders is counted and reported;
`data check` reports the images' sizes on disk before resizing; errors name the fix
(`dataset.skip_unreadable`, `dataset.sites`, `-c demo`, a relative `dataset.root` as the
absolute path it was taken as)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PIL import Image
from test_user_loaders import make_folders, save_image

from fedshift.cli import main
from fedshift.core.config import load_config
from fedshift.core.errors import ConfigError, DataError, MissingSourceError
from fedshift.data import DATASETS, load_dataset

#: datasets whose `data show --out` other tests run (with the files each needs)
SHOWN_ELSEWHERE = {
    "digits": "tests/cli/test_cli.py::test_data_show",
    "brain-mri": "tests/cli/test_cli.py::test_data_show_brain_mri_counts_and_preview",
    "fashion-mnist": "tests/data/test_fashion.py (the Debian files)",
}


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDSHIFT_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)


@pytest.mark.parametrize("name", sorted(set(DATASETS.names()) - set(SHOWN_ELSEWHERE)))
def test_data_show_writes_a_montage_or_refuses_saying_why(name, tmp_path, capsys):
    png = tmp_path / f"{name}.png"
    rc = main(["data", "show", name, "--out", str(png)])
    out, err = capsys.readouterr()
    if rc == 0:
        assert f"montage: {png}" in out
        with Image.open(png) as im:
            assert im.size[0] > 100 and im.size[1] > 100
    else:  # data the user keeps: refused naming the key that points to it
        assert rc == 2 and "dataset.root" in err and "Traceback" not in err, err
        assert not png.exists()


def test_every_dataset_shown_elsewhere_is_registered():
    assert set(SHOWN_ELSEWHERE) <= set(DATASETS.names())


def _tree(tmp_path: Path) -> Path:
    root = make_folders(tmp_path / "data", {"a": ("png",), "b": ("jpg",)}, n=6)
    save_image(root / "a" / "stray", 0, 0, 0, "png", side=40)  # beside cat/ and dog/
    return root


def test_a_stray_image_beside_the_class_folders_is_counted_and_reported(tmp_path, capsys, caplog):
    root = _tree(tmp_path)
    fed = load_dataset({"name": "folders", "root": str(root), "size": 16, "cache": False})
    assert fed.info["skipped"]["stray_images"] == {"a": [str(root / "a" / "stray.png")], "b": []}
    assert fed.info["skipped_files"] == {"a": 1, "b": 0}
    png = tmp_path / "m.png"
    assert main(["data", "show", "folders", f"root={root}", "size=16", "--out", str(png)]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out[: out.rindex("}") + 1])["skipped_files"] == {"a": 1, "b": 0}
    assert png.is_file()
    assert main(["data", "check", "dataset.name=folders", f"dataset.root={root}",
                 "--out", str(tmp_path / "check")]) == 0  # fmt: skip
    out, err = capsys.readouterr()
    warned = [m for r in caplog.records if "beside the class folders" in (m := r.getMessage())]
    assert warned and "a: 1 (" in warned[-1] and "stray.png" in warned[-1]  # the warning
    assert "1 image(s) lie directly in a site folder" in out
    data = json.loads((tmp_path / "check" / "shift.json").read_text())
    assert data["files"]["sites"]["a"]["stray_images"] == 1


def test_data_check_reports_the_sizes_on_disk_before_resizing(tmp_path, capsys):
    root = _tree(tmp_path)  # 16x16 images, every third 20x20; the stray 40x40 is not counted
    argv = ["data", "check", "dataset.name=folders", f"dataset.root={root}"]
    assert main([*argv, "--out", str(tmp_path / "check")]) == 0
    out = capsys.readouterr().out
    assert "| a | 12 | 16x16 | 16x16 | 20x20 | 2 | 0 | 1 | 0 |" in out, out
    assert "| b | 12 | 16x16 | 16x16 | 20x20 | 2 | 0 | 0 | 0 |" in out
    assert "resized to 3x28x28" in out
    sites = json.loads((tmp_path / "check" / "shift.json").read_text())["files"]["sites"]
    assert sites["b"]["original"] == {
        "images": 12, "sizes": 2, "unreadable": 0, "min": "16x16", "median": "16x16",
        "max": "20x20",
    }  # fmt: skip
    # a dataset without image files of its own says so
    assert main(["data", "check", "toyshift", "--out", str(tmp_path / "toy")]) == 0
    assert "not read for this dataset" in capsys.readouterr().out


def test_an_unreadable_image_names_dataset_skip_unreadable(tmp_path):
    root = make_folders(tmp_path / "data", {"a": ("png",), "b": ("png",)}, n=6)
    (root / "b" / "cat" / "img_00.png").write_bytes(b"not an image")
    with pytest.raises(DataError, match=r"dataset.skip_unreadable=true"):
        load_dataset({"name": "folders", "root": str(root), "size": 16, "cache": False})


def test_a_folder_that_is_not_a_site_names_dataset_sites(tmp_path):
    root = make_folders(tmp_path / "data", {"a": ("png",), "b": ("png",)}, n=4)
    (root / "notes").mkdir()
    (root / "notes" / "readme.txt").write_text("x")
    with pytest.raises(DataError, match=r"If notes is not a site, leave it out: "
                       r"dataset.sites=\[a,b\]"):  # fmt: skip
        load_dataset({"name": "folders", "root": str(root), "size": 16, "cache": False})
    (root / "notes" / "cat").mkdir()
    save_image(root / "notes" / "cat" / "x", 0, 0, 0, "png")
    with pytest.raises(DataError, match=r"if one of the folders is not a site, list the sites: "
                       r"dataset.sites=\[a,b,notes\]"):  # fmt: skip
        load_dataset({"name": "folders", "root": str(root), "size": 16, "cache": False})


def test_a_relative_root_is_taken_from_the_current_folder_and_named_absolute(tmp_path):
    with pytest.raises(MissingSourceError) as e:
        load_dataset({"name": "folders", "root": "mydata", "size": 16, "cache": False})
    assert f"{tmp_path / 'mydata'} does not exist (relative to the current folder" in str(e.value)
    make_folders(tmp_path / "mydata", {"a": ("png",), "b": ("png",)}, n=4)
    fed = load_dataset({"name": "folders", "root": "mydata", "size": 16, "cache": False})
    assert fed.info["root"] == str(tmp_path / "mydata")


def test_a_missing_repository_config_names_the_shipped_one(tmp_path):
    """A pip user typing the repository's `-c configs/demo.yaml` (no configs/ folder here)."""
    with pytest.raises(ConfigError) as e:
        load_config("configs/demo.yaml", [])
    msg = str(e.value)
    assert f"(looked for {tmp_path / 'configs' / 'demo.yaml'})" in msg and "`-c demo`" in msg
    with pytest.raises(ConfigError, match=r"`fedshift bench fedrdn_table1`"):
        load_config("configs/suites/fedrdn_table1.yaml", [])
    with pytest.raises(ConfigError) as e:
        load_config("configs/mine.yaml", [])
    assert "ships" not in str(e.value)
