"""Helpers the tests share beyond ``conftest.py``'s fixtures: one same-run harness
(:mod:`support.same_run`) and a reply factory for aggregation tests (:mod:`support.replies`).
Imported as ``support.*``: ``tests/`` is on ``sys.path`` (pytest puts the root
``conftest.py``'s folder there)."""
