"""The disclosure model (:mod:`fedshift.core.disclosure`) against what runs send: every
registered algorithm and augment runs its setup exchange and two rounds on a tiny federation,
and the records its :class:`~fedshift.core.payload.Ledger` counted must be exactly the
declared ones (an undeclared record fails; a declared one never sent fails unless its
``maybe`` says when it is not sent, and is reported), at the declared rounds and sizes."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
from conftest import toy_cfg
from support.same_run import TINY, seg_overrides

from fedshift.algorithms import ALGORITHMS
from fedshift.algorithms.fedproto import rarest_class_seen
from fedshift.augment import AUGMENTS
from fedshift.core.disclosure import UP, Disclosure, Kind, Over, Site, To, When, fixed
from fedshift.runtime.disclosure import (
    TABLE_BEGIN,
    TABLE_END,
    check_ledger,
    disclose,
    markdown_table,
    render,
    sites_of,
)
from fedshift.runtime.simulation import Simulation

pytestmark = pytest.mark.usefixtures("one_thread")

#: every algorithm, FedAvg with every augment, and configurations that send other records
CASES = [
    *[(f"algorithm.name={a}", *seg_overrides(a), *ALGORITHMS.get(a).requires)
      for a in ALGORITHMS.names()],
    *[("algorithm.name=fedavg", f"augment=[{a}]") for a in AUGMENTS.names()],
    ("algorithm.name=fedproto", "algorithm.share_weights=true"),
    ("algorithm.name=adcol", "algorithm.averaging=fedavg"),
    ("algorithm.name=fedsr", "algorithm.reference=averaged"),
    ("algorithm.name=distrans", "algorithm.aggregation=avg"),
    ("algorithm.name=fedavg", "augment=[{name: ffa, ema: average}]"),
    ("algorithm.name=fedavg", "augment=[{name: fedmix, m: 5}]"),
    ("algorithm.name=fedavg", "augment=[{name: cfsi, bank_fraction: 0.5}]"),
    ("algorithm.name=fedavg", "augment=[fedrdn_v]", "federation.holdout=[client2]"),
]  # fmt: skip
ROUNDS = 3
ROOT = Path(__file__).resolve().parents[2]


def _run(over: tuple[str, ...], tmp_path) -> tuple[Simulation, list[Disclosure]]:
    cfg = toy_cfg(*TINY, *over, rounds=ROUNDS)
    sim = Simulation(cfg, tmp_path, progress=False)
    if sim.algo.needs_setup:
        sim.setup_exchange()
    for rnd in range(1, ROUNDS + 1):
        sim.run_round(rnd)
    return sim, sim.algo.disclosures(sim.model)


@pytest.mark.parametrize("over", CASES, ids=[" ".join(c) for c in CASES])
def test_records_on_the_wire_are_the_declared_ones(tmp_path, over):
    sim, declared = _run(over, tmp_path)
    keys = [d.key for d in declared]
    assert len(keys) == len(set(keys)), f"a record declared twice: {keys}"
    problems, unsent = check_ledger(declared, sim.ledger.rows, sites_of(sim.exp), ROUNDS)
    assert not problems, "\n".join(problems)
    if unsent:  # conditional records this tiny run did not send (their ``maybe`` says when)
        warnings.warn(f"{' '.join(over)}: declared, not sent here: {unsent}", stacklevel=1)
    _check_receivers(declared)


def _check_receivers(declared: list[Disclosure]) -> None:
    """What the declarations say about receivers holds together: a down record carries
    declared up records; an up record other clients receive (as sent or aggregated) is
    carried down by some record; one the server keeps is carried down, if at all, only
    inside a model the server trained or updated with it (ADCOL's discriminator)."""
    ups = {r.record for r in declared if r.direction == UP}
    for d in declared:
        if d.direction != UP:
            assert set(d.carries) <= ups, (d.record, d.carries, ups)
            continue
        carriers = [r for r in declared if r.direction != UP and d.record in r.carries]
        if d.to in (To.CLIENTS, To.AGGREGATE):
            assert carriers, f"up {d.record!r} reaches other clients ({d.to}) by no down record"
        else:
            assert all(r.kind is Kind.PARAMETERS for r in carriers), (d.record, carriers)


def test_every_registered_component_is_a_case():
    names = {o.split("=", 1)[1] for c in CASES for o in c if o.startswith("algorithm.name=")}
    assert set(ALGORITHMS.names()) <= names
    augs = {c[1][len("augment=[") : -1] for c in CASES if len(c) == 2 and "augment" in c[1]}
    assert set(AUGMENTS.names()) <= augs


def _site(**kw) -> Site:
    base = dict(name="a", examples=10, class_counts=(7, 3, 0), input_shape=(3, 4, 4),
                num_classes=3, federation=(10, 20), batch_size=4, steps=2)  # fmt: skip
    return Site(**{**base, **kw})


def test_a_site_counts_what_statistics_summarise():
    s = _site()
    assert Disclosure("x", UP, Kind.STATISTIC, When.SETUP, fixed(1), "", to=To.SERVER,
                      over=Over.CLASS).examples_at(s) == 3  # fmt: skip
    assert Disclosure("x", UP, Kind.STATISTIC, When.SETUP, fixed(1), "", to=To.SERVER,
                      over=Over.SITE).examples_at(s) == 10  # fmt: skip
    assert s.smallest_batch == 2 and s.classes_held == 2 and s.steps_per_epoch == 3
    assert _site(examples=9).smallest_batch == 4  # a trailing batch of one is skipped
    assert s.last_epoch_examples == 8
    # prototypes of the training batches: a partial epoch may see one example of a class
    assert rarest_class_seen(_site(steps=3)) == 3 and rarest_class_seen(_site(steps=2)) == 1


def test_declarations_refuse_what_says_nothing():
    with pytest.raises(ValueError, match="who receives"):
        Disclosure("x", UP, Kind.PARAMETERS, When.ROUND, fixed(1), "")
    with pytest.raises(ValueError, match="summarises"):
        Disclosure("x", UP, Kind.STATISTIC, When.ROUND, fixed(1), "", to=To.SERVER)
    with pytest.raises(ValueError, match="count"):
        Disclosure("x", UP, Kind.STATISTIC, When.ROUND, fixed(1), "", to=To.SERVER,
                   over=Over.GROUP)  # fmt: skip


def test_the_check_finds_an_undeclared_record_and_a_wrong_size():
    s = _site()
    declared = [Disclosure("w", UP, Kind.PARAMETERS, When.ROUND, fixed(8), "", to=To.SERVER)]
    rows = [(1, "a", "up", "w", 8), (1, "a", "up", "extra", 4), (2, "a", "up", "w", 12)]
    problems, unsent = check_ledger(declared, rows, {"a": s}, 2)
    assert any("'extra' is not declared" in p for p in problems)
    assert any("12 bytes, declared 8" in p for p in problems)
    problems, unsent = check_ledger(declared, [], {"a": s}, 2)
    assert unsent == ["up 'w'"] and any("never sent" in p for p in problems)


def test_the_receivers_must_hold_together():
    stats = Disclosure("s", UP, Kind.STATISTIC, When.SETUP, fixed(8), "", to=To.CLIENTS,
                       over=Over.SITE)  # fmt: skip
    bank = Disclosure("b", "down", Kind.STATISTIC, When.SETUP, fixed(8), "", carries=("s",))
    _check_receivers([stats, bank])
    with pytest.raises(AssertionError, match="by no down record"):
        _check_receivers([stats])
    kept = Disclosure("s", UP, Kind.STATISTIC, When.SETUP, fixed(8), "", to=To.SERVER,
                      over=Over.SITE)  # fmt: skip
    with pytest.raises(AssertionError):  # forwarded although declared kept by the server
        _check_receivers([kept, bank])


def test_show_reports_fedrdn_statistics():
    cfg = toy_cfg(*TINY, "algorithm.name=fedrdn")
    report = disclose(cfg)
    rows = {(r["direction"], r["record"]): r for r in report["records"]}
    stats = rows[("up", "fedrdn_stats")]
    assert stats["kind"] == "statistic" and stats["to"] == str(To.CLIENTS)
    assert stats["bytes_min"] == 2 * 3 * 4 and stats["fewest_examples"] == 12
    text = render(report)
    assert "fedrdn_stats" in text and "fedrdn_bank" in text
    assert torch.is_tensor(torch.zeros(1))  # nothing trained: the report is plain data


def _doc_reports() -> list[tuple[str, dict]]:
    """Every registered algorithm, then every augment's own records (on FedAvg)."""
    out = []
    for a in ALGORITHMS.names():
        cfg = toy_cfg(*TINY, f"algorithm.name={a}", *seg_overrides(a), *ALGORITHMS.get(a).requires)
        out.append((a, disclose(cfg)))
    for a in AUGMENTS.names():
        report = disclose(toy_cfg(*TINY, "algorithm.name=fedavg", f"augment=[{a}]"))
        own = [r for r in report["records"] if r["component"] == a]
        out.append((f"augment {a}", {**report, "records": own}))
    return out


def test_the_privacy_doc_table_is_the_declarations():
    """docs/PRIVACY.md's table "What each method shares" is generated from the declarations
    (``python tests/core/test_disclosure.py`` rewrites it)."""
    doc = (ROOT / "docs" / "PRIVACY.md").read_text(encoding="utf-8")
    begin, end = doc.index(TABLE_BEGIN) + len(TABLE_BEGIN), doc.index(TABLE_END)
    want = markdown_table(_doc_reports())
    assert doc[begin:end].strip() == want, "run: python tests/core/test_disclosure.py"


if __name__ == "__main__":  # rewrite docs/PRIVACY.md's table
    path = ROOT / "docs" / "PRIVACY.md"
    text = path.read_text(encoding="utf-8")
    head, rest = text.split(TABLE_BEGIN, 1)
    _, tail = rest.split(TABLE_END, 1)
    table = markdown_table(_doc_reports())
    path.write_text(f"{head}{TABLE_BEGIN}\n{table}\n{TABLE_END}{tail}", encoding="utf-8")
