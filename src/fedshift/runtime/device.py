"""Where a run computes: the ``device`` key resolved, deterministic GPU kernels
(``run.deterministic``) and the clients' data placed on the device (``run.data``).

A GPU run keeps the whole experiment on the device: the model, the server and client
tensors the algorithms derive from it and, when it fits (``run.data=auto``) or when asked
(``device``), every client's splits, copied once when the experiment is built so that a batch
is an index into device memory and no host copy happens per batch. ``host`` keeps the data in
host memory and copies each batch. The batch order never depends on the device: permutations
are drawn from CPU generators seeded from (seed, round, client).

Deterministic mode (``run.deterministic``, default on) makes a GPU run repeat bit for bit on
the same GPU model, driver and library versions: ``torch.use_deterministic_algorithms(True)``,
cuDNN without autotuning, and cuBLAS with a fixed workspace (``CUBLAS_WORKSPACE_CONFIG=
:4096:8``, set before the first cuBLAS call unless the user set it). Results on a GPU differ
from the CPU's in the last bits (other kernels); they do not depend on ``run.workers``.
TensorFloat-32 is off unless ``run.tf32`` asks for it (PyTorch's own default lets cuDNN
convolutions use it), so a GPU run computes in float32 like a CPU run.
"""

from __future__ import annotations

import dataclasses
import os

import torch

from fedshift.core.errors import ConfigError
from fedshift.core.federation import ClientData, Federation, Split

__all__ = ["data_bytes", "place_data", "resolve_device", "set_precision"]

#: cuBLAS's documented setting for reproducible results (CUDA >= 10.2)
CUBLAS_WORKSPACE = ":4096:8"


def resolve_device(name: str) -> torch.device:
    """The device the ``device`` key names; ``auto``: the (first) GPU when CUDA is
    available, else the CPU."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        dev = torch.device(name)
    except RuntimeError as e:
        raise ConfigError(f"config key 'device': {e} (use cpu, cuda, cuda:N or auto)") from e
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(
                "config key 'device': CUDA is not available here; use device=cpu or device=auto"
            )
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ConfigError(
                f"config key 'device': {name!r} but this machine has "
                f"{torch.cuda.device_count()} GPU(s) (cuda:0 .. cuda:"
                f"{torch.cuda.device_count() - 1})"
            )
    elif dev.type != "cpu":
        raise ConfigError(f"config key 'device': {name!r} is not supported; use cpu, cuda or auto")
    return dev


def set_precision(device: torch.device, deterministic: bool, tf32: bool) -> dict:
    """Deterministic kernels (``run.deterministic``, module docstring) and TensorFloat-32
    (``run.tf32``: cuDNN convolutions and cuBLAS matrix products on 10-bit-mantissa inputs)
    for a GPU run; nothing on a CPU. Both are process-wide switches, set every time a run is
    built, so one run's settings never leak into the next. Returns what was set, for the
    summary's ``runtime`` record."""
    if device.type != "cuda":
        return {}
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
    torch.backends.cudnn.benchmark = not deterministic
    torch.backends.cudnn.deterministic = deterministic
    torch.use_deterministic_algorithms(deterministic)
    torch.backends.cudnn.allow_tf32 = tf32
    torch.backends.cuda.matmul.allow_tf32 = tf32
    return {
        "deterministic": deterministic,
        "cublas_workspace": os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
        "tf32": tf32,
    }


def data_bytes(fed: Federation) -> int:
    """Bytes of every split of every client of ``fed``."""
    return sum(
        t.element_size() * t.nelement()
        for c in fed.clients
        for s in (c.train, c.val, c.test)
        for t in (s.x, s.y)
    )


def _free_bytes(device: torch.device) -> int:
    free, _ = torch.cuda.mem_get_info(device)
    return int(free)


def place_data(fed: Federation, device: torch.device, mode: str) -> tuple[Federation, str]:
    """``fed`` with its splits on ``device`` when ``mode`` (``run.data``) says so, and where
    the data ended up: ``device`` or ``host``. A CPU run returns ``fed`` as it is."""
    if device.type == "cpu":
        return fed, "host"
    if mode not in ("auto", "device", "host"):
        raise ConfigError(f"config key 'run.data': {mode!r} is not one of auto, device, host")
    need = data_bytes(fed)
    if mode == "host" or (mode == "auto" and need > _free_bytes(device) // 2):
        return fed, "host"

    def move(s: Split) -> Split:
        return Split(s.x.to(device), s.y.to(device))

    try:
        clients = [
            ClientData(c.name, move(c.train), move(c.val), move(c.test)) for c in fed.clients
        ]
    except torch.OutOfMemoryError as e:
        raise ConfigError(
            f"config key 'run.data': the clients' data ({need / 2**30:.1f} GiB) does not fit "
            f"on {device}; use run.data=host (each batch copied) or run.data=auto"
        ) from e
    return dataclasses.replace(fed, clients=clients), "device"
