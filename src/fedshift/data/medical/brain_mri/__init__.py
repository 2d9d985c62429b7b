"""``brain-mri``: an offline segmentation benchmark. Real anatomy, simulated scanners.

**Anatomy (real).** The MNI152 2009a nonlinear symmetric template (Fonov et al., NeuroImage
2011; the ICBM 2009a T1 average of 152 brains) and its gray- and white-matter probability maps,
as shipped by the PyPI package ``nilearn`` in ``nilearn/datasets/data/``:
``mni_icbm152_{t1,gm,wm}_tal_nlin_sym_09a_converted.nii.gz`` (197x233x189 voxels at 1 mm, RAS,
skull-stripped, values 0..255), read with ``nibabel``. ``dataset.nifti_dir`` points at another
folder holding the same three files. There is one brain: train, validation and test hold
different slices of the same subject, so the benchmark measures robustness to the *scanner*
(feature) shift, not to anatomy across subjects.

**Volume.** The three volumes are cropped to the bounding box of the brain plus a
:data:`MARGIN`-voxel border and zero-padded, centred, to a cube (side 192 for the shipped
template), so that every slice of every orientation is already square ("pad to a square"
happens in 3-D, before the scanner model, and the padding receives the same noise as the rest
of the background).

**Labels.** ``labels: tissue`` (default): per-voxel class probabilities
(max(255 - gm - wm, 0), gm, wm) / 255 for (background = CSF and everything else, gray matter,
white matter); a voxel's class is the argmax (ties go to the lower class). ``labels: brain``:
the probabilities (255 - gm - wm, gm + wm) / 255 (gm + wm <= 255 in the template), i.e. brain
iff gm + wm > 127.5. Labels depend on the gm/wm maps only, never on the scanner.

**Slices.** For each orientation in ``dataset.orientations`` (axial, coronal, sagittal), slice
i is *usable* when 1 <= i <= D - 2 (it has both neighbours, as in HarmoFL's loop) and its
native-resolution label map has a foreground (non-background) fraction of at least
``dataset.min_foreground`` of the square cube plane (so the usable set does not depend on
``dataset.size``). A usable slice
becomes one example as in HarmoFL's and FedFA's prostate MRI loaders: slices (i-1, i, i+1)
of the site's scanner-transformed volume are its three channels and slice i's label map is
its target. Every slice of the volume is resized from the cube side to ``dataset.size`` by
area averaging (bilinear when enlarging), so channel 1 of slice i is exactly channel 0 of
slice i+1. Labels are resized by area-averaging the per-class probability maps, then argmax
(not nearest-neighbour on the label map), so thin cortex survives down-sampling. Display
orientation: axial slices have anterior at the top, coronal and sagittal superior at the top.
A slice is named ``"<orientation>:<index>"`` (index along the native axis of the cube).

**Sites.** ``dataset.sites`` clients ``site1..siteK`` hold disjoint slices: each orientation's
usable slices are cut into blocks of ``dataset.block`` consecutive slices; the blocks of all
orientations are shuffled (seeded by ``dataset.seed``) and dealt round-robin, so each site
sees anatomy from the whole range. Within a site its blocks (never single slices: adjacent
slices are near duplicates) are split in dealt order into train/val/test by
``dataset.fractions`` (FedFA's and HarmoFL's 64/16/20): ``round(0.16 n)`` blocks to val,
``round(0.20 n)`` to test, the rest to train (HarmoFL's loader instead permutes single slices
with a stored index and cuts at int(0.64 n) / int(0.8 n)). Slices on either side of a block
border can still share two of their three channels; only the label slice is never shared.

**Simulated scanners.** Site k applies its own fixed acquisition model (:data:`SCANNERS`, one
row per site; rows beyond the sixth are drawn from a fixed seed by :func:`scanner_table`) to
the whole 3-D T1 volume ``v`` = t1 / 255, in this order:

1. sequence contrast: ``v ** gamma``;
2. receive-coil bias field: ``v * exp(bias * p)``, with p a quadratic polynomial in the
   cube's normalised coordinates (coefficients drawn from ``bias_seed``), scaled so
   max |p| = 1 over the cube;
3. resolution: a 3-D Gaussian blur of ``blur`` mm, and/or thick slices along ``thick_axis``
   (the axis is area-averaged into round(side / thickness) slabs, then linearly interpolated
   back, as a viewer reconstructs a thick-slice acquisition);
4. Rician noise of standard deviation ``noise`` (magnitude of the complex signal with
   Gaussian noise on both channels), seeded by ``dataset.seed`` and the site;
5. per-volume normalisation: the 1st..99th percentile window of the brain voxels (template
   t1 > 0; most of the cube is empty background) is mapped to [0, 1] and clipped (HarmoFL
   clips each prostate volume at its 99th percentile and min-max scales it);
6. display window: ``clip(contrast * v + brightness, 0, 1)``. This linear step comes *after*
   the normalisation on purpose: a positive linear map before a percentile window would be
   cancelled exactly.

``dataset.scanner_strength`` s scales every effect from identity: gamma**s, s*bias, s*blur,
1 + s*(thickness - 1), s*noise, 1 + s*(contrast - 1), s*brightness. s = 0 gives every site
the same noiseless scanner (the no-feature-shift control); values above 1 extrapolate.

Building the default federation takes a few seconds (most of it the six 192^3 scanner
volumes); with ``dataset.cache`` (default) the arrays are kept in
``$FEDSHIFT_CACHE/brain-mri/<digest>.npz`` and later loads read them back.

**Modules.** :mod:`~fedshift.data.medical.brain_mri.params` (constants, the ``dataset.*``
keys), :mod:`~fedshift.data.medical.brain_mri.scanner` (the scanner table and model),
:mod:`~fedshift.data.medical.brain_mri.template` (reading, cropping and padding the template),
:mod:`~fedshift.data.medical.brain_mri.slices` (slicing, sites and splits) and
:mod:`~fedshift.data.medical.brain_mri.build` (building, caching, the preview). The names
below are the public API.
"""

from fedshift.data.medical.brain_mri.build import (
    build_brain_mri,
    cache_path,
    load_brain_mri,
    render_slices,
    scanner_preview,
)
from fedshift.data.medical.brain_mri.params import (
    DESCRIPTION,
    LABEL_SETS,
    ORIENTATIONS,
    TEMPLATE_FILES,
    BrainMRIParams,
)
from fedshift.data.medical.brain_mri.scanner import (
    SCANNERS,
    Scanner,
    apply_scanner,
    bias_field,
    rician_noise,
    scanner_table,
    thick_slices,
)
from fedshift.data.medical.brain_mri.slices import usable_slices
from fedshift.data.medical.brain_mri.template import Template, load_template, locate_template

__all__ = [
    "DESCRIPTION",
    "LABEL_SETS",
    "ORIENTATIONS",
    "SCANNERS",
    "TEMPLATE_FILES",
    "BrainMRIParams",
    "Scanner",
    "Template",
    "apply_scanner",
    "bias_field",
    "build_brain_mri",
    "cache_path",
    "load_brain_mri",
    "load_template",
    "locate_template",
    "render_slices",
    "rician_noise",
    "scanner_preview",
    "scanner_table",
    "thick_slices",
    "usable_slices",
]
