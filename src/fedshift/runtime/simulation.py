"""The single-machine simulator: the round loop, sampling, evaluation, checkpoints.

One :class:`Simulation` is one run. Each round it samples clients, sends each the
algorithm's broadcast, runs the algorithm's ``local_update`` in a :class:`ClientContext`,
records every payload in the ledger, checks replies for non-finite values and lets the
algorithm aggregate. Every ``eval.every`` rounds (and at the last round) it evaluates every
client's validation and test split with the global model and, where the algorithm keeps
client-local tensors, with each client's personalised model, on the task's metrics
(:mod:`fedshift.core.tasks`: accuracy, or foreground Dice and mean Dice incl. background). Model
selection picks the round with the best mean *validation* primary metric (never test).

Randomness is derived from (seed, purpose, round, client) (:mod:`fedshift.core.seeding`),
so a run resumed from a checkpoint ends with exactly the numbers of an uninterrupted one.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from fedshift.core.config import RunConfig, dump_config
from fedshift.core.context import ClientContext
from fedshift.core.errors import FedshiftError, TrainingError
from fedshift.core.payload import Ledger, Payload
from fedshift.core.seeding import generator, rng_state, seed_global, set_rng_state
from fedshift.data import load_dataset
from fedshift.data.base import Federation
from fedshift.data.partition import apply_partition
from fedshift.eval.summary import summarize
from fedshift.runtime.executor import SequentialExecutor
from fedshift.runtime.experiment import (
    build_experiment,
    init_client_state,
    score_client,
)

CHECKPOINT = "checkpoint.pt"


class RunInterrupted(FedshiftError):
    """Raised by ``stop_after`` to emulate a run killed after a given round (tests, demos)."""


@dataclass
class RunResult:
    run_dir: Path
    summary: dict


def new_run_dir(cfg: RunConfig, out: str | Path | None = None) -> Path:
    """``<out>/<name>/<algorithm>-<dataset>-seed<seed>``, with ``-2``, ``-3``... if taken."""
    root = Path(out or cfg.out) / cfg.name
    base = f"{cfg.algorithm['name']}-{cfg.dataset['name']}-seed{cfg.seed}"
    path, i = root / base, 1
    while path.exists():
        i += 1
        path = root / f"{base}-{i}"
    return path


class Simulation:
    def __init__(
        self,
        cfg: RunConfig,
        run_dir: Path,
        federation: Federation | None = None,
        progress: bool = True,
    ) -> None:
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.progress = progress
        if federation is None:
            self.fed = load_dataset(cfg.dataset, cfg.partition)
        else:  # a pre-loaded dataset (tests, benchmarks): the partition still applies
            self.fed = apply_partition(federation, cfg.partition)
        fed_cfg = cfg.federation
        self.fed = self.fed.with_train_fraction(fed_cfg.data_fraction)
        exp = build_experiment(cfg, self.fed)
        self.exp = exp
        self.device = exp.device
        self.task, self.holdout, self.model = exp.task, exp.holdout, exp.model
        self.implied, self.train_clients, self.algo = exp.implied, exp.train_clients, exp.algo
        self.pipeline, self.kinds = exp.pipeline, exp.kinds
        self.executor = SequentialExecutor()
        self.server = self.algo.init_server(self.model)
        self.algo.register_clients(list(self.train_clients))
        self.states = {
            cid: init_client_state(exp, cfg.seed, cid, data)
            for cid, data in self.train_clients.items()
        }
        for cid in self.holdout:  # never trains; its augments' local state (own statistics)
            self.states[cid] = init_client_state(exp, cfg.seed, cid, self.fed.client(cid))
        self.ledger = Ledger()
        self.records: list[dict] = []
        self.last_round = 0
        self.wall_before = 0.0

    # ------------------------------------------------------------------ one round
    def sample(self, rnd: int) -> list[str]:
        return sample_clients(
            list(self.train_clients), self.cfg.federation.sample_fraction, self.cfg.seed, rnd
        )

    def client_round(self, rnd: int, cid: str) -> Payload:
        algo, seed = self.algo, self.cfg.seed
        down = algo.broadcast(self.server, rnd, cid)
        if algo.communicates:
            self.ledger.record(rnd, cid, "down", down)
        seed_global(seed, "client", rnd, cid)
        ctx = ClientContext(
            cid=cid,
            round=rnd,
            data=self.train_clients[cid],
            model=self.model,
            train=self.cfg.train,
            pipeline=self.pipeline,
            generator=generator(seed, "batches", rnd, cid),
            device=self.device,
            state=self.states[cid],
            task=self.task,
        )
        up = algo.local_update(ctx, down, self.states[cid])
        check_reply(rnd, cid, up)
        if algo.communicates:
            self.ledger.record(rnd, cid, "up", up)
        return up

    def setup_exchange(self) -> None:
        """Round 0: every client sends its augments' setup records (FedRDN's statistics) and
        receives what the server shares back. Recorded in the ledger as round 0."""
        replies = []
        for cid in self.train_clients:
            up = self.algo.setup_reply(cid, self.states[cid])
            self.ledger.record(0, cid, "up", up)
            replies.append((cid, up))
        self.algo.setup_aggregate(self.server, replies)
        for cid in [*self.train_clients, *self.holdout]:
            down = self.algo.setup_broadcast(self.server, cid)
            self.ledger.record(0, cid, "down", down)
            self.algo.setup_receive(down, self.states[cid])

    def run_round(self, rnd: int) -> dict[str, dict]:
        sampled = self.sample(rnd)
        replies = self.executor.map(lambda cid: (cid, self.client_round(rnd, cid)), sampled)
        self.algo.aggregate(self.server, rnd, replies)
        return {cid: up.metrics for cid, up in replies}

    # ------------------------------------------------------------------ evaluation
    def evaluate_round(self, rnd: int, train_metrics: dict[str, dict]) -> list[dict]:
        bs, dev = self.cfg.eval.batch_size, self.device
        rows: list[dict] = []
        clients = self.fed.clients
        for c in clients:
            row: dict[str, Any] = {"round": rnd, "client": c.name}
            if c.name in self.holdout:
                row["holdout"] = True
            if c.name in train_metrics:
                row["train_loss"] = train_metrics[c.name].get("train_loss")
            rows.append(row)
        for cid in self.holdout:  # a client that never trains gets what it needs to evaluate
            self.algo.eval_receive(self.algo.eval_broadcast(self.server, cid), self.states[cid])
        global_w = self.algo.global_weights(self.server)
        if global_w is not None:
            self.model.load_state_dict(global_w)
            for c, row in zip(clients, rows, strict=True):
                row["global"] = self._scores(c, bs, dev)
        if self.algo.has_personal_model:
            for c, row in zip(clients, rows, strict=True):
                self.model.load_state_dict(
                    self.algo.personal_weights(self.server, self.states[c.name])
                )
                row["personal"] = self._scores(c, bs, dev)
        return rows

    def weights_for(self, client: str, kind: str | None = None) -> dict[str, torch.Tensor]:
        """The state dict of ``client``'s model of ``kind`` (``personal`` / ``global``;
        default: the kind the run's tables evaluate)."""
        kind = kind or self.kinds[0]
        if kind not in self.kinds:
            raise FedshiftError(f"this run has no {kind} model (it has {self.kinds})")
        if kind == "global":
            return self.algo.global_weights(self.server)
        return self.algo.personal_weights(self.server, self.states[client])

    def _scores(self, client, bs: int, dev: torch.device) -> dict[str, float]:
        return score_client(self.exp, client, self.states.get(client.name), bs)

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict:
        return {
            "round": self.last_round,
            "server": self.server,
            "clients": self.states,
            "ledger": self.ledger.state_dict(),
            "records": self.records,
            "rng": rng_state(),
            "wall_s": self.wall_before,
            "config": self.cfg.to_dict(),
        }

    def save_checkpoint(self) -> None:
        tmp = self.run_dir / (CHECKPOINT + ".tmp")
        torch.save(self.state_dict(), tmp)
        os.replace(tmp, self.run_dir / CHECKPOINT)

    def load_checkpoint(self) -> None:
        path = self.run_dir / CHECKPOINT
        if not path.is_file():
            raise FedshiftError(
                f"{path} does not exist: the run stopped before its first checkpoint "
                "(set checkpoint.every to save more often); start it again instead"
            )
        ck = torch.load(path, map_location=self.device, weights_only=False)
        self.last_round = int(ck["round"])
        self.server = ck["server"]
        self.states = ck["clients"]
        self.ledger.load_state_dict(ck["ledger"])
        self.records = ck["records"]
        self.wall_before = float(ck["wall_s"])
        set_rng_state(ck["rng"])

    # ------------------------------------------------------------------ the loop
    def run(self, resume: bool = False, stop_after: int | None = None) -> RunResult:
        cfg = self.cfg
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if resume:
            self.load_checkpoint()
        else:
            dump_config(cfg, self.run_dir / "config.yaml")
            if self.algo.needs_setup:
                self.setup_exchange()
        self._rewrite_metrics()
        t0 = time.perf_counter()
        rounds = cfg.train.rounds
        label = f"{cfg.algorithm['name']} s{cfg.seed}"
        bar = tqdm(
            range(self.last_round + 1, rounds + 1),
            desc=label,
            initial=self.last_round,
            total=rounds,
            disable=not self.progress,
            leave=False,
            dynamic_ncols=True,
        )
        for rnd in bar:
            train_metrics = self.run_round(rnd)
            if rnd % cfg.eval.every == 0 or rnd == rounds:
                rows = self.evaluate_round(rnd, train_metrics)
                self.records.extend(rows)
                self._append_metrics(rows)
                kind, metric = self.kinds[0], self.task.primary.name
                val = sum(r[kind][f"val_{metric}"] for r in rows) / len(rows)
                bar.set_postfix_str(f"val {metric} {val:.3f}")
            self.last_round = rnd
            every = cfg.checkpoint.every
            if (every and rnd % every == 0) or rnd == rounds:
                self.wall_before += time.perf_counter() - t0
                t0 = time.perf_counter()
                self.save_checkpoint()
            if stop_after is not None and rnd >= stop_after and rnd < rounds:
                bar.close()
                raise RunInterrupted(f"stopped after round {rnd} (stop_after)")
        bar.close()
        self.wall_before += time.perf_counter() - t0
        return RunResult(self.run_dir, finish_run(self, label))

    # ------------------------------------------------------------------ files
    def _rewrite_metrics(self) -> None:
        write_metrics(self.run_dir, self.records)

    def _append_metrics(self, rows: list[dict]) -> None:
        write_metrics(self.run_dir, rows, append=True)


