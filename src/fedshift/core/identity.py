"""What of a config decides a run's numbers, and how two configs differ.

:func:`number_config` is the part of a resolved config that changes results: suite cells are
keyed by its digest (``fedshift.bench.config_digest``), run directories carry a digest of it
(:func:`fedshift.runtime.rundir.results.run_dir_name`) and reports group runs by it
(:func:`fedshift.eval.tables.group_flows`). :func:`config_diff` lists the keys in which two
configs differ (a resumed run against its checkpoint, a run directory against a new run).
"""

from __future__ import annotations

import copy
import hashlib
import json
from typing import Any

from fedshift.core.yamlsafe import short_repr

#: top-level config keys that change no number of a run: its name and output folder, the
#: sweep grid (expanded before a run), how this machine executes it (``run``: see
#: :func:`number_config` for its keys that do count) and trackers
NO_NUMBER_KEYS = ("name", "out", "sweep", "run", "track")
#: the ``run`` keys that do change numbers (in the last bits): :func:`number_config` keeps
#: them, at its top level, when they are not at their defaults
EXECUTION_KEYS = ("threads", "executor", "deterministic", "tf32")


#: keys added after results were committed, each with the value that gives what fedshift did
#: before the key existed (a feature's "off"): at that value they are left out of
#: :func:`number_config`, so a config that does not use the feature keeps the digest (and the
#: committed cells, run directories) it had before the key existed. A key joins here when it
#: is added, with that value; where the new default is another value (``partition.rounding``),
#: a suite committed before sets the old value explicitly. tests/test_committed_digests.py
#: plans every committed results folder's command at HEAD and names one whose digests moved.
LATER_DEFAULTS: dict[str, Any] = {
    "train.agc": None,  # adaptive gradient clipping off (FedWon, issue 31)
    "train.agc_eps": 1e-3,
    "train.agc_head": False,
    "model.norm": "keep",  # the model's own normalisation layers (FedWon's option)
    "model.conv": "plain",
    "train.patience": None,  # early stopping off (issue 50)
    # the rule partition.name=domains dealt remainders by before the key existed (the released
    # splitter.py's); its default since is "largest", so a suite run before it (fpl_digits,
    # fedheal_digits) sets rounding: first to keep its cells (issue 50)
    "partition.rounding": "first",
    "federation.secure_aggregation": False,  # secure aggregation off (issue 53)
    "train.trainable": "all",  # every tensor trains (issue 54)
    # model.weights read in the layout its key names fit (issue 54); resolve_weights leaves
    # auto out of a resolved config, so this only keeps a config that writes it unchanged
    "model.weights_format": "auto",
    "model.pretrained": False,  # efficientnet_lite0 from scratch (issue 54)
    "privacy.epsilon": None,  # differential privacy off (issue 53)
    "privacy.updates": "none",  # model updates not covered (issue 53 item 2)
    # the statistics' part of the budget under privacy.updates=example (issue 53 item 2): at
    # its default it keeps a config's digest as before the key existed
    "privacy.stats_share": 0.5,
    "input.size": None,  # images as the dataset gives them, no resize (issue 54)
}
#: sections added later whose every key is in LATER_DEFAULTS or ONLY_WITH: left out when
#: they are empty once those keys are dropped
LATER_SECTIONS = ("privacy",)
#: keys that only act with another key's non-default value: dropped when that one is at its
#: LATER_DEFAULTS value (``model.ws_gamma`` scales weight-standardised convs only)
ONLY_WITH = {
    "model.ws_gamma": "model.conv",
    "train.min_rounds": "train.patience",
    "federation.secagg_frac_bits": "federation.secure_aggregation",
    "federation.secagg_modulus_bits": "federation.secure_aggregation",
    "train.adapter_stages": "train.trainable",
    "train.adapter_reduction": "train.trainable",
    "train.lora_rank": "train.trainable",
    "train.trunk_cache": "train.trainable",
    "privacy.delta": "privacy.epsilon",
    "privacy.clip": "privacy.epsilon",
    "privacy.updates": "privacy.epsilon",
    "privacy.update_clip": "privacy.updates",
    "privacy.stats_share": "privacy.updates",
}


