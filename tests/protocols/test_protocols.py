"""The evaluation protocols (``fedshift protocol ...``): cross-site matrices, leave-one-client-
out, one-key sweeps, rounds to a threshold and t-SNE, on tiny toyshift / toyseg runs."""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import shutil
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import yaml
from conftest import SEG

from fedshift.catalog import resolve
from fedshift.cli.protocol import add_parser
from fedshift.core.config import dump_config, load_config
from fedshift.core.errors import ConfigError, FedshiftError
from fedshift.protocols import (
    SuiteOptions,
    cross_site,
    features_of,
    local_models,
    loco,
    loco_table,
    parse_thresholds,
    parse_values,
    rounds_to_threshold,
    subsample,
    sweep,
    tsne,
)
from fedshift.runtime.simulation import (
    Simulation,
    load_finished,
    run_experiment,
    saved_config,
)
from fedshift.testing import canon

TOY = ["dataset.name=toyshift", "model.name=lenet5", "train.batch_size=16", "name=test"]


def cfg_of(base: list[str], *over: str, rounds: int = 2):
    return resolve(load_config(None, [*base, f"train.rounds={rounds}", *over]))


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("runs")
    out = {}
    for name, cfg in (
        ("local", cfg_of(TOY, "algorithm.name=local")),
        ("fedrdn", cfg_of(TOY, "algorithm.name=fedrdn")),
    ):
        out[name] = run_experiment(cfg, run_dir=root / name, progress=False).run_dir
    return out


