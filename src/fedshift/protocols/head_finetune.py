"""``fedshift protocol head-finetune``: FRAug's motivating experiment (Sec. 3.2, Table 1).

Each client first trains a classification model on a fraction of its local data (the paper:
10 %, local training without federation); then its feature extractor f is frozen and only the
prediction head is trained further on the embeddings of 100 % of its local training data.
Both models (same extractor) are tested on the client's test split. The paper finds the
finetuned head better by 24.8 points on OfficeHome and 4.6 on PACS: an extractor trained on
scarce data still yields useful embeddings for unseen images, the premise of augmenting in
the embedding space.

Mapping to fedshift:

* step 1 is an ordinary run of the config (normally ``algorithm.name: local``; any algorithm
  whose evaluated model is per-client or global works) with ``federation.data_fraction`` < 1
  (the per-class subsample of :meth:`fedshift.core.federation.Federation.with_train_fraction`); the
  config may carry a ``sweep`` (e.g. ``seed: [0, 1, 2]``); cells run through
  :func:`fedshift.bench.run_suite` and are cached;
* step 2, per finished run and client: the run's model of its evaluated kind at the selected round
  (``weights_for``), the extractor (``model.features``) in eval mode on the client's full
  training split through the run's input pipeline without augmentation (``pipeline.eval``),
  the embeddings computed once; the head (``model.classifier``) continues from its trained
  weights for ``epochs`` epochs over the embeddings with the run's optimiser settings
  (``train.optimizer/lr/momentum/weight_decay/betas/batch_size``), batches shuffled by a
  generator seeded from the run's seed and the client name;
* the score is the run's primary metric on the test split, before and after.

The paper does not state the finetuning epochs or optimiser; ``--epochs`` defaults to 10.
The extractor's BN layers stay in eval mode (the extractor is fixed, so are its statistics).
"""

from __future__ import annotations

import copy
import logging
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from fedshift.core.errors import ConfigError, FedshiftError
from fedshift.eval.stats import paired_ttest
from fedshift.eval.tables import grid
from fedshift.protocols.common import (
    ProtocolResult,
    SuiteOptions,
    expand_configs,
    load_run,
    mean_std_text,
    save_outputs,
)
from fedshift.runtime.progress import fmt_duration

LOG = logging.getLogger("fedshift.protocols")


def _say(msg: str) -> None:
    """A progress line: on the terminal under the CLI (``fedshift: ...``), to the
    ``fedshift.protocols`` logger for a program that runs the protocol as a library."""
    LOG.info(msg, extra={"console": True})


def _optimizer(params: list[torch.nn.Parameter], train: Any) -> torch.optim.Optimizer:
    if train.optimizer == "adam":
        return torch.optim.Adam(
            params, lr=train.lr, betas=tuple(train.betas), weight_decay=train.weight_decay
        )
    return torch.optim.SGD(
        params, lr=train.lr, momentum=train.momentum, weight_decay=train.weight_decay
    )


@torch.no_grad()
def embed(sim: Any, cid: str, x: torch.Tensor, batch_size: int = 256) -> torch.Tensor:
    """The frozen extractor's embeddings of ``x`` (the run's eval pipeline, eval mode)."""
    model, state = sim.model, sim.states.get(cid)
    model.eval()
    dev = sim.exp.device
    out = [
        model.features(sim.pipeline.eval(x[i : i + batch_size].to(dev), state))
        for i in range(0, len(x), batch_size)
    ]
    return torch.cat(out)


def finetune_head(
    sim: Any,
    cid: str,
    x: torch.Tensor,
    y: torch.Tensor,
    epochs: int,
    seed: int,
    loss_fn: Any = None,
) -> list[float]:
    """Train only ``sim.model.classifier`` on the embeddings of (x, y); the extractor is
    frozen. ``loss_fn(logits, y)``: default cross-entropy (new-site passes the task's
    training loss, e.g. segmentation's (CE + Dice)/2). Returns the mean training loss of
    each epoch."""
    from fedshift.core.seeding import derive_seed

    model, train = sim.model, sim.cfg.train
    z = embed(sim, cid, x)
    y = y.long().to(z.device)
    head = model.classifier
    params = [p for p in head.parameters() if p.requires_grad]
    if not params:
        raise FedshiftError(f"client {cid}: the model's classifier has no trainable parameter")
    opt = _optimizer(params, train)
    g = torch.Generator().manual_seed(derive_seed(seed, "head_finetune", cid))
    losses = []
    head.train()
    bs = train.batch_size
    for _ in range(epochs):
        order = torch.randperm(len(z), generator=g).to(z.device)  # once per epoch
        # summed on the device in float64 (no host sync per batch; the same operations as
        # summing float(loss) * batch size on the host)
        total, n = torch.zeros((), dtype=torch.float64, device=z.device), 0
        for i in range(0, len(z), bs):
            idx = order[i : i + bs]
            opt.zero_grad(set_to_none=True)
            loss = (loss_fn or F.cross_entropy)(model.head(z[idx]), y[idx])
            loss.backward()
            opt.step()
            total += loss.detach().double() * len(idx)
            n += len(idx)
        losses.append(float(total) / max(n, 1))
    model.eval()
    return losses


