"""One config key swept through the cached bench machinery, mean ± std over seeds per value
(``fedshift protocol sweep -c CONFIG --key K --values ...``): FedFA's Fig. 2 / Table 16 with
``federation.data_fraction``; FedRDN's Fig. 2 and HarmoFL's Fig. 5b with
``train.local_epochs``.
"""

from __future__ import annotations

import copy
from collections import defaultdict
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import yaml  # noqa: E402

from fedshift.core.errors import ConfigError, FedshiftError  # noqa: E402
from fedshift.core.files import atomic_output  # noqa: E402
from fedshift.eval.stats import mean_std, paired_ttest  # noqa: E402
from fedshift.eval.summary import selection_rule  # noqa: E402
from fedshift.eval.tables import grid  # noqa: E402
from fedshift.protocols.common import (  # noqa: E402
    MISSING,
    ProtocolResult,
    SuiteOptions,
    expand_configs,
    label_rows,
    lookup_or_missing,
    mean_std_text,
    row_key,
    row_order,
    save_outputs,
    setting_keys,
    with_settings,
)


def parse_values(text: str) -> list[Any]:
    """``"0.1,0.25,1"`` -> ``[0.1, 0.25, 1]``: comma-separated YAML scalars (numbers,
    booleans, null, strings), each non-empty and listed once."""
    items = [t.strip() for t in str(text).split(",")]
    if not items or any(not t for t in items):
        raise ConfigError(
            f"--values {text!r}: give comma-separated values with none empty, e.g. 0.1,0.5,1"
        )
    values = []
    for t in items:
        try:
            v = yaml.safe_load(t)
        except yaml.YAMLError as e:
            raise ConfigError(f"--values: {t!r} does not parse as a YAML scalar ({e})") from None
        if isinstance(v, dict | list):
            raise ConfigError(f"--values: {t!r} is not a scalar (a number, word, true/false)")
        values.append(v)
    for i, v in enumerate(values):
        if any(type(v) is type(w) and v == w for w in values[:i]):
            raise ConfigError(f"--values {text!r}: {items[i]!r} is listed twice")
    return values


def sweep(options: SuiteOptions, key: str, values: str | list[Any]) -> ProtocolResult:
    """A one-key sweep through the cached bench machinery: the config of ``options``, its grid (e.g.
    algorithm x seed) times ``key`` = each of ``values``. FedFA's Fig. 2 / Table 16:
    ``federation.data_fraction`` = 0.1, 0.25, 0.5, 1; FedRDN's Fig. 2 / HarmoFL's Fig. 5b:
    ``train.local_epochs`` = 1, 2, 5, 10. Table: one row per (algorithm, flow[, setting]),
    one column per value, mean ± std over seeds of the test score at the selected round;
    ``sweep.png``: the mean against the value with std error bars per row."""
    raw, vals, grid_raw = sweep_grid(options, key, values)
    outp = options.output_dir("sweep")
    summaries = options.run_cells(grid_raw, outp / "sweep-suite.yaml")
    with_settings(summaries, setting_keys(raw, exclude=[key]), raw)
    labels = [str(v) for v in vals]
    for s in summaries:
        got = lookup_or_missing(s["_cfg"], key)
        idx = [i for i, v in enumerate(vals) if v == got]
        if not idx:
            raise FedshiftError(f"{s['run_dir']}: {key}={got!r} is not one of {vals}")
        s["_value"] = labels[idx[0]]
    text, data = sweep_table(summaries, key, labels)
    data["values"] = vals
    data["suite"] = str(outp / "sweep-suite.yaml")
    files = save_outputs(outp, "sweep", f"Sweep over {key}", text, data)
    files["png"] = _sweep_png(data, vals, outp / "sweep.png")
    files["suite"] = outp / "sweep-suite.yaml"
    return ProtocolResult("sweep", text, data, files)


def sweep_grid(options: SuiteOptions, key: str, values: str | list[Any]) -> tuple[dict, list, dict]:
    """The raw config of ``options``, the swept values and the suite :func:`sweep` runs (the
    config's grid times ``key`` = each value), planned without running (the committed
    results' digests are checked against it)."""
    source = options.source
    vals = parse_values(values) if isinstance(values, str) else list(values)
    if not vals:
        raise ConfigError("--values: give at least one value")
    if key == "seed" or key.startswith("sweep"):
        raise ConfigError(f"--key {key}: seeds are what each cell averages over; sweep another key")
    raw = options.load()
    if key in (raw.get("sweep") or {}):
        raise ConfigError(
            f"{source}: the config's sweep already varies {key!r}; remove it from the sweep "
            "or choose another --key"
        )
    for cfg in expand_configs(raw, source):
        if lookup_or_missing(cfg.to_dict(), key) is MISSING:
            parent = key.rsplit(".", 1)[0] if "." in key else ""
            node = lookup_or_missing(cfg.to_dict(), parent) if parent else cfg.to_dict()
            valid = ", ".join(sorted(node)) if isinstance(node, dict) else "(not a section)"
            where = f"under '{parent}'" if parent else "at the top level"
            raise ConfigError(
                f"{source}: config key '{key}' does not exist (algorithm "
                f"{cfg.algorithm.name!r}); valid keys {where}: {valid}"
            )
    grid_raw = copy.deepcopy(raw)
    grid_raw.setdefault("sweep", {})[key] = vals
    return raw, vals, grid_raw