@pytest.fixture(scope="module")
def seg_run(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("seg")
    cfg = cfg_of(SEG, "algorithm.name=fedbn")
    return run_experiment(cfg, run_dir=root / "fedbn_seg", progress=False).run_dir


def round_rows(run_dir: Path, which: str = "selected") -> dict[str, dict]:
    """The metric rows of the run's selected round (summary's best_round) or last round."""
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    if which == "last":
        rnd = max(r["round"] for r in rows)
    else:
        rnd = json.loads((run_dir / "summary.json").read_text())["best_round"]
    return {r["client"]: r for r in rows if r["round"] == rnd}


# ============================================================================ cross-site
@pytest.mark.parametrize("which", ["selected", "last"])
@pytest.mark.parametrize("name, kind", [("local", "personal"), ("fedbn_seg", "personal")])
def test_cross_site_diagonal_is_the_runs_own_score(request, tmp_path, name, kind, which):
    """The diagonal is each client's own score at the round the weights come from: the
    selected round (default; what the run's tables report) or the last round."""
    run = request.getfixturevalue("seg_run") if name == "fedbn_seg" else None
    run = run or request.getfixturevalue("runs")[name]
    res = cross_site(run, out=tmp_path / "cs", progress=False, weights=which)
    rows = round_rows(run, which)
    clients = res.data["clients"]
    assert res.data["kind"] == kind and len(clients) == 3
    metrics = ("dice", "dice_all", "loss") if name == "fedbn_seg" else ("acc", "loss")
    assert set(res.data["matrices"]) == set(metrics)
    for m in metrics:
        mat = res.data["matrices"][m]
        for i, c in enumerate(clients):
            assert mat[i][i] == pytest.approx(rows[c][kind][f"test_{m}"], rel=1e-6, abs=1e-9)
    # personal models differ: some off-diagonal cell differs from its row's diagonal
    loss = res.data["matrices"]["loss"]
    assert any(loss[i][j] != loss[i][i] for i in range(3) for j in range(3) if i != j)


def test_cross_site_off_diagonal_cell_by_hand(runs, tmp_path):
    res = cross_site(runs["local"], out=tmp_path / "cs", progress=False)
    sim = load_finished(runs["local"])
    sim.model.load_state_dict(sim.weights_for("client0"))
    sim.model.eval()
    test = sim.fed.client("client1").test
    with torch.no_grad():
        logits = sim.model((test.x - 0.5) / 0.5)  # input.mean/std 0.5 (the run's default)
    acc = (logits.argmax(1) == test.y).double().mean().item()
    loss = F.cross_entropy(logits, test.y).item()
    assert res.data["matrices"]["acc"][0][1] == pytest.approx(acc)
    assert res.data["matrices"]["loss"][0][1] == pytest.approx(loss, rel=1e-5)
    st = res.data["stats"]["acc"]
    mat = res.data["matrices"]["acc"]
    off = [mat[i][j] for i in range(3) for j in range(3) if i != j]
    assert st["off_diagonal_mean"] == pytest.approx(sum(off) / 6)
    assert st["row_off_diagonal_mean"][0] == pytest.approx((mat[0][1] + mat[0][2]) / 2)
    assert st["row_mean"][2] == pytest.approx(sum(mat[2]) / 3)
    # files: the table (diagonal in bold), the numbers, the heatmap
    md = res.files["md"].read_text()
    assert f"**{100 * mat[1][1]:.2f}**" in md and "off-diag mean" in md
    assert json.loads(res.files["json"].read_text())["matrices"]["acc"] == mat
    assert res.files["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cross_site_fedrdn_pipeline_data_vs_model(runs, tmp_path):
    data = cross_site(runs["fedrdn"], pipeline="data", out=tmp_path / "d", progress=False)
    model = cross_site(runs["fedrdn"], pipeline="model", out=tmp_path / "m", progress=False)
    dl, ml = data.data["matrices"]["loss"], model.data["matrices"]["loss"]
    rows = round_rows(runs["fedrdn"])
    for i, c in enumerate(data.data["clients"]):
        # one global model: with each site's own statistics every row is the same
        assert dl[i] == dl[0]
        assert dl[i][i] == ml[i][i] == pytest.approx(rows[c]["global"]["test_loss"], rel=1e-6)
    assert ml[0][1] != dl[0][1] and ml[2][0] != dl[2][0]
    # one cell of the "model" matrix by hand: client1's data with client0's statistics
    sim = load_finished(runs["fedrdn"])
    st = sim.states["client0"]["aug/fedrdn"]
    sim.model.load_state_dict(sim.weights_for("client0"))
    sim.model.eval()
    test = sim.fed.client("client1").test
    with torch.no_grad():
        x = (test.x - st["mean"].view(1, -1, 1, 1)) / st["std"].view(1, -1, 1, 1)
        loss = F.cross_entropy(sim.model(x), test.y).item()
    assert ml[0][1] == pytest.approx(loss, rel=1e-5)


def test_cross_site_local_models_of_a_federated_run(runs, tmp_path):
    """FedRDN Table 3 evaluates each client's *local* model (after its own local training)
    on the other sites, each site's data normalised with its own statistics (Eq. 8)."""
    run = runs["fedrdn"]
    res = cross_site(run, kind="local", out=tmp_path / "l", progress=False)
    glob = cross_site(run, kind="global", out=tmp_path / "g", progress=False)
    assert res.data["kind"] == "local" and res.data["pipeline"] == "data"
    ll, gl = res.data["matrices"]["loss"], glob.data["matrices"]["loss"]
    # one global model gives identical rows; local models differ from it and from each other
    assert all(row == gl[0] for row in gl)
    assert ll[0] != gl[0] and ll[0] != ll[1] and ll[1] != ll[2]
    # row 0 by hand: client0's local update of round T + 1 from the selected round's
    # broadcast, driven through the round loop (the protocol uses SavedRun.local_update)
    saved = load_finished(run)
    sim = Simulation(saved_config(run), run, progress=False)
    sim.load_checkpoint()
    sim.server, sim.states = copy.deepcopy(saved.server), copy.deepcopy(saved.states)
    with torch.enable_grad():
        sim.client_round(saved.round + 1, "client0")
    sim.model.eval()
    st = sim.states["client1"]["aug/fedrdn"]
    test = sim.fed.client("client1").test
    with torch.no_grad():
        x = (test.x - st["mean"].view(1, -1, 1, 1)) / st["std"].view(1, -1, 1, 1)
        loss = F.cross_entropy(sim.model(x), test.y).item()
    assert ll[0][1] == pytest.approx(loss, rel=1e-5)
    # deterministic, and the run itself is untouched (a second call gives the same matrix)
    again = cross_site(run, kind="local", out=tmp_path / "l2", progress=False)
    assert again.data["matrices"]["loss"] == ll
    before = canon((saved.server, saved.states))
    local_models(saved)
    assert canon((saved.server, saved.states)) == before  # the saved run is unchanged
    assert "local update" in res.text and "FedRDN Table 3" in res.text


def test_cross_site_errors(runs, tmp_path):
    with pytest.raises(FedshiftError, match="does not exist"):
        cross_site(tmp_path / "nowhere", out=tmp_path / "o")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FedshiftError, match="not a finished fedshift run"):
        cross_site(tmp_path / "empty", out=tmp_path / "o")
    killed = tmp_path / "killed"
    shutil.copytree(runs["local"], killed)
    (killed / "summary.json").unlink()
    with pytest.raises(FedshiftError, match="--resume"):
        cross_site(killed, out=tmp_path / "o")
    with pytest.raises(FedshiftError, match="or --kind local"):
        cross_site(runs["fedrdn"], kind="personal", out=tmp_path / "o")
    with pytest.raises(FedshiftError, match="no personal model"):
        cross_site(runs["fedrdn"], kind="personal", out=tmp_path / "o")
    with pytest.raises(FedshiftError, match="--pipeline"):
        cross_site(runs["local"], pipeline="server", out=tmp_path / "o")
    with pytest.raises(FedshiftError, match="--split"):
        cross_site(runs["local"], split="holdout", out=tmp_path / "o")


# ============================================================================ loco
def write_config(path: Path, **extra) -> Path:
    base = {
        "name": "proto",
        "dataset": {"name": "toyshift", "train_size": 30},
        "model": {"name": "lenet5"},
        "train": {"rounds": 2, "batch_size": 16},
        "sweep": {"seed": [0, 1]},
    }
    path.write_text(yaml.safe_dump({**base, **extra}))
    return path


@pytest.mark.same_kernels  # the table's arithmetic and the test's, on the same recorded summaries
def test_loco_one_cell_per_client_table_and_cache(tmp_path):
    cfg = write_config(tmp_path / "c.yaml")
    opts = SuiteOptions(cfg, (), 1, 1, tmp_path / "lo", str(tmp_path / "r"), progress=False)
    res = loco(opts)
    manifest = json.loads((tmp_path / "r/proto/bench.json").read_text())
    assert len(manifest) == 6 and {m["status"] for m in manifest} == {"ran"}
    summaries = [json.loads((Path(m["run_dir"]) / "summary.json").read_text()) for m in manifest]
    held = sorted((tuple(s["holdout"]), s["seed"]) for s in summaries)
    assert held == [((c,), k) for c in ("client0", "client1", "client2") for k in (0, 1)]
    (row,) = res.data["rows"]
    assert (row["algorithm"], row["flow"], row["seeds"]) == ("fedavg", "base", [0, 1])
    by = {(s["holdout"][0], s["seed"]): s["target_test_mean"] for s in summaries}
    for c in ("client0", "client1", "client2"):
        t = row["targets"][c]
        assert t["per_seed"] == {0: by[(c, 0)], 1: by[(c, 1)]}
        assert t["mean"] == pytest.approx((by[(c, 0)] + by[(c, 1)]) / 2)
        assert f"{100 * t['mean']:.2f}" in res.text
    avg = [sum(by[(c, k)] for c in ("client0", "client1", "client2")) / 3 for k in (0, 1)]
    assert row["average"]["per_seed"] == {0: pytest.approx(avg[0]), 1: pytest.approx(avg[1])}
    sd = abs(avg[0] - avg[1]) / 2**0.5  # sample std of two values
    assert row["average"]["std"] == pytest.approx(sd)
    assert f"{100 * (avg[0] + avg[1]) / 2:.2f} ± {100 * sd:.2f}" in res.text
    assert "over the source clients" in res.text
    # the suite written into the out folder, and a second call runs nothing
    suite = yaml.safe_load(res.files["suite"].read_text())
    assert suite["sweep"]["federation.holdout"] == [["client0"], ["client1"], ["client2"]]
    mtimes = [(Path(m["run_dir"]) / "summary.json").stat().st_mtime_ns for m in manifest]
    again = loco(opts)
    manifest2 = json.loads((tmp_path / "r/proto/bench.json").read_text())
    assert {m["status"] for m in manifest2} == {"cached"}
    assert [(Path(m["run_dir"]) / "summary.json").stat().st_mtime_ns for m in manifest] == mtimes
    assert again.data["rows"] == res.data["rows"]
    assert again.text == res.text


def _cell(algo, target, seed, value, setting=""):
    return {
        "algorithm": algo,
        "algorithm_config": {"name": algo},
        "augment": [],
        "implied": [],
        "seed": seed,
        "holdout": [target],
        "target_test_mean": value,
        "test_mean": 0.5,
        "best_round": 1,
        "run_dir": f"{algo}-{target}-{seed}",
        "metrics": {},
        "_setting": setting,
    }


def test_loco_table_by_hand_with_a_setting_column():
    cells = [
        _cell("fedavg", "a", 0, 0.5, "train.lr=0.1"),
        _cell("fedavg", "b", 0, 0.7, "train.lr=0.1"),
        _cell("fedavg", "a", 0, 0.2, "train.lr=0.2"),
        _cell("fedavg", "b", 0, 0.4, "train.lr=0.2"),
        _cell("fedavg", "a", 1, 0.3, "train.lr=0.2"),  # seed 1 lacks target b: not averaged
    ]
    text, data = loco_table(cells, ["a", "b"])
    r1, r2 = data["rows"]
    assert (r1["setting"], r2["setting"]) == ("train.lr=0.1", "train.lr=0.2")
    assert r1["flow"] == r2["flow"] == "base"  # the setting parts the rows, not a digest
    assert r1["average"]["mean"] == pytest.approx(0.6)
    assert r2["targets"]["a"]["mean"] == pytest.approx(0.25)
    assert r2["average"]["per_seed"] == {0: pytest.approx(0.3)}
    assert "| setting" in text and "60.00 ± n/a" in text and "25.00" in text
    with pytest.raises(FedshiftError, match="not a leave-one-client-out cell"):
        loco_table([{**cells[0], "holdout": []}], ["a", "b"])


def test_a_cell_list_is_not_a_setting_column():
    """A sweep's ``cell`` list sets different keys per run (the flow label says them): it is
    no ``setting`` key, whose value would be the list's placeholder."""
    from fedshift.protocols.common import setting_keys

    raw = {"sweep": {"cell": [{"algorithm.name": "fedavg"}], "train.lr": [0.1], "seed": [0]}}
    assert setting_keys(raw) == ["train.lr"]


def test_loco_table_paired_t_test_against_fedavg():
    """Each row's per-seed average over targets is tested against FedAvg's, paired by seed."""
    from scipy.stats import ttest_rel

    vals = {"fedavg": [(0.5, 0.7), (0.4, 0.6), (0.6, 0.6)], "fedfa": [(0.6, 0.7), (0.5, 0.8),
            (0.6, 0.7)]}  # fmt: skip
    cells = [
        _cell(algo, t, seed, v[k], "")
        for algo, per_seed in vals.items()
        for seed, v in enumerate(per_seed)
        for k, t in enumerate(("a", "b"))
    ]
    text, data = loco_table(cells, ["a", "b"])
    fedavg, fedfa = data["rows"]
    avg = {a: [sum(v) / 2 for v in per_seed] for a, per_seed in vals.items()}
    want = ttest_rel(avg["fedfa"], avg["fedavg"]).pvalue
    assert fedfa["p_vs_reference"] == pytest.approx(want) and fedavg["p_vs_reference"] is None
    assert data["reference"] == "fedavg" and "p vs fedavg" in text and f"{want:.3f}" in text


def test_loco_table_compares_each_setting_with_fedavg_at_that_setting():
    """Clients swept (8, 20, 80 per federation): rows in number order, each p against
    FedAvg's row of the same setting."""
    from scipy.stats import ttest_rel

    vals = {"8": ([0.5, 0.4, 0.6], [0.6, 0.6, 0.7]), "20": ([0.3, 0.2, 0.35], [0.5, 0.45, 0.4]),
            "80": ([0.1, 0.15, 0.1], [0.3, 0.2, 0.2])}  # fmt: skip
    cells = [
        {**_cell(algo, t, seed, v, f"partition.clients={n}"), "run_dir": f"{algo}{n}{t}{seed}"}
        for n, pair in vals.items()
        for algo, per_seed in zip(("fedavg", "fedfa"), pair, strict=True)
        for seed, v in enumerate(per_seed)
        for t in ("a", "b")
    ]
    text, data = loco_table(cells, ["a", "b"])
    rows = [(r["algorithm"], r["setting"]) for r in data["rows"]]
    assert rows == [(a, f"partition.clients={n}") for a in ("fedavg", "fedfa") for n in vals]
    for r in data["rows"]:
        fedavg, fedfa = vals[r["setting"].split("=")[1]]
        want = None if r["algorithm"] == "fedavg" else ttest_rel(fedfa, fedavg).pvalue
        assert r["p_vs_reference"] == (None if want is None else pytest.approx(want))
    assert "p vs fedavg (same setting, else the first)" in text


def test_loco_errors_before_anything_runs(tmp_path):
    runs_out = tmp_path / "r"
    kw = dict(workers=1, threads=1, out=tmp_path / "lo", runs_out=str(runs_out), progress=False)

    def run(name: str, override: str) -> None:
        loco(SuiteOptions(write_config(tmp_path / name), (override,), **kw))

    with pytest.raises(ConfigError, match="one global model"):
        run("a.yaml", "algorithm.name=fedbn")
    with pytest.raises(ConfigError, match="holdout' is set"):
        run("b.yaml", "federation.holdout=[client0]")
    with pytest.raises(ConfigError, match="already varies"):
        run("c.yaml", "sweep.federation.holdout=[[client1]]")
    assert not runs_out.exists()


# ============================================================================ sweep
def test_parse_values():
    assert parse_values("0.1,0.25,0.5,1") == [0.1, 0.25, 0.5, 1]
    assert parse_values(" true , sgd ,null") == [True, "sgd", None]
    for bad, match in (
        ("1,,2", "none empty"),
        ("", "none empty"),
        ("[1", "does not parse"),
        ("{a: 1}", "not a scalar"),
        ("1,2,1", "twice"),
    ):
        with pytest.raises(ConfigError, match=match):
            parse_values(bad)


@pytest.mark.same_kernels  # the table's arithmetic and the test's, on the same recorded summaries
def test_sweep_numbers_equal_the_summaries(tmp_path):
    cfg = write_config(tmp_path / "c.yaml")
    opts = SuiteOptions(cfg, (), 1, 1, tmp_path / "sw", str(tmp_path / "r"), progress=False)
    res = sweep(opts, "federation.data_fraction", "0.5,1")
    manifest = json.loads((tmp_path / "r/proto/bench.json").read_text())
    summaries = [json.loads((Path(m["run_dir"]) / "summary.json").read_text()) for m in manifest]
    assert len(summaries) == 4
    (row,) = res.data["rows"]
    for label, frac in (("0.5", 0.5), ("1", 1.0)):
        want = {s["seed"]: s["test_mean"] for s in summaries if s["data_fraction"] == frac}
        assert len(want) == 2
        pt = row["points"][label]
        assert pt["per_seed"] == want
        m = (want[0] + want[1]) / 2
        sd = abs(want[0] - want[1]) / 2**0.5
        assert (pt["mean"], pt["std"]) == (pytest.approx(m), pytest.approx(sd))
        assert f"{100 * m:.2f} ± {100 * sd:.2f}" in res.text
    assert "federation.data_fraction=0.5" in res.text
    assert res.files["png"].read_bytes()[:4] == b"\x89PNG"
    assert yaml.safe_load(res.files["suite"].read_text())["sweep"] == {
        "seed": [0, 1],
        "federation.data_fraction": [0.5, 1],
    }


def test_sweep_errors_before_anything_runs(tmp_path):
    cfg = write_config(tmp_path / "c.yaml")
    runs_out = tmp_path / "r"
    opts = SuiteOptions(cfg, (), 1, 1, tmp_path / "sw", str(runs_out), progress=False)
    with pytest.raises(ConfigError, match="'train.local_epoch' does not exist.*local_epochs"):
        sweep(opts, "train.local_epoch", "1,2")
    with pytest.raises(ConfigError, match="'algorithm.mu' does not exist"):
        sweep(opts, "algorithm.mu", "0.1,0.2")  # fedavg has no mu
    with pytest.raises(ConfigError, match="already varies"):
        swept = dataclasses.replace(opts, overrides=("sweep.train.lr=[0.01,0.02]",))
        sweep(swept, "train.lr", "0.1,0.2")
    with pytest.raises(ConfigError, match="seeds are what"):
        sweep(opts, "seed", "0,1")
    with pytest.raises(ConfigError, match="does not parse"):
        sweep(opts, "train.local_epochs", "1,[2")
    with pytest.raises(ConfigError, match="train.local_epochs"):
        sweep(opts, "train.local_epochs", "1,two")  # resolve rejects the type
    assert not runs_out.exists()


# ============================================================================ rounds
def fake_run(root: Path, name: str, seed: int, clients_key: int | None, means: dict) -> Path:
    """A finished run written by hand: ``means`` = round -> per-client global test_acc."""
    d = root / name
    d.mkdir(parents=True)
    over = ["algorithm.name=fedavg", f"seed={seed}"]
    if clients_key is not None:
        over += ["partition.name=iid", f"partition.clients={clients_key}"]
    cfg = cfg_of(TOY, *over)
    dump_config(cfg, d / "config.yaml")
    first = next(iter(means.values()))
    names = [f"c{i}" for i in range(len(first))]
    summary = {
        "algorithm": "fedavg",
        "algorithm_config": cfg.algorithm.to_dict(),
        "augment": [],
        "implied": [],
        "seed": seed,
        "metric": "acc",
        "metric_labels": {"acc": "accuracy"},
        "evaluated_model": "global",
        "clients": names,
        # the rest of what every summary.json holds (checked when read: issue 28)
        "dataset": "toyshift", "model": "lenet5", "rounds": max(means), "best_round": max(means),
        "val_mean": 0.95, "test_mean": sum(means[max(means)]) / len(names),
        "val_per_client": dict.fromkeys(names, 0.95),
        "test_per_client": dict(zip(names, means[max(means)], strict=True)),
        "bytes_up": 0, "bytes_down": 0,
    }  # fmt: skip
    (d / "summary.json").write_text(json.dumps(summary))
    lines = []
    for rnd, accs in means.items():
        for c, a in zip(names, accs, strict=True):
            g = {"val_acc": 0.95, "test_acc": a}
            lines.append({"round": rnd, "client": c, "global": g, "personal": {"test_acc": 1.0}})
        # a held-out client that must not count (it would lift round 2 of run a to 0.6)
        lines.append({"round": rnd, "client": "out", "holdout": True, "global": {"test_acc": 1}})
    (d / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in lines) + "\n")
    return d


