"""The price of privacy (issue 53 item 4): accuracy (Dice on segmentation) against the
privacy budget epsilon, per method, and the break-even epsilon against weights-only FedAvg.

Every cell is one run of a method on a dataset at one epsilon and one seed:

* **Finite epsilon: the same budget for every method.** The weights go through DP-FedAvg
  (``privacy.updates=client``, ``privacy.update_clip``: client level, one site and all its
  data, docs/PRIVACY.md) at ``(epsilon, delta)`` over the run's rounds; a method that also
  shares statistics (FedRDN's ``fedrdn_stats``, HarmoFL's ``amplitude``) releases them through
  the Gaussian mechanism at the same ``(epsilon, delta)`` at the example level
  (``privacy.epsilon``). The two units do not compose into one number (docs/PRIVACY.md, "One
  budget"): "the same budget" here is the same ``(epsilon, delta)`` for each unit the method
  shares, so FedAvg and FedBN (weights only) are held to the client-level budget, FedRDN and
  HarmoFL to it and to the example-level one on their statistics. FedFA's feature statistics
  are refused under DP (computed by the model the site trains: clipping each example's
  features bounds nothing), and so is FedFA under ``privacy.updates=client``: its finite cells
  are recorded as refused, with fedshift's one-line reason, and it has only its ``inf`` cells.
* **``--updates example``**: the weights go through example-level DP-SGD instead
  (``privacy.updates=example``, docs/PRIVACY.md: one example of a site is the unit, as for
  the statistics, which take ``privacy.stats_share`` of the one budget). DP-SGD needs a model
  without BatchNorm, so every cell, ``inf`` included (the same model with and without noise),
  has ``model.norm=none``; a method DP-SGD refuses (its own local step, a record it does not
  cover) is recorded as refused with fedshift's one-line reason, like FedFA above.
* **epsilon = inf**: no privacy at all (no clipping, no noise): the unprotected run.
* **Uniform weighting in every cell**, the ``inf`` ones included (DP-FedAvg needs it), so the
  baseline is the same aggregation with and without noise.
* **The score** is the last round's model's mean test score over the sites
  (``final_test_mean`` of ``summary.json``): the model the DP guarantee covers. Picking a round
  on the sites' validation scores (``test_mean``) reads their data outside the budget; it is
  kept in the JSON beside it.

**Beats and break-even.** At one epsilon, a method *beats* FedAvg when the mean over seeds of
the paired differences ``d_s = score(method, seed s) - score(FedAvg, seed s)`` is above zero
and a one-sided paired t-test (H1: mean d > 0) gives ``p < alpha`` (``--alpha``, default
0.05); with fewer than two common seeds it is not tested and does not beat. The
**break-even epsilon** of a method is the smallest finite epsilon of the grid at which it
beats FedAvg and beats it at every larger finite epsilon of the grid as well ("still beats"
as the budget shrinks); "none" when it does not beat FedAvg at the largest finite epsilon.

**Leakage.** For each protected and unprotected cell the script also attacks the *released*
model: the loss-threshold membership test (Yeom et al. 2018, as ``fedshift protocol
privacy``'s weights row) of the first training client's training images against its test
images under the last round's global model (a method without one, FedBN: the site's model,
whose local BatchNorm layers the server never sees: an upper bound). Central DP-FedAvg trusts
the server with each clipped update: what it protects is what the server releases, so that
is the model attacked here (``fedshift protocol privacy`` attacks the site's own next
upload, before the server's noise). The protected statistics (FedRDN's ``fedrdn_stats``,
HarmoFL's ``amplitude``) are attacked here as released, as ``fedshift protocol privacy``
attacks a protected run's records: its likelihood-ratio membership test on
sites of 10, 50 and 200 images of the client's domain, the record's mean plus the Gaussian
noise the run's noise multiplier and clip give (``2 sigma C / n`` a value), the test knowing
the noise's variance (:func:`record_leakage`; HarmoFL's record modelled as a plain mean,
less noisy than Eq. 3's running mean: an upper bound).

Resumable: each cell's run folder is ``OUT/runs/<dataset>-<method>-eps<e>-seed<s>``; a
finished one (``summary.json``) is read, an interrupted one resumed, a refused one
(``.refused.json`` beside it) skipped. Writes ``OUT/privacy_price.json``,
``OUT/privacy_price.md`` (score table, break-even table, leakage table, the command) and
``OUT/privacy_price.png`` (score against epsilon, one line per method, per dataset).

    # the committed table (docs/RESULTS.md, "The price of privacy"; ~85 min on 2 busy cores)
    python benchmarks/privacy_price.py --datasets digits --rounds 3 \\
        --out results/benchmarks/privacy_price_digits
    # the same with example-level DP-SGD (docs/RESULTS.md, "... example-level DP-SGD")
    python benchmarks/privacy_price.py --datasets digits --rounds 3 --updates example \\
        --out results/benchmarks/privacy_price_digits_example
    python benchmarks/privacy_price.py --out runs/privacy_price    # the issue's grid, ~6 h
    python benchmarks/privacy_price.py --datasets toyshift --methods fedavg,fedrdn \\
        --eps 1,inf --seeds 0 --rounds 1 --out /tmp/pp          # a try (seconds)
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from fedshift.catalog import resolve
from fedshift.core.config import load_config
from fedshift.core.errors import ConfigError
from fedshift.core.files import write_text_atomic
from fedshift.core.tasks import NonFiniteOutputError

sys.path.insert(0, str(Path(__file__).resolve().parent))  # privacy_price_report beside it
from privacy_price_report import (  # noqa: E402, F401 (compare & co.: re-exported)
    BASELINE,
    Comparison,
    analyse,
    break_even,
    compare,
    eps_label,
    leakage_table,
    plot,
    tables,
)

#: per dataset: the training of issue 51's privacy suites (configs/suites/privacy_*.yaml)
DATASETS: dict[str, tuple[str, ...]] = {
    "digits": ("dataset.name=digits", "model.name=lenet5", "train.lr=0.01",
               "train.batch_size=32"),
    "brain-mri": ("dataset.name=brain-mri", "model.name=unet", "model.width=16",
                  "train.optimizer=adam", "train.lr=0.001", "train.batch_size=16",
                  "eval.batch_size=64"),
    "toyshift": ("dataset.name=toyshift",),  # the tiny test configuration
}  # fmt: skip
#: per method: its overrides (FedRDN the algorithm, HarmoFL with its amplitude normalisation)
METHODS: dict[str, tuple[str, ...]] = {
    "fedavg": ("algorithm.name=fedavg",),
    "fedbn": ("algorithm.name=fedbn",),
    "fedrdn": ("algorithm.name=fedrdn",),
    "fedfa": ("algorithm.name=fedfa",),
    "harmofl": ("algorithm.name=harmofl",),
}
INF = math.inf


@dataclass(frozen=True)
class Grid:
    """What to run: datasets x methods x epsilons x seeds, at ``rounds`` rounds; ``extra``:
    overrides every cell gets last (``--set``)."""

    datasets: tuple[str, ...]
    methods: tuple[str, ...]
    eps: tuple[float, ...]
    seeds: tuple[int, ...]
    rounds: int
    delta: float = 1e-5
    clip: float = 1.0
    extra: tuple[str, ...] = ()
    updates: str = "client"  # the weights' unit at a finite eps: "client" or "example"


def cell_overrides(dataset: str, method: str, eps: float, seed: int, grid: Grid) -> list[str]:
    """The config of one cell (module docstring): the dataset's and the method's overrides,
    uniform weighting, and at a finite ``eps`` DP-FedAvg (``grid.updates`` "client") or
    DP-SGD ("example") on the weights plus the statistics' Gaussian mechanism at the same
    ``(eps, delta)``; the last round evaluated only. With "example" every cell, ``inf``
    included, has the model without normalisation layers DP-SGD needs (``model.norm=none``)."""
    over = [*DATASETS[dataset], *METHODS[method], "federation.weighting=uniform",
            f"train.rounds={grid.rounds}", f"eval.every={grid.rounds}", f"seed={seed}",
            "name=privacy_price", "run.threads=1"]  # fmt: skip
    if grid.updates == "example":
        over.append("model.norm=none")
    if not math.isinf(eps):
        over += [f"privacy.epsilon={eps:g}", f"privacy.delta={grid.delta:g}",
                 f"privacy.updates={grid.updates}",
                 f"privacy.update_clip={grid.clip:g}"]  # fmt: skip
    return over + list(grid.extra)


def _membership_auc(run_dir: Path, fed: Any) -> float:
    """The loss-threshold membership AUC of the first training client's training images
    (members) against its test images under the released model (module docstring)."""
    from fedshift.attacks.scores import roc_score
    from fedshift.runtime.simulation import load_finished

    sim = load_finished(run_dir, fed, weights="last")
    site = next(iter(sim.train_clients))
    kind = "global" if "global" in sim.kinds else sim.kinds[0]
    sim.model.load_state_dict(sim.weights_for(site, kind))
    sim.model.eval()
    state, bs = sim.states.get(site), sim.cfg.eval.batch_size

    def losses(part: Any) -> torch.Tensor:
        x, y, out = torch.as_tensor(part.x[:]).float(), torch.as_tensor(part.y[:]), []
        with torch.no_grad():
            for s in range(0, len(x), bs):
                logits = sim.model(sim.pipeline.eval(x[s : s + bs].to(sim.device), state))
                loss = F.cross_entropy(logits, y[s : s + bs].to(sim.device).long(),
                                       reduction="none")  # fmt: skip
                out.append(loss.flatten(1).mean(1) if loss.dim() > 1 else loss)
        return torch.cat(out).double().cpu()

    client = sim.fed.client(site)
    return roc_score(-losses(client.train), -losses(client.test), 1e-3).auc


#: the statistics records attacked with their noise, by method, and the site sizes
RECORDS = {"fedrdn": "fedrdn_stats", "harmofl": "amplitude"}
SIZES = (10, 50, 200)


def noisy_membership_auc(
    features: torch.Tensor, n: int, noise: float, trials: int = 40, seed: int = 0
) -> float:
    """Membership AUC on a site's mean of per-example ``features`` over ``n`` examples,
    released with Gaussian noise of std ``noise`` per value: ``fedshift protocol privacy``'s
    test on a protected record (:func:`fedshift.attacks.membership.membership_by_size` with
    its ``noise``), half the examples the attacker's reference sample."""
    from fedshift.attacks.membership import membership_by_size

    (found,) = membership_by_size(features, [n], trials, seed=seed, noise=lambda m: noise)
    return found.roc.auc


