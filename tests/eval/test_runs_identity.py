"""Issue 27, items 1-3: reports compare like with like, run directories say what they hold,
and one override rule (a value for a swept key replaces its sweep), Flower included.

Each test here failed on 199aa57: the lr sweep's report merged its two learning rates into
one row of 4 "seeds" (avg ± std from the last run of each seed only); every run directory
was ``<algorithm>-<dataset>-seed<k>`` and an existing one was "run there before" whatever
its config; ``fedshift.run`` took a ``-2`` directory where the CLI refused; an override of a
swept key was ignored (``fedshift run``, bench) or refused (``fedshift flower``); a Flower
run on 2 SuperNodes trained 2 of the config's 3 clients."""

from __future__ import annotations

import json
import shutil
import statistics
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, toy_cfg

import fedshift
from fedshift.bench import config_digest, plan
from fedshift.cli import main
from fedshift.core.config import load_config
from fedshift.core.config_tree import expand_sweep
from fedshift.core.errors import FedshiftError
from fedshift.eval.report import build_report, load_runs
from fedshift.eval.tables import flows_rows
from fedshift.runtime.rundir.ownership import RunDirExists

TOY = ["dataset.name=toyshift", "model.name=lenet5", "train.batch_size=16", "name=t"]


def _cells(md: str, start: str) -> list[str]:
    line = next(x for x in md.splitlines() if x.startswith(start))
    return [c.strip() for c in line.strip("|").split("|")]


# ------------------------------------------------------------------ 1. like with like
@pytest.fixture(scope="module")
def lr_sweep(tmp_path_factory):
    """The issue's case: a sweep over train.lr and seeds, run with `fedshift run`."""
    out = tmp_path_factory.mktemp("lr")
    sweep = ["train.rounds=1", "sweep.train.lr=[0.01,0.1]", "sweep.seed=[0,1]"]
    assert main(["run", *TOY, *sweep, "--out", str(out), "--quiet"]) == 0
    return out / "t"


@pytest.mark.same_kernels  # the table's arithmetic and the test's, on the same recorded summaries
def test_report_of_an_lr_sweep_has_one_row_per_lr_with_consistent_numbers(lr_sweep, tmp_path):
    runs = load_runs([lr_sweep])
    assert len(runs) == 4
    md = build_report([lr_sweep], tmp_path / "rep")["md"].read_text()
    clients = runs[0]["clients"]
    rows = [x for x in md.splitlines() if x.startswith("| fedavg |")]
    assert len(rows) == 2 * (1 + len(runs[0].get("metrics", {}))) + 2, rows  # + comm table
    for lr in (0.01, 0.1):
        mine = [s for s in runs if _stored(s)["train"]["lr"] == lr]
        cells = _cells(md, f"| fedavg | train.lr={lr} |")
        # seeds, per-client columns and avg ± std all come from this lr's two runs
        assert cells[2] == "2"
        for i, c in enumerate(clients):
            want = statistics.mean(s["test_per_client"][c] for s in mine)
            assert float(cells[3 + i]) == pytest.approx(100 * want, abs=0.006)
        means = [s["test_mean"] for s in mine]
        avg, _, std = cells[3 + len(clients)].partition(" ± ")
        assert float(avg) == pytest.approx(100 * statistics.mean(means), abs=0.006)
        assert float(std) == pytest.approx(100 * statistics.stdev(means), abs=0.006)
    assert not [x for x in md.splitlines() if x.startswith("| fedavg | base |")]
    rows = [r for r in csv_flows(tmp_path / "rep/report.csv")]
    assert sorted(set(rows)) == ["train.lr=0.01", "train.lr=0.1"]


def _stored(s: dict) -> dict:
    return yaml.safe_load((Path(s["_dir"]) / "config.yaml").read_text())


def csv_flows(path: Path) -> list[str]:
    import csv

    with open(path) as f:
        return [r["flow"] for r in csv.DictReader(f)]


