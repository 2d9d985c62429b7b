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

Each run is adapted as soon as it has trained (bench's ``after`` hook, in the worker that
trained it) and the result kept as JSON in ``<out>/adapted/``; a committed cell
(``results/<suite>/``, numbers only) is taken instead of trained where its adaptation is
committed too (``results/protocols/<suite name>/adapted/``), so the committed tables
re-render without a model and a suite longer than one machine's session goes on elsewhere.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from fedshift.core.errors import ConfigError, FedshiftError
from fedshift.core.files import write_text_atomic
from fedshift.protocols.common import (
    ProtocolResult,
    SuiteOptions,
    load_run,
    save_outputs,
)
from fedshift.protocols.head_finetune import _say, finetune_head
from fedshift.protocols.loco import held_out_cells
from fedshift.protocols.new_site_figure import new_site_png
from fedshift.protocols.new_site_tables import (
    SHOTS,
    new_site_tables,
)
from fedshift.runtime.newsite import adabn, new_site_weights
from fedshift.runtime.progress import fmt_duration
from fedshift.runtime.simulation import torch_threads


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
    how = (tuple(shots), epochs, weights)
    kept = _kept_folders(options)

    def adapted_before(cell: Any, src: Path) -> bool:
        # a committed cell has no model: taken only when its adaptation is kept too
        return _kept_adaptation(kept, src.name, _adapt_key(src, *how))[0] is not None

    cells = held_out_cells(
        options,
        "new-site",
        reuse=adapted_before,
        new_site=True,
        sites=None if sites is None else list(sites),
        after=functools.partial(_adapt_and_keep, out=str(kept[0]), how=how),
    )
    per_run: dict[str, dict] = {}
    todo: dict[str, dict] = {}  # run directory -> its adaptation key
    for s in cells.summaries:
        run_dir = s["run_dir"]
        key = _adapt_key(run_dir, *how)
        cached, where = _kept_adaptation(kept, Path(run_dir).name, key)
        if cached is None:
            todo[run_dir] = key
        else:
            per_run[run_dir] = cached
            if where != cells.out:  # from results/: the output folder complete
                _store_adapted(cells.out, run_dir, key, cached)
    if per_run:
        say(f"new-site: {len(per_run)} of {len(cells.summaries)} runs adapted before, taken")
    started, n = time.monotonic(), len(todo)
    for i, (run_dir, result) in enumerate(
        _adapt_all(list(todo), (tuple(shots), epochs, weights), options.workers), 1
    ):
        per_run[run_dir] = result
        _store_adapted(cells.out, run_dir, todo[run_dir], result)
        left = (time.monotonic() - started) / i * (n - i)
        g = result["scores"]["global"]
        say(
            f"new-site: {i}/{n} adapted ({Path(run_dir).name}, site {result['site']}, "
            f"global {100 * g:.2f}); ETA {fmt_duration(left)}"
        )
    per_run = {k: per_run[k] for k in sorted(per_run)}  # the same bytes however adapted
    text, data = new_site_tables(cells.summaries, per_run, cells.clients, tuple(shots), epochs)
    data["suite"] = str(cells.suite)
    data["weights"] = weights
    files = save_outputs(cells.out, "new-site", "A site that never trained", text, data)
    files["png"] = new_site_png(data, cells.out / "new-site.png")
    files["suite"] = cells.suite
    return ProtocolResult("new-site", text, data, files)


# ========================================================== one run's adaptation, kept
def _adapt_all(run_dirs: list[str], args: tuple, workers: int | None) -> Iterator[tuple[str, dict]]:
    """(run directory, :func:`adapt_run`'s result) for each run, as they finish: in this
    process, or with ``workers`` > 1 in that many spawned processes (each run adapts at its
    own ``run.threads`` either way, so the numbers do not depend on ``--workers``)."""
    n = min(workers or 1, len(run_dirs))
    if n <= 1:
        for run_dir in run_dirs:
            yield run_dir, adapt_run(run_dir, *args)
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=n, mp_context=ctx) as pool:
        futures = {pool.submit(adapt_run, run_dir, *args): run_dir for run_dir in run_dirs}
        try:
            for fut in as_completed(futures):
                yield futures[fut], fut.result()
        except BaseException:
            for fut in futures:
                fut.cancel()
            raise


