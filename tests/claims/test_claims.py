"""The claims ledger: the rubric's verdicts on hand-computed cases, claims files matched to
results, the generated pages, and the committed ledger regenerated from ``results/``."""

from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path

import pytest
import yaml
from conftest import ROOT
from scipy import stats

from fedshift.claims import rubric
from fedshift.claims.evaluate import evaluate, load_papers
from fedshift.claims.ledger import render
from fedshift.claims.spec import ClaimsError, Selector, load_paper


# ------------------------------------------------------------------------------- rubric
def _t_two_sided(d: list[float]) -> float:
    """The paired t-test written out: t = mean / (sd / sqrt(n)), n - 1 degrees of freedom."""
    n = len(d)
    mean = sum(d) / n
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / (n - 1))
    return 2 * stats.t.sf(abs(mean / (sd / math.sqrt(n))), n - 1)


def test_greater_reproduces_only_with_significance_over_three_seeds():
    clear = [0.020, 0.021, 0.022]  # t = 0.021 / (0.001 / sqrt 3) = 36.4: p = 0.00075
    r = rubric.judge(clear, "greater")
    assert r.verdict == rubric.REPRODUCES
    assert r.p == pytest.approx(_t_two_sided(clear), rel=1e-9)
    assert r.n == 3 and r.mean == pytest.approx(0.021)
    noisy = [0.01, 0.02, 0.03]  # t = 3.46, p = 0.074: right sign, not significant
    r = rubric.judge(noisy, "greater")
    assert r.p == pytest.approx(_t_two_sided(noisy), rel=1e-9)
    assert r.p > rubric.ALPHA and r.verdict == rubric.IN_DIRECTION
    # two seeds never reproduce, however large the effect
    assert rubric.judge([0.10, 0.11], "greater").verdict == rubric.IN_DIRECTION


def test_the_opposite_sign_is_contrary_when_significant_else_not_shown():
    # t = -0.02 / (0.01 / sqrt 3) = -3.46, p = 0.074: the other way, not significantly
    assert rubric.judge([-0.01, -0.02, -0.03], "greater").verdict == rubric.NOT_SHOWN
    # t = -36.4, p = 0.00075: significantly the other way
    assert rubric.judge([-0.020, -0.021, -0.022], "greater").verdict == rubric.CONTRARY
    assert rubric.judge([0.01, 0.02, 0.03], "less").verdict == rubric.NOT_SHOWN
    assert rubric.judge([0.020, 0.021, 0.022], "less").verdict == rubric.CONTRARY
    assert rubric.judge([-0.020, -0.021, -0.022], "less").verdict == rubric.REPRODUCES
    assert rubric.judge([0.0, 0.0, 0.0], "greater").verdict == rubric.NOT_SHOWN  # a tie
    assert rubric.judge([0.01, -0.01, 0.0], "less").verdict == rubric.NOT_SHOWN  # mean 0
    # two seeds are never significant, either way
    assert rubric.judge([-0.10, -0.11], "greater").verdict == rubric.NOT_SHOWN


def test_a_comparison_of_runs_not_converged_is_neither_a_win_nor_a_loss():
    r = rubric.judge([0.020, 0.021, 0.022], "greater", unconverged_rounds=30)
    assert (
        r.verdict == rubric.NOT_CONVERGED
        and r.text() == "not converged at 30 rounds (as measured: reproduces)"
    )
    assert r.mean == pytest.approx(0.021)  # the numbers are still shown
    r = rubric.judge([-0.020, -0.021, -0.022], "greater", unconverged_rounds=30)
    assert r.verdict == rubric.NOT_CONVERGED


def test_convergence_by_the_selected_round_the_curves_end_and_early_stopping():
    flat = {r: 0.80 + 0.01 * (-1) ** r for r in range(2, 31, 2)}  # noise on a plateau
    rising = {r: 0.50 + 0.01 * r for r in range(2, 31, 2)}
    # selected round in the last 10 % of 30 rounds: 28 > 27 is not converged, 27 is
    assert not rubric.convergence(30, 28, flat).converged
    assert "last 10 %" in rubric.convergence(30, 28, flat).why
    assert rubric.convergence(30, 27, flat).converged
    # selected early, but the validation curve still rises over its last 5 evaluations
    late = rubric.convergence(30, 10, rising)
    assert not late.converged and "still rising" in late.why
    # slope test over the last 5 points written out: a perfect line has p = 0
    xs, ys = [22, 24, 26, 28, 30], [0.72, 0.74, 0.76, 0.78, 0.805]
    fit = stats.linregress(xs, ys, alternative="greater")
    assert fit.pvalue < rubric.ALPHA
    assert not rubric.convergence(30, 10, dict(zip(xs, ys, strict=True))).converged
    # a rise that is not significant over the last 5 points: converged
    noisy = {22: 0.70, 24: 0.76, 26: 0.69, 28: 0.75, 30: 0.72}
    assert rubric.convergence(30, 24, noisy).converged
    # stopped by early stopping: converged whatever the curve and the selected round
    assert rubric.convergence(30, 30, rising, stop_reason="patience", stopped_at=30).converged
    assert not rubric.convergence(30, 30, rising, stop_reason="rounds", stopped_at=30).converged
    assert not rubric.convergence(30, 30, rising, stop_reason="patience").converged  # no round