def test_every_table_groups_the_lr_sweep_the_same_way(lr_sweep, tmp_path, capsys):
    """flows/comm tables, the printed mean-over-seeds table and the rounds protocol: one
    row per learning rate; summaries written without their config (older fedshift) are
    grouped from the config.yaml next to them."""
    from fedshift.eval.tables import comm_rows, seeds_table
    from fedshift.protocols.rounds import rounds_to_threshold

    runs = load_runs([lr_sweep])
    header, rows = flows_rows(runs)
    assert [(r[1], r[2]) for r in rows] == [("train.lr=0.01", "2"), ("train.lr=0.1", "2")]
    assert [r[1] for r in comm_rows(runs)[1]] == ["train.lr=0.01", "train.lr=0.1"]
    table = seeds_table(runs)
    assert "fedavg train.lr=0.01 | 2" in table and "fedavg train.lr=0.1  | 2" in table
    res = rounds_to_threshold([lr_sweep], "0.05", out=tmp_path / "r", progress=False)
    assert sorted((r["flow"], len(r["seeds"])) for r in res.data["rows"]) == [
        ("train.lr=0.01", 2),
        ("train.lr=0.1", 2),
    ]
    old = tmp_path / "old"
    shutil.copytree(lr_sweep, old)
    for p in old.rglob("summary.json"):
        s = json.loads(p.read_text())
        del s["config"]
        p.write_text(json.dumps(s))
    assert flows_rows(load_runs([old]))[1] == rows


def test_report_refuses_the_same_config_and_seed_twice(lr_sweep, tmp_path):
    root = tmp_path / "dup"
    shutil.copytree(lr_sweep, root)
    first = sorted(p for p in root.iterdir() if p.is_dir())[0]
    twin = first.with_name(first.name + "-2")
    shutil.copytree(first, twin)
    with pytest.raises(FedshiftError, match="same config and seed run twice") as e:
        build_report([root], tmp_path / "rep")
    assert str(first) in str(e.value) and str(twin) in str(e.value)


# ------------------------------------------------------------------ 2. run directories
def test_run_directories_name_what_sets_the_run_apart(lr_sweep):
    names = sorted(p.name for p in lr_sweep.iterdir() if p.is_dir())
    assert len(names) == 4 and all("-seed" in n for n in names)
    fast = [n for n in names if "train.lr=0.1-" in n]
    assert len(fast) == 2 and all(n.startswith("fedavg-toyshift-") for n in names)
    # the runs of one config share the digest, whatever the seed; another config does not
    digests = {n.rsplit("-", 1)[1] for n in fast}
    others = {n.rsplit("-", 1)[1] for n in names if n not in fast}
    assert len(digests) == 1 and len(others) == 1 and digests != others
    from fedshift.runtime.rundir.results import run_dir_name

    rdn = run_dir_name(toy_cfg("augment=[fedrdn]"))
    assert "-augment=fedrdn-" in rdn and rdn != run_dir_name(toy_cfg())
    # an algorithm's own augment (fedrdn = FedAvg + the fedrdn augment) is no change
    assert "augment" not in run_dir_name(toy_cfg("algorithm.name=fedrdn"))
    # train.rounds is left out: a run extended with --resume keeps its directory
    assert run_dir_name(toy_cfg(rounds=2)) == run_dir_name(toy_cfg(rounds=9))
    # suite cells keep their names: <algorithm>-<dataset>-seed<k>-<config digest>
    # (fedrdn_table1's first cell: its digest at 199aa57, committed in results/)
    suite = ROOT / "configs/suites/fedrdn_table1.yaml"
    cell = plan(suite)[0]
    assert cell.run_dir.name == f"fedavg-digits-seed0-{config_digest(cell.cfg)}"
    assert cell.run_dir.name == "fedavg-digits-seed0-4fe1b2d40c"


def test_an_existing_run_directory_is_compared_with_the_new_config(tmp_path, capsys):
    over = [*TOY, "train.rounds=1", "--out", str(tmp_path), "--quiet"]
    assert main(["run", *over]) == 0
    [run_dir] = (tmp_path / "t").iterdir()
    capsys.readouterr()
    assert main(["run", *over]) == 2
    err = capsys.readouterr().err
    assert f"{run_dir} holds a finished run with the same config." in err
    assert "run there before" not in err
    assert main(["run", *over, "train.rounds=3"]) == 2
    err = capsys.readouterr().err
    assert "same config but train.rounds (train.rounds: 1 -> 3" in err
    assert f"fedshift run --resume {run_dir} train.rounds=3" in err
    assert main(["run", *over, "checkpoint.every=1"]) == 2
    err = capsys.readouterr().err
    assert "keys that change no number (checkpoint.every: 10 -> 1)" in err
    # a config.yaml that no longer matches the directory's name (edited, or written by a
    # fedshift whose defaults differed): the differing keys, both values
    stored = yaml.safe_load((run_dir / "config.yaml").read_text())
    stored["train"]["lr"] = 0.5
    (run_dir / "config.yaml").write_text(yaml.safe_dump(stored))
    assert main(["run", *over]) == 2
    err = capsys.readouterr().err
    assert "with another config, which differs from this one in train.lr: 0.5 -> 0.01" in err


