"""The papers' evaluation protocols, each one function and one ``fedshift protocol`` command.

* :func:`cross_site` (``fedshift protocol cross-site RUN_DIR``): the cross-site matrix of
  FedRDN's Table 3. ``M[i][j]`` = the task's metrics of client *i*'s evaluated model on client
  *j*'s split; with ``pipeline="data"`` site *j*'s images go through *j*'s own input pipeline
  (FedRDN normalises a site's test data with that site's statistics, Eq. 8), with
  ``pipeline="model"`` through *i*'s. ``kind="local"`` evaluates each client's *local* model
  (the model after its own local training, FedRDN Sec. 4.4 / Table 3) instead of the
  aggregated or personalised one.
* :func:`loco` (``fedshift protocol loco -c CONFIG``): leave-one-client-out federated domain
  generalisation (FedFA's Table 4): the config's own grid times ``federation.holdout`` = each
  client; the held-out target never trains, the model is selected on the source clients'
  validation score and the target's test score at that round is reported.
* :func:`sweep` (``fedshift protocol sweep -c CONFIG --key K --values ...``): one config key
  swept through the cached bench machinery, mean ± std over seeds per value (FedFA's Fig. 2 /
  Table 16 with ``federation.data_fraction``; FedRDN's Fig. 2 and HarmoFL's Fig. 5b with
  ``train.local_epochs``).
* :func:`rounds_to_threshold` (``fedshift protocol rounds RUN_ROOT... --thresholds``): the
  first evaluated round at which the mean score over clients reaches each threshold, as the
  number of clients grows (DisTrans's Table 5).
* :func:`tsne` (``fedshift protocol tsne RUN_DIR...``): t-SNE of the clients' test features,
  coloured by client, one panel per run (FedRDN's Fig. 3: a local model against a federated
  one).

Every protocol writes a Markdown table (``<name>.md``), the numbers behind it
(``<name>.json``) and, where it draws one, a figure (``<name>.png``) into its output folder
(default ``./protocol-<name>``). Runs are rebuilt with
:func:`fedshift.runtime.simulation.load_finished` (final-round checkpoint) or read from their
``metrics.jsonl`` / ``summary.json``; suites run through :func:`fedshift.bench.run_suite`, so
cells are cached by config digest and never run twice.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import math
import statistics
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402
import yaml  # noqa: E402
from tqdm.auto import tqdm  # noqa: E402

from fedshift.core.config import lookup
from fedshift.core.errors import ConfigError, FedshiftError  # noqa: E402
from fedshift.eval.stats import mean_std  # noqa: E402
from fedshift.eval.summary import selection_rule  # noqa: E402
from fedshift.eval.tables import flow_label, grid  # noqa: E402

PIPELINES = ("data", "model")
SPLITS = ("train", "val", "test")
KINDS = ("personal", "global")
#: ``cross-site --kind``: the evaluated kinds plus ``local`` (FedRDN's Table 3)
CROSS_SITE_KINDS = (*KINDS, "local")
DASH = "—"
_MISSING = object()


@dataclass
class ProtocolResult:
    """What a protocol produced: the printed text (caption, table, notes), the numbers and
    the files written (``md``, ``json``, ``png``, ``suite``)."""

    name: str
    text: str
    data: dict[str, Any]
    files: dict[str, Path] = field(default_factory=dict)


# ============================================================================ helpers
def _pct(x: float | None) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return DASH
    return f"{100 * x:.2f}"


def _pm(values: list[float]) -> str:
    if not values:
        return DASH
    m, sd = mean_std(values)
    return f"{_pct(m)} ± {_pct(sd)}"


def _jsonable(x: Any) -> Any:
    """NaN -> null, paths -> strings, tuples -> lists, recursively (strict JSON)."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_jsonable(v) for v in x]
    if isinstance(x, Path):
        return str(x)
    return x


def _out_dir(out: str | Path | None, name: str) -> Path:
    path = Path(out) if out is not None else Path(f"protocol-{name}")
    if path.exists() and not path.is_dir():
        raise FedshiftError(f"--out {path} exists and is not a folder; choose another path")
    path.mkdir(parents=True, exist_ok=True)
    return path


def _save(out: Path, name: str, title: str, text: str, data: dict) -> dict[str, Path]:
    md, js = out / f"{name}.md", out / f"{name}.json"
    md.write_text(f"# {title}\n\n{text}\n")
    js.write_text(json.dumps(_jsonable(data), indent=2) + "\n")
    return {"md": md, "json": js}


def _short(v: Any) -> str:
    if isinstance(v, list):
        return "[" + ",".join(_short(x) for x in v) + "]"
    if isinstance(v, dict):
        rest = ",".join(f"{k}={_short(x)}" for k, x in v.items() if k != "name")
        return f"{v.get('name', '?')}({rest})" if rest else str(v.get("name", v))
    return str(v)


def _lookup_missing(tree: dict, dotted: str) -> Any:
    return lookup(tree, dotted, _MISSING)


def _run_meta(sim) -> dict[str, Any]:
    """The summary-like fields :func:`flow_label` reads, from a rebuilt run."""
    return {
        "algorithm": sim.cfg.algorithm["name"],
        "algorithm_config": sim.cfg.algorithm,
        "augment": sim.cfg.augment,
        "implied": list(sim.implied),
    }


def run_label(meta: dict) -> str:
    """``fedavg``, ``fedavg +fedrdn``... (the algorithm and its flow when not ``base``)."""
    flow = flow_label(meta)
    return meta["algorithm"] + ("" if flow == "base" else f" {flow}")


