"""``fedshift protocol new-site``: a site that never trained, and what it can do about it.

For each client of the config's dataset held out in turn and each run of the config's grid
(algorithm x seed ...), trained exactly as :func:`fedshift.protocols.loco` trains it (the same
cells, cached by config digest: ``loco`` and ``new-site`` with the same ``--runs`` train each
cell once), the held-out site's test score with each adaptation variant
(:data:`VARIANTS`), from the least target information to the most:

* ``global``: the run's model at the round model selection picked on the sources'
  validation score, as the run scores a held-out site (= ``loco``'s number). Its input
  pipeline is the method's own for a site that never trained: FedRDN normalises the site
  with its own statistics (FedRDN Eq. 8), HarmoFL rebuilds its images with the global
  amplitude (HarmoFL Eq. 4). Methods without a global model whose personal part is BN
  tensors or DisTrans's offset (:meth:`~fedshift.algorithms.base.Algorithm.
  has_new_site_answer`: FedBN, FRAug, DisTrans) give the site the shared layers with the
  uniform mean of the sources' local tensors (:func:`new_site_weights`): FedBN's and FRAug's
  BN affine parameters and running statistics, DisTrans's offset (what the server gives a
  source in ``aggregation=avg``; the mean of the sources' own offsets otherwise).
* ``adabn``: the same weights with every BN layer's running statistics re-estimated on the
  site's unlabelled training images (AdaBN, Li et al., "Revisiting Batch Normalization For
  Practical Domain Adaptation", ICLR-W 2017 / Pattern Recognition 2018): statistics reset,
  one pass over the images with the BN layers in training mode and ``momentum=None`` (the
  cumulative average over the batches), everything else in eval mode, no gradient, the
  weights untouched (:func:`adabn`). For FedBN / FRAug / DisTrans with local BN this is the
  standard answer for a new site: shared layers + the site's own BN statistics. ``—`` for a
  model without BN running statistics (``model.bn=harmofl``, no BN).
* ``test-time norm``: the test-time input normalisation the method defines, where it defines
  one (:func:`test_time_norm`). FedRDN (``augment: fedrdn``): the site's own channel
  statistics (Eq. 5-6, Eq. 8), which is already how the run scores a new site, so the row
  repeats ``global``; FedRDN-V (``fedrdn_v``, Eq. 9) and ``norm`` (Eq. 4): the site's own
  statistics replace the federation's average / the fixed constants (computed); HarmoFL
  (``ampnorm``): the global amplitude (Eq. 4), already in ``global``. Every other method,
  FedFA included (its FFA layers are identity in eval mode), defines none: ``—``.
* ``finetune-k`` (k = 1, 5, 10): the ``global`` model's prediction head
  (``model.classifier``) trained on the embeddings of k labelled images per class of the
  site's training split (segmentation: k labelled images), the extractor frozen
  (:func:`fedshift.protocols.head_finetune.finetune_head`, the run's optimiser settings and
  training loss, ``--epochs`` epochs). The images are drawn by :func:`select_shots`: seeded
  by the run's seed and the site only, so every method of a seed gets the same images, and
  the k = 1 images are among the k = 5 ones (one permutation per class, its first k).
* ``select``: model selection among the sources' models with the site's unlabelled training
  images, after FedSM (Xu et al., "Closing the Generalization Gap of Cross-silo Federated
  Medical Image Segmentation", CVPR 2022), which trains a selector that routes each test
  image to the model of the source it resembles. fedshift's rule needs no selector: each
  source's model (its personal model; for a global-model method its local model after one
  more local update from the selected round's broadcast, as ``cross-site --kind local``)
  predicts the site's unlabelled training images, and the model with the lowest mean
  prediction entropy (per image, per pixel for segmentation) is chosen for the whole site.

Tables: one per method (rows: the variants; columns: the held-out sites, mean ± std over
seeds, and their average per seed, mean ± std), a summary across methods (the average over
sites per variant), paired t-tests over seeds against FedAvg's same variant
(:func:`fedshift.eval.stats.paired_ttest`); ``new-site.md`` / ``new-site.json``, written
atomically.
"""

from __future__ import annotations