def finetune_run(run_dir: str | Path, epochs: int, weights: str = "selected") -> dict[str, Any]:
    """Step 2 on one finished run (its model at the selected round, or ``weights="last"``):
    ``{client: {before, after, train, train_full}}``."""
    from fedshift.data import load_dataset
    from fedshift.data.partition import apply_partition
    from fedshift.runtime.experiment import score_client

    sim = load_run(run_dir, weights)
    cfg = sim.cfg
    if sim.exp.task.name != "classification":
        raise ConfigError(f"{run_dir}: head-finetune needs a classification run")
    full = apply_partition(load_dataset(cfg.dataset, cfg.partition), cfg.partition)
    by_name = {c.name: c for c in full.clients}
    metric = sim.exp.task.primary.name
    out: dict[str, Any] = {}
    for cid in sim.train_clients:
        client = by_name[cid]
        sim.model.load_state_dict(sim.weights_for(cid))
        before = score_client(sim.exp, client, sim.states.get(cid), cfg.train.batch_size)
        saved = copy.deepcopy(sim.model.state_dict())
        with torch.enable_grad():
            losses = finetune_head(sim, cid, client.train.x, client.train.y, epochs, cfg.seed)
        after = score_client(sim.exp, client, sim.states.get(cid), cfg.train.batch_size)
        sim.model.load_state_dict(saved)
        out[cid] = {
            "before": before[f"test_{metric}"],
            "after": after[f"test_{metric}"],
            "train": len(sim.fed.client(cid).train.y),
            "train_full": len(client.train.y),
            "head_loss": losses,
        }
    return out


def head_finetune(
    options: SuiteOptions, epochs: int = 10, weights: str = "selected"
) -> ProtocolResult:
    """Run the config's cells (step 1), finetune each client's head on all its training data
    (step 2) and tabulate test scores w/o and w. finetuning per client, mean ± std over the
    cells (seeds). Returns a :class:`fedshift.protocols.common.ProtocolResult`."""
    if epochs < 1:
        raise ConfigError(f"--epochs must be >= 1, got {epochs}")
    source = options.source
    raw = options.load()
    cfgs = expand_configs(raw, source)
    for c in cfgs:
        if c.federation.data_fraction >= 1:
            raise ConfigError(
                f"{source}: head-finetune trains on a fraction of each client's data first; "
                "set federation.data_fraction below 1 (FRAug Table 1: 0.1)"
            )
    outp = options.output_dir("head-finetune")
    say = _say if options.progress else lambda msg: None
    say(f"head-finetune: step 1, {len(cfgs)} run(s) of {source} (finished cells are reused)")
    summaries = options.run_cells(
        copy.deepcopy(raw),
        outp / "head-finetune-suite.yaml",
        reuse=False,  # the head is retrained on each cell's model: the cells must hold it
    )
    per_run = {}
    started = time.monotonic()
    for i, s in enumerate(summaries, 1):
        name = Path(s["run_dir"]).name
        say(
            f"head-finetune: step 2, run {i}/{len(summaries)} ({name}): training the heads of "
            f"{len(s['test_per_client'])} clients for {epochs} epochs"
        )
        per_run[s["run_dir"]] = finetune_run(s["run_dir"], epochs, weights)
        gains = [c["after"] - c["before"] for c in per_run[s["run_dir"]].values()]
        left = (time.monotonic() - started) / i * (len(summaries) - i)
        say(
            f"head-finetune: run {i}/{len(summaries)} done, mean gain "
            f"{100 * sum(gains) / len(gains):+.2f} points; ETA {fmt_duration(left)}"
        )
    text, data = head_table(per_run, epochs)
    data["suite"] = str(outp / "head-finetune-suite.yaml")
    files = save_outputs(
        outp, "head-finetune", "Prediction-head finetuning (FRAug Table 1)", text, data
    )
    files["suite"] = outp / "head-finetune-suite.yaml"
    return ProtocolResult("head-finetune", text, data, files)


def head_table(per_run: dict[str, dict[str, Any]], epochs: int) -> tuple[str, dict]:
    """Rows w/o finetune, w. finetune, gain; columns = clients and their average; each cell
    mean ± std over the runs, plus a paired t-test of the per-run averages."""
    runs = list(per_run.values())
    clients = list(runs[0])
    header = ["", *clients, "Avg"]

    def avg(r: dict, key: str) -> float:
        return sum(r[c][key] for c in clients) / len(clients)

    rows, data = [], {"epochs": epochs, "runs": per_run, "clients": clients}
    for key, label in (("before", "w/o finetune"), ("after", "w. finetune")):
        cells = [mean_std_text([r[c][key] for r in runs]) for c in clients]
        rows.append([label, *cells, mean_std_text([avg(r, key) for r in runs])])
    gains = [[r[c]["after"] - r[c]["before"] for r in runs] for c in clients]
    rows.append(
        [
            "gain",
            *[mean_std_text(g) for g in gains],
            mean_std_text([avg(r, "after") - avg(r, "before") for r in runs]),
        ]
    )
    before = {i: avg(r, "before") for i, r in enumerate(runs)}
    after = {i: avg(r, "after") for i, r in enumerate(runs)}
    p = paired_ttest(after, before)
    data["paired_p"] = p
    n_train = {c: (runs[0][c]["train"], runs[0][c]["train_full"]) for c in clients}
    note = (
        f"Test score (%) of each client's model trained on its data fraction (w/o) and after "
        f"training only the prediction head for {epochs} epochs on the embeddings of all its "
        f"training data (w.); mean ± std over {len(runs)} run(s). Training images (fraction / "
        "all): " + ", ".join(f"{c} {a}/{b}" for c, (a, b) in n_train.items()) + "."
    )
    if p is not None:
        note += f" Paired t-test of the averages over runs: p = {p:.3g}."
    return grid(header, rows) + "\n\n" + note, data
