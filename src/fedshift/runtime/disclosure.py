"""What a run's sites give away, from the declarations (:mod:`fedshift.core.disclosure`):
``fedshift privacy show`` and the check of a run's ledger against them.

:func:`disclose` builds a config's experiment (the model and the algorithm with its augments,
on the CPU; no client state, no training) over the loaded federation, asks the composition
for its declarations and evaluates each at every training site: bytes and the fewest
examples a statistic summarises. :func:`check_ledger` compares the rows a run's
:class:`~fedshift.core.payload.Ledger` counted with the declarations: an undeclared record,
a record at a round its ``when`` excludes, or bytes other than declared are problems; a
declared record never sent is listed apart (an error unless its ``maybe`` says when it is
not sent).
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict

from fedshift.core.config import RunConfig
from fedshift.core.disclosure import UP, Disclosure, Site, To, When, site_of
from fedshift.data import run_federation
from fedshift.runtime.experiment import Experiment, build_experiment
from fedshift.runtime.secagg import secure_disclosures

__all__ = ["check_ledger", "disclose", "render", "sites_of"]


def sites_of(exp: Experiment) -> dict[str, Site]:
    """Every training site's :class:`Site` (labels counted, images not read)."""
    train = exp.train
    sizes = [len(d.train) for d in exp.train_clients.values()]
    return {
        cid: site_of(data, sizes, exp.fed.num_classes, train.batch_size, train.local_steps,
                     train.local_epochs)
        for cid, data in exp.train_clients.items()
    }  # fmt: skip


def disclose(cfg: RunConfig) -> dict:
    """The declarations of ``cfg`` evaluated at its sites: plain data (``--format json``)."""
    cfg = dataclasses.replace(cfg, device="cpu")
    exp = build_experiment(cfg, run_federation(cfg, None))
    sites = sites_of(exp)
    declared = secure_disclosures(cfg, exp.algo.disclosures(exp.model))
    rows = [d.row(list(sites.values())) for d in declared]
    counted = [r for r in rows if r["direction"] == UP and r["fewest_examples"] is not None]
    fewest = min(counted, key=lambda r: r["fewest_examples"], default=None)
    return {
        "algorithm": cfg.algorithm.name,
        "augments": [a.name for a in exp.augments],
        "dataset": cfg.dataset.name,
        "sites": {cid: s.examples for cid, s in sites.items()},
        "communicates": exp.algo.communicates,
        "records": rows,
        #: privacy.epsilon's plan and its spend over train.rounds (None: off)
        "privacy": exp.privacy_spent(cfg.train.rounds),
        #: the smallest number of examples any statistic a site sends summarises
        "fewest_examples": None if fewest is None else {
            "examples": fewest["fewest_examples"], "record": fewest["record"],
            "over": fewest["over"],
        },
    }  # fmt: skip


def _bytes(row: dict) -> str:
    lo, hi = row["bytes_min"], row["bytes_max"]
    text = f"{lo:,}" if lo == hi else f"{lo:,}-{hi:,}"
    return text if row["bytes_exact"] else f"<= {text}"