def record_leakage(cells: list[dict], grid: Grid, runs: Path, feds: dict) -> list[dict]:
    """For each method whose statistics are protected (:data:`RECORDS`) and each epsilon,
    the membership AUC of its record at sites of :data:`SIZES` images of the first
    client's domain, released as the run released it: the Gaussian mechanism at the run's
    noise multiplier and clip (``summary.json`` of the seed's cell), ``2 sigma C / n`` per
    value for a mean over ``n`` images; no noise at epsilon inf."""
    from fedshift.core.privacy import clip_rows
    from fedshift.data import load_dataset
    from fedshift.protocols.privacy import SURFACES, domain_images

    rows, features = [], {}
    for d in grid.datasets:
        for m, record in RECORDS.items():
            if m not in grid.methods:
                continue
            for c in cells:
                if (c["dataset"], c["method"]) != (d, m) or "score" not in c:
                    continue
                priv = (
                    json.loads((runs / c["run_dir"] / "summary.json").read_text()).get("privacy")
                    or {}
                )
                rec = (priv.get("records") or {}).get(record)
                if c["eps"] != "inf" and rec is None:
                    continue
                if d not in feds:
                    cfg = resolve(load_config(None, cell_overrides(d, m, INF, 0, grid)))
                    feds[d] = load_dataset(cfg.dataset)
                if (d, record) not in features:  # the first client's domain, every split
                    images = domain_images(feds[d])
                    x = images[next(iter(images))]
                    features[d, record] = SURFACES[record].features(x)  # type: ignore[misc]
                feats = features[d, record]
                if rec is not None:  # each image's vector clipped as the run's mechanism does
                    feats = clip_rows(feats, rec["clip"])
                for n in SIZES:
                    if 4 * n > len(feats):
                        continue
                    std = 0.0 if rec is None else 2 * priv["noise_multiplier"] * rec["clip"] / n
                    auc = noisy_membership_auc(feats, n, std, seed=c["seed"])
                    rows.append({"dataset": d, "method": m, "record": record,
                                 "eps": c["eps"], "seed": c["seed"], "n": n,
                                 "noise_std": std, "auc": auc})  # fmt: skip
    return rows


