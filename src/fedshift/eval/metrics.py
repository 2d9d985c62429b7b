"""Classification metrics on a split, batched, in eval mode."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from fedshift.data.base import Split


@torch.no_grad()
def evaluate(
    model: nn.Module,
    split: Split,
    prepare: Callable[[torch.Tensor], torch.Tensor],
    batch_size: int,
    device: torch.device,
) -> dict[str, float]:
    """Accuracy and mean cross-entropy of ``model`` on ``split`` (``prepare`` normalises)."""
    model.eval()
    n = len(split)
    if n == 0:
        return {"acc": float("nan"), "loss": float("nan")}
    correct = torch.zeros((), dtype=torch.long, device=device)
    loss = torch.zeros((), dtype=torch.float64, device=device)
    for start in range(0, n, batch_size):
        x = prepare(split.x[start : start + batch_size].to(device))
        y = split.y[start : start + batch_size].to(device)
        logits = model(x)
        loss += F.cross_entropy(logits, y, reduction="sum").double()
        correct += (logits.argmax(1) == y).sum()
    return {"acc": float(correct) / n, "loss": float(loss) / n}