def load_run(run_dir: str | Path):
    """A finished run rebuilt from its config and final checkpoint (``load_finished``), after
    checking the folder holds a finished run (``config.yaml``, ``checkpoint.pt`` and the
    ``summary.json`` written at the end)."""
    from fedshift.runtime.simulation import CHECKPOINT, load_finished

    path = Path(run_dir)
    if not path.is_dir():
        raise FedshiftError(f"{path} does not exist or is not a folder; give a run directory")
    missing = [f for f in ("config.yaml", CHECKPOINT, "summary.json") if not (path / f).is_file()]
    if missing:
        hint = (
            "the run did not finish; continue it with 'fedshift run --resume " + str(path) + "'"
            if missing == ["summary.json"]
            else "give the folder of one run (it holds config.yaml, checkpoint.pt, summary.json)"
        )
        raise FedshiftError(
            f"{path} is not a finished fedshift run (no {', '.join(missing)}): {hint}"
        )
    return load_finished(path)


def _setting_keys(raw: dict, exclude: Iterable[str] = ()) -> list[str]:
    """The config's own sweep keys that the (algorithm, flow) label does not already say and
    that seeds do not average over: they become a ``setting`` column."""
    skip = set(exclude)
    return [
        k
        for k in (raw.get("sweep") or {})
        if k != "seed"
        and k not in skip
        and not k.startswith("algorithm")
        and not k.startswith("augment")
    ]


def _row_key(s: dict) -> tuple[str, str, str]:
    return (s["algorithm"], flow_label(s), s.get("_setting", ""))


def _row_order(key: tuple[str, str, str]) -> tuple:
    algo, flow, setting = key
    return (algo, flow != "base", flow, setting)


# ============================================================================ 1. cross-site
@torch.no_grad()
def cross_site(
    run_dir: str | Path,
    pipeline: str = "data",
    split: str = "test",
    kind: str | None = None,
    out: str | Path | None = None,
    progress: bool = True,
) -> ProtocolResult:
    """The cross-site matrix (FedRDN's Table 3): ``M[i][j]`` = every metric of the task for
    client *i*'s model on client *j*'s ``split``. ``kind``: ``personal`` / ``global`` = the
    run's final-round weights of that kind (default: the kind the run evaluates; a ``local``
    run's personal model is a model trained on client *i* alone); ``local`` = client *i*'s
    local model, as in FedRDN's Table 3 ("generalization performance of local model",
    Sec. 4.4): the model client *i* obtains by one more round of local training (the run's
    ``train.local_epochs``, optimiser and augments, e.g. FedRDN's Eq. 7 draw) starting from
    what the server broadcasts after the final round, i.e. the w_k that client would upload
    in round T + 1. It is recomputed deterministically (seeded by the run's seed, round T + 1
    and the client); the run's stored state is left as it was. The run's checkpoint
    keeps only the aggregated model, not the local models the last round produced.

    ``pipeline="data"``: *j*'s images through *j*'s own input-pipeline state (FedRDN's test
    time, Eq. 8: a site normalises its data with its own statistics); ``"model"``: through
    *i*'s (the model's site brings its pre-processing along). Writes ``cross-site.md`` (rows =
    model's client, columns = data's client, diagonal in bold, row means and off-diagonal
    means), ``cross-site.json`` (every metric's matrix) and the heatmap ``cross-site.png``."""
    if pipeline not in PIPELINES:
        raise FedshiftError(f"--pipeline {pipeline!r}: choose one of {', '.join(PIPELINES)}")
    if split not in SPLITS:
        raise FedshiftError(f"--split {split!r}: choose one of {', '.join(SPLITS)}")
    sim = load_run(run_dir)
    kind = kind or sim.kinds[0]
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

    def stats(mat: list[list[float]]) -> dict[str, Any]:
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

    primary = sim.task.primary
    mat = mats[primary.name]
    st = stats(mat)
    meta = _run_meta(sim)
    header = ["model \\ data", *clients, "mean", "off-diag mean"]
    rows = []
    for i, ci in enumerate(clients):
        cells = [f"**{_pct(v)}**" if i == j else _pct(v) for j, v in enumerate(mat[i])]
        rows.append([ci, *cells, _pct(st["row_mean"][i]), _pct(st["row_off_diagonal_mean"][i])])
    rows.append(
        [
            "mean",
            *(_pct(v) for v in st["column_mean"]),
            _pct(statistics.fmean(st["row_mean"])),
            _pct(st["off_diagonal_mean"]),
        ]
    )
    at = f"round {sim.last_round}" if kind != "local" else f"local update {sim.last_round + 1}"
    caption = (
        f"Cross-site {split} {primary.label} (%) of {run_label(meta)} ({kind} models, {at}), "
        f"data through the {pipeline}'s client's input pipeline"
    )
    note = (
        f"Row i = client i's {kind} model, column j = client j's {split} data; bold = own data. "
        f"Diagonal mean {_pct(st['diagonal_mean'])}, off-diagonal mean "
        f"{_pct(st['off_diagonal_mean'])}. Input pipeline: "
        + (
            "each data client's own state (its own statistics, FedRDN Eq. 8)."
            if pipeline == "data"
            else "the model client's state."
        )
        + (
            " Final-round weights (checkpoint), not the round model selection picked."
            if kind != "local"
            else " Local models: one round of each client's local training from the final "
            "round's broadcast (FedRDN Table 3)."
        )
    )
    text = f"{caption}:\n\n{grid(header, rows)}\n\n_{note}_"
    data = {
        "protocol": "cross-site",
        "run_dir": str(run_dir),
        **meta,
        "flow": flow_label(meta),
        "kind": kind,
        "split": split,
        "pipeline": pipeline,
        "round": sim.last_round,
        "clients": clients,
        "metric": primary.name,
        "metric_labels": {m.name: m.label for m in sim.task.metrics},
        "matrices": mats,
        "stats": {m: stats(mats[m]) for m in names},
    }
    outp = _out_dir(out, "cross-site")
    files = _save(outp, "cross-site", "Cross-site evaluation", text, data)
    files["png"] = _heatmap(mat, clients, caption, outp / "cross-site.png")
    return ProtocolResult("cross-site", text, data, files)


