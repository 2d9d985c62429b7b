"""FedRDN (Yan et al., "A Simple Data Augmentation for Feature Distribution Skewed Federated
Learning"): random normalisation with the federation's statistics, at the input level.

Before training every client k computes channel statistics of its training images
(Algorithm 1, lines 2-11):
  mu_i^k, sigma_i^k = mean and std of image i over its H x W pixels, per channel   (Eq. 6)
  mu_k    = 1/n_k sum_i mu_i^k,   sigma_k = 1/n_k sum_i sigma_i^k                  (Eq. 5)
(population std, 1/HW inside the root, as Eq. 6 prints it) and uploads the pair once (2C
floats). The server shares all clients' pairs with everyone (setup exchange, round 0 in the
ledger). Eq. 5 and Algorithm 1 line 8 print a plain sum over the n_k images without the
1/n_k; read literally the "mean" would grow with the data set size and Eq. 7 would no longer
normalise, so fedshift averages, as the released code does (per-image statistics averaged).
Likewise Eq. 9 (FedRDN-V) prints sum_k mu_k and is taken as the average 1/K sum_k mu_k. The
statistics are of the raw training images (before any other augment); the released code
computes them through its training transform (flip / rotation), which leaves per-image channel
means unchanged up to the rotated-in black corners.

* ``fedrdn``: during training each image is normalised with the pair of a client drawn
  uniformly at random from all K clients (its own included), redrawn for every image every
  time it is seen (Eq. 7, Algorithm 1 lines 14-19); at test time client k normalises with its
  own pair (Eq. 8); a client that never trains (``federation.holdout``) uses its own pair.
  ``draw="released"`` reproduces the released code instead: one draw per mini-batch, with
  the mean and the std drawn independently (each from a possibly different client).
* ``fedrdn_v``: the averaged statistics mu = 1/K sum_k mu_k, sigma = 1/K sum_k sigma_k for
  training and test (FedRDN-V, Eq. 9).
* ``norm``: the "+norm" flow of Tables 1-3, conventional data normalisation (Eq. 4): every
  client standardises its training and test images with the same FIXED channel constants
  ``mean``/``std`` (Sec. 3.1: values "manually set" from experience or from a real data set).
  Default constants: the ImageNet statistics (0.485, 0.456, 0.406) / (0.229, 0.224, 0.225),
  the values the released code's ``transforms.Normalize`` uses; give ``mean``/``std`` for
  other data (one value per channel). ``stats="client"`` is the earlier fedshift behaviour,
  each client standardised with its own Eq. 5-6 statistics (not the paper's baseline: it is
  FedRDN's test-time rule, Eq. 8, applied at training too). Nothing is communicated.

All three normalise the inputs themselves, so the run's ``input.mean/std`` step is skipped.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import torch

from fedshift.algorithms.state import ABSENT, StateVar, client_var, server_var
from fedshift.augment.base import Augment, Records, State, require_federation
from fedshift.core.bounds import bounds
from fedshift.core.disclosure import Disclosure, Kind, Over, To, When
from fedshift.core.errors import ConfigError
from fedshift.core.federation import ClientData
from fedshift.core.payload import Payload
from fedshift.core.privacy import clip_rows
from fedshift.models.base import FedModel


def channel_statistics(x: torch.Tensor, batch: int = 1024) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. 5-6: the mean over images of each image's per-channel mean and std (over H x W)."""
    if x.ndim != 4 or x.shape[0] == 0:
        raise ValueError(f"expected a non-empty (N, C, H, W) tensor, got shape {tuple(x.shape)}")
    # on the images' device: a client's data may be resident on a GPU (run.data)
    mean = torch.zeros(x.shape[1], dtype=torch.float64, device=x.device)
    std = torch.zeros(x.shape[1], dtype=torch.float64, device=x.device)
    for s in range(0, x.shape[0], batch):
        flat = x[s : s + batch].flatten(2).double()
        mean += flat.mean(2).sum(0)
        std += flat.std(2, unbiased=False).sum(0)
    n = x.shape[0]
    return (mean / n).float(), (std / n).float()


def clipped_statistics(
    x: torch.Tensor, bound: float, batch: int = 1024
) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. 5-6 with each image's (channel means, channel stds) vector, 2C values, clipped
    to L2 norm ``bound`` before the mean over images (``privacy.epsilon``:
    :func:`fedshift.core.privacy.clip_rows`); float64, on the images' device."""
    c = x.shape[1]
    total = torch.zeros(2 * c, dtype=torch.float64, device=x.device)
    for s in range(0, x.shape[0], batch):
        flat = x[s : s + batch].flatten(2).double()
        z = torch.cat([flat.mean(2), flat.std(2, unbiased=False)], dim=1)
        total += clip_rows(z, bound).sum(0)
    total /= x.shape[0]
    return total[:c], total[c:]


