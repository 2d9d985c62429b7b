"""The simulated scanners of ``brain-mri``: the per-site table and the acquisition model
(steps 1-6 of :mod:`fedshift.data.medical.brain_mri`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from fedshift.core.errors import DataError
from fedshift.data.common.seeding import seeded_rng, stable_hash
from fedshift.data.medical.brain_mri.params import WINDOW

__all__ = [
    "SCANNERS",
    "Scanner",
    "apply_scanner",
    "bias_field",
    "noise_rng",
    "rician_noise",
    "scanner_table",
    "thick_slices",
]


# --------------------------------------------------------------------------------------------
# the scanner table
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Scanner:
    """One site's acquisition model (:mod:`fedshift.data.medical.brain_mri` lists the steps)."""

    gamma: float  # 1. v -> v ** gamma
    bias: float  # 2. bias-field amplitude a: field exp(a p), max |p| = 1
    bias_seed: int  # 2. which quadratic polynomial p
    blur: float  # 3. 3-D Gaussian sigma in mm (voxels); 0: none
    thick_axis: str  # 3. "-" or the cube axis "x" / "y" / "z" acquired in thick slices
    thickness: float  # 3. slice thickness in mm along thick_axis; 1: native
    noise: float  # 4. Rician noise sigma on the [0, 1] intensity scale
    contrast: float  # 6. v -> clip(contrast * v + brightness, 0, 1) after normalisation
    brightness: float  # 6.

    def scaled(self, s: float) -> Scanner:
        """The scanner at strength ``s``: identity at 0, this row at 1."""
        return dataclasses.replace(
            self,
            gamma=float(self.gamma**s),
            bias=s * self.bias,
            blur=s * self.blur,
            thickness=1.0 + s * (self.thickness - 1.0),
            noise=s * self.noise,
            contrast=1.0 + s * (self.contrast - 1.0),
            brightness=s * self.brightness,
        )


#: site1..site6. Intensity, bias field, resolution and noise all differ; no row is extreme.
SCANNERS: tuple[Scanner, ...] = (
    #       gamma  bias  seed  blur  thick thickness noise  contrast brightness
    Scanner(1.00, 0.10, 1, 0.0, "-", 1.0, 0.010, 1.00, 0.00),  # site1: near-reference
    Scanner(0.70, 0.25, 2, 0.8, "-", 1.0, 0.020, 1.10, -0.05),  # site2: flat contrast, soft
    Scanner(1.40, 0.15, 3, 0.0, "z", 3.0, 0.015, 0.90, 0.05),  # site3: 3 mm axial slices
    Scanner(0.85, 0.35, 4, 1.2, "-", 1.0, 0.040, 1.00, 0.00),  # site4: strong bias, blurry
    Scanner(1.20, 0.20, 5, 0.0, "y", 4.0, 0.030, 1.20, -0.03),  # site5: 4 mm coronal slices
    Scanner(1.60, 0.30, 6, 0.5, "x", 2.0, 0.050, 0.80, 0.08),  # site6: dark GM, noisiest
)
#: seeds the rows of sites beyond len(SCANNERS); fixed, so site k's scanner never changes
EXTRA_SITES_SEED = stable_hash("brain-mri/extra-sites")
#: seeds the bias-field polynomials (with each scanner's ``bias_seed``)
BIAS_SEED = stable_hash("brain-mri/bias")
AXES = {"x": 0, "y": 1, "z": 2}


def scanner_table(sites: int) -> list[Scanner]:
    """The scanners of ``site1..site<sites>``: the rows of :data:`SCANNERS`, then rows drawn
    from ranges that cover the table with a generator fixed by :data:`EXTRA_SITES_SEED` and
    the site number (so adding sites never changes the earlier ones)."""
    rows = list(SCANNERS[:sites])
    for k in range(len(SCANNERS), sites):
        rng = seeded_rng(EXTRA_SITES_SEED, k)
        thick_axis = str(rng.choice(["-", "x", "y", "z"]))
        rows.append(
            Scanner(
                gamma=round(float(np.exp(rng.uniform(-0.4, 0.5))), 3),
                bias=round(float(rng.uniform(0.1, 0.35)), 3),
                bias_seed=k + 1,
                blur=round(float(rng.choice([0.0, rng.uniform(0.4, 1.2)])), 3),
                thick_axis=thick_axis,
                thickness=1.0 if thick_axis == "-" else round(float(rng.uniform(2.0, 4.0)), 3),
                noise=round(float(rng.uniform(0.01, 0.05)), 4),
                contrast=round(float(rng.uniform(0.8, 1.2)), 3),
                brightness=round(float(rng.uniform(-0.08, 0.08)), 3),
            )
        )
    return rows


# --------------------------------------------------------------------------------------------
# the scanner model
# --------------------------------------------------------------------------------------------


