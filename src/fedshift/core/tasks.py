"""What a federation's labels mean, and therefore how a client's loss and the metrics are
computed: ``classification`` (one class per image) or ``segmentation`` (one class per pixel).

A :class:`Task` owns the local loss (``train.loss``; ``auto`` = cross-entropy for
classification and the (CE + Dice) / 2 joint loss of HarmoFL and FedFA for segmentation) and
the evaluation metrics. Algorithms call ``ctx.task.loss(logits, y)`` instead of a fixed
cross-entropy, so every algorithm whose objective is "the task loss (+ a penalty / a
correction)" runs on both tasks unchanged; algorithms and augments that need one label per
image (prototypes, mixed labels, class-conditional generators) say so with
``tasks = ("classification",)`` and are rejected at config time on segmentation data.

Metrics (every row of ``metrics.jsonl`` has ``{split}_{metric}`` for each):

* classification: ``acc`` (accuracy; model selection) and ``loss`` (mean cross-entropy);
* segmentation: ``dice`` = **foreground Dice** (mean over the foreground classes; model
  selection), ``dice_all`` = **mean Dice over all classes including background** (the number
  FedFA's and HarmoFL's code report), and ``loss`` (the task loss averaged over images).
  Dice is computed per image and class on the arg-max prediction,
  ``D = 2 |P n G| / (|P| + |G|)``, averaged per class over the images where the class occurs
  in the prediction or the ground truth (an image with the class in neither is skipped for
  that class; HarmoFL's ``dice_coef`` counts such an image as 0 and averages per batch, which
  only differs on images lacking a class), then averaged over classes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from fedshift.core.errors import ConfigError, TrainingError

if TYPE_CHECKING:
    from fedshift.core.federation import Split

LOSSES = ("auto", "ce", "dice", "ce+dice")
SMOOTH = 1e-5  # HarmoFL's DiceLoss smoothing

#: partitions that never look at labels (the dataset's own clients; clients dealt from its
#: domains), so any task may use them (``fedshift.data.partition`` deals the others by class)
LABEL_FREE_PARTITIONS = ("none", "domains")


# ----------------------------------------------------------------------------- losses
def soft_dice_loss(logits: torch.Tensor, y: torch.Tensor, smooth: float = SMOOTH) -> torch.Tensor:
    """Soft Dice loss over a batch (Milletari et al., 2016, Eq. 1; HarmoFL's ``DiceLoss``):
    with p = softmax(logits) and one-hot g, per class c over all pixels of the batch
    ``D_c = (2 sum p_c g_c + s) / (sum p_c + sum g_c + s)`` and the loss is
    ``1 - mean_c D_c`` over every class including background."""
    probs = logits.softmax(1)
    onehot = F.one_hot(y, logits.shape[1]).movedim(-1, 1).to(probs.dtype)
    dims = (0, *range(2, logits.dim()))
    inter = (probs * onehot).sum(dims)
    denom = probs.sum(dims) + onehot.sum(dims)
    return 1 - ((2 * inter + smooth) / (denom + smooth)).mean()


def pixel_cross_entropy(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over every pixel of ``logits`` (N, C, H, W) and labels (N, H, W).

    On a CUDA tensor with deterministic algorithms on (``run.deterministic``) the pixels are
    flattened to rows first: PyTorch's CUDA kernel for 2-D targets sums with atomics and
    refuses to run in deterministic mode, the per-row kernel does not (the same value up to
    rounding). Everywhere else (the CPU: bit-identical to before) the plain call."""
    if logits.is_cuda and logits.dim() > 2 and torch.are_deterministic_algorithms_enabled():
        return flat_cross_entropy(logits, y)
    return F.cross_entropy(logits, y)


def flat_cross_entropy(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of (N, C, ...) logits with every position a row of C logits."""
    c = logits.shape[1]
    return F.cross_entropy(logits.movedim(1, -1).reshape(-1, c), y.reshape(-1))


def joint_loss(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """(cross-entropy + soft Dice) / 2, the segmentation loss of HarmoFL (``JointLoss``) and
    FedFA (``TRAIN_LOSS = 'joint'``)."""
    return (pixel_cross_entropy(logits, y) + soft_dice_loss(logits, y)) / 2


# ----------------------------------------------------------------------------- metrics
def dice_counts(pred: torch.Tensor, y: torch.Tensor, num_classes: int) -> torch.Tensor:
    """Per image and class: (|P n G|, |P| + |G|) of the label maps ``pred`` and ``y``
    (both (N, H, W)); returns (N, C, 2) int64."""
    p = F.one_hot(pred.flatten(1), num_classes)
    g = F.one_hot(y.flatten(1), num_classes)
    return torch.stack([(p & g).sum(1), p.sum(1) + g.sum(1)], dim=-1)


def dice_from_counts(counts: torch.Tensor) -> torch.Tensor:
    """Per class: the mean over images of 2|P n G| / (|P| + |G|), skipping images where the
    class is in neither map (NaN for a class absent everywhere). ``counts``: (N, C, 2)."""
    inter, total = counts[..., 0].double(), counts[..., 1].double()
    defined = total > 0
    per_image = torch.where(defined, 2 * inter / total.clamp_min(1), torch.zeros_like(total))
    n = defined.sum(0)
    return torch.where(
        n > 0, per_image.sum(0) / n.clamp_min(1), torch.full_like(n, torch.nan, dtype=torch.float64)
    )


def nanmean(values: torch.Tensor) -> float:
    ok = ~torch.isnan(values)
    return float(values[ok].mean()) if bool(ok.any()) else float("nan")


class NonFiniteOutputError(TrainingError):
    """The model's outputs on an evaluated split hold NaN or inf: any score of them would be
    made up (``argmax`` of a NaN row is class 0, so accuracy and Dice read as those of a
    model that predicts class 0 everywhere). Callers add which client and split."""


def check_finite_outputs(bad: int, examples: int) -> None:
    """Raise :class:`NonFiniteOutputError` when ``bad`` (the count of non-finite output
    values over ``examples`` evaluated examples) is not 0."""
    if bad:
        raise NonFiniteOutputError(
            f"the model's outputs hold {bad:,} NaN/inf value(s) over {examples:,} evaluated "
            "example(s): the run diverged, and a score of such outputs would be meaningless; "
            "lower train.lr, or look at what changes the weights outside training "
            "(privacy noise, a server optimiser)"
        )


# ----------------------------------------------------------------------------- tasks
@dataclass(frozen=True)
class Metric:
    name: str  # key in metric rows: "{split}_{name}"
    label: str  # what tables and plots call it


class Task:
    """The loss and the metrics of one kind of label."""

    name: ClassVar[str]
    #: the metrics every evaluation writes; the first is the one model selection uses
    metrics: ClassVar[tuple[Metric, ...]]

    def __init__(self, loss: str = "auto") -> None:
        if loss not in LOSSES:
            raise ConfigError(f"config key 'train.loss': {loss!r} is not one of {LOSSES}")
        self.loss_name = loss

    @property
    def primary(self) -> Metric:
        return self.metrics[0]

    def loss(self, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def evaluate(
        self,
        model: nn.Module,
        split: Split,
        prepare: Callable[[torch.Tensor], torch.Tensor],
        batch_size: int,
        device: torch.device,
    ) -> dict[str, float]:
        raise NotImplementedError

    def predict(self, logits: torch.Tensor) -> torch.Tensor:
        return logits.argmax(1)


class Classification(Task):
    name = "classification"
    metrics = (Metric("acc", "accuracy"), Metric("loss", "cross-entropy"))

    def __init__(self, loss: str = "auto") -> None:
        super().__init__(loss)
        if loss in ("dice", "ce+dice"):
            raise ConfigError(
                f"config key 'train.loss': {loss!r} is a segmentation loss but the dataset is "
                "a classification task; use train.loss=ce (or auto)"
            )

    def loss(self, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Cross-entropy; ``y`` may be class indices or soft labels (N, classes)."""
        return F.cross_entropy(logits, y)

    @torch.no_grad()
    def evaluate(self, model, split, prepare, batch_size, device) -> dict[str, float]:
        """Accuracy and mean cross-entropy of ``model`` on ``split``, in eval mode."""
        model.eval()
        n = len(split)
        if n == 0:
            return {"acc": float("nan"), "loss": float("nan")}
        correct = torch.zeros((), dtype=torch.long, device=device)
        loss = torch.zeros((), dtype=torch.float64, device=device)
        bad = torch.zeros((), dtype=torch.long, device=device)
        for start in range(0, n, batch_size):
            x = prepare(split.x[start : start + batch_size].to(device))
            y = split.y[start : start + batch_size].to(device)
            logits = model(x)
            bad += (~torch.isfinite(logits)).sum()
            loss += F.cross_entropy(logits, y, reduction="sum").double()
            correct += (logits.argmax(1) == y).sum()
        check_finite_outputs(int(bad), n)
        return {"acc": float(correct) / n, "loss": float(loss) / n}


class Segmentation(Task):
    name = "segmentation"
    metrics = (
        Metric("dice", "foreground Dice"),
        Metric("dice_all", "mean Dice incl. background"),
        Metric("loss", "loss"),
    )

    def loss(self, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """``train.loss``: ``ce+dice`` (``auto``) the joint loss, ``dice`` the soft Dice loss,
        ``ce`` pixel-wise cross-entropy."""
        if self.loss_name in ("auto", "ce+dice"):
            return joint_loss(logits, y)
        if self.loss_name == "dice":
            return soft_dice_loss(logits, y)
        return pixel_cross_entropy(logits, y)

    @torch.no_grad()
    def evaluate(self, model, split, prepare, batch_size, device) -> dict[str, float]:
        """Foreground Dice, mean Dice incl. background and the mean loss on ``split``."""
        model.eval()
        n = len(split)
        if n == 0:
            return {"dice": float("nan"), "dice_all": float("nan"), "loss": float("nan")}
        # accumulated on the device (no host sync per batch): the same float64 operations,
        # in the same order, as summing float(batch loss) * batch size on the host
        counts, loss = [], torch.zeros((), dtype=torch.float64, device=device)
        bad = torch.zeros((), dtype=torch.long, device=device)
        for start in range(0, n, batch_size):
            x = prepare(split.x[start : start + batch_size].to(device))
            y = split.y[start : start + batch_size].to(device)
            logits = model(x)
            bad += (~torch.isfinite(logits)).sum()
            loss += self.loss(logits, y).double() * len(y)
            counts.append(dice_counts(logits.argmax(1), y, logits.shape[1]))
        check_finite_outputs(int(bad), n)
        per_class = dice_from_counts(torch.cat(counts).cpu())
        return {
            "dice": nanmean(per_class[1:]),
            "dice_all": nanmean(per_class),
            "loss": float(loss) / n,
        }


TASKS: dict[str, type[Task]] = {"classification": Classification, "segmentation": Segmentation}


def make_task(name: str, loss: str = "auto") -> Task:
    return TASKS[name](loss)


def metric_label(task: str, metric: str | None = None) -> str:
    """How tables name a task's metric (its primary metric by default)."""
    cls = TASKS[task]
    for m in cls.metrics:
        if metric in (None, m.name):
            return m.label
    raise KeyError(f"task {task!r} has no metric {metric!r}")


def check_task(
    task: str,
    dataset: str,
    algorithm: str,
    algorithm_tasks: tuple[str, ...],
    augments: dict[str, tuple[str, ...]],
    loss: str,
    partition: str,
) -> None:
    """Config-time check that the algorithm, the augments, the loss and the partition make
    sense for the dataset's task; raise ConfigError saying why not."""
    if task not in algorithm_tasks:
        raise ConfigError(
            f"config key 'algorithm.name': algorithm {algorithm!r} supports "
            f"{' and '.join(algorithm_tasks)} only, but dataset {dataset!r} is a {task} task"
        )
    for name, tasks in augments.items():
        if task not in tasks:
            raise ConfigError(
                f"config key 'augment': augment {name!r} supports {' and '.join(tasks)} only "
                f"(it mixes or needs one label per image), but dataset {dataset!r} is a "
                f"{task} task; remove it"
            )
    make_task(task, loss)
    if task == "segmentation" and partition not in LABEL_FREE_PARTITIONS:
        raise ConfigError(
            f"config key 'partition.name': label-skew partitions ({partition!r}) deal out "
            f"images by their class, which a segmentation dataset ({dataset!r}) does not have; "
            f"use partition.name={' or '.join(LABEL_FREE_PARTITIONS)}"
        )