def test_equal_is_an_equivalence_test_with_a_margin():
    tight = [0.001, -0.001, 0.0005]
    r = rubric.judge(tight, "equal", margin=0.01)
    # TOST: both one-sided tests of d - m < 0 and d + m > 0; p is the larger
    n, mean = 3, sum(tight) / 3
    sd = math.sqrt(sum((x - mean) ** 2 for x in tight) / 2)
    se = sd / math.sqrt(n)
    p_lower = stats.t.sf((mean + 0.01) / se, n - 1)
    p_upper = stats.t.cdf((mean - 0.01) / se, n - 1)
    assert r.p == pytest.approx(max(p_lower, p_upper), rel=1e-9)
    assert r.verdict == rubric.REPRODUCES
    # beyond the margin of 1 point, significantly (one-sided t-test of d > m): contrary
    assert rubric.judge([0.02, 0.021, 0.019], "equal").verdict == rubric.CONTRARY
    # beyond it on average, not significantly: not shown
    assert rubric.judge([0.005, 0.03, 0.0], "equal").verdict == rubric.NOT_SHOWN
    # level on average but too noisy to show equivalence
    assert rubric.judge([0.009, -0.008, 0.004], "equal").verdict == rubric.IN_DIRECTION


def test_constant_differences_and_no_pairs():
    r = rubric.judge([0.01, 0.01, 0.01], "greater")
    assert r.p == 0.0 and r.verdict == rubric.REPRODUCES
    r = rubric.judge([], "greater")
    assert r.verdict == rubric.NOT_MEASURED and r.n == 0
    with pytest.raises(ValueError, match="expect"):
        rubric.judge([0.1], "bigger")


def test_a_claim_combines_its_comparisons():
    R, D, M = rubric.REPRODUCES, rubric.IN_DIRECTION, rubric.NOT_MEASURED
    C, S, U = rubric.CONTRARY, rubric.NOT_SHOWN, rubric.NOT_CONVERGED
    assert rubric.combine([R, R]) == R
    assert rubric.combine([R, D]) == D
    assert rubric.combine([R, S, D]) == S
    assert rubric.combine([S, C]) == C  # contrary first
    assert rubric.combine([R, M]) == M
    assert rubric.combine([S, M]) == S  # a measured "not shown" is not waiting for the rest
    assert rubric.combine([U, S]) == S  # nor for runs still converging
    assert rubric.combine([R, U, M]) == U
    assert rubric.combine([]) == M


