"""Scores per domain for clients dealt from domains (``partition.name=domains``, Bai et al.,
arXiv 2307.04942): a table with a column per client would repeat each domain as many times
as it was dealt (80 columns for 80 clients); these give one number per training domain, as
FedHEAL's and FPL's per-domain tables do."""

from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Any


def domain_scores(
    summary: dict[str, Any], per_client: dict[str, float] | None = None
) -> dict[str, float] | None:
    """Per domain (sorted), the mean test score of the training clients that hold mostly
    that domain (the summary's ``domain_mix``; with lam = 0 each client holds exactly one);
    held-out clients left out. ``per_client``: the scores to average (default: the
    summary's ``test_per_client``; another metric's block). None without a ``domain_mix``."""
    mix = summary.get("domain_mix")
    if not mix:
        return None
    scores = summary["test_per_client"] if per_client is None else per_client
    held = set(summary.get("holdout") or [])
    by: dict[str, list[float]] = defaultdict(list)
    for client, shares in mix.items():
        if client in scores and client not in held:
            by[max(shares, key=shares.get)].append(float(scores[client]))
    return {d: statistics.fmean(v) for d, v in sorted(by.items())}


def split_domains(summary: dict[str, Any]) -> bool:
    """Whether some domain was dealt to several training clients, each client holding mostly
    one domain (so that a table per client would repeat each domain; :func:`domain_scores`
    gives one number per domain). False where a client's largest share is tied (lam near 1:
    every client holds the domains alike, and a "main domain" would be an arbitrary pick)."""
    mix = summary.get("domain_mix") or {}
    held = set(summary.get("holdout") or [])
    mains = []
    for c, shares in mix.items():
        if c in held or not shares:
            continue
        top = max(shares.values())
        if sum(v == top for v in shares.values()) > 1:
            return False
        mains.append(max(shares, key=shares.get))
    return len(mains) > len(set(mains))


def domain_columns(summaries: list[dict[str, Any]]) -> list[str] | None:
    """The columns of a per-domain table over ``summaries``: the training domains (sorted),
    then the first run's held-out clients; None when no run split a domain over clients
    (a table per client is then one per domain already)."""
    if not any(split_domains(s) for s in summaries):
        return None
    domains = training_domains(summaries)
    held = [c for c in summaries[0].get("clients", []) if c in (summaries[0].get("holdout") or [])]
    return domains + [c for c in held if c not in domains]


def training_domains(summaries: list[dict[str, Any]]) -> list[str]:
    """The domains any of ``summaries`` trained on (sorted; :func:`domain_scores`' keys)."""
    return sorted({d for s in summaries for d in domain_scores(s) or {}})


def domain_view(summary: dict[str, Any], per_client: dict[str, float]) -> dict[str, float]:
    """``per_client`` scores seen per :func:`domain_columns`: each training domain's mean,
    then each held-out client's own score."""
    out = dict(domain_scores(summary, per_client) or {})
    held = summary.get("holdout") or []
    out.update({c: per_client[c] for c in held if c in per_client})
    return out
