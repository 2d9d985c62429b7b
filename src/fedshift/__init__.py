"""fedshift: federated learning under feature-distribution skew."""

__version__ = "0.1.0"

# The Python API, imported on first use so that `import fedshift` (and with it
# `fedshift --help`) does not import torch: each name and the module that defines it.
_API = {
    "run": "fedshift.api",
    "resume": "fedshift.api",
    "load_run": "fedshift.api",
    "LoadedRun": "fedshift.api",
    "export_model": "fedshift.api",
    "load_exported": "fedshift.api",
    "load_predictor": "fedshift.api",
    # what fedshift.run returns, and a finished run rebuilt (LoadedRun.rebuild)
    "RunResult": "fedshift.runtime.rundir.results",
    "SavedRun": "fedshift.runtime.rundir.saved",
}


def __getattr__(name: str):  # noqa: ANN202 - module attribute hook (PEP 562)
    if name in _API:
        import importlib

        return getattr(importlib.import_module(_API[name]), name)
    raise AttributeError(f"module 'fedshift' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_API])
