"""Site-property inference: from the statistic a site shares, predict a property it did not
agree to reveal (its scanner, its domain, its contrast level, its class mix).

The attacker holds statistics of sites whose property it knows (shadow sites, e.g. drawn from
public data of each scanner) and a classifier from statistic to property; the score is its
accuracy on sites it did not train on, against the chance of guessing the most frequent
property. :func:`probe_accuracy` uses a nearest-class-mean classifier on standardised features
(few sites, many features: a classifier with no parameters to over-fit) with leave-one-out
over the sites.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["ProbeResult", "probe_accuracy"]


@dataclass(frozen=True)
class ProbeResult:
    """Leave-one-site-out accuracy of the probe and the chance rate (most frequent label)."""

    accuracy: float
    chance: float
    sites: int


def probe_accuracy(stats: torch.Tensor, labels: list[str]) -> ProbeResult:
    """Leave-one-out accuracy of predicting ``labels[i]`` from ``stats[i]`` (``(S, ...)``, one
    statistic per site) by the nearest mean of the other sites' statistics per label, on
    features standardised with the other sites' mean and standard deviation."""
    x = stats.reshape(len(stats), -1).double()
    if len(x) != len(labels) or len(x) < 3:
        raise ValueError("probe_accuracy: one label per statistic, and at least 3 sites")
    names = sorted(set(labels))
    y = torch.tensor([names.index(v) for v in labels])
    right = 0
    for i in range(len(x)):
        keep = torch.arange(len(x)) != i
        train, ty = x[keep], y[keep]
        mu, sd = train.mean(0), train.std(0).clamp_min(1e-12)
        z, q = (train - mu) / sd, (x[i] - mu) / sd
        present = [c for c in range(len(names)) if (ty == c).any()]
        means = torch.stack([z[ty == c].mean(0) for c in present])
        guess = present[int((means - q).norm(dim=1).argmin())]
        right += int(guess == int(y[i]))
    chance = max(labels.count(v) for v in names) / len(labels)
    return ProbeResult(right / len(x), chance, len(x))
