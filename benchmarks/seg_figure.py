"""Per-site segmentation picture: image, ground truth and each run's prediction side by side.

    python benchmarks/seg_figure.py RUN_DIR [RUN_DIR ...] --out figure.png [--channel 1]

Give one run directory per method (same dataset and seed); each is rebuilt from its config and
final checkpoint. See :func:`fedshift.protocols.segviz.site_predictions_figure`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from fedshift.protocols.segviz import site_predictions_figure


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--split", default="test", choices=["train", "val", "test"])
    ap.add_argument("--index", type=int, help="image index per site (default: most foreground)")
    ap.add_argument("--channel", type=int, help="show this input channel in gray")
    args = ap.parse_args()
    out = site_predictions_figure(args.runs, args.out, args.split, args.index, args.channel)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
