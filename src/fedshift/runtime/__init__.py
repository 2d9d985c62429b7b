"""The runtime: experiment building, one client's step, the round loop over a transport.

``experiment`` (the parts of one run), ``client`` (one client's training and evaluation, used
by every transport), ``transport`` (the interface the loop talks to), ``loop`` (the round loop:
sampling, aggregation, ledger, evaluation, model selection, checkpoints, signals), ``native``
(the in-process transport), ``pool`` / ``pool_worker`` (clients in worker processes,
``run.workers``), ``cores`` (how many processes and threads), ``simulation`` (the
single-machine run and its entry points), ``vmap`` (the in-process transport with a round's
clients vectorised), ``hooks`` (what a run does besides its round protocol: model selection,
metrics files, checkpoint timing, progress, trackers, the summary), ``results`` (run directory
files and their hooks), ``saved`` (a finished run rebuilt for evaluation).
"""
