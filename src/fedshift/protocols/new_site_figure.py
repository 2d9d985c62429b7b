"""The figure of ``fedshift protocol new-site``: ``new-site.png``, one row per method, one
marker per variant at its average over the held-out sites (mean over seeds, a bar of ± one
std), methods ordered by their ``global`` score, so that how far each answer moves a site
that never trained can be seen at a glance (the numbers are the summary table's); a suite
that sweeps a setting (the number of clients) gets one panel per setting."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

from fedshift.core.files import atomic_output
from fedshift.eval.order import natural_key
from fedshift.protocols.common import split_panels
from fedshift.protocols.new_site_tables import row_name

#: marker and colour of each variant (finetune-k: shades of one colour, darker for more k)
_STYLE = {
    "global": ("o", "black"),
    "adabn": ("s", "tab:blue"),
    "test-time norm": ("^", "tab:purple"),
    "select": ("x", "tab:red"),
}
_FINETUNE = ("#9fd49f", "#4caf50", "#1b5e20", "#0b3d0b")


def _style(variant: str, k_index: int) -> tuple[str, str]:
    if variant.startswith("finetune-"):
        return "D", _FINETUNE[min(k_index, len(_FINETUNE) - 1)]
    return _STYLE.get(variant, ("*", "grey"))


def tick_label(m: dict, width: int = 30) -> str:
    """A row's label on the figure: the method, then its setting's ``key=value`` items on
    lines of at most ``width`` characters (a FedWon row's four items would otherwise push
    the plot off the figure)."""
    name = row_name((m["algorithm"], m["flow"], ""))
    lines = textwrap.wrap(m["setting"], width, break_long_words=False) if m["setting"] else []
    if lines:
        lines[0] = "[" + lines[0]
        lines[-1] += "]"
    return "\n".join([name, *lines])


def new_site_png(data: dict[str, Any], path: Path) -> Path:
    """Draw ``data`` (new-site.json's numbers) to ``path`` (written atomically). Rows at
    several settings of a swept key (the number of clients) are drawn as one panel per
    setting, side by side on one scale, each method on the same line in every panel, so that
    a method that moves with the setting can be seen (:func:`~fedshift.protocols.common.
    split_panels`); methods ordered by their ``global`` score averaged over the panels."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = [m for m in data["methods"] if m["variants"]]
    split = split_panels((m["algorithm"], m["flow"], m["setting"]) for m in methods)
    panels = sorted({p for p, _ in split.values()}, key=natural_key)
    cells: dict[tuple, dict[str, dict]] = {}  # method -> panel -> its numbers
    for m in methods:
        panel, method = split[(m["algorithm"], m["flow"], m["setting"])]
        cells.setdefault(method, {})[panel] = m

    def global_mean(method: tuple) -> float:
        got = [
            m["variants"]["global"]["average"]["mean"]
            for m in cells[method].values()
            if m["variants"].get("global", {}).get("average", {}).get("mean") is not None
        ]
        return sum(got) / len(got) if got else -1.0

    order = sorted(cells, key=global_mean)  # the best at the top
    variants = list(data["variants"])
    names = [tick_label({"algorithm": a, "flow": f, "setting": s}) for a, f, s in order]
    lines = [len(n.splitlines()) for n in names]
    longest = max((len(line) for n in names for line in n.splitlines()), default=0)
    # each panel keeps ~5.5 in (one) or ~3.6 in (several) beside the labels (7 pt text:
    # ~0.06 in a character)
    width = 5.5 if len(panels) == 1 else 3.6 * len(panels)
    size = (width + 0.06 * longest, 0.2 * sum(lines) + 0.25 * len(order) + 2.0)
    fig, axes = plt.subplots(
        1, len(panels), figsize=size, layout="constrained", sharex=True, sharey=True,
        squeeze=False,
    )  # fmt: skip
    legend: dict[str, Any] = {}
    for ax, panel in zip(axes[0], panels, strict=True):
        legend.update(_draw_panel(ax, [cells[method].get(panel) for method in order], variants))
        ax.grid(axis="x", alpha=0.3)
        if len(panels) > 1:
            ax.set_title(panel, fontsize=8)
    axes[0][0].set_yticks(range(len(order)), names, fontsize=7)
    xlabel = f"held-out sites' test {data['metric_label']} (%), average over sites"
    title = "A site that never trained: each answer, mean ± std over seeds"
    if len(panels) == 1:
        axes[0][0].set_xlabel(xlabel)
        axes[0][0].set_title(title, fontsize=9)
    else:
        fig.supxlabel(xlabel, fontsize=10)
        fig.suptitle(title, fontsize=9)
    handles = [legend[v] for v in variants if v in legend]  # each variant once
    where = {"loc": "outside lower center", "ncol": 4}  # under the axis label
    if len(panels) > 1:  # beside the panels: under them is the shared axis label's place
        where = {"loc": "outside right upper", "ncol": 1}
    fig.legend(handles, [v for v in variants if v in legend], fontsize=7, **where)
    with atomic_output(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)
    return path


def _draw_panel(ax: Any, rows: list[dict | None], variants: list[str]) -> dict[str, Any]:
    """One panel: row i = ``rows[i]``'s numbers (None: the method has no row at this
    setting), one marker per variant with a number, ± one std; returns the legend handles."""
    finetunes = [v for v in variants if v.startswith("finetune-")]
    offsets = {v: (i - (len(variants) - 1) / 2) * 0.09 for i, v in enumerate(variants)}
    handles = {}
    for v in variants:
        xs, ys, errs = [], [], []
        for row, m in enumerate(rows):
            avg = m["variants"][v]["average"] if m else {"mean": None}
            if avg["mean"] is None:
                continue
            xs.append(100 * avg["mean"])
            errs.append(100 * (avg["std"] or 0.0))
            ys.append(row + offsets[v])
        if xs:
            marker, colour = _style(v, finetunes.index(v) if v in finetunes else 0)
            handles[v] = ax.errorbar(
                xs, ys, xerr=errs, fmt=marker, color=colour, ms=5, capsize=2, lw=0.8, label=v
            )
    return handles