@pytest.fixture
def hand_runs(tmp_path) -> Path:
    root = tmp_path / "hand"
    fake_run(root, "a", 0, 4, {2: [0.5] * 4, 4: [0.6, 0.7, 0.6, 0.7], 6: [0.8, 0.9, 0.8, 0.9]})
    fake_run(root, "b", 1, 4, {2: [0.62] * 4, 4: [0.7] * 4, 6: [0.75] * 4})
    fake_run(root, "c", 0, 8, {2: [0.4] * 8, 4: [0.55] * 8, 6: [0.61] * 8})
    fake_run(root, "d", 0, None, {2: [0.9] * 3})  # partition none: 3 clients counted
    return root


def test_rounds_to_threshold_by_hand(hand_runs, tmp_path):
    res = rounds_to_threshold([hand_runs], "0.6,0.8,0.9", out=tmp_path / "ro", progress=False)
    rows = {r["by"]: r["thresholds"] for r in res.data["rows"]}
    assert list(rows) == [3, 4, 8]  # numeric order
    four = rows[4]
    assert (four["0.6"]["mean"], four["0.6"]["reached"], four["0.6"]["of"]) == (3, 2, 2)
    assert (four["0.8"]["mean"], four["0.8"]["reached"]) == (6, 1)
    assert (four["0.9"]["mean"], four["0.9"]["reached"]) == (None, 0)
    assert rows[8]["0.6"]["rounds"] == [6] and rows[8]["0.8"]["mean"] is None
    assert rows[3]["0.9"]["rounds"] == [2]
    assert "| fedavg    | base | 4                 | 2     | 3 (2/2) | 6 (1/2) | — (0/2) |" in (
        res.text
    )
    assert "≥ 60%" in res.text and "partition.clients" in res.text
    curve = next(r for r in res.data["runs"] if r["run_dir"].endswith("a"))["curve"]
    assert curve == {2: 0.5, 4: pytest.approx(0.65), 6: pytest.approx(0.85)}
    # validation split: every run is at 0.95 from its first evaluated round
    val = rounds_to_threshold([hand_runs], "0.9", split="val", out=tmp_path / "v", progress=False)
    assert all(
        r["thresholds"]["0.9"]["rounds"] == [2] * r["thresholds"]["0.9"]["of"]
        for r in val.data["rows"]
    )
    # another --by key read from each config.yaml
    by = rounds_to_threshold(
        [hand_runs / "a", hand_runs / "b"],
        "0.6",
        by="train.rounds",
        out=tmp_path / "b",
        progress=False,
    )
    assert [r["by"] for r in by.data["rows"]] == [2]
    assert json.loads(res.files["json"].read_text())["rows"][1]["thresholds"]["0.6"]["mean"] == 3