def local_models(sim) -> dict[str, dict[str, torch.Tensor]]:
    """Each training client's local model for ``cross_site(kind="local")``: the weights after
    its local update of round ``last_round + 1`` from the server's broadcast (the algorithm's
    own ``local_update``, with the run's augments and seeded batches). The server, the client
    states and the ledger are restored afterwards, so the run is unchanged."""
    rnd = sim.last_round + 1
    saved = (copy.deepcopy(sim.states), sim.ledger.state_dict())
    out: dict[str, dict[str, torch.Tensor]] = {}
    try:
        with torch.enable_grad():
            for cid in sim.train_clients:
                sim.client_round(rnd, cid)
                out[cid] = {k: v.detach().clone() for k, v in sim.model.state_dict().items()}
    finally:
        sim.states = saved[0]
        sim.ledger.load_state_dict(saved[1])
    return out


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
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# ============================================================================ suites
def _expand(raw: dict, source: str) -> list:
    from fedshift.catalog import resolve
    from fedshift.core.config import expand_sweep

    return [resolve(one, source) for one in expand_sweep(raw, source)]


def _run_cells(
    raw: dict,
    suite_path: Path,
    runs_out: str | None,
    workers: int | None,
    threads: int | None,
    progress: bool,
) -> list[dict]:
    """Write the expanded suite, run it through bench (cached cells) and return the summaries,
    each with ``_cfg`` = its cell's resolved config dict."""
    from fedshift.bench import plan, run_suite

    suite_path.write_text(yaml.safe_dump(raw, sort_keys=False))
    cells = plan(suite_path, None, runs_out)
    summaries = run_suite(
        suite_path, None, out=runs_out, workers=workers, progress=progress, threads=threads
    )
    for c, s in zip(cells, summaries, strict=True):
        if Path(s["run_dir"]) != c.run_dir:  # run_suite keeps plan order; never mix them up
            raise FedshiftError(f"suite cell {c.run_dir} returned the summary of {s['run_dir']}")
        s["_cfg"] = c.cfg.to_dict()
    return summaries


def _with_settings(summaries: list[dict], keys: list[str]) -> None:
    for s in summaries:
        s["_setting"] = " ".join(f"{k}={_short(_lookup_missing(s['_cfg'], k))}" for k in keys)


# ============================================================================ 2. loco
def loco(
    config: str | Path | None,
    overrides: list[str] | None = None,
    workers: int | None = None,
    threads: int | None = None,
    out: str | Path | None = None,
    runs_out: str | None = None,
    progress: bool = True,
) -> ProtocolResult:
    """Leave-one-client-out federated domain generalisation (FedFA's Table 4).

    The config (with its own ``sweep``, e.g. algorithm x seed) gets one more sweep key,
    ``federation.holdout`` = ``[c]`` for each client ``c`` of its dataset; the suite is
    written to ``<out>/loco-suite.yaml`` and run by :func:`fedshift.bench.run_suite` (cells
    cached by config digest). A held-out client never trains; model selection uses the source
    clients' validation score only, and the target's test score at the selected round is its
    ``target_test_mean``. Table: one row per (algorithm, flow[, setting]), one column per
    target (mean over seeds) and the average over targets, mean ± std over seeds."""
    from fedshift.core.config import load_config

    source = str(config) if config else "defaults"
    raw = load_config(config, overrides)
    fed_section = raw.get("federation")
    if isinstance(fed_section, dict) and fed_section.get("holdout"):
        raise ConfigError(
            f"{source}: config key 'federation.holdout' is set; loco holds out each client "
            "in turn itself, so remove it"
        )
    if "federation.holdout" in (raw.get("sweep") or {}):
        raise ConfigError(
            f"{source}: the sweep already varies 'federation.holdout'; loco adds that key "
            "itself, so remove it from the sweep"
        )
    cfgs = _expand(raw, source)
    clients = _loco_clients(cfgs, source)
    grid_raw = copy.deepcopy(raw)
    grid_raw.setdefault("sweep", {})["federation.holdout"] = [[c] for c in clients]
    outp = _out_dir(out, "loco")
    summaries = _run_cells(grid_raw, outp / "loco-suite.yaml", runs_out, workers, threads, progress)
    _with_settings(summaries, _setting_keys(raw))
    text, data = loco_table(summaries, clients)
    data["suite"] = str(outp / "loco-suite.yaml")
    files = _save(outp, "loco", "Leave-one-client-out generalisation", text, data)
    files["suite"] = outp / "loco-suite.yaml"
    return ProtocolResult("loco", text, data, files)


def _loco_clients(cfgs: list, source: str) -> list[str]:
    """The dataset's clients (the same in every cell of the config's grid), after checking that
    every distinct cell has one global model to test a held-out client with."""
    from fedshift.data import load_dataset
    from fedshift.data.partition import apply_partition
    from fedshift.runtime.simulation import Simulation

    feds: dict[str, Any] = {}
    clients: list[str] | None = None
    checked: set[str] = set()
    for cfg in cfgs:
        key = json.dumps([cfg.dataset, cfg.partition], sort_keys=True, default=str)
        if key not in feds:
            feds[key] = load_dataset(cfg.dataset)  # before partition: Simulation applies it
            names = apply_partition(feds[key], cfg.partition).client_names
            if clients is not None and names != clients:
                raise ConfigError(
                    f"{source}: the grid's cells have different clients ({clients} vs {names}); "
                    "leave-one-client-out needs one set of clients: run each dataset apart"
                )
            clients = names
        assert clients is not None
        if len(clients) < 2:
            raise ConfigError(
                f"{source}: dataset {cfg.dataset['name']!r} has {len(clients)} client; "
                "leave-one-client-out needs at least 2"
            )
        d = cfg.to_dict()
        for k in ("seed", "name", "out", "sweep"):
            d.pop(k, None)
        sig = json.dumps(d, sort_keys=True, default=str)
        if sig in checked:
            continue
        checked.add(sig)
        fed_cfg = dataclasses.replace(cfg.federation, holdout=[clients[0]])
        probe = dataclasses.replace(cfg, federation=fed_cfg)
        try:  # builds the model and algorithm only; nothing runs, nothing is written
            Simulation(probe, Path("."), federation=feds[key], progress=False)
        except ConfigError as e:
            raise ConfigError(f"{source}: loco: {e}") from None
    assert clients is not None
    return clients