def sweep_table(summaries: list[dict], key: str, labels: list[str]) -> tuple[str, dict]:
    """Rows (algorithm, flow[, setting]) x columns = the swept values (``s["_value"]``), cells
    = mean ± std over seeds of the selected round's test score (every metric in the data)."""
    if not summaries:
        raise FedshiftError("sweep: no cells")
    first = summaries[0]
    metric, label = first.get("metric", "acc"), first.get("metric_label", "accuracy")
    others = list(first.get("metrics", {}))
    groups: dict[tuple, dict[str, dict[int, dict]]] = defaultdict(lambda: defaultdict(dict))
    label_rows(summaries, [key])  # the swept key is the columns, not part of a row's flow
    for s in summaries:
        groups[row_key(s)][s["_value"]][s["seed"]] = s
    with_setting = any(k[2] for k in groups)
    header = ["algorithm", "flow", *(["setting"] if with_setting else []), "seeds"]
    header += [f"{key}={v}" for v in labels]
    rows, out_rows = [], []
    for k in sorted(groups, key=row_order):
        algo, flow, setting = k
        seeds = sorted({seed for by in groups[k].values() for seed in by})
        cells, points = [], {}
        for v in labels:
            by_seed = groups[k].get(v, {})
            per_seed = {seed: s["test_mean"] for seed, s in by_seed.items()}
            m, sd = mean_std(list(per_seed.values()))
            points[v] = {
                "per_seed": per_seed,
                "mean": m,
                "std": sd,
                "metrics": {
                    o: {seed: s["metrics"][o]["test_mean"] for seed, s in by_seed.items()}
                    for o in others
                },
                "run_dirs": {seed: s["run_dir"] for seed, s in by_seed.items()},
            }
            cells.append(mean_std_text(list(per_seed.values())))
        rows.append([algo, flow, *([setting] if with_setting else []), str(len(seeds)), *cells])
        out_rows.append(
            {"algorithm": algo, "flow": flow, "setting": setting, "seeds": seeds, "points": points}
        )
    # a flow's change against its algorithm's base flow at each value: paired t-test over seeds
    base = {(r["algorithm"], r["setting"]): r for r in out_rows if r["flow"] == "base"}
    tested = False
    for row, r in zip(rows, out_rows, strict=True):
        ref = base.get((r["algorithm"], r["setting"]))
        if ref is None or ref is r:
            continue
        first_cell = len(row) - len(labels)
        for i, v in enumerate(labels):
            pv = paired_ttest(r["points"][v]["per_seed"], ref["points"][v]["per_seed"])
            r["points"][v]["p_vs_base"] = pv
            if pv is not None:
                row[first_cell + i] += f" (p={pv:.3f})"
                tested = True
    caption = f"Test {label} (%) against {key}, mean ± std over seeds"
    note = f"Model selection: {selection_rule(label)}."
    if tested:
        note += " p: paired t-test over seeds against the same algorithm's base flow."
    text = f"{caption}:\n\n{grid(header, rows)}\n\n_{note}_"
    data = {
        "protocol": "sweep",
        "key": key,
        "labels": labels,
        "metric": metric,
        "metric_label": label,
        "model_selection": selection_rule(label),
        "rows": out_rows,
    }
    return text, data


def _sweep_png(data: dict, values: list[Any], path: Path) -> Path:
    numeric = all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)
    xs = [float(v) for v in values] if numeric else list(range(len(values)))
    fig, ax = plt.subplots(figsize=(6, 4))
    for r in data["rows"]:
        name = r["algorithm"] + ("" if r["flow"] == "base" else f" {r['flow']}")
        name += f" {r['setting']}" if r["setting"] else ""
        pts = [(x, r["points"][lab]) for x, lab in zip(xs, data["labels"], strict=True)]
        pts = [(x, p) for x, p in pts if p["per_seed"]]
        ax.errorbar(
            [x for x, _ in pts],
            [100 * p["mean"] for _, p in pts],
            yerr=[100 * p["std"] for _, p in pts],
            marker="o",
            capsize=3,
            lw=1.4,
            label=name,
        )
    ax.set_xticks(xs, data["labels"])
    ax.set_xlabel(data["key"])
    ax.set_ylabel(f"test {data['metric_label']} (%)")
    ax.set_title(
        f"test {data['metric_label']} vs {data['key']} (mean ± std over seeds)", fontsize=9
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    with atomic_output(path) as tmp:
        fig.savefig(tmp, format=Path(path).suffix[1:] or "png", dpi=110)
    plt.close(fig)
    return path
