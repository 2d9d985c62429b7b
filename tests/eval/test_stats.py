"""Seed statistics and the Table-1-shaped flows table."""

from __future__ import annotations

import pytest
from scipy import stats

from fedshift.eval.stats import mean_std, paired_ttest, rank_correlation, ranks
from fedshift.eval.tables import flow_label, flows_table


def test_mean_std_and_paired_ttest():
    assert mean_std([1.0, 2.0, 3.0]) == (2.0, 1.0)
    a = {0: 0.9, 1: 0.8, 2: 0.85}
    b = {0: 0.7, 1: 0.75, 2: 0.72, 3: 0.1}  # seed 3 has no pair and is ignored
    expected = stats.ttest_rel([0.9, 0.8, 0.85], [0.7, 0.75, 0.72]).pvalue
    assert paired_ttest(a, b) == pytest.approx(expected)
    assert paired_ttest({0: 1.0}, {0: 0.5}) is None
    assert paired_ttest({0: 1.0, 1: 2.0}, {0: 1.0, 1: 2.0}) == 1.0


def test_ranks_highest_first_ties_share_the_mean_rank():
    assert ranks({"a": 0.5, "b": 0.9, "c": 0.7}) == {"b": 1.0, "c": 2.0, "a": 3.0}
    got = ranks({"a": 0.4, "b": 0.6, "c": 0.6, "d": 0.6, "e": 0.1})
    assert got == {"b": 2.0, "c": 2.0, "d": 2.0, "a": 4.0, "e": 5.0}  # b, c, d span ranks 1-3
    assert ranks({"a": 0.6, "b": 0.6}) == {"a": 1.5, "b": 1.5}
    assert ranks({}) == {}


def _kendall_by_pairs(x: list[float], y: list[float]) -> float:
    """tau-b counted over every pair: (concordant - discordant) / sqrt of the pairs not tied
    in x times those not tied in y."""
    n, c, d, tx, ty = len(x), 0, 0, 0, 0
    for i in range(n):
        for j in range(i + 1, n):
            sx, sy = (x[i] > x[j]) - (x[i] < x[j]), (y[i] > y[j]) - (y[i] < y[j])
            c += sx * sy > 0
            d += sx * sy < 0
            tx += sx == 0
            ty += sy == 0
    pairs = n * (n - 1) / 2
    return (c - d) / ((pairs - tx) * (pairs - ty)) ** 0.5


def test_rank_correlation_is_kendalls_tau_b_over_the_common_entries():
    a = {"m1": 0.9, "m2": 0.8, "m3": 0.7, "m4": 0.6, "m5": 0.5, "only_a": 0.1}
    same = {k: v + 0.05 for k, v in a.items() if k != "only_a"}
    assert rank_correlation(a, same)[0] == pytest.approx(1.0) and rank_correlation(a, same)[2] == 5
    b = {"m1": 0.5, "m2": 0.9, "m3": 0.7, "m4": 0.7, "m5": 0.4, "only_b": 1.0}  # a tie in b
    tau, p, n = rank_correlation(a, b)
    keys = ["m1", "m2", "m3", "m4", "m5"]
    assert n == 5
    assert tau == pytest.approx(_kendall_by_pairs([a[k] for k in keys], [b[k] for k in keys]))
    assert 0.0 < p <= 1.0
    reverse = {k: -v for k, v in a.items()}
    assert rank_correlation(a, reverse)[0] == pytest.approx(-1.0)
    assert rank_correlation({"x": 1.0, "y": 2.0}, {"x": 1.0, "y": 2.0}) == (None, None, 2)
    flat = {k: 0.5 for k in keys}
    assert rank_correlation(a, flat) == (None, None, 5)  # all tied: tau undefined


def _s(algo, augs, seed, acc, implied=()):
    return {
        "algorithm": algo,
        "augment": [{"name": a} for a in augs],
        "implied": list(implied),
        "seed": seed,
        "test_mean": acc,
        "clients": ["a"],
        "test_per_client": {"a": acc},
    }


def test_flows_table_deltas():
    runs = [_s("fedavg", [], s, 0.80 + 0.01 * s) for s in range(3)]
    runs += [_s("fedavg", ["fedrdn"], s, 0.85 + 0.01 * s + 0.001 * s * s) for s in range(3)]
    runs += [_s("fedrdn", ["fedrdn"], 0, 0.9, implied=["fedrdn"])]
    assert flow_label(runs[0]) == "base" and flow_label(runs[3]) == "+fedrdn"
    assert flow_label(runs[-1]) == "base"  # the preset's own augment is its base flow
    table = flows_table(runs)
    row = next(line for line in table.splitlines() if "+fedrdn" in line)
    assert "+5.17" in row  # mean(85, 86.1, 87.4) - mean(80, 81, 82) = 86.17 - 81.00 (%)