def loco_table(summaries: list[dict], clients: list[str]) -> tuple[str, dict]:
    """The leave-one-client-out table and its numbers from the cells' summaries (each holding
    out one client: ``summary["holdout"] == [target]``)."""
    if not summaries:
        raise FedshiftError("loco: no cells")
    groups: dict[tuple, dict[str, dict[int, dict]]] = defaultdict(lambda: defaultdict(dict))
    for s in summaries:
        hold = s.get("holdout") or []
        if len(hold) != 1 or s.get("target_test_mean") is None:
            raise FedshiftError(
                f"{s.get('run_dir')}: not a leave-one-client-out cell (holdout {hold})"
            )
        groups[_row_key(s)][hold[0]][s["seed"]] = s
    first = summaries[0]
    metric, label = first.get("metric", "acc"), first.get("metric_label", "accuracy")
    others = list(first.get("metrics", {}))
    with_setting = any(k[2] for k in groups)
    header = ["algorithm", "flow", *(["setting"] if with_setting else []), "seeds"]
    header += [*clients, "avg ± std"]
    rows, out_rows = [], []
    for key in sorted(groups, key=_row_order):
        algo, flow, setting = key
        by_target = groups[key]
        seeds = sorted({seed for t in by_target.values() for seed in t})
        targets: dict[str, Any] = {}
        cells = []
        for c in clients:
            per_seed = {seed: s["target_test_mean"] for seed, s in by_target.get(c, {}).items()}
            extra = {
                m: {
                    seed: s["metrics"][m]["test_per_client"][c]
                    for seed, s in by_target.get(c, {}).items()
                }
                for m in others
            }
            source_mean = {seed: s["test_mean"] for seed, s in by_target.get(c, {}).items()}
            mean = statistics.fmean(per_seed.values()) if per_seed else math.nan
            targets[c] = {
                "per_seed": per_seed,
                "mean": mean,
                "metrics": extra,
                "source_test_mean_per_seed": source_mean,
                "run_dirs": {seed: s["run_dir"] for seed, s in by_target.get(c, {}).items()},
                "best_round": {seed: s["best_round"] for seed, s in by_target.get(c, {}).items()},
            }
            cells.append(_pct(mean))
        complete = [seed for seed in seeds if all(seed in by_target.get(c, {}) for c in clients)]
        avg = {
            seed: statistics.fmean(by_target[c][seed]["target_test_mean"] for c in clients)
            for seed in complete
        }
        m, sd = mean_std(list(avg.values()))
        row = [algo, flow, *([setting] if with_setting else []), str(len(seeds)), *cells]
        row.append(_pm(list(avg.values())))
        rows.append(row)
        out_rows.append(
            {
                "algorithm": algo,
                "flow": flow,
                "setting": setting,
                "seeds": seeds,
                "targets": targets,
                "average": {"per_seed": avg, "mean": m, "std": sd},
            }
        )
    rule = (
        f"round with the best mean validation {label} over the source clients (earliest on "
        "ties; the held-out target never trains and takes no part in selection); the "
        f"target's test {label} at that round"
    )
    caption = f"Leave-one-client-out: test {label} (%) of each held-out target client"
    note = (
        f"Column = the client held out (target), mean over seeds; avg ± std = mean over targets "
        f"per seed, then mean ± sample std over the seeds with every target. Model selection: "
        f"{rule}."
    )
    text = f"{caption}:\n\n{grid(header, rows)}\n\n_{note}_"
    data = {
        "protocol": "loco",
        "metric": metric,
        "metric_label": label,
        "clients": clients,
        "model_selection": rule,
        "rows": out_rows,
    }
    return text, data


# ============================================================================ 3. sweep
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


