"""The papers' claims ledger: ``claims/<paper>.yaml`` (:mod:`.spec`) evaluated against the
committed runs under ``results/`` (:mod:`.evaluate`, :mod:`.metrics`, :mod:`.scope`) by one
rubric (:mod:`.rubric`), rendered as docs/CLAIMS.md and docs/results/ (:mod:`.ledger`,
:mod:`.results_tables`); ``fedshift claims collect`` copies finished runs into ``results/``
(:mod:`.collect`) and :mod:`.commits` says which recorded commits git holds. Reads run files
through :mod:`fedshift.eval`; nothing here runs a model."""
