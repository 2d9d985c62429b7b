"""Amplitude normalisation (HarmoFL: Jiang, Wang & Dou, "HarmoFL: Harmonizing Local and Global
Drifts in Federated Learning on Heterogeneous Medical Images", AAAI 2022, Sec. 3.2, Eq. 2-4,
Alg. 1 lines 7-9 and 17), as an input-level augment usable with any algorithm
(``augment: [ampnorm]``).

Images are raw, in [0, 1]; the run's ``input.mean/std`` normalisation is applied after this
augment by the pipeline.

* Eq. 2: each channel of an image x is transformed with the 2-D FFT,
  F(x) = A(x) exp(j P(x)), amplitude A = |F(x)| and phase P = angle(F(x)).
* Eq. 3 (Alg. 1 lines 7-8): during its first round of local training a client keeps a running
  mean amplitude over its mini-batches, A_k = (1 - v) A_{k-1} + v * mean_b A(x_b), decay
  v = 0.1 (``decay``; Sec. 4.1 "decay factor v to 0.1"). Start value (``init``):

  - ``"zero"`` (default with ``amplitude=paper``): A_0 = 0, as the text under Eq. 3 states.
    After K batches A_K = sum_k v (1 - v)^(K-k) a_k, whose weights sum to 1 - (1 - v)^K, so
    the amplitude is that fraction of a mean amplitude: the first batch of round 1 is rebuilt
    at 10 % of its amplitude, and the uploaded A_K is shrunk by (1 - v)^K. For the shipped
    suites: digits (750 training images, batch 32, K = 24) 8 %; brain-mri (32 slices per
    site, batch 16, K = 2) 81 %; prostate truncated to HK's 100 training slices (batch 16,
    K = 7) 48 %; Camelyon17 (5,000 patches, batch 128, K = 40) 1.5 %. Eq. 4 is linear in
    the amplitude, so the shrink is one intensity factor c = 1 - (1 - v)^K, the same for
    every client after round 1 (equal K) and for evaluation; the input normalisation turns
    it into an affine change of the input that a BatchNorm after the first convolution
    (every model of the suites, ``model.bn=harmofl`` included) removes with its batch
    statistics. It is the default because it is the paper's stated rule. It costs nothing
    where BN normalises with batch statistics at evaluation too (``model.bn=harmofl``, the
    released models) or where K is large; a BN that tracks running statistics evaluates
    with estimates that started at (0, 1) and reach the shrunk inputs' statistics only after
    many steps, and the smaller c, the longer the global model scores near chance: digits
    at 80 clients (~37 images a client, K = 2, c = 0.19) stays at chance to round 12 with
    ``"zero"`` and leaves it at round 4 with ``"first"`` (the round-8 model scores 0-8 % with
    its running statistics, 42-77 % with batch statistics, on the same validation images).
    A client whose c is under 0.5 with such a model logs a warning after round 1
    (:func:`shrink_warning`). For a model without BN, tracked BN statistics with few
    round-1 batches, or clients with very different K, use ``"first"``.
  - ``"first"``: A_1 = the first batch's mean amplitude (released code), so no shrink.
  - ``"auto"``: ``zero`` for ``amplitude=paper``, ``first`` for ``amplitude=released``
    (whose v is 0: a zero start would stay zero).

  After round 1 the client sends A_k up once (record ``amplitude``: C x H x W float32,
  C*H*W*4 bytes) and the server fixes the global amplitude A = 1/N sum_i A_i,K (Alg. 1 line
  17: uniform 1/N over the clients that replied in round 1; the released code's
  ``client_weights`` are uniform too). Sec. 3.2 ("only communication at the first round and
  fix the global amplitude"): it never changes again and is sent down once to each client
  (record ``global_amplitude``, C*H*W*4 bytes, in the client's first broadcast after round
  1), which keeps it in its augment state.
* Eq. 4 (Alg. 1 line 9): the normalised image is rebuilt from the global amplitude and its own
  phase, x_hat = Re F^-1(A exp(j P(x))).

Round 1 (before a global amplitude exists): each batch first updates the client's running
amplitude (Eq. 3) and is then rebuilt with that running amplitude (Eq. 4 with A_i,k, Alg. 1
line 9).

Evaluation rule: a client's validation and test images are rebuilt with the global amplitude
it holds. A client holds it from its first broadcast after round 1 on, so the evaluation
right after round 1 uses the client's own running amplitude (the released code evaluates that
round on the server model, which already holds the average). A client that never trains
(``federation.holdout``: a new site) has no amplitude of its own: as the paper's global
amplitude is meant for any client, it receives the global amplitude before each evaluation
(:meth:`AmpNorm.eval_broadcast`) and its images are rebuilt with it. Before round 1 ends no
amplitude exists and images are evaluated unchanged. (A training client never sampled since
round 1 under ``federation.sample_fraction < 1`` still sees its images unchanged.)

``amplitude`` selects the variant:

* ``"paper"`` (default): the whole amplitude spectrum is replaced and A_k is the decayed
  running mean above.
* ``"released"``: the released code (med-air/HarmoFL). Its spectral window has half-width
  ``floor(min(H, W) * 0) = 0``, so only the DC coefficient F[0, 0] is replaced (for images
  in [0, 1] this moves each channel's mean to the global one and keeps everything else), and
  its momentum is declared ``int`` in Cython (0.1 -> 0), so A_k stays the first batch's mean.

The transforms run in float64; the amplitudes are stored and sent as float32.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Literal

import torch

from fedshift.algorithms.state import StateVar, client_var, server_var
from fedshift.augment.base import Augment, Records, State, require_federation
from fedshift.core.bounds import bounded
from fedshift.core.disclosure import Disclosure, Kind, Over, To, When, sums_only
from fedshift.core.errors import ConfigError
from fedshift.core.payload import Payload
from fedshift.core.privacy import clip_rows
from fedshift.models.base import FedModel, tracking_bn

log = logging.getLogger(__name__)

UP = "amplitude"
DOWN = "global_amplitude"


@dataclass
class AmpNormParams:
    # "paper": whole amplitude spectrum, decayed running mean (Eq. 3-4);
    # "released": released code: only the DC coefficient, amplitude of the first batch.
    amplitude: Literal["paper", "released"] = "paper"
    # v of Eq. 3 (weight of the newest batch); "released" behaves as v = 0.
    decay: float = bounded(0.1, gt=0, le=1)
    # start of Eq. 3's running mean: "zero" (paper text under Eq. 3), "first" (the first
    # batch's mean: released code), "auto" (zero for paper, first for released)
    init: Literal["auto", "zero", "first"] = "auto"


def amplitude_phase(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. 2: amplitude and phase of the per-channel 2-D FFT of (..., H, W) images (float64)."""
    f = torch.fft.fft2(x.double())
    return f.abs(), f.angle()


