"""Secure aggregation (``federation.secure_aggregation``, :mod:`fedshift.runtime.secagg`):
pairwise masking over a finite field, checked against its definition."""

from __future__ import annotations

import pytest
import torch
from conftest import toy_cfg
from support.same_run import assert_runs_equal

from fedshift.core.errors import ConfigError, FedshiftError, TrainingError
from fedshift.core.identity import number_config
from fedshift.core.payload import Payload
from fedshift.runtime.disclosure import disclose, render
from fedshift.runtime.lifecycle import run_record
from fedshift.runtime.loop import LoopOptions
from fedshift.runtime.native import InProcessTransport
from fedshift.runtime.secagg import (
    META,
    FixedPoint,
    SecureAggregation,
    mask_reply,
    pair_seed,
    unmask_sum,
)
from fedshift.runtime.simulation import Simulation, resume_experiment, run_experiment
from fedshift.runtime.stopping import RunInterrupted

pytestmark = pytest.mark.usefixtures("one_thread")  # bit-for-bit comparisons

SECURE = "federation.secure_aggregation=true"
COHORT = ["a", "b", "c", "d"]


def _replies(seed: int = 0) -> dict[str, tuple[Payload, float]]:
    """Four clients' replies (two records, a float and an integer tensor) and weights."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for i, cid in enumerate(COHORT):
        rec = {
            "w": torch.randn(50, 20, generator=g) * 3,
            "b": torch.randn(7, generator=g),
            "count": torch.tensor(10 + i),  # a BN counter: an integer tensor
        }
        out[cid] = (Payload({"weights": rec, "extra": {"x": torch.rand(3, generator=g)}},
                            num_examples=20 + 7 * i), float(20 + 7 * i))  # fmt: skip
    return out


def _plain_mean(replies, record: str, key: str) -> torch.Tensor:
    """The plain weighted mean in float64: sum_k w_k x_k / sum_k w_k."""
    total = sum(w for _, w in replies.values())
    return sum(w * p.records[record][key].double() for p, w in replies.values()) / total


def _secure(fp: FixedPoint, replies, rnd: int = 3, seed: int = 7) -> Payload:
    masked = {c: mask_reply(fp, seed, rnd, c, COHORT, p, w) for c, (p, w) in replies.items()}
    return unmask_sum(fp, rnd, COHORT, masked)


@pytest.mark.parametrize("frac_bits", [8, 16, 24])
def test_the_masked_aggregate_is_the_plain_one_within_the_quantisation(frac_bits):
    fp = FixedPoint(frac_bits=frac_bits)
    replies = _replies()
    got = _secure(fp, replies)
    bound = fp.mean_error(len(COHORT))  # n_clients * 2**-frac_bits, derived in secagg
    assert bound == len(COHORT) * 2.0**-frac_bits
    for record, key in [("weights", "w"), ("weights", "b"), ("extra", "x")]:
        err = (got.records[record][key].double() - _plain_mean(replies, record, key)).abs()
        assert float(err.max()) <= bound, (record, key, float(err.max()), bound)
        assert got.records[record][key].dtype == torch.float32
    # an integer tensor is the rounded mean, as the plain weighted_average gives it
    assert got.records["weights"]["count"] == _plain_mean(replies, "weights", "count").round()
    assert got.records["weights"]["count"].dtype == torch.int64
    assert got.num_examples == sum(p.num_examples for p, _ in replies.values())
    assert META not in got.records


def test_the_server_sees_masked_values_only():
    fp = FixedPoint()
    replies = _replies()
    plain, w = replies["a"]
    masked = mask_reply(fp, 7, 3, "a", COHORT, plain, w)
    # what the site would send unmasked: its quantised weighted values
    quantised = torch.round(plain.records["weights"]["w"].double() * w * fp.scale)
    seen = masked.records["weights"]["w"].double()
    assert seen.dtype == torch.float64 and masked.num_examples == 0
    assert not torch.equal(seen, quantised.remainder(fp.modulus))
    corr = torch.corrcoef(torch.stack([seen.flatten(), quantised.flatten()]))[0, 1]
    assert abs(float(corr)) < 0.15  # 1,000 values: uniform residues, no trace of the plain
    assert float(seen.min()) >= 0 and float(seen.max()) < fp.modulus
    # the masks are the pair's: the same pair seed from either end, another for another round
    assert pair_seed(7, 3, "a", "b") == pair_seed(7, 3, "b", "a") != pair_seed(7, 4, "a", "b")
    # alone (no other client to pair with) nothing would hide it: the masks are what does
    alone = mask_reply(fp, 7, 3, "a", ["a"], plain, w)
    assert torch.equal(alone.records["weights"]["w"], quantised.to(torch.int64) % fp.modulus)


def test_a_lost_client_is_refused_not_summed_wrongly():
    fp = FixedPoint()
    replies = _replies()
    masked = {c: mask_reply(fp, 7, 3, c, COHORT, p, w) for c, (p, w) in replies.items()}
    del masked["c"]
    with pytest.raises(FedshiftError, match="lost client.*'?c'?.*no dropout recovery"):
        unmask_sum(fp, 3, COHORT, masked)


def test_a_sum_that_could_wrap_around_the_modulus_is_refused():
    fp = FixedPoint(frac_bits=16, modulus_bits=20)  # |q| must stay under 2**20 / 8
    payload, _ = _replies()["a"]
    with pytest.raises(FedshiftError, match="overflow at tensor extra/x.*secagg_frac_bits"):
        mask_reply(fp, 7, 3, "a", COHORT, payload, 20.0)


def test_a_secure_fedavg_round_is_the_plain_one_within_the_quantisation(tmp_path):
    plain = Simulation(toy_cfg(rounds=1), tmp_path / "plain", progress=False)
    plain.run()
    secure = Simulation(toy_cfg(SECURE, rounds=1), tmp_path / "secure", progress=False)
    secure.run()
    n = len(secure.train_clients)
    bound = FixedPoint().mean_error(n)
    a, b = plain.server["weights"], secure.server["weights"]
    worst = max(float((a[k].double() - b[k].double()).abs().max()) for k in a)
    assert 0 < worst <= bound, (worst, bound)
    # the server's ledger counted what it saw: the masked integers (8 bytes an element) and
    # each site's masked weight and example count
    up = secure.ledger.by_record()["up"]
    shared = secure.algo.algorithm.shared_keys
    assert up["weights"] == n * 8 * sum(a[k].numel() for k in shared)
    assert up["weights"] > plain.ledger.by_record()["up"]["weights"]  # float32 in the plain
    assert up[META] == n * 3 * 8  # weight, count, examples
    # each site's training metrics still reach the server (the round's metric rows)
    rows = [r for r in secure.records if "train_loss" in r]
    assert len(rows) == n and all(r["train_loss"] > 0 for r in rows)
    assert run_record(secure).summary["runtime"]["secure_aggregation"]["frac_bits"] == 16


def test_a_lost_client_stops_a_secure_round(tmp_path):
    class Losing(InProcessTransport):
        def train(self, rnd, cids, down):
            replies, lost = super().train(rnd, cids, down)
            gone = cids[-1]
            del replies[gone]
            return replies, [gone]

    sim = Simulation(toy_cfg(SECURE, rounds=1), tmp_path / "r", progress=False,
                     options=LoopOptions(min_clients=1), transport=Losing())  # fmt: skip
    with pytest.raises(FedshiftError, match="secure aggregation lost client"):
        sim.run()


def test_a_non_finite_reply_is_refused_before_it_is_masked(tmp_path):
    class Diverging(InProcessTransport):
        def train(self, rnd, cids, down):
            replies, lost = super().train(rnd, cids, down)
            next(iter(replies[cids[0]].records["weights"].values())).fill_(float("nan"))
            return replies, lost

    sim = Simulation(toy_cfg(SECURE, rounds=1), tmp_path / "r", progress=False,
                     transport=Diverging())  # fmt: skip
    with pytest.raises(TrainingError, match="non-finite update.*weights/"):
        sim.run()


@pytest.mark.parametrize(
    ("algorithm", "record", "why"),
    [
        ("fedrdn", "fedrdn_stats", "other clients receive it as sent"),
        ("fedfa", "ffa_stats", "reads each site's value"),
        ("scaffold", "delta", "reads each site's value"),
        ("fedproto", "prototypes", "reads each site's value"),
        ("fpl", "prototypes", "other clients receive it as sent"),
    ],
)
def test_records_the_server_reads_per_site_are_refused(tmp_path, monkeypatch, algorithm,
                                                       record, why):  # fmt: skip
    built = []
    monkeypatch.setattr(InProcessTransport, "attach", lambda *a: built.append(a))
    cfg = toy_cfg(f"algorithm.name={algorithm}", SECURE, rounds=1)
    with pytest.raises(ConfigError, match=rf"secure_aggregation.*'{record}'.*{why}"):
        Simulation(cfg, tmp_path / "r", progress=False)
    assert not built  # refused before any client state was built


def test_a_uniform_mean_is_divided_by_the_count_not_the_weights():
    fp = FixedPoint()
    replies = _replies()
    masked = {c: mask_reply(fp, 7, 3, c, COHORT, p, w, frozenset({"extra"}))
              for c, (p, w) in replies.items()}  # fmt: skip
    got = unmask_sum(fp, 3, COHORT, masked, uniform=frozenset({"extra"}))
    plain = torch.stack([p.records["extra"]["x"].double() for p, _ in replies.values()]).mean(0)
    assert float((got.records["extra"]["x"].double() - plain).abs().max()) <= fp.mean_error(4)
    weighted = _plain_mean(replies, "weights", "w")
    assert float((got.records["weights"]["w"].double() - weighted).abs().max()) <= fp.mean_error(4)


def test_harmofl_amplitude_is_summed_securely(tmp_path):
    """HarmoFL's amplitude (its server takes the plain mean over sites) is hidden too."""
    plain = Simulation(toy_cfg("algorithm.name=harmofl", rounds=1), tmp_path / "p",
                       progress=False)  # fmt: skip
    plain.run()
    cfg = toy_cfg("algorithm.name=harmofl", SECURE, rounds=1)
    secure = Simulation(cfg, tmp_path / "s", progress=False)
    secure.run()
    key = next(k for k in plain.server if k.startswith("aug/"))
    a, b = plain.server[key]["amplitude"], secure.server[key]["amplitude"]
    err = float((a.double() - b.double()).abs().max())
    assert 0 < err <= FixedPoint().mean_error(len(secure.train_clients))
    once = toy_cfg("algorithm.name=harmofl", SECURE, "federation.sample_fraction=0.5")
    with pytest.raises(ConfigError, match="'amplitude' are sent once.*sample_fraction"):
        Simulation(once, tmp_path / "o", progress=False)