def test_rounds_errors(hand_runs, tmp_path):
    for bad, match in (
        ("0", r"outside \(0, 1\]"),
        ("1.5", "outside"),
        ("abc", "not a number"),
        ("0.5,0.5", "twice"),
        ("nan", "outside"),
    ):
        with pytest.raises(FedshiftError, match=match):
            parse_thresholds(bad)
    assert parse_thresholds("1,0.25") == [1.0, 0.25]
    kw = dict(out=tmp_path / "ro", progress=False)
    with pytest.raises(FedshiftError, match="does not exist"):
        rounds_to_threshold([tmp_path / "nowhere"], "0.5", **kw)
    (tmp_path / "empty").mkdir()
    with pytest.raises(FedshiftError, match="no finished runs"):
        rounds_to_threshold([tmp_path / "empty"], "0.5", **kw)
    with pytest.raises(FedshiftError, match="has no key 'train.nothing'"):
        rounds_to_threshold([hand_runs], "0.5", by="train.nothing", **kw)
    with pytest.raises(FedshiftError, match="choose val or test"):
        rounds_to_threshold([hand_runs], "0.5", split="train", **kw)
    with open(hand_runs / "a/metrics.jsonl", "a") as f:
        f.write("{oops\n")
    with pytest.raises(FedshiftError, match="line 16: not JSON"):
        rounds_to_threshold([hand_runs], "0.5", **kw)
    (hand_runs / "b/config.yaml").unlink()
    with pytest.raises(FedshiftError, match="no config.yaml"):
        rounds_to_threshold([hand_runs / "b"], "0.5", **kw)


