"""FedMix and NaiveMix (Yoon et al., "FedMix: Approximation of Mixup under Mean Augmented
Federated Learning", ICLR 2021).

Mean Augmented FL (MAFL): before training, every client averages its training images and
one-hot labels over groups of ``m`` examples (its "mashed" data, x_bar and y_bar) and sends
them to the server once; the server shares all clients' averaged images with every client
(setup exchange, round 0 in the ledger: record ``fedmix_means`` up, ``fedmix_bank`` down).
These averaged images are what leaves a hospital.

Local training then uses, for a fixed mixing ratio lam:

* ``mode="fedmix"`` (default): the paper's approximation of global mixup by a first-order
  Taylor expansion of l(f((1-lam) x_i + lam x_j), (1-lam) y_i + lam y_j) in lam x_j around
  (1-lam) x_i, with the other client's raw x_j, y_j replaced by an averaged x_bar, y_bar:

      l_FedMix = (1-lam) l(f((1-lam) x_i), y_i) + lam l(f((1-lam) x_i), y_bar)
                 + lam <d l(f((1-lam) x_i), y_i) / dx, x_bar>

  The first two terms are one cross-entropy with the soft target (1-lam) y_i + lam y_bar on
  the input (1-lam) x_i, which ``train_batch`` returns; the input-gradient term is added to
  the objective by forward hooks on the model (see below).
* ``mode="naivemix"``: mixup of the local batch with received averaged data,
  x = (1-lam) x_i + lam x_bar, y = (1-lam) y_i + lam y_bar (the paper's NaiveMix baseline).

The paper's loss averages over the received means j; it is linear in (x_bar, y_bar), so
drawing one mean per example uniformly (as done here) is an unbiased estimate of it (Flower's
public re-implementation draws one mean per batch; no official code was released).

Where the data live: the images an augment sees are raw [0, 1] images, and the run's input
normalisation comes after the augments, so FedMix works in raw image space (the network is
``f = net . normalise``): x_bar are averaged raw images, (1-lam) x_i is scaled before
normalising, and the derivative is taken with respect to the raw input. It is computed as
<dl/dz, J x_bar> at the network input z = pipeline(raw), where J x_bar (the pipeline's
Jacobian applied to x_bar, x_bar / std for the usual normalisation) comes from the input
pipeline's own autograd graph; this is exact for any differentiable pipeline after FedMix.

The gradient term: a forward pre-hook makes the network input a fresh leaf z; a forward hook
computes sum_i CE(f(z)_i, y_i), its gradient w.r.t. z with ``create_graph=True``, and the
term T = lam * mean_i <dl_i/dz_i, (J x_bar)_i>; the logits are then passed through an
identity whose backward also sends d(objective)/dT = 1 into T, so the optimiser's gradient is
that of (algorithm's loss + T). The reported train loss does not include T. With BatchNorm in
training mode the examples of a batch interact, so dl/dz is the gradient of the batch's
summed loss (as any batched implementation computes it).

``m`` is the number of images behind each shared mean (the "batch size of mean images"):
a client with n training images shares floor(n / m) means of m images each (``group_means``),
not one mean of all its data; ``m=null`` is the one-mean-per-client extreme.

Defaults: lam = 0.05 and m = all local data (one mean per client) are the values Flower's
FedMix baseline lists for FedMix on CIFAR-10 (NaiveMix: lam = 0.1). FedRDN's baselines
(FedRDN App. A.2) use m = 5 images per mean and lam = 0.1, which the fedrdn_* suites set
explicitly: ``{name: fedmix, lam: 0.1, m: 5}``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F

from fedshift.algorithms.state import ABSENT, StateVar, client_var, server_var
from fedshift.augment.base import Augment, Records, State, require_federation
from fedshift.augment.mixing import HARD_LABEL_ALGORITHMS
from fedshift.core.bounds import bounded
from fedshift.core.disclosure import Disclosure, Kind, Over, To, When
from fedshift.core.errors import ConfigError, TrainingError
from fedshift.core.federation import ClientData
from fedshift.core.payload import Payload
from fedshift.core.privacy import clip_rows
from fedshift.core.seeding import generator as derived_generator
from fedshift.models.base import FedModel


@dataclass
class FedMixParams:
    mode: Literal["fedmix", "naivemix"] = "fedmix"
    lam: float = bounded(0.05, ge=0, lt=1)  # mixing ratio lambda (fixed, not drawn)
    m: int | None = bounded(None, ge=1)  # examples per averaged image (None: all local data)


def group_means(
    x: torch.Tensor, y: torch.Tensor, m: int | None, num_classes: int, g: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """MAFL's averaged data: a random order of the local examples cut into groups of ``m``
    (a trailing group of fewer than ``m`` is dropped unless it is the only one); per group the
    mean image and the mean one-hot label."""
    n = x.shape[0]
    if n == 0:
        raise ValueError("fedmix: a client has no training data to average")
    size = n if m is None else min(m, n)
    order = torch.randperm(n, generator=g).to(x.device)  # drawn on the CPU generator
    groups = max(1, n // size)
    idx = order[: groups * size].view(groups, size)
    onehot = F.one_hot(y.long(), num_classes).to(x.dtype)
    return x[idx].mean(1), onehot[idx].mean(1)


def clipped_group_means(
    x: torch.Tensor,
    y: torch.Tensor,
    m: int | None,
    num_classes: int,
    g: torch.Generator,
    bound: float,
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """:func:`group_means` with each example's (image, one-hot label) vector clipped to L2
    norm ``bound`` first (``privacy.epsilon``), and the group size: the same groups (the
    same draw of ``g``), float64."""
    n = x.shape[0]
    size = n if m is None else min(m, n)
    order = torch.randperm(n, generator=g).to(x.device)
    groups = max(1, n // size)
    idx = order[: groups * size].view(groups, size)
    onehot = F.one_hot(y.long(), num_classes).double()
    z = clip_rows(torch.cat([x.flatten(1).double(), onehot], dim=1), bound)
    means = z[idx].mean(1)
    return means[:, : x[0].numel()].view(groups, *x.shape[1:]), means[:, x[0].numel() :], size


def example_bound(shape: tuple[int, int, int]) -> float:
    """The largest L2 norm of one example's (image in [0, 1], one-hot label) vector."""
    return (shape[0] * shape[1] * shape[2] + 1) ** 0.5


