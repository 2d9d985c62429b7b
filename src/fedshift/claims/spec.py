"""The claims files (``claims/<paper>.yaml``) as typed, validated values: a paper, its
claims, each claim's offline stand-in and the comparisons that test it (the format is
described in claims/README.md; :mod:`fedshift.claims.evaluate` evaluates them)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from fedshift.claims import rubric
from fedshift.core.config_tree import lookup
from fedshift.core.errors import FedshiftError

KINDS = ("claim", "design", "accounting", "qualitative")
_CLAIM_KEYS = {
    "id",
    "kind",
    "where",
    "statement",
    "paper",
    "real_suite",
    "needs",
    "stand_in",
    "metric",
    "compare",
    "notes",
    "test",
    "figure",
    "accounting",
    "scope",
    "retests",
}
_STAND_IN_KEYS = {"suite", "command", "results", "minutes", "paper_rounds", "protocol"}
_COMPARE_KEYS = {"label", "a", "b", "expect", "margin", "metric", "metric_b", "mean_over"}
_PAPER_KEYS = {"paper", "venue", "page", "intro", "claims", "notes", "seed_paper"}
_SCOPE_KEYS = {"each", "statement"}


class ClaimsError(FedshiftError):
    """A claims file that does not parse, or that does not fit the results it names."""


# ------------------------------------------------------------------------------ the spec
@dataclass(frozen=True)
class Selector:
    """Runs whose resolved config has these dotted-key values (``augment``: a list of
    augment names, or of mappings whose keys must match)."""

    values: tuple[tuple[str, Any], ...]

    @classmethod
    def of(cls, raw: Any, where: str) -> Selector:
        if not isinstance(raw, dict) or not raw:
            raise ClaimsError(f"{where}: a run selector is a mapping of dotted config keys")
        return cls(tuple(sorted((str(k), v) for k, v in raw.items())))

    def matches(self, cfg: dict, summary: dict) -> bool:
        """Whether a run (its resolved ``cfg`` and ``summary``) is one of these runs. The
        ``augment`` list is the run's own: without the augments its algorithm implies
        (FedFA's ffa, HarmoFL's amplitude normalisation) when those keep their defaults; a
        name in it stands for that augment with its default keys (recorded in the summary)."""
        defaults = (summary.get("defaults") or {}).get("augment", {})
        for key, want in self.values:
            have = lookup(cfg, key, _ABSENT)
            if key == "augment" and isinstance(have, list):
                implied = set(summary.get("implied", []))
                have = [
                    a for a in have if not (a.get("name") in implied and _is_default(a, defaults))
                ]
                if not _same_augments(have, want, defaults):
                    return False
            elif not _same(have, want):
                return False
        return True

    def label(self) -> str:
        return " ".join(f"{k}={_short(v)}" for k, v in self.values)


_ABSENT = object()


def _is_default(aug: dict, defaults: dict) -> bool:
    own = defaults.get(aug.get("name"))
    return own is not None and all(aug.get(k) == v for k, v in own.items())


def _same_augments(have: list, want: Any, defaults: dict) -> bool:
    if not isinstance(want, list) or len(want) != len(have):
        return False
    for h, w in zip(have, want, strict=True):
        if isinstance(w, str):
            if h.get("name") != w or not _is_default(h, defaults):
                return False
        elif not _same(h, w):
            return False
    return True


def _short(v: Any) -> str:
    if isinstance(v, list):
        return "[" + ",".join(_short(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ",".join(f"{k}:{_short(x)}" for k, x in sorted(v.items())) + "}"
    return str(v)


def _same(have: Any, want: Any) -> bool:
    """``want`` (from a claims file) describes ``have`` (a resolved config value): mappings
    by the keys ``want`` names, lists item by item, numbers by value (booleans apart)."""
    if have is _ABSENT:
        return False
    if isinstance(want, dict) and isinstance(have, dict):
        return all(_same(have.get(k, _ABSENT), v) for k, v in want.items())
    if isinstance(want, list) and isinstance(have, list):
        return len(want) == len(have) and all(_same(h, w) for h, w in zip(have, want, strict=True))
    if isinstance(want, bool) or isinstance(have, bool):
        return want is have
    if isinstance(want, int | float) and isinstance(have, int | float):
        return want == have
    return bool(want == have)


@dataclass(frozen=True)
class Scope:
    """What a claim is about, stated (``statement``: "every algorithm of the table") and
    made exact: its comparisons are templates, each generated once per value of the config
    key ``each`` that the committed runs have (:func:`fedshift.claims.scope.expand_scope`),
    so no value can be left out by hand."""

    each: str
    statement: str


@dataclass(frozen=True)
class CompareSpec:
    label: str
    a: Selector
    b: Selector
    expect: str
    margin: float
    metric: str
    #: the metric of ``b`` when it differs from ``a``'s (e.g. before / after a protocol)
    metric_b: str
    mean_over: str | None


@dataclass(frozen=True)
class StandIn:
    suite: str
    #: the shell commands that make its results, in order
    commands: tuple[str, ...]
    results: tuple[str, ...]
    minutes: float | None
    paper_rounds: int | None
    protocol: str | None


@dataclass(frozen=True)
class ClaimSpec:
    id: str
    kind: str
    where: str
    statement: str
    paper: str
    real_suite: str | None
    needs: str | None
    stand_in: StandIn | None
    metric: str
    compare: tuple[CompareSpec, ...]
    notes: str | None
    test: str | None
    figure: str | None
    accounting: tuple[dict, ...]
    #: the claim's stated scope (its comparisons generated over ``scope.each``), or None
    scope: Scope | None = None
    #: ``<paper key>/<claim id>`` of a claim counted elsewhere that this row re-measures:
    #: listed under that claim, never counted itself
    retests: str | None = None


@dataclass(frozen=True)
class PaperSpec:
    key: str
    paper: str
    venue: str
    page: str
    intro: str
    notes: str
    claims: tuple[ClaimSpec, ...]
    #: one of the five papers the project set out to reproduce (FedRDN, DisTrans, FedFA,
    #: HarmoFL, FRAug): the ledger counts them apart from the other methods
    seed_paper: bool = False


def _page(page: str, where: str) -> str:
    """A claims file's ``page``: a relative ``.md`` path under ``docs/`` (``fedshift claims``
    writes it), never one that leaves the repository's docs."""
    parts = page.split("/")
    if not (page.startswith("docs/") and page.endswith(".md")) or any(
        p in ("", ".", "..") or "\\" in p for p in parts
    ):
        raise ClaimsError(
            f"{where}: page {page!r} must be a relative .md path under docs/ without '..' "
            "(e.g. docs/parts/fedrdn-claims.md): `fedshift claims` writes it"
        )
    return page


