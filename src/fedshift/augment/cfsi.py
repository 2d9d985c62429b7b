"""Continuous frequency space interpolation (CFSI) with a distribution bank, the data half of
FedDG-ELCFS (Liu, Chen, Qin, Dou & Heng, "FedDG: Federated Domain Generalization on Medical
Image Segmentation via Episodic Learning in Continuous Frequency Space", CVPR 2021, Sec. 3.2;
arXiv 2103.06030). The paper's body text was not obtainable offline: equation numbers are
unverified and the facts below come from the abstract and the released code
(liuquande/FedDG-ELCFS: ``dataset/prepare_dataset.py``, ``dataloaders/fundus_dataloader.py``
``low_freq_mutate_np`` / ``source_to_target_freq``, ``freq_space_interpolation_demo.py``).

* Distribution bank (setup exchange, once before round 1): each training client k computes the
  amplitude spectrum A = |F(x)| (per channel 2-D FFT, :func:`fedshift.augment.ampnorm.
  amplitude_phase`) of its raw training images and uploads them (record ``cfsi_amplitudes``:
  n_k x C x H x W float32, n_k * C * H * W * 4 bytes); the server sends each client the other
  clients' spectra (record ``cfsi_bank``: sum over the other clients of their bytes; a
  held-out client, which never trains, receives nothing). Amplitude
  spectra, not images, leave a client (the phase, which carries the anatomy, stays local).
  ``bank_fraction`` keeps that fraction of a client's images (at least one, a seeded draw per
  client): 1 (default: every image); the released loader samples 1/8 of each client's files.
* Interpolation (per training image x of client k): a source client n != k drawn uniformly,
  one of its amplitudes A_n drawn uniformly, lambda ~ U(``lam_min``, ``lam_max``) (continuous;
  default U(0, 1)); inside a centred low-frequency square window M (half-size
  b = floor(min(H, W) * ``alpha``), side 2b + 1, in the fftshift-ed spectrum, as the released
  code computes it)
      A' = (1 - lambda) A_k(x) + lambda A_n   on M,    A' = A_k(x)   outside M,
  and the image is rebuilt with its own phase, x' = Re F^-1(A' exp(j P(x))), clipped to the
  raw range [0, 1] (the released loader clips to [0, 255]).
  ``alpha`` default 0.003: the value of the authors' interpolation demo
  (``freq_space_interpolation_demo.py``); the paper's value is unverified. The released
  training loader differs: ``alpha = 0`` (the 1 x 1 window = the DC coefficient only) and a full
  swap (lambda = 1, the interpolation line commented out), i.e. ``{alpha: 0, lam_min: 1,
  lam_max: 1, bank_fraction: 0.125}``. It also draws two transformed images per sample but
  trains on the first only; here one is drawn.

Batch layout: ``train_batch`` returns the raw batch followed by its transformed copy,
``(2N, C, H, W)`` with the labels repeated (the released loader stacks them along channels
instead). The ``elcfs`` algorithm splits the two halves for its episodic step; any other
algorithm trains on both (CFSI as plain data augmentation). List ``cfsi`` last among the
augments. Evaluation images are unchanged (the method has no test-time step), so a held-out
client (``federation.holdout``) is evaluated as is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from fedshift.algorithms.state import ABSENT, StateInit, StateVar, client_var, server_var
from fedshift.augment.ampnorm import amplitude_phase, from_amplitude_phase
from fedshift.augment.base import Augment, Records, State, require_federation
from fedshift.core.bounds import bounded
from fedshift.core.disclosure import Disclosure, Kind, Over, To, When
from fedshift.core.errors import ConfigError
from fedshift.core.payload import Payload
from fedshift.core.seeding import generator as derived_generator
from fedshift.models.base import FedModel

UP = "cfsi_amplitudes"
DOWN = "cfsi_bank"


@dataclass
class CFSIParams:
    # window ratio: half-size b = floor(min(H, W) * alpha) around the centre (demo: 0.003;
    # released training loader: 0, the DC coefficient only)
    alpha: float = bounded(0.003, ge=0, le=0.5)
    # lambda ~ U(lam_min, lam_max) per image (paper: continuous in [0, 1]; released: 1 = swap)
    lam_min: float = bounded(0.0, ge=0, le=1)
    lam_max: float = bounded(1.0, ge=0, le=1)
    # share of a client's training images whose spectra enter the bank (released: 0.125)
    bank_fraction: float = bounded(1.0, gt=0, le=1)


def window_half_size(h: int, w: int, alpha: float) -> int:
    """b = floor(min(H, W) * alpha): the window spans frequencies -b..b on both axes."""
    return math.floor(min(h, w) * alpha)


def low_freq_window(
    h: int, w: int, alpha: float, device: torch.device | str | None = None
) -> torch.Tensor:
    """The binary low-frequency window M in the FFT's own (unshifted) layout, float64 (H, W)
    on ``device`` (default: torch's default device): the centred (2b + 1)-square of the
    fftshift-ed spectrum moved back by ifftshift."""
    b = window_half_size(h, w, alpha)
    shifted = torch.zeros(h, w, dtype=torch.float64, device=device)
    ch, cw = h // 2, w // 2
    shifted[max(ch - b, 0) : ch + b + 1, max(cw - b, 0) : cw + b + 1] = 1.0
    return torch.fft.ifftshift(shifted)


def interpolate(
    x: torch.Tensor, other_amplitude: torch.Tensor, lam: torch.Tensor, window: torch.Tensor
) -> torch.Tensor:
    """CFSI: images (N, C, H, W) rebuilt from A' = A + lam * M * (A_other - A) (i.e.
    (1 - lam) A + lam A_other inside M, A outside) and their own phase. ``other_amplitude``
    (N, C, H, W) or (C, H, W); ``lam`` (N,) or a scalar; no clipping."""
    amp, phase = amplitude_phase(x)
    other = other_amplitude.to(device=x.device, dtype=torch.float64)
    lam = torch.as_tensor(lam, dtype=torch.float64, device=x.device).reshape(-1, 1, 1, 1)
    m = window.to(device=x.device, dtype=torch.float64)
    return from_amplitude_phase(amp + lam * m * (other - amp), phase, x.dtype)


class CFSI(Augment):
    """FedDG-ELCFS's distribution bank and continuous frequency space interpolation."""

    name = "cfsi"
    Params = CFSIParams
    needs_setup = True

    @classmethod
    def check(cls, params: Any, algorithm: str, others: list[str]) -> None:
        require_federation("cfsi", algorithm, "exchanges amplitude spectra through the server")
        if params.lam_min > params.lam_max:
            raise ConfigError(
                f"config keys 'augment.cfsi.lam_min' ({params.lam_min}) and 'lam_max' "
                f"({params.lam_max}): lam_min must not exceed lam_max"
            )

    # -- state -------------------------------------------------------------------------------
    def server_vars(self) -> list[StateVar]:
        return [server_var("bank", ABSENT, doc="every site's amplitudes (the setup exchange)")]

    def client_vars(self) -> list[StateVar]:
        return [
            client_var("own", self._own_amplitudes, doc="the client's own amplitude bank"),
            client_var("bank", {}, doc="the other sites' amplitudes (the setup exchange)"),
        ]

    def _own_amplitudes(self, at: StateInit) -> torch.Tensor:
        assert at.data is not None and at.cid is not None  # client state
        cid, data = at.cid, at.data
        x = data.train.x
        n = x.shape[0]
        keep = max(1, round(self.params.bank_fraction * n)) if n else 0
        if keep < n:
            g = derived_generator(self.seed, "cfsi", cid)
            perm = torch.randperm(n, generator=g).to(x.device)  # CPU draw: same on any device
            x = x[perm[:keep].sort().values]
        amps = [amplitude_phase(x[s : s + 256].float())[0].float() for s in range(0, keep, 256)]
        return torch.cat(amps).cpu() if amps else torch.zeros(0, *x.shape[1:])

    # -- setup exchange ----------------------------------------------------------------------
    def disclosures(self, model: FedModel) -> list[Disclosure]:
        def kept(n: int) -> int:
            return max(1, round(self.params.bank_fraction * n)) if n else 0

        return [
            Disclosure(UP, "up", Kind.EXAMPLES, When.SETUP,
                       lambda s: kept(s.examples) * s.image_floats * 4,
                       "the amplitude spectrum of each of the site's kept training images "
                       "(bank_fraction)", to=To.CLIENTS, over=Over.EXAMPLE,
                       unprotectable="each value is one image's spectrum (one example): noise "
                       "large enough to hide an image leaves nothing of its spectrum"),
            Disclosure(DOWN, "down", Kind.EXAMPLES, When.SETUP,
                       lambda s: (sum(kept(n) for n in s.federation) - kept(s.examples))
                       * s.image_floats * 4,
                       "every other site's per-image amplitude spectra", carries=(UP,)),
        ]  # fmt: skip

    def setup_reply(self, cid: str, state: State) -> Records:
        return {UP: {"amplitude": state["own"]}}

    def setup_aggregate(self, server: State, replies: list[tuple[str, Records]]) -> None:
        server["bank"] = {cid: r[UP]["amplitude"] for cid, r in replies if UP in r}

    def setup_broadcast(self, server: State, cid: str) -> Records:
        """The other training clients' spectra, to each training client; nothing to a client
        that sent none (a ``federation.holdout`` site never trains, so it needs no bank)."""
        bank = server.get("bank", {})
        if cid not in bank:
            return {}
        return {DOWN: {k: v for k, v in sorted(bank.items()) if k != cid}}

    def receive(self, records: Payload, state: State, rnd: int) -> None:
        if DOWN in records.records:
            state["bank"] = {k: v.clone() for k, v in records[DOWN].items() if v.shape[0]}

    # -- data path ---------------------------------------------------------------------------
    def train_batch(
        self, x: torch.Tensor, y: torch.Tensor, state: State, generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        bank = [state["bank"][k] for k in sorted(state["bank"])]
        if not bank:
            raise ConfigError(
                "augment 'cfsi': this client holds no other client's amplitude spectra (the "
                "setup exchange did not run, or it is the only training client); CFSI needs "
                "at least two training clients"
            )
        n = x.shape[0]
        src = torch.randint(len(bank), (n,), generator=generator).tolist()
        pick = [int(torch.randint(bank[s].shape[0], (1,), generator=generator)) for s in src]
        other = torch.stack([bank[s][j] for s, j in zip(src, pick, strict=True)])
        p = self.params
        lam = p.lam_min + (p.lam_max - p.lam_min) * torch.rand(n, generator=generator).to(x.device)
        window = low_freq_window(x.shape[-2], x.shape[-1], p.alpha, device=x.device)
        x_freq = interpolate(x, other, lam, window).clamp(0.0, 1.0)
        return torch.cat((x, x_freq)), torch.cat((y, y))