# ------------------------------------------------------------------------ a fake tree
def _run(root: Path, name: str, seed: int, cfg: dict, score: float, **summary) -> None:
    d = root / name
    d.mkdir(parents=True)
    full = {"name": "s", "seed": seed, "dataset": {"name": "toyshift"}, **cfg}
    (d / "config.yaml").write_text(yaml.safe_dump(full))
    s = {
        "seed": seed,
        "rounds": 10,
        "metric": "acc",
        "evaluated_model": "global",
        "test_mean": score,
        "test_per_client": {"c0": score, "c1": score},
        "clients": ["c0", "c1"],
        "implied": [],
        "defaults": {"augment": {"ffa": {"p": 0.5}, "fedrdn": {"draw": "paper"}}},
        "best_round": 6,
        **summary,
    }
    (d / "summary.json").write_text(json.dumps(s))
    # a validation curve that levels off by round 6, the selected round (converged)
    curve = dict(enumerate([0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.89, 0.9, 0.895, 0.9], start=1))
    rows = [
        {"round": r, "client": c, "global": {"val_acc": score * v, "test_acc": score}}
        for r, v in curve.items()
        for c in ("c0", "c1")
    ]
    (d / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")


def _tree(tmp_path: Path, gains: list[float]) -> Path:
    results = tmp_path / "results"
    for seed, g in enumerate(gains):
        base = 0.70 + 0.01 * seed
        _run(
            results / "suite",
            f"fedavg-s{seed}",
            seed,
            {"algorithm": {"name": "fedavg"}, "augment": []},
            base,
        )
        _run(
            results / "suite",
            f"rdn-s{seed}",
            seed,
            {"algorithm": {"name": "fedavg"}, "augment": [{"name": "fedrdn", "draw": "paper"}]},
            base + g,
        )
    (results / "suite" / "source.json").write_text(
        json.dumps(
            {
                "command": "fedshift bench x.yaml",
                "commit": "abcdef0123",
                "machine": {"cpu": "Test CPU", "capability": "AVX2", "cores": 2, "torch": "2.x"},
            }
        )
    )
    return results


def _claims(tmp_path: Path, extra: dict | None = None) -> Path:
    claim = {
        "id": "T1",
        "where": "Table 1",
        "statement": "FedRDN helps FedAvg.",
        "paper": "62.5 -> 69.8",
        "stand_in": {
            "suite": "x.yaml",
            "command": "fedshift bench x.yaml",
            "results": "suite",
            "paper_rounds": 100,
        },
        "compare": [
            {"label": "+FedRDN vs FedAvg", "a": {"augment": ["fedrdn"]}, "b": {"augment": []}}
        ],
        **(extra or {}),
    }
    d = tmp_path / "claims"
    d.mkdir(parents=True, exist_ok=True)
    doc = {"paper": "Toy", "page": "docs/parts/toy-claims.md", "claims": [claim]}
    (d / "toy.yaml").write_text(yaml.safe_dump(doc))
    return d


def test_evaluate_reads_results_and_judges(tmp_path):
    results = _tree(tmp_path, [0.040, 0.041, 0.042])
    (paper,) = evaluate(_claims(tmp_path), results)
    (claim,) = paper.claims
    assert claim.verdict == rubric.REPRODUCES
    (c,) = claim.comparisons
    assert c.result.n == 3 and c.result.mean == pytest.approx(0.041)
    assert claim.rounds == 10
    assert paper.counts()[rubric.REPRODUCES] == 1

    (paper,) = evaluate(_claims(tmp_path), _tree(tmp_path / "b", [0.04, -0.01, 0.01]))
    assert paper.claims[0].verdict == rubric.IN_DIRECTION
    (paper,) = evaluate(_claims(tmp_path), _tree(tmp_path / "c", [-0.04, -0.03, -0.05]))
    assert paper.claims[0].verdict == rubric.CONTRARY


def test_a_claim_over_runs_not_converged_says_so_with_their_rounds(tmp_path):
    results = _tree(tmp_path, [0.040, 0.041, 0.042])
    summary = results / "suite" / "rdn-s1" / "summary.json"
    s = json.loads(summary.read_text())
    summary.write_text(json.dumps({**s, "best_round": 10}))  # selected its last round
    claims = _claims(tmp_path)
    (paper,) = evaluate(claims, results)
    (claim,) = paper.claims
    assert claim.verdict == rubric.NOT_CONVERGED
    assert claim.verdict_text() == "not converged at 10 rounds (as measured: reproduces)"
    assert claim.comparisons[0].converged_text() == "5/6"
    page = render(claims, results)["docs/parts/toy-claims.md"]
    assert "**Verdict: not converged at 10 rounds (as measured: reproduces).**" in page
    assert "5 of 6 runs converged" in page and "1 selected a round in the last 10 %" in page
    # the same run stopped by early stopping at round 10: converged
    summary.write_text(
        json.dumps({**s, "best_round": 10, "stopped_at": 10, "stop_reason": "patience"})
    )
    (paper,) = evaluate(claims, results)
    assert paper.claims[0].verdict == rubric.REPRODUCES


def test_missing_results_are_not_measured_and_needs_is_not_runnable(tmp_path):
    (paper,) = evaluate(_claims(tmp_path), tmp_path / "nothing")
    assert paper.claims[0].verdict == rubric.NOT_MEASURED
    claims = _claims(tmp_path / "n", {"needs": "Office-Caltech-10 images"})
    (paper,) = evaluate(claims, tmp_path / "nothing")
    assert paper.claims[0].verdict == rubric.NOT_RUNNABLE


def test_a_selector_that_matches_two_runs_of_a_seed_is_refused(tmp_path):
    results = _tree(tmp_path, [0.04, 0.04, 0.04])
    claims = _claims(
        tmp_path,
        {"compare": [{"label": "x", "a": {"algorithm.name": "fedavg"}, "b": {"augment": []}}]},
    )
    with pytest.raises(ClaimsError, match="matches 2 runs of seed 0"):
        evaluate(claims, results)


def test_selectors_match_augments_by_their_defaults_without_implied_ones():
    defaults = {"defaults": {"augment": {"ffa": {"p": 0.5}, "fedrdn": {"draw": "paper"}}}}
    fedfa = {
        "algorithm": {"name": "fedfa"},
        "augment": [{"name": "ffa", "p": 0.5}, {"name": "fedrdn", "draw": "paper"}],
    }
    s = {**defaults, "implied": ["ffa"]}
    assert Selector.of({"augment": ["fedrdn"]}, "t").matches(fedfa, s)
    assert Selector.of({"algorithm.name": "fedfa", "augment": ["fedrdn"]}, "t").matches(fedfa, s)
    assert not Selector.of({"augment": []}, "t").matches(fedfa, s)
    tuned = {"algorithm": {"name": "fedavg"}, "augment": [{"name": "ffa", "p": 0.1}]}
    s = {**defaults, "implied": []}
    assert not Selector.of({"augment": ["ffa"]}, "t").matches(tuned, s)  # not the defaults
    assert Selector.of({"augment": [{"name": "ffa", "p": 0.1}]}, "t").matches(tuned, s)
    assert not Selector.of({"algorithm": {"name": "fedavg", "mu": 1}}, "t").matches(tuned, s)
    assert not Selector.of({"flag": True}, "t").matches({"flag": 1}, s)  # bool is not 1


def test_bad_claims_files_name_the_file_and_claim(tmp_path):
    claims = _claims(tmp_path, {"expected": "x"})
    with pytest.raises(ClaimsError, match=r"toy.yaml claim T1: unknown key\(s\) \['expected'\]"):
        load_papers(claims)
    claims = _claims(tmp_path / "b", {"compare": []})
    with pytest.raises(ClaimsError, match="needs a stand_in and comparisons"):
        load_papers(claims)
    claims = _claims(tmp_path / "c", {"kind": "design"})
    with pytest.raises(ClaimsError, match="names its test"):
        load_papers(claims)


def test_rendering_is_deterministic_and_states_the_numbers(tmp_path):
    results = _tree(tmp_path, [0.040, 0.041, 0.042])
    claims = _claims(tmp_path)
    # cells of a suite still running (results/_incomplete/): no page, not in the ledger
    shutil.copytree(results / "suite", results / "_incomplete" / "suite")
    pages = render(claims, results)
    assert pages == render(claims, results)
    assert set(pages) == {"docs/CLAIMS.md", "docs/parts/toy-claims.md", "docs/results/suite.md"}
    page = pages["docs/parts/toy-claims.md"]
    assert "| +FedRDN vs FedAvg | 75.10 ± 1.10 | 71.00 ± 1.00 | +4.10 ± 0.10 |" in page
    assert "| 3 | < 0.001 | 6/6 | reproduces |" in page
    assert "**Verdict: reproduces.**" in page
    assert "10 rounds (the paper 100: 0.10 of its length)" in page
    assert "2-core Test CPU (AVX2), torch 2.x, commit abcdef0" in page
    top = pages["docs/CLAIMS.md"]
    assert rubric.RUBRIC in top
    assert "| [Toy](parts/toy-claims.md) | 1 | 1 | 0 | 0 | 0 | 0 | 0 | 0 | 0 |" in top
    assert str(tmp_path) not in "".join(pages.values())  # no absolute paths
    assert "made by" not in page  # the results were made by the printed command


def test_results_made_by_another_command_name_it_and_the_machine(tmp_path):
    """A row measured on a GPU machine (or with other flags) says the command that really
    made its results beside the stand-in's own command."""
    results = _tree(tmp_path, [0.040, 0.041, 0.042])
    source = results / "suite" / "source.json"
    made = "fedshift bench x.yaml device=cuda --workers 8"
    src = json.loads(source.read_text())
    src["command"] = made
    src["machine"]["gpu"] = "Test GPU"
    source.write_text(json.dumps(src))
    page = render(_claims(tmp_path), results)["docs/parts/toy-claims.md"]
    assert f"made by `{made}` on 2-core Test CPU (AVX2), Test GPU, torch 2.x" in page


def test_machine_text_names_every_commit_the_runs_recorded():
    """Runs collected from several commits (a resumed suite) list each one, abbreviated, as
    collect records them; one commit stays one."""
    from fedshift.claims.ledger import machine_text

    machine = {"cores": 2, "cpu": "Test CPU", "torch": "2.x"}
    one = machine_text({"machine": machine, "commit": "a" * 40})
    several = machine_text({"machine": machine, "commit": ["a" * 40, "b" * 40 + "+dirty"]})
    assert one == "2-core Test CPU, torch 2.x, commit aaaaaaa"
    assert several == "2-core Test CPU, torch 2.x, commits aaaaaaa bbbbbbb+dirty"


def test_source_names_the_machines_the_runs_recorded(tmp_path):
    """collect's source.json takes the machine from the runs' provenance (not the machine
    collecting), and a suite whose cells ran on two machines (resumed elsewhere through
    results/_incomplete) names both, as the ledger then prints."""
    from fedshift.claims.collect import collect_suite
    from fedshift.claims.ledger import machine_text

    a = {"cores": 2, "cpu": "CPU A", "capability": "AVX512", "gpu": None, "torch": "2.x"}
    b = {**a, "cpu": "CPU B"}
    suite = tmp_path / "runs" / "s"
    for i, m in enumerate([a, a, b]):
        cell = suite / f"cell{i}"
        cell.mkdir(parents=True)
        (cell / "summary.json").write_text(json.dumps({"provenance": {"machine": m}}))

    def source() -> dict:
        out = collect_suite(suite, tmp_path / "results", "cmd")
        return json.loads((out / "source.json").read_text())

    src = source()
    assert src["machine"] == a and src["machines"] == [a, b]
    assert machine_text(src) == "2-core CPU A (AVX512), torch 2.x; 2-core CPU B (AVX512), torch 2.x"
    (suite / "cell2").rename(tmp_path / "gone")
    src = source()
    assert src["machine"] == a and "machines" not in src
    assert machine_text(src) == "2-core CPU A (AVX512), torch 2.x"


def test_results_table_names_a_later_option_only_where_a_run_turns_it_on(tmp_path):
    """FedWon's model keys are off by default on every other run: the results page labels
    the FedWon rows with them and the FedAvg rows without them (not ``model.conv=plain``)."""
    from fedshift.claims.evaluate import ResultRun
    from fedshift.claims.ledger import results_table

    off = {"model": {"name": "cnn", "norm": "keep", "conv": "plain"}, "train": {"agc": None}}
    on = {"model": {"name": "cnn", "norm": "none", "conv": "ws"}, "train": {"agc": 1.28}}
    runs = []
    for name, extra in (("fedavg", off), ("fedwon", on)):
        _run(tmp_path, name, 0, {"algorithm": {"name": name}, "augment": [], **extra}, 0.5)
        d = tmp_path / name
        cfg = yaml.safe_load((d / "config.yaml").read_text())
        runs.append(ResultRun(d, cfg, json.loads((d / "summary.json").read_text())))
    rows = [line for line in results_table("x", runs, None).splitlines() if "| 1 |" in line]
    fedavg, fedwon = (next(r for r in rows if f"algorithm={n} " in r) for n in ("fedavg", "fedwon"))
    assert "model" not in fedavg and "agc" not in fedavg
    assert "model.conv=ws" in fedwon and "model.norm=none" in fedwon and "train.agc=1.28" in fedwon


def test_results_table_labels_floats_short_unless_two_rows_would_read_alike(tmp_path):
    """A float key reads with 6 significant digits (``lr=0.333333``, not 16 digits); when
    two groups differ only past the 6th digit, both labels keep the exact values."""
    from fedshift.claims.evaluate import ResultRun
    from fedshift.claims.ledger import results_table

    def labels(lrs, sub):
        runs = []
        for i, lr in enumerate(lrs):
            name = f"{sub}{i}"
            cfg = {"algorithm": {"name": "fedavg"}, "augment": [], "train": {"lr": lr}}
            _run(tmp_path / sub, name, 0, cfg, 0.5)
            d = tmp_path / sub / name
            cfg = yaml.safe_load((d / "config.yaml").read_text())
            runs.append(ResultRun(d, cfg, json.loads((d / "summary.json").read_text())))
        rows = [r for r in results_table("x", runs, None).splitlines() if "| 1 |" in r]
        return sorted(r.split(" | ")[0].strip("| ") for r in rows)

    third, close = 1 / 3, 1 / 3 + 1e-9
    assert labels([third, 0.25], "a") == ["train.lr=0.25", "train.lr=0.333333"]
    assert labels([third, close], "b") == sorted([f"train.lr={third}", f"train.lr={close}"])


def test_results_table_has_a_column_per_domain_when_domains_are_dealt_to_several_clients(
    tmp_path,
):
    """80 clients dealt from 4 domains made 80 client columns (plus each held-out site's);
    with a domain dealt to several clients the columns are the training domains, each the
    mean over the clients holding mostly that domain (by hand below), the held-out site in
    the held-out column only; one client per domain keeps its client columns."""
    from fedshift.claims.evaluate import ResultRun
    from fedshift.claims.ledger import results_table

    def table(sub: str, per_client: dict, mix: dict, holdout: list) -> list[str]:
        runs = []
        for seed, shift in ((0, 0.0), (1, 0.02)):
            scores = {c: v + shift for c, v in per_client.items()}
            trained = [v for c, v in scores.items() if c not in holdout]
            held = [v for c, v in scores.items() if c in holdout]
            _run(tmp_path / sub, f"r{seed}", seed, {"algorithm": {"name": "fedavg"}},
                 sum(trained) / len(trained), test_per_client=scores, domain_mix=mix,
                 holdout=holdout, target_test_mean=held[0] if held else None)  # fmt: skip
            d = tmp_path / sub / f"r{seed}"
            cfg = yaml.safe_load((d / "config.yaml").read_text())
            runs.append(ResultRun(d, cfg, json.loads((d / "summary.json").read_text())))
        return results_table("x", runs, None).splitlines()

    mix = {"c0": {"a": 9, "b": 1, "h": 0}, "c1": {"a": 5, "b": 0, "h": 0},
           "c2": {"a": 0, "b": 7, "h": 0}, "h": {"a": 0, "b": 0, "h": 8}}  # fmt: skip
    lines = table("dealt", {"c0": 0.9, "c1": 0.7, "c2": 0.4, "h": 0.3}, mix, ["h"])
    header = next(x for x in lines if x.startswith("| runs"))
    assert [c.strip() for c in header.split("|")[1:-1]] == [
        "runs", "seeds", "a", "b", "mean", "held-out", "KB up / round", "KB setup"]  # fmt: skip
    row = next(x for x in lines if x.startswith("| (all runs)"))
    cells = [c.strip() for c in row.split("|")[1:-1]]
    a = ((0.9 + 0.7) / 2 + (0.92 + 0.72) / 2) / 2  # domain a per seed, then over seeds
    b = (0.4 + 0.42) / 2
    assert cells[2:4] == [f"{100 * a:.2f}", f"{100 * b:.2f}"]
    assert cells[5].startswith(f"{100 * 0.31:.2f} ±")  # the held-out site: (0.30 + 0.32) / 2
    assert "per domain" in "\n".join(lines)
    one = {"c0": {"a": 9, "b": 0}, "c1": {"a": 0, "b": 7}}  # one client per domain
    lines = table("one", {"c0": 0.9, "c1": 0.4}, one, [])
    assert "| c0 | c1 |" in next(x for x in lines if x.startswith("| runs"))


# ------------------------------------------------------------ the committed ledger
def test_the_committed_ledger_is_what_results_give():
    """docs/CLAIMS.md, the per-paper pages and docs/results/*.md are generated: regenerate
    them with `fedshift claims` after changing claims/ or results/."""
    from fedshift.claims.commits import commit_checker

    if commit_checker(ROOT) is None:  # the pages flag runs at commits the history lacks
        pytest.skip("needs the repository's git history (not a shallow clone) to regenerate")
    pages = render(ROOT / "claims", ROOT / "results")
    stale = [
        rel
        for rel, text in pages.items()
        if not (ROOT / rel).is_file() or (ROOT / rel).read_text() != text
    ]
    assert not stale, f"run `fedshift claims` and commit: {stale}"
    generated = {p.relative_to(ROOT).as_posix() for p in (ROOT / "docs/results").glob("*.md")}
    assert generated <= set(pages), "docs/results/ holds pages no results folder gives"


def test_every_file_a_claim_names_exists():
    for path in sorted((ROOT / "claims").glob("*.yaml")):
        paper = load_paper(path)
        for c in paper.claims:
            commands = " ".join(c.stand_in.commands) if c.stand_in else ""
            text = " ".join(
                filter(None, [c.real_suite, c.stand_in and c.stand_in.suite, commands, c.figure])
            )
            for ref in re.findall(r"(?:configs/\S+?\.yaml|docs/img/\S+?\.png)", text):
                assert (ROOT / ref).is_file(), f"{path.name} {c.id}: {ref} does not exist"
            if c.test:
                file, _, name = c.test.partition("::")
                assert f"def {name}(" in (ROOT / file).read_text(), f"{c.id}: {c.test}"


def test_per_domain_metrics_group_clients_by_their_main_domain(tmp_path):
    from fedshift.claims.evaluate import ResultRun, metric_value

    summary = {
        "test_per_client": {"c0": 0.9, "c1": 0.7, "c2": 0.4, "t": 0.1},
        "domain_mix": {"c0": {"a": 10, "b": 1}, "c1": {"a": 9, "b": 2}, "c2": {"a": 0, "b": 8},
                       "t": {"a": 0, "b": 0, "z": 5}},
        "holdout": ["t"],
    }  # fmt: skip
    run = ResultRun(tmp_path, {}, summary)
    # domain a: (0.9 + 0.7) / 2 = 0.8; domain b: 0.4; the held-out client is not scored
    assert metric_value(run, "domain_mean") == pytest.approx((0.8 + 0.4) / 2)
    assert metric_value(run, "domain_std") == pytest.approx(0.2)  # population std of 0.8, 0.4
    with pytest.raises(ClaimsError, match="domain_mix"):
        metric_value(ResultRun(tmp_path, {}, {"test_per_client": {}}), "domain_std")


def test_new_site_metric_reads_the_protocols_score_of_that_run(tmp_path):
    from fedshift.claims.evaluate import ResultRun, metric_value

    proto = tmp_path / "protocols" / "ns"
    proto.mkdir(parents=True)
    scores = {"global": 0.41, "adabn": 0.66, "test-time norm": None}
    (proto / "new-site.json").write_text(json.dumps({"runs": {
        "runs/ns/fedavg-digits-seed0-aaaa": {"scores": scores,
                                             "reasons": {"test-time norm": "defines none"}},
        "runs/ns/fedavg-digits-seed1-bbbb": {"scores": {"global": 0.1, "adabn": 0.2}},
    }}))  # fmt: skip
    run = ResultRun(tmp_path / "results" / "ns" / "fedavg-digits-seed0-aaaa", {}, {})
    assert metric_value(run, "new_site:adabn", proto) == 0.66
    assert metric_value(run, "new_site:global", proto) == 0.41
    with pytest.raises(ClaimsError, match="defines none"):
        metric_value(run, "new_site:test-time norm", proto)
    with pytest.raises(ClaimsError, match="no variant 'finetune-5'"):
        metric_value(run, "new_site:finetune-5", proto)
    other = ResultRun(tmp_path / "results" / "ns" / "fedbn-digits-seed0-cccc", {}, {})
    with pytest.raises(ClaimsError, match="no entry for run"):
        metric_value(other, "new_site:adabn", proto)


@pytest.mark.parametrize(
    "field, value",
    [("test_mean", 1e308), ("test_mean", -5.0), ("test_mean", 5.0), ("test_per_client", 5.0)],
    ids=["1e308", "negative", "500%", "per-client-500%"],
)
def test_a_score_out_of_range_is_refused_not_judged(tmp_path, field, value):
    """A committed summary.json with a score of 1e308, -5.0 or 500 % moved a verdict without
    a word (issue 48); now the ledger refuses it, naming the file and the field."""
    from fedshift.core.errors import FedshiftError

    results = _tree(tmp_path, [-0.04, -0.03, -0.05])  # a NO verdict
    path = results / "suite" / "rdn-s0" / "summary.json"
    s = json.loads(path.read_text())
    if field == "test_per_client":
        s["test_per_client"]["c1"] = value
        field = "test_per_client.c1"
    else:
        s[field] = value
    path.write_text(json.dumps(s))
    with pytest.raises(FedshiftError, match=rf"{re.escape(str(path))}: field '{field}' must be"):
        evaluate(_claims(tmp_path), results)


def test_metric_rows_out_of_range_are_refused_by_the_ledger(tmp_path):
    from fedshift.claims.evaluate import Results
    from fedshift.core.errors import FedshiftError

    results = _tree(tmp_path, [0.04])
    path = results / "suite" / "rdn-s0" / "metrics.jsonl"
    lines = path.read_text().splitlines()
    row = json.loads(lines[3])
    row["global"]["val_acc"] = 5.0
    lines[3] = json.dumps(row)
    path.write_text("\n".join(lines) + "\n")
    run = next(r for r in Results(results).runs("suite") if r.path.name == "rdn-s0")
    with pytest.raises(FedshiftError, match=r"metrics.jsonl, line 4: key 'global.val_acc'"):
        _ = run.rows


# ------------------------------------------------ scopes, re-tests, provenance (issue 50)
def _two_algorithms(tmp_path: Path) -> Path:
    """fedavg and fedbn, each without and with FedRDN, 3 seeds; FedRDN +4 points on both."""
    results = tmp_path / "results"
    for seed in range(3):
        for alg in ("fedavg", "fedbn"):
            base = 0.70 + 0.01 * seed + (0.02 if alg == "fedbn" else 0.0)
            _run(results / "suite", f"{alg}-s{seed}", seed,
                 {"algorithm": {"name": alg}, "augment": []}, base)  # fmt: skip
            _run(results / "suite", f"{alg}-rdn-s{seed}", seed,
                 {"algorithm": {"name": alg}, "augment": [{"name": "fedrdn", "draw": "paper"}]},
                 base + 0.04 + 0.001 * seed)  # fmt: skip
    return results


def test_a_scope_generates_one_comparison_per_committed_value(tmp_path):
    results = _two_algorithms(tmp_path)
    claims = _claims(tmp_path, {
        "scope": {"each": "algorithm.name", "statement": "every algorithm"},
        "compare": [{"label": "{value} +FedRDN vs {value}", "a": {"augment": ["fedrdn"]},
                     "b": {"augment": []}}],
    })  # fmt: skip
    (paper,) = evaluate(claims, results)
    (claim,) = paper.claims
    assert [c.spec.label for c in claim.comparisons] == [
        "fedavg +FedRDN vs fedavg",
        "fedbn +FedRDN vs fedbn",
    ]
    assert all(c.result.n == 3 for c in claim.comparisons)
    assert claim.uncompared == [] and claim.verdict == rubric.REPRODUCES
    page = render(claims, results)["docs/parts/toy-claims.md"]
    assert "**Scope.** every algorithm: one comparison per value of `algorithm.name`" in page
    # a template may not name the key its scope generates over
    bad = _claims(tmp_path / "b", {
        "scope": {"each": "algorithm.name", "statement": "every algorithm"},
        "compare": [{"label": "x", "a": {"algorithm.name": "fedavg", "augment": ["fedrdn"]},
                     "b": {"augment": []}}],
    })  # fmt: skip
    with pytest.raises(ClaimsError, match="names algorithm.name, the key its scope"):
        load_papers(bad)


def test_a_committed_run_in_a_claims_reach_left_uncompared_is_named(tmp_path):
    """Comparing FedAvg only (``algorithm.name`` held fixed by hand) leaves the committed
    FedBN cells out: they are named on the page."""
    results = _two_algorithms(tmp_path)
    claims = _claims(tmp_path, {"compare": [
        {"label": "FedAvg +FedRDN vs FedAvg", "a": {"algorithm.name": "fedavg",
         "augment": ["fedrdn"]}, "b": {"algorithm.name": "fedavg", "augment": []}}]})  # fmt: skip
    (paper,) = evaluate(claims, results)
    fedbn = sorted(f"fedbn-{k}s{s}" for k in ("", "rdn-") for s in range(3))
    assert paper.claims[0].uncompared == fedbn
    page = render(claims, results)["docs/parts/toy-claims.md"]
    assert "**Not compared.** 6 committed run(s) in the reach" in page


def test_no_committed_run_in_a_claims_reach_is_left_uncompared():
    """Every committed cell that matches a claim's selectors but for a key the comparison
    holds fixed (FedRDN T1 comparing FedAvg only, with FedBN and FedFA cells committed) is
    compared: the claim states its scope and its comparisons are generated from it."""
    left = {
        f"{p.spec.key} {c.spec.id}": c.uncompared[:3]
        for p in evaluate(ROOT / "claims", ROOT / "results")
        for c in p.claims
        if c.uncompared
    }
    assert not left, f"committed runs left out of claims (give them a scope): {left}"


def test_a_retest_is_listed_under_its_claim_and_not_counted_twice(tmp_path):
    results = _tree(tmp_path, [0.040, 0.041, 0.042])
    claims = _claims(tmp_path)
    again = {
        "id": "T1-again",
        "retests": "toy/T1",
        "where": "Table 1, another stand-in",
        "statement": "The same.",
        "stand_in": {"suite": "x.yaml", "command": "fedshift bench x.yaml", "results": "suite"},
        "compare": [{"label": "+FedRDN vs FedAvg", "a": {"augment": ["fedrdn"]},
                     "b": {"augment": []}}],
    }  # fmt: skip
    doc = {"paper": "Other", "page": "docs/parts/other-claims.md", "claims": [again]}
    (claims / "other.yaml").write_text(yaml.safe_dump(doc))
    papers = evaluate(claims, results)
    toy = next(p for p in papers if p.spec.key == "toy")
    other = next(p for p in papers if p.spec.key == "other")
    assert sum(other.counts().values()) == 0 and sum(toy.counts().values()) == 1
    (target,) = toy.claims
    assert [c.spec.id for _, c in target.retested_by] == ["T1-again"]
    pages = render(claims, results)
    assert (
        "- [Other T1-again](other-claims.md), Table 1, another stand-in: reproduces"
        in (pages["docs/parts/toy-claims.md"])
    )
    assert "| **all** | 1 | 1 | 0 | 0 | 0 | 0 | 0 | 0 | 1 | 0 |" in pages["docs/CLAIMS.md"]
    doc["claims"][0]["retests"] = "toy/T9"
    (claims / "other.yaml").write_text(yaml.safe_dump(doc))
    with pytest.raises(ClaimsError, match="retests toy/T9, which is not a counted claim"):
        evaluate(claims, results)


def test_seed_papers_are_counted_apart_from_other_methods(tmp_path):
    results = _tree(tmp_path, [0.040, 0.041, 0.042])
    claims = _claims(tmp_path)
    doc = yaml.safe_load((claims / "toy.yaml").read_text())
    (claims / "seed.yaml").write_text(
        yaml.safe_dump(
            {**doc, "paper": "Seed", "page": "docs/parts/seed-claims.md", "seed_paper": True}
        )
    )
    top = render(claims, results)["docs/CLAIMS.md"]
    assert top.startswith("# Claims ledger: the five seed papers' claims")
    rows = [line for line in top.splitlines() if line.startswith("| ") and "|---" not in line]
    labels = [r.split(" | ")[0].removeprefix("| ") for r in rows[1:]]
    assert labels == ["[Seed](parts/seed-claims.md)", "**the five seed papers**",
                      "[Toy](parts/toy-claims.md)", "**other methods**", "**all**"]  # fmt: skip
    assert rows[2].startswith("| **the five seed papers** | 1 | 1 |")
    assert rows[-1].startswith("| **all** | 2 | 2 |")


def _git(repo: Path, *args: str) -> str:
    import subprocess

    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                          check=True)  # fmt: skip
    return done.stdout.strip()


