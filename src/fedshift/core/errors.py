"""Errors a user can act on. Each message names the file/key at fault and the fix."""

from __future__ import annotations


class FedshiftError(Exception):
    """Base class: anything fedshift raises on purpose for a user to read."""


class ConfigError(FedshiftError):
    """A configuration key, type or value is wrong."""


class DataError(FedshiftError):
    """A dataset is missing, malformed or inconsistent with the request."""


class MissingSourceError(DataError):
    """A raw data source (package file) needed to build a benchmark is absent."""


class TrainingError(FedshiftError):
    """Training produced something unusable (non-finite update, empty client...)."""
