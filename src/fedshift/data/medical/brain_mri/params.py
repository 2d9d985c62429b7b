"""``brain-mri``'s constants and its ``dataset.*`` parameters (:class:`BrainMRIParams`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from fedshift.core.errors import ConfigError

NAME = "brain-mri"
DESCRIPTION = "real anatomy (MNI152 2009a template), simulated scanners"
ORIENTATIONS = ("axial", "coronal", "sagittal")
LABEL_SETS: dict[str, list[str]] = {
    "tissue": ["background", "gray matter", "white matter"],
    "brain": ["background", "brain"],
}
TEMPLATE_FILES = {
    k: f"mni_icbm152_{k}_tal_nlin_sym_09a_converted.nii.gz" for k in ("t1", "gm", "wm")
}
#: voxels of background kept around the brain's bounding box before padding to a cube
MARGIN = 4
#: the U-Net pools four times, so the side must be a multiple of 2**4
SIZE_DIVISOR = 16
#: percentile window of the per-volume normalisation (step 5)
WINDOW = (1.0, 99.0)
MAX_STRENGTH = 2.0
PIP_HINT = "pip install nilearn"
#: names the recipe in the cache digest; bump it when the arrays a parameter set gives change
RECIPE = "brain-mri-v1"


__all__ = ["LABEL_SETS", "ORIENTATIONS", "BrainMRIParams"]


@dataclass
class BrainMRIParams:
    """The ``dataset.*`` keys of ``brain-mri``."""

    #: "tissue": background / gray matter / white matter; "brain": background / brain
    labels: str = "tissue"
    #: slice orientations pooled into the sites (axial alone gives ~22 slices per site at K=6)
    orientations: list[str] = field(default_factory=lambda: ["axial", "coronal"])
    #: a slice is usable when this fraction of its (native, square) label map is foreground
    min_foreground: float = 0.05
    #: output side in pixels; a multiple of 16 (the U-Net pools four times)
    size: int = 64
    #: number of clients site1..siteK
    sites: int = 6
    #: consecutive usable slices per block (the unit dealt to sites and splits)
    block: int = 4
    #: train / val / test shares of each site's blocks (FedFA/HarmoFL: 64/16/20)
    fractions: list[float] = field(default_factory=lambda: [0.64, 0.16, 0.20])
    #: 0: identical noiseless scanners everywhere; 1: the scanner table's values
    scanner_strength: float = 1.0
    #: seeds the block dealing and the scanner noise
    seed: int = 0
    #: folder with the three template files; None: nilearn's installed copy
    nifti_dir: str | None = None
    #: keep the built arrays in <cache>/brain-mri/<digest>.npz and reuse them
    cache: bool = True

    def validate(self, prefix: str = "dataset") -> None:
        """Raise :class:`ConfigError` naming the key of any value the loader cannot honour."""

        def key(name: str) -> str:
            return f"{prefix}.{name}" if prefix else name

        def integer(name: str, value: object, low: int) -> None:
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ConfigError(
                    f"config key '{key(name)}' must be an integer >= {low}, got {value!r}"
                )

        def number(value: object) -> bool:
            return not isinstance(value, bool) and isinstance(value, int | float)

        if self.labels not in LABEL_SETS:
            raise ConfigError(
                f"config key '{key('labels')}': {self.labels!r} is not valid; choose one of "
                + ", ".join(repr(k) for k in LABEL_SETS)
            )
        o = self.orientations
        if isinstance(o, str) or not isinstance(o, list | tuple) or not o:
            raise ConfigError(
                f"config key '{key('orientations')}' must be a non-empty list from "
                f"{list(ORIENTATIONS)}, got {o!r}"
            )
        unknown = [x for x in o if x not in ORIENTATIONS]
        if unknown:
            raise ConfigError(
                f"config key '{key('orientations')}': unknown orientation(s) {unknown}; valid: "
                + ", ".join(ORIENTATIONS)
            )
        if len(set(o)) != len(o):
            raise ConfigError(f"config key '{key('orientations')}' names an orientation twice: {o}")
        if not number(self.min_foreground) or not 0 <= self.min_foreground < 1:
            raise ConfigError(
                f"config key '{key('min_foreground')}' must be a number in [0, 1), "
                f"got {self.min_foreground!r}"
            )
        integer("size", self.size, SIZE_DIVISOR)
        if self.size % SIZE_DIVISOR:
            lower = self.size // SIZE_DIVISOR * SIZE_DIVISOR
            raise ConfigError(
                f"config key '{key('size')}' must be a multiple of {SIZE_DIVISOR} (the U-Net "
                f"halves the image four times), got {self.size}; use {lower} or "
                f"{lower + SIZE_DIVISOR}"
            )
        integer("sites", self.sites, 1)
        integer("block", self.block, 1)
        integer("seed", self.seed, 0)
        f = self.fractions
        if (
            isinstance(f, str)
            or not isinstance(f, list | tuple)
            or len(f) != 3
            or not all(number(v) and v > 0 for v in f)
            or abs(sum(f) - 1.0) > 1e-6
        ):
            raise ConfigError(
                f"config key '{key('fractions')}' must be three positive numbers "
                f"(train, val, test) summing to 1, got {f!r}"
            )
        s = self.scanner_strength
        if not number(s) or not 0 <= s <= MAX_STRENGTH:
            raise ConfigError(
                f"config key '{key('scanner_strength')}' must be a number in "
                f"[0, {MAX_STRENGTH}] (0: identical scanners, 1: the scanner table), got {s!r}"
            )
        if not isinstance(self.cache, bool):
            raise ConfigError(
                f"config key '{key('cache')}' must be true or false, got {self.cache!r}"
            )
        if self.nifti_dir is not None and not isinstance(self.nifti_dir, str | Path):
            raise ConfigError(
                f"config key '{key('nifti_dir')}' must be a folder path or null, "
                f"got {self.nifti_dir!r}"
            )