# ============================================================================ t-SNE
def test_subsample():
    a = subsample(20, 5, 3)
    assert torch.equal(a, subsample(20, 5, 3)) and len(set(a.tolist())) == 5
    assert torch.equal(a, a.sort().values) and not torch.equal(a, subsample(20, 5, 4))
    assert torch.equal(subsample(4, 10, 0), torch.arange(4))


@pytest.mark.same_kernels  # two calls in one process; the perplexity from the point count
def test_tsne_writes_a_png_and_is_deterministic(runs, tmp_path):
    dirs = [runs["local"], runs["fedrdn"]]
    one = tsne(dirs, per_client=10, out=tmp_path / "t1", progress=False)
    two = tsne(dirs, per_client=10, out=tmp_path / "t2", progress=False)
    assert one.files["png"].read_bytes()[:4] == b"\x89PNG"
    for p, q in zip(one.data["panels"], two.data["panels"], strict=True):
        assert p["x"] == q["x"] and p["y"] == q["y"]
        assert p["points"] == 30 and p["client"].count("client1") == 10
        assert p["perplexity"] == pytest.approx(29 / 3)  # capped for 30 points
    assert [p["kind"] for p in one.data["panels"]] == ["personal", "global"]
    assert "silhouette" in one.files["md"].read_text()
    other = tsne(dirs[:1], per_client=10, seed=1, out=tmp_path / "t3", progress=False)
    assert other.data["panels"][0]["x"] != one.data["panels"][0]["x"]


