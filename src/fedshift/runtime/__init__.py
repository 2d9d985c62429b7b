"""The runtime: experiment building, one client's step, the round loop over a transport.

``experiment`` (the parts of one run), ``client`` (one client's training and evaluation, used
by every transport), ``transport`` (the interface the loop talks to), ``loop`` (the round
protocol: sampling, aggregation, ledger, evaluation, the run's state, rollback after a
signal), ``checkpointing`` (when and how that state is written and read back),
``lifecycle`` (a run around its rounds: lock, logs, hooks, the finished run's record),
``hooks`` (the hook interface, model selection, progress), ``native`` (the in-process
transport), ``pool/`` (clients in worker processes, ``run.workers``), ``vmap`` (the
in-process transport with a round's clients vectorised), ``transports`` (their registry and
the lookup of a run's transport), ``secagg`` (secure aggregation),
``cores`` (how many processes and threads), ``simulation`` (the single-machine run and its
entry points), ``rundir/`` (a run directory's files: ownership, results, the checkpoint
format, a finished run rebuilt for evaluation), ``tracking/`` (the trackers and their
registry), ``parallel`` / ``progress`` (independent runs in worker processes), ``export`` /
``predictor`` / ``newsite`` (a trained model out of fedshift).
"""