def sweep(
    config: str | Path | None,
    key: str,
    values: str | list[Any],
    overrides: list[str] | None = None,
    workers: int | None = None,
    threads: int | None = None,
    out: str | Path | None = None,
    runs_out: str | None = None,
    progress: bool = True,
) -> ProtocolResult:
    """A one-key sweep through the cached bench machinery: the config's own grid (e.g.
    algorithm x seed) times ``key`` = each of ``values``. FedFA's Fig. 2 / Table 16:
    ``federation.data_fraction`` = 0.1, 0.25, 0.5, 1; FedRDN's Fig. 2 / HarmoFL's Fig. 5b:
    ``train.local_epochs`` = 1, 2, 5, 10. Table: one row per (algorithm, flow[, setting]),
    one column per value, mean ± std over seeds of the test score at the selected round;
    ``sweep.png``: the mean against the value with std error bars per row."""
    from fedshift.core.config import load_config

    source = str(config) if config else "defaults"
    vals = parse_values(values) if isinstance(values, str) else list(values)
    if not vals:
        raise ConfigError("--values: give at least one value")
    if key == "seed" or key.startswith("sweep"):
        raise ConfigError(f"--key {key}: seeds are what each cell averages over; sweep another key")
    raw = load_config(config, overrides)
    if key in (raw.get("sweep") or {}):
        raise ConfigError(
            f"{source}: the config's sweep already varies {key!r}; remove it from the sweep "
            "or choose another --key"
        )
    for cfg in _expand(raw, source):
        if _lookup_missing(cfg.to_dict(), key) is _MISSING:
            parent = key.rsplit(".", 1)[0] if "." in key else ""
            node = _lookup_missing(cfg.to_dict(), parent) if parent else cfg.to_dict()
            valid = ", ".join(sorted(node)) if isinstance(node, dict) else "(not a section)"
            where = f"under '{parent}'" if parent else "at the top level"
            raise ConfigError(
                f"{source}: config key '{key}' does not exist (algorithm "
                f"{cfg.algorithm['name']!r}); valid keys {where}: {valid}"
            )
    grid_raw = copy.deepcopy(raw)
    grid_raw.setdefault("sweep", {})[key] = vals
    outp = _out_dir(out, "sweep")
    summaries = _run_cells(
        grid_raw, outp / "sweep-suite.yaml", runs_out, workers, threads, progress
    )
    _with_settings(summaries, _setting_keys(raw, exclude=[key]))
    labels = [str(v) for v in vals]
    for s in summaries:
        got = _lookup_missing(s["_cfg"], key)
        idx = [i for i, v in enumerate(vals) if v == got]
        if not idx:
            raise FedshiftError(f"{s['run_dir']}: {key}={got!r} is not one of {vals}")
        s["_value"] = labels[idx[0]]
    text, data = sweep_table(summaries, key, labels)
    data["values"] = vals
    data["suite"] = str(outp / "sweep-suite.yaml")
    files = _save(outp, "sweep", f"Sweep over {key}", text, data)
    files["png"] = _sweep_png(data, vals, outp / "sweep.png")
    files["suite"] = outp / "sweep-suite.yaml"
    return ProtocolResult("sweep", text, data, files)


def sweep_table(summaries: list[dict], key: str, labels: list[str]) -> tuple[str, dict]:
    """Rows (algorithm, flow[, setting]) x columns = the swept values (``s["_value"]``), cells
    = mean ± std over seeds of the selected round's test score (every metric in the data)."""
    if not summaries:
        raise FedshiftError("sweep: no cells")
    first = summaries[0]
    metric, label = first.get("metric", "acc"), first.get("metric_label", "accuracy")
    others = list(first.get("metrics", {}))
    groups: dict[tuple, dict[str, dict[int, dict]]] = defaultdict(lambda: defaultdict(dict))
    for s in summaries:
        groups[_row_key(s)][s["_value"]][s["seed"]] = s
    with_setting = any(k[2] for k in groups)
    header = ["algorithm", "flow", *(["setting"] if with_setting else []), "seeds"]
    header += [f"{key}={v}" for v in labels]
    rows, out_rows = [], []
    for k in sorted(groups, key=_row_order):
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
            cells.append(_pm(list(per_seed.values())))
        rows.append([algo, flow, *([setting] if with_setting else []), str(len(seeds)), *cells])
        out_rows.append(
            {"algorithm": algo, "flow": flow, "setting": setting, "seeds": seeds, "points": points}
        )
    caption = f"Test {label} (%) against {key}, mean ± std over seeds"
    note = f"Model selection: {selection_rule(label)}."
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
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# ============================================================================ 4. rounds
def parse_thresholds(text: str | Iterable[float]) -> list[float]:
    """``"0.6,0.7,0.8"`` -> ``[0.6, 0.7, 0.8]``: fractions in (0, 1], each once."""
    items = [t.strip() for t in text.split(",")] if isinstance(text, str) else list(text)
    out = []
    for t in items:
        try:
            v = float(t)
        except (TypeError, ValueError):
            raise FedshiftError(
                f"--thresholds: {t!r} is not a number; give fractions such as 0.6,0.7,0.8"
            ) from None
        if not 0 < v <= 1 or math.isnan(v):
            raise FedshiftError(
                f"--thresholds: {t} is outside (0, 1]; thresholds are fractions of the metric "
                "(0.8 = 80 %)"
            )
        if v in out:
            raise FedshiftError(f"--thresholds: {t} is listed twice")
        out.append(v)
    if not out:
        raise FedshiftError("--thresholds: give at least one threshold, e.g. 0.6,0.7,0.8")
    return out


def _find_runs(roots: Iterable[str | Path]) -> list[Path]:
    found: list[Path] = []
    roots = list(roots)
    if not roots:
        raise FedshiftError("rounds: give at least one run directory or folder of runs")
    for root in roots:
        root = Path(root)
        if not root.exists():
            raise FedshiftError(f"{root} does not exist")
        found += sorted(p.parent for p in root.rglob("summary.json"))
    if not found:
        raise FedshiftError(f"no finished runs (summary.json) below {', '.join(map(str, roots))}")
    return list(dict.fromkeys(found))


def first_round_reaching(curve: dict[int, float], threshold: float) -> int | None:
    """The first evaluated round whose value reaches ``threshold`` (None if none does)."""
    for rnd in sorted(curve):
        if curve[rnd] >= threshold:
            return rnd
    return None


def mean_curve(rows: list[dict], kind: str, key: str) -> dict[int, float]:
    """Round -> mean over the (non-held-out) clients of ``row[kind][key]``."""
    by_round: dict[int, list[float]] = defaultdict(list)
    for r in rows:
        if kind in r and not r.get("holdout"):
            by_round[int(r["round"])].append(r[kind][key])
    return {rnd: statistics.fmean(v) for rnd, v in sorted(by_round.items())}