def test_tsne_pools_spatial_feature_maps(seg_run, tmp_path):
    sim = load_finished(seg_run)
    x = sim.fed.client("client2").test.x[:3]
    got = features_of(sim, "client2", x)
    sim.model.load_state_dict(sim.weights_for("client2"))
    sim.model.eval()
    with torch.no_grad():
        fmap = sim.model.features((x - 0.5) / 0.5)
    assert fmap.dim() == 4 and got.shape == (3, fmap.shape[1])
    torch.testing.assert_close(got, fmap.mean((2, 3)).double())
    res = tsne([seg_run], per_client=3, out=tmp_path / "t", progress=False)
    assert res.data["panels"][0]["feature_dim"] == 4 and res.data["panels"][0]["points"] == 9


def test_tsne_errors(runs, tmp_path):
    kw = dict(out=tmp_path / "t", progress=False)
    with pytest.raises(FedshiftError, match="at least 2"):
        tsne([runs["local"]], per_client=1, **kw)
    with pytest.raises(FedshiftError, match="2 labels for 1 runs"):
        tsne([runs["local"]], labels=["a", "b"], **kw)
    with pytest.raises(FedshiftError, match="not a finished fedshift run"):
        tsne([tmp_path], **kw)
    with pytest.raises(FedshiftError, match="perplexity"):
        tsne([runs["local"]], perplexity=0, **kw)


# ============================================================================ the CLI
def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fedshift")
    add_parser(p.add_subparsers(dest="command", required=True))
    return p