def test_the_api_names_and_claims_run_directories_as_the_cli(tmp_path):
    cfg = {"dataset": {"name": "toyshift"}, "model": {"name": "lenet5"}, "name": "t"}
    over = ["train.rounds=1", "train.batch_size=16", "train.lr=0.05"]
    first = fedshift.run(cfg, over, out=tmp_path)
    assert "train.lr=0.05" in first.run_dir.name
    with pytest.raises(RunDirExists, match="exists='overwrite'") as e:
        fedshift.run(cfg, over, out=tmp_path)
    assert "with the same config" in str(e.value) and "exists='new'" in str(e.value)
    assert [p.name for p in (tmp_path / "t").iterdir()] == [first.run_dir.name]
    again = fedshift.run(cfg, over, out=tmp_path, exists="new")
    assert again.run_dir.name == f"{first.run_dir.name}-2"
    (first.run_dir / "stale.txt").write_text("old")
    redone = fedshift.run(cfg, over, out=tmp_path, exists="overwrite")
    assert redone.run_dir == first.run_dir and not (first.run_dir / "stale.txt").exists()
    assert redone.summary["test_mean"] == first.summary["test_mean"]
    from fedshift.runtime.rundir.results import run_dir_name

    assert first.run_dir.name == run_dir_name(toy_cfg("train.lr=0.05"))  # fedshift run's


# ------------------------------------------------------------------ 3. one override rule
SWEPT = """\
name: t
dataset: {name: toyshift}
model: {name: lenet5}
train: {rounds: 1, batch_size: 16}
sweep:
  algorithm.name: [fedavg, fedbn]
"""


@pytest.fixture
def swept(tmp_path) -> Path:
    path = tmp_path / "swept.yaml"
    path.write_text(SWEPT)
    return path


def test_an_explicit_value_replaces_the_keys_sweep_everywhere(swept, tmp_path, capsys):
    raw = load_config(swept, ["algorithm.name=fedbn"])
    assert "sweep" not in raw and raw["algorithm"] == {"name": "fedbn"}
    demo = expand_sweep(load_config("demo", ["algorithm.name=fedbn"]))
    assert [c["algorithm"]["name"] for c in demo] == ["fedbn"]
    # other grid keys stay; a section holds its keys
    both = load_config(swept, ["algorithm.name=fedbn", "sweep.seed=[0,1]"])
    assert len(expand_sweep(both)) == 2
    assert "sweep" not in load_config(swept, ["algorithm={name: fedprox, mu: 0.1}"])
    # per-cell mappings: the key gives way in each, cells that become one are one
    cells = load_config(None, ["sweep.cell=[{algorithm.name: fedbn, model.bn: true}, "
                               "{algorithm.name: harmofl}]", "algorithm.name=fedavg"])  # fmt: skip
    assert cells["sweep"]["cell"] == [
        {"model.bn": True, "algorithm.name": "fedavg"},
        {"algorithm.name": "fedavg"},
    ]
    # fedshift run: FedBN only
    assert main(["run", "-c", str(swept), "algorithm.name=fedbn", "--out", str(tmp_path / "r"),
                 "--quiet"]) == 0  # fmt: skip
    assert [p.name.split("-")[0] for p in (tmp_path / "r/t").iterdir()] == ["fedbn"]
    # fedshift bench: the suite's FedBN cell, same digest (its cache stays valid)
    [cell] = plan(swept, ["algorithm.name=fedbn"], out=str(tmp_path / "b"))
    assert cell.digest == next(c.digest for c in plan(swept, out=str(tmp_path / "b"))
                               if c.cfg.algorithm.name == "fedbn")  # fmt: skip
    # fedshift.run: runs the one cell
    res = fedshift.run(swept, ["algorithm.name=fedbn"], out=tmp_path / "api")
    assert res.summary["algorithm"] == "fedbn"
    capsys.readouterr()


def test_flower_commands_take_the_override_of_a_swept_key(swept, tmp_path, capsys):
    pytest.importorskip("flwr")
    out = ["--out", str(tmp_path / "f"), "--quiet", "--engine", "in-process"]
    assert main(["flower", "simulate", "-c", str(swept), "algorithm.name=fedbn", *out]) == 0
    assert [p.name.split("-")[0] for p in (tmp_path / "f/t").iterdir()] == ["fedbn"]
    assert main(["flower", "simulate", "-c", str(swept), *out]) == 2
    err = capsys.readouterr().err
    assert "2 runs over algorithm.name" in err and "give each swept key one value" in err
    app = tmp_path / "app"
    assert main(["flower", "app", str(app), "-c", str(swept), "algorithm.name=fedbn"]) == 0
    doc = _toml(app / "pyproject.toml")
    assert "algorithm:\n  name: fedbn" in doc["tool"]["flwr"]["app"]["config"]["fedshift-config"]


