"""The figure of ``fedshift protocol new-site``: ``new-site.png``, one row per method, one
marker per variant at its average over the held-out sites (mean over seeds, a bar of ± one
std), methods ordered by their ``global`` score, so that how far each answer moves a site
that never trained can be seen at a glance (the numbers are the summary table's)."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

from fedshift.core.files import atomic_output
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
    """Draw ``data`` (new-site.json's numbers) to ``path`` (written atomically)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = [m for m in data["methods"] if m["variants"]]
    order = sorted(
        methods,
        key=lambda m: (
            -1.0
            if m["variants"]["global"]["average"]["mean"] is None
            else m["variants"]["global"]["average"]["mean"]
        ),
    )
    variants = list(data["variants"])
    finetunes = [v for v in variants if v.startswith("finetune-")]
    names = [tick_label(m) for m in order]
    lines = [len(n.splitlines()) for n in names]
    longest = max((len(line) for n in names for line in n.splitlines()), default=0)
    # the plot keeps ~5.5 in beside the labels (7 pt text: ~0.06 in a character)
    size = (5.5 + 0.06 * longest, 0.2 * sum(lines) + 0.25 * len(order) + 2.0)
    fig, ax = plt.subplots(figsize=size, layout="constrained")
    offsets = {v: (i - (len(variants) - 1) / 2) * 0.09 for i, v in enumerate(variants)}
    for v in variants:
        xs, ys, errs = [], [], []
        for row, m in enumerate(order):
            avg = m["variants"][v]["average"]
            if avg["mean"] is None:
                continue
            xs.append(100 * avg["mean"])
            errs.append(100 * (avg["std"] or 0.0))
            ys.append(row + offsets[v])
        if not xs:
            continue
        marker, colour = _style(v, finetunes.index(v) if v in finetunes else 0)
        ax.errorbar(xs, ys, xerr=errs, fmt=marker, color=colour, ms=5, capsize=2, lw=0.8, label=v)
    ax.set_yticks(range(len(order)), names, fontsize=7)
    ax.set_xlabel(f"held-out sites' test {data['metric_label']} (%), average over sites")
    ax.set_title("A site that never trained: each answer, mean ± std over seeds", fontsize=9)
    ax.grid(axis="x", alpha=0.3)
    fig.legend(fontsize=7, loc="outside lower center", ncol=4)  # under the axis label
    with atomic_output(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)
    return path