class _AddToObjective(torch.autograd.Function):
    """Identity on the logits whose backward also gives the extra term gradient 1, so
    ``loss.backward()`` yields the gradient of (loss + extra)."""

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, extra: torch.Tensor) -> torch.Tensor:
        return logits.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return grad, torch.ones((), dtype=grad.dtype, device=grad.device)


@dataclass
class _Pending:
    raw: torch.Tensor  # (1-lam) x, requires grad: the pipeline's output depends on it
    xbar: torch.Tensor  # one averaged raw image per example
    target: torch.Tensor  # y_i as probability rows (the gradient term's label)
    z_in: torch.Tensor | None = None  # the network input the pipeline produced from ``raw``
    jxbar: torch.Tensor | None = None  # J x_bar at the network input
    leaf: torch.Tensor | None = None  # the detached leaf the network is run on


def gradient_term(
    logits: torch.Tensor, z: torch.Tensor, target: torch.Tensor, jxbar: torch.Tensor, lam: float
) -> torch.Tensor:
    """lam * mean_i <d(sum_k CE_k)/dz_i, (J x_bar)_i>, differentiable (create_graph)."""
    ce = F.cross_entropy(logits, target, reduction="sum")
    (grad,) = torch.autograd.grad(ce, z, create_graph=True)
    return lam * (grad * jxbar).flatten(1).sum(1).mean()


def pipeline_jvp(z_in: torch.Tensor, raw: torch.Tensor, v: torch.Tensor) -> torch.Tensor | None:
    """J v where J = d z_in / d raw, by two vector-Jacobian products on the pipeline graph
    (None when ``z_in`` was not computed from ``raw``)."""
    if z_in is raw:
        return v
    u = torch.zeros_like(z_in, requires_grad=True)
    (vjp,) = torch.autograd.grad(
        z_in, raw, grad_outputs=u, create_graph=True, retain_graph=True, allow_unused=True
    )
    if vjp is None:
        return None
    (jv,) = torch.autograd.grad(vjp, u, grad_outputs=v, retain_graph=True, allow_unused=True)
    return torch.zeros_like(z_in) if jv is None else jv.detach()


