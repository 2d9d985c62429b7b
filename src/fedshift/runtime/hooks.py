"""What a run does besides its round protocol: :class:`Hook`, the one interface the round
loop (:mod:`fedshift.runtime.loop`) calls, and the hooks every run has.

The loop calls its hooks, in their list order, at these points of a run:

====================================  ===========================================================
``resume(state)``                     a checkpoint was loaded (its dict: a hook reads back what
                                      its :meth:`Hook.state_dict` put there)
``open(last_round, records, resumed)``  the run starts (after the setup exchange): ``records``
                                      are the metric rows of the checkpoint a resumed run
                                      continues after round ``last_round``
``evaluated(rnd, rows)``              round ``rnd`` is whole and was evaluated: its metric rows
``log_round(record)``                 round ``rnd`` is whole (:class:`RoundRecord`); a round
                                      rolled back after a signal is never seen
``checkpointed(rnd)``                 ``checkpoint.pt`` now holds every round up to ``rnd``
                                      (called with SIGINT / SIGTERM held off, as the write is)
``state_dict()``                      what the hook adds to ``checkpoint.pt`` (top-level keys)
``end(record)``                       the run finished (:class:`~fedshift.eval.summary.RunRecord`)
``close()``                           the run stops, finished or not (only hooks that opened)
====================================  ===========================================================

Every run's hooks, in order (:func:`fedshift.runtime.lifecycle.run_hooks`):
``metrics.jsonl`` (:class:`~fedshift.runtime.rundir.results.MetricsFile`), ``selected.pt``
(:class:`ModelSelection`), the trackers (``metrics.csv`` and the config key ``track``'s:
:mod:`fedshift.runtime.tracking.registry`), the round line and progress bar
(:class:`ProgressLine`), ``summary.json`` / ``ledger.json`` / ``convergence.png``
(:class:`~fedshift.runtime.rundir.results.ResultFiles`) and any the caller adds
(``RoundLoop(hooks=...)``: a bench cell's progress report). ``checkpoint.pt`` is not a hook's:
the loop writes it after every hook has seen the round it makes durable
(:mod:`fedshift.runtime.checkpointing`). A hook never changes a run's numbers: it reads the
loop's state and writes files.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tqdm.auto import tqdm

from fedshift.core.rows import MetricRow, as_kind
from fedshift.eval.summary import select_round
from fedshift.runtime.rundir.checkpoint_io import SELECTED, config_digest

if TYPE_CHECKING:
    from fedshift.eval.summary import RunRecord
    from fedshift.runtime.loop import RoundLoop

__all__ = [
    "Hook",
    "Hooks",
    "ModelSelection",
    "ProgressLine",
    "RoundRecord",
    "round_line",
    "val_mean",
]

log = logging.getLogger("fedshift.runtime")


@dataclass
class RoundRecord:
    """What one whole round produced."""

    round: int
    #: train loss of each client's reply (clients whose reply had one)
    train_loss: dict[str, float]
    #: the evaluation rows (``metrics.jsonl`` lines) when the round was evaluated
    rows: list[MetricRow] | None = None
    bytes_up: int = 0
    bytes_down: int = 0
    #: model kinds the run evaluates, primary first
    kinds: list[str] = field(default_factory=list)
    #: how many sampled clients replied
    replies: int = 0

    @classmethod
    def of(
        cls,
        rnd: int,
        train_metrics: dict[str, dict],
        rows: list[MetricRow] | None,
        ledger_rows: list,
        kinds: list[str],
    ) -> RoundRecord:
        """Round ``rnd`` as the hooks see it: the replies' ``train_metrics``, the evaluation
        ``rows`` (None when not evaluated) and the bytes of the round's ``ledger_rows``."""
        sent = {"up": 0, "down": 0}
        for _, _, direction, _, nbytes in ledger_rows:
            sent[direction] = sent.get(direction, 0) + nbytes
        losses = {c: m["train_loss"] for c, m in train_metrics.items() if "train_loss" in m}
        replies = len(train_metrics)
        return cls(rnd, losses, rows, sent["up"], sent["down"], list(kinds), replies)


class Hook:
    """One thing a run does at defined points besides its round protocol (module
    docstring); every method does nothing unless overridden."""

    def resume(self, state: dict) -> None:
        """A checkpoint was loaded: ``state`` is its dict."""

    def open(self, last_round: int, records: list[MetricRow], resumed: bool) -> None:
        """The run starts (``resumed``: it continues after round ``last_round``, whose metric
        rows are ``records``; else it starts from round 1)."""

    def evaluated(self, rnd: int, rows: list[MetricRow]) -> None:
        """Round ``rnd`` is whole and was evaluated: ``rows`` are its metric rows (already in
        the loop's ``records``)."""

    def log_round(self, record: RoundRecord) -> None:
        """Round ``record.round`` is whole."""

    def checkpointed(self, rnd: int) -> None:
        """The run's checkpoint now holds every round up to ``rnd``: a resume never runs
        them again. Called with SIGINT / SIGTERM held off, as the checkpoint write is."""

    def state_dict(self) -> dict:
        """What the hook adds to ``checkpoint.pt`` (read back by :meth:`resume`)."""
        return {}

    def end(self, record: RunRecord) -> None:
        """The run finished."""

    def close(self) -> None:
        """The run stops, finished or not (called once for every hook that opened)."""


