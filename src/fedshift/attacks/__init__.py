"""Attacks on what a site shares besides (or with) its model weights (issue 51): what each
method's statistics give away, measured.

* :mod:`~fedshift.attacks.spectra`: images from amplitude spectra (HarmoFL's mean amplitude,
  ELCFS's per-image bank) by phase retrieval and by an inverting-gradients style optimisation;
* :mod:`~fedshift.attacks.membership`: membership inference on a shared mean (FedRDN's
  statistics, FedFA's feature statistics, prototypes) by a likelihood-ratio test, by site size;
* :mod:`~fedshift.attacks.site_property`: a site's property from its statistic;
* :mod:`~fedshift.attacks.scores`: SSIM / PSNR to the nearest true image, ROC AUC and TPR at a
  low false-positive rate.

Each attack is checked where the answer is known (``tests/attacks``): a site of one image is
reconstructed, a mean over one example is a perfect membership signal, a property written into
the statistic is read back. Written in plain torch: ``breaching`` would replace torch 2.13 with
2.14 and CUDA wheels and needs torchvision; ``privacy-meter`` audits a model's outputs, not a
released statistic.
"""