def _need(raw: dict, key: str, where: str, kind: type | tuple = str) -> Any:
    if key not in raw:
        raise ClaimsError(f"{where}: '{key}' is missing")
    if not isinstance(raw[key], kind):
        raise ClaimsError(f"{where}: '{key}' must be {getattr(kind, '__name__', kind)}")
    return raw[key]


def _only(raw: dict, keys: set[str], where: str) -> None:
    extra = sorted(set(raw) - keys)
    if extra:
        raise ClaimsError(f"{where}: unknown key(s) {extra}; valid: {sorted(keys)}")


def _commands(raw: str | list) -> tuple[str, ...]:
    return tuple(" ".join(str(c).split()) for c in ([raw] if isinstance(raw, str) else raw))


def _stand_in(s: Any, where: str) -> StandIn | None:
    """A claim's ``stand_in`` mapping (``None`` when it has none)."""
    if s is None:
        return None
    if not isinstance(s, dict):
        raise ClaimsError(f"{where}: stand_in is a mapping")
    _only(s, _STAND_IN_KEYS, f"{where} stand_in")
    res = s.get("results", [])
    res = [res] if isinstance(res, str) else list(res)
    return StandIn(
        suite=str(_need(s, "suite", f"{where} stand_in")),
        commands=_commands(_need(s, "command", f"{where} stand_in", (str, list))),
        results=tuple(str(r) for r in res),
        minutes=s.get("minutes"),
        paper_rounds=s.get("paper_rounds"),
        protocol=s.get("protocol"),
    )


def _compare(c: Any, cw: str, metric: str) -> CompareSpec:
    """One entry of a claim's ``compare`` list (``metric``: the claim's, its default)."""
    if not isinstance(c, dict):
        raise ClaimsError(f"{cw}: a comparison is a mapping")
    _only(c, _COMPARE_KEYS, cw)
    expect = c.get("expect", "greater")
    if expect not in rubric.EXPECTS:
        raise ClaimsError(f"{cw}: expect must be one of {rubric.EXPECTS}, got {expect!r}")
    return CompareSpec(
        label=str(_need(c, "label", cw)),
        a=Selector.of(c.get("a"), f"{cw} a"),
        b=Selector.of(c.get("b"), f"{cw} b"),
        expect=expect,
        margin=float(c.get("margin", rubric.DEFAULT_MARGIN)),
        metric=str(c.get("metric", metric)),
        metric_b=str(c.get("metric_b", c.get("metric", metric))),
        mean_over=c.get("mean_over"),
    )


