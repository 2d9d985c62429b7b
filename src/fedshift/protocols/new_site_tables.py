"""The tables of ``fedshift protocol new-site`` (:mod:`fedshift.protocols.new_site`): one
per method (variants x held-out sites, mean ± std over seeds, paired t-tests against FedAvg's
same variant) and a summary across methods, as Markdown text and JSON-ready numbers."""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from typing import Any

from fedshift.core.errors import FedshiftError
from fedshift.eval.order import natural_key
from fedshift.eval.stats import mean_std, paired_ttest, rank_correlation, ranks
from fedshift.eval.tables import grid
from fedshift.protocols.common import (
    DASH,
    fedavg_at_several_settings,
    label_rows,
    mean_std_text,
    place,
    reference_row,
    row_order,
    site_columns,
    split_panels,
)

#: ``--shots``: labelled images per class for ``finetune-k``
SHOTS = (1, 5, 10)
#: the variants, in table order (``finetune-k`` for each k of the shots)
BASE_VARIANTS = ("global", "adabn", "test-time norm")


def variants(shots: tuple[int, ...] = SHOTS) -> list[str]:
    return [*BASE_VARIANTS, *(f"finetune-{k}" for k in shots), "select"]


VARIANTS = tuple(variants())


# ============================================================================ tables
def new_site_tables(
    summaries: list[dict],
    per_run: dict[str, dict],
    clients: list[str],
    shots: tuple[int, ...] = SHOTS,
    epochs: int = 50,
) -> tuple[str, dict]:
    """One table per method (rows: variants; columns: sites, mean ± std over seeds, and the
    average over sites, mean ± std over the seeds with every site; p: paired t-test of that
    average against FedAvg's same variant), then a summary across methods."""
    if not summaries:
        raise FedshiftError("new-site: no cells")
    names = variants(shots)
    label_rows(summaries, site_columns(summaries))
    groups: dict[tuple, dict[str, dict[int, dict]]] = defaultdict(lambda: defaultdict(dict))
    for s in summaries:
        r = per_run[s["run_dir"]]
        place(groups, s, r["site"], r["seed"], r, "new-site")
    first = summaries[0]
    label = first.get("metric_label", "accuracy")
    per_class = "" if first.get("task") == "segmentation" else " per class"
    keys = sorted(groups, key=row_order)
    methods = {k: _method_numbers(groups[k], clients, names) for k in keys}
    refs = {k: reference_row(k, keys) for k in keys}
    ref = refs[keys[0]] if keys else None  # the note's name of it
    _paired_tests(methods, refs, names)
    parts = []
    why: dict[str, set[str]] = defaultdict(set)
    for k in keys:
        numbers = methods[k]
        for r in (r for site in groups[k].values() for r in site.values()):
            for v, reason in r["reasons"].items():
                if r["scores"].get(v) is None:
                    why[v].add(reason)
        parts.append(_method_table(row_name(k), numbers, clients, names, refs[k]))
    summary_rows = []
    for k in keys:
        cells = []
        for v in names:
            av = methods[k]["variants"][v]["average"]
            p = av["p_vs_reference"]
            cells.append(av["text"] + ("" if p is None else f" (p={p:.3f})"))
        summary_rows.append([row_name(k), *cells])
    summary = grid(["method", *names], summary_rows)
    note = _note(label, ref, epochs, per_class, why, fedavg_at_several_settings(keys))
    ranking = ranking_by_setting(methods)
    text = "\n\n".join(
        [f"New-site adaptation: test {label} (%) of each held-out site", *parts]
        + [f"### Summary: average over sites\n\n{summary}", f"_{note}_"]
        + ([ranking_text(ranking, label)] if ranking else [])
    )
    data = {
        "protocol": "new-site",
        "metric": first.get("metric", "acc"),
        "metric_label": label,
        "clients": clients,
        "variants": names,
        "shots": list(shots),
        "epochs": epochs,
        "reference": row_name(ref) if ref else None,
        "methods": [
            {
                "algorithm": k[0],
                "flow": k[1],
                "setting": k[2],
                "reference": row_name(refs[k]) if refs[k] else None,
                **methods[k],
            }
            for k in keys
        ],  # fmt: skip
        "runs": per_run,
        "not_applicable": {v: sorted(w) for v, w in why.items() if w},
        **({"ranking": ranking} if ranking else {}),  # a swept setting's only
    }
    return text, data


