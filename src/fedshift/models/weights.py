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
  (``model.weights_skip=[classifier]``);
* ``weights_format``: whose key names the file has: ``fedshift`` (what
  ``model.state_dict()`` of fedshift's model writes), ``torchvision``, ``timm`` or
  ``efficientnet_pytorch``, through the key map the model declares for it
  (:mod:`fedshift.models.keymaps`); ``auto`` (the default, left out of the resolved config)
  reads the file in the one layout it fits and refuses a file that fits several with
  different tensors. In a foreign layout the checkpoint's classifier is dropped and
  fedshift's ``classifier`` stays at its initialisation (a new head for the task's
  classes); the run's log says which layout was read and what was dropped.

Every other tensor must match: a key the model has and the file lacks, a key the file has and
the model lacks, or a shape that differs is a :class:`ConfigError` naming the file and keys
(the first few and their count) and the fix.
The keys are absent from a config without ``model.weights``, so such configs (and the run
directories and bench digests made before this existed) are unchanged.
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from fedshift.core.errors import ConfigError
from fedshift.models.keymaps import FORMATS, KEY_MAPS, formats_of, no_format_reason

#: the keys every model section takes besides the model's own parameters
WEIGHT_KEYS = ("weights", "weights_sha256", "weights_skip", "weights_format")

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
    fmt = given.get("weights_format", "auto")
    if fmt not in ("auto", *FORMATS):
        raise ConfigError(
            f"config key 'model.weights_format' must be one of auto, {', '.join(FORMATS)} "
            f"(the library whose key names the file has), got {fmt!r}"
        )
    out = {"weights": str(p), "weights_sha256": digest}
    out["weights_skip"] = [s.strip(".") for s in skip]
    if fmt != "auto":  # auto (the default) is left out: configs from before the key unchanged
        out["weights_format"] = fmt
    return out


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


@dataclass
class Fit:
    """How a file's state dict fits a model when read in one format."""

    fmt: str
    #: fedshift key -> tensor, what would be loaded
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    #: fedshift key -> the file's key it came from
    source: dict[str, str] = field(default_factory=dict)
    #: the checkpoint's classifier keys, dropped (foreign formats)
    head: list[str] = field(default_factory=list)
    unmatched: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    shapes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.unmatched or self.missing or self.shapes)


#: buffers an older checkpoint may lack (PyTorch < 0.4.1 saved BN layers without them): left
#: at the model's own value (0: only BN with momentum=None reads it)
OPTIONAL_SUFFIXES = (".num_batches_tracked",)


def fit_state(
    state: dict[str, torch.Tensor], own: dict[str, torch.Tensor], fmt: str, name: str,
    skip: list[str],
) -> Fit:  # fmt: skip
    """Read ``state`` as format ``fmt`` of model ``name`` (own state dict ``own``):
    what would be loaded, and what does not fit. Foreign formats drop the checkpoint's
    classifier and keep fedshift's ``classifier`` at its initialisation."""
    fit = Fit(fmt)
    if fmt == "fedshift":
        for k, t in state.items():
            if _skipped(k, skip):
                continue
            if k in own:
                fit.tensors[k], fit.source[k] = t, k
            else:
                fit.unmatched.append(k)
        keep = skip
    else:
        keymap = KEY_MAPS[name][fmt]
        keep = [*skip, "classifier"]
        for k, t in state.items():
            if keymap.is_head(k):
                fit.head.append(k)
                continue
            new = keymap.rename(k)
            if new is not None and _skipped(new, keep):
                continue
            if new is None or new not in own:
                fit.unmatched.append(k if new is None else f"{k} (-> {new})")
            else:
                fit.tensors[new], fit.source[new] = t, k
    for k in own:
        if _skipped(k, keep) or k in fit.tensors:
            continue
        if fmt != "fedshift" and k.endswith(OPTIONAL_SUFFIXES):
            continue
        fit.missing.append(k)
    fit.shapes = [
        f"{fit.source[k]} {tuple(t.shape)} in the file vs {k} {tuple(own[k].shape)}"
        for k, t in fit.tensors.items()
        if t.shape != own[k].shape
    ]
    return fit


def _misfit(fit: Fit, path: Path, name: str, state: dict, fix: str) -> ConfigError:
    parts = []
    if fit.missing:
        parts.append(f"missing from the file: {_listed(fit.missing)}")
    if fit.unmatched:
        parts.append(f"not in the model: {_listed(fit.unmatched)}")
    if fit.shapes:
        parts.append(f"other shapes: {_listed(fit.shapes)}")
    hint = ""
    if fit.missing and all(f"module.{k}" in state for k in fit.missing):
        hint = " (the file's keys start with 'module.': strip it before saving)"
    layout = "" if fit.fmt == "fedshift" else f" read in the {fit.fmt} layout"
    return ConfigError(
        f"config key 'model.weights': {path}{layout} does not fit model {name!r} as "
        f"configured: {'; '.join(parts)}{hint}. {fix}"
    )


