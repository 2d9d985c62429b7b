"""``fedshift report RUN_DIR...``: a paper-style report of finished runs, as Markdown, one
self-contained HTML file (styles and figures inlined) and CSV.

Every ``summary.json`` below the given folders is one run. Runs are grouped by dataset; for
each dataset the report has

* the per-client table of each metric of the task, shaped like the papers' (FedRDN's Table 1/2,
  FedFA's and HarmoFL's per-site tables): one row per flow, the runs of one config over seeds
  (runs that differ in any other key, ``train.lr`` say, are rows of their own, labelled with
  the differing keys: :func:`~fedshift.eval.tables.group_flows`), per-client test score
  averaged over the row's seeds, the average ± std over the same seeds, the change against
  the same algorithm's base flow with its direction (↑/↓) and the paired t-test p-value
  against it, and with
  ``--reference ALGO[/FLOW]`` the paired t-test p-value against that row (FedRDN's appendix B);
  segmentation gets foreground Dice and mean Dice including background, each labelled;
* convergence curves: the mean over clients of the validation and test primary metric per
  round, averaged over seeds, one curve per row of the tables;
* the communication cost per client and round, from the ledger, next to the model's size;
* the model-selection rule, stated under every table.

``report.csv`` has one row per (run, client, metric) with the test score at the selected round
(and a ``mean`` row per run), for plotting elsewhere.
"""

from __future__ import annotations