def _drop_later_defaults(out: dict) -> None:
    def node(dotted: str) -> tuple[dict | None, str]:
        *parents, leaf = dotted.split(".")
        cur: Any = out
        for part in parents:
            cur = cur.get(part) if isinstance(cur, dict) else None
        return (cur if isinstance(cur, dict) else None), leaf

    def at_default(dotted: str) -> bool:
        parent, leaf = node(dotted)
        return parent is None or leaf not in parent or parent[leaf] == LATER_DEFAULTS[dotted]

    inactive = [k for k, gate in ONLY_WITH.items() if at_default(gate)]
    for dotted in [*inactive, *(k for k in LATER_DEFAULTS if at_default(k))]:
        parent, leaf = node(dotted)
        if parent is not None:
            parent.pop(leaf, None)
    for section in LATER_SECTIONS:
        if out.get(section) == {}:
            del out[section]


def without_later_defaults(d: dict) -> dict:
    """A copy of a resolved config without the keys of :data:`LATER_DEFAULTS` at their "off"
    value (and the :data:`ONLY_WITH` keys they switch off): what a run's config said before
    those keys existed."""
    out = copy.deepcopy(d)
    _drop_later_defaults(out)
    return out


def number_config(d: dict, threads: int | None = None) -> dict:
    """The part of a resolved config (:meth:`RunConfig.to_dict`, or a run's ``config.yaml``
    read as data) that decides a run's numbers: everything but :data:`NO_NUMBER_KEYS` and
    the checkpoint cadence (``checkpoint`` becomes ``{}``), plus ``threads`` (the torch
    thread count, default ``run.threads``) when not 1, ``executor`` when not sequential,
    ``deterministic`` when off and ``tf32`` when on: these change the last bits. Suite cells
    are keyed by its digest (``fedshift.bench.config_digest``); reports group runs by it
    (:mod:`fedshift.eval.tables`)."""
    execution = d.get("run") or {}
    out = copy.deepcopy({k: v for k, v in d.items() if k not in NO_NUMBER_KEYS})
    _drop_later_defaults(out)
    threads = int(execution.get("threads", 1)) if threads is None else threads
    # when a run saves its state does not change its results (the empty section keeps the
    # digests of suites cached before checkpoint.minutes existed)
    out["checkpoint"] = {}
    if threads != 1:
        out["threads"] = threads
    # the vectorised executor sums in another order (results equal up to float rounding)
    if execution.get("executor", "sequential") != "sequential":
        out["executor"] = execution["executor"]
    if not execution.get("deterministic", True):
        out["deterministic"] = False
    if execution.get("tf32", False):  # TensorFloat-32 on a GPU: other numbers
        out["tf32"] = True
    return out


def number_digest(d: dict, threads: int | None = None) -> str:
    """The 10-hex-digit SHA-256 of :func:`number_config` (sorted-key JSON): a suite cell's
    digest (``fedshift.bench.config_digest``), computed here from a resolved config or a
    cell's ``config.yaml`` read as data, so a committed cell's recorded digest can be
    checked against the config it holds."""
    blob = json.dumps(number_config(d, threads), sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:10]


def flatten(tree: dict, prefix: str = "") -> dict[str, Any]:
    """A nested config as ``{dotted key: value}`` (empty sections and lists are values)."""
    out: dict[str, Any] = {}
    for k, v in tree.items():
        if isinstance(v, dict) and v:
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


#: what :func:`config_diff` shows for a key one of the configs does not have
NOT_SET = "(not set)"


def config_diff(old: dict, new: dict) -> list[tuple[str, str, str]]:
    """``(dotted key, old value, new value)``, values as short text (:data:`NOT_SET` for a
    key one side lacks), for every key whose value differs between two nested configs:
    ``old``'s keys first, then those only ``new`` has."""
    a, b = flatten(old), flatten(new)
    gone = object()

    def shown(flat: dict, key: str) -> str:
        return short_repr(flat[key]) if key in flat else NOT_SET

    return [
        (k, shown(a, k), shown(b, k))
        for k in [*a, *(k for k in b if k not in a)]
        if a.get(k, gone) != b.get(k, gone)
    ]