# ---------------------------------------------------------------------- shared by runtimes
def sample_clients(ids: list[str], fraction: float, seed: int, rnd: int) -> list[str]:
    """The clients of round ``rnd``: ``max(1, round(fraction * N))`` of ``ids`` drawn from
    the run's ``sample`` stream of that round, kept in ``ids`` order."""
    m = max(1, round(fraction * len(ids)))
    if m >= len(ids):
        return list(ids)
    perm = torch.randperm(len(ids), generator=generator(seed, "sample", rnd))
    return [ids[i] for i in sorted(perm[:m].tolist())]


def check_reply(rnd: int, cid: str, up: Payload) -> None:
    """Refuse a reply holding NaN/inf (or a non-finite training loss), naming the round, the
    client and the tensor."""
    bad = up.first_non_finite()
    loss = up.metrics.get("train_loss")
    if bad is not None or (loss is not None and not torch.isfinite(torch.tensor(loss))):
        what = f"tensor {bad!r}" if bad else f"train_loss={loss}"
        raise TrainingError(
            f"round {rnd}: client {cid!r} produced a non-finite update ({what}). "
            "Lower train.lr, check the input normalisation (input.mean/std) or the data."
        )


def write_metrics(run_dir: Path, rows: list[dict], append: bool = False) -> None:
    with open(Path(run_dir) / "metrics.jsonl", "a" if append else "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


def finish_run(run, label: str, extra: dict | None = None) -> dict:
    """Write ``summary.json`` (+ ``extra`` keys), ``ledger.json`` and ``convergence.png`` of
    a finished run (a :class:`Simulation` or a Flower server: anything with ``cfg``, ``fed``,
    ``model``, ``records``, ``kinds``, ``ledger``, ``task``, ``run_dir``, ``wall_before``)."""
    from fedshift.eval.plots import plot_convergence

    summary = summarize(run)
    summary.update(extra or {})
    run_dir = Path(run.run_dir)
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    ledger = run.ledger
    data = {
        "by_record": ledger.by_record(),
        "by_round": {str(k): v for k, v in ledger.by_round().items()},
        "total": {"up": ledger.total("up"), "down": ledger.total("down")},
    }
    (run_dir / "ledger.json").write_text(json.dumps(data, indent=2) + "\n")
    metric = run.task.primary
    plot_convergence(
        run.records, run.kinds, run_dir / "convergence.png", label, metric.name, metric.label
    )
    return summary


def run_experiment(
    cfg: RunConfig,
    out: str | Path | None = None,
    run_dir: Path | None = None,
    federation: Federation | None = None,
    progress: bool = True,
    stop_after: int | None = None,
) -> RunResult:
    """Run one resolved config to the end; returns the run directory and its summary."""
    run_dir = run_dir or new_run_dir(cfg, out)
    return Simulation(cfg, run_dir, federation, progress).run(stop_after=stop_after)


def load_finished(run_dir: str | Path, federation: Federation | None = None) -> Simulation:
    """A finished (or checkpointed) run rebuilt from its ``config.yaml`` and ``checkpoint.pt``:
    the federation, the model, the algorithm and every client's state as at the last
    checkpoint, ready to evaluate (pictures, cross-site matrices, features)."""
    from fedshift.catalog import resolve
    from fedshift.core.config import load_yaml

    run_dir = Path(run_dir)
    cfg_path = run_dir / "config.yaml"
    if not cfg_path.is_file() or not (run_dir / CHECKPOINT).is_file():
        raise FedshiftError(
            f"{run_dir} is not a finished fedshift run (it needs config.yaml and {CHECKPOINT})"
        )
    cfg = resolve(load_yaml(cfg_path), source=str(cfg_path))
    sim = Simulation(cfg, run_dir, federation, progress=False)
    sim.load_checkpoint()
    return sim


def resume_experiment(
    run_dir: str | Path,
    federation: Federation | None = None,
    progress: bool = True,
    stop_after: int | None = None,
) -> RunResult:
    """Continue a killed run from its last checkpoint, with its saved config."""
    from fedshift.catalog import resolve
    from fedshift.core.config import load_yaml

    run_dir = Path(run_dir)
    cfg_path = run_dir / "config.yaml"
    if not cfg_path.is_file():
        raise FedshiftError(f"{run_dir} is not a fedshift run directory (no config.yaml)")
    cfg = resolve(load_yaml(cfg_path), source=str(cfg_path))
    sim = Simulation(cfg, run_dir, federation, progress)
    return sim.run(resume=True, stop_after=stop_after)
