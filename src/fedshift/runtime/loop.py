"""The round loop: one implementation for every transport, holding the round protocol only.

:class:`RoundLoop` is one run. It builds the experiment from its transport's federation
(:func:`~fedshift.runtime.experiment.start_experiment`), then (after the setup exchange,
round 0, when an augment needs one) every round up to ``train.rounds``:

1. keeps what undoes the round (server state, ledger length, the sampled clients' state);
2. samples clients (:func:`sample_clients`, from the run's ``sample`` stream of the round);
3. hands the transport each sampled client's broadcast payload, checks the replies for
   non-finite values and lost clients (``min_clients``), and lets the algorithm aggregate;
4. every ``eval.every`` rounds and at the last, evaluates every client with the global
   and/or personal model;
5. commits the round (no undo any more) and hands it to the run's hooks;
6. stops after it where ``train.patience`` says (:mod:`fedshift.eval.early_stop`).

Every payload passes the :class:`~fedshift.core.payload.Ledger`. Randomness is derived from
(seed, purpose, round, client) (:mod:`fedshift.core.seeding`), so a resumed, or extended, run
ends with exactly the numbers of an uninterrupted one. The loop owns the run's state
(:meth:`RoundLoop.state_dict`, ``checkpoint.pt``: written when
:class:`~fedshift.runtime.checkpointing.Checkpointing` says, after the round's hooks) and
SIGINT / SIGTERM: the round in progress is rolled back and the last whole round saved, then
:class:`~fedshift.runtime.stopping.RunSignal` propagates (the CLI exits 130 / 143).
Everything else a run does is a hook (:mod:`fedshift.runtime.hooks`; every run's:
:func:`~fedshift.runtime.lifecycle.run_hooks`). With ``federation.secure_aggregation`` the
algorithm aggregates the replies' secure sum only (:mod:`fedshift.runtime.secagg`); with
``privacy.updates=client`` the noisy mean of the clipped updates
(:mod:`fedshift.runtime.dp_updates`).
"""

from __future__ import annotations

import copy
import logging
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch

from fedshift.core.config import RunConfig
from fedshift.core.errors import FedshiftError
from fedshift.core.payload import Ledger, Payload
from fedshift.core.rows import MetricRow, metric_row
from fedshift.core.seeding import generator, rng_state
from fedshift.eval.early_stop import Stop, stop_of
from fedshift.runtime.checkpointing import Checkpointing, restore
from fedshift.runtime.client import check_reply
from fedshift.runtime.dp_updates import UpdatePrivacy
from fedshift.runtime.experiment import start_experiment
from fedshift.runtime.hooks import Hook, Hooks, RoundRecord
from fedshift.runtime.lifecycle import run_to_end
from fedshift.runtime.rundir.results import RunResult
from fedshift.runtime.secagg import SecureAggregation
from fedshift.runtime.stopping import RunInterrupted, SignalGate
from fedshift.runtime.tracking import registry as tracking
from fedshift.runtime.transport import EvalRequest, RunIdentity, Transport, check_supported

log = logging.getLogger("fedshift.runtime")


@dataclass
class LoopOptions:
    """How the loop treats its clients (not part of the experiment config, so a run's
    config digest is the same whatever the transport)."""

    #: replies a round needs when clients are lost (None: every sampled client)
    min_clients: int | None = None
    #: show the round lines on the terminal (the Flower ServerApp's log: no progress bar)
    round_log: bool = False
    #: appended to the progress label, e.g. " (flower)"
    label_suffix: str = ""
    #: the command that continues the run after a signal, if not ``fedshift run --resume DIR``
    resume_hint: str = ""
    #: the run's signal gate where its signals arrive elsewhere (a loop in a thread:
    #: :meth:`~fedshift.runtime.stopping.SignalGate.forwarded`); None: its own
    gate: SignalGate | None = None


def sample_clients(ids: list[str], fraction: float, seed: int, rnd: int) -> list[str]:
    """The clients of round ``rnd``: ``max(1, round(fraction * N))`` of ``ids`` drawn from
    the run's ``sample`` stream of that round, kept in ``ids`` order."""
    m = max(1, round(fraction * len(ids)))
    if m >= len(ids):
        return list(ids)
    perm = torch.randperm(len(ids), generator=generator(seed, "sample", rnd))
    return [ids[i] for i in sorted(perm[:m].tolist())]


