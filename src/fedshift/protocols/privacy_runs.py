"""Attacks on what a trained site sends in a round: its weights and the records its model
computes (issue 51; ``fedshift protocol privacy``, :mod:`fedshift.protocols.privacy`).

From a finished run (:func:`~fedshift.protocols.common.load_run`) the attacked site (the
first training client) runs its local update of the next round
(:meth:`~fedshift.runtime.rundir.saved.SavedRun.local_reply`: the algorithm's own training, seeded),
and the attacks read the payload it would send, as the server receives it. The attacker's
model is the server's global model with every tensor the site sent in its ``weights`` record
put in (for FedBN, whose BN layers stay local, the server's own BN layers stay); a site that
sends no weights (FedProto by default) is attacked with its own model, an upper bound.

* **Weights (every method; the reference row)**: the loss-threshold membership test (Yeom et
  al., CSF 2018): the lower an image's loss under the attacker's model, the likelier it was
  trained on. Members: the site's training images; non-members: its test images (the same
  domain, never trained on).
* **Per-class means of representations** (``prototypes``: FedProto, FPL): the tracing test
  (:func:`fedshift.attacks.membership.tracing`: robust where the attacker's features only
  approximate those the record averaged, as here: the record was computed by the model in
  training) per class, on the record as sent, the per-example representations computed
  with the attacker's model, the reference moments from the site's validation images.
* **Feature statistics** (``ffa_stats``: FedFA): the same test on the concatenated per-layer
  means and standard deviations, per example the instance statistics (FedFA's Eq. 2) at each
  FFA layer's input under the attacker's model, ``n`` the site's training images. The record
  is a momentum mean over the round's batches that drew an FFA step under a changing model:
  the test's model of it is approximate, so its numbers are a lower bound.
* **Representations of examples** (``features``: ADCOL): model inversion
  (:func:`fedshift.attacks.inversion.invert_features`) of the first shared vectors, each
  scored by SSIM to the nearest training image of the site.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from fedshift.attacks.inversion import invert_features
from fedshift.attacks.membership import tracing
from fedshift.attacks.scores import nearest_image, roc_score
from fedshift.augment.ffa import instance_statistics
from fedshift.core.payload import Payload

__all__ = ["attack_run", "attacker_weights"]

#: representations inverted per run (each a few hundred Adam steps through the model)
INVERTED = 4


def attacker_weights(sim: Any, up: Payload) -> dict[str, torch.Tensor]:
    """The server's global model with the tensors of the site's ``weights`` record put in."""
    try:
        base = dict(sim.algo.global_weights(sim.server))
    except (KeyError, TypeError, NotImplementedError):  # no global model: the site's own
        base = dict(sim.weights_for(next(iter(sim.train_clients))))
    sent = up.records.get("weights", {})
    base.update({k: v for k, v in sent.items() if k in base})
    return base


def _batches(x: torch.Tensor, size: int):
    for s in range(0, len(x), size):
        yield x[s : s + size]


def _losses(sim: Any, site: str, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Per-example loss of the working model on raw images ``x`` (mean over pixels for
    segmentation), through the site's evaluation pipeline."""
    state, bs, out = sim.states.get(site), sim.cfg.eval.batch_size, []
    with torch.no_grad():
        for xb, yb in zip(_batches(x, bs), _batches(y, bs), strict=True):
            logits = sim.model(sim.pipeline.eval(xb.to(sim.device), state))
            loss = F.cross_entropy(logits, yb.to(sim.device).long(), reduction="none")
            out.append(loss.flatten(1).mean(1) if loss.dim() > 1 else loss)
    return torch.cat(out).double().cpu()


def _features(sim: Any, site: str, x: torch.Tensor) -> torch.Tensor:
    state, out = sim.states.get(site), []
    with torch.no_grad():
        for xb in _batches(x, sim.cfg.eval.batch_size):
            z = sim.model.features(sim.pipeline.eval(xb.to(sim.device), state))
            out.append((z.flatten(2).mean(2) if z.dim() > 2 else z).double())
    return torch.cat(out).cpu()


def _ffa_features(sim: Any, site: str, x: torch.Tensor, stages: list[str]) -> torch.Tensor:
    """Per example, the instance mean and std (Eq. 2) at each FFA stage's input, in the
    record's order (``<stage>.mean``, ``<stage>.std`` for each stage)."""
    model, state, seen = sim.model, sim.states.get(site), {}
    saved = dict(model.stage_hooks)

    def capture(stage: str, prev: Any):
        def hook(t: torch.Tensor) -> torch.Tensor:
            seen[stage] = instance_statistics(t)
            return t if prev is None else prev(t)

        return hook

    rows = []
    try:
        for stage in stages:
            model.stage_hooks[stage] = capture(stage, saved.get(stage))
        with torch.no_grad():
            for xb in _batches(x, sim.cfg.eval.batch_size):
                model(sim.pipeline.eval(xb.to(sim.device), state))
                rows.append(torch.cat([t for s in stages for t in seen[s]], dim=1).double())
    finally:
        model.stage_hooks.clear()
        model.stage_hooks.update(saved)
    return torch.cat(rows).cpu()


