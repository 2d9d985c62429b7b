"""Markdown of the claims ledger: docs/CLAIMS.md, one page per paper, and a table per
committed results folder, all computed from ``claims/*.yaml`` and ``results/``
(:mod:`fedshift.claims.evaluate`). The output depends on those files only (no dates, no absolute
paths), so regenerating it from the same files gives the same bytes."""

from __future__ import annotations

import statistics
from pathlib import Path

from fedshift.claims import rubric
from fedshift.claims.commits import commit_checker, run_commit
from fedshift.claims.evaluate import (
    ClaimResult,
    PaperResult,
    Results,
    fmt_p,
    metric_words,
)
from fedshift.claims.results_tables import GENERATED, machine_text, md_table, results_table

__all__ = ["claims_page", "machine_text", "paper_page", "render", "results_table"]


def _signed(x: float) -> str:
    return f"{100 * x:+.2f}"


def _claim_section(c: ClaimResult) -> str:
    s = c.spec
    out = [f"### {s.id}. {s.where}", "", f"**Claim.** {s.statement}"]
    if s.paper:
        out += ["", f"**Paper.** {s.paper}"]
    if s.real_suite:
        out += ["", f"**On the paper's data.** `{s.real_suite}` (the data on your disk)"]
    if s.needs:
        out += ["", f"**Offline.** Not runnable: {s.needs}"]
    out += _stand_in_lines(c)
    if s.scope is not None:
        out += [
            "",
            f"**Scope.** {s.scope.statement}: one comparison per value of `{s.scope.each}` "
            "that the committed runs hold on both sides of a comparison (generated, none "
            "picked by hand).",
        ]
    if s.retests:
        paper, _, cid = s.retests.partition("/")
        out += [
            "",
            f"**Re-test** of claim {cid} of `claims/{paper}.yaml`: listed under it there, "
            "not counted again.",
        ]
    out += _comparison_lines(c)
    if c.uncompared:
        out += [
            "",
            f"**Not compared.** {len(c.uncompared)} committed run(s) in the reach of these "
            "comparisons that none of them compares (a key held fixed by hand): "
            + ", ".join(f"`{n}`" for n in c.uncompared)
            + ".",
        ]
    if c.unknown_commits:
        n, total, shas = c.unknown_commits
        out += [
            "",
            f"**Provenance.** {n} of {total} runs were run at a fedshift commit this "
            f"repository does not hold ({', '.join(x[:7] for x in shas)}): the code that "
            "made their numbers cannot be checked out.",
        ]
    if c.accounting:
        out += [""] + [f"- {label}: {text}" for label, text in c.accounting]
    if s.test:
        out += ["", f"**Checked by** `{s.test}`."]
    if s.figure:
        out += ["", f"**Figure.** `{s.figure}`."]
    if c.verdict is not None:
        word = "Verdict" if c.counted else "Verdict of the re-test (not counted)"
        out += ["", f"**{word}: {c.verdict_text()}.**"]
    if c.retested_by:
        out += ["", "**Re-tested** (listed here, not counted again):"]
        for paper, r in c.retested_by:
            link = f"[{paper.paper} {r.spec.id}]({Path(paper.page).name})"
            out.append(f"- {link}, {r.spec.where}: {r.verdict_text()}")
    if s.notes:
        out += ["", s.notes]
    return "\n".join(out)


def _stand_in_lines(c: ClaimResult) -> list[str]:
    """The claim's offline stand-in: its commands, rounds against the paper's, and where
    its results are (or that there are none yet)."""
    st = c.spec.stand_in
    if st is None:
        return []
    out: list[str] = []
    line = "**Offline stand-in.** " + "; ".join(f"`{cmd}`" for cmd in st.commands)
    if st.minutes:
        line += f" (about {st.minutes:g} min on 2 cores)"
    facts = []
    if c.rounds:
        ratio = f"{c.rounds} rounds"
        if st.paper_rounds:
            share = c.rounds / st.paper_rounds
            ratio += f" (the paper {st.paper_rounds}: {share:.2f} of its length)"
        facts.append(ratio)
    where = ", ".join(f"`results/{r}`" for r in st.results)
    if c.measured:
        made = (c.source or {}).get("command")
        if made and made not in st.commands:
            # e.g. a GPU machine's run: name the command that really made the results
            facts.append(f"results in {where}, made by `{made}` on {machine_text(c.source)}")
        else:
            facts.append(f"results in {where}, measured on {machine_text(c.source)}")
    elif st.results:
        facts.append(
            f"no results in {where} yet: run the commands, then "
            "`fedshift claims collect` and `fedshift claims`"
        )
    out += [
        "",
        line + (". " + "; ".join(facts)[:1].upper() + "; ".join(facts)[1:] + "." if facts else "."),
    ]
    return out