class RoundLoop:
    """One run over a :class:`~fedshift.runtime.transport.Transport` (module docstring);
    ``hooks``: called after the run's own (:func:`~fedshift.runtime.lifecycle.run_hooks`)."""

    def __init__(
        self,
        cfg: RunConfig,
        run_dir: str | Path,
        transport: Transport,
        progress: bool = True,
        options: LoopOptions | None = None,
        hooks: Iterable[Hook] = (),
    ) -> None:
        tracking.check_trackers(cfg.track)  # a missing package fails before anything loads
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.progress = progress
        self.options = options or LoopOptions()
        self.identity = RunIdentity(key=uuid.uuid4().hex)
        check_supported(transport, cfg)  # secure aggregation, privacy: declared by the transport
        self.dp = UpdatePrivacy.of(cfg)  # privacy.updates=client: clipped replies, noisy mean
        transport = transport if self.dp is None else self.dp.wrap(transport)
        self.secure = SecureAggregation.of(cfg)  # federation.secure_aggregation: masked replies
        self.transport = transport if self.secure is None else self.secure.wrap(transport)
        exp, self.server = start_experiment(cfg, self.transport, self.identity)
        self.exp, self.fed = exp, exp.fed  # the federation as placed on the run's device
        self.task, self.holdout, self.model = exp.task, exp.holdout, exp.model
        self.implied, self.train_clients, self.algo = exp.implied, exp.train_clients, exp.algo
        self.pipeline, self.kinds, self.device = exp.pipeline, exp.kinds, exp.device
        self.ledger, self.last_round, self.wall_before = Ledger(), 0, 0.0
        self.records: list[MetricRow] = []  # the metrics rows of the rounds run so far
        #: the setup exchange (round 0) has completed, or there is none
        self.setup_complete = not self.algo.needs_setup
        self._undo: tuple[dict, int] | None = None  # (server, ledger rows) at the round start
        self.gate = self.options.gate or SignalGate()  # SIGINT / SIGTERM: a clean stop
        self.checkpoints = Checkpointing(self.run_dir, self.gate, self.identity)
        self.t0 = time.perf_counter()  # since when the run's wall_s has not been counted
        self.provenance: dict | None = None  # summary.json's "provenance" (set by run)
        self.extra_hooks = list(hooks)
        self.hooks = Hooks([])  # the run's hooks, made when it starts (run_hooks)
        self.stop: Stop | None = None  # where train.patience stopped the run

    @property
    def label(self) -> str:
        """``<algorithm> s<seed>``: the progress bar's and the convergence plot's title."""
        return f"{self.cfg.algorithm.name} s{self.cfg.seed}{self.options.label_suffix}"

    # ------------------------------------------------------------------ one round
    def sample(self, rnd: int) -> list[str]:
        return sample_clients(
            list(self.train_clients), self.cfg.federation.sample_fraction, self.cfg.seed, rnd
        )

    def _down(self, rnd: int):
        def down(cid: str) -> Payload:
            payload = self.algo.broadcast(self.server, rnd, cid)
            if self.algo.communicates:
                self.ledger.record(rnd, cid, "down", payload)
            return payload

        return down

    def _receive(self, rnd: int, cid: str, up: Payload) -> None:
        check_reply(rnd, cid, up)
        if self.algo.communicates:
            self.ledger.record(rnd, cid, "up", up)

    def client_round(self, rnd: int, cid: str) -> Payload:
        """One client's work of round ``rnd`` (broadcast, local update, checks), without
        aggregation: what tests and benchmarks drive step by step."""
        replies, lost = self.transport.train(rnd, [cid], self._down(rnd))
        if cid not in replies:
            raise FedshiftError(f"round {rnd}: client {cid!r} was lost")
        self._receive(rnd, cid, replies[cid])
        return replies[cid]

    def run_round(self, rnd: int) -> dict[str, dict]:
        """Round ``rnd``: sample, train, check, aggregate; returns the replies' metrics."""
        sampled = self.sample(rnd)
        replies, lost = self.transport.train(rnd, sampled, self._down(rnd))
        self.need(rnd, "aggregation", sampled, len(replies), lost)
        ups = []
        for cid in sampled:
            if cid in replies:
                self._receive(rnd, cid, replies[cid])
                ups.append((cid, replies[cid]))
        sums = ups if self.secure is None else self.secure.combine(rnd, sampled, ups)
        if self.dp is not None:  # privacy.updates: the noisy mean of the clipped updates
            sums = self.dp.combine(rnd, sampled, sums)
        self.algo.aggregate(self.server, rnd, sums)  # secure: the masked replies' sum only
        return {cid: up.metrics for cid, up in ups}

    def need(self, rnd: int, what: str, asked: list[str], got: int, lost: list[str]) -> None:
        """Stop unless enough of ``asked`` replied (``min_clients``; all if unset)."""
        if not lost:
            return
        need = len(asked) if self.options.min_clients is None else self.options.min_clients
        if got >= min(need, len(asked)):
            log.warning(
                "round %d: %s without lost client(s) %s (%d of %d replied, min-clients %d)",
                rnd, what, lost, got, len(asked), need,
            )  # fmt: skip
            return
        raise FedshiftError(
            f"round {rnd}: {what} needs {need} of the {len(asked)} sampled clients but only "
            f"{got} replied; lost (gone, crashed or silent past the timeout): {', '.join(lost)}. "
            "Restart those clients and resume the run (`--resume`), or let rounds complete "
            "with fewer clients (`--min-clients`)."
        )

    def setup_exchange(self) -> None:
        """Round 0: every client sends its augments' setup records (FedRDN's statistics) and
        receives what the server shares back. Recorded in the ledger as round 0."""
        algo, trains = self.algo, list(self.train_clients)
        ups, lost = self.transport.setup_reply(trains)
        if lost:
            raise FedshiftError(
                f"setup exchange: client(s) {lost} did not reply; every client must send its "
                "setup statistics before round 1. Restart those clients and the run."
            )
        for cid in trains:
            self.ledger.record(0, cid, "up", ups[cid])
        algo.setup_aggregate(self.server, [(cid, ups[cid]) for cid in trains])
        downs = {}
        for cid in [*trains, *self.holdout]:
            downs[cid] = algo.setup_broadcast(self.server, cid)
            self.ledger.record(0, cid, "down", downs[cid])
        lost = self.transport.setup_receive(downs)
        if lost:
            raise FedshiftError(f"setup exchange: client(s) {lost} did not take the statistics")
        self.setup_complete = True

    # ------------------------------------------------------------------ evaluation
    def evaluate_round(self, rnd: int, train_metrics: dict[str, dict]) -> list[MetricRow]:
        algo, clients = self.algo, self.fed.client_names
        request = EvalRequest(algo.global_weights(self.server))
        if algo.has_personal_model:
            # a held-out client has no personal model (protocol new-site gives its answer)
            views = {c: algo.server_view(self.server, c) for c in clients if c not in self.holdout}
            request.views = views
        for cid in self.holdout:  # a client that never trains gets what it needs to evaluate
            request.extra[cid] = algo.eval_broadcast(self.server, cid)
        scores, lost = self.transport.evaluate(rnd, clients, request)
        if not scores:
            raise FedshiftError(f"round {rnd}: no client replied to the evaluation")
        return [
            metric_row(rnd, cid, holdout=cid in self.holdout, train=train_metrics.get(cid),
                       scores=scores.get(cid))
            for cid in clients
        ]  # fmt: skip

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict:
        """The run's state after its last round (``checkpoint.pt``), with its hooks' keys."""
        return {
            "round": self.last_round,
            "server": self.server,
            "clients": self.transport.state_dict(),
            "ledger": self.ledger.state_dict(),
            "records": self.records,
            "rng": rng_state(),
            "wall_s": self.wall_before,
            "config": self.cfg.to_dict(),
            "run_key": self.identity.key,
            **self.hooks.state_dict(),
        }

    def save_checkpoint(self) -> None:
        """``checkpoint.pt``: the state of the last whole round (when
        :class:`~fedshift.runtime.checkpointing.Checkpointing` says, and after a signal)."""
        self.clock()
        self.checkpoints.save(self.state_dict(), self.hooks)

    def clock(self) -> None:
        """Count the time since the last count into the run's ``wall_s``."""
        now = time.perf_counter()
        self.wall_before += now - self.t0
        self.t0 = now

    def load_checkpoint(self) -> dict:
        """Load ``checkpoint.pt``: the run continues after its round (returns its dict;
        :func:`fedshift.runtime.checkpointing.restore`)."""
        return restore(self)

    # ------------------------------------------------------------------ the loop
    def run(
        self, resume: bool = False, stop_after: int | None = None, rounds: int | None = None
    ) -> RunResult:
        """Run to ``train.rounds`` (or its early stop). ``resume``: continue from
        ``checkpoint.pt`` (none, killed during set-up: it starts again); ``rounds``: with
        ``resume``, extend to that many rounds (it ends as a run of ``rounds`` from the start);
        ``stop_after``: stop with :class:`RunInterrupted` after that round (tests). What a run
        does around its rounds: :func:`fedshift.runtime.lifecycle.run_to_end`."""
        return run_to_end(self, resume, stop_after, rounds)

    def train_rounds(self, stop_after: int | None) -> None:
        """The rounds after ``last_round`` up to ``train.rounds`` or the early stop, each
        handed to the hooks, then checkpointed when due; ``stop_after``: as :meth:`run`'s."""
        rounds, every = self.cfg.train.rounds, self.cfg.eval.every
        self.t0 = time.perf_counter()
        self.stop = self._early_stop()  # a resumed run that had stopped trains no further
        last = rounds if self.stop is None else self.last_round
        for rnd in range(self.last_round + 1, last + 1):
            self.gate.poll()  # a signal recorded for a loop in another thread
            mark = len(self.ledger.rows)  # the round's first ledger row
            self._undo = (copy.deepcopy(self.server), mark)
            self.transport.begin_round(self.sample(rnd))
            train_metrics = self.run_round(rnd)
            rows = None
            if rnd % every == 0 or rnd == rounds:
                rows = self.evaluate_round(rnd, train_metrics)
            self._commit(rnd, rows)
            self.stop = self._early_stop() if rows is not None else None
            ledger_rows = self.ledger.rows[mark:]  # the round's own
            self.hooks.log_round(RoundRecord.of(rnd, train_metrics, rows, ledger_rows, self.kinds))
            if self.checkpoints.due(rnd, self.cfg, self.stop is not None):  # after every hook
                self.save_checkpoint()
            if self.stop is not None:
                log.info("%s", self.stop.describe(self.task.primary.name))
                return
            if stop_after is not None and rnd >= stop_after and rnd < rounds:
                raise RunInterrupted(f"stopped after round {rnd} (stop_after)")

    def _early_stop(self) -> Stop | None:  # over the rows so far: a stopped run stays so
        return stop_of(self.cfg, self.records, self.kinds[0], self.task.primary.name)

    def _commit(self, rnd: int, rows: list[MetricRow] | None) -> None:
        """Round ``rnd`` is whole: drop the undo, keep its rows, hand them to the hooks."""
        self._undo = None
        self.transport.begin_round([])  # nothing to undo any more
        self.last_round = rnd
        if rows is not None:
            self.records.extend(rows)
            self.hooks.evaluated(rnd, rows)

    def save_interrupted(self) -> int | None:
        """After a signal: undo the round in progress and save the last whole round. A
        signal during the setup exchange leaves nothing to save: a half-done exchange
        (statistics sent but not yet received back) must not be checkpointed."""
        self.gate.stopping = True
        if self._undo is not None:
            server, rows = self._undo
            self.server = server
            del self.ledger.rows[rows:]
            self.transport.rollback()
            self._undo = None
        if self.last_round == 0 and not self.setup_complete:
            return None
        self.save_checkpoint()
        return self.last_round