def _paired_tests(methods: dict[tuple, dict], refs: dict[tuple, tuple | None], names: list[str]):
    """Each row's ``p_vs_reference`` per variant: the paired t-test over seeds of its average
    against its reference row's same variant (None for the reference itself)."""
    for k, numbers in methods.items():
        r = refs[k]
        for v in names:
            mine = numbers["variants"][v]["average"]
            base = methods[r]["variants"][v]["average"]["per_seed"] if r else {}
            mine["p_vs_reference"] = (
                None if r in (None, k) else paired_ttest(mine["per_seed"], base)
            )


def ranking_by_setting(methods: dict[tuple, dict], variant: str = "global") -> dict | None:
    """Where each method ranks at each setting of a swept key (the number of clients per
    domain: Bai et al., arXiv 2307.04942, find that rankings move with it), by ``variant``'s
    average over the held-out sites (mean over seeds; 1 = highest), and Kendall's tau-b
    between every two settings' rankings. ``methods``: row key -> :func:`_method_numbers`.
    None when the rows are not at two or more settings (:func:`~fedshift.protocols.common.
    split_panels`)."""
    split = split_panels(methods)
    panels = sorted({p for p, _ in split.values()}, key=natural_key)
    if len(panels) < 2:
        return None
    means: dict[str, dict[str, float]] = {p: {} for p in panels}
    for k, (panel, method) in split.items():
        m = methods[k]["variants"][variant]["average"]["mean"]
        if m is not None:
            means[panel][row_name(method)] = round(m, 9)  # float noise is no order
    rank = {p: ranks(means[p]) for p in panels}
    names = sorted({row_name(method) for _, method in split.values()})
    last = len(names) + 1.0  # a method without a score at the first setting goes last
    names.sort(key=lambda n: (rank[panels[0]].get(n, last), n))
    pairs = []
    for i, a in enumerate(panels):
        for b in panels[i + 1 :]:
            tau, p, n = rank_correlation(means[a], means[b])
            pairs.append({"a": a, "b": b, "tau": tau, "p": p, "n": n})
    return {
        "variant": variant,
        "settings": panels,
        "methods": [
            {
                "method": n,
                "by_setting": {
                    p: {"mean": means[p].get(n), "rank": rank[p].get(n)} for p in panels
                },
            }
            for n in names
        ],
        "kendall": pairs,
    }


def ranking_text(ranking: dict, label: str) -> str:
    """The ranking section of ``new-site.md`` (:func:`ranking_by_setting`)."""
    panels = ranking["settings"]
    rows = []
    for m in ranking["methods"]:
        cells = []
        for p in panels:
            c = m["by_setting"][p]
            cells.append(DASH if c["mean"] is None else f"{100 * c['mean']:.2f} ({c['rank']:g})")
        rows.append([m["method"], *cells])
    taus = "; ".join(
        f"{k['a']} vs {k['b']}: "
        + ("—" if k["tau"] is None else f"τ = {k['tau']:.2f} (p = {k['p']:.3f}, {k['n']} methods)")
        for k in ranking["kendall"]
    )
    return (
        f"### Ranking by setting: {ranking['variant']}\n\n"
        f"{grid(['method', *panels], rows)}\n\n"
        f"_Each method's {ranking['variant']} test {label} (%), averaged over the held-out "
        "sites and the seeds, and its rank among the methods at that setting (1 = highest; "
        "ties share the mean rank); rows in the order of the first setting. Kendall's τ-b "
        f"between two settings' rankings: {taus}. τ = 1: the same order; 0: unrelated. Ranks "
        "of means: methods whose means differ by less than their std over seeds may trade "
        "places from seed to seed (their tables' ± and p)._"
    )


def _method_table(
    name: str, numbers: dict, clients: list[str], names: list[str], ref: tuple | None
) -> str:
    """One method's table: variants x sites, the average, and p against the reference."""
    header = ["variant", *clients, "avg ± std", *([f"p vs {row_name(ref)}"] if ref else [])]
    rows = []
    for v in names:
        nv = numbers["variants"][v]
        row = [v, *(nv["sites"][c]["text"] for c in clients), nv["average"]["text"]]
        if ref:
            p = nv["average"]["p_vs_reference"]
            row.append("" if p is None else f"{p:.3f}")
        rows.append(row)
    sel = numbers["selected_sources"]
    picks = "; ".join(f"{c}: {', '.join(sel[c])}" for c in clients if sel.get(c))
    alike = numbers["select_alike"]
    return (
        f"### {name} ({len(numbers['seeds'])} seed(s))\n\n{grid(header, rows)}\n\n"
        f"_select chose (by seed): {picks}._"
        + (
            f" _(alike): the sources' models predict the site alike (mean entropies equal to "
            f"{ALIKE:g}, relative), so the pick is float noise and select equals their common "
            "answer._"
            if alike
            else ""
        )
    )


