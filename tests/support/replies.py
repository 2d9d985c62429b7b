"""Client replies for aggregation unit tests, without spelling out ``Payload`` each time.

    server = algo.init_server(model)
    algo.aggregate(server, 1, [
        reply("a", n=100, weights=full(server["weights"], 1.0)),
        reply("b", n=300, weights=full(server["weights"], 3.0)),
    ])

:func:`reply` is one ``(client, Payload)`` pair as ``aggregate`` receives it; :func:`full`
fills tensors shaped like a state dict's (all of it, or ``keys``) with one value;
:func:`copy_of` clones them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch

from fedshift.core.payload import Payload

Tensors = Mapping[str, torch.Tensor]


def reply(
    client: str,
    n: int = 1,
    *,
    config: Mapping[str, float | int | str] | None = None,
    metrics: Mapping[str, float] | None = None,
    **records: Tensors,
) -> tuple[str, Payload]:
    """``client``'s reply: its ``records`` (name -> tensors) from ``n`` training examples,
    with the ``config`` values it sends along (FedNova's ``a_norm``) and its ``metrics``."""
    payload = Payload({k: dict(v) for k, v in records.items()}, n, dict(metrics or {}),
                      dict(config or {}))  # fmt: skip
    return client, payload


def full(like: Tensors, value: float, keys: Iterable[str] | None = None) -> dict[str, torch.Tensor]:
    """The tensors of ``like`` (those of ``keys``), each filled with ``value``, same dtype."""
    return {k: torch.full_like(like[k], value) for k in (like if keys is None else keys)}


def copy_of(like: Tensors, keys: Iterable[str] | None = None) -> dict[str, torch.Tensor]:
    """Clones of the tensors of ``like`` (those of ``keys``)."""
    return {k: like[k].clone() for k in (like if keys is None else keys)}