def test_flow_label_names_non_default_keys():
    harmo = {
        "algorithm_config": {
            "name": "harmofl",
            "bn_policy": "global",
            "rho": 0.05,
            "perturbation": False,
            "amplitude_norm": True,
        },
        "implied": ["ampnorm"],
        "augment": [{"name": "ampnorm", "amplitude": "paper", "decay": 0.1}],
    }
    assert flow_label(harmo) == "perturbation=False"
    harmo["algorithm_config"]["perturbation"] = True
    assert flow_label(harmo) == "base"
    rdn = {
        "algorithm_config": {"name": "fedbn", "bn_policy": "local"},
        "implied": [],
        "augment": [{"name": "fedrdn", "draw": "released"}],
    }
    assert flow_label(rdn) == "+fedrdn(draw=released)"


def test_label_skew_table_grid_and_pvalues():
    from fedshift.eval.label_skew import label_skew_table

    def s(algo, part, dh, seed, acc, **algo_keys):
        return {
            "algorithm": algo,
            "algorithm_config": {"name": algo, **algo_keys},
            "augment": [],
            "implied": [],
            "partition": part,
            "dh": dh,
            "seed": seed,
            "test_mean": acc,
        }

    iid = {"name": "iid", "clients": 10, "seed": 0}
    one = {"name": "one-class", "clients": None, "negatives": 1.0, "seed": 0}
    runs = [
        *(s("fedavg", iid, 0.0, k, 0.80 + 0.01 * k) for k in range(3)),
        *(s("fedavg", one, 100.0, k, 0.50) for k in range(3)),
        *(s("moon", iid, 0.0, k, 0.70 + 0.01 * k + 0.001 * k * k) for k in range(3)),
    ]
    table = label_skew_table(runs)
    lines = table.splitlines()
    assert "iid DH=0%" in lines[0] and "one-class DH=100%" in lines[0]
    assert lines[0].index("iid") < lines[0].index("one-class")  # columns by DH
    assert lines[2].startswith("| fedavg")  # reference first
    assert "81.00 ± 1.00" in lines[2] and "50.00 ± 0.00" in lines[2]
    moon = lines[3]
    assert "moon" in moon and "(p=" in moon
    assert moon.split("|")[-2].strip() == ""  # moon has no one-class runs: empty cell


def test_flows_rows_have_a_column_per_domain_when_domains_are_dealt_to_several_clients():
    """The report's tables (and benchmarks/flows_table.py): clients dealt from domains, two
    to a domain, give one column per training domain (the mean of its clients, by hand
    here), then the held-out site's own; one client per domain keeps the client columns."""
    from fedshift.eval.tables import flows_rows

    mix = {"c0": {"a": 9, "b": 0}, "c1": {"a": 5, "b": 1}, "c2": {"a": 0, "b": 7},
           "c3": {"a": 0, "b": 6}, "h": {"a": 0, "b": 0}}  # fmt: skip
    runs = []
    for seed, shift in ((0, 0.0), (1, 0.1)):
        per = {"c0": 0.9 + shift, "c1": 0.7 + shift, "c2": 0.4, "c3": 0.2, "h": 0.3 + shift}
        s = _s("fedavg", [], seed, sum(per[c] for c in ("c0", "c1", "c2", "c3")) / 4)
        s.update(clients=list(per), test_per_client=per, domain_mix=mix, holdout=["h"])
        runs.append(s)
    header, rows = flows_rows(runs)
    assert header[3:6] == ["a", "b", "h"] and header[6] == "avg ± std"
    a = ((0.9 + 0.7) / 2 + (1.0 + 0.8) / 2) / 2
    assert rows[0][3:6] == [f"{100 * a:.2f}", f"{100 * 0.3:.2f}", f"{100 * 0.35:.2f}"]
    one = {"c0": {"a": 9, "b": 0}, "c1": {"a": 0, "b": 7}}
    s = _s("fedavg", [], 0, 0.5)
    s.update(clients=["c0", "c1"], test_per_client={"c0": 0.6, "c1": 0.4}, domain_mix=one)
    assert flows_rows([s])[0][3:5] == ["c0", "c1"]
    alike = {c: {"a": 5, "b": 5} for c in ("c0", "c1", "c2")}  # lam = 1: no main domain
    s.update(clients=list(alike), test_per_client=dict.fromkeys(alike, 0.5), domain_mix=alike)
    assert flows_rows([s])[0][3:6] == ["c0", "c1", "c2"]
