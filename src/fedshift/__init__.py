"""fedshift: federated learning under feature-distribution skew."""

__version__ = "0.1.0"

# The Python API (fedshift.api), imported on first use so that `import fedshift` (and with it
# `fedshift --help`) does not import torch.
_API = ("run", "load_run", "LoadedRun", "export_model", "load_exported")


def __getattr__(name: str):  # noqa: ANN202 - module attribute hook (PEP 562)
    if name in _API:
        from fedshift import api

        return getattr(api, name)
    raise AttributeError(f"module 'fedshift' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_API])