import copy
import math
import statistics
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from fedshift.core.errors import ConfigError, FedshiftError
from fedshift.eval.stats import mean_std, paired_ttest
from fedshift.eval.tables import grid
from fedshift.protocols.common import (
    DASH,
    ProtocolResult,
    SuiteOptions,
    label_rows,
    load_run,
    mean_std_text,
    row_key,
    row_order,
    save_outputs,
)
from fedshift.protocols.head_finetune import _say, finetune_head
from fedshift.protocols.loco import held_out_cells
from fedshift.runtime.progress import fmt_duration

#: ``--shots``: labelled images per class for ``finetune-k``
SHOTS = (1, 5, 10)
#: the variants, in table order (``finetune-k`` for each k of the shots)
BASE_VARIANTS = ("global", "adabn", "test-time norm")


def variants(shots: tuple[int, ...] = SHOTS) -> list[str]:
    return [*BASE_VARIANTS, *(f"finetune-{k}" for k in shots), "select"]


VARIANTS = tuple(variants())


def new_site(
    options: SuiteOptions,
    shots: tuple[int, ...] = SHOTS,
    epochs: int = 50,
    weights: str = "selected",
    sites: tuple[str, ...] | None = None,
) -> ProtocolResult:
    """Run the config's leave-one-client-out cells (as ``loco``; cached) and score each
    held-out site with every variant (module docstring). ``sites``: the clients to hold out
    (default: each in turn, as loco); ``shots``: the k of ``finetune-k``;
    ``epochs``: head-training epochs over the k-shot embeddings; ``weights``: each run's state
    at the selected round (default, ``loco``'s) or the last."""
    if epochs < 1:
        raise ConfigError(f"--epochs must be >= 1, got {epochs}")
    if not shots or any(k < 1 for k in shots) or len(set(shots)) != len(shots):
        raise ConfigError(f"--shots must be distinct integers >= 1, got {list(shots)}")
    say = _say if options.progress else lambda msg: None
    cells = held_out_cells(
        options,
        "new-site",
        reuse=False,
        new_site=True,
        sites=None if sites is None else list(sites),
    )
    per_run: dict[str, dict] = {}
    started = time.monotonic()
    n = len(cells.summaries)
    for i, s in enumerate(cells.summaries, 1):
        say(f"new-site: run {i}/{n} ({Path(s['run_dir']).name}): adapting to {s['holdout'][0]}")
        per_run[s["run_dir"]] = adapt_run(s["run_dir"], tuple(shots), epochs, weights)
        left = (time.monotonic() - started) / i * (n - i)
        g = per_run[s["run_dir"]]["scores"]["global"]
        say(f"new-site: run {i}/{n} done (global {100 * g:.2f}); ETA {fmt_duration(left)}")
    text, data = new_site_tables(cells.summaries, per_run, cells.clients, tuple(shots), epochs)
    data["suite"] = str(cells.suite)
    data["weights"] = weights
    files = save_outputs(cells.out, "new-site", "A site that never trained", text, data)
    files["suite"] = cells.suite
    return ProtocolResult("new-site", text, data, files)


# ============================================================================ the variants
def new_site_weights(sim: Any) -> dict[str, torch.Tensor]:
    """The model a site that never trained takes from a run whose algorithm keeps
    client-local tensors (FedBN, FRAug, DisTrans: ``has_new_site_answer``): every source's
    personal model, the tensors in which they differ (the local ones: BN tensors, DisTrans's
    offset) replaced by their uniform mean over the sources, the others (the shared layers,
    equal in every source) taken as they are. Integer tensors (BN's batch counters) are taken
    from the first source."""
    sources = list(sim.train_clients)
    per = [sim.weights_for(c, "personal") for c in sources]
    out = {}
    for k, v in per[0].items():
        same = all(torch.equal(v, p[k]) for p in per[1:])
        if same or not v.is_floating_point():
            out[k] = v.clone()
        else:
            out[k] = torch.stack([p[k].double() for p in per]).mean(0).to(v.dtype)
    return out


def bn_layers(model: nn.Module) -> list[nn.modules.batchnorm._BatchNorm]:
    """The model's BN layers that keep running statistics (AdaBN re-estimates these)."""
    return [
        m
        for m in model.modules()
        if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats
    ]


