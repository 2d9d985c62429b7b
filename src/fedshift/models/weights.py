"""Pretrained weights for any model: ``model.weights=PATH`` (a state-dict file you have).

fedshift downloads nothing. The file is what ``torch.save(model.state_dict(), PATH)`` writes
(for ImageNet-pretrained backbones: the state dict you converted to fedshift's key names). It
is read with ``torch.load(weights_only=True)`` (tensors only: no code in the file runs) and
applied in :func:`~fedshift.models.build_model`, after the model is built and seeded and
before an algorithm wraps it or augments attach, so every client and every runtime starts
from the same weights.

The model section's keys (besides the model's own):

* ``weights``: the file; resolved to an absolute path in the run's config;
* ``weights_sha256``: the file's SHA-256, filled in when the config is resolved and checked
  whenever it is resolved again (``--resume``, pool workers, Flower nodes): a run never
  continues, or is reproduced, with a file that changed since it started;
* ``weights_skip``: key prefixes of tensors left at their (seeded) initialisation, with the
  file's tensors under them ignored: a new classifier head for another number of classes
  (``model.weights_skip=[classifier]``).

Every other tensor must match: a key the model has and the file lacks, a key the file has and
the model lacks, or a shape that differs is a :class:`ConfigError` naming the file and keys.
The keys are absent from a config without ``model.weights``, so such configs (and the run
directories and bench digests made before this existed) are unchanged.
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from fedshift.core.errors import ConfigError

#: the keys every model section takes besides the model's own parameters
WEIGHT_KEYS = ("weights", "weights_sha256", "weights_skip")

#: how many keys an error lists of each kind
SHOWN = 6


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as e:
        raise ConfigError(f"config key 'model.weights': cannot read {path}: {e.strerror}") from None


def resolve_weights(section: dict) -> dict:
    """The checked weight keys of a ``model`` config section: ``{}`` without ``weights``,
    else ``{weights: absolute path, weights_sha256: the file's, weights_skip: [...]}``."""
    given = {k: section[k] for k in WEIGHT_KEYS if k in section}
    path = given.get("weights")
    if path is None:
        if given:
            keys = ", ".join(f"model.{k}" for k in given)
            raise ConfigError(f"config key(s) {keys} apply only with model.weights=PATH")
        return {}
    if not isinstance(path, str) or not path.strip():
        raise ConfigError(
            "config key 'model.weights' must be the path of a state-dict file (saved with "
            f"torch.save(model.state_dict(), PATH)), got {path!r}"
        )
    p = Path(path).expanduser().resolve()
    if not p.is_file():
        what = "is a directory" if p.is_dir() else "does not exist"
        raise ConfigError(
            f"config key 'model.weights': {p} {what}; give the path of a state-dict file you "
            "have (fedshift downloads nothing)"
        )
    skip = given.get("weights_skip", [])
    if isinstance(skip, str):
        skip = [skip]
    if not isinstance(skip, list) or not all(isinstance(s, str) and s.strip(".") for s in skip):
        raise ConfigError(
            "config key 'model.weights_skip' must be a list of state-dict key prefixes (e.g. "
            f"[classifier]), got {skip!r}"
        )
    data = _read(p)
    if not data:
        raise ConfigError(
            f"config key 'model.weights': {p} is empty (0 bytes: a copy or download cut "
            "short?); give a state-dict file saved with torch.save(model.state_dict(), PATH)"
        )
    digest = sha256_bytes(data)
    pinned = given.get("weights_sha256")
    if pinned is not None and str(pinned).lower() != digest:
        raise ConfigError(
            f"config key 'model.weights': {p} has SHA-256 {digest}, but the config pins "
            f"{pinned} (model.weights_sha256): the file changed since the run was configured. "
            "Restore the original file, or start a new run without model.weights_sha256 to "
            "use this one"
        )
    return {
        "weights": str(p),
        "weights_sha256": digest,
        "weights_skip": [s.strip(".") for s in skip],
    }


def _skipped(key: str, skip: list[str]) -> bool:
    return any(key == s or key.startswith(s + ".") for s in skip)


def _listed(keys: list[str]) -> str:
    more = f", ... ({len(keys)} in all)" if len(keys) > SHOWN else ""
    return ", ".join(keys[:SHOWN]) + more


def _state_dict_of(obj: Any, path: Path) -> dict[str, torch.Tensor]:
    """``obj`` (what the file holds) as a state dict, or a ConfigError saying what it is."""
    if not isinstance(obj, Mapping):
        raise ConfigError(
            f"config key 'model.weights': {path} holds a {type(obj).__name__}, not a state "
            "dict; save one with torch.save(model.state_dict(), PATH)"
        )
    bad = [str(k) for k, v in obj.items() if not (isinstance(k, str) and torch.is_tensor(v))]
    if bad:
        nested = [k for k in ("state_dict", "model", "model_state_dict") if k in obj]
        hint = (
            f"; the tensors may be under its key {nested[0]!r}: save that mapping alone, "
            f"torch.save(ckpt[{nested[0]!r}], PATH)"
            if nested
            else ""
        )
        raise ConfigError(
            f"config key 'model.weights': {path} is not a state dict (name -> tensor): its "
            f"entries {_listed(bad)} are not tensors{hint}"
        )
    return dict(obj)


def load_weights(model: nn.Module, section: dict, name: str) -> None:
    """Load the ``model.weights`` file of a resolved model section into ``model`` (model
    ``name``), checking its SHA-256 against ``weights_sha256`` and every key and shape."""
    path = Path(section["weights"])
    data = _read(path)
    digest = sha256_bytes(data)
    pinned = section.get("weights_sha256")
    if pinned is not None and digest != pinned:
        raise ConfigError(
            f"config key 'model.weights': {path} changed while the run was being set up "
            f"(SHA-256 {digest}, resolved as {pinned}); restore it and start again"
        )
    try:
        obj = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as e:  # not a torch file, or it holds more than tensors and containers
        raise ConfigError(
            f"config key 'model.weights': cannot read {path} as a torch state dict "
            f"(torch.load with weights_only=True): {type(e).__name__}: "
            f"{(str(e).splitlines() or ['(no message)'])[0]}"
        ) from None
    state = _state_dict_of(obj, path)
    bad = [k for k, t in state.items() if t.is_floating_point() and not torch.isfinite(t).all()]
    if bad:  # such weights make every client's update NaN: not a learning-rate problem
        raise ConfigError(
            f"config key 'model.weights': {path} holds NaN or inf in {_listed(bad)}; these "
            "weights cannot be trained from: give a file of finite weights"
        )
    skip = list(section.get("weights_skip", []))
    own = model.state_dict()
    unused = [s for s in skip if not any(_skipped(k, [s]) for k in own)]
    if unused:
        raise ConfigError(
            f"config key 'model.weights_skip': {unused} match no tensor of model {name!r} "
            f"(its top-level modules: {sorted({k.split('.')[0] for k in own})})"
        )
    wanted = [k for k in own if not _skipped(k, skip)]
    given = [k for k in state if not _skipped(k, skip)]
    missing = [k for k in wanted if k not in state]
    unexpected = [k for k in given if k not in own]
    shapes = [
        f"{k} {tuple(state[k].shape)} in the file vs {tuple(own[k].shape)}"
        for k in wanted
        if k in state and state[k].shape != own[k].shape
    ]
    if missing or unexpected or shapes:
        parts = []
        if missing:
            parts.append(f"missing from the file: {_listed(missing)}")
        if unexpected:
            parts.append(f"not in the model: {_listed(unexpected)}")
        if shapes:
            parts.append(f"other shapes: {_listed(shapes)}")
        hint = ""
        if missing and all(f"module.{k}" in state for k in missing):
            hint = " (the file's keys start with 'module.': strip it before saving)"
        raise ConfigError(
            f"config key 'model.weights': {path} does not fit model {name!r} as configured: "
            f"{'; '.join(parts)}{hint}. Save the weights of this architecture, or keep the "
            "tensors that differ (a classifier for other classes) at their initialisation "
            "with model.weights_skip=[PREFIX, ...]"
        )
    model.load_state_dict({k: state[k] for k in wanted}, strict=False)
