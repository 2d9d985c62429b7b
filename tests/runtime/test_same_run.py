"""Every registered algorithm and augment gives the same run every way it can be run: killed
after a round and resumed, with its clients in worker processes, and on Flower (in-process
simulation, uninterrupted and resumed), bit for bit (:mod:`support.same_run`).

One test, parametrised over the registries (a new algorithm or augment is tested without
being listed here) and over three groups of ways, each compared with the uninterrupted native
run of the case:

* ``resume``: every case, killed after round 1 of 2 and resumed, every checkpoint read back
  with ``torch.load(weights_only=True)`` only: one way per algorithm and augment, in-process
  and cheap, so ``make check`` (the fast tier) runs these;
* ``flower``: the :data:`FLOWER` cases on Flower in-process, uninterrupted and stopped and
  resumed (the clients restored from the nodes' snapshots): each kind of record and state
  that crosses Flower's wire;
* ``pool``: two worker processes (``run.workers``) for the :data:`POOL` cases: the
  :data:`FLOWER` cases (every kind of record and client state that leaves the process) and the
  stacked and optioned cases. The other cases get no pool run of their own: client state a
  worker process would lose (kept outside the client's ``state()``) the ``resume`` way
  loses too, since it rebuilds every client from its checkpoint. What only a pool shows, a
  component keeping state in its module between rounds, is tested for these cases only.

``flower`` and ``pool`` are process-level (conftest.PROCESS): ``make test`` runs them,
``make check`` leaves them out.
"""

from __future__ import annotations

import pytest
import torch
from conftest import toy_cfg
from support.same_run import TINY, assert_same_run, seg_overrides, shared_run

from fedshift.algorithms import ALGORITHMS
from fedshift.augment import AUGMENTS
from fedshift.runtime.simulation import load_finished

pytestmark = pytest.mark.usefixtures("one_thread")  # bit-for-bit comparisons

#: registered components that cannot run on the toy config, with why (none today: a name
#: listed here is left out of the cases below, and the test says so)
CANNOT_RUN: dict[str, str] = {}

#: on Flower too: BN kept on the clients, control variates, FFA statistics, amplitudes,
#: held-out clients, FedRDN's statistics, CFSI's amplitude bank, offsets, generators and
#: prototypes, a hypernetwork, a server optimiser; sampled rounds
FLOWER = [
    ("algorithm.name=fedbn",),
    ("algorithm.name=fedbn", "federation.sample_fraction=0.67"),
    ("algorithm.name=scaffold",),
    ("algorithm.name=scaffold", "federation.sample_fraction=0.67"),
    ("algorithm.name=fedfa",),
    ("algorithm.name=harmofl",),
    ("algorithm.name=harmofl", "federation.holdout=[client2]"),
    ("algorithm.name=fedavg", "augment=[fedrdn]"),
    ("algorithm.name=fedavg", "augment=[fedrdn]", "federation.holdout=[client2]"),
    ("algorithm.name=fedavg", "augment=[cfsi]"),
    ("algorithm.name=fedavg", "augment=[cfsi]", "federation.holdout=[client2]"),
    ("algorithm.name=distrans",),
    ("algorithm.name=fraug",),
    ("algorithm.name=pfedhn",),
    ("algorithm.name=fedadam", "train.optimizer_state=persist", "train.momentum=0.9"),
    ("algorithm.name=fediir", "federation.sample_fraction=0.67"),
    ("algorithm.name=fedsr", "algorithm.reference=averaged"),
]

#: sampled rounds, persisted optimiser state and stacked augments
COMBINED = [
    ("algorithm.name=scaffold", "federation.sample_fraction=0.67",
     "train.optimizer_state=persist", "train.momentum=0.9"),
    ("algorithm.name=scaffold", "augment=[fedrdn,fedmix]", "train.optimizer_state=persist",
     "train.momentum=0.5"),
    ("algorithm.name=pfedhn", "federation.sample_fraction=0.67"),
    ("algorithm.name=fedbn", "augment=[ffa,mixstyle]", "federation.sample_fraction=0.67"),
    ("algorithm.name=fedprox", "augment=[fedrdn,fedmix]"),
    # FedWon's model option (no normalisation, WSConv) and AGC under another algorithm
    ("algorithm.name=scaffold", "model.norm=none", "model.conv=ws", "train.agc=0.05"),
]  # fmt: skip