import base64
import csv
import html
import io
import re
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from fedshift.core.errors import FedshiftError  # noqa: E402
from fedshift.core.files import (  # noqa: E402
    atomic_output,
    csv_safe,
    write_bytes_atomic,
    write_text_atomic,
)
from fedshift.core.logs import logged_warnings  # noqa: E402
from fedshift.eval.domains import domain_columns  # noqa: E402
from fedshift.eval.label_skew import partition_label  # noqa: E402
from fedshift.eval.order import natural_key  # noqa: E402
from fedshift.eval.summary import read_metric_rows, read_summary, selection_rule  # noqa: E402
from fedshift.eval.tables import (  # noqa: E402
    comm_rows,
    flows_rows,
    group_flows,
    metric_caption,
    row_label,
    scores,
)

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2em auto;
max-width:1200px;color:#222;padding:0 1em}
h1{font-size:1.6em;border-bottom:2px solid #444;padding-bottom:.2em}
h2{font-size:1.3em;margin-top:1.8em;border-bottom:1px solid #bbb}
h3{font-size:1.05em;margin-top:1.2em}
table{border-collapse:collapse;margin:.6em 0;font-size:.86em}
th,td{border:1px solid #ccc;padding:.25em .55em;text-align:right;white-space:nowrap}
th{background:#f0f0f0}
td:first-child,td:nth-child(2),th:first-child,th:nth-child(2){text-align:left}
tr:nth-child(even) td{background:#fafafa}
td.up{color:#17803d;font-weight:600} td.down{color:#b42318;font-weight:600}
td.best{font-weight:700} td.txt{text-align:left}
.wide{overflow-x:auto}
p.note{color:#555;font-size:.85em;margin-top:.2em}
img{max-width:100%;border:1px solid #ddd}
.meta{color:#555;font-size:.9em}
"""


# ----------------------------------------------------------------------------- loading
def load_runs(roots: list[str | Path]) -> list[dict]:
    """Every ``summary.json`` below ``roots`` (path order), with ``_dir`` = its folder."""
    runs = []
    for root in roots:
        root = Path(root)
        if not root.exists():
            raise FedshiftError(f"{root} does not exist")
        for path in sorted(root.rglob("summary.json")):
            s = read_summary(path)  # checked: a hand-edited one is an error naming it
            s["_dir"] = str(path.parent)
            runs.append(s)
    if not runs:
        raise FedshiftError(f"no finished runs (summary.json) below {', '.join(map(str, roots))}")
    return runs


def _curves(runs: list[dict]) -> dict[str, dict[int, tuple[float, float]]]:
    """Per flow (the rows of the tables, :func:`~fedshift.eval.tables.group_flows`): round ->
    (val, test) mean over clients of the primary metric of the evaluated model, averaged over
    the runs (seeds) that evaluated that round."""
    group_flows(runs)
    acc: dict[str, dict[int, list[tuple[float, float]]]] = defaultdict(lambda: defaultdict(list))
    for s in runs:
        path = Path(s["_dir"]) / "metrics.jsonl"
        if not path.is_file():
            continue
        kind, metric = s["evaluated_model"], s.get("metric", "acc")
        per_round: dict[int, list[dict]] = defaultdict(list)
        for row in read_metric_rows(path):  # checked: scores finite and in range
            if kind in row:
                per_round[row["round"]].append(row[kind])
        label = _label(s)
        for rnd, rows in per_round.items():
            val = sum(r[f"val_{metric}"] for r in rows) / len(rows)
            test = sum(r[f"test_{metric}"] for r in rows) / len(rows)
            acc[label][rnd].append((val, test))
    return {
        label: {
            rnd: (
                sum(v for v, _ in pts) / len(pts),
                sum(t for _, t in pts) / len(pts),
            )
            for rnd, pts in sorted(by_round.items())
        }
        for label, by_round in acc.items()
    }


def _label(s: dict) -> str:
    return row_label(s)


def convergence_png(runs: list[dict]) -> bytes:
    """The convergence figure (PNG bytes): validation (left) and test (right) curves."""
    curves = _curves(runs)
    s = runs[0]
    metric_label = s.get("metric_label", "accuracy")
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.2), sharey=True)
    # distinct colours for up to 20 curves (the default cycle repeats after 10), and line
    # styles beyond that
    cmap = plt.get_cmap("tab10" if len(curves) <= 10 else "tab20")
    styles = ("-", "--", ":", "-.")
    for i, (label, pts) in enumerate(sorted(curves.items())):
        xs = list(pts)
        look = {"color": cmap(i % cmap.N), "ls": styles[(i // cmap.N) % len(styles)]}
        for ax, k in zip(axes, (0, 1), strict=True):
            ax.plot(xs, [100 * pts[x][k] for x in xs], label=label, lw=1.4, **look)
    for ax, split in zip(axes, ("validation", "test"), strict=True):
        ax.set_xlabel("round")
        ax.set_title(f"{split} {metric_label} (%), mean over clients and seeds", fontsize=10)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel(f"{metric_label} (%)")
    # the legend sits outside the axes, so it never hides a curve
    handles, labels = axes[1].get_legend_handles_labels()
    fig.legend(handles, labels, loc="center left", bbox_to_anchor=(0.80, 0.5), fontsize=7)
    fig.tight_layout(rect=(0, 0, 0.80, 1))
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()


# ----------------------------------------------------------------------------- rendering
def _md_table(header: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def _html_table(header: list[str], rows: list[list[str]], best_col: int | None = None) -> str:
    best = None
    if best_col is not None and rows:

        def val(r: list[str]) -> float:
            try:
                return float(r[best_col].split()[0])
            except ValueError:
                return float("-inf")

        best = max(range(len(rows)), key=lambda i: val(rows[i]))
    parts = ['<div class="wide"><table><thead><tr>']
    parts += [f"<th>{html.escape(h)}</th>" for h in header]
    parts.append("</tr></thead><tbody>")
    for i, r in enumerate(rows):
        parts.append("<tr>")
        for j, cell in enumerate(r):
            cls = []
            if header[j].startswith("Δ"):
                cls.append("up" if "↑" in cell else "down" if "↓" in cell else "")
            if best is not None and i == best and j == best_col:
                cls.append("best")
            if not _NUMERIC.match(cell):
                cls.append("txt")
            c = " ".join(x for x in cls if x)
            parts.append(
                f'<td class="{c}">{html.escape(cell)}</td>'
                if c
                else f"<td>{html.escape(cell)}</td>"
            )
        parts.append("</tr>")
    parts.append("</tbody></table></div>")
    return "".join(parts)


def _datasets(runs: list[dict]) -> dict[str, list[dict]]:
    """Runs grouped by dataset and, under label skew, by partition (with its DH): rows of one
    table must share their clients. Runs of one partition that a suite dealt to several
    numbers of clients, or with different held-out sites (new-site's suites), are sections of
    their own (``10 training clients, held out site6``)."""
    groups: dict[str, list[dict]] = defaultdict(list)
    for s in runs:
        part = s.get("partition") or {"name": "none"}
        key = (
            s["dataset"]
            if part.get("name", "none") == "none"
            else (f"{s['dataset']}, {partition_label(s)}")
        )
        groups[key].append(s)
    out: dict[str, list[dict]] = {}
    for key, group in groups.items():
        for s in group:
            tag = _clients_tag(s, group)
            out.setdefault(f"{key}, {tag}" if tag else key, []).append(s)
    return out


def _clients_tag(s: dict, group: list[dict]) -> str:
    """What tells run ``s``'s clients from the others' in its ``group``: the number of
    training clients and the held-out sites, where those differ ("" where they do not, or
    where only the names differ: :func:`_check_same_clients` says so)."""
    if len({tuple(r["clients"]) for r in group}) == 1:
        return ""

    def held(r: dict) -> list[str]:
        return list(r.get("holdout") or [])

    parts = []
    if len({len(r["clients"]) - len(held(r)) for r in group}) > 1:
        parts.append(f"{len(s['clients']) - len(held(s))} training clients")
    if len({tuple(held(r)) for r in group}) > 1:
        parts.append(f"held out {','.join(held(s)) or 'none'}")
    return ", ".join(parts)


def _check_same_clients(name: str, runs: list[dict]) -> None:
    first = runs[0]["clients"]
    for s in runs[1:]:
        if s["clients"] != first:
            raise FedshiftError(
                f"dataset {name!r}: runs have different clients ({first} vs {s['clients']} in "
                f"{s['_dir']}); report them separately"
            )


def _warnings(runs: list[dict]) -> dict[str, list[str]]:
    """Each warning a run logged (:func:`fedshift.core.logs.logged_warnings`) -> the runs."""
    found: dict[str, list[str]] = {}
    for s in runs:
        for message in logged_warnings(s["_dir"]):
            found.setdefault(message, []).append(f"{s['_flow'].label} seed {s['seed']}")
    return found


def _group_head(group: list[dict]) -> str:
    """One dataset's line under its heading: task, clients (held-out ones named), models,
    rounds and seeds."""
    first = group[0]
    seeds = sorted({s["seed"] for s in group})
    task = first.get("task", "classification")
    model = sorted({s.get("model", "?") for s in group})
    rounds = sorted({s["rounds"] for s in group})
    held = [c for c in first["clients"] if c in (first.get("holdout") or [])]
    return (
        f"{task}; clients: {', '.join(first['clients'])}"
        + (f" ({', '.join(held)} held out: never trained, not in avg ± std)" if held else "")
        + f"; model {', '.join(model)}; "
        f"rounds {', '.join(map(str, rounds))}; seeds {', '.join(map(str, seeds))}"
    )


def _metric_tables(group: list[dict], reference: str | None) -> tuple[list[str], list[str]]:
    """One dataset's table per metric (the selection metric first), as markdown lines and
    HTML elements."""
    first = group[0]
    seeds = sorted({s["seed"] for s in group})
    rule = selection_rule(first.get("metric_label", "accuracy"))
    by_domain = domain_columns(group) is not None
    md: list[str] = []
    body: list[str] = []
    for metric in [None, *first.get("metrics", {})]:
        header, rows = flows_rows(group, metric, reference)
        per_row = {int(r[header.index("seeds")]) for r in rows}
        over = f"{len(seeds)} seed(s)" if len(per_row) == 1 else "each row's seeds"
        caption = f"{metric_caption(group, metric)}, mean over {over}"
        shown = (
            ""
            if metric is None
            else (f" This table shows the {metric_caption(group, metric)[5:-4]} at that round.")
        )
        note = (
            f"Model selection: {rule}.{shown} Δ: change of the average against the same "
            "algorithm's base flow (percentage points); p: two-sided paired t-test over "
            "seeds."
            + (
                " Clients dealt from domains, several to a domain: a column per training "
                "domain, the mean over the clients holding mostly that domain."
                if by_domain
                else ""
            )
        )
        md += ["", f"### {caption}", "", _md_table(header, rows), "", f"_{note}_"]
        body += [
            f"<h3>{html.escape(caption)}</h3>",
            _html_table(header, rows, header.index("avg ± std")),
            f'<p class="note">{html.escape(note)}</p>',
        ]
    return md, body


def _csv_rows(name: str, group: list[dict]) -> list[dict]:
    """``report.csv``'s rows of one dataset: each run's test score per client and their
    mean, per metric."""
    rows: list[dict] = []
    for s in group:
        for metric in [s.get("metric", "acc"), *s.get("metrics", {})]:
            sc = scores(s, metric)
            base = {
                "dataset": name,
                "algorithm": s["algorithm"],
                "flow": s["_flow"].label,
                "seed": s["seed"],
                "metric": metric,
                "model": s["evaluated_model"],
                "best_round": s["best_round"],
                "run_dir": s["_dir"],
            }
            for c in s["clients"]:
                if c in sc["test_per_client"]:  # a held-out site the run did not score
                    rows.append({**base, "client": c, "test": sc["test_per_client"][c]})
            rows.append({**base, "client": "mean", "test": sc["test_mean"]})
    return rows


def build_report(
    roots: list[str | Path],
    out: str | Path,
    reference: str | None = None,
    title: str | None = None,
) -> dict[str, Path]:
    """Write ``report.md``, ``report.html`` (self-contained), ``report.csv`` and the figures
    into ``out``; returns their paths."""
    runs = load_runs(roots)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    title = title or "fedshift report"
    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    md = [f"# {title}", "", f"{len(runs)} runs from {', '.join(map(str, roots))}; {stamp}."]
    body = [
        f"<h1>{html.escape(title)}</h1>",
        f'<p class="meta">{len(runs)} runs from {html.escape(", ".join(map(str, roots)))}; '
        f"{stamp}.</p>",
    ]
    csv_rows: list[dict] = []
    files: dict[str, Path] = {}
    for name, group in sorted(_datasets(runs).items(), key=lambda kv: natural_key(kv[0])):
        _check_same_clients(name, group)
        group_flows(group)  # the rows: runs of one config over seeds (every table below)
        head = _group_head(group)
        md += ["", f"## {name}", "", head]
        body += [f"<h2>{html.escape(name)}</h2>", f'<p class="meta">{html.escape(head)}</p>']
        tmd, tbody = _metric_tables(group, reference)
        md += tmd
        body += tbody
        png = convergence_png(group)
        fig_path = out / f"convergence-{_slug(name)}.png"
        write_bytes_atomic(fig_path, png)
        files[f"convergence:{name}"] = fig_path
        md += ["", "### Convergence", "", f"![convergence]({fig_path.name})"]
        b64 = base64.b64encode(png).decode()
        body += [
            "<h3>Convergence</h3>",
            f'<img alt="convergence" src="data:image/png;base64,{b64}">',
        ]
        header, rows = comm_rows(group)
        note = "Bytes per client per round from the ledger (setup exchange of round 0 apart)."
        md += ["", "### Communication", "", _md_table(header, rows), "", f"_{note}_"]
        body += ["<h3>Communication</h3>", _html_table(header, rows), f'<p class="note">{note}</p>']
        csv_rows += _csv_rows(name, group)
    warned = _warnings(runs)
    if warned:  # what the runs logged as warnings (their run.log), once each
        items = [f"{m} [{', '.join(r)}]" for m, r in warned.items()]
        md += ["", "## Warnings the runs logged", "", *(f"- {i}" for i in items)]
        lis = "".join(f"<li>{html.escape(i)}</li>" for i in items)
        body += ["<h2>Warnings the runs logged</h2>", f"<ul>{lis}</ul>"]
    md_path, html_path, csv_path = out / "report.md", out / "report.html", out / "report.csv"
    write_text_atomic(md_path, "\n".join(md) + "\n")
    page = (
        f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}'
        f"</title><style>{CSS}</style></head><body>{''.join(body)}</body></html>\n"
    )
    write_text_atomic(html_path, page)
    with atomic_output(csv_path) as tmp, open(tmp, "w", newline="") as f:
        w = csv.writer(f)  # every cell escaped against formulas (csv_safe)
        w.writerow([csv_safe(k) for k in csv_rows[0]])
        w.writerows([csv_safe(v) for v in row.values()] for row in csv_rows)
    files.update({"md": md_path, "html": html_path, "csv": csv_path})
    return files


_NUMERIC = re.compile(r"^[-+]?[0-9.]*( ± ([0-9.]+|n/a))?( [↑↓=])?$")

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def screenshot(html_path: str | Path, png_path: str | Path, width: int = 1280) -> Path:
    """Render ``html_path`` in headless Chromium into ``png_path`` (full page height up to
    6000 px), to check a report's layout without a display (Debian: ``apt-get install
    chromium``)."""
    import shutil
    import subprocess

    browser = next((b for b in BROWSERS if shutil.which(b)), None)
    if browser is None:
        raise FedshiftError(
            "no headless browser found for --screenshot (tried "
            f"{', '.join(BROWSERS)}); install one, e.g. 'sudo apt-get install chromium'"
        )
    html_path, png_path = Path(html_path).resolve(), Path(png_path).resolve()
    height = min(
        6000,
        700 + html_path.read_text().count("<tr>") * 30 + 500 * html_path.read_text().count("<img"),
    )
    cmd = [
        browser,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--hide-scrollbars",
        f"--window-size={width},{height}",
        f"--screenshot={png_path}",
        html_path.as_uri(),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    if done.returncode != 0 or not png_path.is_file():
        raise FedshiftError(f"{browser} failed to render {html_path}: {done.stderr[-500:]}")
    return png_path


def _slug(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in name)
