"""Issue 48, item 1: no write, copy, lock or delete through a name or a link fedshift did not
make. Every writing path (run, resume, overwrite, a new run into a claimed folder, bench,
claims collect, the decode cache, export, report, montages) is walked with a symbolic link
planted at a name it writes, pointing to a user's file outside; the victim must be unchanged
and a refusal must name the link. ``core.files`` is the one layer these paths go through."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from conftest import toy_cfg, toy_dir, write_suite

from fedshift.cli import main
from fedshift.core import files
from fedshift.core.errors import FedshiftError
from fedshift.core.files import UnsafePathError
from fedshift.runtime.rundir.ownership import LOCK_FILE
from fedshift.runtime.simulation import Simulation, run_experiment
from fedshift.runtime.stopping import RunInterrupted

THESIS = "\\documentclass{article} years of work\n"
TOY = ["dataset.name=toyshift", "model.name=lenet5", "train.batch_size=16", "train.rounds=2"]


def _victim(tmp_path: Path) -> Path:
    victim = tmp_path / "home" / "thesis.tex"
    victim.parent.mkdir(parents=True, exist_ok=True)
    victim.write_text(THESIS)
    return victim


def _plant(path: Path, victim: Path) -> None:
    if path.is_file() and not path.is_symlink():
        path.unlink()
    path.symlink_to(victim)


def _stopped_run(tmp_path: Path) -> Path:
    """A run stopped after round 1 of 2 (a checkpoint to resume)."""
    run_dir = tmp_path / "runs" / "r"
    with pytest.raises(RunInterrupted):
        Simulation(toy_cfg(rounds=2), run_dir, progress=False).run(stop_after=1)
    return run_dir


#: every file a run writes in its directory, and the temporary names earlier versions used
RUN_FILES = [
    LOCK_FILE,
    "run.log",
    "metrics.jsonl",
    "metrics.csv",
    "summary.json",
    "ledger.json",
    "checkpoint.pt",
    "selected.pt",
    "config.yaml",
    "convergence.png",
    "metrics.jsonl.tmp",
    "summary.json.tmp",
    "checkpoint.pt.tmp",
    "metrics.csv.tmp",
    "ledger.json.tmp",
]


@pytest.mark.parametrize("name", RUN_FILES)
def test_resume_refuses_a_link_planted_at_any_name_it_writes(tmp_path, capsys, name):
    """`fedshift run --resume` of a received run directory with ``name`` a link to the
    user's thesis: one error naming the link, the thesis unchanged."""
    run_dir = _stopped_run(tmp_path)
    victim = _victim(tmp_path)
    _plant(run_dir / name, victim)
    code = main(["run", "--resume", str(run_dir), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert str(run_dir / name) in err and "symbolic link" in err, err
    assert "Traceback" not in err
    assert victim.read_text() == THESIS


@pytest.mark.parametrize("exists", ["--new", "--overwrite", None])
def test_a_new_run_into_a_folder_holding_only_a_linked_lock(tmp_path, capsys, exists):
    """A folder holding nothing but a run.lock that links to the user's file (a claim whose
    run never started, as a collaborator's tarball may hold): never truncated or written."""
    victim = _victim(tmp_path)
    out = tmp_path / "runs"
    run_dir = out / "X" / toy_dir(*TOY[:3])
    run_dir.mkdir(parents=True)
    (run_dir / LOCK_FILE).symlink_to(victim)
    argv = ["run", *TOY, "name=X", "--out", str(out), "--quiet"]
    code = main(argv + ([exists] if exists else []))
    err = capsys.readouterr().err
    assert victim.read_text() == THESIS
    if exists == "--new":  # the next free name: a run of its own, the linked folder untouched
        assert code == 0, err
        assert (run_dir / LOCK_FILE).is_symlink()
    else:
        assert code == 2 and "symbolic link" in err, err


@pytest.mark.parametrize("name", ["bench.lock", "bench.json", "bench.json.tmp"])
def test_bench_refuses_a_link_in_the_suite_folder(tmp_path, capsys, name):
    """`fedshift bench` over a suite folder holding a planted link: refused before any cell
    runs, the victim unchanged."""
    suite = write_suite(tmp_path, train={"rounds": 1, "batch_size": 16}, sweep={"seed": [0]})
    folder = tmp_path / "runs" / "suite"
    folder.mkdir(parents=True)
    victim = _victim(tmp_path)
    (folder / name).symlink_to(victim)
    code = main(["bench", str(suite), "--workers", "1"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert str(folder / name) in err and "symbolic link" in err, err
    assert victim.read_text() == THESIS
    assert not any(p.is_dir() for p in folder.iterdir())  # no cell started


def test_bench_refuses_a_link_inside_a_cell(tmp_path, capsys):
    """A finished suite whose cell's summary.json was replaced by a link: a re-run does not
    write through it (the cell is refused, the victim unchanged)."""
    suite = write_suite(tmp_path, train={"rounds": 1, "batch_size": 16}, sweep={"seed": [0]})
    assert main(["bench", str(suite), "--workers", "1"]) == 0
    cell = next(p for p in (tmp_path / "runs" / "suite").iterdir() if p.is_dir())
    victim = _victim(tmp_path)
    _plant(cell / "metrics.jsonl", victim)
    (cell / "summary.json").unlink()  # unfinished: the re-run takes it up again
    main(["bench", str(suite), "--workers", "1"])
    err = capsys.readouterr().err
    assert str(cell / "metrics.jsonl") in err and "symbolic link" in err, err
    assert victim.read_text() == THESIS


def test_export_and_report_refuse_links_at_their_outputs(tmp_path, capsys):
    """`fedshift export --out L` and `fedshift report --out DIR` with DIR/report.md a link:
    refused, naming the link; the victim unchanged."""
    run = run_experiment(toy_cfg(rounds=1), run_dir=tmp_path / "runs" / "r", progress=False)
    victim = _victim(tmp_path)
    link = tmp_path / "model.pt"
    link.symlink_to(victim)
    assert main(["export", str(run.run_dir), "--out", str(link)]) == 2
    err = capsys.readouterr().err
    assert str(link) in err and "symbolic link" in err, err
    rep = tmp_path / "rep"
    rep.mkdir()
    (rep / "report.md").symlink_to(victim)
    assert main(["report", str(tmp_path / "runs"), "--out", str(rep)]) == 2
    err = capsys.readouterr().err
    assert str(rep / "report.md") in err and "symbolic link" in err, err
    assert victim.read_text() == THESIS


def test_the_decode_cache_never_writes_through_a_link(tmp_path):
    """write_npy and save_npz write a fresh temporary name (the fixed names earlier versions
    used may be planted: untouched); a cache entry folder that is a link is refused."""
    from fedshift.core.images import write_npy
    from fedshift.data.common import cache
    from fedshift.data.common.image_files import _write_cache

    victim = _victim(tmp_path)
    entry = tmp_path / "cache" / "entry"
    entry.mkdir(parents=True)
    (entry / f".train.npy.{os.getpid()}.tmp").symlink_to(victim)
    (entry / "kept.npz.tmp").symlink_to(victim)
    x = np.zeros((2, 1, 4, 4), dtype=np.uint8)
    write_npy(entry / "train.npy", x)
    cache.save_npz(entry / "kept.npz", {"train": np.arange(2)})
    assert np.load(entry / "train.npy").shape == (2, 1, 4, 4)
    assert victim.read_text() == THESIS
    linked = tmp_path / "cache" / "linked"
    outside = tmp_path / "outside"
    outside.mkdir()
    linked.symlink_to(outside, target_is_directory=True)
    with pytest.raises(UnsafePathError, match="symbolic link"):
        _write_cache(linked, {"train": x}, {"train": np.arange(2)})
    assert list(outside.iterdir()) == []
    _plant(entry / "train.npy", victim)  # the final name a link: refused, not replaced
    with pytest.raises(UnsafePathError, match="train.npy"):
        write_npy(entry / "train.npy", x)
    assert victim.read_text() == THESIS


def test_a_montage_is_not_written_through_a_link(tmp_path):
    """`data show --out` (every montage goes through core.files.save_figure)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    victim = _victim(tmp_path)
    link = tmp_path / "montage.png"
    link.symlink_to(victim)
    fig = plt.figure()
    try:
        with pytest.raises(UnsafePathError, match="montage.png"):
            files.save_figure(fig, link)
        files.save_figure(fig, tmp_path / "ok.png")
    finally:
        plt.close(fig)
    assert victim.read_text() == THESIS
    assert (tmp_path / "ok.png").read_bytes()[:4] == b"\x89PNG"


# ---------------------------------------------------------------------- claims collect
def _suite_folder(tmp_path: Path) -> Path:
    """A finished suite folder of one cell (what `fedshift bench` leaves)."""
    suite = write_suite(tmp_path, train={"rounds": 1, "batch_size": 16}, sweep={"seed": [0]})
    assert main(["bench", str(suite), "--workers", "1"]) == 0
    return tmp_path / "runs" / "suite"


def _repo(tmp_path: Path) -> tuple[Path, Path]:
    """A repository with a committed suite under results/ and a file of the user's beside."""
    repo = tmp_path / "repo"
    (repo / "results" / "committed").mkdir(parents=True)
    (repo / "results" / "committed" / "source.json").write_text("{}")
    (repo / "notes.txt").write_text("mine")
    return repo, repo / "results"


@pytest.mark.parametrize(
    "extra",
    [["--name", ".."], ["--name", "."], ["--name", "a/../.."], ["--protocol", ".."],
     ["--protocol", "../x"], ["--name", "ABS"], ["--protocol", "ABS"], ["--name", ""]],
    ids=["name-dotdot", "name-dot", "name-nested", "protocol-dotdot", "protocol-up",
         "name-abs", "protocol-abs", "name-empty"],
)  # fmt: skip
def test_collect_refuses_names_that_escape_results(tmp_path, capsys, extra):
    """`fedshift claims collect --name ..` used to remove the whole repository, `--protocol
    ..` results/, `--name /abs` that path: each is refused, nothing is touched."""
    folder = _suite_folder(tmp_path)
    repo, results = _repo(tmp_path)
    victim = tmp_path / "abs"
    victim.mkdir()
    (victim / "keep.txt").write_text("keep")
    extra = [str(victim) if e == "ABS" else e for e in extra]
    argv = ["claims", "collect", str(folder), "--command", "x", "--results", str(results)]
    assert main([*argv, *extra]) == 2
    err = capsys.readouterr().err
    assert "fedshift: error:" in err and "Traceback" not in err
    assert (repo / "notes.txt").read_text() == "mine"
    assert (results / "committed" / "source.json").is_file()
    assert (victim / "keep.txt").read_text() == "keep"


def test_collect_from_inside_the_suite_folder_takes_its_name(tmp_path, capsys, monkeypatch):
    """`cd suite && fedshift claims collect .` used to remove every committed suite (the
    name of '.' is empty): now it collects into results/<the folder's name>."""
    folder = _suite_folder(tmp_path)
    repo, results = _repo(tmp_path)
    monkeypatch.chdir(folder)
    assert main(["claims", "collect", ".", "--command", "x", "--results", str(results)]) == 0
    assert (results / "committed" / "source.json").is_file()
    assert (results / "suite" / "source.json").is_file()
    assert len([p for p in (results / "suite").iterdir() if p.is_dir()]) == 1


@pytest.mark.parametrize("name", ["config.yaml", "summary.json"])
def test_collect_refuses_a_received_suite_with_linked_files(tmp_path, capsys, name):
    """A received suite whose cell's ``name`` links to the user's private key: refused
    before results/ is touched; no copy of the key lands in results/."""
    folder = _suite_folder(tmp_path)
    repo, results = _repo(tmp_path)
    key = tmp_path / "home" / ".ssh" / "id_rsa"
    key.parent.mkdir(parents=True)
    key.write_text("PRIVATE KEY")
    cell = next(p for p in folder.iterdir() if p.is_dir())
    _plant(cell / name, key)
    argv = ["claims", "collect", str(folder), "--command", "x", "--results", str(results)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert str(cell / name) in err and "symbolic link" in err, err
    assert not (results / "suite").exists()
    assert not any("PRIVATE" in p.read_text() for p in results.rglob("*") if p.is_file())


def test_collect_protocol_refuses_a_linked_table(tmp_path, capsys):
    """A protocol output whose table.json links outside: refused, nothing copied."""
    out = tmp_path / "proto"
    out.mkdir()
    (out / "new-site.md").write_text("# table\n")
    key = _victim(tmp_path)
    (out / "table.json").symlink_to(key)
    repo, results = _repo(tmp_path)
    argv = ["claims", "collect", str(out), "--command", "x", "--results", str(results)]
    assert main([*argv, "--protocol", "p"]) == 2
    err = capsys.readouterr().err
    assert str(out / "table.json") in err and "symbolic link" in err, err
    assert not (results / "protocols" / "p").exists()


def test_claims_page_must_stay_under_docs(tmp_path):
    """A claims file whose ``page`` leaves docs/ (``../../x.md``, an absolute path): refused
    when the claims are read, before any page is written."""
    from fedshift.claims.spec import ClaimsError, load_paper

    for page in ("../../outside.md", "/tmp/x.md", "docs/../../x.md", "docs/x.txt"):
        spec = tmp_path / "paper.yaml"
        spec.write_text(json.dumps({"paper": "P", "page": page, "claims": []}))
        with pytest.raises(ClaimsError, match="page"):
            load_paper(spec)


# ---------------------------------------------------------------------- the layer itself
def test_core_files_refuse_links_and_special_files(tmp_path):
    """The layer's primitives, each against a planted link and a FIFO (which must not
    block)."""
    victim = _victim(tmp_path)
    link = tmp_path / "l"
    link.symlink_to(victim)
    fifo = tmp_path / "f"
    os.mkfifo(fifo)
    for bad in (link, fifo):
        with pytest.raises(UnsafePathError):
            files.write_text_atomic(bad, "x")
        with pytest.raises(UnsafePathError):
            files.open_append(bad)
        with pytest.raises(UnsafePathError):
            files.open_lock(bad)
        with pytest.raises(UnsafePathError):
            files.copy_regular(bad, tmp_path / "copy")
    with pytest.raises(UnsafePathError, match="FIFO"):
        files.read_json(fifo)  # never blocks
    assert files.read_bytes(link) == THESIS.encode()  # reading through a link is allowed
    with pytest.raises(UnsafePathError):
        files.read_bytes(link, follow=False)
    dir_link = tmp_path / "d"
    dir_link.symlink_to(tmp_path / "home", target_is_directory=True)
    with pytest.raises(UnsafePathError):
        files.ensure_dir(dir_link)
    with pytest.raises(UnsafePathError):
        files.remove_tree(dir_link, tmp_path)
    with pytest.raises(UnsafePathError):
        files.remove_tree(tmp_path, tmp_path)
    root = tmp_path / "root"
    root.mkdir()
    (root / "d").symlink_to(tmp_path / "home", target_is_directory=True)
    with pytest.raises(UnsafePathError):
        files.child_path(root, "d/x", nested=True)  # through a link out of the root
    assert victim.read_text() == THESIS and (tmp_path / "home").is_dir()
    assert files.child_path(tmp_path, "ok") == tmp_path / "ok"
    with pytest.raises(FedshiftError):
        files.check_folder(tmp_path)  # holds a link and a FIFO


def test_metrics_csv_appends_never_go_through_a_link_planted_between_rounds(tmp_path):
    """``metrics.csv`` is appended to each evaluated round; a link planted at its name after
    the tracker opened (a run folder another process can write) is refused, not followed,
    and the rows stay byte-identical to a plain append where no link is planted."""
    from fedshift.runtime.hooks import RoundRecord
    from fedshift.runtime.tracking.trackers import CsvTracker

    row = {"round": 1, "client": "a", "global": {"test_acc": 0.5}}
    later = RoundRecord(round=2, train_loss={}, rows=[{**row, "round": 2}])
    plain = CsvTracker(tmp_path / "plain")
    (tmp_path / "plain").mkdir()
    plain.open(1, [row], resumed=False)
    plain.log_round(later)
    assert (tmp_path / "plain" / "metrics.csv").read_text().count("\n") == 3
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    tracker = CsvTracker(run_dir)
    tracker.open(1, [row], resumed=False)
    victim = _victim(tmp_path)
    _plant(run_dir / "metrics.csv", victim)
    with pytest.raises(UnsafePathError, match="symbolic link"):
        tracker.log_round(later)
    assert victim.read_text() == THESIS