def from_amplitude_phase(
    amplitude: torch.Tensor, phase: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """Inverse of :func:`amplitude_phase`: Re F^-1(A exp(j P)) (Eq. 4's rebuild), as ``dtype``."""
    return torch.fft.ifft2(torch.polar(amplitude, phase)).real.to(dtype)


def batch_amplitude(x: torch.Tensor) -> torch.Tensor:
    """Mean amplitude spectrum of a batch (N, C, H, W) -> (C, H, W) float32."""
    return amplitude_phase(x)[0].mean(0).float()


def clipped_batch_amplitude(x: torch.Tensor, bound: float) -> torch.Tensor:
    """:func:`batch_amplitude` with each image's amplitude spectrum (C x H x W values)
    clipped to L2 norm ``bound`` before the mean (``privacy.epsilon``)."""
    amp = amplitude_phase(x)[0]
    return clip_rows(amp.flatten(1), bound).view_as(amp).mean(0).float()


def amplitude_bound(shape: tuple[int, int, int]) -> float:
    """The largest L2 norm of one image's amplitude spectrum for images in [0, 1]:
    sqrt(H W) ||x|| <= H W sqrt(C) (Parseval, unnormalised FFT): the default clip of
    ``amplitude``, which clips no valid image."""
    c, h, w = shape
    return float(h * w * c**0.5)


def running_weights(decay: float, init: str, batches: int) -> list[float]:
    """The weight of batch k = 1..K's mean amplitude in Eq. 3's running mean after K
    batches: v (1 - v)^(K - k), the first batch's (1 - v)^(K - 1) with ``init="first"``."""
    out = [decay * (1.0 - decay) ** (batches - k) for k in range(1, batches + 1)]
    if init == "first" and batches:
        out[0] = (1.0 - decay) ** (batches - 1)
    return out


def max_example_weight(sizes: list[int], weights: list[float], n: int) -> float:
    """The largest total weight one of ``n`` examples can have in ``sum_k weights[k]
    mean(batch k)``, batches of ``sizes`` drawn epoch by epoch (each example at most once an
    epoch; an epoch's batches cover n, or n - 1 when a trailing batch of one is skipped:
    :meth:`fedshift.core.context.ClientContext.batches`): the sum over epochs of the
    epoch's largest ``weight / size``."""
    total, best, seen = 0.0, 0.0, 0
    for size, w in zip(sizes, weights, strict=True):
        if seen + size > n:  # the next epoch starts
            total, best, seen = total + best, 0.0, 0
        best, seen = max(best, w / size), seen + size
    return total + best


def update_running(
    running: torch.Tensor | None, batch_amp: torch.Tensor, decay: float, init: str = "zero"
) -> torch.Tensor:
    """Eq. 3: (1 - v) * running + v * batch amplitude. For the first batch (``running`` None)
    the previous term is zero (``init="zero"``, paper) or the batch itself (``"first"``)."""
    if running is None:
        if init == "first":
            return batch_amp.clone()
        return decay * batch_amp
    return (1.0 - decay) * running + decay * batch_amp


#: below this factor c = 1 - (1 - v)^K of the mean amplitude a zero start warns (K < 7 at v = 0.1)
SHRINK_WARN = 0.5


def tracks_bn_statistics(model: torch.nn.Module) -> bool:
    """Whether any BatchNorm layer of ``model`` evaluates with running statistics."""
    return bool(tracking_bn(model))


def shrink_warning(cid: str, batches: int, decay: float) -> str | None:
    """The warning for a zero start of Eq. 3 that left the client's amplitude at
    c = 1 - (1 - v)^K < :data:`SHRINK_WARN` of a mean amplitude (K = ``batches``), for a
    model whose BN tracks running statistics (module docstring); ``None`` if c is larger."""
    c = 1.0 - (1.0 - decay) ** batches
    if c >= SHRINK_WARN:
        return None
    return (
        f"ampnorm: client {cid} ran {batches} batch(es) in round 1, so the zero start of "
        f"Eq. 3 (the paper's) rebuilds every image at {100 * c:.0f} % of a mean amplitude; "
        "the model's BatchNorm running statistics reach such inputs only after many steps, "
        "and until then the global model evaluates near chance (digits at 80 clients: to "
        "round 12). The released code's start avoids it: "
        "augment: [{name: ampnorm, init: first}] (`fedshift docs parts/harmofl-methods`)"
    )


def rebuild(x: torch.Tensor, amplitude: torch.Tensor, dc_only: bool = False) -> torch.Tensor:
    """Eq. 4: images (N, C, H, W) rebuilt from ``amplitude`` (C, H, W) and their own phase.

    ``dc_only`` replaces the amplitude of the DC coefficient F[0, 0] only (released code)."""
    amp, phase = amplitude_phase(x)
    target = amplitude.to(device=x.device, dtype=torch.float64)
    if dc_only:
        amp = amp.clone()
        amp[..., 0, 0] = target[..., 0, 0]
    else:
        amp = target.expand_as(amp)
    return from_amplitude_phase(amp, phase, x.dtype)


class AmplitudeRebuild(torch.nn.Module):
    """Eq. 4 with a fixed amplitude held as a buffer: ``eval_batch`` of one client in a form
    ``torch.export`` captures (the export's predictor, :mod:`fedshift.runtime.predictor`)."""

    def __init__(self, amplitude: torch.Tensor, dc_only: bool) -> None:
        super().__init__()
        self.register_buffer("amplitude", amplitude.detach().float().cpu().clone())
        self.dc_only = dc_only

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rebuild(x, self.amplitude, self.dc_only)


class AmpNorm(Augment):
    """HarmoFL's amplitude normalisation: every client's images get one global amplitude."""

    name = "ampnorm"
    Params = AmpNormParams
    #: the zero-start warning was logged (once per run and process)
    _warned = False

    @classmethod
    def check(cls, params: Any, algorithm: str, others: list[str]) -> None:
        require_federation("ampnorm", algorithm, "averages amplitudes over the clients")
        if params.amplitude == "released" and params.init == "zero":
            raise ConfigError(
                "config key 'augment.ampnorm.init': 'zero' with amplitude='released' keeps the "
                "amplitude at zero (the released running mean has v = 0); use init='first' "
                "or 'auto'"
            )

    @property
    def _decay(self) -> float:
        return 0.0 if self.params.amplitude == "released" else self.params.decay

    @property
    def _init(self) -> str:
        if self.params.init == "auto":
            return "first" if self.params.amplitude == "released" else "zero"
        return self.params.init

    @property
    def _dc_only(self) -> bool:
        return self.params.amplitude == "released"

    # -- state -------------------------------------------------------------------------------
    def server_vars(self) -> list[StateVar]:
        return [
            server_var("amplitude", None, doc="the global amplitude A (the sites' mean, once)"),
            server_var("sent", [], doc="the clients A was sent to"),
        ]

    def client_vars(self) -> list[StateVar]:
        out = [
            client_var("running", None, doc="the client's own amplitude A_k (Eq. 3)"),
            client_var("batches", 0, doc="the batches in A_k"),
            client_var("uploaded", False, doc="A_k was sent"),
            client_var("global", None, doc="the server's A once received"),
            client_var("cid", lambda at: at.cid, doc="the client's id"),
        ]
        if UP in self.privacy:  # privacy.epsilon: the batch sizes bound an image's weight
            out += [
                client_var("sizes", [], doc="privacy.epsilon: the batch sizes in A_k"),
                client_var("n", lambda at: int(at.data.train.x.shape[0]),
                           doc="privacy.epsilon: the client's training images"),
            ]  # fmt: skip
        return out

    def protected(self, augments: list[Augment]) -> None:
        """Under ``privacy.epsilon`` the per-example bound needs the site's own images: an
        augment before this one could mix them (one image in two batch rows)."""
        before = augments[: augments.index(self)]
        if before:
            raise ConfigError(
                f"config key 'privacy.epsilon': augment 'ampnorm' protects its amplitude per "
                f"image, but {[a.name for a in before]} change(s) the images before it; list "
                "'ampnorm' first in 'augment'"
            )

    # -- exchange ----------------------------------------------------------------------------
    def disclosures(self, model: FedModel) -> list[Disclosure]:
        size = lambda s: s.image_floats * 4  # noqa: E731
        return [
            Disclosure(UP, "up", Kind.STATISTIC, When.ONCE, size,
                       "the site's running mean amplitude spectrum (Eq. 3) over its first "
                       "round's batches", to=To.AGGREGATE, over=Over.BATCH,
                       clip=amplitude_bound),
            Disclosure(DOWN, "down", Kind.STATISTIC, When.ONCE, size,
                       "the sites' mean amplitude spectrum", carries=(UP,),
                       maybe="once the server holds it (the round after the first upload)"),
        ]  # fmt: skip

    def broadcast(self, server: State, rnd: int, cid: str) -> Records:
        """The fixed global amplitude, once to each client (it keeps it)."""
        if server["amplitude"] is None or cid in server["sent"]:
            return {}
        server["sent"].append(cid)
        return {DOWN: {"amplitude": server["amplitude"]}}

    def eval_broadcast(self, server: State, cid: str) -> Records:
        """For a client that never trains (``federation.holdout``): the global amplitude, so
        that its evaluation images are normalised like every other client's (Sec. 3.2)."""
        if server["amplitude"] is None:
            return {}
        return {DOWN: {"amplitude": server["amplitude"]}}

    def receive(self, records: Payload, state: State, rnd: int) -> None:
        rec = records.records.get(DOWN)
        if rec is not None:
            state["global"] = rec["amplitude"].detach().clone()

    def reply(self, model: FedModel, state: State, rnd: int) -> Records:
        """The client's running amplitude, once, after the round it was accumulated in."""
        if state["running"] is None or state["uploaded"]:
            return {}
        state["uploaded"] = True
        mech = self.privacy.get(UP)
        if mech is not None:  # privacy.epsilon: Eq. 3 over clipped spectra, plus noise
            w = max_example_weight(
                state["sizes"], running_weights(self._decay, self._init, state["batches"]),
                state["n"],
            )  # fmt: skip
            out = mech.release({"amplitude": state["running"]}, w, rnd, state["cid"])
            return {UP: {"amplitude": out["amplitude"].clamp_min(0.0)}}  # post-processing
        if self._init == "zero" and not self._warned:
            msg = shrink_warning(state.get("cid", "?"), state["batches"], self._decay)
            if msg and model is not None and tracks_bn_statistics(model):
                self._warned = True  # once per run and process, not once per client
                log.warning(msg)
        return {UP: {"amplitude": state["running"]}}

    @sums_only(UP, weight="uniform")  # their plain mean only: secure aggregation can hide each
    def aggregate(self, server: State, rnd: int, replies: list[tuple[str, Payload]]) -> None:
        """The global amplitude: the uniform mean of the first amplitudes received; then fixed."""
        if server["amplitude"] is not None:
            return
        amps = [p.records[UP]["amplitude"] for _, p in replies if UP in p.records]
        if amps:
            server["amplitude"] = torch.stack([a.float() for a in amps]).mean(0)

    # -- data path ---------------------------------------------------------------------------
    def train_batch(
        self, x: torch.Tensor, y: torch.Tensor, state: State, generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if state["global"] is None:
            # first round: accumulate A_k (Eq. 3), then rebuild with it
            mech = self.privacy.get(UP)
            amp = batch_amplitude(x) if mech is None else clipped_batch_amplitude(x, mech.clip)
            if mech is not None:
                state["sizes"].append(x.shape[0])
            state["running"] = update_running(state["running"], amp, self._decay, self._init)
            state["batches"] += 1
            return rebuild(x, state["running"], self._dc_only), y
        return rebuild(x, state["global"], self._dc_only), y

    def eval_batch(self, x: torch.Tensor, state: State) -> torch.Tensor:
        """Eq. 4 with the global amplitude once held; before that the client's own running
        amplitude; else unchanged (no amplitude exists yet)."""
        amp = state["global"] if state["global"] is not None else state["running"]
        return x if amp is None else rebuild(x, amp, self._dc_only)

    def eval_module(self, state: State) -> torch.nn.Module | None:
        """:meth:`eval_batch`'s choice of amplitude for this client, fixed."""
        amp = state["global"] if state["global"] is not None else state["running"]
        return torch.nn.Identity() if amp is None else AmplitudeRebuild(amp, self._dc_only)

    def site_state(self, server: State, images: torch.Tensor | None) -> State | None:
        """A new site gets the global amplitude (as a held-out client: ``eval_broadcast``)."""
        return {"global": server["amplitude"], "running": None}