def _split(sim: Any, site: str, name: str) -> tuple[torch.Tensor, torch.Tensor]:
    part = getattr(sim.fed.client(site), name)
    return torch.as_tensor(part.x[:]).float(), torch.as_tensor(part.y[:])


def _traced(
    record: torch.Tensor, members: torch.Tensor, others: torch.Tensor, ref: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The tracing scores of ``members`` and ``others`` for ``record``, with the reference
    sample's moments."""
    mu, var = ref.mean(0), ref.var(0)
    return tracing(record, members, mu, var), tracing(record, others, mu, var)


def attack_run(sim: Any, fpr: float = 1e-3, seed: int = 0) -> dict[str, Any]:
    """Every attack of the module docstring on the first training client of the finished
    run ``sim``; returns ``{"site": ..., "rows": {attack: value}, "records": [...],
    "pictures": {...}}``."""
    site = next(iter(sim.train_clients))
    with torch.enable_grad():
        up = sim.local_reply(sim.round + 1, site)
    own = {k: v.detach().clone() for k, v in sim.model.state_dict().items()}
    # a site that sends no weights (FedProto by default): the attacks that need a model use
    # the site's own, an upper bound of what its server can do
    sim.model.load_state_dict(attacker_weights(sim, up) if "weights" in up.records else own)
    sim.model.eval()
    xtr, ytr = _split(sim, site, "train")
    xva, yva = _split(sim, site, "val")
    xte, yte = _split(sim, site, "test")
    rows: dict[str, float] = {}
    if "weights" in up.records:
        lost_in, lost_out = -_losses(sim, site, xtr, ytr), -_losses(sim, site, xte, yte)
        roc = roc_score(lost_in, lost_out, fpr)
        rows["membership AUC, weights (loss threshold)"] = roc.auc
        rows[f"membership TPR at FPR {fpr:g}, weights"] = roc.tpr
    pictures: dict[str, Any] = {}
    records = sorted(up.records)
    if "prototypes" in up.records:
        protos, counts = up["prototypes"]["protos"].double(), up["prototypes"]["counts"]
        ftr, fva, fte = (_features(sim, site, x) for x in (xtr, xva, xte))
        ins, outs = [], []
        for c in range(len(protos)):
            m, o, r = ftr[ytr == c], fte[yte == c], fva[yva == c]
            if int(counts[c]) < 1 or len(m) == 0 or len(o) == 0 or len(r) < 2:
                continue
            a, b = _traced(protos[c], m, o, r)
            ins.append(a)
            outs.append(b)
        if ins:
            roc = roc_score(torch.cat(ins), torch.cat(outs), fpr)
            rows["membership AUC, prototypes (per class)"] = roc.auc
            rows[f"membership TPR at FPR {fpr:g}, prototypes"] = roc.tpr
    if "ffa_stats" in up.records:
        stats = up["ffa_stats"]
        stages = sorted({k.rsplit(".", 1)[0] for k in stats})
        record = torch.cat([stats[f"{s}.{p}"].double() for s in stages for p in ("mean", "std")])
        ftr, fva, fte = (_ffa_features(sim, site, x, stages) for x in (xtr, xva, xte))
        a, b = _traced(record, ftr, fte, fva)
        roc = roc_score(a, b, fpr)
        rows["membership AUC, feature statistics"] = roc.auc
        rows[f"membership TPR at FPR {fpr:g}, feature statistics"] = roc.tpr
    if "features" in up.records:
        z = up["features"]["z"][:INVERTED].float()
        state = sim.states.get(site)

        def feats(x: torch.Tensor) -> torch.Tensor:
            out = sim.model.features(sim.pipeline.eval(x.to(sim.device), state))
            return out.flatten(2).mean(2) if out.dim() > 2 else out

        with torch.enable_grad():
            recs = invert_features(feats, z.to(sim.device), tuple(xtr.shape[1:]), seed=seed)
        gray = xtr.mean(1)
        scores = [nearest_image(r.mean(0).cpu(), gray) for r in recs]
        rows["SSIM, representation inversion"] = sum(s.ssim for s in scores) / len(scores)
        rows["PSNR dB, representation inversion"] = sum(s.psnr for s in scores) / len(scores)
        pictures["representation inversion"] = (recs[0].mean(0).cpu(), gray[scores[0].index])
    return {"site": site, "rows": rows, "records": records, "pictures": pictures}
