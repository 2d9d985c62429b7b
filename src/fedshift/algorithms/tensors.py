"""Named-tensor helpers the algorithms share: copies, key subsets and weighted averages of
state dicts (``Tensors`` = ``dict[str, torch.Tensor]``)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

from fedshift.core.payload import Tensors


def clone(tensors: Tensors) -> Tensors:
    """A detached copy of every tensor."""
    return {k: v.detach().clone() for k, v in tensors.items()}


def subset(tensors: Tensors, keys: Iterable[str]) -> Tensors:
    """The entries of ``tensors`` named by ``keys``, in ``keys``' order."""
    return {k: tensors[k] for k in keys}


def weighted_average(items: Sequence[tuple[float, Tensors]]) -> Tensors:
    """``sum_i w_i t_i / sum_i w_i`` per key; integer tensors (BN counters) are rounded."""
    if not items:
        raise ValueError("weighted_average of no tensors")
    total = float(sum(w for w, _ in items))
    if total <= 0:
        raise ValueError("weighted_average: weights sum to zero")
    out: Tensors = {}
    for key, ref in items[0][1].items():
        dtype = ref.dtype if ref.is_floating_point() else torch.float64
        acc = torch.zeros(ref.shape, dtype=dtype, device=ref.device)
        for w, t in items:
            acc.add_(t[key].to(acc.dtype), alpha=w / total)
        out[key] = acc if ref.is_floating_point() else acc.round().to(ref.dtype)
    return out
