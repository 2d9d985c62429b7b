"""t-SNE of the clients' test features, coloured by client, one panel per run
(``fedshift protocol tsne RUN_DIR...``; FedRDN's Fig. 3: a local model against a federated
one).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402
from tqdm.auto import tqdm  # noqa: E402

from fedshift.core.errors import FedshiftError  # noqa: E402
from fedshift.core.files import atomic_output  # noqa: E402
from fedshift.eval.tables import grid  # noqa: E402
from fedshift.protocols.common import (  # noqa: E402
    SPLITS,
    ProtocolResult,
    load_run,
    output_dir,
    run_label,
    run_meta,
    save_outputs,
)


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
        outs.append(z.double())
    return torch.cat(outs).cpu()  # one copy to the host, not one per batch


def tsne(
    run_dirs: list[str | Path],
    per_client: int = 150,
    out: str | Path | None = None,
    perplexity: float = 30.0,
    seed: int = 0,
    split: str = "test",
    labels: list[str] | None = None,
    progress: bool = True,
    weights: str = "selected",
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
        sim = load_run(d, weights)
        panel = _panel(sim, d, per_client, perplexity, seed, split)
        panel["label"] = labels[r] if labels else f"{run_label(run_meta(sim))} ({sim.kinds[0]})"
        panels.append(panel)
    table = _panel_table(panels)
    caption = f"t-SNE of {split} features by client (up to {per_client} images per client)"
    note = (
        "Silhouette of the client labels (in [-1, 1]): high = features cluster by client "
        f"(domain-specific), near 0 = clients mixed. TSNE(init=pca, random_state={seed})."
    )
    text = f"{caption}:\n\n{table}\n\n_{note}_"
    data = {
        "protocol": "tsne",
        "split": split,
        "per_client": per_client,
        "seed": seed,
        "panels": panels,
    }
    outp = output_dir(out, "tsne")
    files = save_outputs(outp, "tsne", "t-SNE of client features", text, data)
    files["png"] = _tsne_png(panels, outp / "tsne.png")
    return ProtocolResult("tsne", text, data, files)


def _panel(
    sim: Any, d: str | Path, per_client: int, perplexity: float, seed: int, split: str
) -> dict[str, Any]:
    """One run's panel: its clients' features embedded by t-SNE, with the silhouettes."""
    from sklearn.manifold import TSNE
    from sklearn.metrics import silhouette_score

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
    return {
        "run_dir": str(d),
        "label": "",
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


def _panel_table(panels: list[dict]) -> str:
    """One row per panel: its model, points, feature size, perplexity and silhouettes."""
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
    return grid(header, rows)


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
    with atomic_output(path) as tmp:
        fig.savefig(tmp, format=Path(path).suffix[1:] or "png", dpi=110)
    plt.close(fig)
    return path
