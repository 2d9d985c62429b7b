"""Issue 49, item 5: `fedshift cache list|clean`. The list names each cache folder with its
files and size; clean removes the derived folders (all, or those named), keeps the fetched
package files unless --sources, and deletes nothing outside the cache or through a link."""

from __future__ import annotations

from pathlib import Path

from fedshift.cli import main


def _cache(tmp_path: Path) -> tuple[Path, Path]:
    cache = tmp_path / "cache"
    for folder, n in (("folders/ab12", 3), ("digits/v1-seed0", 2), ("sources/opencv", 1)):
        (cache / folder).mkdir(parents=True)
        for i in range(n):
            (cache / folder / f"f{i}.npy").write_bytes(b"x" * 1000)
    outside = tmp_path / "mine"
    outside.mkdir()
    (outside / "thesis.tex").write_text("years of work")
    (cache / "linked").symlink_to(outside, target_is_directory=True)
    return cache, outside


def test_list_names_every_folder_and_its_size(tmp_path, capsys):
    cache, _ = _cache(tmp_path)
    assert main(["cache", "list", "--cache-dir", str(cache)]) == 0
    out = capsys.readouterr().out
    lines = {ln.split()[0]: ln for ln in out.splitlines() if ln and ln.split()[0] in
             ("folders", "digits", "sources", "linked")}  # fmt: skip
    assert lines["folders"].split()[1] == "3" and lines["digits"].split()[1] == "2"
    assert "kept by clean" in lines["sources"] and "symbolic link" in lines["linked"]


def test_clean_removes_derived_folders_and_keeps_sources_and_links(tmp_path, capsys):
    cache, outside = _cache(tmp_path)
    assert main(["cache", "clean", "--cache-dir", str(cache), "--dry-run"]) == 0
    assert (cache / "folders").is_dir()  # a dry run removes nothing
    assert main(["cache", "clean", "digits", "--cache-dir", str(cache)]) == 0
    assert not (cache / "digits").exists() and (cache / "folders").is_dir()
    assert main(["cache", "clean", "--cache-dir", str(cache)]) == 0
    assert sorted(p.name for p in cache.iterdir()) == ["linked", "sources"]
    assert (outside / "thesis.tex").read_text() == "years of work"
    assert main(["cache", "clean", "sources", "--cache-dir", str(cache)]) == 2  # needs --sources
    assert main(["cache", "clean", "--sources", "--cache-dir", str(cache)]) == 0
    assert sorted(p.name for p in cache.iterdir()) == ["linked"]


def test_clean_refuses_names_outside_the_cache_and_links(tmp_path, capsys):
    cache, outside = _cache(tmp_path)
    for name in ("..", ".", str(outside), "linked", "nothing-here"):
        assert main(["cache", "clean", name, "--cache-dir", str(cache)]) == 2, name
        err = capsys.readouterr().err
        assert err.startswith("fedshift: error:") and "Traceback" not in err, err
    assert (outside / "thesis.tex").read_text() == "years of work"
    assert (cache / "folders").is_dir() and (tmp_path / "cache").is_dir()