def stats_bound(shape: tuple[int, int, int]) -> float:
    """The largest L2 norm of one image's (means, stds) vector for images in [0, 1]:
    sqrt(C * 1 + C * 0.25) (a channel mean is at most 1, a population std at most 1/2): the
    default clip of ``fedrdn_stats``."""
    return (1.25 * shape[0]) ** 0.5


#: the smallest std a noisy release of ``fedrdn_stats`` is clamped to (post-processing:
#: Eq. 7 divides by it; images in [0, 1])
NOISY_STD_FLOOR = 0.01


def _normalize(x: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """(x - mean) / std with per-image (N, C) or shared (C,) statistics."""
    if mean.ndim == 1:
        mean, std = mean.view(1, -1, 1, 1), std.view(1, -1, 1, 1)
    else:
        mean, std = mean[:, :, None, None], std[:, :, None, None]
    return (x - mean) / std


class Standardize(torch.nn.Module):
    """``(x - mean) / std`` per channel with fixed statistics held as buffers: ``eval_batch``
    of these augments for one site, in a form ``torch.export`` captures (the export's
    predictor, :mod:`fedshift.runtime.predictor`)."""

    def __init__(self, mean: torch.Tensor, std: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("mean", mean.detach().float().cpu().clone())
        self.register_buffer("std", std.detach().float().cpu().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _normalize(x, self.mean, self.std)


class _ClientStats(Augment):
    """Shared part: the client's own statistics, computed once from its training split."""

    normalizes = True

    def client_vars(self) -> list[StateVar]:
        """The client's per-channel mean and std, computed together by :meth:`init_client`."""
        return [
            client_var("mean", ABSENT, doc="the client's per-channel mean (init_client)"),
            client_var("std", ABSENT, doc="its per-channel std (init_client)"),
        ]

    def init_client(self, cid: str, data: ClientData, model: FedModel) -> State:
        mean, std = channel_statistics(data.train.x)
        if bool((std <= 0).any()):
            raise ConfigError(
                f"augment '{self.name}': client {cid!r} has a channel with zero spread "
                "(constant images); its statistics cannot normalise"
            )
        return {"mean": mean, "std": std}

    def eval_batch(self, x: torch.Tensor, state: State) -> torch.Tensor:
        """Eq. 8: each client normalises its test data with its own statistics."""
        return _normalize(x, state["mean"].to(x.device), state["std"].to(x.device))

    def eval_module(self, state: State) -> torch.nn.Module | None:
        return Standardize(state["mean"], state["std"])

    def site_state(self, server: State, images: torch.Tensor | None) -> State | None:
        """A new site normalises with its own Eq. 5-6 statistics (as a held-out client):
        computed from ``images``; ``None`` without them."""
        if images is None:
            return None
        mean, std = channel_statistics(images)
        if bool((std <= 0).any()):
            raise ConfigError(
                f"augment '{self.name}': the site's images have a channel with zero spread "
                "(constant images); their statistics cannot normalise"
            )
        return {"mean": mean, "std": std}

    @classmethod
    def _one_normalizer(cls, others: list[str]) -> None:
        from fedshift.augment import AUGMENTS

        clash = [o for o in others if AUGMENTS.get(o).normalizes]
        if clash:
            raise ConfigError(
                f"config key 'augment': '{cls.name}' and {clash} both normalise the inputs; "
                "keep one of them"
            )


#: the fixed constants of the released code's ``transforms.Normalize`` (ImageNet statistics)
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


@dataclass
class NormParams:
    # "fixed": Eq. 4 with the constants below for every client (the paper's "+norm" baseline);
    # "client": each client's own Eq. 5-6 statistics (earlier fedshift behaviour).
    stats: Literal["fixed", "client"] = "fixed"
    mean: list[float] = field(default_factory=lambda: list(IMAGENET_MEAN))
    std: list[float] = field(default_factory=lambda: list(IMAGENET_STD), metadata=bounds(gt=0))


class Norm(_ClientStats):
    """The "+norm" flow: conventional data normalisation, Eq. 4 (``NormParams``)."""

    name = "norm"
    Params = NormParams

    @classmethod
    def check(cls, params: Any, algorithm: str, others: list[str]) -> None:
        if params.stats == "client" and algorithm == "central":
            raise ConfigError(
                "augment 'norm' with stats=client normalises each client with its own "
                "statistics, but algorithm 'central' trains on the pooled data; use the "
                "default stats=fixed"
            )
        if params.stats == "fixed":
            mean, std = list(params.mean), list(params.std)
            if not mean or len(mean) != len(std) or any(float(s) <= 0 for s in std):
                raise ConfigError(
                    "config keys 'augment.norm.mean'/'augment.norm.std' need one value per "
                    f"channel, equal lengths and std > 0; got mean={mean}, std={std}"
                )
        cls._one_normalizer(others)

    def init_client(self, cid: str, data: ClientData, model: FedModel) -> State:
        """Eq. 4's constants (``stats="fixed"``) or the client's own Eq. 5-6 statistics."""
        if self.params.stats == "client":
            return super().init_client(cid, data, model)
        dev = data.train.x.device  # kept where the batches are: no copy per batch
        mean = torch.tensor([float(v) for v in self.params.mean], device=dev)
        std = torch.tensor([float(v) for v in self.params.std], device=dev)
        channels = data.train.x.shape[1]
        if mean.numel() != channels:
            raise ConfigError(
                f"augment 'norm': client {cid!r} has {channels}-channel images but "
                f"'augment.norm.mean'/'augment.norm.std' give {mean.numel()} values (default: "
                f"the 3 ImageNet constants); set one value per channel, e.g. "
                f"augment=[{{name: norm, mean: {[0.5] * channels}, std: {[0.5] * channels}}}]"
            )
        return {"mean": mean, "std": std}

    def train_batch(self, x, y, state, generator):
        return _normalize(x, state["mean"].to(x.device), state["std"].to(x.device)), y

    def site_state(self, server: State, images: torch.Tensor | None) -> State | None:
        """``stats="fixed"``: the same constants for every site; ``"client"``: the site's own."""
        if self.params.stats == "client":
            return super().site_state(server, images)
        mean = torch.tensor([float(v) for v in self.params.mean])
        return {"mean": mean, "std": torch.tensor([float(v) for v in self.params.std])}


@dataclass
class FedRDNParams:
    # "paper": a client's (mean, std) pair per image, redrawn every time (Eq. 7);
    # "released": one draw per mini-batch, mean and std drawn independently.
    draw: Literal["paper", "released"] = "paper"


class _Federated(_ClientStats):
    """Statistics shared through the server in a setup exchange before round 1."""

    needs_setup = True

    @classmethod
    def check(cls, params: Any, algorithm: str, others: list[str]) -> None:
        require_federation(cls.name, algorithm, "shares statistics between clients", "use 'norm'")
        cls._one_normalizer(others)

    #: who receives a site's statistics (FedRDN: every client, as sent)
    audience = To.CLIENTS

    def server_vars(self) -> list[StateVar]:
        return [
            server_var("clients", ABSENT, doc="the sites, in the setup exchange's order"),
            server_var("mean", ABSENT, doc="every site's per-channel mean (setup)"),
            server_var("std", ABSENT, doc="every site's per-channel std (setup)"),
        ]

    def client_vars(self) -> list[StateVar]:
        dp = [client_var("dp", ABSENT, doc="privacy.epsilon: the clipped statistics")]
        return [
            *super().client_vars(),
            *(dp if "fedrdn_stats" in self.privacy else []),
            *self.received_vars(),
        ]

    #: the setup broadcast: its record, the prefix of the client-state keys that keep its
    #: mean and std (``<prefix>_mean``, ``<prefix>_std``), and whose statistics they are
    received: ClassVar[tuple[str, str, str]]

    def received_vars(self) -> list[StateVar]:
        """What the client keeps of the setup broadcast (:attr:`received`)."""
        _, key, whose = self.received
        return [
            client_var(f"{key}_mean", ABSENT, doc=f"{whose} mean (setup)"),
            client_var(f"{key}_std", ABSENT, doc=f"{whose} std (setup)"),
        ]

    def receive(self, records: Payload, state: State, rnd: int) -> None:
        record, key, _ = self.received
        got = records.records.get(record)
        if got is not None:
            state[f"{key}_mean"], state[f"{key}_std"] = got["mean"], got["std"]

    def init_client(self, cid: str, data: ClientData, model: FedModel) -> State:
        """The client's Eq. 5-6 statistics and, under ``privacy.epsilon``, their
        per-image clipped form (what it releases, with noise, in :meth:`setup_reply`)."""
        state = super().init_client(cid, data, model)
        mech = self.privacy.get("fedrdn_stats")
        if mech is not None:
            mean, std = clipped_statistics(data.train.x, mech.clip)
            state["dp"] = {"mean": mean, "std": std, "n": int(data.train.x.shape[0])}
        return state

    def disclosures(self, model: FedModel) -> list[Disclosure]:
        return [
            Disclosure("fedrdn_stats", "up", Kind.STATISTIC, When.SETUP,
                       lambda s: 2 * s.input_shape[0] * 4,
                       "the site's per-channel mean and std (Eq. 5-6: per-image statistics "
                       "averaged over its training images)", to=self.audience, over=Over.SITE,
                       clip=stats_bound),
            self.bank_disclosure(),
        ]  # fmt: skip

    def bank_disclosure(self) -> Disclosure:
        raise NotImplementedError

    def setup_reply(self, cid: str, state: State) -> Records:
        """The client's statistics; under ``privacy.epsilon`` the clipped mean over its n
        images plus the Gaussian mechanism's noise (weights 1/n), the std clamped to
        :data:`NOISY_STD_FLOOR` (post-processing)."""
        mech = self.privacy.get("fedrdn_stats")
        if mech is None:
            return {"fedrdn_stats": {"mean": state["mean"], "std": state["std"]}}
        dp = state["dp"]
        out = mech.release({"mean": dp["mean"], "std": dp["std"]}, 1.0 / dp["n"], 0, cid)
        return {"fedrdn_stats": {
            "mean": out["mean"].float(), "std": out["std"].clamp_min(NOISY_STD_FLOOR).float(),
        }}  # fmt: skip

    def setup_aggregate(self, server: State, replies: list[tuple[str, Records]]) -> None:
        server["clients"] = [cid for cid, _ in replies]
        server["mean"] = torch.stack([r["fedrdn_stats"]["mean"] for _, r in replies])
        server["std"] = torch.stack([r["fedrdn_stats"]["std"] for _, r in replies])


class FedRDN(_Federated):
    """Random normalisation with a random client's statistics during training."""

    name = "fedrdn"
    Params = FedRDNParams
    received = ("fedrdn_bank", "bank", "every site's")

    def bank_disclosure(self) -> Disclosure:
        return Disclosure(
            "fedrdn_bank", "down", Kind.STATISTIC, When.SETUP,
            lambda s: s.num_sites * 2 * s.input_shape[0] * 4,
            "every site's mean and std", carries=("fedrdn_stats",),
        )  # fmt: skip

    def setup_broadcast(self, server: State, cid: str) -> Records:
        return {"fedrdn_bank": {"mean": server["mean"], "std": server["std"]}}

    def train_batch(self, x, y, state, generator):
        """Eq. 7: x_hat = (x - mu_j) / sigma_j with j drawn uniformly from the K clients."""
        bank_mean, bank_std = state["bank_mean"], state["bank_std"]
        k = bank_mean.shape[0]
        if self.params.draw == "paper":
            j = torch.randint(k, (x.shape[0],), generator=generator).to(bank_mean.device)
            mean, std = bank_mean[j], bank_std[j]
        else:
            i = torch.randint(k, (1,), generator=generator)
            j = torch.randint(k, (1,), generator=generator)
            mean, std = bank_mean[i[0]], bank_std[j[0]]
        return _normalize(x, mean.to(x.device), std.to(x.device)), y


class FedRDNV(_Federated):
    """FedRDN-V: the federation's averaged statistics for training and test (Eq. 9)."""

    name = "fedrdn_v"

    audience = To.AGGREGATE
    received = ("fedrdn_avg", "avg", "the sites' averaged")

    def bank_disclosure(self) -> Disclosure:
        return Disclosure(
            "fedrdn_avg", "down", Kind.STATISTIC, When.SETUP,
            lambda s: 2 * s.input_shape[0] * 4,
            "the sites' mean and std averaged", carries=("fedrdn_stats",),
        )  # fmt: skip

    def setup_broadcast(self, server: State, cid: str) -> Records:
        return {"fedrdn_avg": {"mean": server["mean"].mean(0), "std": server["std"].mean(0)}}

    def train_batch(self, x, y, state, generator):
        return _normalize(x, state["avg_mean"].to(x.device), state["avg_std"].to(x.device)), y

    def eval_batch(self, x: torch.Tensor, state: State) -> torch.Tensor:
        return _normalize(x, state["avg_mean"].to(x.device), state["avg_std"].to(x.device))

    def eval_module(self, state: State) -> torch.nn.Module | None:
        return Standardize(state["avg_mean"], state["avg_std"])

    def site_state(self, server: State, images: torch.Tensor | None) -> State | None:
        """Every site, a new one too, normalises with the federation's averages (Eq. 9)."""
        return {"avg_mean": server["mean"].mean(0), "avg_std": server["std"].mean(0)}