def _adapt_key(run_dir: str | Path, shots: tuple[int, ...], epochs: int, weights: str) -> dict:
    """What one run's adaptation depends on: the run (its ``summary.json`` without the
    ``run_dir`` it lies in, which differs for a cell taken from ``results/``; a cell run
    again writes another: its timings) and the protocol's options."""
    summary = json.loads((Path(run_dir) / "summary.json").read_text())
    summary.pop("run_dir", None)
    canonical = json.dumps(summary, sort_keys=True, separators=(",", ":")).encode()
    return {
        "summary_digest": hashlib.sha256(canonical).hexdigest(),
        "shots": list(shots),
        "epochs": epochs,
        "weights": weights,
    }


def _adapt_and_keep(run_dir: str, out: str, how: tuple) -> None:
    """bench's hook on each cell the protocol trains: adapt the run at once and keep the
    result in ``out``, so that a stopped protocol (or a lost machine) keeps every run it
    trained as numbers, not only as a model."""
    key = _adapt_key(run_dir, *how)
    if _adapted(Path(out), run_dir, key) is None:
        _store_adapted(Path(out), run_dir, key, adapt_run(run_dir, *how))


def _kept_folders(options: SuiteOptions) -> list[Path]:
    """Where finished adaptations are looked up: the output folder's ``adapted/``, then
    (unless ``--fresh``) the committed ones, ``<results>/protocols/<suite name>/adapted/``
    (``results/`` as bench finds it: :func:`fedshift.bench.results_root`)."""
    from fedshift.bench import results_root

    folders = [options.output_dir("new-site")]
    root, name = results_root(), options.load().get("name")
    if root is not None and isinstance(name, str) and name and not options.fresh:
        folders.append(root / "protocols" / name)
    return folders


def _kept_adaptation(
    folders: list[Path], run_name: str, key: dict
) -> tuple[dict | None, Path | None]:
    """Run ``run_name``'s adaptation with ``key`` and the first of ``folders`` (the output
    folder first) that keeps it; (None, None) when none does."""
    for folder in folders:
        found = _adapted(folder, run_name, key)
        if found is not None:
            return found, folder
    return None, None


def _adapted_path(out: Path, run_dir: str | Path) -> Path:
    return out / "adapted" / f"{Path(run_dir).name}.json"


def _adapted(out: Path, run_dir: str | Path, key: dict) -> dict | None:
    """A run's adaptation that an earlier (stopped) ``new-site`` kept in the output folder
    ``out`` (or that is committed under ``results/``) with the same ``key``, read as JSON
    data (never code); None otherwise. A long protocol stopped mid-way so adapts only the
    runs it had not, and a committed table re-renders without its models."""
    path = _adapted_path(out, run_dir)
    try:
        kept = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(kept, dict) or kept.get("key") != key:
        return None
    if not isinstance(kept.get("result"), dict):
        return None
    return kept["result"]


def _store_adapted(out: Path, run_dir: str | Path, key: dict, result: dict) -> None:
    path = _adapted_path(out, run_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, json.dumps({"key": key, "result": result}, indent=1) + "\n")


# ============================================================================ the variants
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
    sums, n = [], 0
    for i in range(0, len(x), batch_size):
        logits = model(prepare(x[i : i + batch_size].to(device))).double()
        logp = F.log_softmax(logits, dim=1)
        ent = -(logp.exp() * logp).sum(1)
        sums.append(ent.sum())  # stays on the device: one host sync at the end
        n += ent.numel()
    return float(torch.stack(sums).sum()) / max(n, 1) if sums else 0.0


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
    with torch_threads(sim.cfg.run.threads):  # the run's own, in any process
        return _adapt(sim, shots, epochs)


def _adapt(sim: Any, shots: tuple[int, ...], epochs: int) -> dict[str, Any]:
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
    shot_counts: dict[str, int] = {}
    for k in shots:
        name = f"finetune-{k}"
        idx = select_shots(client.train.y, k, cfg.seed, site, task.name)
        shot_counts[str(k)] = len(idx)  # str keys: the same in memory and in JSON
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
