"""How the sites of a federation differ: one shift score per axis a method family addresses.

``fedshift data check`` measures four axes; each is what one family of methods normalises,
augments or personalises:

* ``intensity``: per-channel intensity mean and standard deviation of each image (FedRDN
  normalises the input with federation statistics of exactly these);
* ``amplitude``: the shape of each image's amplitude spectrum, HarmoFL's Eq. 2 quantity
  A(x) = |F(x)| per channel (:func:`fedshift.augment.ampnorm.amplitude_phase`), averaged over
  rings of equal spatial frequency; the DC coefficient is left out and the ring profile is
  scaled to unit sum before its logarithm is taken, so brightness and contrast (the intensity
  axis) do not move it while blur, noise, resolution and texture do (HarmoFL's amplitude
  normalisation);
* ``features``: per-channel mean and standard deviation of the feature maps a fixed model
  (seeded random initialisation, or given weights) computes at each of its stages, the
  statistics FedFA augments and FedBN keeps local (also MixStyle, MoEx);
* ``labels``: each image's label as a one-hot vector, or for segmentation its per-class pixel
  fractions (the label mix DisTrans's DH, Eq. 3-4, and label-skew methods such as FedProx
  and SCAFFOLD address). DH itself is :func:`fedshift.data.partition.degree_of_heterogeneity`.

**The score.** Every axis turns each image into a descriptor vector d(x) (above). For each
dimension j, with K sites weighted equally, the site means m_kj and within-site variances
v_kj give the between-site variance B_j = mean_k (m_kj - mean_k m_kj)^2 and the within-site
variance W_j = mean_k v_kj. The axis's score is the mean over dimensions of

    eta^2_j = B_j / (B_j + W_j)

the share of that statistic's variance (over the equal-weight mixture of the sites) that is
explained by which site an image comes from: 0 when every site has the same distribution of
the statistic, 1 when the sites do not overlap at all. Being a share of variance, it has no
unit and the same meaning on every axis, which is what makes the axes comparable.
``features`` averages the per-layer scores over the model's stages. Dimensions with no
variance at all (a constant statistic) are left out. In the numerator, B_j is first reduced
by (K - 1) / K^2 sum_k v_kj / n_k, what the site means of n_k images drawn from one
distribution spread by chance (floored at 0; sites dealt stratified by class vary less than
that, so the correction errs low), so that sites alike score about 0 at any sample size.

The same normalisation gives the site-level numbers: a site's distance to the federation is
sqrt(mean_j (m_kj - mean_k m_kj)^2 / (B_j + W_j)) (its mean square over the sites is the
score before the correction) and the distance between sites k and l is
sqrt(mean_j (m_kj - m_lj)^2 / (B_j + W_j)).

Everything streams: each site's images are read in batches (a seeded subsample of at most
``max_per_site``) into running sums of each descriptor (float64), never concatenated.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch

from fedshift.augment.ampnorm import amplitude_phase
from fedshift.core.errors import ConfigError, DataError
from fedshift.core.federation import SPLITS, Federation, Split
from fedshift.core.images import ByteImages
from fedshift.core.seeding import generator
from fedshift.data.partition import degree_of_heterogeneity, tv_heterogeneity
from fedshift.models.base import FedModel

#: the axes, in report order
AXES = ("intensity", "amplitude", "features", "labels")
#: rings of the amplitude profile (fewer for images under 16 pixels a side)
RINGS = 8
#: numerical floor of a variance (descriptors are O(1): intensities, logs, fractions)
EPS = 1e-12
#: pixel values one batch holds at most (its float64 FFT then takes 16 bytes a value)
BATCH_PIXELS = 1 << 22

__all__ = [
    "AXES",
    "BATCH_PIXELS",
    "SPLIT_CHOICES",
    "AxisShift",
    "FeatureProbe",
    "Measurement",
    "Moments",
    "SiteData",
    "combine",
    "amplitude_profile",
    "federation_sites",
    "intensity_statistics",
    "label_descriptor",
    "measure",
    "ring_index",
    "separation",
    "spectral_centroid",
]


# --------------------------------------------------------------------------------------------
# streaming moments and the separation score
# --------------------------------------------------------------------------------------------


class Moments:
    """Running count, sum and sum of squares of (n, D) descriptor batches, in float64."""

    def __init__(self) -> None:
        self.n = 0
        self.sum: torch.Tensor | None = None
        self.sq: torch.Tensor | None = None

    def add(self, batch: torch.Tensor) -> None:
        """Add the rows of an (n, ...) batch, flattened to (n, D)."""
        b = batch.detach().to(torch.float64).reshape(batch.shape[0], -1)
        self.add_sums(b.shape[0], b.sum(0), (b * b).sum(0))

    def add_sums(self, n: int, total: torch.Tensor, squares: torch.Tensor) -> None:
        """Add ``n`` rows given only their per-dimension sum and sum of squares."""
        if self.sum is None or self.sq is None:
            self.sum = torch.zeros_like(total, dtype=torch.float64)
            self.sq = torch.zeros_like(squares, dtype=torch.float64)
        self.n += n
        self.sum += total.to(torch.float64)
        self.sq += squares.to(torch.float64)

    @property
    def mean(self) -> torch.Tensor:
        if self.sum is None or self.n == 0:
            raise ValueError("no descriptors were added")
        return self.sum / self.n

    @property
    def var(self) -> torch.Tensor:
        """Population variance per dimension (clamped at 0 against rounding)."""
        if self.sq is None:
            raise ValueError("no descriptors were added")
        return (self.sq / self.n - self.mean**2).clamp_min(0.0)


@dataclass
class AxisShift:
    """One axis measured over K sites (module docstring): the score, each site's distance to
    the federation, the K x K distances, and the per-dimension shares ``eta2``."""

    score: float
    to_federation: list[float]
    pairwise: list[list[float]]
    eta2: list[float] = field(default_factory=list)

    def order(self, sites: list[str]) -> list[str]:
        """The sites from the farthest from the federation to the nearest."""
        ranked = sorted(range(len(sites)), key=lambda k: -self.to_federation[k])
        return [sites[k] for k in ranked]


def separation(
    means: torch.Tensor, variances: torch.Tensor, counts: torch.Tensor | None = None
) -> AxisShift:
    """The score of one axis from K sites' per-dimension means and variances, both (K, D),
    and the number of images behind each site's numbers (module docstring: eta^2 = B / (B +
    W) per dimension, B corrected for sampling, averaged; distances in units of the total
    standard deviation). Without ``counts`` no sampling correction is made."""
    m = means.to(torch.float64)
    v = variances.to(torch.float64)
    k = m.shape[0]
    centre = m.mean(0)
    between = ((m - centre) ** 2).mean(0)
    total = between + v.mean(0)
    if counts is not None and k > 1:
        # E[B] over sites drawn from one distribution: (K - 1) / K^2 sum_k v_k / n_k
        n = counts.to(torch.float64).clamp_min(1.0)[:, None]
        noise = (k - 1) / k**2 * (v / n).sum(0)
        between = (between - noise).clamp_min(0.0)
    live = total > EPS * max(1.0, float(total.max()) if total.numel() else 1.0)
    if k < 2 or not bool(live.any()):
        zeros = [[0.0] * k for _ in range(k)]
        return AxisShift(0.0, [0.0] * k, zeros, [0.0] * int(m.shape[1]))
    eta2 = torch.where(live, between / total.clamp_min(EPS), torch.zeros_like(total))
    scaled = (m[:, live] - centre[live]) / total[live].sqrt()
    to_fed = scaled.pow(2).mean(1).sqrt()
    diff = scaled[:, None, :] - scaled[None, :, :]
    pair = diff.pow(2).mean(-1).sqrt()
    return AxisShift(
        score=float(eta2[live].mean()),
        to_federation=to_fed.tolist(),
        pairwise=pair.tolist(),
        eta2=eta2.tolist(),
    )


def combine(layers: list[AxisShift]) -> AxisShift:
    """Several layers' shifts as one: scores averaged, squared distances averaged."""
    if not layers:
        raise ValueError("no layers to combine")
    n = len(layers)
    to_fed = torch.tensor([a.to_federation for a in layers]).pow(2).mean(0).sqrt()
    pair = torch.tensor([a.pairwise for a in layers]).pow(2).mean(0).sqrt()
    return AxisShift(
        score=sum(a.score for a in layers) / n,
        to_federation=to_fed.tolist(),
        pairwise=pair.tolist(),
        eta2=[a.score for a in layers],
    )


