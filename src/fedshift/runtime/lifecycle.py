"""A run around its rounds: what :meth:`RoundLoop.run <fedshift.runtime.loop.RoundLoop.run>`
does besides the round protocol.

:func:`run_to_end` locks the run directory for the call
(:mod:`fedshift.runtime.rundir.ownership`), sends its log records to ``run.log``
(:mod:`fedshift.core.logs`), loads the checkpoint of a resumed run
(:func:`~fedshift.runtime.checkpointing.restore`) and extends it (``train.rounds``), writes
``config.yaml`` and the provenance, opens the run's hooks (:func:`run_hooks`, in their
order), runs the setup exchange and the rounds, fills the finished run's record
(:func:`run_record`: what ``summary.json``, ``ledger.json`` and ``convergence.png`` are
written from) and, after SIGINT / SIGTERM, saves the last whole round and raises
:class:`~fedshift.runtime.stopping.RunSignal`.
"""

from __future__ import annotations

import logging
import time
from contextlib import nullcontext
from typing import TYPE_CHECKING

from fedshift.core.config import dump_config
from fedshift.core.files import check_folder
from fedshift.core.logs import run_log, showing_console
from fedshift.eval.summary import RunRecord
from fedshift.runtime.checkpointing import extended
from fedshift.runtime.hooks import Hook, Hooks, ModelSelection, ProgressLine
from fedshift.runtime.rundir.checkpoint_io import CHECKPOINT
from fedshift.runtime.rundir.ownership import hold_run
from fedshift.runtime.rundir.results import MetricsFile, ResultFiles, RunResult
from fedshift.runtime.stopping import Caught, RunSignal
from fedshift.runtime.tracking import registry as tracking
from fedshift.runtime.tracking import trackers as track

if TYPE_CHECKING:
    from fedshift.runtime.loop import RoundLoop

__all__ = ["run_hooks", "run_record", "run_to_end"]

log = logging.getLogger("fedshift.runtime")


def run_to_end(
    run: RoundLoop, resume: bool, stop_after: int | None, rounds: int | None
) -> RunResult:
    """Run ``run`` to ``train.rounds`` or its early stop (arguments:
    :meth:`~fedshift.runtime.loop.RoundLoop.run`), its directory locked and its log records
    in ``run.log`` for the call."""
    shown = run.options.round_log and not run.progress
    console = showing_console() if shown else nullcontext()
    with hold_run(run.run_dir), run_log(run.run_dir), console:
        try:
            return _run(run, resume, stop_after, rounds)
        except Exception as e:  # the caller reports it: into run.log only
            log.error("stopped: %s", e, extra={"console": False})
            raise


def _run(run: RoundLoop, resume: bool, stop_after: int | None, rounds: int | None) -> RunResult:
    check_folder(run.run_dir)  # hold_run refused a link; a link planted inside too
    resumed = resume and (run.run_dir / CHECKPOINT).is_file()
    # on the terminal where a console shows it (the Flower ServerApp prints its own)
    shown = not run.options.round_log
    log.info("run directory %s", run.run_dir.resolve(), extra={"console": shown})
    ck = run.load_checkpoint() if resumed else None
    if rounds is not None:
        depends = run.algo.algorithm.depends_on_rounds
        run.cfg, run.records = extended(
            run.cfg, run.records, run.last_round, depends, run.run_dir, rounds
        )
    if not resumed:
        dump_config(run.cfg, run.run_dir / "config.yaml")
    run.provenance = track.provenance(track.utc_now(), run.last_round if resumed else None)
    log.info("%s", track.describe_start(run, resumed))
    run.t0 = time.perf_counter()
    run.hooks = Hooks(run_hooks(run))
    run.checkpoints.start()
    if ck is not None:
        run.hooks.resume(ck)
    try:
        with run.gate.installed():
            run.gate.poll()
            if not resumed and run.algo.needs_setup:
                run.setup_exchange()
            run.hooks.open(run.last_round, run.records, resumed)
            run.train_rounds(stop_after)
        run.clock()
        record = run_record(run)
        run.hooks.end(record)
    except Caught as caught:
        saved = run.save_interrupted()
        stop = RunSignal(caught.signum, run.run_dir, saved, run.options.resume_hint)
        log.info("stopped by %s", stop)
        raise stop from None
    finally:
        run.hooks.close()
    log.info("%s", track.describe_end(record.summary))
    return RunResult(run.run_dir, record.summary)


def run_hooks(run: RoundLoop) -> list[Hook]:
    """``run``'s hooks, in the order they are called: ``metrics.jsonl``, ``selected.pt``, the
    trackers (``track``), the round line and progress bar, ``summary.json`` and the other
    result files, then the caller's (``RoundLoop(hooks=...)``). ``checkpoint.pt`` is the
    loop's own, after them all (:mod:`fedshift.runtime.checkpointing`)."""
    cfg = run.cfg
    console = run.options.round_log and not run.progress
    metric = run.task.primary.name
    return [
        MetricsFile(run.run_dir),
        ModelSelection(run),
        *tracking.trackers(run.run_dir, cfg.track, cfg.to_dict()),
        ProgressLine(run.label, cfg.train.rounds, metric, run.progress, console),
        ResultFiles(),
        *run.extra_hooks,
    ]


def run_record(run: RoundLoop) -> RunRecord:
    """The finished ``run``, typed: what ``summary.json`` is written from."""
    info = run.transport.info()
    if info is not None:
        info = {**info, "device": str(run.device), **run.exp.placement}
    end = None if run.provenance is None else {**run.provenance, "end": track.utc_now()}
    model = run.model
    return RunRecord(
        config=run.cfg,
        run_dir=run.run_dir,
        label=run.label,
        task=run.task,
        kinds=list(run.kinds),
        clients=run.fed.client_names,
        implied=list(run.implied),
        dh=run.fed.info.get("dh"),
        weighting=run.algo.algorithm.weighting,
        model_params=sum(p.numel() for p in model.parameters()),
        model_bytes=sum(t.numel() * t.element_size() for t in model.state_dict().values()),
        records=run.records,
        ledger=run.ledger,
        wall_s=run.wall_before,
        runtime=info,
        provenance=end,
        domain_mix=run.fed.info.get("domain_mix"),
        stopped_at=run.last_round,
        stop=run.stop,
        **run.exp.record_extras(run.server, run.last_round),
    )