def render(report: dict) -> str:
    """The report as text: the records a site sends (one line each), then those it
    receives."""
    sites = report["sites"]
    lines = [
        f"{report['algorithm']}"
        + (f" + augment {', '.join(report['augments'])}" if report["augments"] else "")
        + f" on {report['dataset']}: {len(sites)} training site(s), "
        f"{min(sites.values(), default=0):,}-{max(sites.values(), default=0):,} "
        "training examples each"
    ]
    if not report["records"]:
        lines.append("nothing leaves a site (no client-server traffic)")
        return "\n".join(lines)
    head = ("record", "from", "kind", "to", "how often", "bytes", "fewest examples")
    up = [r for r in report["records"] if r["direction"] == UP]
    table = [head]
    for r in up:
        few = "" if r["fewest_examples"] is None else f"{r['fewest_examples']:,} ({r['over']})"
        when = r["when"] + (" *" if r["maybe"] else "")
        table.append((r["record"], r["component"], r["kind"], r["to"], when, _bytes(r), few))
    widths = [max(len(row[i]) for row in table) for i in range(len(head))]
    lines.append("what leaves a site:")
    for row in table:
        lines.append("  " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)))
    lines.append("what a site receives:")
    for r in report["records"]:
        if r["direction"] != UP:
            lines.append(
                f"  {r['record']} ({r['component']}, {r['kind']}, {r['when']}, "
                f"{_bytes(r)} bytes): {r['what']}"
                + (f"; from {', '.join(r['carries'])}" if r["carries"] else "")
            )
    fewest = report["fewest_examples"]
    if fewest is not None:
        lines.append(
            f"fewest examples any statistic a site sends summarises: {fewest['examples']:,} "
            f"({fewest['record']}, one {fewest['over']})"
        )
    notes = [r for r in report["records"] if r["maybe"]]
    for r in notes:
        lines.append(f"* {r['direction']} {r['record']}: {r['maybe']}")
    lines.append("records:")
    for r in up:
        lines.append(f"  {r['record']}: {r['what']}")
    lines.append("can secure aggregation (federation.secure_aggregation=true) hide it?")
    dp_unit = _updates_unit(report.get("privacy"))
    for r in up:
        said = r["secure_aggregation"]
        if dp_unit is not None:  # refused together (runtime/dp_updates.py, runtime/dpsgd.py)
            said = (
                f"not with privacy.updates={dp_unit}: the two are refused together "
                "(not wired yet); set one of them off"
            )
        lines.append(f"  {r['record']}: {said}")
    lines += _privacy_lines(up, report.get("privacy"))
    return "\n".join(lines)


def _updates_unit(plan: dict | None) -> str | None:
    """``privacy.updates`` of a plan that protects the weights (``client`` or ``example``),
    else None."""
    weights = None if plan is None else plan["records"].get("weights")
    return None if weights is None else str(weights["unit"])


def _privacy_lines(up: list[dict], plan: dict | None) -> list[str]:
    """Per ``up`` record: does ``privacy.epsilon`` protect it; with a plan, its clip bound,
    the noise std of one value at the site where it summarises the fewest examples, and the
    epsilon it spends."""
    lines = ["does differential privacy (privacy.epsilon) protect it?"]
    unit = _updates_unit(plan)
    for r in up:
        said = r["privacy"]
        if unit is not None and r["record"] == "weights":
            said = (
                "yes: privacy.updates=example, DP-SGD: each example's gradient clipped, noise "
                "at every local step"
                if unit == "example"
                else "yes: privacy.updates=client, each site's update clipped, noise on the mean"
            )
        lines.append(f"  {r['record']}: {said}")
    if plan is None:
        return lines
    sigma = plan["noise_multiplier"]
    lines.append(
        f"privacy.epsilon={plan['epsilon']:g}, delta {plan['delta']:g}, over "
        f"{plan['planned_rounds']} round(s): "
        + ("" if sigma is None else f"statistics' noise multiplier {sigma:.4g} ")
        + f"({plan['accountant']}); epsilon spent in all at the example level "
        f"{plan['epsilon_spent']:.4g} over {plan['releases']} release(s)"
    )
    for name, rec in plan["records"].items():
        if name == "weights" and unit == "example":
            lines += [
                f"  weights: one example the unit, DP-SGD, example clip {rec['clip']:.4g}, "
                f"per site ({len(rec['sites'])}): "
                + "; ".join(
                    f"{site} noise multiplier {s['noise_multiplier']:.4g} at sampling rate "
                    f"{s['sample_rate']:.3g}, {s['releases']} step(s), epsilon "
                    f"{s['epsilon_spent']:.4g} (with the statistics "
                    f"{s['epsilon_spent_with_statistics']:.4g})"
                    for site, s in rec["sites"].items()
                )
            ]
            continue
        if name == "weights" and unit is not None:
            lines.append(
                f"  weights: one site the unit, update clip {rec['clip']:.4g}, noise "
                f"multiplier {rec['noise_multiplier']:.4g} (std {rec['noise_multiplier']:.4g} x "
                f"clip / clients in the round), {rec['releases']} release(s), client-level "
                f"epsilon {rec['epsilon_spent']:.4g}"
            )
            continue
        row = next(r for r in up if r["record"] == name)
        few = row["fewest_examples"] or 1
        lines.append(
            f"  {name}: clip {rec['clip']:.4g}{' (default)' if rec['clip_default'] else ''}, "
            f"noise std per value at most {sigma * 2 * rec['clip'] / few:.4g} where it summarises "
            f"{few:,} example(s), {rec['releases']} release(s), epsilon {rec['epsilon_spent']:.4g}"
        )
    return lines