def test_parser_defaults():
    p = parser()
    a = p.parse_args(["protocol", "cross-site", "RUN"])
    assert (a.run_dir, a.pipeline, a.split, a.kind, a.out) == (
        "RUN",
        "data",
        "test",
        None,
        "protocol-cross-site",
    )
    assert p.parse_args(["protocol", "cross-site", "RUN", "--kind", "local"]).kind == "local"
    a = p.parse_args(["protocol", "loco", "-c", "x.yaml", "train.rounds=3", "--workers", "2"])
    assert (a.config, a.overrides, a.workers, a.threads, a.out) == (
        "x.yaml",
        ["train.rounds=3"],
        2,
        None,
        "protocol-loco",
    )
    a = p.parse_args(["protocol", "sweep", "-c", "x", "--key", "k", "--values", "1,2"])
    assert (a.key, a.values, a.out, a.runs) == ("k", "1,2", "protocol-sweep", None)
    a = p.parse_args(["protocol", "rounds", "A", "B", "--thresholds", "0.5"])
    assert (a.runs, a.split, a.by, a.out) == (
        ["A", "B"],
        "test",
        "partition.clients",
        "protocol-rounds",
    )
    a = p.parse_args(["protocol", "tsne", "A", "--per-client", "20"])
    assert (a.runs, a.per_client, a.perplexity, a.seed, a.out) == (
        ["A"],
        20,
        30.0,
        0,
        "protocol-tsne",
    )
    for bad in (
        ["protocol"],
        ["protocol", "cross-site", "R", "--pipeline", "server"],
        ["protocol", "rounds", "A"],
        ["protocol", "sweep", "--key", "k"],
    ):
        with pytest.raises(SystemExit):
            p.parse_args(bad)


def test_parser_handlers_run_and_print(runs, hand_runs, tmp_path, capsys):
    p = parser()
    a = p.parse_args(
        [
            "protocol",
            "rounds",
            str(hand_runs),
            "--thresholds",
            "0.6",
            "--out",
            str(tmp_path / "ro"),
            "--quiet",
        ]
    )
    assert a.fn(a) == 0
    out = capsys.readouterr().out
    assert "3 (2/2)" in out and f"md: {tmp_path / 'ro' / 'rounds.md'}" in out
    a = p.parse_args(
        [
            "protocol",
            "cross-site",
            str(runs["local"]),
            "--pipeline",
            "model",
            "--out",
            str(tmp_path / "cs"),
            "--quiet",
        ]
    )
    assert a.fn(a) == 0
    assert "model's client's input pipeline" in capsys.readouterr().out
    a = p.parse_args(["protocol", "rounds", str(hand_runs), "--thresholds", "2"])
    with pytest.raises(FedshiftError, match="outside"):
        a.fn(a)


def test_main_reports_protocol_errors(tmp_path, capsys):
    from fedshift.cli import main

    assert main(["protocol", "rounds", str(tmp_path), "--thresholds", "0"]) == 2
    assert "outside (0, 1]" in capsys.readouterr().err


def test_sweep_over_an_algorithm_key_is_one_row():
    """Sweeping ``algorithm.rho`` puts each value in a column of the same row; the swept key
    is not part of the row's flow label (HarmoFL's Fig. 5c sweep)."""
    from fedshift.protocols.sweep import sweep_table

    def cell(rho, seed, acc):
        return {
            "algorithm": "harmofl",
            "algorithm_config": {
                "name": "harmofl",
                "rho": rho,
                "perturbation": True,
                "amplitude_norm": True,
            },  # fmt: skip
            "augment": [],
            "implied": [],
            "seed": seed,
            "test_mean": acc,
            "run_dir": f"r{rho}-{seed}",
            "metrics": {},
            "_value": str(rho),
        }

    cells = [cell(r, s, 0.5 + r / 10 + s / 100) for r in (1.0, 0.05) for s in (0, 1)]
    text, data = sweep_table(cells, "algorithm.rho", ["1.0", "0.05"])
    assert len(data["rows"]) == 1 and data["rows"][0]["flow"] == "base"
    assert data["rows"][0]["points"]["1.0"]["mean"] == pytest.approx(0.605)


def test_sweep_tests_each_flow_against_its_base_flow():
    from scipy.stats import ttest_rel

    from fedshift.protocols.sweep import sweep_table

    def cell(augment, seed, acc):
        return {"algorithm": "fedavg", "algorithm_config": {"name": "fedavg"}, "implied": [],
                "augment": augment, "seed": seed, "test_mean": acc, "run_dir": f"{seed}",
                "metrics": {}, "_value": "1"}  # fmt: skip

    base, rdn = [0.70, 0.74, 0.71], [0.75, 0.80, 0.74]
    cells = [cell([], s, a) for s, a in enumerate(base)]
    cells += [cell([{"name": "fedrdn"}], s, a) for s, a in enumerate(rdn)]
    text, data = sweep_table(cells, "train.local_epochs", ["1"])
    want = ttest_rel(rdn, base).pvalue
    got = [r for r in data["rows"] if r["flow"] != "base"][0]["points"]["1"]["p_vs_base"]
    assert got == pytest.approx(want) and f"(p={want:.3f})" in text


