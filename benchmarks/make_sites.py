"""A small three-site image tree with planted feature shifts, for trying fedshift on "your own
data" (the README's first commands) without any: ``<out>/<site>/<class>/<image>.png``.

Each site sees the same two classes (a bright disc or a bright square on a textured
background, so P(y|x) is shared) through its own scanner: site ``hospital_a`` as drawn,
``hospital_b`` darker with more contrast, ``hospital_c`` with a colour cast and blur. That is
the feature-distribution skew fedshift is about, and ``fedshift data check`` names it.

    python benchmarks/make_sites.py mysites              # 3 sites x 2 classes x 40 images
    python benchmarks/make_sites.py mysites --images 200 --side 64
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from PIL import Image, ImageFilter

SITES = ("hospital_a", "hospital_b", "hospital_c")
CLASSES = ("disc", "square")


def scene(rng: np.random.Generator, cls: int, side: int) -> np.ndarray:
    """A gray ``side x side`` image in [0, 1]: texture, and the class's shape at a random
    place and size."""
    img = 0.25 + 0.1 * rng.standard_normal((side, side))
    r = rng.uniform(0.15, 0.3) * side
    cy, cx = rng.uniform(r, side - r, size=2)
    yy, xx = np.mgrid[:side, :side]
    if cls == 0:
        inside = (yy - cy) ** 2 + (xx - cx) ** 2 <= r**2
    else:
        inside = (abs(yy - cy) <= r * 0.85) & (abs(xx - cx) <= r * 0.85)
    img[inside] += 0.5
    return img.clip(0, 1)


def scanner(img: np.ndarray, site: int) -> Image.Image:
    """The site's acquisition: intensity, contrast, colour and sharpness differ."""
    if site == 1:
        img = ((img - 0.5) * 1.6 + 0.35).clip(0, 1)
    rgb = np.stack([img, img, img], axis=-1)
    if site == 2:
        rgb = (rgb * np.array([1.0, 0.8, 0.6]) + np.array([0.08, 0.05, 0.0])).clip(0, 1)
    out = Image.fromarray((rgb * 255).round().astype(np.uint8))
    return out.filter(ImageFilter.GaussianBlur(1.2)) if site == 2 else out


def make_sites(out: Path, images: int = 40, side: int = 48, seed: int = 0) -> Path:
    """Write the tree under ``out`` (``images`` per site and class) and return it."""
    rng = np.random.default_rng(seed)
    for s, site in enumerate(SITES):
        for c, cls in enumerate(CLASSES):
            folder = out / site / cls
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(images):
                scanner(scene(rng, c, side), s).save(folder / f"{i:04d}.png")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="the folder to write (its site folders are made in it)")
    ap.add_argument("--images", type=int, default=40, help="images per site and class")
    ap.add_argument("--side", type=int, default=48, help="image side in pixels")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    root = make_sites(Path(args.out), args.images, args.side, args.seed)
    n = len(SITES) * len(CLASSES) * args.images
    print(f"{root}: {len(SITES)} sites x {len(CLASSES)} classes, {n} images")


if __name__ == "__main__":
    main()