def test_a_summed_record_sent_on_a_condition_is_refused():
    """Sites of one round must send the same tensors: a conditional record cannot be summed
    even when its aggregate only averages it."""
    from types import SimpleNamespace

    from fedshift.core.disclosure import UP, Disclosure, Kind, To, When, fixed

    record = Disclosure("offset", UP, Kind.PARAMETERS, When.ROUND, fixed(4), "a tensor",
                        to=To.AGGREGATE, maybe="when it moved").with_source("x", True)  # fmt: skip
    assert record.hideable
    algo = SimpleNamespace(disclosures=lambda model: [record])
    exp = SimpleNamespace(algo=algo, model=None)
    secure = SecureAggregation.of(toy_cfg(SECURE))
    with pytest.raises(ConfigError, match="'offset' are sent on a condition"):
        secure.check(exp)  # type: ignore[arg-type]


def test_methods_whose_server_only_averages_run_securely(tmp_path):
    for algorithm in ("fedbn", "fedprox"):
        cfg = toy_cfg(f"algorithm.name={algorithm}", SECURE, rounds=1)
        Simulation(cfg, tmp_path / algorithm, progress=False).run()


def test_privacy_show_says_what_secure_aggregation_can_hide():
    report = disclose(toy_cfg("algorithm.name=fedrdn"))
    rows = {(r["direction"], r["record"]): r for r in report["records"]}
    assert rows[("up", "weights")]["secure_aggregation"].startswith("yes")
    stats = rows[("up", "fedrdn_stats")]["secure_aggregation"]
    assert "secure aggregation cannot hide it" in stats
    assert "fedrdn_stats: no: other clients receive it as sent" in render(report)