def rounds_to_threshold(
    roots: Iterable[str | Path],
    thresholds: str | Iterable[float],
    split: str = "test",
    by: str = "partition.clients",
    out: str | Path | None = None,
    progress: bool = True,
) -> ProtocolResult:
    """Rounds needed to reach accuracy thresholds (DisTrans's Table 5).

    For every finished run below ``roots`` (a folder with ``summary.json``, ``config.yaml``
    and ``metrics.jsonl``): the mean over clients (held-out clients excluded) of the ``split``
    primary metric of the evaluated model kind at each evaluated round, and the first round
    at which it reaches each threshold. Rows: (algorithm, flow, value of ``by`` in the run's
    ``config.yaml``; for the default ``partition.clients`` a dataset's own clients are
    counted when the partition has no such key); cells: mean over the seeds that reached the
    threshold, with how many of the seeds did (``—`` if none)."""
    from fedshift.core.config import load_yaml

    if split not in ("val", "test"):
        raise FedshiftError(f"--split {split!r}: choose val or test")
    ths = parse_thresholds(thresholds)
    runs = _find_runs(roots)
    per_run = []
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for d in tqdm(runs, desc="rounds", disable=not progress, leave=False):
        for f in ("config.yaml", "metrics.jsonl"):
            if not (d / f).is_file():
                raise FedshiftError(f"{d} has a summary.json but no {f}: not a fedshift run")
        s = json.loads((d / "summary.json").read_text())
        cfg = load_yaml(d / "config.yaml")
        value = _lookup_missing(cfg, by)
        if value is _MISSING:
            if by != "partition.clients":
                raise FedshiftError(
                    f"{d}/config.yaml has no key '{by}'; choose an existing --by key "
                    "(e.g. partition.clients, train.local_epochs)"
                )
            value = len(s["clients"])  # the dataset's own clients (partition none)
        rows = []
        with open(d / "metrics.jsonl") as fh:
            for n, line in enumerate(fh, 1):
                if line.strip():
                    try:
                        rows.append(json.loads(line))
                    except json.JSONDecodeError as e:
                        raise FedshiftError(f"{d}/metrics.jsonl line {n}: not JSON ({e})") from None
        kind, metric = s["evaluated_model"], s.get("metric", "acc")
        try:
            curve = mean_curve(rows, kind, f"{split}_{metric}")
        except KeyError as e:
            raise FedshiftError(f"{d}/metrics.jsonl: a {kind} row lacks {e}") from None
        if not curve:
            raise FedshiftError(f"{d}/metrics.jsonl has no evaluated rounds of the {kind} model")
        reached = {t: first_round_reaching(curve, t) for t in ths}
        rec = {
            "run_dir": str(d),
            "algorithm": s["algorithm"],
            "flow": flow_label(s),
            "by": value,
            "seed": s["seed"],
            "kind": kind,
            "metric": metric,
            "curve": curve,
            "first_round": reached,
        }
        per_run.append(rec)
        groups[(s["algorithm"], rec["flow"], json.dumps(value, default=str))].append(rec)
    first = per_run[0]
    label = _metric_label(runs[0], first["metric"])

    def order(k: tuple) -> tuple:
        v = json.loads(k[2])
        num = isinstance(v, int | float) and not isinstance(v, bool)
        return (k[0], k[1] != "base", k[1], not num, v if num else 0, str(v))

    header = ["algorithm", "flow", by, "seeds", *(f"≥ {100 * t:g}%" for t in ths)]
    rows_out, table = [], []
    for k in sorted(groups, key=order):
        recs = groups[k]
        cells, cols = [], {}
        for t in ths:
            got = [r["first_round"][t] for r in recs if r["first_round"][t] is not None]
            m = statistics.fmean(got) if got else None
            cols[str(t)] = {"mean": m, "reached": len(got), "of": len(recs), "rounds": got}
            txt = DASH if m is None else (f"{m:.0f}" if float(m).is_integer() else f"{m:.1f}")
            cells.append(f"{txt} ({len(got)}/{len(recs)})")
        table.append([k[0], k[1], str(json.loads(k[2])), str(len(recs)), *cells])
        rows_out.append(
            {
                "algorithm": k[0],
                "flow": k[1],
                "by": json.loads(k[2]),
                "seeds": sorted(r["seed"] for r in recs),
                "thresholds": cols,
            }
        )
    caption = f"Rounds to reach a mean {split} {label} (over clients) by {by}"
    note = (
        f"First evaluated round whose mean {split} {label} over clients (the evaluated model; "
        "held-out clients excluded) reaches the threshold; mean over the seeds that reached it "
        f"(reached/seeds); {DASH}: no seed reached it within its rounds."
    )
    text = f"{caption}:\n\n{grid(header, table)}\n\n_{note}_"
    data = {
        "protocol": "rounds",
        "split": split,
        "by": by,
        "thresholds": ths,
        "metric": first["metric"],
        "rows": rows_out,
        "runs": per_run,
    }
    outp = _out_dir(out, "rounds")
    files = _save(outp, "rounds", "Rounds to reach a threshold", text, data)
    return ProtocolResult("rounds", text, data, files)


def _metric_label(run_dir: Path, metric: str) -> str:
    s = json.loads((run_dir / "summary.json").read_text())
    return s.get("metric_labels", {}).get(metric, "accuracy" if metric == "acc" else metric)


# ============================================================================ 5. t-SNE
def subsample(n: int, k: int, seed: int) -> torch.Tensor:
    """``min(n, k)`` sorted indices of ``range(n)``, drawn without replacement with ``seed``."""
    if k >= n:
        return torch.arange(n)
    g = torch.Generator().manual_seed(seed)
    return torch.randperm(n, generator=g)[:k].sort().values


