"""A claim's comparisons made from its stated scope, and the committed runs its comparisons
could have used but do not (issue 50: comparisons that cannot be picked by hand)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from fedshift.claims.spec import ClaimSpec, CompareSpec, Selector
from fedshift.core.config_tree import lookup

if TYPE_CHECKING:
    from fedshift.claims.evaluate import ResultRun


def _value_text(v: object) -> str:
    return Selector.of({"k": v}, "value").label().removeprefix("k=")


def expand_scope(spec: ClaimSpec, runs: list[ResultRun]) -> list[CompareSpec]:
    """The claim's comparisons: as written, or, with a ``scope``, each template once per
    value of ``scope.each`` for which runs match both its ``a`` and its ``b`` (sorted by the
    value's text), that value added to both selectors; its label names the value
    (``{value}`` in the label, else a prefix). Every committed value that can be compared
    is, so none is left out by hand (a value with runs on one side only has nothing to
    compare; :func:`uncompared` still names a run no comparison reaches)."""
    if spec.scope is None:
        return list(spec.compare)
    key = spec.scope.each

    def values(sel: Selector) -> dict[str, object]:
        found: dict[str, object] = {}
        for r in runs:
            v = lookup(r.cfg, key, None)
            if v is not None and sel.matches(r.cfg, r.summary):
                found.setdefault(_value_text(v), v)
        return found

    out = []
    for c in spec.compare:
        on_a, on_b = values(c.a), values(c.b)
        for text in sorted(set(on_a) & set(on_b)):
            v = on_a[text]
            label = c.label.replace("{value}", text)
            if "{value}" not in c.label:
                label = f"{text}: {c.label}"
            out.append(
                dataclasses.replace(
                    c,
                    label=label,
                    a=Selector(tuple(sorted((*c.a.values, (key, v)), key=lambda kv: kv[0]))),
                    b=Selector(tuple(sorted((*c.b.values, (key, v)), key=lambda kv: kv[0]))),
                )
            )
    return out


def _reach(c: CompareSpec) -> tuple[Selector, Selector]:
    """A comparison's selectors without the keys both hold at the same value (what it keeps
    fixed): the runs they match are those the comparison could have been made on."""
    shared = [kv for kv in c.a.values if kv in c.b.values]  # values may be lists, dicts
    a = tuple(kv for kv in c.a.values if kv not in shared)
    b = tuple(kv for kv in c.b.values if kv not in shared)
    return Selector(a), Selector(b)


def uncompared(runs: list[ResultRun], comps: list[CompareSpec]) -> list[str]:
    """The runs (folder names) in the reach of a claim's comparisons that none of them
    compares. A comparison's reach is its selectors without the keys it holds fixed (both
    sides at one value, e.g. ``algorithm.name: fedavg`` in "FedAvg +FedRDN vs FedAvg
    +norm"): a committed run of another value of such a key (FedBN +norm) was left out of
    the claim by hand, so its scope must generate it (``scope.each``) or it must go."""
    reaches = [sel for c in comps for sel in _reach(c) if sel.values]
    used = [sel for c in comps for sel in (c.a, c.b)]
    out = []
    for r in runs:
        if any(s.matches(r.cfg, r.summary) for s in reaches) and not any(
            s.matches(r.cfg, r.summary) for s in used
        ):
            out.append(r.path.name)
    return sorted(out)