def _scope(sc: Any, where: str, comps: list[CompareSpec]) -> Scope | None:
    """A claim's ``scope`` (``None`` when it has none); no comparison may name the key the
    scope generates comparisons over."""
    if sc is None:
        return None
    if not isinstance(sc, dict):
        raise ClaimsError(f"{where}: scope is a mapping with 'each' and 'statement'")
    _only(sc, _SCOPE_KEYS, f"{where} scope")
    scope = Scope(
        each=str(_need(sc, "each", f"{where} scope")),
        statement=str(_need(sc, "statement", f"{where} scope")).strip(),
    )
    for i, c in enumerate(comps):
        named = [k for sel in (c.a, c.b) for k, _ in sel.values if k == scope.each]
        if named:
            raise ClaimsError(
                f"{where} compare[{i}]: names {scope.each}, the key its scope generates "
                f"the comparisons over; leave it out (each value of {scope.each} the "
                "results hold gets its own comparison)"
            )
    return scope


def _claim(raw: Any, where: str) -> ClaimSpec:
    if not isinstance(raw, dict):
        raise ClaimsError(f"{where}: a claim is a mapping")
    cid = str(_need(raw, "id", where, (str, int)))
    where = f"{where} claim {cid}"
    _only(raw, _CLAIM_KEYS, where)
    kind = raw.get("kind", "claim")
    if kind not in KINDS:
        raise ClaimsError(f"{where}: kind must be one of {KINDS}, got {kind!r}")
    stand = _stand_in(raw.get("stand_in"), where)
    metric = str(raw.get("metric", "test"))
    comps = [
        _compare(c, f"{where} compare[{i}]", metric) for i, c in enumerate(raw.get("compare") or [])
    ]
    scope = _scope(raw.get("scope"), where, comps)
    retests = raw.get("retests")
    if retests is not None and (not isinstance(retests, str) or retests.count("/") != 1):
        raise ClaimsError(
            f"{where}: retests names the claim it re-measures as '<claims file>/<id>' "
            "(e.g. fedfa/T4)"
        )
    needs = raw.get("needs")
    if kind == "claim" and not needs and (stand is None or not comps):
        raise ClaimsError(f"{where}: a counted claim needs a stand_in and comparisons, or 'needs'")
    if kind == "design" and not raw.get("test"):
        raise ClaimsError(f"{where}: a design check names its test ('test: tests/...::name')")
    return ClaimSpec(
        id=cid,
        kind=kind,
        where=str(_need(raw, "where", where)),
        statement=str(_need(raw, "statement", where)).strip(),
        paper=str(raw.get("paper", "")).strip(),
        real_suite=raw.get("real_suite"),
        needs=needs,
        stand_in=stand,
        metric=metric,
        compare=tuple(comps),
        notes=(str(raw["notes"]).strip() if raw.get("notes") else None),
        test=raw.get("test"),
        figure=raw.get("figure"),
        accounting=tuple(raw.get("accounting") or ()),
        scope=scope,
        retests=retests,
    )


def load_paper(path: Path) -> PaperSpec:
    """One claims file (:class:`ClaimsError` naming the file and the claim on a bad entry)."""
    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise ClaimsError(f"{path}: cannot read ({e})") from None
    where = str(path)
    if not isinstance(raw, dict):
        raise ClaimsError(f"{where}: a claims file is a mapping with 'paper' and 'claims'")
    _only(raw, _PAPER_KEYS, where)
    claims = tuple(_claim(c, where) for c in _need(raw, "claims", where, list))
    ids = [c.id for c in claims]
    dup = sorted({i for i in ids if ids.count(i) > 1})
    if dup:
        raise ClaimsError(f"{where}: claim ids {dup} are used twice")
    return PaperSpec(
        key=path.stem,
        paper=str(_need(raw, "paper", where)),
        venue=str(raw.get("venue", "")),
        page=_page(str(_need(raw, "page", where)), where),
        intro=str(raw.get("intro", "")).strip(),
        notes=str(raw.get("notes", "")).strip(),
        claims=claims,
        seed_paper=bool(raw.get("seed_paper", False)),
    )
