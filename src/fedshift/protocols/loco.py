"""Leave-one-client-out federated domain generalisation, FedFA's Table 4
(``fedshift protocol loco -c CONFIG``).

The config's own grid times ``federation.holdout`` = each client; the held-out target never
trains, the model is selected on the source clients' validation score and the target's test
score at that round is reported.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import statistics
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fedshift.core.errors import ConfigError, FedshiftError
from fedshift.data.common.sites import name_hint
from fedshift.eval.stats import mean_std, paired_ttest
from fedshift.eval.tables import grid
from fedshift.protocols.common import (
    ProtocolResult,
    SuiteOptions,
    expand_configs,
    fedavg_at_several_settings,
    label_rows,
    mean_std_text,
    percent,
    place,
    reference_row,
    row_order,
    save_outputs,
    setting_keys,
    site_columns,
    with_settings,
)


def loco(options: SuiteOptions) -> ProtocolResult:
    """Leave-one-client-out federated domain generalisation (FedFA's Table 4).

    The config of ``options`` (with its own ``sweep``, e.g. algorithm x seed) gets one more
    sweep key, ``federation.holdout`` = ``[c]`` for each client ``c`` of its dataset; the
    suite is
    written to ``<out>/loco-suite.yaml`` and run by :func:`fedshift.bench.run_suite` (cells
    cached by config digest). A held-out client never trains; model selection uses the source
    clients' validation score only, and the target's test score at the selected round is its
    ``target_test_mean``. Table: one row per (algorithm, flow[, setting]), one column per
    target (mean over seeds) and the average over targets, mean ± std over seeds."""
    cells = held_out_cells(options, "loco")
    text, data = loco_table(cells.summaries, cells.clients)
    data["suite"] = str(cells.suite)
    files = save_outputs(cells.out, "loco", "Leave-one-client-out generalisation", text, data)
    files["suite"] = cells.suite
    return ProtocolResult("loco", text, data, files)


@dataclasses.dataclass(frozen=True)
class HeldOutCells:
    """The leave-one-client-out cells of a config's grid, run (:func:`held_out_cells`)."""

    raw: dict
    clients: list[str]
    summaries: list[dict]
    out: Path
    suite: Path


def held_out_cells(
    options: SuiteOptions,
    name: str,
    reuse: bool | Callable[[Any, Path], bool] = True,
    new_site: bool = False,
    sites: list[str] | None = None,
    after: Callable[[str], Any] | None = None,
) -> HeldOutCells:
    """The config's grid times ``federation.holdout`` = each client (or each of ``sites``,
    checked to be clients of the dataset, in the dataset's order; :func:`held_out_grid`),
    written to ``<out>/<name>-suite.yaml`` and run through bench (cells cached by config
    digest, so ``loco`` and ``new-site`` with the same ``--runs`` train each cell once).
    ``reuse``: take cells committed in ``results/`` (False when the cells' models are loaded,
    or which to take: :meth:`SuiteOptions.run_cells`); ``after(run_dir)``: bench's hook on
    each cell it trains; ``new_site``: also accept algorithms whose held-out site takes the
    sources' local tensors (:meth:`~fedshift.algorithms.base.Algorithm.has_new_site_answer`:
    FedBN, FRAug, DisTrans), which the run itself does not score."""
    raw, clients, grid_raw = held_out_grid(options, name, new_site, sites)
    outp = options.output_dir(name)
    suite = outp / f"{name}-suite.yaml"
    summaries = options.run_cells(grid_raw, suite, reuse=reuse, after=after)
    with_settings(summaries, setting_keys(raw), raw)
    return HeldOutCells(raw, clients, summaries, outp, suite)


def held_out_grid(
    options: SuiteOptions, name: str, new_site: bool = False, sites: list[str] | None = None
) -> tuple[dict, list[str], dict]:
    """The raw config of ``options``, the clients held out in turn and the suite that holds
    each out (the config's own grid times ``federation.holdout``; with clients dealt from
    domains, ``partition.keep`` too): what :func:`held_out_cells` runs, planned without
    running (the committed results' digests are checked against it)."""
    source = options.source
    raw = options.load()
    fed_section = raw.get("federation")
    if isinstance(fed_section, dict) and fed_section.get("holdout"):
        raise ConfigError(
            f"{source}: config key 'federation.holdout' is set; {name} holds out each client "
            "in turn itself, so remove it"
        )
    if "federation.holdout" in (raw.get("sweep") or {}):
        raise ConfigError(
            f"{source}: the sweep already varies 'federation.holdout'; {name} adds that key "
            "itself, so remove it from the sweep"
        )
    cfgs = expand_configs(raw, source)
    clients = _loco_clients(cfgs, source, name, new_site)
    if sites is not None:
        unknown = [c for c in sites if c not in clients]
        if unknown or not sites:
            raise ConfigError(
                f"{source}: --sites {','.join(sites)}: {unknown or 'none given'}; "
                f"the dataset's clients are {', '.join(clients)}{name_hint(unknown, clients)}"
            )
        clients = [c for c in clients if c in sites]
    grid_raw = copy.deepcopy(raw)
    grid = grid_raw.setdefault("sweep", {})
    if _dealt_from_domains(cfgs):
        # clients dealt from domains (partition.name=domains): a held-out site is a whole
        # domain kept out of the deal (partition.keep), set together with the holdout
        cells = grid.pop("cell", None) or [{}]
        grid["cell"] = [
            {**cell, "partition.keep": [c], "federation.holdout": [c]}
            for cell in cells
            for c in clients
        ]
    else:
        grid["federation.holdout"] = [[c] for c in clients]
    return raw, clients, grid_raw


def _dealt_from_domains(cfgs: list) -> bool:
    """Whether the grid's cells deal their clients from the dataset's domains; then the sites
    a protocol holds out are the domains (each kept whole), not the dealt clients."""
    names = {cfg.partition.name for cfg in cfgs}
    if "domains" in names and len(names) > 1:
        raise ConfigError(
            "the grid mixes partition 'domains' with other partitions; holding out a site "
            "means a domain for one and a client for the other: run them apart"
        )
    return names == {"domains"}


def _loco_clients(cfgs: list, source: str, name: str = "loco", new_site: bool = False) -> list[str]:
    """The dataset's clients (the same in every cell of the config's grid), after checking that
    every distinct cell has a model to test a held-out client with (one global model; with
    ``new_site``, or a personal part the sources give a new site)."""
    from fedshift.data import load_dataset
    from fedshift.data.partition import apply_partition
    from fedshift.runtime.simulation import Simulation

    feds: dict[str, Any] = {}
    clients: list[str] | None = None
    checked: set[str] = set()
    for cfg in cfgs:
        sections = [cfg.dataset.to_dict(), cfg.partition.to_dict()]
        key = json.dumps(sections, sort_keys=True, default=str)
        if key not in feds:
            feds[key] = load_dataset(cfg.dataset)  # before partition: Simulation applies it
            names = (
                feds[key].client_names  # the domains: each held out whole (partition.keep)
                if cfg.partition.name == "domains"
                else apply_partition(feds[key], cfg.partition).client_names
            )
            if clients is not None and names != clients:
                raise ConfigError(
                    f"{source}: the grid's cells have different clients ({clients} vs {names}); "
                    "leave-one-client-out needs one set of clients: run each dataset apart"
                )
            clients = names
        assert clients is not None
        if len(clients) < 2:
            raise ConfigError(
                f"{source}: dataset {cfg.dataset.name!r} has {len(clients)} client; "
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
        if cfg.partition.name == "domains":
            kept = dataclasses.replace(cfg.partition.params, keep=[clients[0]])
            probe = dataclasses.replace(
                probe, partition=dataclasses.replace(cfg.partition, params=kept)
            )
        try:  # builds the model and algorithm only; nothing runs, nothing is written
            sim = Simulation(probe, Path("."), federation=feds[key], progress=False)
        except ConfigError as e:
            raise ConfigError(f"{source}: {name}: {e}") from None
        if not new_site and not sim.algo.has_global_model:
            raise ConfigError(
                f"{source}: loco: algorithm {cfg.algorithm.name!r} keeps client-local tensors, "
                "so a held-out client has no model of the run to be tested with; "
                "leave-one-client-out needs an algorithm with one global model. "
                "`fedshift protocol new-site` gives a new site this algorithm's answer (the "
                "shared layers with the sources' mean local tensors, BN statistics "
                "re-estimated on the site: AdaBN)"
            )
    assert clients is not None
    return clients


def loco_table(summaries: list[dict], clients: list[str]) -> tuple[str, dict]:
    """The leave-one-client-out table and its numbers from the cells' summaries (each holding
    out one client: ``summary["holdout"] == [target]``)."""
    if not summaries:
        raise FedshiftError("loco: no cells")
    groups: dict[tuple, dict[str, dict[int, dict]]] = defaultdict(lambda: defaultdict(dict))
    label_rows(summaries, site_columns(summaries))  # the held-out client is the columns
    for s in summaries:
        hold = s.get("holdout") or []
        if len(hold) != 1 or s.get("target_test_mean") is None:
            raise FedshiftError(
                f"{s.get('run_dir')}: not a leave-one-client-out cell (holdout {hold})"
            )
        place(groups, s, hold[0], s["seed"], s, "loco")
    first = summaries[0]
    metric, label = first.get("metric", "acc"), first.get("metric_label", "accuracy")
    others = list(first.get("metrics", {}))
    with_setting = any(k[2] for k in groups)
    header = ["algorithm", "flow", *(["setting"] if with_setting else []), "seeds"]
    header += [*clients, "avg ± std"]
    rows, out_rows = [], []
    for key in sorted(groups, key=row_order):
        algo, flow, setting = key
        numbers = _loco_row(groups[key], clients, others)
        row = [algo, flow, *([setting] if with_setting else []), str(len(numbers["seeds"]))]
        row += [percent(numbers["targets"][c]["mean"]) for c in clients]
        row.append(mean_std_text(list(numbers["average"]["per_seed"].values())))
        rows.append(row)
        out_rows.append({"algorithm": algo, "flow": flow, "setting": setting, **numbers})
    ref_name = _add_p_values(header, rows, out_rows)
    rule = (
        f"round with the best mean validation {label} over the source clients (earliest on "
        "ties; the held-out target never trains and takes no part in selection); the "
        f"target's test {label} at that round"
    )
    caption = f"Leave-one-client-out: test {label} (%) of each held-out target client"
    note = (
        f"Column = the client held out (target), mean over seeds; avg ± std = mean over targets "
        f"per seed, then mean ± sample std over the seeds with every target; p: paired t-test "
        f"of that average over seeds. Model selection: {rule}."
    )
    text = f"{caption}:\n\n{grid(header, rows)}\n\n_{note}_"
    data = {
        "protocol": "loco",
        "metric": metric,
        "metric_label": label,
        "clients": clients,
        "model_selection": rule,
        "reference": ref_name,
        "rows": out_rows,
    }
    return text, data


def _loco_row(by_target: dict[str, dict[int, dict]], clients: list[str], others: list[str]) -> dict:
    """One row's numbers: its seeds, each target's scores and the average over targets per
    seed (over the seeds that have every target), with its mean and std."""
    seeds = sorted({seed for t in by_target.values() for seed in t})
    targets = {c: _target(by_target.get(c, {}), c, others) for c in clients}
    complete = [seed for seed in seeds if all(seed in by_target.get(c, {}) for c in clients)]
    avg = {
        seed: statistics.fmean(by_target[c][seed]["target_test_mean"] for c in clients)
        for seed in complete
    }
    m, sd = mean_std(list(avg.values()))
    return {"seeds": seeds, "targets": targets, "average": {"per_seed": avg, "mean": m, "std": sd}}


def _target(runs: dict[int, dict], c: str, others: list[str]) -> dict[str, Any]:
    """Held-out client ``c``'s numbers from its runs (by seed)."""
    per_seed = {seed: s["target_test_mean"] for seed, s in runs.items()}
    return {
        "per_seed": per_seed,
        "mean": statistics.fmean(per_seed.values()) if per_seed else math.nan,
        "metrics": {
            m: {seed: s["metrics"][m]["test_per_client"][c] for seed, s in runs.items()}
            for m in others
        },
        "source_test_mean_per_seed": {seed: s["test_mean"] for seed, s in runs.items()},
        "run_dirs": {seed: s["run_dir"] for seed, s in runs.items()},
        "best_round": {seed: s["best_round"] for seed, s in runs.items()},
    }


def _add_p_values(header: list[str], rows: list[list[str]], out_rows: list[dict]) -> str:
    """A paired t-test (over seeds) of each row's average against FedAvg's at the row's own
    setting (:func:`~fedshift.protocols.common.reference_row`; else the first row's), as a
    column and ``p_vs_reference``; returns the reference row's name."""
    keys = [(r["algorithm"], r["flow"], r.get("setting", "")) for r in out_rows]
    refs = [keys.index(reference_row(k, keys) or keys[0]) for k in keys]
    ref_name = " ".join(
        x for x in (keys[refs[0]][0], "" if keys[refs[0]][1] == "base" else keys[refs[0]][1]) if x
    )
    if fedavg_at_several_settings(keys):
        ref_name += " (same setting, else the first)"
    if len(out_rows) > 1:
        header.append(f"p vs {ref_name}")
        for i, (row, out) in enumerate(zip(rows, out_rows, strict=True)):
            base = out_rows[refs[i]]["average"]["per_seed"]
            pv = None if i == refs[i] else paired_ttest(out["average"]["per_seed"], base)
            out["p_vs_reference"] = pv
            row.append("" if pv is None else f"{pv:.3f}")
    return ref_name
