"""The simulation engine: round loop, payload protocol, ledger, seeding, checkpoints."""
