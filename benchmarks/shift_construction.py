"""Does ``fedshift data check`` order brain-mri's sites the way its scanner table built them?

    python benchmarks/shift_construction.py [--split train|val|test|all] [key=value ...]

``key=value``: ``dataset.*`` keys of brain-mri (e.g. ``dataset.size=32``). Three checks:

1. the shift scores at ``dataset.scanner_strength`` 0, 0.5, 1 and 2 (0: one noiseless scanner
   everywhere, so the sites differ only in which slices they hold): every image axis should
   grow with the strength, the label axis should not move (labels never see the scanner);
2. at strength 1, each site's measured channel std against its scanner's display contrast,
   and its spectral centroid against its blur and its noise (Spearman rank correlations);
3. the ordering of the sites by channel std and spectral centroid measured on their own
   slices, against the ordering of the same scanners imaging one common set of slices
   (:func:`fedshift.data.medical.brain_mri.render_slices`), where anatomy cannot differ.
"""

from __future__ import annotations

import argparse
import dataclasses

import torch

from fedshift.catalog import resolve
from fedshift.core.config import InputConfig, load_config
from fedshift.core.context import Normalize
from fedshift.core.federation import ClientData, Federation, Split
from fedshift.core.seeding import seed_global
from fedshift.data import load_dataset
from fedshift.data.medical.brain_mri import render_slices, scanner_table
from fedshift.models import build_model
from fedshift.shift.measure import FeatureProbe, Measurement, measure, spectral_centroid

STRENGTHS = (0.0, 0.5, 1.0, 2.0)


def ranks(values: list[float]) -> torch.Tensor:
    """Ranks from 1, ties sharing their mean rank."""
    v = torch.tensor(values, dtype=torch.float64)
    out = torch.empty_like(v)
    for i, x in enumerate(v):
        out[i] = (v < x).sum() + ((v == x).sum() + 1) / 2
    return out


def spearman(a: list[float], b: list[float]) -> float:
    ra, rb = ranks(a), ranks(b)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    return float((ra * rb).sum() / (ra.norm() * rb.norm()))


def measured(fed: Federation, split: str) -> Measurement:
    """The measurement ``fedshift data check`` makes (seed 0, default input normalisation)."""
    with torch.random.fork_rng(devices=[]):
        seed_global(0, "init")
        model = build_model({"name": "unet"}, fed.num_classes, fed.input_shape, fed.task)
    norm = Normalize(InputConfig(), fed.input_shape[0], torch.device("cpu"))
    return measure(fed, FeatureProbe(model, norm), split=split)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--split", default="train", choices=["train", "val", "test", "all"])
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    base = ["dataset.name=brain-mri", "model.name=unet", *args.overrides]
    print("1. scores by scanner strength")
    print(f"{'strength':>8}  {'intensity':>9}  {'amplitude':>9}  {'features':>9}  {'labels':>9}")
    at_one = None
    for s in STRENGTHS:
        cfg = resolve(load_config(None, [*base, f"dataset.scanner_strength={s}"]))
        fed = load_dataset(cfg.dataset)
        m = measured(fed, args.split)
        row = "  ".join(f"{m.axes[a].score:9.3f}" for a in m.axes)
        print(f"{s:8.1f}  {row}")
        if s == 1.0:
            at_one, params = m, cfg.dataset.params
    assert at_one is not None
    m = at_one
    scanners = [sc.scaled(1.0) for sc in scanner_table(len(m.sites))]
    std = [sum(s.channel_std) / len(s.channel_std) for s in m.sites]
    centroid = [spectral_centroid(s.profile, m.ring_frequencies) for s in m.sites]
    print("\n2. per site at strength 1 (own slices)")
    print(f"{'site':>6}  {'contrast':>8}  {'std':>6}  {'blur':>5}  {'noise':>6}  {'centroid':>8}")
    for s, sc, sd, ce in zip(m.sites, scanners, std, centroid, strict=True):
        cols = f"{sc.contrast:8.2f}  {sd:6.3f}  {sc.blur:5.1f}  {sc.noise:6.3f}  {ce:8.4f}"
        print(f"{s.name:>6}  {cols}")
    print(f"Spearman(contrast, std) = {spearman([sc.contrast for sc in scanners], std):+.2f}")
    print(f"Spearman(blur, centroid) = {spearman([sc.blur for sc in scanners], centroid):+.2f}")
    print(f"Spearman(noise, centroid) = {spearman([sc.noise for sc in scanners], centroid):+.2f}")
    print("\n3. the same slices under every scanner")
    fed = load_dataset(dataclasses.asdict(params) | {"name": "brain-mri"})
    ids = fed.info["slices"][fed.clients[0].name]["train"]
    y = fed.clients[0].train.y
    clients = []
    for k, c in enumerate(fed.clients):
        x = render_slices(params, k, ids)
        clients.append(ClientData(c.name, Split(x, y), Split(x[:1], y[:1]), Split(x[:1], y[:1])))
    same = measured(dataclasses.replace(fed, clients=clients), "train")
    std_same = [sum(s.channel_std) / len(s.channel_std) for s in same.sites]
    cen_same = [spectral_centroid(s.profile, same.ring_frequencies) for s in same.sites]

    def order(values: list[float]) -> str:
        return " < ".join(
            m.site_names[k] for k in sorted(range(len(values)), key=values.__getitem__)
        )

    print(f"std, own slices:       {order(std)}")
    print(f"std, same slices:      {order(std_same)}   Spearman {spearman(std, std_same):+.2f}")
    print(f"centroid, own slices:  {order(centroid)}")
    print(
        f"centroid, same slices: {order(cen_same)}   Spearman {spearman(centroid, cen_same):+.2f}"
    )
    for axis in ("intensity", "amplitude", "features"):
        own, ref = m.axes[axis].to_federation, same.axes[axis].to_federation
        print(f"{axis} distance to the federation, own slices:  {order(own)}")
        print(
            f"{axis} distance to the federation, same slices: {order(ref)}   "
            f"Spearman {spearman(own, ref):+.2f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
