"""The registry of transports (:data:`TRANSPORTS`) and :func:`make_transport`, the transport
of a run on this machine.

A transport (:class:`~fedshift.runtime.transport.Transport`) is registered the way every
component is (:class:`~fedshift.core.registry.Registry`): one ``TRANSPORTS.add(cls.name,
cls, cls.Params)`` per class, the three that run on this machine below (Flower's
``GridTransport`` registers itself in :mod:`fedshift.flower.transport`, which the ``flower``
commands import). Each class declares (:mod:`fedshift.runtime.transport`, the module
docstring) its ``name``, its ``Params``, the ``run.executor`` value that selects it, whether
it runs the clients in ``worker_processes``, and the features it ``supports`` (secure
aggregation, the privacy budget); one that a ``run.executor`` selects builds itself for a
run with the class method ``create(cfg, federation, workers, pool)``.

Selection (:func:`transport_entry`) keeps the config keys as they were: ``run.executor``
names how a process computes its clients (``sequential``, ``vmap``), ``run.workers`` how
many processes; the registered transport of that executor that runs worker processes is
chosen for more than one worker (or a running pool), the one that does not otherwise:

* ``run.executor=sequential``: ``native`` (one process), ``pool`` (``run.workers`` > 1, or
  ``auto`` resolved by :func:`~fedshift.runtime.cores.resolve_workers` to more than one);
* ``run.executor=vmap``: ``vmap`` (one process; ``auto`` means one, more is refused).

Secure aggregation and DP-FedAvg wrap whichever transport runs (the round loop does, after
:func:`~fedshift.runtime.transport.check_supported`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fedshift.core.errors import ConfigError
from fedshift.core.registry import Entry, Registry
from fedshift.runtime.cores import resolve_workers
from fedshift.runtime.native import InProcessTransport
from fedshift.runtime.pool.transport import PoolTransport, WorkerPool
from fedshift.runtime.vmap import VmapTransport

if TYPE_CHECKING:
    from fedshift.core.config import RunConfig
    from fedshift.core.federation import Federation
    from fedshift.runtime.transport import Transport

__all__ = ["TRANSPORTS", "make_transport", "transport_entry"]


#: every transport, by name: classes with the declarations above
TRANSPORTS: Registry[Any] = Registry("transport")
for _cls in (InProcessTransport, VmapTransport, PoolTransport):
    TRANSPORTS.add(_cls.name, _cls, _cls.Params)


def transport_entry(
    cfg: RunConfig, workers: int | str | None = None, pool: WorkerPool | None = None
) -> tuple[Entry[Any], int]:
    """The registered transport of a run on this machine (module docstring) and the worker
    processes it runs: ``pool`` (a running :class:`WorkerPool`), or ``workers`` (default:
    ``run.workers``; ``auto``: see :func:`~fedshift.runtime.cores.resolve_workers`)."""
    executor = cfg.run.executor
    choices = [e for e in TRANSPORTS.entries() if getattr(e.obj, "executor", None) == executor]
    if not choices:
        known = sorted({str(e.obj.executor) for e in TRANSPORTS.entries() if e.obj.executor})
        raise ConfigError(
            f"config key 'run.executor': no registered transport computes executor "
            f"{executor!r}; valid: {', '.join(known)} (transports: {', '.join(TRANSPORTS.names())})"
        )
    requested = cfg.run.workers if workers is None else workers
    multi = [e for e in choices if e.obj.worker_processes]
    single = [e for e in choices if not e.obj.worker_processes]
    if not multi:  # one process only: auto means one, more is refused
        n = 1 if requested == "auto" else resolve_workers(requested)
        if pool is not None or n > 1:
            raise ConfigError(
                f"config key 'run.executor': {executor} trains every client of a round together "
                f"in one process; it does not combine with {n if pool is None else pool.size} "
                "worker processes (set run.workers=1 or auto, or run.executor=sequential)"
            )
        return single[0], 1
    if pool is not None:
        return multi[0], pool.size
    n = resolve_workers(requested, cfg.run.threads, cfg.device)
    if n > 1 or not single:
        return multi[0], n
    return single[0], 1


def make_transport(
    cfg: RunConfig,
    federation: Federation | None = None,
    workers: int | str | None = None,
    pool: WorkerPool | None = None,
) -> Transport:
    """The transport of a run on this machine (:func:`transport_entry`), built: in this
    process, or in ``pool`` (a running :class:`WorkerPool`, left running), or in ``workers``
    processes it starts. ``federation``: a pre-loaded dataset (tests, benchmarks)."""
    entry, n = transport_entry(cfg, workers, pool)
    return entry.obj.create(cfg, federation, n, pool)