def test_runs_at_a_commit_the_repository_does_not_hold_are_flagged(tmp_path):
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    repo = tmp_path / "repo"
    results = _tree(repo, [0.040, 0.041, 0.042])
    claims = _claims(repo)
    _git(repo, "init", "-q")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty",
         "-m", "x")  # fmt: skip
    held = _git(repo, "rev-parse", "HEAD")
    gone = "0123456789abcdef0123456789abcdef01234567"
    for i, d in enumerate(sorted((results / "suite").iterdir())):
        if d.is_dir():
            s = json.loads((d / "summary.json").read_text())
            commit = gone if i < 2 else held
            s["provenance"] = {"git": {"commit": commit, "dirty": False}}
            (d / "summary.json").write_text(json.dumps(s))
    pages = render(claims, results)
    flag = "2 of 6 runs were run at a fedshift commit this repository does not hold (0123456)"
    assert flag in pages["docs/parts/toy-claims.md"]
    assert (
        "**Provenance.** 2 of 6 cells were run at a fedshift commit"
        in (pages["docs/results/suite.md"])
    )
    # without the repository's history nothing is said of any commit
    quiet = render(claims, results, commits=False)
    assert "Provenance" not in quiet["docs/parts/toy-claims.md"]


def test_protocol_outputs_record_their_commit_and_collect_keeps_it(tmp_path):
    """A protocol's JSON records its provenance (the fedshift commit, the command); collect
    writes that commit into source.json, and an output that records none gets commit null
    with a note, never a guessed commit."""
    from fedshift.claims.collect import UNKNOWN_COMMIT, collect_protocol
    from fedshift.protocols.common import save_outputs

    out = tmp_path / "out"
    out.mkdir()
    save_outputs(out, "loco", "Title", "text", {"x": 1})
    written = json.loads((out / "loco.json").read_text())
    assert written["x"] == 1 and set(written["provenance"]) == {"git", "command", "machine"}
    written["provenance"]["git"] = {"commit": "a" * 40, "dirty": False}
    (out / "loco.json").write_text(json.dumps(written))
    dest = collect_protocol(out, tmp_path / "results", "fedshift protocol loco -c c.yaml", "p")
    src = json.loads((dest / "source.json").read_text())
    assert src["commit"] == "a" * 40 and src["command"] == "fedshift protocol loco -c c.yaml"
    del written["provenance"]
    (out / "loco.json").write_text(json.dumps(written))
    dest = collect_protocol(out, tmp_path / "results", "fedshift protocol loco -c c.yaml", "p")
    src = json.loads((dest / "source.json").read_text())
    assert src["commit"] is None and src["commit_unknown"] == UNKNOWN_COMMIT


def test_the_committed_protocol_outputs_name_their_commit_or_say_it_is_unknown():
    for src in sorted((ROOT / "results" / "protocols").glob("*/source.json")):
        data = json.loads(src.read_text())
        assert data.get("command"), src
        assert data.get("commit") or data.get("commit_unknown"), f"{src}: no commit, no note"