@torch.no_grad()
def adabn(
    model: nn.Module,
    x: torch.Tensor,
    prepare: Any,
    batch_size: int,
    device: torch.device,
) -> bool:
    """AdaBN: re-estimate every BN layer's running statistics on the images ``x`` (through
    ``prepare``, the site's input pipeline). The statistics are reset and accumulated with
    ``momentum=None`` (PyTorch's cumulative moving average: each batch weighs 1/t of the
    running value at its t-th step, so equal batches give the plain mean of the batch
    means and of the unbiased batch variances); only the BN layers are in training mode,
    the rest (dropout, FedFA's FFA layers) stays in eval mode; no gradient, no weight
    changes. Returns False (and does nothing) when the model has no such layer."""
    layers = bn_layers(model)
    if not layers:
        return False
    momenta = [m.momentum for m in layers]
    model.eval()
    for m in layers:
        m.reset_running_stats()
        m.momentum = None
        m.train()
    try:
        for i in range(0, len(x), batch_size):
            model(prepare(x[i : i + batch_size].to(device)))
    finally:
        for m, mom in zip(layers, momenta, strict=True):
            m.momentum = mom
        model.eval()
    return True


def select_shots(y: torch.Tensor, k: int, seed: int, site: str, task: str) -> torch.Tensor:
    """Indices of k labelled images per class of ``y`` (classification; a class with fewer
    images gives all it has) or k images (segmentation), sorted. One permutation per class
    (per site for segmentation), seeded by the run's seed and the site only, whose first k
    are taken: the same images for every method of a seed, nested across k."""
    from fedshift.core.seeding import derive_seed

    g = torch.Generator().manual_seed(derive_seed(seed, "new-site-shots", site))
    y = y.cpu()
    if task != "classification":
        return torch.sort(torch.randperm(len(y), generator=g)[:k]).values
    picked = []
    for c in torch.unique(y).tolist():
        idx = torch.nonzero(y == c).flatten()
        picked.append(idx[torch.randperm(len(idx), generator=g)[:k]])
    return torch.sort(torch.cat(picked)).values


@torch.no_grad()
def mean_entropy(
    model: nn.Module, x: torch.Tensor, prepare: Any, batch_size: int, device: torch.device
) -> float:
    """Mean entropy (nats) of the model's softmax predictions on ``x`` (eval mode), per image
    (per pixel for segmentation logits)."""
    model.eval()
    total, n = 0.0, 0
    for i in range(0, len(x), batch_size):
        logits = model(prepare(x[i : i + batch_size].to(device))).double()
        logp = F.log_softmax(logits, dim=1)
        ent = -(logp.exp() * logp).sum(1)
        total += float(ent.sum())
        n += ent.numel()
    return total / max(n, 1)


#: the augments whose eval path is a test-time input normalisation, and how new-site treats
#: each: "own" = the site's own channel statistics replace the augment's (computed),
#: "in-global" = the method's own rule at a new site, already what ``global`` scores
TEST_TIME_NORMS = {
    "fedrdn": ("in-global", "FedRDN Eq. 8: the site's own statistics, already in global"),
    "fedrdn_v": ("own", "FedRDN Eq. 8 in place of FedRDN-V's averaged statistics (Eq. 9)"),
    "norm": ("own", "FedRDN Eq. 8 in place of the fixed constants (Eq. 4)"),
    "ampnorm": ("in-global", "HarmoFL Eq. 4 with the global amplitude, already in global"),
}


def test_time_norm(sim: Any, site: str, state: dict) -> tuple[dict | None, str]:
    """The site's pipeline state for ``test-time norm`` (module docstring): a copy of
    ``state`` with the site's own channel statistics (FedRDN Eq. 5-6) in place of the
    normalising augment's, ``state`` itself when the method's rule is already how the run
    scores the site, or None when the method defines no test-time normalisation; with the
    reason (the note under the table)."""
    from fedshift.augment.fedrdn import channel_statistics
    from fedshift.core.context import aug_key

    found = [a for a in sim.exp.augments if a.name in TEST_TIME_NORMS]
    if not found:
        return None, "the method defines no test-time normalisation"
    a = found[0]
    how, why = TEST_TIME_NORMS[a.name]
    if how == "in-global":
        return state, why
    mean, std = channel_statistics(sim.fed.client(site).train.x)
    new = copy.copy(state)
    aug = dict(state[aug_key(a)])
    names = ("avg_mean", "avg_std") if a.name == "fedrdn_v" else ("mean", "std")
    aug[names[0]], aug[names[1]] = mean, std
    new[aug_key(a)] = aug
    return new, why


