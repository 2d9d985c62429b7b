"""The ServerApp side: the round loop of :mod:`fedshift.runtime.loop` over a Flower ``Grid``.

:class:`FlowerServer` runs one experiment with every client behind a SuperNode: the same
:class:`~fedshift.runtime.loop.RoundLoop` as ``fedshift run`` (sampling, aggregation, the
ledger, evaluation rows, model selection, checkpoints and resume), with
:class:`~fedshift.flower.transport.GridTransport` delivering the messages. Its run directory
holds what a native run's does, plus ``summary["runtime"]`` (Flower mode, nodes, lost clients,
evaluation bytes). A run whose ServerApp was stopped resumes with ``resume=True`` (its
SuperNodes restore each client's state from their per-round snapshots).
"""

from __future__ import annotations

from pathlib import Path

from flwr.serverapp import Grid

from fedshift.core.config import RunConfig
from fedshift.core.errors import ConfigError
from fedshift.flower.transport import FlowerOptions, GridTransport
from fedshift.runtime.loop import LoopOptions, RoundLoop
from fedshift.runtime.rundir.results import RunResult
from fedshift.runtime.stopping import Caught, RunSignal, SignalGate
from fedshift.runtime.transport import check_supported

__all__ = ["FlowerOptions", "FlowerServer"]


class FlowerServer:
    """One run over a Flower ``Grid`` (see the module docstring)."""

    def __init__(
        self,
        cfg: RunConfig,
        run_dir: str | Path,
        options: FlowerOptions | None = None,
        progress: bool = True,
        gate: SignalGate | None = None,
    ) -> None:
        if cfg.algorithm.name in ("local", "central"):
            raise ConfigError(
                f"config key 'algorithm.name': {cfg.algorithm.name!r} exchanges nothing "
                "between clients and server; run it with `fedshift run`, not on Flower"
            )
        if cfg.federation.secure_aggregation:  # before any node starts
            from fedshift.flower.secagg import workflow_params
            from fedshift.runtime.secagg import FixedPoint

            fed = cfg.federation
            workflow_params(FixedPoint(fed.secagg_frac_bits, fed.secagg_modulus_bits))
        # before any node starts: what GridTransport does not declare (privacy.epsilon,
        # untested on Flower yet)
        check_supported(GridTransport, cfg, "run it with `fedshift run`, or remove it")
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.options = options or FlowerOptions()
        self.options.check()
        self.progress = progress
        self.loop: RoundLoop | None = None
        #: SIGINT / SIGTERM of a ServerApp in a thread of its own (a simulation on Ray):
        #: recorded by the main thread (SignalGate.forwarded), acted on here
        self.gate = gate

    def run(self, grid: Grid, resume: bool = False, stop_after: int | None = None) -> RunResult:
        """Run (or with ``resume``, continue from its checkpoint) to ``train.rounds``."""
        gate = self.gate or SignalGate()
        transport = GridTransport(grid, self.options, stop_check=gate.poll)
        where = self.run_dir
        if self.options.continue_with:
            hint = self.options.continue_with.replace("{run_dir}", str(where))
        elif self.options.mode.startswith("simulation"):
            hint = f"fedshift flower simulate --resume {where}"
        else:
            hint = f"a Flower run of the same app with the run config resume={where}"
        options = LoopOptions(
            min_clients=self.options.min_clients,
            round_log=True,
            label_suffix=" (flower)",
            resume_hint=hint,
            gate=gate,
        )
        try:
            try:
                self.loop = RoundLoop(self.cfg, self.run_dir, transport, self.progress, options)
            except Caught as caught:  # while waiting for the nodes: nothing ran, nothing to save
                raise RunSignal(caught.signum, self.run_dir, None, hint) from None
            return self.loop.run(resume=resume, stop_after=stop_after)
        finally:
            transport.close()
