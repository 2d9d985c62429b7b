"""``fedshift report``: Markdown + self-contained HTML + CSV from finished runs."""

from __future__ import annotations

import csv
import json
import re

import pytest
from conftest import seg_cfg, toy_cfg

from fedshift.cli import main
from fedshift.core.errors import FedshiftError
from fedshift.eval.report import build_report, load_runs
from fedshift.runtime.simulation import run_experiment


@pytest.fixture(scope="module")
def runs_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    for algo, aug in (("fedavg", "[]"), ("fedavg", "[fedrdn]"), ("fedbn", "[]")):
        for seed in (0, 1):
            cfg = toy_cfg(f"algorithm.name={algo}", f"augment={aug}", f"seed={seed}", rounds=2)
            tag = "rdn" if "fedrdn" in aug else "base"
            run_experiment(cfg, run_dir=root / f"{algo}-{tag}-s{seed}", progress=False)
    return root


@pytest.mark.same_kernels  # the table's arithmetic and the test's, on the same recorded summaries
def test_report_tables_deltas_and_reference(runs_root, tmp_path):
    files = build_report([runs_root], tmp_path / "rep", reference="fedbn")
    md = files["md"].read_text()
    runs = load_runs([runs_root])
    assert "Test accuracy (%), mean over 2 seed(s)" in md
    assert "Model selection: round with the best mean validation accuracy" in md
    row = next(line for line in md.splitlines() if line.startswith("| fedavg | +fedrdn"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    # Δ vs base = mean over seeds of the +fedrdn runs minus that of the base runs (points)
    by = {
        (s["algorithm"], "rdn" if s["augment"] else "base", s["seed"]): s["test_mean"] for s in runs
    }
    want = 100 * ((by["fedavg", "rdn", 0] + by["fedavg", "rdn", 1]) / 2) - 100 * (
        (by["fedavg", "base", 0] + by["fedavg", "base", 1]) / 2
    )
    delta = cells[-3]
    assert float(delta.split()[0]) == pytest.approx(want, abs=0.006)
    assert delta.endswith("↑" if want > 0 else "↓" if want < 0 else "=")
    assert "p vs fedbn/base" in md
    assert "### Communication" in md and (tmp_path / "rep/convergence-toyshift.png").is_file()


def test_report_html_is_self_contained(runs_root, tmp_path):
    files = build_report([runs_root], tmp_path / "rep")
    page = files["html"].read_text()
    assert page.startswith("<!doctype html>") and "<table>" in page
    srcs = re.findall(r'(?:src|href)="([^"]+)"', page)
    assert srcs and all(s.startswith("data:image/png;base64,") for s in srcs)


@pytest.mark.same_kernels  # the CSV against the recorded summaries
def test_report_csv_has_a_row_per_run_client_metric(runs_root, tmp_path):
    files = build_report([runs_root], tmp_path / "rep")
    rows = list(csv.DictReader(files["csv"].open()))
    runs = load_runs([runs_root])
    assert len(rows) == len(runs) * (len(runs[0]["clients"]) + 1)
    one = next(r for r in rows if r["client"] == "mean" and r["algorithm"] == "fedbn")
    s = next(s for s in runs if s["algorithm"] == "fedbn" and s["seed"] == int(one["seed"]))
    assert float(one["test"]) == pytest.approx(s["test_mean"])


def test_report_segmentation_has_both_dice_tables(tmp_path):
    run_experiment(seg_cfg(rounds=1), run_dir=tmp_path / "runs/seg", progress=False)
    md = build_report([tmp_path / "runs"], tmp_path / "rep")["md"].read_text()
    assert "Test foreground Dice (%)" in md and "Test mean Dice incl. background (%)" in md
    assert "best mean validation foreground Dice" in md


def test_report_errors(runs_root, tmp_path):
    with pytest.raises(FedshiftError, match="no finished runs"):
        build_report([tmp_path], tmp_path / "rep")
    with pytest.raises(ValueError, match="reference 'scaffold' is not among the runs"):
        build_report([runs_root], tmp_path / "rep", reference="scaffold")


def test_report_cli(runs_root, tmp_path, capsys):
    assert main(["report", str(runs_root), "--out", str(tmp_path / "r")]) == 0
    assert "html:" in capsys.readouterr().out
    assert main(["report", str(runs_root), "--out", str(tmp_path / "r"), "--reference", "x"]) == 2


def test_report_sections_per_partition(tmp_path):
    for part in ("iid", "classes"):
        cfg = toy_cfg(f"partition.name={part}", "partition.clients=3", rounds=1)
        run_experiment(cfg, run_dir=tmp_path / f"runs/{part}", progress=False)
    page = build_report([tmp_path / "runs"], tmp_path / "rep")["html"].read_text()
    heads = re.findall(r"<h2>([^<]*)</h2>", page)
    assert len(heads) == 2 and any("iid DH=0%" in h for h in heads)


def test_report_sections_per_number_of_clients_and_held_out_site():
    """A suite that deals the same domains to 8, 20 and 80 clients and holds out one site at
    a time (new-site's suites) was refused ("runs have different clients"); each number of
    training clients and each held-out site is now a section, in number order. Runs whose
    clients differ only by name still stop with the error."""
    from fedshift.eval.order import natural_key
    from fedshift.eval.report import _check_same_clients, _datasets

    part = {"name": "domains", "clients": 8, "lam": 0.0}

    def s(n: int, held: str) -> dict:
        clients = [f"client{i:02d}" for i in range(n)] + [held]
        return {"dataset": "digits", "partition": {**part, "clients": n}, "clients": clients,
                "holdout": [held], "_dir": f"{n}-{held}"}  # fmt: skip

    runs = [s(n, h) for n in (80, 8, 20) for h in ("synth", "mnistm")]
    groups = _datasets(runs)
    names = sorted(groups, key=natural_key)
    assert [n.split(", ", 2)[-1] for n in names] == [
        f"{n} training clients, held out {h}" for n in (8, 20, 80) for h in ("mnistm", "synth")
    ]
    for name, group in groups.items():
        _check_same_clients(name, group)  # one client list per section
    one = [s(8, "synth"), s(8, "synth")]
    assert list(_datasets(one)) == [next(iter(_datasets(one)))]  # same clients: one section
    assert ", 8 training clients" not in next(iter(_datasets(one)))
    renamed = [s(8, "synth"), {**s(8, "synth"), "clients": [f"site{i}" for i in range(9)]}]
    ((name, group),) = _datasets(renamed).items()
    with pytest.raises(FedshiftError, match="runs have different clients"):
        _check_same_clients(name, group)


def test_report_names_the_held_out_site_outside_the_average(tmp_path):
    """A held-out client's column sits beside the training clients'; the section says it
    never trained and is not in avg ± std (which is the training clients' mean)."""
    cfg = toy_cfg("federation.holdout=[client1]", rounds=1)
    run_experiment(cfg, run_dir=tmp_path / "runs/held", progress=False)
    md = build_report([tmp_path / "runs"], tmp_path / "rep")["md"].read_text()
    assert "(client1 held out: never trained, not in avg ± std)" in md
    row = next(line for line in md.splitlines() if line.startswith("| fedavg | base |"))
    assert "client1" in md.split(row)[0].splitlines()[-2]  # a column of the table's header


def test_report_columns_per_domain_for_clients_dealt_from_domains(tmp_path):
    """Domains dealt two to a client-per-domain pair: the report's tables have one column
    per domain and the note says what a column is."""
    cfg = toy_cfg("partition.name=domains", "partition.clients=4", rounds=1)
    run = run_experiment(cfg, run_dir=tmp_path / "runs/dealt", progress=False)
    mix = json.loads((run.run_dir / "summary.json").read_text())["domain_mix"]
    domains = sorted({max(v, key=v.get) for v in mix.values()})
    md = build_report([tmp_path / "runs"], tmp_path / "rep")["md"].read_text()
    header = next(line for line in md.splitlines() if line.startswith("| algorithm |"))
    assert header.split(" | ")[3 : 3 + len(domains)] == domains and "client00" not in header
    assert "a column per training domain" in md


@pytest.mark.parametrize(
    "edit, key",
    [
        (lambda r: r["global"].update(val_acc=1e308), "global.val_acc"),
        (lambda r: r["global"].update(test_acc=-5.0), "global.test_acc"),
        (lambda r: r["global"].update(test_acc=5.0), "global.test_acc"),
        (lambda r: r["global"].update(test_loss=float("nan")), "global.test_loss"),
        (lambda r: r.update(round="2"), "round"),
    ],
    ids=["1e308", "negative", "500%", "nan", "round-text"],
)
def test_report_refuses_metric_rows_out_of_range(runs_root, tmp_path, capsys, edit, key):
    """A metrics.jsonl row with a score out of range went into the convergence curves without
    a word (issue 48); now `fedshift report` names the file, the line and the key."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(runs_root / "fedavg-base-s0", run)
    path = run / "metrics.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    edit(rows[2])
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["report", str(run), "--out", str(tmp_path / "rep")]) == 2
    err = capsys.readouterr().err
    assert f"{path}, line 3: key {key!r} must be" in err and err.count("\n") == 1, err