def adapt_run(
    run_dir: str | Path, shots: tuple[int, ...] = SHOTS, epochs: int = 50, weights: str = "selected"
) -> dict[str, Any]:
    """Every variant's test score of one leave-one-client-out run's held-out site:
    ``{"site", "seed", "scores": {variant: float | None}, "reasons": {variant: why none /
    what it is}, "selected_source", "entropy", "shots"}``."""
    sim = load_run(run_dir, weights)
    if len(sim.exp.holdout) != 1:
        raise FedshiftError(f"{run_dir}: not a run with one held-out site ({sim.exp.holdout})")
    (site,) = sim.exp.holdout
    cfg, exp, model = sim.cfg, sim.exp, sim.model
    task, metric = sim.task, sim.task.primary.name
    client = sim.fed.client(site)
    state = sim.states[site]
    exp.algo.eval_receive(exp.algo.eval_broadcast(sim.server, site), state)  # HarmoFL's A
    bs, dev = cfg.eval.batch_size, sim.device
    reasons: dict[str, str] = {}
    if exp.algo.has_global_model:
        base = {k: v.clone() for k, v in sim.weights_for(site, "global").items()}
        reasons["global"] = "the global model"
    else:
        base = new_site_weights(sim)
        reasons["global"] = "shared layers + the sources' mean local tensors"

    def prep(st: dict) -> Any:
        return lambda x: sim.pipeline.eval(x, st)

    def score(w: dict, st: dict = state) -> float:
        model.load_state_dict(w)
        return task.evaluate(model, client.test, prep(st), bs, dev)[metric]

    scores: dict[str, float | None] = {"global": score(base)}
    # adabn
    model.load_state_dict(base)
    if adabn(model, client.train.x, prep(state), bs, dev):
        scores["adabn"] = task.evaluate(model, client.test, prep(state), bs, dev)[metric]
    else:
        scores["adabn"] = None
        reasons["adabn"] = "the model has no BN layer with running statistics"
    # test-time norm
    tt_state, reasons["test-time norm"] = test_time_norm(sim, site, state)
    scores["test-time norm"] = None if tt_state is None else score(base, tt_state)
    # finetune-k
    shot_counts = {}
    for k in shots:
        name = f"finetune-{k}"
        idx = select_shots(client.train.y, k, cfg.seed, site, task.name)
        shot_counts[k] = len(idx)
        model.load_state_dict(base)
        with torch.enable_grad():
            x, y = client.train.x[idx], client.train.y[idx]
            finetune_head(sim, site, x, y, epochs, cfg.seed, task.loss)
        scores[name] = task.evaluate(model, client.test, prep(state), bs, dev)[metric]
    # select
    candidates = _source_models(sim)
    entropy = {}
    for cid, w in candidates.items():
        model.load_state_dict(w)
        entropy[cid] = mean_entropy(model, client.train.x, prep(state), bs, dev)
    chosen = min(entropy, key=lambda c: (entropy[c], c))
    scores["select"] = score(candidates[chosen])
    reasons["select"] = f"{chosen}'s model (lowest mean prediction entropy)"
    return {
        "site": site,
        "seed": cfg.seed,
        "round": sim.round,
        "scores": scores,
        "reasons": reasons,
        "selected_source": chosen,
        "entropy": entropy,
        "shots": shot_counts,
        "epochs": epochs,
    }


