"""The command line end to end: run, resume, list, errors."""

from __future__ import annotations

import json

import pytest

from fedshift.cli import main

SUMMARY_KEYS = {
    "algorithm",
    "dataset",
    "seed",
    "rounds",
    "best_round",
    "val_mean",
    "test_mean",
    "test_per_client",
    "bytes_up",
    "bytes_down",
    "wall_s",
}


@pytest.fixture
def digits_env(tmp_path_factory, monkeypatch):
    cache = tmp_path_factory.getbasetemp() / "fedshift-cache"
    monkeypatch.setenv("FEDSHIFT_CACHE", str(cache))
    return [
        "dataset.domains=[mnist,optdigits,mnistm]",
        "dataset.train_size=60",
        "dataset.val_size=20",
        "dataset.test_size=40",
        "dataset.synth_pool=500",
    ]


@pytest.mark.png  # the convergence.png drawn (tests/conftest.py: 1x1 elsewhere)
def test_run_on_digits_end_to_end(tmp_path, digits_env, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "name: e2e\nmodel: {name: lenet5}\ntrain: {rounds: 3, batch_size: 16}\n"
        "sweep: {algorithm.name: [fedavg, fedbn]}\n"
    )
    rc = main(["run", "-c", str(cfg), *digits_env, "--out", str(tmp_path / "runs"), "--quiet"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "mnistm" in out and "fedbn" in out and "run directories" in out
    for algo in ("fedavg", "fedbn"):
        [d] = (tmp_path / "runs" / "e2e").glob(f"{algo}-digits-*seed0-*")
        summary = json.loads((d / "summary.json").read_text())
        assert set(summary) >= SUMMARY_KEYS
        assert set(summary["test_per_client"]) == {"mnist", "optdigits", "mnistm"}
        assert summary["rounds"] == 3
        rows = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
        assert {r["round"] for r in rows} == {1, 2, 3} and len(rows) == 9
        assert (d / "convergence.png").stat().st_size > 1000
        assert (d / "config.yaml").is_file()


def test_resume_from_cli(tmp_path, digits_env, capsys):
    """`fedshift run --resume` continues a killed digits run to the uninterrupted one."""
    from support.same_run import assert_runs_equal

    from fedshift.catalog import resolve
    from fedshift.core.config import load_config
    from fedshift.runtime.simulation import run_experiment
    from fedshift.runtime.stopping import RunInterrupted

    over = [
        *digits_env,
        "model.name=lenet5",
        "train.rounds=4",
        "checkpoint.every=2",
        "train.batch_size=16",
    ]
    cfg = resolve(load_config(None, over))
    with pytest.raises(RunInterrupted):  # killed after round 3; the checkpoint is round 2's
        run_experiment(cfg, run_dir=tmp_path / "k", progress=False, stop_after=3)
    assert main(["run", "--resume", str(tmp_path / "k"), "--quiet"]) == 0
    full = run_experiment(cfg, run_dir=tmp_path / "f", progress=False)
    assert_runs_equal(tmp_path / "k", full.run_dir)


def test_list(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for name in (
        "fedavg",
        "fedbn",
        "fedprox",
        "fedavgm",
        "fedadam",
        "fednova",
        "scaffold",
        "local",
        "central",
        "digits",
        "cnn",
        "digitmodel",
        "lenet5",
    ):
        assert name in out


def test_config_error_exit_code_and_message(capsys):
    assert main(["run", "train.lrr=0.1", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "unknown config key 'train.lrr'" in err and "did you mean 'lr'" in err


def test_data_show(tmp_path, digits_env, capsys):
    png = tmp_path / "m.png"
    assert main(["data", "show", "digits", *digits_env, "--out", str(png)]) == 0
    counts = json.loads(capsys.readouterr().out.split("montage:")[0])
    assert counts["mnist"] == {"train": 60, "val": 20, "test": 40}
    assert png.stat().st_size > 1000


def test_data_show_user_dataset_without_root_shows_the_layout(capsys):
    assert main(["data", "show", "prostate"]) == 2
    err = capsys.readouterr().err
    assert "dataset.root" in err and "Case00_segmentation.nii.gz" in err


def test_data_show_brain_mri_counts_and_preview(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("FEDSHIFT_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "scanners.png"
    assert main(["data", "show", "brain-mri", "size=32", "sites=2", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    shown = json.loads(text[: text.rindex("}") + 1])
    assert shown["task"] == "segmentation"
    assert set(shown["counts"]) == {"site1", "site2"}
    assert out.is_file()


def test_overrides_may_follow_options():
    from fedshift.cli import parse

    args = parse(["bench", "s.yaml", "--quiet", "sweep={seed: [0, 1]}", "--workers", "2", "a=1"])
    assert args.suite == "s.yaml" and args.quiet and args.workers == 2
    assert args.overrides == ["sweep={seed: [0, 1]}", "a=1"]
    with pytest.raises(SystemExit):
        parse(["bench", "s.yaml", "--no-such-flag"])
    with pytest.raises(SystemExit):
        parse(["list", "stray"])


def test_protocol_fresh_reaches_the_suite_options():
    """`fedshift protocol loco|new-site|sweep|head-finetune --fresh`: every cell runs here,
    none taken from results/ (the protocols' SuiteOptions.fresh; default off)."""
    from fedshift.cli import parse
    from fedshift.cli.protocol import _suite_options

    for name in ("loco", "new-site", "sweep", "head-finetune"):
        extra = ["--key", "train.lr", "--values", "0.1"] if name == "sweep" else []
        on = _suite_options(parse(["protocol", name, "-c", "x.yaml", "--fresh", *extra]))
        off = _suite_options(parse(["protocol", name, "-c", "x.yaml", *extra]))
        assert on.fresh and not off.fresh, name


def test_output_into_a_closed_pipe_ends_quietly(monkeypatch):
    """`fedshift list | head -1`: the reader closing the pipe is no error (it printed
    'fedshift: error: Broken pipe'); the exit code is a shell's 141 (128 + SIGPIPE)."""
    import io
    import sys

    class ClosedPipe(io.StringIO):
        def write(self, s: str) -> int:
            raise BrokenPipeError(32, "Broken pipe")

    err = io.StringIO()
    monkeypatch.setattr(sys, "stdout", ClosedPipe())
    monkeypatch.setattr(sys, "stderr", err)
    assert main(["list"]) == 141
    assert err.getvalue() == ""
