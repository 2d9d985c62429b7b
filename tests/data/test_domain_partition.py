"""``partition.name=domains`` (Bai et al., arXiv 2307.04942): N clients from D domains, from one
domain per client (lam = 0) to equal shares of every domain (lam = 1); counts worked by hand."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from fedshift.core.errors import ConfigError
from fedshift.data import load_dataset
from fedshift.data.domain_partition import domain_counts
from fedshift.data.partition import apply_partition


def test_counts_by_hand():
    # two domains of 100 and 60 over 4 clients: m = (1,1) -> (2,1) (100/1 > 60/1) -> (2,2)
    # (50 < 60); lam = 0: each client holds half of one domain
    assert domain_counts([100, 60], 4, 0).tolist() == [[50, 0], [50, 0], [0, 30], [0, 30]]
    # lam = 1: n_d / 4 of every domain
    assert domain_counts([100, 60], 4, 1).tolist() == [[25, 15]] * 4
    # lam = 0.5: 0.5 x own + 0.5 x n_d / 4 = (37.5, 7.5) and (12.5, 22.5); floors leave one
    # example of each domain per pair, given to the first clients
    assert domain_counts([100, 60], 4, 0.5).tolist() == [[38, 8], [38, 8], [12, 22], [12, 22]]
    # more domains than clients: whole domains, largest first onto the smaller client
    # (30 -> c0, 20 -> c1, 10 -> c1, 7 -> c0 (tie: the first), 5 -> c1)
    assert domain_counts([10, 30, 20, 5, 7], 2, 0).tolist() == [
        [0, 30, 0, 0, 7],
        [10, 0, 20, 5, 0],
    ]
    # every count is a partition of its domain, whatever lam
    for lam in (0, 0.1, 0.37, 1):
        for n, k in (([100, 60, 7], 5), ([10, 30, 20, 5, 7], 3), ([9, 0, 4], 4)):
            c = domain_counts(n, k, lam)
            assert c.sum(axis=0).tolist() == n and (c >= 0).all()


def test_remainders_stay_with_the_clients_that_hold_the_domain():
    # five scanners of 32 slices over 25 clients (unseen_sites_brain_mri): 6.4 each; each
    # scanner's 2 left over go to two of its own five clients (all tie at 0.4: the first two)
    c = domain_counts([32] * 5, 25, 0)
    assert ((c > 0).sum(axis=1) == 1).all()  # lam = 0: one domain per client
    assert c[:5, 0].tolist() == [7, 7, 6, 6, 6] and c.sum(axis=0).tolist() == [32] * 5
    # the released splitter.py gives every remainder to the first clients: client00 and
    # client01 then hold one slice of each other scanner
    first = domain_counts([32] * 5, 25, 0, rounding="first")
    assert first[0].tolist() == [7, 1, 1, 1, 1] and first[2].tolist() == [6, 0, 0, 0, 0]
    # between the ends, the largest fractional share first: domains of 10 and 7 over 3
    # clients at lam = 0.5 (m = (2, 1)): shares (4.17, 1.17), (4.17, 1.17), (1.67, 4.67);
    # floors (4, 1), (4, 1), (1, 4) leave one of each, which goes to client 2 (0.67 > 0.17)
    assert domain_counts([10, 7], 3, 0.5).tolist() == [[4, 1], [4, 1], [2, 5]]
    assert domain_counts([10, 7], 3, 0.5, rounding="first").tolist() == [[5, 2], [4, 1], [1, 4]]


def test_a_partition_with_remainders_still_puts_one_domain_on_a_client():
    fed = load_dataset({**_toy(), "train_size": 61})  # 61 = 2 x 30 + 1 and 3 x 20 + 1
    one = apply_partition(fed, {"name": "domains", "clients": 7, "lam": 0})
    held = {c: [d for d, k in s.items() if k] for c, s in one.info["domain_mix"].items()}
    assert all(len(h) == 1 for h in held.values()), held
    released = {"name": "domains", "clients": 7, "lam": 0, "rounding": "first"}
    released = apply_partition(fed, released)
    assert sum(1 for k in released.info["domain_mix"]["client00"].values() if k) == 3


def _toy() -> dict:
    return {"name": "toyshift", "train_size": 60, "val_size": 24, "test_size": 30}


def test_the_two_ends_one_domain_per_client_and_equal_shares():
    fed = load_dataset(_toy())
    domains = fed.client_names
    n = {d: len(fed.client(d).train) for d in domains}
    one = apply_partition(fed, {"name": "domains", "clients": 6, "lam": 0})
    assert one.client_names == [f"client{i:02d}" for i in range(6)]
    mix = one.info["domain_mix"]
    for client, shares in mix.items():
        held = [d for d, k in shares.items() if k]
        assert len(held) == 1, (client, shares)  # one domain each
        assert shares[held[0]] == n[held[0]] // 2  # each domain split over two clients
    equal = apply_partition(fed, {"name": "domains", "clients": 6, "lam": 1})
    for shares in equal.info["domain_mix"].values():
        assert all(abs(shares[d] - n[d] / 6) < 1 for d in domains)  # n_d / 6 of every domain
    # an exact partition of every split: the same examples, none twice
    for part in (one, equal):
        for split in ("train", "val", "test"):
            pooled = torch.cat([c.split(split).x for c in part.clients]).flatten(1)
            source = torch.cat([c.split(split).x for c in fed.clients]).flatten(1)
            assert len(pooled) == len(source)
            assert sorted(map(tuple, pooled.tolist())) == sorted(map(tuple, source.tolist()))


def test_seeded_and_usable_for_segmentation():
    fed = load_dataset(_toy())
    a = apply_partition(fed, {"name": "domains", "clients": 4, "lam": 0.3, "seed": 1})
    b = apply_partition(fed, {"name": "domains", "clients": 4, "lam": 0.3, "seed": 1})
    c = apply_partition(fed, {"name": "domains", "clients": 4, "lam": 0.3, "seed": 2})
    pairs = zip(a.clients, b.clients, strict=True)
    assert all(torch.equal(x.train.x, y.train.x) for x, y in pairs)
    pairs = zip(a.clients, c.clients, strict=True)
    assert not all(torch.equal(x.train.x, y.train.x) for x, y in pairs)
    seg = load_dataset({"name": "toyseg"})
    out = apply_partition(seg, {"name": "domains", "clients": 5, "lam": 0})
    assert len(out.clients) == 5 and out.info["partition"]["name"] == "domains"
    with pytest.raises(ConfigError, match="use none or domains"):
        apply_partition(seg, {"name": "iid", "clients": 2})
    with pytest.raises(ConfigError, match="lam"):
        apply_partition(fed, {"name": "domains", "lam": 1.5})


def test_a_run_records_each_clients_domain_mix(tmp_path: Path, one_thread):
    import fedshift

    result = fedshift.run(
        None,
        ["dataset.name=toyshift", "partition.name=domains", "partition.clients=4",
         "partition.lam=0", "train.rounds=1"],
        out=tmp_path,
    )  # fmt: skip
    summary = json.loads((Path(result.run_dir) / "summary.json").read_text())
    mix = summary["domain_mix"]
    assert sorted(mix) == summary["clients"] and len(mix) == 4
    assert all(sum(1 for k in shares.values() if k) == 1 for shares in mix.values())
    assert np.sum([list(s.values()) for s in mix.values()]) > 0


def test_data_check_shows_the_client_x_domain_shares(tmp_path: Path, monkeypatch, one_thread):
    from fedshift.cli import main

    monkeypatch.chdir(tmp_path)

    argv = ["data", "check", "toyshift", "partition.name=domains", "partition.clients=4",
            "partition.lam=0.5", "dataset.train_size=40", "--max-per-site", "10"]  # fmt: skip
    assert main(argv) == 0
    folder = tmp_path / "data-check" / "toyshift"
    data = json.loads((folder / "shift.json").read_text())
    mix = data["config"]["domain_mix"]
    # the report's table is the partition's own counts (3 domains of 40 training images)
    expected = domain_counts([40, 40, 40], 4, 0.5)
    assert [list(mix[c].values()) for c in sorted(mix)] == expected.tolist()
    report = (folder / "report.md").read_text()
    assert "## Domains per client" in report and "domains.png" in report
    first = (
        f"| {sorted(mix)[0]} | {' | '.join(str(v) for v in expected[0])} | {expected[0].sum()} |"
    )
    assert first in report
    assert (folder / "domains.png").stat().st_size > 0


def test_the_partition_figure_script(tmp_path: Path, capsys):
    import runpy

    script = Path(__file__).parents[2] / "benchmarks" / "domain_partition.py"
    main = runpy.run_path(str(script))["main"]
    out = tmp_path / "p.png"
    assert (
        main(["--dataset", "toyshift", "--clients", "4", "--lam", "0", "1", "--out", str(out)]) == 0
    )
    text = capsys.readouterr().out
    assert out.stat().st_size > 0
    rows = [r for r in text.splitlines() if r.startswith("| client") and "---" not in r]
    rows = [r for r in rows if not r.startswith("| client |")]  # the two tables' headers
    assert len(rows) == 8
    # lam = 1 (the second table): every client the same share of every domain
    assert len({r.split("|", 2)[2] for r in rows[4:]}) == 1


def test_keep_leaves_a_domain_whole_for_an_unseen_site(tmp_path: Path, one_thread):
    fed = load_dataset(_toy())
    target = fed.client_names[1]
    out = apply_partition(fed, {"name": "domains", "clients": 4, "lam": 0, "keep": [target]})
    # four dealt clients from the two other domains, then the kept domain as it was
    assert out.client_names == ["client00", "client01", "client02", "client03", target]
    for split in ("train", "val", "test"):
        assert torch.equal(out.client(target).split(split).x, fed.client(target).split(split).x)
    mix = out.info["domain_mix"]
    assert all(mix[c][target] == 0 for c in out.client_names[:4])
    dealt = [d for d in fed.client_names if d != target]
    assert sum(mix[c][d] for c in out.client_names[:4] for d in dealt) == sum(
        len(fed.client(d).train) for d in dealt
    )
    with pytest.raises(ConfigError, match="partition.keep"):
        apply_partition(fed, {"name": "domains", "keep": ["nowhere"]})
    with pytest.raises(ConfigError, match="none is left"):
        apply_partition(fed, {"name": "domains", "keep": fed.client_names})
    # the unseen-site run: trained on the dealt clients, the kept domain held out
    import fedshift

    result = fedshift.run(
        None,
        ["dataset.name=toyshift", "dataset.train_size=40", "partition.name=domains",
         "partition.clients=4", f"partition.keep=[{target}]", f"federation.holdout=[{target}]",
         "train.rounds=1"],
        out=tmp_path,
    )  # fmt: skip
    summary = json.loads((Path(result.run_dir) / "summary.json").read_text())
    assert summary["holdout"] == [target] and len(summary["clients"]) == 5