def row_name(key: tuple | None) -> str:
    """A table row's name: ``algorithm [flow] [setting]`` (the base flow unnamed)."""
    if key is None:
        return ""
    algo, flow, setting = key
    return algo + ("" if flow == "base" else f" {flow}") + (f" [{setting}]" if setting else "")


def _method_numbers(
    by_site: dict[str, dict[int, dict]], clients: list[str], names: list[str]
) -> dict[str, Any]:
    """One method's numbers: per variant, each site's scores by seed (mean ± std) and the
    average over sites per seed (seeds with every site, and a score for each)."""
    seeds = sorted({seed for site in by_site.values() for seed in site})
    out: dict[str, Any] = {"seeds": seeds, "variants": {}}
    for v in names:
        sites = {}
        for c in clients:
            per_seed = {seed: r["scores"].get(v) for seed, r in sorted(by_site.get(c, {}).items())}
            vals = [x for x in per_seed.values() if x is not None]
            sites[c] = {
                "per_seed": per_seed,
                "mean": statistics.fmean(vals) if vals else None,
                "text": mean_std_text(vals) if len(vals) == len(per_seed) and vals else DASH,
            }
        complete = [
            seed
            for seed in seeds
            if all(by_site.get(c, {}).get(seed, {}).get("scores", {}).get(v) is not None
                   for c in clients)
        ]  # fmt: skip
        avg = {
            seed: statistics.fmean(by_site[c][seed]["scores"][v] for c in clients)
            for seed in complete
        }
        m, sd = mean_std(list(avg.values()))
        out["variants"][v] = {
            "sites": sites,
            "average": {
                "per_seed": avg,
                "mean": None if math.isnan(m) else m,
                "std": None if math.isnan(sd) else sd,
                "text": mean_std_text(list(avg.values())),
            },
        }
    runs = {c: sorted(by_site.get(c, {}).items()) for c in clients}
    out["selected_sources"] = {
        c: [
            f"s{seed} {r['selected_source']}" + (" (alike)" if _alike(r.get("entropy")) else "")
            for seed, r in runs[c]
        ]
        for c in clients
    }
    out["select_alike"] = any(_alike(r.get("entropy")) for c in clients for _, r in runs[c])
    return out


#: relative spread of the sources' mean entropies below which ``select`` had nothing to choose
ALIKE = 1e-6


def _alike(entropy: dict[str, float] | None) -> bool:
    """Whether the sources' models predict the site alike (their mean prediction entropies
    agree to :data:`ALIKE`, relative): ``select``'s pick is then float noise, not a choice
    (e.g. DisTrans whose aggregated offsets left every source with the same model)."""
    if not entropy or len(entropy) < 2:
        return False
    vals = list(entropy.values())
    return max(vals) - min(vals) <= ALIKE * max(1.0, max(abs(v) for v in vals))


def _note(
    label: str, ref: tuple | None, epochs: int, per_class: str, why: dict, settings: bool = False
) -> str:
    """The explanation printed under the tables."""
    dash_notes = "; ".join(f"{v}: {', '.join(sorted(w))}" for v, w in why.items() if w)
    note = (
        f"Held-out site's test {label} (%) after each variant; column = the site held out "
        "(it never trains; each run is leave-one-client-out's cell), mean ± std over seeds; "
        "avg ± std = mean over sites per seed, then mean ± sample std over the seeds with "
        "every site; p: paired t-test of that average over seeds against "
        + (
            "FedAvg's same variant at the row's own setting (else the first FedAvg row)"
            if settings and ref
            else f"{row_name(ref) if ref else '(no FedAvg row)'}'s same variant"
        )
        + ". global: the run's model at "
        "the round selected on the sources' validation score (= loco); methods without a "
        "global model (FedBN, FRAug, DisTrans): shared layers + the sources' mean local "
        "tensors (BN, offset). adabn: BN running statistics re-estimated on the site's "
        "unlabelled training images (AdaBN). test-time norm: the method's own test-time "
        "input normalisation: FedRDN-V and norm with the site's own statistics in place of "
        "the averaged / fixed ones; FedRDN (Eq. 8, the site's own statistics) and HarmoFL "
        "(the global amplitude) already score a new site that way, so their row repeats "
        "global. "
        f"finetune-k: the head trained {epochs} epochs with the run's training loss on k "
        f"labelled training images{per_class} (same images for every method of a seed). "
        "select: the source model with the "
        "lowest mean prediction entropy on the site's unlabelled training images (after "
        "FedSM, CVPR 2022)." + (f" {DASH} = not applicable: {dash_notes}." if dash_notes else "")
    )
    return note