def test_setting_keys_of_a_cell_sweep_are_the_cells_keys():
    """A ``cell`` sweep labels rows by the keys its cells set (not by the word ``cell``,
    whose value is no config key); algorithm keys are already in the flow label."""
    from fedshift.protocols.common import setting_keys

    raw = {"sweep": {"cell": [{"algorithm.name": "fedavg"},
                              {"algorithm.name": "feddg_ga", "algorithm.base": "fedprox"}],
                     "seed": [0, 1]}}  # fmt: skip
    assert setting_keys(raw) == []
    raw["sweep"]["cell"].append({"algorithm.name": "fedavg", "train.lr": 0.1})
    assert setting_keys(raw) == ["train.lr"]
    assert setting_keys({"sweep": {"train.lr": [0.1], "seed": [0]}}) == ["train.lr"]


def test_loco_over_clients_dealt_from_domains_holds_out_whole_domains(tmp_path):
    # four clients dealt from toyshift's three domains; each domain in turn is kept whole
    # (partition.keep) and held out, the others dealt to the four clients
    cfg = write_config(
        tmp_path / "c.yaml",
        partition={"name": "domains", "clients": 4, "lam": 0},
        sweep={"seed": [0], "cell": [{"algorithm.name": "fedavg"}]},
        train={"rounds": 1, "batch_size": 16},
    )
    opts = SuiteOptions(cfg, (), 1, 1, tmp_path / "lo", str(tmp_path / "r"), progress=False)
    res = loco(opts)
    manifest = json.loads((tmp_path / "r/proto/bench.json").read_text())
    summaries = [json.loads((Path(m["run_dir"]) / "summary.json").read_text()) for m in manifest]
    domains = ["client0", "client1", "client2"]  # toyshift's domains
    assert sorted(s["holdout"][0] for s in summaries) == domains
    for s in summaries:
        (target,) = s["holdout"]
        assert s["clients"] == ["client00", "client01", "client02", "client03", target]
        assert all(s["domain_mix"][c][target] == 0 for c in s["clients"][:4])
        assert s["target_test_mean"] is not None
    assert set(res.data["rows"][0]["targets"]) == set(domains)
    # one row (the kept domain is a column like the holdout, not a row key), averaged over
    # every held-out domain
    assert len(res.data["rows"]) == 1, [r["flow"] for r in res.data["rows"]]
    assert list(res.data["rows"][0]["average"]["per_seed"]) == [0]
    with pytest.raises(ConfigError, match="mixes partition 'domains'"):
        mixed = write_config(
            tmp_path / "m.yaml",
            sweep={"seed": [0], "partition.name": ["domains", "none"]},
        )
        loco(SuiteOptions(mixed, (), 1, 1, tmp_path / "lo2", str(tmp_path / "r2"), progress=False))


def test_a_cell_lists_keys_label_only_the_cells_that_set_them():
    """A ``cell`` list that gives FedWon its model option beside a plain FedAvg: FedAvg's row
    is ``fedavg`` (not every cell's keys at its defaults), FedWon's names its three keys, and
    the gamma that only acts with ``model.conv=ws`` goes with them, not into the label."""
    from fedshift.protocols.common import (
        expand_configs,
        label_rows,
        row_key,
        setting_keys,
        with_settings,
    )

    raw = {
        "dataset": {"name": "toyshift"},
        "model": {"name": "lenet5"},
        "sweep": {
            "cell": [
                {"algorithm.name": "fedavg"},
                {"algorithm.name": "fedwon", "model.norm": "none", "model.conv": "ws",
                 "train.agc": 1.28},
                {"algorithm.name": "fedprox", "augment": [{"name": "mixstyle", "alpha": 0.3}]},
            ],
            "seed": [0, 1],
        },
    }  # fmt: skip

    def labelled() -> list[dict]:  # the sweep's runs as a protocol labels their rows
        summaries = []
        for cfg in expand_configs(raw, "test"):
            d = cfg.to_dict()
            summaries.append({"algorithm": d["algorithm"]["name"], "seed": d["seed"], "_cfg": d})
        with_settings(summaries, setting_keys(raw), raw)
        label_rows(summaries)
        return summaries

    summaries = labelled()
    by_algo = {s["algorithm"]: row_key(s) for s in summaries}
    assert by_algo["fedavg"] == ("fedavg", "base", "")
    assert by_algo["fedwon"] == ("fedwon", "base", "model.norm=none model.conv=ws train.agc=1.28")
    # a cell's augment gives some keys, the resolved entry has every default too: still
    # that cell (FedDG-ELCFS's cfsi window once labelled its row with FedWon's keys)
    assert by_algo["fedprox"] == ("fedprox", "base", "")
    assert len({row_key(s) for s in summaries}) == 3  # the seeds share a row

    # a cell that a later cell extends ({fedavg} and {fedavg, model.norm: none, ...}): each run
    # is the cell that sets the most keys it matches (fedwon_loco's two FedAvg cells once read
    # as one row, one hiding the other), and a key two cells set is listed once
    raw["sweep"]["cell"].append({"algorithm.name": "fedavg", "model.norm": "none",
                                 "model.conv": "ws"})  # fmt: skip
    assert setting_keys(raw).count("model.norm") == 1
    summaries = labelled()
    fedavg_rows = {row_key(s) for s in summaries if s["algorithm"] == "fedavg"}
    ws = ("fedavg", "base", "model.norm=none model.conv=ws")
    assert fedavg_rows == {("fedavg", "base", ""), ws}