@torch.no_grad()
def features_of(sim, client: str, x: torch.Tensor, kind: str | None = None) -> torch.Tensor:
    """``model.features`` of ``client``'s evaluated model on its raw images ``x`` through its
    own input pipeline, in eval mode; spatial maps (B, C, H, W) (the U-Net's last decoder
    map) are global-average-pooled to (B, C)."""
    sim.model.load_state_dict(sim.weights_for(client, kind))
    sim.model.eval()
    state = sim.states.get(client)
    bs = sim.cfg.eval.batch_size
    outs = []
    for start in range(0, len(x), bs):
        xb = sim.pipeline.eval(x[start : start + bs].to(sim.device), state)
        z = sim.model.features(xb)
        if z.dim() > 2:
            z = z.flatten(2).mean(2)
        outs.append(z.double().cpu())
    return torch.cat(outs)


def tsne(
    run_dirs: list[str | Path],
    per_client: int = 150,
    out: str | Path | None = None,
    perplexity: float = 30.0,
    seed: int = 0,
    split: str = "test",
    labels: list[str] | None = None,
    progress: bool = True,
) -> ProtocolResult:
    """t-SNE (van der Maaten & Hinton, 2008; scikit-learn's ``TSNE``, PCA initialisation,
    ``random_state=seed``) of every client's ``split`` features, coloured by client, one panel
    per run (FedRDN's Fig. 3: a local model against the federated model). Features: each
    client's evaluated model on its own data through its own input pipeline
    (:func:`features_of`); ``per_client`` images per client drawn with ``seed + client
    index``. The perplexity is capped at (n - 1) / 3 for n points (scikit-learn needs
    perplexity < n); the value used is written into the figure and the JSON. The table gives
    the silhouette score of the client labels in the feature space and in the embedding
    (lower: clients' features mixed; higher: separated by client)."""
    from sklearn.manifold import TSNE
    from sklearn.metrics import silhouette_score

    if per_client < 2:
        raise FedshiftError(f"--per-client {per_client}: needs at least 2 images per client")
    if perplexity <= 0:
        raise FedshiftError(f"--perplexity {perplexity}: must be > 0")
    if split not in SPLITS:
        raise FedshiftError(f"--split {split!r}: choose one of {', '.join(SPLITS)}")
    if not run_dirs:
        raise FedshiftError("tsne: give at least one run directory")
    if labels is not None and len(labels) != len(run_dirs):
        raise FedshiftError(f"--labels: {len(labels)} labels for {len(run_dirs)} runs")
    panels = []
    for r, d in enumerate(tqdm(run_dirs, desc="t-SNE", disable=not progress, leave=False)):
        sim = load_run(d)
        feats, who = [], []
        for ci, c in enumerate(sim.fed.clients):
            data = c.split(split)
            idx = subsample(len(data), per_client, seed + ci)
            feats.append(features_of(sim, c.name, data.x[idx]))
            who += [c.name] * len(idx)
        z = torch.cat(feats).numpy()
        n = len(z)
        if n < 4:
            raise FedshiftError(f"{d}: only {n} {split} images in all; t-SNE needs at least 4")
        perp = min(float(perplexity), (n - 1) / 3)
        emb = TSNE(
            n_components=2,
            perplexity=perp,
            init="pca",
            learning_rate="auto",
            random_state=seed,
        ).fit_transform(z)
        multi = len(set(who)) > 1
        meta = _run_meta(sim)
        panels.append(
            {
                "run_dir": str(d),
                "label": labels[r] if labels else f"{run_label(meta)} ({sim.kinds[0]})",
                "kind": sim.kinds[0],
                "clients": sim.fed.client_names,
                "points": len(who),
                "feature_dim": int(z.shape[1]),
                "perplexity": perp,
                "silhouette_features": float(silhouette_score(z, who)) if multi else math.nan,
                "silhouette_embedding": float(silhouette_score(emb, who)) if multi else math.nan,
                "x": emb[:, 0].tolist(),
                "y": emb[:, 1].tolist(),
                "client": who,
            }
        )
    header = [
        "run",
        "model",
        "points",
        "feature dim",
        "perplexity",
        "silhouette (features)",
        "silhouette (t-SNE)",
    ]
    rows = [
        [
            p["label"],
            p["kind"],
            str(p["points"]),
            str(p["feature_dim"]),
            f"{p['perplexity']:.1f}",
            f"{p['silhouette_features']:.3f}",
            f"{p['silhouette_embedding']:.3f}",
        ]
        for p in panels
    ]
    caption = f"t-SNE of {split} features by client (up to {per_client} images per client)"
    note = (
        "Silhouette of the client labels (in [-1, 1]): high = features cluster by client "
        f"(domain-specific), near 0 = clients mixed. TSNE(init=pca, random_state={seed})."
    )
    text = f"{caption}:\n\n{grid(header, rows)}\n\n_{note}_"
    data = {
        "protocol": "tsne",
        "split": split,
        "per_client": per_client,
        "seed": seed,
        "panels": panels,
    }
    outp = _out_dir(out, "tsne")
    files = _save(outp, "tsne", "t-SNE of client features", text, data)
    files["png"] = _tsne_png(panels, outp / "tsne.png")
    return ProtocolResult("tsne", text, data, files)


