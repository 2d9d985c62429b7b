"""The pool transport (``run.workers``): a run's clients in long-lived worker processes. The
round loop's side (:mod:`.transport`: :class:`~.transport.WorkerPool`,
:class:`~.transport.PoolTransport`) and the workers' (:mod:`.worker`: the message format
and each worker's loop)."""