def check_ledger(
    declared: list[Disclosure],
    rows: list[tuple[int, str, str, str, int]],
    sites: dict[str, Site],
    rounds: int,
) -> tuple[list[str], list[str]]:
    """``(problems, unsent)`` of a run's ledger ``rows`` over ``rounds`` rounds in which every
    training site took part, against the declarations (module docstring)."""
    by_key = {d.key: d for d in declared}
    problems: list[str] = []
    seen: dict[tuple[str, str], set[tuple[int, str]]] = defaultdict(set)
    for rnd, cid, direction, record, nbytes in rows:
        d = by_key.get((direction, record))
        if d is None:
            problems.append(f"round {rnd}, {cid}: {direction} record {record!r} is not declared")
            continue
        seen[d.key].add((rnd, cid))
        if cid not in sites:
            continue  # a held-out site's evaluation records are not counted
        want = d.bytes_at(sites[cid])
        if (nbytes != want) if d.exact else (nbytes > want):
            rel = "" if d.exact else "at most "
            problems.append(
                f"{direction} {record!r} at {cid}, round {rnd}: {nbytes} bytes, "
                f"declared {rel}{want}"
            )
        if (d.when is When.SETUP) != (rnd == 0):
            problems.append(f"{direction} {record!r} in round {rnd}, declared {d.when}")
    for key, where in seen.items():
        d = by_key[key]
        per_site: dict[str, int] = defaultdict(int)
        for _, cid in where:
            per_site[cid] += 1
        if d.when is When.ONCE and max(per_site.values()) > 1:
            problems.append(f"{key[0]} {key[1]!r} sent more than once to/from one site")
        if d.when is When.ROUND and not d.maybe:
            missing = sorted({r for r in range(1, rounds + 1)} - {r for r, _ in where})
            if missing:
                problems.append(f"{key[0]} {key[1]!r} declared every round, not in {missing}")
    unsent = [f"{d.direction} {d.record!r}" for d in declared if d.key not in seen]
    problems += [f"{u} is declared but was never sent" for u, d in
                 zip(unsent, [d for d in declared if d.key not in seen], strict=True)
                 if not d.maybe]  # fmt: skip
    return problems, unsent


#: the markers around the generated table in docs/PRIVACY.md
TABLE_BEGIN = "<!-- disclosure table: generated from the declarations; do not edit -->"
TABLE_END = "<!-- end of the disclosure table -->"


def _over(row: dict) -> str:
    if row["kind"] in ("parameters", "update"):
        return f" (BatchNorm statistics inside: over one {row['over']})"
    return f" (over one {row['over']})"


def markdown_table(reports: list[tuple[str, dict]]) -> str:
    """docs/PRIVACY.md's table "What each method shares": one row per ``(label, report)``,
    each record a site sends with its kind, receiver, how often and what one value of a
    statistic summarises (sizes depend on the data: ``fedshift privacy show``), and what
    secure aggregation (``federation.secure_aggregation``) does with them: hides them all
    from the server, or refuses the method, naming the records it cannot hide."""
    lines = [
        "| method | record: kind, to whom, how often (a statistic: over what) "
        "| secure aggregation |",
        "|---|---|---|",
    ]
    for label, report in reports:
        ups = [r for r in report["records"] if r["direction"] == UP]
        parts = [
            f"`{r['record']}`: {r['kind']}, {r['to']}, {r['when']}"
            + (_over(r) if r["over"] else "")
            + (" (conditional)" if r["maybe"] else "")
            for r in ups
        ]
        none = "nothing of its own" if label.startswith("augment") else "nothing (no traffic)"
        lines.append(f"| {label} | {'<br>'.join(parts) or none} | {_secure(ups)} |")
    return "\n".join(lines)


def _secure(ups: list[dict]) -> str:
    """One table cell: what secure aggregation does with the records ``ups``."""
    if not ups:
        return ""
    bad = [r for r in ups if not r["secure_aggregation"].startswith("yes")]
    if not bad:
        return "hides " + ", ".join(f"`{r['record']}`" for r in ups)
    why = {str(To.CLIENTS): "sent to clients"}
    return "refused: " + ", ".join(
        f"`{r['record']}` ({why.get(r['to'] or '', 'read per site')})" for r in bad
    )
