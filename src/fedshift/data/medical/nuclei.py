"""``nuclei``: nuclei segmentation, one client per site folder of the user's own images.

The multi-site nuclei setting of FedFA (Zhou & Konukoglu, ICLR 2023; its ``Nuclei`` dataset
class reads ``SiteA`` .. ``SiteF``), with any site folders. Nothing is downloaded:
``dataset.root`` holds one folder per site, each with fixed train / val / test splits, each
split an ``images/`` and a ``labels/`` folder (the layout: :data:`TREE`, which the errors
print).

Clients are ``dataset.sites`` in that order, or (None) every sub-folder of the root in sorted
order (hidden folders skipped). Image and label are paired by file stem (the name without its
last extension); samples are sorted by stem. Errors (:class:`~fedshift.core.errors.DataError`,
naming the file): an image without a label, a label without an image, two files with one
stem, an image and its label of different sizes, a site without ``train``, ``val`` or
``test`` (or without ``images`` / ``labels`` inside), an empty split, a file with another
extension (hidden files are skipped), a JPEG label (lossy: edges would smear).

Images: RGB as is, RGBA / palette -> RGB (alpha dropped), gray -> copied to 3 channels;
8-bit / 255, 16-bit / 65535, float images must already be in [0, 1]. Labels may be binary
(0/255 or 0/1) or instance masks (0 background, 1..n nuclei): foreground = value > 0 (RGB
masks: any colour channel > 0). Every image is resized to ``size x size`` (default 256, a
multiple of 16; aspect ratio not kept, as FedFA's ``Resize([256, 256])``): bilinear
(antialiased) images, nearest labels. Images float32 in [0, 1] ``(N, 3, size, size)``, labels
int64 ``(N, size, size)`` in {0, 1}; classes ``["background", "nucleus"]``.

Differences from FedFA's released code: it maps only label value 255 to 1 (instance masks
would keep values 2..n as extra classes; fedshift binarises any non-zero), resizes labels
bilinearly on the 8-bit mask (fedshift: nearest), and pairs each image with
``labels/<stem>.png`` only (fedshift also accepts TIFF labels).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from fedshift.core.datasets import Dataset
from fedshift.core.errors import DataError
from fedshift.core.federation import SPLITS, ClientData, Federation, Split
from fedshift.data.common.checks import check_size, require_root
from fedshift.data.common.images import (
    IMAGE_EXTENSIONS,
    LABEL_EXTENSIONS,
    read_image,
    read_mask,
    resize_images,
    resize_labels,
)
from fedshift.data.common.sites import check_sites_key

NAME = "nuclei"
CLASSES = ["background", "nucleus"]
#: the layout of ``dataset.root`` (module docstring; the errors print it)
TREE = """\
<dataset.root>/
  SiteA/
    train/
      images/   img001.png  img002.tif ...   (.png .jpg .jpeg .tif .tiff)
      labels/   img001.png  img002.tif ...   (.png .tif .tiff, same stem)
    val/        (same)
    test/       (same)
  SiteB/ ..."""

__all__ = ["CLASSES", "NucleiParams", "list_pairs", "load_nuclei", "load_split"]


@dataclass
class NucleiParams:
    """The ``dataset.*`` keys of ``nuclei``."""

    root: str | None = None  # folder with one sub-folder per site
    sites: list[str] | None = None  # None: every sub-folder of root, sorted
    size: int = 256  # every image resized to size x size (multiple of 16)

    def validate(self, prefix: str = "dataset") -> None:
        """Raise :class:`ConfigError` naming the key for a value the loader cannot honour."""
        check_sites_key(self.sites, f"{prefix}.sites")
        check_size(self.size, f"{prefix}.size", multiple=16, minimum=16)


def _files(folder: Path, extensions: tuple[str, ...], what: str) -> dict[str, Path]:
    """stem -> file of a folder; other extensions, sub-folders and repeated stems are errors."""
    if not folder.is_dir():
        raise DataError(f"{folder} is missing; every split folder needs images/ and labels/")
    out: dict[str, Path] = {}
    for path in sorted(folder.iterdir()):
        if path.name.startswith("."):
            continue
        if not path.is_file():
            raise DataError(f"{path}: unexpected folder inside {what}/; move it out")
        if path.suffix.lower() not in extensions:
            lossy = what == "labels" and path.suffix.lower() in (".jpg", ".jpeg")
            why = " (labels must be lossless: JPEG blurs the mask edges)" if lossy else ""
            raise DataError(
                f"{path}: {what} must be {' / '.join(extensions)} files{why}; convert or move it"
            )
        if path.stem in out:
            raise DataError(
                f"{folder}: {out[path.stem].name} and {path.name} share the stem {path.stem!r}; "
                f"keep one"
            )
        out[path.stem] = path
    return out


def list_pairs(split_dir: Path) -> list[tuple[Path, Path]]:
    """(image, label) files of one split folder, sorted by stem, checked for pairing."""
    if not split_dir.is_dir():
        raise DataError(
            f"{split_dir} is missing: each site needs train/, val/ and test/ folders. "
            f"Expected layout:\n{TREE}"
        )
    images = _files(split_dir / "images", IMAGE_EXTENSIONS, "images")
    labels = _files(split_dir / "labels", LABEL_EXTENSIONS, "labels")
    for mine, theirs, (what, other, suffixes) in (
        (images, labels, ("image", "label", ".png (or .tif)")),
        (labels, images, ("label", "image", ".png (or .jpg, .tif)")),
    ):
        for stem, path in mine.items():
            if stem not in theirs:
                raise DataError(
                    f"{path} has no {other}: expected {split_dir / f'{other}s' / stem}{suffixes}; "
                    f"add it or remove the {what}"
                )
    if not images:
        raise DataError(f"{split_dir} is an empty split: images/ holds no image; add some")
    return [(images[s], labels[s]) for s in sorted(images)]


def load_split(split_dir: Path, size: int) -> tuple[Split, list[tuple[int, int]]]:
    """One split: images ``(N, 3, size, size)``, binary labels, and the original sizes."""
    pairs = list_pairs(split_dir)
    x = torch.empty(len(pairs), 3, size, size, dtype=torch.float32)
    y = torch.empty(len(pairs), size, size, dtype=torch.int64)
    sizes = []
    for j, (image_path, label_path) in enumerate(pairs):
        image = read_image(image_path)
        label = read_mask(label_path)
        if image.shape[1:] != label.shape:
            raise DataError(
                f"{image_path} is {image.shape[2]}x{image.shape[1]} (W x H) but its label "
                f"{label_path} is {label.shape[1]}x{label.shape[0]}; they must match pixel for "
                f"pixel"
            )
        sizes.append((int(image.shape[1]), int(image.shape[2])))
        x[j] = resize_images(torch.from_numpy(image)[None], size)[0]
        binary = torch.from_numpy((label > 0).astype(np.int64))
        y[j] = resize_labels(binary[None], size)[0]
    return Split(x, y), sizes


def load_nuclei(params: NucleiParams) -> Federation:
    """The ``nuclei`` federation: one client per site folder, binary segmentation."""
    params.validate()
    root = require_root(params.root, NAME, TREE)
    if params.sites is None:
        sites = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
        if not sites:
            raise DataError(
                f"dataset.root={str(root)!r} has no site folders. Expected layout:\n{TREE}"
            )
    else:
        sites = list(params.sites)
        for site in sites:
            if not (root / site).is_dir():
                raise DataError(
                    f"site folder {root / site} is missing; add it or drop {site!r} from "
                    f"dataset.sites"
                )
    clients, shapes, foreground = [], {}, {}
    for site in sites:
        splits, shapes[site] = {}, {}
        for split in SPLITS:
            splits[split], found = load_split(root / site / split, params.size)
            shapes[site][split] = sorted({f"{h}x{w}" for h, w in found})
        clients.append(ClientData(site, splits["train"], splits["val"], splits["test"]))
        foreground[site] = round(float(splits["train"].y.float().mean()), 4)
    fed = Federation(
        NAME, clients, list(CLASSES), (3, params.size, params.size), task="segmentation"
    )
    fed.info = {
        "root": str(root),
        "sites": sites,
        "counts": fed.counts(),
        "original_sizes": shapes,
        "train_foreground_fraction": foreground,
        "preprocessing": {
            "images": "RGB; gray copied to 3 channels; alpha dropped; 8-bit / 255",
            "labels": "foreground = value > 0 (instance masks binarised)",
            "size": params.size,
            "resize": "every image to size x size: bilinear (antialiased) images, nearest labels",
        },
    }
    return fed


#: the ``nuclei`` dataset (the dataset contract: :mod:`fedshift.core.datasets`)
NUCLEI_DATASET = Dataset(
    "nuclei", NucleiParams, "segmentation", load_nuclei,
    "nuclei segmentation, one site per folder (your <site>/{train,val,test}/{images,labels})",
)  # fmt: skip