def _tsne_png(panels: list[dict], path: Path) -> Path:
    names = list(dict.fromkeys(c for p in panels for c in p["clients"]))
    cmap = plt.get_cmap("tab10" if len(names) <= 10 else "tab20")
    colour = {c: cmap(i % cmap.N) for i, c in enumerate(names)}
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 4.2), squeeze=False)
    for ax, p in zip(axes[0], panels, strict=True):
        for c in p["clients"]:
            pts = [(x, y) for x, y, w in zip(p["x"], p["y"], p["client"], strict=True) if w == c]
            ax.scatter([a for a, _ in pts], [b for _, b in pts], s=8, color=colour[c], label=c)
        ax.set_title(f"{p['label']}\nperplexity {p['perplexity']:.1f}", fontsize=9)
        ax.set_xticks([])
        ax.set_yticks([])
    axes[0][-1].legend(fontsize=7, markerscale=2, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# ============================================================================ the CLI
def _print(res: ProtocolResult) -> int:
    print(res.text)
    print()
    for k, p in res.files.items():
        print(f"{k}: {p}")
    return 0


def _cmd_cross_site(args: argparse.Namespace) -> int:
    return _print(
        cross_site(args.run_dir, args.pipeline, args.split, args.kind, args.out, not args.quiet)
    )


def _cmd_loco(args: argparse.Namespace) -> int:
    return _print(
        loco(
            args.config,
            args.overrides,
            args.workers,
            args.threads,
            args.out,
            args.runs,
            not args.quiet,
        )
    )


def _cmd_head_finetune(args: argparse.Namespace) -> int:
    from fedshift.head_finetune import head_finetune

    return _print(
        head_finetune(
            args.config,
            args.overrides,
            args.epochs,
            args.workers,
            args.threads,
            args.out,
            args.runs,
            not args.quiet,
        )
    )


def _cmd_sweep(args: argparse.Namespace) -> int:
    return _print(
        sweep(
            args.config,
            args.key,
            args.values,
            args.overrides,
            args.workers,
            args.threads,
            args.out,
            args.runs,
            not args.quiet,
        )
    )


def _cmd_rounds(args: argparse.Namespace) -> int:
    return _print(
        rounds_to_threshold(
            args.runs, args.thresholds, args.split, args.by, args.out, not args.quiet
        )
    )


def _cmd_tsne(args: argparse.Namespace) -> int:
    labels = [x.strip() for x in args.labels.split(",")] if args.labels else None
    return _print(
        tsne(
            args.runs,
            args.per_client,
            args.out,
            args.perplexity,
            args.seed,
            args.split,
            labels,
            not args.quiet,
        )
    )


def _suite_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("-c", "--config", help="YAML run config (may have its own sweep grid)")
    p.add_argument("overrides", nargs="*", help="key=value overrides, e.g. train.rounds=100")
    p.add_argument("--workers", type=int, help="parallel processes (default: cores // 2)")
    p.add_argument("--threads", type=int, help="torch threads per worker")
    p.add_argument("--runs", help="root folder for the cells' run directories (config 'out')")


def add_parser(sub) -> None:
    """Add ``fedshift protocol {cross-site,loco,sweep,rounds,head-finetune,tsne}`` to the
    ``sub``-commands of the main parser; each sets ``fn`` to a handler returning the exit code."""
    p = sub.add_parser(
        "protocol",
        help="the papers' evaluation protocols "
        "(cross-site, loco, sweep, rounds, head-finetune, tsne)",
    )
    ps = p.add_subparsers(dest="protocol", required=True)

    def common(q: argparse.ArgumentParser, name: str) -> None:
        q.add_argument(
            "--out", default=f"protocol-{name}", help=f"output folder (default: ./protocol-{name})"
        )
        q.add_argument("--quiet", action="store_true", help="no progress bars")

    cs = ps.add_parser("cross-site", help="client i's model on client j's data (FedRDN Tab. 3)")
    cs.add_argument("run_dir", help="a finished run directory")
    cs.add_argument(
        "--pipeline",
        choices=PIPELINES,
        default="data",
        help="whose input pipeline state the data goes through (default: data)",
    )
    cs.add_argument("--split", choices=SPLITS, default="test")
    cs.add_argument(
        "--kind",
        choices=CROSS_SITE_KINDS,
        help="model kind (default: the evaluated one); local = each client's local model "
        "after one more round of its own training (FedRDN Table 3)",
    )
    common(cs, "cross-site")
    cs.set_defaults(fn=_cmd_cross_site)

    lo = ps.add_parser("loco", help="leave-one-client-out generalisation (FedFA Tab. 4)")
    _suite_args(lo)
    common(lo, "loco")
    lo.set_defaults(fn=_cmd_loco)

    sw = ps.add_parser("sweep", help="one config key swept, mean ± std over seeds")
    _suite_args(sw)
    sw.add_argument("--key", required=True, help="dotted config key, e.g. train.local_epochs")
    sw.add_argument("--values", required=True, help="comma-separated values, e.g. 1,2,5,10")
    common(sw, "sweep")
    sw.set_defaults(fn=_cmd_sweep)

    ro = ps.add_parser("rounds", help="rounds to reach thresholds by #clients (DisTrans Tab. 5)")
    ro.add_argument("runs", nargs="+", help="run directories or folders holding them")
    ro.add_argument("--thresholds", required=True, help="fractions in (0, 1], e.g. 0.6,0.7,0.8")
    ro.add_argument("--split", choices=["val", "test"], default="test")
    ro.add_argument(
        "--by",
        default="partition.clients",
        help="config key of the row's setting (default: partition.clients)",
    )
    common(ro, "rounds")
    ro.set_defaults(fn=_cmd_rounds)

    hf = ps.add_parser(
        "head-finetune", help="train on a data fraction, retrain only the head (FRAug Tab. 1)"
    )
    _suite_args(hf)
    hf.add_argument("--epochs", type=int, default=10, help="head epochs (default 10)")
    common(hf, "head-finetune")
    hf.set_defaults(fn=_cmd_head_finetune)

    ts = ps.add_parser("tsne", help="t-SNE of test features by client (FedRDN Fig. 3)")
    ts.add_argument("runs", nargs="+", help="finished run directories, one panel each")
    ts.add_argument("--per-client", type=int, default=150, help="images per client (150)")
    ts.add_argument("--perplexity", type=float, default=30.0)
    ts.add_argument("--seed", type=int, default=0, help="subsampling and t-SNE seed (0)")
    ts.add_argument("--split", choices=SPLITS, default="test")
    ts.add_argument("--labels", help="comma-separated panel titles (default: run labels)")
    common(ts, "tsne")
    ts.set_defaults(fn=_cmd_tsne)
