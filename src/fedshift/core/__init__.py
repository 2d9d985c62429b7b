"""fedshift's bottom layer: what every other package builds on.

``errors`` (the exceptions a user can act on), ``registry`` (name -> component lookups),
``config`` (the run-config schema, parsing, overrides and sweeps), ``payload`` (the message
protocol and the communication ledger), ``seeding`` (derived random streams), ``tasks``
(classification / segmentation losses and metrics), ``context`` (what a client sees while it
trains) and ``state`` (loading and saving run state without executing code).

The layer rule: a module of ``fedshift.core`` imports only the standard library, third-party
packages and other ``fedshift.core`` modules. Component packages (``data``, ``models``,
``algorithms``, ``augment``) import ``core``; ``catalog`` imports the components; ``eval``
imports those; ``runtime`` wires everything; ``flower`` is a transport of the runtime; the
command-line tools (``bench``, ``protocols``, ``cli``) sit on top.
``tests/test_layers.py`` enforces this.
"""
