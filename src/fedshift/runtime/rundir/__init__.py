"""A run directory's files: who owns the directory (:mod:`.ownership`: claimed atomically,
locked while a process uses it), its result files (:mod:`.results`: the name,
``metrics.jsonl``, ``summary.json``, ``ledger.json``, ``convergence.png``), the one format of
every saved state (:mod:`.checkpoint_io`: ``checkpoint.pt``, ``selected.pt``, node
snapshots) and a finished run rebuilt from it (:mod:`.saved`)."""