def _comparison_lines(c: ClaimResult) -> list[str]:
    """The metric line, the table of the claim's comparisons and the convergence line."""
    if not c.comparisons:
        return []
    out: list[str] = []
    metrics = [r.spec.metric for r in c.comparisons] + [r.spec.metric_b for r in c.comparisons]
    one = len(set(metrics)) == 1
    if one:
        out += ["", f"**Metric.** {metric_words(metrics[0])} (%, mean ± std over seeds)."]
    else:
        out += ["", "**Metric.** per comparison below (%, mean ± std over seeds)."]
    rows = []
    for r in c.comparisons:
        res = r.result
        diff = "—" if res.n == 0 else f"{_signed(res.mean)} ± {100 * res.std:.2f}"
        want = {"greater": "a > b", "less": "a < b"}.get(
            r.spec.expect, f"a = b (± {100 * r.spec.margin:g})"
        )
        label = r.spec.label
        if not one:
            m = metric_words(r.spec.metric)
            if r.spec.metric_b != r.spec.metric:
                m = f"a: {m}; b: {metric_words(r.spec.metric_b)}"
            label += f" [{m}]"
        rows.append(
            [
                label,
                r.a.cell(),
                r.b.cell(),
                diff,
                want,
                str(res.n),
                fmt_p(res.p),
                r.converged_text(),
                res.text(),
            ]
        )
    header = [
        "comparison (a vs b)",
        "a",
        "b",
        "a − b",
        "expected",
        "n",
        "p",
        "converged",
        "verdict",
    ]
    out += ["", md_table(header, rows)]
    line = _convergence_line(c)
    if line:
        out += ["", line]
    return out


def _convergence_line(c: ClaimResult) -> str:
    """What the rubric's convergence rule found among the runs the comparisons judged: how
    many converged, the selected rounds, and why the others did not."""
    runs = {r.path: r for cr in c.comparisons for r in cr.judged}
    if not runs:
        return ""
    conv = [r.convergence for r in runs.values()]
    late = [v for v in conv if not v.converged]
    stopped = sum(
        1
        for r in runs.values()
        if r.summary.get("stopped_at") is not None and r.summary.get("stop_reason") == "patience"
    )
    selected = sorted(v.selected for v in conv)
    rounds = sorted({v.rounds for v in conv})
    text = (
        f"**Convergence.** {len(conv) - len(late)} of {len(conv)} runs converged"
        + (f" ({stopped} stopped early by patience)" if stopped else "")
        + f"; selected rounds {selected[0]}-{selected[-1]} (median "
        f"{statistics.median(selected):g}) of {'/'.join(str(r) for r in rounds)} rounds"
    )
    if late:
        by_last = sum(1 for v in late if v.why.startswith("selected round"))
        rising = len(late) - by_last
        parts = []
        if by_last:
            parts.append(f"{by_last} selected a round in the last {100 * rubric.LAST_SHARE:g} %")
        if rising:
            parts.append(f"{rising} with a validation curve still rising")
        text += "; not converged: " + ", ".join(parts)
    return text + "."


def paper_page(p: PaperResult) -> str:
    s = p.spec
    counted = [c for c in p.claims if c.counted]
    retests = [c for c in p.claims if c.verdict is not None and not c.counted]
    apart = [c for c in p.claims if c.verdict is None]
    out = [f"# {s.paper}: claims ledger", "", GENERATED, ""]
    if s.intro:
        out += [s.intro, ""]
    out += ["Verdicts by the rubric of [CLAIMS.md](../CLAIMS.md).", ""]
    rows = [
        [c.spec.id, c.spec.where, _first_sentence(c.spec.statement), c.verdict_text()]
        for c in counted
    ]
    if rows:
        out += [md_table(["#", "where", "claim", "verdict"], rows), ""]
    if retests:
        rows = [[c.spec.id, str(c.spec.retests), c.spec.where, c.verdict_text()] for c in retests]
        out += [
            "Re-tests of claims counted elsewhere (listed under those claims, not counted again):",
            "",
            md_table(["#", "re-tests", "where", "verdict"], rows),
            "",
        ]
    if apart:
        rows = [
            [c.spec.id, c.spec.kind, c.spec.where, _first_sentence(c.spec.statement)] for c in apart
        ]
        out += [
            "Listed apart (never counted as reproductions):",
            "",
            md_table(["#", "kind", "where", "what"], rows),
            "",
        ]
    if s.notes:
        out += [s.notes, ""]
    out += ["## Claims", ""]
    for c in counted + retests:
        out += [_claim_section(c), ""]
    if apart:
        out += ["## Checks listed apart", ""]
        for c in apart:
            out += [_claim_section(c), ""]
    return "\n".join(out).rstrip() + "\n"


def _first_sentence(text: str) -> str:
    one = " ".join(text.split())
    return one if len(one) <= 140 else one[:137].rstrip() + "..."


#: the five papers fedshift set out to reproduce, as the ledger's title names them
SEED_PAPERS = "FedRDN, DisTrans, FedFA, HarmoFL, FRAug"