#: every algorithm, FedAvg with every augment, the combined cases and the Flower cases
CASES = [
    *[(f"algorithm.name={a}", *seg_overrides(a), *ALGORITHMS.get(a).requires)
      for a in ALGORITHMS.names() if a not in CANNOT_RUN],
    *[("algorithm.name=fedavg", f"augment=[{a}]") for a in AUGMENTS.names() if a not in CANNOT_RUN],
    *COMBINED,
]  # fmt: skip
CASES += [c for c in FLOWER if c not in CASES]
#: in worker processes too (module docstring)
POOL = [*FLOWER, *[c for c in COMBINED if c not in FLOWER]]

PARAMS = [
    *[pytest.param("resume", c, id=f"resume-{' '.join(c)}") for c in CASES],
    *[pytest.param("flower", c, id=f"flower-{' '.join(c)}") for c in FLOWER],
    *[pytest.param("pool", c, id=f"pool-{' '.join(c)}") for c in POOL],
]

#: the ways each group runs, the first the reference
WAYS_OF = {
    "resume": ("native", "resume"),
    "flower": ("native", "flower", "flower-resume"),
    "pool": ("native", "pool"),
}


@pytest.mark.parametrize(("group", "over"), PARAMS)
def test_same_run(tmp_path, monkeypatch, request, session_dir, group, over):
    """2 rounds, a checkpoint after each; the stopped ways stop after round 1 and resume
    from its checkpoint. Metric rows, summary results, ledger and the final checkpoint
    (server, clients, RNG) must equal the uninterrupted native run's. That native run is
    made once per case and session (``shared_run``): the case's three groups, run by any
    workers, compare with the same one."""
    cfg = toy_cfg(*TINY, *over, "checkpoint.every=1", rounds=2)
    pool = request.getfixturevalue("worker_pool") if group == "pool" else None
    if group != "pool":  # nothing a run reads back may run code
        real = torch.load

        def strict(*args, **kwargs):
            assert kwargs.get("weights_only") is not False, "torch.load(weights_only=False)"
            return real(*args, **{**kwargs, "weights_only": True})

        monkeypatch.setattr(torch, "load", strict)
    native = shared_run(cfg, session_dir / "same-run")
    runs = assert_same_run(cfg, tmp_path, WAYS_OF[group], stop_after=1, pool=pool,
                           reference=native)  # fmt: skip
    if group == "pool":
        assert runs["native"].summary["runtime"] == {
            "engine": "native", "executor": "sequential", "workers": 1, "threads": 1,
            "device": "cpu"}  # fmt: skip
        assert runs["pool"].summary["runtime"] == {
            "engine": "native", "executor": "pool", "workers": 2, "threads": 1,
            "device": "cpu"}  # fmt: skip
        return
    if group == "resume":
        assert runs.saved_round["resume"] == 1
        for weights in ("last", "selected"):  # the finished run rebuilds from its state
            assert load_finished(runs.dir("resume"), weights=weights).round >= 1
    else:
        assert runs.saved_round["flower-resume"] == 1
        assert runs["flower"].summary["runtime"]["mode"] == "simulation (in-process)"
        assert runs["flower"].summary["runtime"]["lost"] == {}


def test_every_registered_component_is_a_case():
    """Nothing is left out silently: every algorithm and augment runs in :func:`test_same_run`
    or is in :data:`CANNOT_RUN` with why."""
    named = {o.split("=", 1)[1] for c in CASES for o in c if o.startswith("algorithm.name=")}
    augments = {c[1][len("augment=[") : -1] for c in CASES if len(c) == 2 and "augment" in c[1]}
    for name in ALGORITHMS.names():
        assert name in named or CANNOT_RUN.get(name), name
    for name in AUGMENTS.names():
        assert name in augments or CANNOT_RUN.get(name), name
    assert all(CANNOT_RUN.values()), "every entry of CANNOT_RUN says why"