# --------------------------------------------------------------------------------------------
# the descriptors
# --------------------------------------------------------------------------------------------


def intensity_statistics(x: torch.Tensor) -> torch.Tensor:
    """(N, C, H, W) images -> (N, 2C): each channel's mean, then each channel's std."""
    flat = x.to(torch.float64).flatten(2)
    return torch.cat([flat.mean(-1), flat.std(-1, correction=0)], dim=1)


def ring_index(height: int, width: int, rings: int = RINGS) -> tuple[torch.Tensor, int]:
    """Which frequency ring each coefficient of an (H, W) FFT falls in (-1: the DC term and
    the corners beyond the Nyquist radius), and the number of rings: equal-width rings of the
    radial frequency sqrt(f_u^2 + f_v^2) (cycles per pixel) over (0, 0.5]."""
    n = max(1, min(rings, min(height, width) // 2))
    fu = torch.fft.fftfreq(height, dtype=torch.float64)[:, None]
    fv = torch.fft.fftfreq(width, dtype=torch.float64)[None, :]
    radius = (fu**2 + fv**2).sqrt()
    idx = torch.ceil(radius / 0.5 * n).long() - 1
    idx[radius == 0] = -1
    idx[idx >= n] = -1
    return idx, n


def amplitude_profile(x: torch.Tensor, rings: tuple[torch.Tensor, int]) -> torch.Tensor:
    """(N, C, H, W) images -> (N, C * R): per channel, the log of the ring-averaged amplitude
    spectrum A(x) (HarmoFL Eq. 2) scaled to unit sum over the R rings (DC left out)."""
    idx, n_rings = rings
    amp, _ = amplitude_phase(x)  # (N, C, H, W) float64
    flat = amp.flatten(2)
    where = idx.flatten()
    keep = where >= 0
    sums = torch.zeros(*flat.shape[:2], n_rings, dtype=torch.float64)
    sums.index_add_(2, where[keep], flat[..., keep])
    count = torch.bincount(where[keep], minlength=n_rings).to(torch.float64)
    profile = sums / count
    profile = profile / profile.sum(-1, keepdim=True).clamp_min(EPS)
    return profile.clamp_min(EPS).log().flatten(1)


def label_descriptor(y: torch.Tensor, num_classes: int) -> torch.Tensor:
    """Labels -> (N, classes): one-hot for class labels (N,), per-class pixel fractions for
    label maps (N, H, W)."""
    if y.dim() == 1:
        return torch.nn.functional.one_hot(y.long(), num_classes).to(torch.float64)
    flat = y.long().flatten(1)
    n = flat.shape[0]
    offset = num_classes * torch.arange(n)[:, None]
    counts = torch.bincount((flat + offset).flatten(), minlength=n * num_classes)
    return counts.view(n, num_classes).to(torch.float64) / flat.shape[1]


class _Stop(Exception):
    """Raised by the last stage hook: nothing after it is needed."""


class FeatureProbe:
    """Per-image channel mean and std of each stage's output of a fixed ``model`` (eval mode:
    BatchNorm uses its running statistics, so one site's batch is never normalised by
    itself). ``normalize`` is the input pipeline's last step, applied first."""

    def __init__(
        self, model: FedModel, normalize: Callable[[torch.Tensor], torch.Tensor] | None = None
    ) -> None:
        self.model = model.eval()
        self.normalize = normalize
        self.layers = list(model.stage_names)
        if not self.layers:
            raise ConfigError(
                f"config key 'model.name': model {type(model).__name__} names no stages, so "
                "the features axis has nothing to measure; choose a model with stages "
                "(fedshift list)"
            )

    def __call__(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {}
        last = self.layers[-1]

        def hook(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
            def record(h: torch.Tensor) -> torch.Tensor:
                flat = h.detach().to(torch.float64).reshape(h.shape[0], h.shape[1], -1)
                std = flat.std(-1, correction=0) if flat.shape[-1] > 1 else flat[..., 0] * 0
                out[name] = torch.cat([flat.mean(-1), std], dim=1)
                if name == last:
                    raise _Stop
                return h

            return record

        saved = dict(self.model.stage_hooks)
        self.model.stage_hooks = {name: hook(name) for name in self.layers}
        try:
            with torch.no_grad():
                self.model.features(x if self.normalize is None else self.normalize(x))
        except _Stop:
            pass
        finally:
            self.model.stage_hooks = saved
        missing = [name for name in self.layers if name not in out]
        if missing:
            raise ConfigError(
                f"config key 'model.name': model {type(self.model).__name__} did not run the "
                f"stage hooks of {missing} (FedModel.stage_hooks), so the features axis cannot "
                "see those stages; its features() must call each stage's hook"
            )
        return out


# --------------------------------------------------------------------------------------------
# the sites and the measurement
# --------------------------------------------------------------------------------------------


@dataclass
class SiteData:
    """What :func:`measure` keeps of one site: counts, class balance, channel statistics,
    the ring profile, the images it sampled (for the montage)."""

    name: str
    counts: dict[str, int]
    sampled: int
    class_fractions: list[float]
    channel_mean: list[float]
    channel_std: list[float]
    profile: list[list[float]]  # (C, R): mean of the log ring profile
    preview: torch.Tensor  # a few sampled images (n, C, H, W)


#: ``--split`` values: one split, or all three of each site
SPLIT_CHOICES = (*SPLITS, "all")


def federation_sites(fed: Federation, split: str) -> list[tuple[str, list[Split]]]:
    """The name and measured splits of each site (``all``: train, val and test); raises
    :class:`DataError` naming the site and split of anything :func:`measure` cannot read (no
    images to measure, a wrong shape, values out of [0, 1] or not finite, labels out of
    range)."""
    if split not in SPLIT_CHOICES:
        raise DataError(f"unknown split {split!r}; choose one of {', '.join(SPLIT_CHOICES)}")
    out = []
    c, h, w = fed.input_shape
    for client in fed.clients:
        for name in SPLITS:
            s = client.split(name)
            where = f"dataset {fed.name!r}, site {client.name!r}, {name} split"
            if s.x.dim() != 4 or tuple(s.x.shape[1:]) != (c, h, w):
                raise DataError(
                    f"{where}: images of shape {tuple(s.x.shape[1:])}, but the dataset "
                    f"declares {c}x{h}x{w}; every site's images must share one shape"
                )
            if not len(s):
                continue
            if isinstance(s.x, ByteImages):
                pass  # 8-bit values / 255: always finite and in [0, 1]
            elif not bool(torch.isfinite(s.x).all()):
                raise DataError(f"{where}: images hold NaN or infinite values; check its files")
            lo, hi = (0.0, 1.0) if isinstance(s.x, ByteImages) else (s.x.min(), s.x.max())
            lo, hi = float(lo), float(hi)
            if lo < 0.0 or hi > 1.0:
                raise DataError(
                    f"{where}: pixel values span [{lo:g}, {hi:g}] but fedshift's images are "
                    "in [0, 1]; check the loader's scaling"
                )
            if int(s.y.min()) < 0 or int(s.y.max()) >= fed.num_classes:
                raise DataError(
                    f"{where}: labels span {int(s.y.min())}..{int(s.y.max())} but the dataset "
                    f"has {fed.num_classes} classes"
                )
        splits = [client.split(sp) for sp in (SPLITS if split == "all" else (split,))]
        if sum(len(sp) for sp in splits) == 0:
            raise DataError(
                f"dataset {fed.name!r}, site {client.name!r} has no {split} images to measure; "
                "choose another --split"
            )
        out.append((client.name, splits))
    return out


def _take(splits: list[Split], idx: torch.Tensor) -> torch.Tensor:
    """The images at ``idx`` (sorted) of the splits laid end to end (copies of the
    chosen rows only)."""
    xs, start = [], 0
    for s in splits:
        local = idx[(idx >= start) & (idx < start + len(s))] - start
        if len(local):
            xs.append(s.x[local])
        start += len(s)
    return torch.cat(xs)


def _batches(n: int, cap: int | None, seed: int, site: str, size: int) -> Iterator[torch.Tensor]:
    """Sorted index batches of a seeded subsample of at most ``cap`` of ``n`` images."""
    if cap is not None and n > cap:
        idx = torch.randperm(n, generator=generator(seed, "data-check", site))[:cap]
        idx = torch.sort(idx).values
    else:
        idx = torch.arange(n)
    yield from torch.split(idx, size)


@dataclass
class Measurement:
    """The numbers :func:`measure` returns (rendered by :mod:`fedshift.shift.report`)."""

    dataset: str
    task: str
    split: str
    input_shape: tuple[int, int, int]
    classes: list[str]
    sites: list[SiteData]
    axes: dict[str, AxisShift]
    layers: list[str]
    layer_scores: dict[str, float]
    ring_frequencies: list[float]
    dh: float
    tv: float

    @property
    def site_names(self) -> list[str]:
        return [s.name for s in self.sites]


def _measure_site(
    fed: Federation,
    name: str,
    splits: list,
    probe: FeatureProbe | None,
    rings: tuple[torch.Tensor, int],
    max_per_site: int | None,
    seed: int,
    batch_size: int,
    preview: int,
) -> tuple[dict[str, Moments], dict[str, Moments], SiteData]:
    """One site's moments per axis (intensity, amplitude, labels) and per probed layer, and
    what the report shows of it (:class:`SiteData`): one pass over its sampled images, one
    over all its labels."""
    c, h, w = fed.input_shape
    layers = [] if probe is None else probe.layers
    total = sum(len(sp) for sp in splits)
    inten, ampl, lab, pix = Moments(), Moments(), Moments(), Moments()
    feats = {layer: Moments() for layer in layers}
    shown: list[torch.Tensor] = []
    # the montage's images: evenly spread over the sample (neighbours are often alike)
    n = total if max_per_site is None else min(total, max_per_site)
    wanted = torch.linspace(0, n - 1, min(preview, n)).round().long().unique()
    seen = 0
    for idx in _batches(total, max_per_site, seed, name, batch_size):
        x = _take(splits, idx)
        here = wanted[(wanted >= seen) & (wanted < seen + len(idx))] - seen
        shown.append(x[here].clone())
        seen += len(idx)
        inten.add(intensity_statistics(x))
        ampl.add(amplitude_profile(x, rings))
        xd = x.to(torch.float64)
        pix.add_sums(x.shape[0] * h * w, xd.sum((0, 2, 3)), (xd * xd).sum((0, 2, 3)))
        if probe is not None:
            for layer, d in probe(x.float()).items():
                feats[layer].add(d)
    for sp in splits:
        for idx in torch.split(torch.arange(len(sp)), batch_size):
            lab.add(label_descriptor(sp.y[idx], fed.num_classes))
    profile = ampl.mean.reshape(c, rings[1]).tolist()
    site = SiteData(
        name=name,
        counts={sp: len(fed.client(name).split(sp)) for sp in SPLITS},
        sampled=inten.n,
        class_fractions=lab.mean.tolist(),
        channel_mean=pix.mean.tolist(),
        channel_std=pix.var.sqrt().tolist(),
        profile=profile,
        preview=torch.cat(shown),
    )
    return {"intensity": inten, "amplitude": ampl, "labels": lab}, feats, site


def measure(
    fed: Federation,
    probe: FeatureProbe | None = None,
    *,
    split: str = "train",
    max_per_site: int | None = 2000,
    seed: int = 0,
    batch_size: int = 256,
    preview: int = 8,
) -> Measurement:
    """Measure ``fed``'s sites along :data:`AXES` (module docstring). Images: a seeded
    subsample of at most ``max_per_site`` of each site's ``split`` (None: all of them);
    labels: all of that split. ``probe``: the fixed model of the ``features`` axis (None
    leaves that axis out). Batches hold at most ``batch_size`` images and
    :data:`BATCH_PIXELS` pixel values."""
    sites = federation_sites(fed, split)
    c, h, w = fed.input_shape
    batch_size = max(1, min(batch_size, BATCH_PIXELS // (c * h * w)))
    rings = ring_index(h, w)
    per_axis: dict[str, list[Moments]] = {a: [] for a in ("intensity", "amplitude", "labels")}
    per_layer: dict[str, list[Moments]] = {}
    kept: list[SiteData] = []
    layers = [] if probe is None else probe.layers
    for name, splits in sites:
        moms, feats, site = _measure_site(
            fed, name, splits, probe, rings, max_per_site, seed, batch_size, preview
        )
        for key in per_axis:
            per_axis[key].append(moms[key])
        for layer in layers:
            per_layer.setdefault(layer, []).append(feats[layer])
        kept.append(site)

    def axis(moms: list[Moments]) -> AxisShift:
        means = torch.stack([m.mean for m in moms])
        return separation(
            means, torch.stack([m.var for m in moms]), torch.tensor([m.n for m in moms])
        )

    axes = {key: axis(moms) for key, moms in per_axis.items()}
    layer_shift = {layer: axis(moms) for layer, moms in per_layer.items()}
    if layer_shift:
        axes["features"] = combine(list(layer_shift.values()))
    # label counts (classification) or summed pixel fractions (segmentation) per site
    counts = torch.stack([m.sum for m in per_axis["labels"] if m.sum is not None])
    ring_width = 0.5 / rings[1]
    return Measurement(
        dataset=fed.name,
        task=fed.task,
        split=split,
        input_shape=(c, h, w),
        classes=list(fed.classes),
        sites=kept,
        axes={a: axes[a] for a in AXES if a in axes},
        layers=layers,
        layer_scores={layer: a.score for layer, a in layer_shift.items()},
        ring_frequencies=[ring_width * (r + 0.5) for r in range(rings[1])],
        dh=degree_of_heterogeneity(counts),
        tv=tv_heterogeneity(counts),
    )


def spectral_centroid(profile: list[list[float]], frequencies: list[float]) -> float:
    """Where a site's amplitude sits, in cycles per pixel: the ring frequencies weighted by
    its (C, R) mean log ring profile turned back into unit-sum amplitudes, averaged over the
    channels. Lower: smoother images (blur, thick slices, upsampling); higher: sharper or
    noisier ones."""
    p = torch.tensor(profile, dtype=torch.float64).exp()
    p = p / p.sum(-1, keepdim=True)
    return float((p * torch.tensor(frequencies, dtype=torch.float64)).sum(-1).mean())
