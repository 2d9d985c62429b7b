"""Segmentation pictures: for each site, the image, its ground truth and every method's
prediction side by side (one PNG), from finished run directories.

Each run is rebuilt from its ``config.yaml`` and saved state (by default the round model
selection picked, ``selected.pt``; ``weights="last"``: the final round: the server's weights
and every client's own tensors), and each client is predicted with the
model the run's tables evaluate (its personalised model where the algorithm keeps local
tensors, FedBN; the global model otherwise), through the client's own input pipeline (FedRDN's
statistics, HarmoFL's amplitude normalisation). Each panel is titled with the method and its
foreground Dice on that image. The runs must share the dataset (same sites and test images).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from fedshift.core.errors import FedshiftError  # noqa: E402
from fedshift.core.files import atomic_output  # noqa: E402
from fedshift.protocols.common import run_label, run_meta  # noqa: E402
from fedshift.runtime.simulation import load_finished  # noqa: E402

#: label colours: background black, then red, cyan, yellow, magenta, green...
PALETTE = (
    np.array(
        [[0, 0, 0], [230, 60, 50], [60, 200, 230], [250, 210, 40], [200, 80, 220], [90, 200, 90]],
        dtype=np.float32,
    )
    / 255.0
)


def _load(run_dir: Path, federation=None, weights: str = "selected"):
    sim = load_finished(run_dir, federation, weights)
    if sim.task.name != "segmentation":
        raise FedshiftError(f"{run_dir}: a {sim.task.name} run; pictures are for segmentation")
    return sim


@torch.no_grad()
def predict(sim, client: str, x: torch.Tensor) -> torch.Tensor:
    """Label maps predicted for ``x`` (raw [0, 1] images of ``client``) by the run's evaluated
    model of that client (personalised if the run has one, else global)."""
    state = sim.states.get(client)
    sim.model.load_state_dict(sim.weights_for(client))
    sim.model.eval()
    logits = sim.model(sim.pipeline.eval(x.to(sim.device), state))
    return logits.argmax(1).cpu()


def _colour(labels: np.ndarray) -> np.ndarray:
    return PALETTE[np.clip(labels, 0, len(PALETTE) - 1)]


def _image(x: torch.Tensor, channel: int | None) -> tuple[np.ndarray, str | None]:
    if channel is not None:
        return x[channel].numpy(), "gray"
    if x.shape[0] == 3:
        return x.permute(1, 2, 0).numpy(), None
    return x[0].numpy(), "gray"


def foreground_dice(pred: torch.Tensor, y: torch.Tensor, num_classes: int) -> float:
    from fedshift.core.tasks import dice_counts, dice_from_counts, nanmean

    per_class = dice_from_counts(dice_counts(pred[None], y[None], num_classes))
    return nanmean(per_class[1:])


def _site_row(
    axes: Any,
    client: Any,
    sims: list,
    split: str,
    index: int | None,
    channel: int | None,
    num_classes: int,
) -> None:
    """One site's row: its image, the ground truth and each run's prediction with its Dice."""
    data = client.split(split)
    if len(data) == 0:
        raise FedshiftError(f"client {client.name!r} has no {split} images")
    i = index if index is not None else int(data.y.flatten(1).gt(0).sum(1).argmax())
    if not 0 <= i < len(data):
        raise FedshiftError(f"index {i} is outside {client.name}'s {len(data)} {split} images")
    # drawn on the host: the run's data may be resident on a GPU
    x, y = data.x[i].cpu(), data.y[i].cpu()
    img, cmap = _image(x, channel)
    axes[0].imshow(img, cmap=cmap, vmin=0, vmax=1)
    axes[0].set_ylabel(f"{client.name}\n{split} #{i}", fontsize=9)
    axes[1].imshow(_colour(y.numpy()))
    for c, sim in enumerate(sims):
        pred = predict(sim, client.name, x[None])[0]
        d = foreground_dice(pred, y, num_classes)
        ax = axes[2 + c]
        ax.imshow(_colour(pred.numpy()))
        ax.set_title(f"Dice {100 * d:.1f}", fontsize=8, pad=2)


def site_predictions_figure(
    run_dirs: list[str | Path],
    out: str | Path,
    split: str = "test",
    index: int | None = None,
    channel: int | None = None,
    labels: list[str] | None = None,
    weights: str = "selected",
) -> Path:
    """Write the per-site picture to ``out`` (PNG). ``index``: which image of each site's
    ``split`` (default: the one with the most foreground pixels, so the structures show);
    ``channel``: show one input channel in gray (e.g. 1, the centre slice of a 3-slice
    stack) instead of RGB; ``labels``: column titles (default: each run's algorithm and
    augments)."""
    if not run_dirs:
        raise FedshiftError("site_predictions_figure: no run directories given")
    sims = []
    fed = None
    for d in run_dirs:
        sim = _load(Path(d), fed, weights)
        fed = fed or sim.fed
        sims.append(sim)
    if labels is None:
        labels = [run_label(run_meta(sim)) for sim in sims]
    clients = fed.clients
    ncol = 2 + len(sims)
    fig, axes = plt.subplots(
        len(clients), ncol, figsize=(1.9 * ncol, 1.9 * len(clients)), squeeze=False
    )
    for r, client in enumerate(clients):
        _site_row(axes[r], client, sims, split, index, channel, fed.num_classes)
        if r == 0:
            axes[r, 0].set_title("image", fontsize=8)
            axes[r, 1].set_title("ground truth", fontsize=8)
    for c, lab in enumerate(labels):
        axes[0, 2 + c].set_title(f"{lab}\n{axes[0, 2 + c].get_title()}", fontsize=8)
    for ax in axes.flat:
        ax.set_xticks([])
        ax.set_yticks([])
    legend = ", ".join(
        f"{name}: {'black' if k == 0 else ['red', 'cyan', 'yellow', 'magenta', 'green'][k - 1]}"
        for k, name in enumerate(fed.classes[: len(PALETTE)])
    )
    fig.suptitle(
        f"{fed.name}: one {split} image per site; {weights} models; colours {legend}",
        fontsize=9,
    )
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_output(out) as tmp:
        fig.savefig(tmp, format=Path(out).suffix[1:] or "png", dpi=110)
    plt.close(fig)
    return out
