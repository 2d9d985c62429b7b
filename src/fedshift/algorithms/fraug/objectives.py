"""FRAug's losses (Chen et al., ICCV 2023, Sec. 3): the synthetic embeddings of Eq. 2-3, the
model's loss of Eq. 1, the generator's of Eq. 5 and the RTNet's of Eq. 6, each written once
with the ``variant`` record (:class:`fedshift.algorithms.fraug.params.Variant`) choosing
between the paper's form and the released code's where they differ."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from fedshift.algorithms.fraug.nets import Generator, RTNet, entropies, entropy, mmd
from fedshift.algorithms.fraug.params import FRAugParams, RoundPlan, Variant
from fedshift.models.base import FedModel

#: the plan of a loss evaluated outside a round: residual unscaled, no mixing
UNSCALED = RoundPlan()


@dataclass
class WorkingNets:
    """The generator and RTNet one local update trains: the client's own copies of the
    algorithm's templates, loaded from the down payload and the client state (``rtnet`` is
    None with ``embeddings=agnostic``)."""

    generator: Generator
    rtnet: RTNet | None


@dataclass
class Branch:
    """Synthetic embeddings of one branch: Eq. 2's u_hat (real embeddings + residual, the
    batch's labels) or Eq. 3's u_hat_c (class prototypes + residual, class labels c)."""

    emb: torch.Tensor
    labels: torch.Tensor
    #: the class branch of a variant that sums over every class (Eq. 2, 6)
    per_class: bool


@dataclass
class StepBatch:
    """What the losses (Eq. 1, 5, 6) read of one mini-batch: its labels ``y``, the cycled
    class labels ``y_c``, the real embeddings ``ref`` (U, for the generator and the RTNet;
    None when neither needs them), the prototypes, the round's plan and the working networks
    (None: the templates, for a loss evaluated outside a local update)."""

    y: torch.Tensor
    y_c: torch.Tensor
    ref: torch.Tensor | None
    protos: torch.Tensor
    plan: RoundPlan = UNSCALED
    nets: WorkingNets | None = None


class Objectives:
    """The loss terms, mixed into :class:`fedshift.algorithms.fraug.FRAug` (they read its
    ``params``, ``variant``, ``num_classes``, ``noise_dim`` and template networks)."""

    params: FRAugParams
    variant: Variant
    num_classes: int
    noise_dim: int
    generator: Generator
    rtnet: RTNet | None

    def _nets(self, nets: WorkingNets | None) -> WorkingNets:
        """``nets``, or the templates when a loss is evaluated outside a local update."""
        return nets if nets is not None else WorkingNets(self.generator, self.rtnet)

    # -- z and the class labels c ----------------------------------------------------------
    def noise(self, n: int, device: torch.device) -> torch.Tensor:
        """z ~ N(0, I) (Sec. 3.2) or U[0, 1) (code): ``noise``, else the variant's."""
        kind = self.params.noise or self.variant.noise
        if kind == "normal":
            return torch.randn(n, self.noise_dim, device=device)
        return torch.rand(n, self.noise_dim, device=device)

    def class_labels(self, batch: int, device: torch.device, offset: int = 0) -> torch.Tensor:
        """The labels c of the class branch for a batch of ``batch``: every class, ``per_class``
        times, grouped by class (the sums over c of Eq. 2 / 6); or (code) ``batch`` labels
        ``(offset + i) mod C`` cycling through the classes across steps."""
        if self.variant.class_sums:
            k = self.params.per_class or max(2, batch // self.num_classes)
            return torch.arange(self.num_classes, device=device).repeat_interleave(k)
        return (torch.arange(batch, device=device) + offset) % self.num_classes

    # -- Eq. 2-3 ---------------------------------------------------------------------------
    def _branches(
        self, real: torch.Tensor | None, y: torch.Tensor, y_c: torch.Tensor, protos: torch.Tensor
    ) -> list[tuple[torch.Tensor | None, torch.Tensor, bool]]:
        """(base, labels, per-class sum) of the branches ``embeddings`` selects: Eq. 2's on the
        real embeddings, Eq. 3's on the prototypes of the classes ``y_c``."""
        mode, out = self.params.embeddings, []
        if mode in ("both", "u_hat", "agnostic"):
            out.append((real, y, False))
        if mode in ("both", "u_hat_c", "agnostic"):
            out.append((protos[y_c], y_c, self.variant.class_sums))
        return out

    def synthesise(
        self, base: torch.Tensor | None, labels: torch.Tensor, plan: RoundPlan, nets: WorkingNets
    ) -> torch.Tensor:
        """Eq. 3: ``base + lambda_syn(t) * m(g(z, labels), labels)`` (``plan.scale``; 1: the
        code's unscaled residual); ``g(z, labels)`` itself without an RTNet (``agnostic``) or
        without a base."""
        g = nets.generator(self.noise(labels.shape[0], labels.device), labels)
        if nets.rtnet is None or base is None:
            return g
        return nets.rtnet(base, g, labels, scale=plan.scale)

    @torch.no_grad()
    def synthetic_embeddings(self, u: torch.Tensor, batch: StepBatch) -> list[Branch]:
        """The branches in use, built without gradient from the detached real embeddings
        ``u`` (labels ``y``) and the prototypes of classes ``y_c``: Eq. 2's u_hat, Eq. 3's
        u_hat_c (``agnostic``: ``g(z, y)`` and ``g(z', c)``); ``plan.mix`` = r interpolates
        with the base (the code's ``interpolate``); ``batch.ref`` is not read."""
        plan, nets = batch.plan, self._nets(batch.nets)
        out = []
        for base, labels, per_class in self._branches(u.detach(), batch.y, batch.y_c, batch.protos):
            emb = self.synthesise(base, labels, plan, nets)
            if plan.mix is not None:
                assert base is not None  # every branch here has a base: u or a prototype
                emb = plan.mix * emb + (1 - plan.mix) * base
            out.append(Branch(emb, labels, per_class))
        return out

    def per_class_sum(self, values: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """``sum_c mean_{i: labels_i = c} values_i`` (the sums over c of Eq. 2 and 6)."""
        onehot = F.one_hot(labels, self.num_classes).to(values.dtype)
        return ((onehot.t() @ values) / onehot.sum(0).clamp(min=1)).sum()

    def synthetic_terms(self, model: FedModel, branches: list[Branch]) -> Iterator[torch.Tensor]:
        """Eq. 2's terms of ``L_syn``, one per branch: ``CE(h(u_hat), y)`` and
        ``sum_c CE(h(u_hat_c), c)`` (the code: the plain mean CE of each branch). The
        embeddings carry no gradient, so ``L_syn`` trains the prediction head only. (An
        iterator: each term is built as the caller adds it, the order autograd replays.)"""
        for b in branches:
            if b.per_class:
                ce = F.cross_entropy(model.head(b.emb), b.labels, reduction="none")
                yield self.per_class_sum(ce, b.labels)
            else:
                yield F.cross_entropy(model.head(b.emb), b.labels)

    # -- Eq. 1 -----------------------------------------------------------------------------
    def model_loss(self, model: FedModel, u: torch.Tensor, batch: StepBatch) -> torch.Tensor:
        """Eq. 1: ``L_cls = L_real + L_syn`` with ``L_real = CE(h(u), y)`` and Eq. 2's
        ``L_syn``; the code: ``(1 - w_t) L_real + w_t mean(L_syn terms)`` (``plan.syn_weight``;
        no synthetic embeddings are drawn while w_t = 0; ``batch.ref`` is not read)."""
        loss = F.cross_entropy(model.head(u), batch.y)
        w = batch.plan.syn_weight
        if not self.variant.additive_losses and not w:
            return loss
        branches = self.synthetic_embeddings(u, batch)
        if self.variant.additive_losses:
            for term in self.synthetic_terms(model, branches):
                loss = loss + term
            return loss
        assert w is not None
        syn = torch.stack(list(self.synthetic_terms(model, branches))).mean()
        return (1 - w) * loss + w * syn

    # -- Eq. 5 -----------------------------------------------------------------------------
    def _distance(self, kind: str, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        if kind == "mse":
            return F.mse_loss(a, b)
        return mmd(a, b, kernel=self.params.mmd_kernel)

    def generator_loss(self, model: FedModel, batch: StepBatch) -> torch.Tensor:
        """Eq. 5: ``CE(h(u_hat), y) - alpha * MMD(u_hat, U)``, u_hat of Eq. 3 built through the
        fixed RTNet from the real batch ``ref`` (U) and its labels ``y``; the code:
        ``CE(h(g(z, c)), c) - alpha * D`` on the raw generator output for the cycled labels
        ``y_c``, D = MMD(g(z, c), U) or (``generator_distance="mse"``) MSE(g(z, c), u_bar_c)."""
        y, y_c, ref, protos, plan = batch.y, batch.y_c, batch.ref, batch.protos, batch.plan
        nets = self._nets(batch.nets)
        if self.variant.generator_on_residual:
            e = self.synthesise(ref, y, plan, nets)
            labels = y
        else:
            e = self.synthesise(None, y_c, plan, nets)
            labels = y_c
        loss = F.cross_entropy(model.head(e), labels)
        if self.params.alpha:
            if not self.variant.generator_on_residual and self.params.generator_distance == "mse":
                dist = F.mse_loss(e, protos[labels])
            else:
                assert ref is not None
                dist = mmd(e, ref, kernel=self.params.mmd_kernel)
            loss = loss - self.params.alpha * dist
        return loss

    # -- Eq. 6 -----------------------------------------------------------------------------
    def per_class_mmd(
        self, emb: torch.Tensor, labels: torch.Tensor, protos: torch.Tensor
    ) -> torch.Tensor:
        """Eq. 6's ``sum_c MMD(u_hat_c, u_bar_c)``: one distance per class against its
        prototype (``rtnet_distance``)."""
        return torch.stack(
            [
                self._distance(self.params.rtnet_distance, emb[labels == c], protos[c : c + 1])
                for c in labels.unique()
            ]
        ).sum()

    def rtnet_loss(self, model: FedModel, batch: StepBatch) -> torch.Tensor:
        """Eq. 6: ``-(H(h(u_hat)) + sum_c H(h(u_hat_c))) + beta (MMD(u_hat, U) +
        sum_c MMD(u_hat_c, u_bar_c))`` over the branches in use, the generator fixed (its
        output detached); the code: the mean over the branches of ``-H + beta * D`` with one
        pooled distance for the class branch."""
        y, y_c, ref, protos, plan = batch.y, batch.y_c, batch.ref, batch.protos, batch.plan
        nets = self._nets(batch.nets)
        assert nets.rtnet is not None
        beta, additive = self.params.beta, self.variant.additive_losses
        total = torch.zeros((), device=y.device)  # the paper's one sum
        parts = []  # the code's per-branch terms
        for base, labels, per_class in self._branches(ref, y, y_c, protos):
            assert base is not None
            with torch.no_grad():
                g = nets.generator(self.noise(labels.shape[0], labels.device), labels)
            emb = nets.rtnet(base, g, labels, scale=plan.scale)
            logits = model.head(emb)
            h = self.per_class_sum(entropies(logits), labels) if per_class else entropy(logits)
            term = total - h if additive else -h
            if beta:
                if per_class:
                    dist = self.per_class_mmd(emb, labels, protos)
                else:
                    dist = self._distance(self.params.rtnet_distance, emb, base)
                term = term + beta * dist
            if additive:
                total = term
            else:
                parts.append(term)
        return total if additive else torch.stack(parts).mean()
