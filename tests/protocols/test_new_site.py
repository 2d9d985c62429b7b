"""``fedshift protocol new-site``: AdaBN against a direct computation, the k-shot draw, an
answer (not an error) for FedBN / DisTrans / FRAug, every variant in the table, ``global`` =
loco's number for the same cell, and the cells shared with loco."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import yaml
from torch import nn

from fedshift.core.errors import ConfigError
from fedshift.protocols import SuiteOptions, loco
from fedshift.protocols.new_site import adabn, new_site, select_shots
from fedshift.protocols.new_site_tables import new_site_tables, variants


def _net() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 4, 3),
        nn.BatchNorm2d(4),
        nn.ReLU(),
        nn.Flatten(),
        nn.Dropout(0.5),  # must stay in eval mode during AdaBN
        nn.Linear(4 * 6 * 6, 5),
        nn.BatchNorm1d(5),
    )


def _trained_looking(net: nn.Sequential) -> None:
    """Running statistics and affine parameters away from their defaults, as after training."""
    with torch.no_grad():
        for bn in (net[1], net[6]):
            bn.running_mean.uniform_(-1, 1)
            bn.running_var.uniform_(0.5, 2)
            bn.weight.uniform_(0.5, 1.5)
            bn.bias.uniform_(-0.5, 0.5)


def test_adabn_running_statistics_are_the_sites_and_weights_stay():
    net = _net()
    _trained_looking(net)
    x = torch.rand(12, 3, 8, 8)

    def prepare(b: torch.Tensor) -> torch.Tensor:
        return (b - 0.5) / 0.25

    params = {k: v.clone() for k, v in net.named_parameters()}
    assert adabn(net, x, prepare, batch_size=12, device=torch.device("cpu"))
    # direct computation: the first BN's input over all images (one batch), unbiased var
    h = net[0](prepare(x))
    torch.testing.assert_close(net[1].running_mean, h.mean((0, 2, 3)))
    torch.testing.assert_close(net[1].running_var, h.var((0, 2, 3), unbiased=True))
    # the second BN sees the first normalised with the batch statistics (training mode),
    # no dropout (eval mode)
    z = F.batch_norm(h, None, None, net[1].weight, net[1].bias, training=True)
    u = net[5](torch.relu(z).flatten(1))
    torch.testing.assert_close(net[6].running_mean, u.mean(0))
    torch.testing.assert_close(net[6].running_var, u.var(0, unbiased=True))
    for k, v in net.named_parameters():
        assert torch.equal(v, params[k]), k  # weights untouched
    assert not net.training and all(m.momentum == 0.1 for m in (net[1], net[6]))

    # two equal batches: momentum=None averages the batch means and unbiased variances
    assert adabn(net, x, prepare, batch_size=6, device=torch.device("cpu"))
    h1, h2 = net[0](prepare(x[:6])), net[0](prepare(x[6:]))
    torch.testing.assert_close(net[1].running_mean, (h1.mean((0, 2, 3)) + h2.mean((0, 2, 3))) / 2)
    want = (h1.var((0, 2, 3), unbiased=True) + h2.var((0, 2, 3), unbiased=True)) / 2
    torch.testing.assert_close(net[1].running_var, want)

    no_bn = nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 2))
    before = {k: v.clone() for k, v in no_bn.state_dict().items()}
    assert not adabn(no_bn, x, prepare, 12, torch.device("cpu"))
    assert all(torch.equal(v, before[k]) for k, v in no_bn.state_dict().items())


def test_k_shot_selection_k_per_class_seeded_nested():
    y = torch.tensor([0] * 7 + [1] * 12 + [2] * 3)[
        torch.randperm(22, generator=torch.Generator().manual_seed(1))
    ]
    for k in (1, 5, 10):
        idx = select_shots(y, k, seed=0, site="mnistm", task="classification")
        counts = torch.bincount(y[idx], minlength=3).tolist()
        assert counts == [min(k, 7), min(k, 12), min(k, 3)]  # class 2 has only 3
        assert len(set(idx.tolist())) == len(idx)
        assert torch.equal(idx, select_shots(y, k, 0, "mnistm", "classification"))
    one, five = (set(select_shots(y, k, 0, "mnistm", "classification").tolist()) for k in (1, 5))
    assert one <= five  # nested: the k=1 images are among the k=5 ones
    other = [select_shots(y, 5, s, "mnistm", "classification") for s in range(1, 4)]
    assert any(not torch.equal(o, select_shots(y, 5, 0, "mnistm", "classification")) for o in other)
    seg = select_shots(torch.zeros(9, 4, 4, dtype=torch.long), 5, 0, "site", "segmentation")
    assert len(seg) == 5 and len(set(seg.tolist())) == 5


def write_config(path: Path, algorithms: list[str]) -> Path:
    base = {
        "name": "ns",
        "dataset": {"name": "toyshift", "train_size": 24},
        "model": {"name": "lenet5"},
        "train": {"rounds": 2, "batch_size": 8, "lr": 0.05},
        "sweep": {"seed": [0], "algorithm.name": algorithms},
    }
    path.write_text(yaml.safe_dump(base))
    return path


def test_new_site_every_method_every_variant_and_global_is_locos(tmp_path):
    algos = ["fedavg", "fedbn", "distrans", "fraug"]
    opts = SuiteOptions(
        write_config(tmp_path / "c.yaml", algos), (), 1, 1, tmp_path / "o", str(tmp_path / "r"),
        progress=False,
    )  # fmt: skip
    res = new_site(opts, shots=(1, 2), epochs=2)
    names = variants((1, 2))
    runs = res.data["runs"]
    assert len(runs) == len(algos) * 3  # 3 sites, one seed
    by_algo: dict[str, list[dict]] = {}
    for run_dir, r in runs.items():
        summary = json.loads((Path(run_dir) / "summary.json").read_text())
        by_algo.setdefault(summary["algorithm"], []).append(r)
        assert summary["holdout"] == [r["site"]]
        assert set(r["scores"]) == set(names)
        for v in ("global", "adabn", "finetune-1", "finetune-2", "select"):
            assert r["scores"][v] is not None and 0 <= r["scores"][v] <= 1, (run_dir, v)
        assert r["scores"]["test-time norm"] is None  # no method here defines one
        assert r["selected_source"] in {"client0", "client1", "client2"} - {r["site"]}
        if summary["algorithm"] == "fedavg":
            # the same computation as loco's held-out score of this cell
            assert r["scores"]["global"] == summary["target_test_mean"]
        else:  # the run itself does not score the site; the protocol answers
            assert summary["target_test_mean"] is None
    # the same k-shot images for every method of a seed (counts per site equal)
    for site in ("client0", "client1", "client2"):
        shots = {a: next(r["shots"] for r in rs if r["site"] == site) for a, rs in by_algo.items()}
        assert len({json.dumps(s, sort_keys=True) for s in shots.values()}) == 1
    # one table per method with a row per variant, and the summary
    for a in algos:
        assert f"### {a} (1 seed(s))" in res.text
    for v in names:
        assert f"| {v} " in res.text
    assert "### Summary" in res.text and "not applicable" in res.text
    data = json.loads(res.files["json"].read_text())
    assert [m["algorithm"] for m in data["methods"]] == sorted(algos)
    assert res.files["md"].read_text().startswith("# A site that never trained")
    assert res.files["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # loco on the same runs folder trains nothing again (fedavg's cells are shared)
    lo = loco(
        SuiteOptions(
            write_config(tmp_path / "l.yaml", ["fedavg"]),
            (),
            1,
            1,
            tmp_path / "lo",
            str(tmp_path / "r"),
            progress=False,
        )  # fmt: skip
    )
    manifest = json.loads((tmp_path / "r/ns/bench.json").read_text())
    fedavg_cells = [m for m in manifest if "fedavg" in Path(m["run_dir"]).name]
    assert fedavg_cells and {m["status"] for m in fedavg_cells} == {"cached"}
    (row,) = lo.data["rows"]
    for site, t in row["targets"].items():
        (r,) = [r for r in by_algo["fedavg"] if r["site"] == site]
        assert t["per_seed"][0] == r["scores"]["global"]


def test_loco_refuses_fedbn_and_points_to_new_site(tmp_path):
    opts = SuiteOptions(
        write_config(tmp_path / "c.yaml", ["fedbn"]), (), 1, 1, tmp_path / "o",
        str(tmp_path / "r"), progress=False,
    )  # fmt: skip
    with pytest.raises(ConfigError, match="protocol new-site"):
        loco(opts)
    with pytest.raises(ConfigError, match="--shots"):
        new_site(opts, shots=(0,))
    with pytest.raises(ConfigError, match=r"--sites nobody: \['nobody'\]; [^(]*$"):
        new_site(opts, sites=("nobody",))
    # a site named as a user spells it gets its client name in the error
    with pytest.raises(ConfigError, match=r"'Client1' is client 'client1'"):
        new_site(opts, sites=("Client1",))


def _run(algo: str, site: str, seed: int, scores: dict) -> tuple[dict, dict]:
    s = {
        "algorithm": algo, "algorithm_config": {"name": algo}, "augment": [], "implied": [],
        "seed": seed, "holdout": [site], "run_dir": f"{algo}-{site}-{seed}", "metrics": {},
        "metric": "acc", "metric_label": "accuracy", "_setting": "",
    }  # fmt: skip
    r = {
        "site": site, "seed": seed, "scores": scores, "selected_source": "x",
        "reasons": {"test-time norm": "the method defines no test-time normalisation"},
    }  # fmt: skip
    return s, r


def test_tables_by_hand_paired_t_test_against_fedavg():
    from scipy.stats import ttest_rel

    names = variants((1,))
    vals = {"fedavg": [0.5, 0.4, 0.6], "fedbn": [0.6, 0.6, 0.7]}
    summaries, per_run = [], {}
    for algo, per_seed in vals.items():
        for seed, v in enumerate(per_seed):
            for site, off in (("a", 0.0), ("b", 0.1)):
                sc = {n: v + off for n in names}
                sc["test-time norm"] = None
                s, r = _run(algo, site, seed, sc)
                summaries.append(s)
                per_run[s["run_dir"]] = r
    text, data = new_site_tables(summaries, per_run, ["a", "b"], (1,), 3)
    fedavg, fedbn = data["methods"]
    avg = {a: [v + 0.05 for v in per_seed] for a, per_seed in vals.items()}
    want = ttest_rel(avg["fedbn"], avg["fedavg"]).pvalue
    got = fedbn["variants"]["adabn"]["average"]
    assert got["p_vs_reference"] == pytest.approx(want)
    assert fedavg["variants"]["adabn"]["average"]["p_vs_reference"] is None
    assert got["mean"] == pytest.approx(sum(avg["fedbn"]) / 3)
    assert fedbn["variants"]["test-time norm"]["average"]["mean"] is None
    assert f"(p={want:.3f})" in text and "p vs fedavg" in text
    assert "test-time norm: the method defines no test-time normalisation" in text
    assert not math.isnan(fedbn["variants"]["global"]["sites"]["a"]["mean"])
    assert "ranking" not in data and "Ranking" not in text  # one setting: nothing to rank by


def test_a_swept_setting_compares_like_with_like_in_number_order():
    """With the number of clients swept, each row's p is against FedAvg at its own setting
    (not the first FedAvg row), and rows go 8, 20, 80 clients (not 20, 8, 80). A cell that
    sets keys of its own (FedWon's ``model.norm=none``) is compared at its number of clients
    too (it was compared with the first FedAvg row: 8 clients for every FedWon row)."""
    from scipy.stats import ttest_rel

    names = variants((1,))
    vals = {  # per setting: fedavg's and fedbn's score by seed
        "8": ([0.5, 0.4, 0.6], [0.6, 0.6, 0.7]),
        "20": ([0.3, 0.2, 0.35], [0.5, 0.45, 0.4]),
        "80": ([0.1, 0.15, 0.1], [0.3, 0.2, 0.2]),
    }
    summaries, per_run = [], {}
    own = {"fedavg": "", "fedbn": "", "fedwon": " model.norm=none"}  # FedWon's cell's key
    for n, pair in vals.items():
        for algo, per_seed in zip(("fedavg", "fedbn", "fedwon"), (*pair, pair[1]), strict=True):
            for seed, v in enumerate(per_seed):
                for site in ("a", "b"):
                    s, r = _run(algo, site, seed, {k: v for k in names})
                    s["_setting"] = f"partition.clients={n}{own[algo]}"
                    s["run_dir"] += f"-{n}"
                    summaries.append(s)
                    per_run[s["run_dir"]] = r
    text, data = new_site_tables(summaries, per_run, ["a", "b"], (1,), 3)
    rows = [(m["algorithm"], m["setting"]) for m in data["methods"]]
    assert rows == [(a, f"partition.clients={n}{own[a]}") for a in own for n in vals]
    for m in data["methods"]:
        n = m["setting"].split()[0].split("=")[1]
        got = m["variants"]["global"]["average"]["p_vs_reference"]
        assert m["reference"] == f"fedavg [partition.clients={n}]", m["setting"]
        if m["algorithm"] == "fedavg":
            assert got is None
        else:
            assert got == pytest.approx(ttest_rel(vals[n][1], vals[n][0]).pvalue)
    assert "at the row's own setting" in text


def test_split_panels_takes_the_swept_key_every_row_has():
    """The panel of a row is its ``key=value`` for the keys all rows give with several values;
    what a cell sets of its own (FedWon's) stays with the method; no sweep: one panel."""
    from fedshift.protocols.common import split_panels

    keys = [("fedavg", "base", "partition.clients=8"), ("fedavg", "base", "partition.clients=20"),
            ("fedwon", "base", "partition.clients=8 model.norm=none"),
            ("fedwon", "base", "partition.clients=20 model.norm=none")]  # fmt: skip
    got = split_panels(keys)
    assert got[keys[1]] == ("partition.clients=20", ("fedavg", "base", ""))
    assert got[keys[2]] == ("partition.clients=8", ("fedwon", "base", "model.norm=none"))
    one = [("fedavg", "base", ""), ("fedwon", "base", "model.norm=none")]
    assert {p for p, _ in split_panels(one).values()} == {""}
    same = [("fedavg", "base", "train.lr=0.1"), ("fedbn", "base", "train.lr=0.1")]  # one value
    assert split_panels(same)[same[1]] == ("", ("fedbn", "base", "train.lr=0.1"))


def test_a_swept_setting_ranks_the_methods_at_each_setting():
    """The ranking section: each method's global average and rank at each number of
    clients (computed by hand here), rows in the first setting's order, Kendall's tau-b
    between the two settings' rankings (by hand: one concordant pair of three, tau -1/3)."""
    names = variants((1,))
    score = {("fedavg", "8"): 0.5, ("fedbn", "8"): 0.6, ("fedwon", "8"): 0.7,
             ("fedavg", "20"): 0.5, ("fedbn", "20"): 0.8, ("fedwon", "20"): 0.3}  # fmt: skip
    own = {"fedavg": "", "fedbn": "", "fedwon": " model.norm=none"}
    summaries, per_run = [], {}
    for (algo, n), v in score.items():
        for seed in (0, 1):
            for site, off in (("a", -0.1), ("b", 0.1)):  # the average over sites is v
                s, r = _run(algo, site, seed, {k: v + off for k in names})
                s["_setting"] = f"partition.clients={n}{own[algo]}"
                s["run_dir"] += f"-{n}"
                summaries.append(s)
                per_run[s["run_dir"]] = r
    text, data = new_site_tables(summaries, per_run, ["a", "b"], (1,), 3)
    ranking = data["ranking"]
    assert ranking["settings"] == ["partition.clients=8", "partition.clients=20"]
    rows = {m["method"]: m["by_setting"] for m in ranking["methods"]}
    assert [m["method"] for m in ranking["methods"]] == [
        "fedwon [model.norm=none]", "fedbn", "fedavg"]  # fmt: skip
    for (algo, n), v in score.items():
        cell = rows[algo + (" [model.norm=none]" if algo == "fedwon" else "")][
            f"partition.clients={n}"
        ]
        assert cell["mean"] == pytest.approx(v)
    assert [rows[m]["partition.clients=20"]["rank"] for m in rows] == [3.0, 1.0, 2.0]
    (pair,) = ranking["kendall"]
    assert pair["tau"] == pytest.approx(-1 / 3) and pair["n"] == 3
    line = next(x for x in text.splitlines() if x.startswith("| fedwon [model.norm=none]"))
    assert [c.strip() for c in line.split("|")[2:4]] == ["70.00 (1)", "30.00 (3)"]
    assert "### Ranking by setting: global" in text and "τ = -0.33" in text


def _held_out_run(tmp_path: Path, name: str, *over: str, seg: bool = False) -> Path:
    from conftest import SEG

    from fedshift.catalog import resolve
    from fedshift.core.config import load_config
    from fedshift.runtime.simulation import run_experiment

    base = SEG if seg else ["dataset.name=toyshift", "dataset.train_size=24",
                            "model.name=lenet5", "train.batch_size=8", "name=test"]  # fmt: skip
    cfg = resolve(
        load_config(None, [*base, "train.rounds=2", "federation.holdout=[client1]", *over])
    )
    return run_experiment(cfg, run_dir=tmp_path / name, progress=False).run_dir


def test_test_time_norm_where_the_method_defines_one(tmp_path):
    from fedshift.augment.fedrdn import channel_statistics
    from fedshift.protocols import load_run
    from fedshift.protocols.new_site import adapt_run

    # FedRDN: the site's own statistics are already how the run scores it (Eq. 8)
    r = adapt_run(_held_out_run(tmp_path, "rdn", "algorithm.name=fedrdn"), (1,), 1)
    assert r["scores"]["test-time norm"] == r["scores"]["global"]
    # HarmoFL: the global amplitude, already in global
    r = adapt_run(_held_out_run(tmp_path, "harmo", "algorithm.name=harmofl"), (1,), 1)
    assert r["scores"]["test-time norm"] == r["scores"]["global"]
    assert "global amplitude" in r["reasons"]["test-time norm"]
    # FedRDN-V: the site's own statistics in place of the averaged ones, computed
    run = _held_out_run(tmp_path, "rdnv", "augment=[fedrdn_v]")
    r = adapt_run(run, (1,), 1)
    sim = load_run(run)
    site = sim.fed.client("client1")
    mean, std = channel_statistics(site.train.x)
    sim.model.load_state_dict(sim.weights_for("client1", "global"))
    direct = sim.task.evaluate(
        sim.model, site.test, lambda x: (x - mean.view(1, -1, 1, 1)) / std.view(1, -1, 1, 1),
        sim.cfg.eval.batch_size, sim.device,
    )["acc"]  # fmt: skip
    assert r["scores"]["test-time norm"] == pytest.approx(direct, abs=1e-12)
    # FedFA's FFA layers are identity at test time: no test-time normalisation
    r = adapt_run(_held_out_run(tmp_path, "fa", "algorithm.name=fedfa"), (1,), 1)
    assert r["scores"]["test-time norm"] is None


def test_segmentation_fedbn_site_gets_an_answer(tmp_path):
    from fedshift.protocols.new_site import adapt_run

    r = adapt_run(_held_out_run(tmp_path, "seg", "algorithm.name=fedbn", seg=True), (1, 2), 2)
    assert r["shots"] == {"1": 1, "2": 2}  # k images, not per class
    for v in ("global", "adabn", "finetune-1", "finetune-2", "select"):
        assert 0 <= r["scores"][v] <= 1


def test_a_stopped_new_site_adapts_only_the_runs_it_had_not(tmp_path, monkeypatch):
    """Each run's adaptation is kept in the output folder (JSON, keyed by the run's summary
    and the options): the same command again adapts nothing and gives the same tables; a
    missing file is adapted again, and other options (--epochs) adapt every run again."""
    import importlib

    ns = importlib.import_module("fedshift.protocols.new_site")  # the module, not the function

    opts = SuiteOptions(
        write_config(tmp_path / "c.yaml", ["fedavg"]), (), 1, 1, tmp_path / "o",
        str(tmp_path / "r"), progress=False,
    )  # fmt: skip
    first = new_site(opts, shots=(1,), epochs=2)
    first_bytes = first.files["json"].read_bytes()
    kept = sorted((first.files["json"].parent / "adapted").glob("*.json"))
    assert len(kept) == 3  # one per held-out site
    calls: list[str] = []
    real = ns.adapt_run

    def counted(run_dir, *a, **k):
        calls.append(Path(run_dir).name)
        return real(run_dir, *a, **k)

    monkeypatch.setattr(ns, "adapt_run", counted)
    again = new_site(opts, shots=(1,), epochs=2)
    assert calls == [] and again.text == first.text
    data = [json.loads(r.files["json"].read_text()) for r in (first, again)]
    assert data[0] == data[1]
    kept[0].unlink()
    third = new_site(opts, shots=(1,), epochs=2)
    assert calls == [kept[0].stem]
    # the run adapted last this time: the file is the same, byte for byte (runs in order)
    assert third.files["json"].read_bytes() == first_bytes
    calls.clear()
    new_site(opts, shots=(1,), epochs=3)
    assert len(calls) == 3


def test_each_run_adapts_as_it_trains_and_a_committed_table_needs_no_model(tmp_path, monkeypatch):
    """A cell the protocol trains is adapted at once (bench's hook), so a machine lost
    mid-suite keeps each finished run as numbers; with the cells and their adaptations
    committed (``fedshift claims collect``), the command re-renders the same tables in a
    fresh folder without training or loading a model; a committed cell whose adaptation is
    not committed is trained again (its model is needed), the others are taken."""
    import importlib

    from fedshift.claims.collect import collect_protocol, collect_suite

    ns = importlib.import_module("fedshift.protocols.new_site")
    real_all = ns._adapt_all

    def nothing_left(run_dirs, *a, **k):
        assert run_dirs == [], "a trained run was not adapted as it finished"
        return real_all(run_dirs, *a, **k)

    monkeypatch.setattr(ns, "_adapt_all", nothing_left)
    cfg = write_config(tmp_path / "c.yaml", ["fedavg", "fedbn"])

    def opts(tag: str, fresh: bool = False) -> SuiteOptions:
        return SuiteOptions(cfg, (), 1, 1, tmp_path / f"o{tag}", str(tmp_path / f"r{tag}"),
                            progress=False, fresh=fresh)  # fmt: skip

    first = new_site(opts("1"), shots=(1,), epochs=2)
    results = tmp_path / "results"
    collect_suite(tmp_path / "r1" / "ns", results, "fedshift protocol new-site -c c.yaml")
    collect_protocol(tmp_path / "o1", results, "fedshift protocol new-site -c c.yaml", "ns")
    assert not list(results.rglob("*.pt"))
    monkeypatch.setenv("FEDSHIFT_RESULTS", str(results))

    def no_model(*a, **k):
        raise AssertionError("a committed run's model was asked for")

    with monkeypatch.context() as m:
        m.setattr(ns, "load_run", no_model)
        again = new_site(opts("2"), shots=(1,), epochs=2)
    assert again.text == first.text
    manifest = json.loads((tmp_path / "r2" / "ns" / "bench.json").read_text())
    assert {row["status"] for row in manifest} == {"committed"} and len(manifest) == 6
    assert len(list((tmp_path / "o2" / "adapted").glob("*.json"))) == 6  # the folder whole
    # a committed cell without its adaptation: trained again, its model adapted
    kept = results / "protocols" / "ns" / "adapted"
    (kept / f"{Path(manifest[0]['run_dir']).name}.json").unlink()
    third = new_site(opts("3"), shots=(1,), epochs=2)
    manifest = json.loads((tmp_path / "r3" / "ns" / "bench.json").read_text())
    assert [row["status"] for row in manifest] == ["ran"] + ["committed"] * 5
    assert third.text == first.text
    # --fresh: every cell trained here, no committed adaptation read
    fresh = new_site(opts("4", fresh=True), shots=(1,), epochs=2)
    manifest = json.loads((tmp_path / "r4" / "ns" / "bench.json").read_text())
    assert {row["status"] for row in manifest} == {"ran"}
    assert fresh.text == first.text


@pytest.mark.process
def test_adapting_in_worker_processes_gives_the_same_numbers(tmp_path):
    """--workers 2 adapts the runs in two spawned processes, each at the run's own thread
    count, as this process does: the same scores to the bit."""
    cfg = write_config(tmp_path / "c.yaml", ["fedavg", "fedbn"])
    runs = str(tmp_path / "r")
    one = new_site(SuiteOptions(cfg, (), 1, 1, tmp_path / "o1", runs, progress=False),
                   shots=(1,), epochs=2)  # fmt: skip
    two = new_site(SuiteOptions(cfg, (), 2, 1, tmp_path / "o2", runs, progress=False),
                   shots=(1,), epochs=2)  # fmt: skip
    assert one.data["runs"] == two.data["runs"] and one.text == two.text
    assert len(list((tmp_path / "o2" / "adapted").glob("*.json"))) == 6


def test_the_new_site_figure_draws_methods_without_a_score(tmp_path):
    """new-site.png: a method with no number for a variant (test-time norm, adabn on a model
    without BN), or even for global, is drawn with the variants it has (ordered last)."""
    from fedshift.protocols.new_site_figure import new_site_png, tick_label

    def avg(x):
        return {"average": {"mean": x, "std": None if x is None else 0.01}}

    data = {
        "metric_label": "accuracy",
        "variants": ["global", "adabn", "test-time norm"],
        "methods": [
            {"algorithm": "fedavg", "flow": "base", "setting": "",
             "variants": {"global": avg(0.4), "adabn": avg(0.5), "test-time norm": avg(None)}},
            {"algorithm": "fedwon", "flow": "base", "setting": "model.conv=ws",
             "variants": {"global": avg(None), "adabn": avg(None), "test-time norm": avg(None)}},
        ],
    }  # fmt: skip
    out = new_site_png(data, tmp_path / "f.png")
    assert out.read_bytes()[:4] == b"\x89PNG"
    assert tick_label(data["methods"][1]) == "fedwon\n[model.conv=ws]"


def test_the_new_site_figure_keeps_every_label_on_the_figure(tmp_path, monkeypatch):
    """A cell with a long setting (FedWon's four keys) pushed the plot to the right until the
    title and the axis label were cut off at the figure's edge; the setting now wraps and the
    figure widens with the longest line: every text drawn lies inside the figure."""
    import matplotlib.pyplot as plt

    from fedshift.protocols.new_site_figure import new_site_png, tick_label

    setting = "partition.clients=25 model.norm=none model.conv=ws train.agc=1.28"
    avg = {"average": {"mean": 0.8, "std": 0.02}}
    data = {
        "metric_label": "foreground Dice",
        "variants": ["global", "adabn"],
        "methods": [
            {"algorithm": a, "flow": "base", "setting": st,
             "variants": {"global": avg, "adabn": avg}}
            for a, st in (("fedavg", "partition.clients=25"), ("fedwon", setting))
        ],
    }  # fmt: skip
    assert tick_label(data["methods"][1]) == (
        "fedwon\n[partition.clients=25\nmodel.norm=none model.conv=ws\ntrain.agc=1.28]"
    )
    drawn = []
    monkeypatch.setattr(plt, "close", drawn.append)  # keep the figure to measure it
    new_site_png(data, tmp_path / "f.png")
    (fig,) = drawn
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    page = fig.bbox
    (ax,) = fig.axes
    lo, hi = ax.get_xlim()
    ticks = [t for t, x in zip(ax.get_xticklabels(), ax.get_xticks(), strict=True) if lo <= x <= hi]
    texts = [ax.title, ax.xaxis.label, *ax.get_yticklabels(), *ticks,
             *fig.legends[0].get_texts()]  # fmt: skip
    assert texts[0].get_text().startswith("A site that never trained")
    assert len(ax.get_yticklabels()) == 2
    for t in texts:
        box = t.get_window_extent(renderer)
        assert page.x0 - 1 <= box.x0 and box.x1 <= page.x1 + 1, t.get_text()
    plt.close(fig)


def test_a_swept_setting_draws_one_panel_per_setting_on_the_figure(tmp_path, monkeypatch):
    """Three numbers of clients: three panels side by side on one x scale, titled by the
    setting, each method on one line in every panel (labelled once, without the setting:
    42 rows in one column was a figure no one reads), every text inside the figure."""
    import matplotlib.pyplot as plt

    from fedshift.protocols.new_site_figure import new_site_png

    def avg(x):
        return {"average": {"mean": x, "std": 0.01}}

    own = {"fedavg": "", "fedwon": " model.norm=none model.conv=ws train.agc=1.28"}
    score = {"fedavg": 0.4, "fedwon": 0.5}
    data = {
        "metric_label": "accuracy",
        "variants": ["global", "adabn"],
        "methods": [
            {"algorithm": a, "flow": "base", "setting": f"partition.clients={n}{own[a]}",
             "variants": {"global": avg(score[a] + n / 1000),
                          "adabn": avg(None if a == "fedwon" else 0.45)}}
            for a in own for n in (8, 20, 80)
        ],
    }  # fmt: skip
    drawn = []
    monkeypatch.setattr(plt, "close", drawn.append)
    new_site_png(data, tmp_path / "f.png")
    (fig,) = drawn
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    assert [ax.get_title() for ax in fig.axes] == [f"partition.clients={n}" for n in (8, 20, 80)]
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert labels == ["fedavg", "fedwon\n[model.norm=none model.conv=ws\ntrain.agc=1.28]"]
    for ax, n in zip(fig.axes, (8, 20, 80), strict=True):  # fedwon's global on row 1
        xs = {round(float(x), 6) for line in ax.lines for x in line.get_xdata()}
        assert round(100 * (0.5 + n / 1000), 6) in xs, n
    assert fig.axes[1].get_shared_y_axes().joined(fig.axes[0], fig.axes[1])
    assert fig.axes[0].get_xlim() == fig.axes[2].get_xlim()
    (legend,) = fig.legends
    assert [t.get_text() for t in legend.get_texts()] == ["global", "adabn"]  # each once
    texts = [fig._suptitle, fig._supxlabel, *legend.get_texts()]
    for ax in fig.axes:
        texts += [ax.title, *ax.get_yticklabels()]
    page = fig.bbox
    for t in texts:
        box = t.get_window_extent(renderer)
        assert page.x0 - 1 <= box.x0 and box.x1 <= page.x1 + 1, t.get_text()
        assert page.y0 - 1 <= box.y0 and box.y1 <= page.y1 + 1, t.get_text()
    plt.close(fig)


def test_select_flags_sources_that_predict_alike():
    """Entropies that agree to float noise (DisTrans sources sharing one offset) mark the
    pick as no choice; real differences, one source or none do not."""
    from fedshift.protocols.new_site_tables import _alike

    e = 1.47  # any entropy; the spreads below are relative to it
    assert _alike({"a": e, "b": e * (1 + 1e-8), "c": e * (1 - 5e-9)})
    assert not _alike({"a": 1.40, "b": 1.41})
    assert not _alike({"a": e, "b": e * (1 + 1e-4)})
    assert not _alike({"a": e}) and not _alike(None)