def bias_field(side: int, amplitude: float, seed: int) -> np.ndarray:
    """``exp(amplitude * p)`` on a cube, p a random quadratic in coordinates in [-1, 1]
    (monomials x, y, z, x^2, y^2, z^2, xy, xz, yz) scaled to max |p| = 1."""
    c = seeded_rng(BIAS_SEED, seed).standard_normal(9)
    t = np.linspace(-1.0, 1.0, side, dtype=np.float64)
    fx, fy, fz = (c[i] * t + c[i + 3] * t * t for i in range(3))
    xy = fx[:, None] + fy[None, :] + c[6] * np.outer(t, t)  # terms in (x, y)
    xz = fz[None, :] + c[7] * np.outer(t, t)  # terms in (x, z) and z alone
    yz = c[8] * np.outer(t, t)  # the (y, z) term
    p = xy.astype(np.float32)[:, :, None] + xz.astype(np.float32)[:, None, :]
    p += yz.astype(np.float32)[None, :, :]
    p *= np.float32(amplitude / np.abs(p).max())
    return np.exp(p, out=p)


def thick_slices(v: np.ndarray, axis: int, thickness: float) -> np.ndarray:
    """Average ``axis`` into round(n / thickness) slabs, then interpolate back linearly."""
    n = v.shape[axis]
    m = max(1, round(n / thickness))
    if m >= n:
        return v
    moved = np.ascontiguousarray(np.moveaxis(v, axis, -1))
    t = torch.from_numpy(moved).reshape(1, -1, n)
    low = F.adaptive_avg_pool1d(t, m)
    back = F.interpolate(low, size=n, mode="linear", align_corners=False)
    return np.moveaxis(back.reshape(moved.shape).numpy(), -1, axis)


def rician_noise(v: np.ndarray, sigma: float, rng: np.random.Generator) -> np.ndarray:
    """``|v + sigma (n1 + i n2)|`` with n1, n2 ~ N(0, 1): the magnitude of an MR signal with
    complex Gaussian noise (Rician; Rayleigh with mean sigma sqrt(pi / 2) where v = 0).
    Overwrites and returns float32 arrays; ``v`` itself is consumed."""
    s = np.float32(sigma)
    real = rng.standard_normal(v.shape, dtype=np.float32)
    real *= s
    real += v
    real *= real
    out = rng.standard_normal(v.shape, dtype=np.float32)
    out *= s
    out *= out
    out += real
    return np.sqrt(out, out=out)


def apply_scanner(
    t1: np.ndarray,
    scanner: Scanner,
    rng: np.random.Generator,
    mask: np.ndarray | None = None,
) -> np.ndarray:
    """Steps 1-6 of :mod:`fedshift.data.medical.brain_mri` on a float32 volume in [0, 1];
    returns float32 in [0, 1]. The percentile window of step 5 is taken over ``mask`` (the
    template's brain: most of the cube is empty background, whose percentiles say nothing
    about tissue) or the whole volume. A step whose parameter is at its identity value is
    skipped exactly."""
    from scipy.ndimage import gaussian_filter

    v = np.array(t1, dtype=np.float32)
    if scanner.gamma != 1.0:
        np.power(v, np.float32(scanner.gamma), out=v)
    if scanner.bias != 0.0:
        if v.shape[0] != v.shape[1] or v.shape[1] != v.shape[2]:
            raise ValueError("the bias field needs a cube")
        v *= bias_field(v.shape[0], scanner.bias, scanner.bias_seed)
    if scanner.blur > 0.0:
        v = gaussian_filter(v, sigma=scanner.blur, mode="nearest")
    if scanner.thick_axis != "-" and scanner.thickness > 1.0:
        v = thick_slices(v, AXES[scanner.thick_axis], scanner.thickness)
    if scanner.noise > 0.0:
        v = rician_noise(v, scanner.noise, rng)
    lo, hi = np.percentile(v if mask is None else v[mask], WINDOW)
    if not hi > lo:
        raise DataError(
            f"brain-mri: the {WINDOW[0]:g}..{WINDOW[1]:g} percentile window of a scanner "
            "volume is empty; the template files look wrong (check dataset.nifti_dir)"
        )
    v -= np.float32(lo)
    v *= np.float32(1.0 / (hi - lo))
    np.clip(v, 0.0, 1.0, out=v)
    if scanner.contrast != 1.0 or scanner.brightness != 0.0:
        v *= np.float32(scanner.contrast)
        v += np.float32(scanner.brightness)
        np.clip(v, 0.0, 1.0, out=v)
    return v


def noise_rng(seed: int, site: int) -> np.random.Generator:
    """The Rician noise generator of ``site`` (0-based), fixed by the data seed."""
    return seeded_rng(seed, "brain-mri/noise", site)