def test_privacy_show_declares_what_secure_aggregation_sends():
    """With secure aggregation the summed records go masked (8 bytes an element) and the
    protocol's own records are declared: ``secagg`` (masked weight and counts, both engines)
    and ``secagg+`` (Flower's SecAgg+ key exchange), so the ledger counts only declared
    records (tests/flower/test_flower_secagg.py checks both runs' ledgers)."""
    plain = {r["record"]: r for r in disclose(toy_cfg())["records"] if r["direction"] == "up"}
    rows = {r["record"]: r for r in disclose(toy_cfg(SECURE))["records"]
            if r["direction"] == "up"}  # fmt: skip
    assert set(plain) == {"weights"} and set(rows) == {"weights", META, "secagg+"}
    assert rows["weights"]["bytes_max"] == 2 * plain["weights"]["bytes_max"]
    assert not rows["weights"]["bytes_exact"]
    assert (rows[META]["bytes_max"], rows[META]["bytes_exact"]) == (24, True)
    assert rows[META]["secure_aggregation"].startswith("yes")
    assert rows["secagg+"]["secure_aggregation"].startswith("not needed")
    assert "on Flower only" in rows["secagg+"]["maybe"]
    # three sites: two keys, a share pair to each of two others, three unmask shares
    assert rows["secagg+"]["bytes_max"] == 430 + 2 * 620 + 3 * 332


def test_the_keys_leave_the_digest_of_a_plain_run_alone():
    plain = number_config(toy_cfg().to_dict())["federation"]
    assert "secure_aggregation" not in plain and "secagg_frac_bits" not in plain
    secure = number_config(toy_cfg(SECURE).to_dict())["federation"]
    assert secure["secure_aggregation"] is True and secure["secagg_frac_bits"] == 16


def test_a_resumed_secure_run_is_the_uninterrupted_one(tmp_path):
    cfg = toy_cfg(SECURE, "checkpoint.every=1", rounds=3)
    full = run_experiment(cfg, run_dir=tmp_path / "full", progress=False)
    with pytest.raises(RunInterrupted):
        run_experiment(cfg, run_dir=tmp_path / "cut", progress=False, stop_after=1)
    resume_experiment(tmp_path / "cut", progress=False)
    assert_runs_equal(tmp_path / "cut", full.run_dir)