def _rounds_done(run_dir: Path) -> int:
    """How many rounds a stopped run recorded (its ``metrics.jsonl`` rows' last round; a run
    whose evaluation raised stopped in the round after it)."""
    path = run_dir / "metrics.jsonl"
    rows = (
        [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
        if path.is_file()
        else []
    )
    return max((int(r.get("round", 0)) for r in rows), default=0)


def run_cell(
    dataset: str, method: str, eps: float, seed: int, grid: Grid, runs: Path, feds: dict
) -> dict:
    """One cell: read when finished, resumed when interrupted, else run; a config fedshift
    refuses is recorded (``refused``: its one-line reason) and not run again. ``feds``: the
    federation of each dataset, loaded once (every cell of a dataset holds the same)."""
    from fedshift.data import load_dataset
    from fedshift.runtime.simulation import resume_experiment, run_experiment

    name = f"{dataset}-{method}-eps{eps_label(eps)}-seed{seed}"
    run_dir, refused = runs / name, runs / f"{name}.refused.json"
    diverged = runs / f"{name}.diverged.json"
    cell = {"dataset": dataset, "method": method, "eps": eps_label(eps), "seed": seed}
    for record in (refused, diverged):
        if record.is_file():
            return {**cell, **json.loads(record.read_text())}
    t0 = time.perf_counter()
    cfg = resolve(load_config(None, cell_overrides(dataset, method, eps, seed, grid)))
    attack = run_dir / "membership.json"
    done = (run_dir / "summary.json").is_file() and attack.is_file()
    if not done and dataset not in feds:
        feds[dataset] = load_dataset(cfg.dataset)
    fed = feds.get(dataset)
    if not (run_dir / "summary.json").is_file():
        try:
            if (run_dir / "config.yaml").is_file():
                resume_experiment(run_dir, fed, progress=False)
            else:
                shutil.rmtree(run_dir, ignore_errors=True)
                try:
                    run_experiment(cfg, run_dir=run_dir, federation=fed, progress=False)
                except ConfigError as e:  # refused before any client state: its reason
                    shutil.rmtree(run_dir, ignore_errors=True)
                    runs.mkdir(parents=True, exist_ok=True)
                    write_text_atomic(refused, json.dumps({"refused": str(e)}) + "\n")
                    return {**cell, "refused": str(e)}
        except NonFiniteOutputError as e:  # the model's outputs overflowed: no score exists
            why = {"diverged": str(e), "round": _rounds_done(run_dir) + 1}
            write_text_atomic(diverged, json.dumps(why) + "\n")
            return {**cell, **why}
        (run_dir / "membership.json").unlink(missing_ok=True)
    summary = json.loads((run_dir / "summary.json").read_text())
    if not attack.is_file():
        write_text_atomic(attack, json.dumps({"auc": _membership_auc(run_dir, fed)}) + "\n")
    priv = summary.get("privacy") or {}
    weights = (priv.get("records") or {}).get("weights") or {}
    sites = [v["noise_multiplier"] for v in (weights.get("sites") or {}).values()]
    return {
        **cell,
        "metric": summary["metric"],
        "score": summary["final_test_mean"],
        "selected_score": summary["test_mean"],
        "membership_auc": json.loads(attack.read_text())["auc"],
        # DP-FedAvg's multiplier; DP-SGD's: the largest over the sites (each has its own)
        "weights_noise_multiplier": weights.get("noise_multiplier", max(sites, default=None)),
        "example_level_all_records": (priv.get("example_level_all_records") or {}).get(
            "epsilon_spent"
        ),
        "wall_s": summary.get("wall_s"),
        "ran_s": round(time.perf_counter() - t0, 1),
        "run_dir": name,
    }


def _claim(lock: Path) -> bool:
    """Take the cell's lock (a file holding this process's id); False when another live
    process holds it. A lock whose process is gone is taken over."""
    import os

    lock.parent.mkdir(parents=True, exist_ok=True)
    for _ in range(2):
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            try:
                os.kill(int(lock.read_text() or 0), 0)
                return False  # held by a live process
            except (ProcessLookupError, ValueError, FileNotFoundError):
                lock.unlink(missing_ok=True)  # its process is gone
                continue
            except PermissionError:
                return False  # a live process of another user
        with os.fdopen(fd, "w") as f:
            f.write(str(os.getpid()))
        return True
    return False


def run_grid(grid: Grid, out: Path, log: Any = print) -> list[dict]:
    """Every cell of ``grid`` under ``out/runs``, the methods in ``grid.methods``' order
    (``--methods``' order, FedAvg appended when not named). A cell another live process is
    running (its lock, ``runs/<cell>.lock``) is left out, so processes can share ``out``."""
    runs, feds = out / "runs", {}
    cells = []
    order = list(grid.methods)
    for dataset in grid.datasets:
        for method in order:
            for eps in grid.eps:
                for seed in grid.seeds:
                    name = f"{dataset}-{method}-eps{eps_label(eps)}-seed{seed}"
                    lock = runs / f"{name}.lock"
                    if not _claim(lock):
                        log(f"{name}: running in another process ({lock}); left out here")
                        continue
                    try:
                        c = run_cell(dataset, method, eps, seed, grid, runs, feds)
                    finally:
                        lock.unlink(missing_ok=True)
                    cells.append(c)
                    what = (f"refused ({c['refused']})" if "refused" in c else
                            f"diverged ({c['diverged']})" if "diverged" in c else
                            f"{c['metric']} {c['score']:.4f}, membership AUC "
                            f"{c['membership_auc']:.3f}, {c['ran_s']} s")  # fmt: skip
                    log(f"{dataset} {method} eps={eps_label(eps)} seed={seed}: {what}")
    return cells


def write_outputs(cells: list[dict], grid: Grid, out: Path, alpha: float, command: str) -> str:
    """``privacy_price.json``, ``.md`` and ``.png`` under ``out``; returns the Markdown."""
    analysis = analyse(cells, grid, alpha)
    leaks = record_leakage(cells, grid, out / "runs", {})
    text = tables(cells, grid, analysis, alpha) + "\n" + leakage_table(leaks, grid)
    meta = {
        "command": command, "datasets": list(grid.datasets), "methods": list(grid.methods),
        "eps": [eps_label(e) for e in grid.eps], "delta": grid.delta, "updates": grid.updates,
        "update_clip": grid.clip, "seeds": list(grid.seeds), "rounds": grid.rounds,
        "overrides": list(grid.extra),
        "alpha": alpha, "torch": torch.__version__, "threads": 1,
        "score": "final_test_mean (the last round's model)",
        "beats": "mean paired difference > 0 and one-sided paired t-test p < alpha",
        "break_even": "smallest finite eps beaten there and at every larger finite eps",
        "ran_s": "seconds this invocation spent on the cell (about 0: read from its folder)",
        "analysis": analysis, "cells": cells, "record_leakage": leaks,
    }  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out / "privacy_price.json", json.dumps(meta, indent=2) + "\n")
    write_text_atomic(out / "privacy_price.md", f"`{command}`\n\n{text}")
    plot(cells, grid, out / "privacy_price.png")
    return text