def _toml(path: Path) -> dict:
    import tomllib

    return tomllib.loads(path.read_text())


def test_flower_run_on_fewer_supernodes_than_clients_is_refused_before_round_1(tmp_path):
    """Flower's default local simulation has 2 SuperNodes; the config has 3 clients."""
    pytest.importorskip("flwr")
    from fedshift.flower.inprocess import InProcessGrid
    from fedshift.flower.node import build_client_app
    from fedshift.flower.server import FlowerOptions, FlowerServer

    cfg = toy_cfg(rounds=1)
    server = FlowerServer(cfg, tmp_path / "r", FlowerOptions(), progress=False)
    with pytest.raises(FedshiftError, match=r"2 SuperNode\(s\) connected, but the config's "
                       r"federation has 3 clients .*client2 would have none") as e:  # fmt: skip
        server.run(InProcessGrid(build_client_app(), 2))
    assert "Run it with 3 SuperNodes" in str(e.value)
    assert not (tmp_path / "r/metrics.jsonl").exists()  # nothing trained
    # more SuperNodes than clients: the node that has no client says so, with both numbers
    four = FlowerServer(cfg, tmp_path / "s", FlowerOptions(nodes=4), progress=False)
    with pytest.raises(FedshiftError, match=r"partition-id=3 of 4 SuperNodes: the config's "
                       r"federation has 3 clients"):  # fmt: skip
        four.run(InProcessGrid(build_client_app(), 4))


def test_flower_app_waits_for_one_supernode_per_client_of_the_config(tmp_path, capsys):
    """The app's run config asks for the config's 3 clients; another --nodes is refused
    (tests/flower/test_flower_app.py: the app's simulation command, folders, Flower config)."""
    pytest.importorskip("flwr")
    app = tmp_path / "app"
    assert main(["flower", "app", str(app), *TOY, "train.rounds=1", "--out", str(tmp_path)]) == 0
    doc = _toml(app / "pyproject.toml")
    assert "federations" not in doc["tool"]["flwr"]
    assert doc["tool"]["flwr"]["app"]["config"]["nodes"] == 3
    assert main(["flower", "app", str(tmp_path / "b"), *TOY, "--nodes", "2"]) == 2
    assert "--nodes 2: the config's federation has 3 clients" in capsys.readouterr().err


def test_keys_added_later_leave_the_digest_of_configs_that_do_not_use_them():
    from fedshift.core.identity import LATER_DEFAULTS, number_config

    cfg = toy_cfg().to_dict()
    stripped = number_config(cfg)
    assert "agc" not in stripped["train"] and "norm" not in stripped["model"]
    assert "ws_gamma" not in stripped["model"]  # only acts with conv=ws
    # a config written before the keys existed has the same number config
    old = {**cfg, "train": {k: v for k, v in cfg["train"].items() if not k.startswith("agc")},
           "model": {k: v for k, v in cfg["model"].items()
                     if k not in ("norm", "conv", "ws_gamma")}}  # fmt: skip
    assert number_config(old) == stripped
    # a config that uses them keeps them, ws_gamma with conv=ws
    won = toy_cfg("model.norm=none", "model.conv=ws", "train.agc=0.5").to_dict()
    kept = number_config(won)
    assert kept["train"]["agc"] == 0.5 and kept["model"]["conv"] == "ws"
    assert "ws_gamma" in kept["model"] and kept["model"]["norm"] == "none"
    assert set(LATER_DEFAULTS) >= {"train.agc", "model.norm", "model.conv"}


def test_partition_rounding_keeps_the_digest_of_the_rule_before_it_existed():
    """Before ``partition.rounding`` existed, domains were dealt by the rule now called
    ``first`` (issue 50: fpl_digits / fedheal_digits): that value is left out of the digest,
    the new default ``largest`` is not (the two deal other counts where shares are not
    whole, so a committed cell must not be taken for the other rule's)."""
    from fedshift.core.identity import number_digest

    before = {"seed": 0, "partition": {"name": "domains", "clients": 10, "lam": 0.0}}
    first = {**before, "partition": {**before["partition"], "rounding": "first"}}
    largest = {**before, "partition": {**before["partition"], "rounding": "largest"}}
    assert number_digest(first) == number_digest(before)
    assert number_digest(largest) != number_digest(before)
