"""Medical-imaging benchmarks.

* :mod:`~fedshift.data.medical.brain_mri`: ``brain-mri``, offline segmentation on the real
  MNI152 template with simulated scanners (a subpackage: parameters, scanner model, template,
  slicing, building and caching);
* :mod:`~fedshift.data.medical.prostate`: ``prostate``, multi-site prostate MRI from the
  user's NIfTI files (read with :mod:`~fedshift.data.medical.nifti`);
* :mod:`~fedshift.data.medical.camelyon`: ``camelyon17``, histology patches of five
  hospitals (WILDS or HarmoFL layout);
* :mod:`~fedshift.data.medical.nuclei`: ``nuclei``, nuclei segmentation, one site per folder.

Nothing here downloads anything but ``brain-mri``'s template, which ships with nilearn.
"""
