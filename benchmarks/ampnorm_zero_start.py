"""HarmoFL's zero start of Eq. 3 against the released code's first-batch start, on one run's
config: the sources' validation curve of each, and the last model scored with its BN running
statistics and with batch statistics.

    python benchmarks/ampnorm_zero_start.py [CONFIG] [--rounds 15] [--every 3] [--out DIR]

CONFIG: a run's ``config.yaml`` (default: the 10-client, site6-held-out, seed-0 HarmoFL run of
``unseen_sites_brain_mri``: one round-1 batch a client, so the zero start rebuilds every image
at c = 1 - 0.9 = 10 % of a mean amplitude). The two runs differ only in
``augment.ampnorm.init`` (``zero`` vs ``first``); everything else is the config's, rounds and
evaluation period as given. A model whose BatchNorm tracks running statistics evaluates the
shrunk inputs with statistics that lag them (docs/parts/harmofl-methods.md); batch statistics
do not lag, so the gap between the last two columns is what the lag costs. About 2 min on an idle
2-core machine for the default config.
"""

from __future__ import annotations

import argparse
import functools
import sys
import tempfile
from pathlib import Path

from fedshift.catalog import resolve
from fedshift.core.config import load_config
from fedshift.models.base import tracking_bn
from fedshift.protocols.common import load_run
from fedshift.protocols.rounds import mean_curve, metric_rows
from fedshift.runtime.simulation import Simulation

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = ROOT / "results/unseen_sites_brain_mri/harmofl-brain-mri-seed0-6702ed5cf1/config.yaml"


def running_vs_batch(run_dir: Path) -> tuple[float, float]:
    """The last model's mean validation score over the training clients, BN with its running
    statistics, then BN with each evaluation batch's own statistics."""
    out = []
    for batch_stats in (False, True):
        sim = load_run(run_dir, "last")
        model, task = sim.model, sim.task
        metric = task.primary.name
        if batch_stats:
            for m in tracking_bn(model):
                m.track_running_stats, m.running_mean, m.running_var = False, None, None
        clients = list(sim.exp.train_clients)
        weights = {k: v.clone() for k, v in sim.weights_for(clients[0], "global").items()}
        scores = []
        for cid in clients:
            model.load_state_dict(weights, strict=not batch_stats)
            prep = functools.partial(sim.pipeline.eval, state=sim.states[cid])
            client, bs = sim.fed.client(cid), sim.cfg.eval.batch_size
            scores.append(task.evaluate(model, client.val, prep, bs, sim.device)[metric])
        out.append(sum(scores) / len(scores))
    return out[0], out[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("config", nargs="?", type=Path, default=DEFAULT)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--every", type=int, default=3)
    ap.add_argument("--out", type=Path, help="run folders (default: a temporary folder)")
    args = ap.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="ampnorm-start-"))
    curves, last = {}, {}
    for init in ("zero", "first"):
        overrides = [
            f"name=ampnorm_start_{init}",
            f"train.rounds={args.rounds}",
            f"eval.every={args.every}",
            f"augment=[{{name: ampnorm, init: {init}}}]",
        ]
        cfg = resolve(load_config(str(args.config), overrides))
        if cfg.algorithm.name != "harmofl":
            print(f"{args.config}: not a HarmoFL run ({cfg.algorithm.name})", file=sys.stderr)
            return 2
        run_dir = out / init
        sim = Simulation(cfg, run_dir, None, False)
        sim.run()
        metric = sim.task.primary.name
        # the sources' mean (held-out clients' rows excluded), as `fedshift protocol rounds`
        curves[init] = mean_curve(metric_rows(run_dir), "global", f"val_{metric}")
        last[init] = running_vs_batch(run_dir)
    rounds = sorted(curves["zero"])
    print(f"{args.config}\nsources' mean validation {metric} (%) of the global model, by round")
    print("| init | " + " | ".join(str(r) for r in rounds) + " | last: running BN | batch BN |")
    print("|---|" + "---|" * (len(rounds) + 2))
    for init in ("zero", "first"):
        cells = [f"{100 * curves[init][r]:.1f}" for r in rounds]
        run_bn, batch_bn = last[init]
        print(
            f"| {init} | " + " | ".join(cells) + f" | {100 * run_bn:.1f} | {100 * batch_bn:.1f} |"
        )
    print(f"runs: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