def _eps(text: str) -> tuple[float, ...]:
    vals = []
    for part in text.split(","):
        v = INF if part.strip() == "inf" else float(part)
        if not v > 0:
            raise SystemExit(f"--eps: each epsilon must be > 0 or inf, got {part!r}")
        vals.append(v)
    return tuple(sorted(vals))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="folder for runs/, json, md, png")
    ap.add_argument("--datasets", default="digits,brain-mri",
                    help=f"comma-separated, of {', '.join(DATASETS)}")  # fmt: skip
    ap.add_argument("--methods", default=",".join(METHODS),
                    help=f"of {', '.join(METHODS)} (fedavg always runs)")  # fmt: skip
    ap.add_argument("--eps", default="0.5,1,2,4,8,inf", help="comma-separated; inf: no DP")
    ap.add_argument("--seeds", default="0,1,2", help="comma-separated seeds")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--delta", type=float, default=1e-5)
    ap.add_argument("--update-clip", type=float, default=1.0, help="privacy.update_clip")
    ap.add_argument("--updates", choices=("client", "example"), default="client",
                    help="the weights' DP at a finite eps: client (DP-FedAvg) or example "
                    "(DP-SGD, model.norm=none in every cell)")  # fmt: skip
    ap.add_argument("--alpha", type=float, default=0.05, help="the one-sided test's level")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="an override of every cell (repeatable)")  # fmt: skip
    args = ap.parse_args(argv)
    datasets = tuple(args.datasets.split(","))
    methods = tuple(dict.fromkeys([*args.methods.split(","), BASELINE]))
    for name, allowed, given in (("--datasets", DATASETS, datasets),
                                 ("--methods", METHODS, methods)):  # fmt: skip
        bad = [x for x in given if x not in allowed]
        if bad:
            raise SystemExit(f"{name}: unknown {bad}; choose from {', '.join(allowed)}")
    seeds = tuple(int(s) for s in args.seeds.split(","))
    grid = Grid(datasets, methods, _eps(args.eps), seeds, args.rounds, args.delta,
                args.update_clip, tuple(args.set), args.updates)  # fmt: skip
    torch.set_num_threads(1)
    cells = run_grid(grid, args.out, log=lambda s: print(s, flush=True))
    command = "python benchmarks/privacy_price.py " + " ".join(argv or sys.argv[1:])
    print(write_outputs(cells, grid, args.out, args.alpha, command))
    return 0


if __name__ == "__main__":
    sys.exit(main())
