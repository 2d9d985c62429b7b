"""The cross-site matrix of FedRDN's Table 3 (``fedshift protocol cross-site RUN_DIR``).

``M[i][j]`` = the task's metrics of client *i*'s evaluated model on client *j*'s split; with
``pipeline="data"`` site *j*'s images go through *j*'s own input pipeline (FedRDN normalises
a site's test data with that site's statistics, Eq. 8), with ``pipeline="model"`` through
*i*'s. ``kind="local"`` evaluates each client's *local* model (the model after its own local
training, FedRDN Sec. 4.4 / Table 3) instead of the aggregated or personalised one.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import TYPE_CHECKING, Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402
from tqdm.auto import tqdm  # noqa: E402

from fedshift.core.errors import FedshiftError  # noqa: E402
from fedshift.core.files import atomic_output  # noqa: E402
from fedshift.eval.tables import flow_label, grid  # noqa: E402
from fedshift.protocols.common import (  # noqa: E402
    DASH,
    PIPELINES,
    SPLITS,
    ProtocolResult,
    load_run,
    output_dir,
    percent,
    run_label,
    run_meta,
    save_outputs,
)

if TYPE_CHECKING:
    from fedshift.runtime.rundir.saved import SavedRun


@torch.no_grad()
def cross_site(
    run_dir: str | Path,
    pipeline: str = "data",
    split: str = "test",
    kind: str | None = None,
    out: str | Path | None = None,
    progress: bool = True,
    weights: str = "selected",
) -> ProtocolResult:
    """The cross-site matrix (FedRDN's Table 3): ``M[i][j]`` = every metric of the task for
    client *i*'s model on client *j*'s ``split``. ``kind``: ``personal`` / ``global`` = the
    run's weights of that kind (default: the kind the run evaluates; a ``local``
    run's personal model is a model trained on client *i* alone); ``local`` = client *i*'s
    local model, as in FedRDN's Table 3 ("generalization performance of local model",
    Sec. 4.4): the model client *i* obtains by one more round of local training (the run's
    ``train.local_epochs``, optimiser and augments, e.g. FedRDN's Eq. 7 draw) starting from
    what the server broadcasts after that round T, i.e. the w_k that client would upload
    in round T + 1. It is recomputed deterministically (seeded by the run's seed, round T + 1
    and the client); the run's stored state is left as it was. The run's checkpoint
    keeps only the aggregated model, not the local models the last round produced.

    ``weights``: the run's state at the round model selection picked on validation
    (``selected``, default: the model whose scores the run's tables report) or at its last
    round (``last``).

    ``pipeline="data"``: *j*'s images through *j*'s own input-pipeline state (FedRDN's test
    time, Eq. 8: a site normalises its data with its own statistics); ``"model"``: through
    *i*'s (the model's site brings its pre-processing along). Writes ``cross-site.md`` (rows =
    model's client, columns = data's client, diagonal in bold, row means and off-diagonal
    means), ``cross-site.json`` (every metric's matrix) and the heatmap ``cross-site.png``."""
    if pipeline not in PIPELINES:
        raise FedshiftError(f"--pipeline {pipeline!r}: choose one of {', '.join(PIPELINES)}")
    if split not in SPLITS:
        raise FedshiftError(f"--split {split!r}: choose one of {', '.join(SPLITS)}")
    sim = load_run(run_dir, weights)
    kind = _checked_kind(sim, run_dir, kind or sim.kinds[0])
    mats = _matrices(sim, kind, split, pipeline, progress)
    clients = sim.fed.client_names
    primary = sim.task.primary
    mat = mats[primary.name]
    st = matrix_stats(mat)
    meta = run_meta(sim)
    at = f"round {sim.round}" if kind != "local" else f"local update {sim.round + 1}"
    caption = (
        f"Cross-site {split} {primary.label} (%) of {run_label(meta)} ({kind} models, {at}), "
        f"data through the {pipeline}'s client's input pipeline"
    )
    note = _note(st, kind, split, pipeline, weights, sim.round)
    text = f"{caption}:\n\n{_table(mat, st, clients)}\n\n_{note}_"
    data = {
        "weights": weights,
        "protocol": "cross-site",
        "run_dir": str(run_dir),
        **meta,
        "flow": flow_label(meta),
        "kind": kind,
        "split": split,
        "pipeline": pipeline,
        "round": sim.round,
        "clients": clients,
        "metric": primary.name,
        "metric_labels": {m.name: m.label for m in sim.task.metrics},
        "matrices": mats,
        "stats": {m: matrix_stats(v) for m, v in mats.items()},
    }
    outp = output_dir(out, "cross-site")
    files = save_outputs(outp, "cross-site", "Cross-site evaluation", text, data)
    files["png"] = _heatmap(mat, clients, caption, outp / "cross-site.png")
    return ProtocolResult("cross-site", text, data, files)


def _checked_kind(sim: Any, run_dir: str | Path, kind: str) -> str:
    """``kind`` if the run has such models (``local``: every client trains)."""
    if kind == "local":
        if not sim.train_clients or any(c not in sim.train_clients for c in sim.fed.client_names):
            raise FedshiftError(
                f"--kind local: run {run_dir} has clients that never train "
                f"(federation.holdout); they have no local model. Use --kind global"
            )
    elif kind not in sim.kinds:
        raise FedshiftError(
            f"--kind {kind}: run {run_dir} has no {kind} model (it has {', '.join(sim.kinds)}"
            "; or --kind local)"
        )
    return kind


def _matrices(
    sim: Any, kind: str, split: str, pipeline: str, progress: bool
) -> dict[str, list[list[float]]]:
    """Every metric's matrix: ``[i][j]`` = client *i*'s ``kind`` model on client *j*'s
    ``split``, the data through the input pipeline of *j* (``pipeline="data"``) or *i*."""
    clients = sim.fed.client_names
    n = len(clients)
    names = [m.name for m in sim.task.metrics]
    mats = {m: [[math.nan] * n for _ in range(n)] for m in names}
    bs = sim.cfg.eval.batch_size
    local = local_models(sim) if kind == "local" else {}
    for i, ci in enumerate(tqdm(clients, desc="cross-site", disable=not progress, leave=False)):
        sim.model.load_state_dict(local[ci] if kind == "local" else sim.weights_for(ci, kind))
        for j, cj in enumerate(clients):
            state = sim.states.get(cj if pipeline == "data" else ci)

            def prepare(x: torch.Tensor, state=state) -> torch.Tensor:
                return sim.pipeline.eval(x, state)

            data = sim.fed.client(cj).split(split)
            res = sim.task.evaluate(sim.model, data, prepare, bs, sim.device)
            for m in names:
                mats[m][i][j] = res[m]
    return mats


def matrix_stats(mat: list[list[float]]) -> dict[str, Any]:
    """Row, column, diagonal and off-diagonal means of a square cross-site matrix."""
    n = len(mat)
    off = [mat[i][j] for i in range(n) for j in range(n) if i != j]
    return {
        "row_mean": [statistics.fmean(r) for r in mat],
        "row_off_diagonal_mean": [
            statistics.fmean([mat[i][j] for j in range(n) if j != i]) if n > 1 else math.nan
            for i in range(n)
        ],
        "column_mean": [statistics.fmean(mat[i][j] for i in range(n)) for j in range(n)],
        "diagonal_mean": statistics.fmean(mat[i][i] for i in range(n)),
        "off_diagonal_mean": statistics.fmean(off) if off else math.nan,
    }


def _table(mat: list[list[float]], st: dict[str, Any], clients: list[str]) -> str:
    """The matrix in %, own data in bold, with row means, off-diagonal means and a mean row."""
    header = ["model \\ data", *clients, "mean", "off-diag mean"]
    rows = []
    for i, ci in enumerate(clients):
        cells = [f"**{percent(v)}**" if i == j else percent(v) for j, v in enumerate(mat[i])]
        rows.append(
            [ci, *cells, percent(st["row_mean"][i]), percent(st["row_off_diagonal_mean"][i])]
        )
    rows.append(
        [
            "mean",
            *(percent(v) for v in st["column_mean"]),
            percent(statistics.fmean(st["row_mean"])),
            percent(st["off_diagonal_mean"]),
        ]
    )
    return grid(header, rows)


def _note(
    st: dict[str, Any], kind: str, split: str, pipeline: str, weights: str, last_round: int
) -> str:
    """What the table's rows, columns and weights are, under it."""
    picked = "the round model selection picked" if weights == "selected" else "the last round"
    if pipeline == "data":
        through = "each data client's own state (its own statistics, FedRDN Eq. 8)."
    else:
        through = "the model client's state."
    if kind != "local":
        whose = f" Weights of round {last_round} ({picked})."
    else:
        whose = (
            f" Local models: one round of each client's local training from round "
            f"{last_round}'s broadcast ({picked}; FedRDN Table 3)."
        )
    return (
        f"Row i = client i's {kind} model, column j = client j's {split} data; bold = own data. "
        f"Diagonal mean {percent(st['diagonal_mean'])}, off-diagonal mean "
        f"{percent(st['off_diagonal_mean'])}. Input pipeline: {through}{whose}"
    )


def local_models(sim: SavedRun) -> dict[str, dict[str, torch.Tensor]]:
    """Each training client's local model for ``cross_site(kind="local")``: the weights after
    its local update of round ``round + 1`` from the server's broadcast (the algorithm's
    own ``local_update``, with the run's augments and seeded batches:
    :meth:`~fedshift.runtime.rundir.saved.SavedRun.local_update`); the saved run is unchanged."""
    with torch.enable_grad():
        return {cid: sim.local_update(sim.round + 1, cid) for cid in sim.train_clients}


def _heatmap(mat: list[list[float]], clients: list[str], title: str, path: Path) -> Path:
    n = len(clients)
    vals = [[100 * v for v in row] for row in mat]
    fig, ax = plt.subplots(figsize=(1.2 + 0.9 * n, 1.0 + 0.8 * n))
    im = ax.imshow(vals, cmap="viridis", vmin=0, vmax=100)
    for i in range(n):
        for j in range(n):
            v = vals[i][j]
            txt = DASH if math.isnan(v) else f"{v:.1f}"
            ax.text(
                j,
                i,
                txt,
                ha="center",
                va="center",
                fontsize=8,
                color="black" if v > 60 else "white",
                fontweight="bold" if i == j else "normal",
            )
        ax.add_patch(plt.Rectangle((i - 0.5, i - 0.5), 1, 1, fill=False, lw=1.5, ec="red"))
    ax.set_xticks(range(n), clients, rotation=45, ha="right", fontsize=8)
    ax.set_yticks(range(n), clients, fontsize=8)
    ax.set_xlabel("data of client")
    ax.set_ylabel("model of client")
    ax.set_title(title, fontsize=8, wrap=True)
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    fig.tight_layout()
    with atomic_output(path) as tmp:
        fig.savefig(tmp, format=Path(path).suffix[1:] or "png", dpi=110)
    plt.close(fig)
    return path