def _source_models(sim: Any) -> dict[str, dict[str, torch.Tensor]]:
    """Each source's model for ``select``: its personal model, or (a global-model method)
    its local model after one more local update from the run's broadcast
    (:func:`fedshift.protocols.cross_site.local_models`, deterministic, the run unchanged)."""
    if sim.exp.algo.has_personal_model:
        return {c: sim.weights_for(c, "personal") for c in sim.train_clients}
    from fedshift.protocols.cross_site import local_models

    return local_models(sim)


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
    label_rows(summaries, ["federation.holdout"])
    groups: dict[tuple, dict[str, dict[int, dict]]] = defaultdict(lambda: defaultdict(dict))
    for s in summaries:
        r = per_run[s["run_dir"]]
        groups[row_key(s)][r["site"]][r["seed"]] = r
    first = summaries[0]
    label = first.get("metric_label", "accuracy")
    per_class = "" if first.get("task") == "segmentation" else " per class"
    keys = sorted(groups, key=row_order)
    methods = {k: _method_numbers(groups[k], clients, names) for k in keys}
    ref = next((k for k in keys if k[:2] == ("fedavg", "base")), None)
    for k in keys:
        for v in names:
            mine = methods[k]["variants"][v]["average"]
            base = methods[ref]["variants"][v]["average"]["per_seed"] if ref else {}
            mine["p_vs_reference"] = (
                None if ref in (None, k) else paired_ttest(mine["per_seed"], base)
            )
    parts = []
    why: dict[str, set[str]] = defaultdict(set)
    for k in keys:
        numbers = methods[k]
        for r in (r for site in groups[k].values() for r in site.values()):
            for v, reason in r["reasons"].items():
                if r["scores"].get(v) is None:
                    why[v].add(reason)
        header = ["variant", *clients, "avg ± std", *([f"p vs {_name(ref)}"] if ref else [])]
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
        parts.append(
            f"### {_name(k)} ({len(numbers['seeds'])} seed(s))\n\n{grid(header, rows)}\n\n"
            f"_select chose (by seed): {picks}._"
        )
    summary_rows = []
    for k in keys:
        cells = []
        for v in names:
            av = methods[k]["variants"][v]["average"]
            p = av["p_vs_reference"]
            cells.append(av["text"] + ("" if p is None else f" (p={p:.3f})"))
        summary_rows.append([_name(k), *cells])
    summary = grid(["method", *names], summary_rows)
    dash_notes = "; ".join(f"{v}: {', '.join(sorted(w))}" for v, w in why.items() if w)
    note = (
        f"Held-out site's test {label} (%) after each variant; column = the site held out "
        "(it never trains; each run is leave-one-client-out's cell), mean ± std over seeds; "
        "avg ± std = mean over sites per seed, then mean ± sample std over the seeds with "
        "every site; p: paired t-test of that average over seeds against "
        f"{_name(ref) if ref else '(no FedAvg row)'}'s same variant. global: the run's model at "
        "the round selected on the sources' validation score (= loco); methods without a "
        "global model (FedBN, FRAug, DisTrans): shared layers + the sources' mean local "
        "tensors (BN, offset). adabn: BN running statistics re-estimated on the site's "
        "unlabelled training images (AdaBN). test-time norm: the method's own test-time "
        "input normalisation (FedRDN Eq. 8 own statistics, HarmoFL's global amplitude). "
        f"finetune-k: the head trained {epochs} epochs with the run's training loss on k "
        f"labelled training images{per_class} (same images for every method of a seed). "
        "select: the source model with the "
        "lowest mean prediction entropy on the site's unlabelled training images (after "
        "FedSM, CVPR 2022)." + (f" {DASH} = not applicable: {dash_notes}." if dash_notes else "")
    )
    text = "\n\n".join(
        [f"New-site adaptation: test {label} (%) of each held-out site", *parts]
        + [f"### Summary: average over sites\n\n{summary}", f"_{note}_"]
    )
    data = {
        "protocol": "new-site",
        "metric": first.get("metric", "acc"),
        "metric_label": label,
        "clients": clients,
        "variants": names,
        "shots": list(shots),
        "epochs": epochs,
        "reference": _name(ref) if ref else None,
        "methods": [{"algorithm": k[0], "flow": k[1], "setting": k[2], **methods[k]} for k in keys],
        "runs": per_run,
        "not_applicable": {v: sorted(w) for v, w in why.items() if w},
    }
    return text, data


def _name(key: tuple | None) -> str:
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
    out["selected_sources"] = {
        c: [f"s{seed} {r['selected_source']}" for seed, r in sorted(by_site.get(c, {}).items())]
        for c in clients
    }
    return out