class FedMix(Augment):
    """FedMix / NaiveMix under Mean Augmented FL: averaged local data shared once."""

    name = "fedmix"
    tasks = ("classification",)  # it mixes one label per image
    Params = FedMixParams
    needs_setup = True

    @classmethod
    def check(cls, params: Any, algorithm: str, others: list[str]) -> None:
        require_federation(
            "fedmix",
            algorithm,
            "mixes local data with other clients' averaged images shared through the server",
            "use 'mixup' for mixing within one data set",
        )
        if algorithm in HARD_LABEL_ALGORITHMS:
            raise ConfigError(
                f"augment 'fedmix' returns soft (mixed) labels, but algorithm '{algorithm}' "
                "needs each example's integer class"
            )

    def __init__(self, params: Any, seed: int, num_classes: int) -> None:
        super().__init__(params, seed, num_classes)
        self.pending: _Pending | None = None
        #: the gradient term at the latest forward, kept on the device (read: ``last_term``)
        self._last_term: torch.Tensor | None = None

    @property
    def last_term(self) -> float | None:
        """Value of the gradient term at the latest forward (it is not in the reported loss);
        converted when read, so that a GPU run does not wait for it every batch."""
        return None if self._last_term is None else float(self._last_term)

    # -- model: the gradient term of l_FedMix ---------------------------------------------
    def attach(self, model: FedModel) -> None:
        if self.params.mode == "fedmix":
            model.register_forward_pre_hook(self._pre_hook)
            model.register_forward_hook(self._post_hook)

    def _pre_hook(self, module: torch.nn.Module, args: tuple) -> tuple | None:
        p = self.pending
        if p is None or not module.training or not torch.is_grad_enabled() or not args:
            return None
        z = args[0]
        if z.shape[0] != p.raw.shape[0]:
            return None
        if p.z_in is not z:  # a new network input: is it this batch's?
            jxbar = pipeline_jvp(z, p.raw, p.xbar.to(z.device)) if z.requires_grad else None
            if jxbar is None:
                if p.z_in is not None:
                    return None  # another forward (not of this batch) after it
                raise TrainingError(
                    "fedmix: the network input is not differentiable with respect to the "
                    "images fedmix produced (an augment after 'fedmix' breaks the graph); "
                    "list 'fedmix' last in 'augment'"
                )
            p.z_in, p.jxbar = z, jxbar
        p.leaf = z.detach().requires_grad_(True)
        return (p.leaf, *args[1:])

    def _post_hook(self, module: torch.nn.Module, args: tuple, out: torch.Tensor) -> Any:
        p = self.pending
        if p is None or p.leaf is None or not args or args[0] is not p.leaf:
            return None
        leaf, p.leaf = p.leaf, None
        assert p.jxbar is not None
        term = gradient_term(out, leaf, p.target.to(out.device), p.jxbar, self.params.lam)
        self._last_term = term.detach()
        return _AddToObjective.apply(out, term)

    # -- MAFL: averaged data shared once ---------------------------------------------------
    def server_vars(self) -> list[StateVar]:
        return [
            server_var("x", ABSENT, doc="every site's averaged images (the setup exchange)"),
            server_var("y", ABSENT, doc="and their averaged labels"),
        ]

    def client_vars(self) -> list[StateVar]:
        """The client's group means, computed together by :meth:`init_client`, and the bank
        it receives in the setup exchange."""
        group = [client_var("group", ABSENT, doc="privacy.epsilon: the group size")]
        return [
            client_var("x", ABSENT, doc="the client's mean image per group (init_client)"),
            client_var("y", ABSENT, doc="its mean one-hot label per group (init_client)"),
            *(group if "fedmix_means" in self.privacy else []),
            client_var("bank_x", ABSENT, doc="every site's averaged images (setup)"),
            client_var("bank_y", ABSENT, doc="and labels (setup)"),
        ]

    def init_client(self, cid: str, data: ClientData, model: FedModel) -> State:
        g = derived_generator(self.seed, "fedmix", cid)
        mech = self.privacy.get("fedmix_means")
        if mech is not None:  # privacy.epsilon: the clipped means, released in setup_reply
            x, y, size = clipped_group_means(
                data.train.x, data.train.y, self.params.m, self.num_classes, g, mech.clip
            )
            return {"x": x, "y": y, "group": size}
        xbar, ybar = group_means(data.train.x, data.train.y, self.params.m, self.num_classes, g)
        return {"x": xbar, "y": ybar}

    def disclosures(self, model: FedModel) -> list[Disclosure]:
        def group(n: int) -> int:
            return n if self.params.m is None else min(self.params.m, n)

        def rows(n: int) -> int:
            return max(1, n // group(n))

        def size(n: int, s) -> int:
            return rows(n) * (s.image_floats + s.num_classes) * 4

        return [
            Disclosure("fedmix_means", "up", Kind.STATISTIC, When.SETUP,
                       lambda s: size(s.examples, s),
                       "the site's mean image and mean one-hot label per group of m examples",
                       to=To.CLIENTS, over=Over.GROUP, count=lambda s: group(s.examples),
                       clip=example_bound),
            Disclosure("fedmix_bank", "down", Kind.STATISTIC, When.SETUP,
                       lambda s: sum(size(n, s) for n in s.federation),
                       "every site's averaged images and labels", carries=("fedmix_means",)),
        ]  # fmt: skip

    def setup_reply(self, cid: str, state: State) -> Records:
        """The averaged data; under ``privacy.epsilon`` the clipped group means plus the
        Gaussian mechanism's noise (groups are disjoint: one example moves one group's mean,
        weight 1/m), then clamped to [0, 1] and the labels renormalised (post-processing)."""
        mech = self.privacy.get("fedmix_means")
        if mech is None:
            return {"fedmix_means": {"x": state["x"], "y": state["y"]}}
        out = mech.release({"x": state["x"], "y": state["y"]}, 1.0 / state["group"], 0, cid)
        y = out["y"].clamp_min(0.0)
        y = torch.where(y.sum(1, keepdim=True) > 0, y, torch.ones_like(y))
        return {"fedmix_means": {
            "x": out["x"].clamp(0.0, 1.0).float(), "y": (y / y.sum(1, keepdim=True)).float(),
        }}  # fmt: skip

    def setup_aggregate(self, server: State, replies: list[tuple[str, Records]]) -> None:
        server["x"] = torch.cat([r["fedmix_means"]["x"] for _, r in replies])
        server["y"] = torch.cat([r["fedmix_means"]["y"] for _, r in replies])

    def setup_broadcast(self, server: State, cid: str) -> Records:
        return {"fedmix_bank": {"x": server["x"], "y": server["y"]}}

    def receive(self, records: Payload, state: State, rnd: int) -> None:
        if "fedmix_bank" in records.records:
            bank = records["fedmix_bank"]
            state["bank_x"], state["bank_y"] = bank["x"].clone(), bank["y"].clone()

    # -- data path -------------------------------------------------------------------------
    def train_batch(
        self, x: torch.Tensor, y: torch.Tensor, state: State, generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if "bank_x" not in state:
            raise RuntimeError("fedmix: no averaged data received (the setup exchange did not run)")
        lam = self.params.lam
        bank = state["bank_x"]
        j = torch.randint(bank.shape[0], (x.shape[0],), generator=generator).to(bank.device)
        xbar = state["bank_x"][j].to(x.device, x.dtype)
        ybar = state["bank_y"][j].to(x.device)
        p = y.float() if y.ndim == 2 else F.one_hot(y.long(), self.num_classes).float()
        target = (1 - lam) * p + lam * ybar
        if self.params.mode == "naivemix":
            self.pending = None
            return (1 - lam) * x + lam * xbar, target
        raw = ((1 - lam) * x).detach().requires_grad_(True)
        self.pending = _Pending(raw=raw, xbar=xbar, target=p)
        return raw, target