def _summary_row(label: str, papers: list[PaperResult]) -> list[str]:
    """One summary row: counted claims, per verdict, re-tests and rows listed apart."""
    counts = dict.fromkeys(rubric.VERDICTS, 0)
    for p in papers:
        for k, v in p.counts().items():
            counts[k] += v
    retests = sum(1 for p in papers for c in p.claims if c.verdict is not None and not c.counted)
    apart = sum(1 for p in papers for c in p.claims if c.verdict is None)
    return [
        label,
        str(sum(counts.values())),
        *(str(counts[v]) for v in rubric.VERDICTS),
        str(retests),
        str(apart),
    ]


def claims_page(papers: list[PaperResult], results_tables: list[str]) -> str:
    seeds = [p for p in papers if p.spec.seed_paper]
    others = [p for p in papers if not p.spec.seed_paper]
    out = [
        "# Claims ledger: the five seed papers' claims (" + SEED_PAPERS + "), other "
        "methods' claims, their offline stand-ins, the verdicts",
        "",
        GENERATED,
        "",
        "Each paper's claims are data (`claims/<paper>.yaml`: the claim, the paper's numbers,",
        "the suite on the paper's data, the offline stand-in and its command, the metric and",
        "the comparisons, or the scope they are generated over). `fedshift claims` reads them",
        "with the committed runs under `results/` and writes this page and the per-paper",
        "pages; `tests/claims/test_claims.py` fails when the committed pages differ from what",
        "the results give, and when a committed run in a claim's reach is left uncompared.",
        "The five seed papers are counted apart from the other methods' claims (federated",
        "domain generalisation, the new-site answers, the baselines). The stand-ins are",
        "small (digits, brain-mri, Fashion-MNIST on 2 CPU cores, far fewer rounds than the",
        "papers: each row states the ratio), so a **not shown** or **contrary** says the",
        "claim does not show at this scale on this data, not that the paper is wrong.",
        "",
        rubric.RUBRIC,
        "## Summary",
        "",
        "Counted claims per verdict; re-tests (a claim re-measured on another stand-in) are",
        "listed under the claim they re-measure and not counted again.",
        "",
    ]
    header = ["paper", "counted claims", *rubric.VERDICTS, "re-tests", "listed apart"]
    rows = []
    for group in (seeds, others):
        for p in group:
            link = f"[{p.spec.paper}]({p.spec.page.removeprefix('docs/')})"
            rows.append(_summary_row(link, [p]))
        if group is seeds and seeds:
            rows.append(_summary_row("**the five seed papers**", seeds))
    if others:
        rows.append(_summary_row("**other methods**", others))
    rows.append(_summary_row("**all**", papers))
    out += [md_table(header, rows), ""]
    if results_tables:
        out += [
            "## Committed results",
            "",
            "One table per folder under `results/` (every run, grouped by everything in its",
            "config but the seed): [results/README.md](../results/README.md) says how they",
            "were made.",
            "",
            *(f"- [{name}](results/{name}.md)" for name in results_tables),
            "",
        ]
    return "\n".join(out).rstrip() + "\n"


def render(claims_dir: Path, results_root: Path, commits: bool = True) -> dict[str, str]:
    """Every generated page: ``{path relative to the repository: text}``: one per results
    folder (``protocols`` and ``_``-prefixed folders, e.g. ``_incomplete``'s cells of suites
    still running, give none), each paper's claims page and docs/CLAIMS.md. ``commits``: flag
    the runs whose recorded commit the repository at ``claims_dir``'s parent does not hold
    (:func:`~fedshift.claims.commits.commit_checker`; nothing is said where that repository's
    history is not at hand: no git, a shallow clone)."""
    from fedshift.claims.evaluate import evaluate

    checker = commit_checker(Path(claims_dir).parent) if commits else None
    papers = evaluate(claims_dir, results_root, checker)
    results = Results(results_root)
    pages: dict[str, str] = {}
    folders = (
        sorted(
            p.name
            for p in Path(results_root).iterdir()
            if p.is_dir()
            # protocols/ and benchmarks/ hold those outputs, not suites: a benchmark's local
            # run folders (ignored by git) must not make benchmarks/ a results page
            and p.name not in ("protocols", "benchmarks")
            and not p.name.startswith("_")
            and any(p.rglob("summary.json"))
        )
        if Path(results_root).is_dir()
        else []
    )
    missing: set[str] = set()
    if checker is not None:
        missing = checker(
            {c for name in folders for r in results.runs(name) if (c := run_commit(r.summary))}
        )
    for name in folders:
        runs = results.runs(name)
        pages[f"docs/results/{name}.md"] = results_table(name, runs, results.source(name), missing)
    for p in papers:
        pages[p.spec.page] = paper_page(p)
    pages["docs/CLAIMS.md"] = claims_page(papers, folders)
    return pages