def _fix(name: str, fmt: str) -> str:
    formats = formats_of(name)
    if fmt == "fedshift":
        other = (
            f"; or, for another library's file, set model.weights_format (model {name!r} reads "
            f"{', '.join(formats)})"
            if len(formats) > 1
            else ""
        )
        return (
            "Save the weights of this architecture, or keep the tensors that differ (a "
            "classifier for other classes) at their initialisation with "
            f"model.weights_skip=[PREFIX, ...]{other}"
        )
    return (
        f"Give {fmt}'s weights of this architecture ({name}, its default sizes), or set "
        f"model.weights_format to the file's layout ({', '.join(formats)})"
    )


def choose_fit(
    state: dict[str, torch.Tensor], own: dict[str, torch.Tensor], fmt: str, name: str,
    skip: list[str], path: Path,
) -> Fit:  # fmt: skip
    """The fit of ``state`` in format ``fmt`` (``auto``: the one format that fits; several
    that fit with different tensors are ambiguous), or a ConfigError naming the keys."""
    formats = formats_of(name)
    if fmt != "auto" and fmt not in formats:
        raise ConfigError(
            f"config key 'model.weights_format': model {name!r} cannot read the {fmt} layout: "
            f"{no_format_reason(name, fmt)}"
        )
    if fmt != "auto":
        fit = fit_state(state, own, fmt, name, skip)
        if not fit.ok:
            raise _misfit(fit, path, name, state, _fix(name, fmt))
        return fit
    fits = [fit_state(state, own, f, name, skip) for f in formats]
    good = [f for f in fits if f.ok]
    distinct = {tuple(sorted(f.source.items())) for f in good}
    if len(distinct) > 1:
        raise ConfigError(
            f"config key 'model.weights': {path} fits model {name!r} in several layouts that "
            f"load different tensors ({', '.join(f.fmt for f in good)}); say which with "
            "model.weights_format=..."
        )
    if good:
        return good[0]
    # none fits: name what does not, in the layout the file is closest to (ties: fedshift)
    best = max(fits, key=lambda f: (len(f.tensors), f.fmt == "fedshift"))
    raise _misfit(best, path, name, state, _fix(name, best.fmt))


def read_state(path: Path, expected_sha256: str | None, key: str = "model.weights") -> dict:
    """The state dict in ``path`` (SHA-256 checked against ``expected_sha256`` if given), read
    with ``torch.load(weights_only=True)``: tensors only, no code in the file runs."""
    data = _read(path)
    digest = sha256_bytes(data)
    if expected_sha256 is not None and digest != expected_sha256:
        raise ConfigError(
            f"config key '{key}': {path} changed while the run was being set up "
            f"(SHA-256 {digest}, resolved as {expected_sha256}); restore it and start again"
        )
    try:
        obj = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as e:  # not a torch file, or it holds more than tensors and containers
        raise ConfigError(
            f"config key '{key}': cannot read {path} as a torch state dict "
            f"(torch.load with weights_only=True): {type(e).__name__}: "
            f"{(str(e).splitlines() or ['(no message)'])[0]}"
        ) from None
    state = _state_dict_of(obj, path)
    bad = [k for k, t in state.items() if t.is_floating_point() and not torch.isfinite(t).all()]
    if bad:  # such weights make every client's update NaN: not a learning-rate problem
        raise ConfigError(
            f"config key '{key}': {path} holds NaN or inf in {_listed(bad)}; these "
            "weights cannot be trained from: give a file of finite weights"
        )
    return state


def apply_state(model: nn.Module, state: dict, name: str, fmt: str, skip: list[str],
                path: Path, key: str = "model.weights") -> str:  # fmt: skip
    """Load ``state`` (format ``fmt``, ``auto`` allowed) into ``model``; the report line
    (format read, tensors loaded, the checkpoint's classifier dropped)."""
    own = model.state_dict()
    unused = [s for s in skip if not any(_skipped(k, [s]) for k in own)]
    if unused:
        raise ConfigError(
            f"config key 'model.weights_skip': {unused} match no tensor of model {name!r} "
            f"(its top-level modules: {sorted({k.split('.')[0] for k in own})})"
        )
    fit = choose_fit(state, own, fmt, name, skip, path)
    model.load_state_dict(fit.tensors, strict=False)
    line = f"{key}: {path} read in the {fit.fmt} layout: {len(fit.tensors)} tensors"
    if fit.head:
        line += (
            f"; its classifier ({', '.join(fit.head)}) dropped: model {name!r}'s classifier "
            "is new, for this task's classes"
        )
    return line


def load_weights(model: nn.Module, section: dict, name: str) -> str:
    """Load the ``model.weights`` file of a resolved model section into ``model`` (model
    ``name``), checking its SHA-256 against ``weights_sha256`` and every key and shape, in the
    layout ``weights_format`` says (``auto`` when absent). Returns the report line."""
    path = Path(section["weights"])
    state = read_state(path, section.get("weights_sha256"))
    fmt = section.get("weights_format", "auto")
    return apply_state(model, state, name, fmt, list(section.get("weights_skip", [])), path)