class Hooks:
    """A run's hooks, called together in their order; ``close`` closes every one that
    opened, the last opened first."""

    def __init__(self, hooks: Iterable[Hook]) -> None:
        self.hooks = list(hooks)
        self._opened: list[Hook] = []

    def resume(self, state: dict) -> None:
        for h in self.hooks:
            h.resume(state)

    def open(self, last_round: int, records: list[MetricRow], resumed: bool) -> None:
        for h in self.hooks:
            h.open(last_round, records, resumed)
            self._opened.append(h)

    def evaluated(self, rnd: int, rows: list[MetricRow]) -> None:
        for h in self.hooks:
            h.evaluated(rnd, rows)

    def log_round(self, record: RoundRecord) -> None:
        for h in self.hooks:
            h.log_round(record)

    def checkpointed(self, rnd: int) -> None:
        for h in self._opened:
            h.checkpointed(rnd)

    def state_dict(self) -> dict:
        out: dict = {}
        for h in self.hooks:
            out.update(h.state_dict())
        return out

    def end(self, record: RunRecord) -> None:
        for h in self.hooks:
            h.end(record)

    def close(self) -> None:
        while self._opened:
            self._opened.pop().close()


def val_mean(rows: list[MetricRow], kind: str, metric: str) -> float:
    """Mean validation ``metric`` of the ``kind`` model over the scored training clients
    (held-out and lost clients excluded, as in model selection)."""
    k = as_kind(kind)
    scored = [r[k][f"val_{metric}"] for r in rows if k in r and not r.get("holdout")]
    return sum(scored) / max(len(scored), 1)


def round_line(record: RoundRecord, rounds: int, metric: str) -> str:
    """The ``run.log`` line of one round: replies, mean train loss and, when evaluated, the
    mean validation primary metric of the primary model."""
    loss = list(record.train_loss.values())
    line = f"round {record.round}/{rounds}: {record.replies} replies"
    line += f", train loss {sum(loss) / len(loss):.4f}" if loss else ""
    if record.rows is not None:
        kind = record.kinds[0]
        line += f", val {metric} {val_mean(record.rows, kind, metric):.4f} ({kind})"
    return line


class ModelSelection(Hook):
    """``selected.pt``: the state at the best scheduled evaluation round so far (model
    selection on the mean validation primary metric of the primary model, earliest on ties:
    :func:`~fedshift.eval.summary.select_round`); the last round is in ``checkpoint.pt``.
    The round it holds is ``selected_round`` in ``checkpoint.pt``."""

    def __init__(self, run: RoundLoop) -> None:
        self.run = run
        self.selected_round: int | None = None

    def resume(self, state: dict) -> None:
        self.selected_round = state.get("selected_round")

    def state_dict(self) -> dict:
        return {"selected_round": self.selected_round}

    def evaluated(self, rnd: int, rows: list[MetricRow]) -> None:
        run = self.run
        every = run.cfg.eval.every
        if rnd % every:
            return  # the last round, evaluated because it is last: not a candidate
        scheduled = [r for r in run.records if r["round"] % every == 0]
        best = select_round(scheduled, run.kinds[0], run.task.primary.name)["best"]
        if best["round"] != rnd:
            return
        self.selected_round = rnd
        state: dict[str, Any] = {"round": rnd, "server": run.server}
        state["clients"] = run.transport.state_dict()
        # whose state this is: a selected.pt copied from another run is refused
        state["run_key"] = run.identity.key
        state["config_digest"] = config_digest(run.cfg.to_dict())
        run.checkpoints.write(state, SELECTED)


class ProgressLine(Hook):
    """One ``run.log`` line per round (on the terminal too where ``console``: the Flower
    ServerApp's log) and, where ``progress``, a tqdm bar labelled ``label``."""

    def __init__(self, label: str, rounds: int, metric: str, progress: bool, console: bool) -> None:
        self.label, self.rounds, self.metric = label, rounds, metric
        self.progress, self.console = progress, console
        self.bar: Any = None

    def open(self, last_round: int, records: list[MetricRow], resumed: bool) -> None:
        self.bar = tqdm(
            desc=self.label,
            initial=last_round,
            total=self.rounds,
            disable=not self.progress,
            leave=False,
            dynamic_ncols=True,
        )

    def log_round(self, record: RoundRecord) -> None:
        line = round_line(record, self.rounds, self.metric)
        if record.rows is not None:
            val = val_mean(record.rows, record.kinds[0], self.metric)
            self.bar.set_postfix_str(f"val {self.metric} {val:.3f}", refresh=False)
        self.bar.update(1)
        log.info("%s", line, extra={"console": self.console})

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
