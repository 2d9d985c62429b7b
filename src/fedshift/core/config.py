"""Experiment configuration: YAML + ``key=value`` overrides, validated against dataclasses.

A config is a nested mapping. The fixed sections (``train``, ``federation``, ``eval``, ...)
are dataclasses below; the ``dataset``, ``model`` and ``algorithm`` sections hold a ``name``
plus the keys of that component's own parameter dataclass (found through the registries);
:func:`fedshift.catalog.resolve` turns each into a typed
:class:`~fedshift.core.components.Component`.
Every error names the offending key (and the file it came from) and lists the valid choices.

Values: a float key takes any number, or a string Python's ``float()`` reads (YAML 1.1 reads
``1e-3`` and ``5e-4`` without a dot as strings); every float must be finite (no nan / inf)
and, unless 0, within float32's range (``train.lr=1e300`` would be inf in the arithmetic).
Numeric fields with a valid range declare it once, as field metadata
(:mod:`fedshift.core.bounds`: ``lr: float = bounded(0.01, gt=0)``); :func:`build_dataclass`
checks it for the fixed sections below and for every component's parameter dataclass alike,
naming the full key (``algorithm.mu``) and the range; rules across keys stay in
:func:`check_ranges` and the components' ``validate`` / ``check`` methods. ``name`` becomes a
folder under ``out``: it must be a plain folder name.

Untrusted input: YAML is read with a loader that refuses a key written twice in one mapping
(which would silently replace a whole section), and a loaded config may hold at most
:data:`~fedshift.core.yamlsafe.MAX_NODES` values once its aliases are expanded (a "billion
laughs" file of nested aliases is refused at load time instead of hanging the deep copies,
``asdict`` and messages that walk it; see :mod:`fedshift.core.yamlsafe`). A sweep grid may
have at most :data:`~fedshift.core.config_tree.MAX_SWEEP_CELLS` combinations. Error messages
show values through a bounded ``repr``. The raw tree before a :class:`RunConfig` is built
(overrides, dotted keys, merge, lookup, the sweep grid) is :mod:`fedshift.core.config_tree`;
import its functions from there.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import math
import os
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from fedshift.core.bounds import bounded, bounds, check_bounds
from fedshift.core.components import Component
from fedshift.core.config_tree import (
    COMPONENT_SECTIONS,
    parse_override,
    replace_swept,
    set_dotted,
)
from fedshift.core.errors import ConfigError
from fedshift.core.files import write_text_atomic
from fedshift.core.presets import config_file, shipped_hint
from fedshift.core.yamlsafe import DuplicateKeyError, load_text, plain_tree, short_repr

#: the magnitudes a float config key may have besides 0: float32's largest and smallest
#: normal numbers (every value ends up in float32 arithmetic: 1e300 would be inf there)
FLOAT32_MAX = 3.4028234663852886e38
FLOAT32_TINY = 1.1754943508222875e-38


@dataclass
class TrainConfig:
    """Local training of every client."""

    # the most rounds a run trains (with ``patience``: it may stop earlier)
    rounds: int = bounded(50, ge=1)
    # early stopping: stop once the mean validation primary metric of the primary model has
    # not improved (strictly) for this many scheduled evaluations (every ``eval.every``
    # rounds), never before ``min_rounds``; None: train all ``rounds``
    # (fedshift.eval.early_stop)
    patience: int | None = bounded(None, ge=1)
    min_rounds: int = bounded(0, ge=0, why="no early stop before this round")
    local_epochs: int = bounded(1, ge=1)
    # if set, overrides local_epochs (mini-batch steps per round)
    local_steps: int | None = bounded(None, ge=1)
    batch_size: int = bounded(32, ge=1)
    optimizer: Literal["sgd", "adam"] = "sgd"
    lr: float = bounded(0.01, gt=0)
    momentum: float = bounded(0.0, ge=0, lt=1, why="SGD momentum")
    weight_decay: float = bounded(0.0, ge=0)
    # Adam's (beta1, beta2); torch's default. HarmoFL's prostate/nuclei runs use [0.9, 0.99]
    betas: list[float] = field(
        default_factory=lambda: [0.9, 0.999], metadata=bounds(ge=0, lt=1, why="Adam's betas")
    )
    # "reset": a fresh optimizer every round (FedBN's code); "persist": kept in client state.
    optimizer_state: Literal["reset", "persist"] = "reset"
    # which tensors train (fedshift.algorithms.trainable): "all", the classifier only
    # ("head"), the batch-norm layers ("bn") or both ("bn+head"); the rest stays frozen
    # and never crosses the wire
    # "adapters": residual adapters after the stages, "lora": low-rank updates of the
    # convolution and linear weights (fedshift.models.peft), each with the classifier
    trainable: Literal["all", "head", "bn", "bn+head", "adapters", "lora"] = "all"
    # the adapters' stages (empty: every stage) and bottleneck reduction C -> C / r
    adapter_stages: list[str] = field(default_factory=list)
    adapter_reduction: int = bounded(4, ge=1)
    # LoRA's rank r (alpha = r)
    lora_rank: int = bounded(4, ge=1)
    # with trainable=head: compute each client's embeddings once and train the head on them
    # where nothing varies them per round (fedshift.runtime.trunk_cache); false: recompute
    trunk_cache: bool = True
    # the local loss: "auto" = cross-entropy for classification, (CE + soft Dice) / 2 for
    # segmentation (HarmoFL/FedFA); "ce", "dice" or "ce+dice" set it explicitly
    loss: Literal["auto", "ce", "dice", "ce+dice"] = "auto"
    # adaptive gradient clipping threshold lambda (NFNets Eq. 3; FedWon's training), applied
    # before each optimiser step of the default local step; None: off
    # (fedshift.algorithms.agc)
    agc: float | None = bounded(None, gt=0)
    # AGC's floor eps of a unit's weight norm (NFNets: 1e-3)
    agc_eps: float = bounded(1e-3, gt=0)
    # AGC clips the model's final linear layer (``classifier``) too; NFNets does not
    agc_head: bool = False


@dataclass
class FederationConfig:
    """Which clients take part in a round and how their replies are weighted."""

    sample_fraction: float = bounded(1.0, gt=0, le=1)
    # aggregation weight of a client's reply: "samples" (n_k / n, FedAvg's Eq. 1), "uniform"
    # (1 / |S|), or "auto": the algorithm's paper weighting (its class's ``paper_weighting``);
    # the resolved value is recorded in summary.json as "weighting"
    weighting: Literal["auto", "samples", "uniform"] = "auto"
    # clients that never train but are evaluated with the global model (leave-one-client-out
    # federated domain generalisation, FedFA's Table 4); model selection ignores them
    holdout: list[str] = field(default_factory=list)
    # share of each client's training split that is used (seeded, stratified where labels are
    # classes; FedFA's Fig. 2 / Table 16 sweep); validation and test are untouched
    data_fraction: float = bounded(1.0, gt=0, le=1)
    # secure aggregation (fedshift.runtime.secagg, docs/PRIVACY.md): the server sees each
    # client's records only pairwise-masked, and their sum; refused for a method whose server
    # reads any site's record individually (`fedshift privacy show` says which)
    secure_aggregation: bool = False
    # fractional bits of the fixed point the masked values are quantised to: the aggregate
    # equals the plain one within n_clients * 2**-secagg_frac_bits per element
    secagg_frac_bits: int = bounded(16, ge=1, le=40)
    # the masks' field is the integers modulo 2**secagg_modulus_bits (int64 arithmetic: at
    # most 62); a sum that could wrap around it stops the run
    secagg_modulus_bits: int = bounded(62, ge=16, le=62)


@dataclass
class PrivacyConfig:
    """Differential privacy for the statistics a site shares (:mod:`fedshift.core.privacy`,
    docs/PRIVACY.md): off unless ``epsilon`` is set. Each protected record is clipped per
    example to its bound and released through the Gaussian mechanism, with one noise
    multiplier calibrated (Opacus's RDP accountant) so that all of a site's releases over
    ``train.rounds`` spend at most (``epsilon``, ``delta``). A method that sends a statistic
    it cannot bound is refused, naming the record."""

    # the budget of one site's training examples over the whole run; null: no protection
    epsilon: float | None = bounded(None, gt=0)
    delta: float = bounded(1e-5, gt=0, lt=1)
    # record name -> the L2 bound each example's contribution is clipped to; a record not
    # named keeps its component's default (the largest contribution an image in [0, 1] can
    # give, so no valid example is clipped: `fedshift privacy show` prints it)
    clip: dict[str, float] = field(default_factory=dict)
    # differential privacy for the model updates too (docs/PRIVACY.md): "none" (the weights
    # are not covered), "client" (DP-FedAvg, fedshift.core.dp_updates: each site's update
    # clipped to update_clip, Gaussian noise on the server's mean; the unit is one site, under
    # privacy.epsilon); "example" (DP-SGD through Opacus, fedshift.core.dpsgd: each example's
    # gradient clipped to update_clip, Gaussian noise at every local step on Poisson-sampled
    # batches; the unit is one example, statistics and weights under one privacy.epsilon)
    updates: Literal["none", "client", "example"] = "none"
    # the L2 bound of the updates' mechanism: updates=client, one site's update of the shared
    # weights in one round; updates=example, one example's gradient at one local step
    update_clip: float = bounded(1.0, gt=0)
    # updates=example: the part of epsilon the shared statistics' noise is calibrated to; each
    # site's DP-SGD noise is then set so that both, in one accountant history, spend epsilon
    stats_share: float = bounded(0.5, gt=0, lt=1)


@dataclass
class InputConfig:
    """Input pipeline applied to every batch: (x - mean) / std per channel, x in [0, 1].
    FedBN's digits code uses 0.5 / 0.5.

    ``size``: ``[H, W]``, every image resized (bilinear, after the augments' transforms and
    before ``mean/std``; :class:`fedshift.core.context.Resize`) to what the model takes, in
    training, evaluation and the exported predictor alike, the model built for that size
    (digits' 28x28 upsampled for a pretrained backbone); None (default): as the dataset
    gives them. Classification only (a segmentation mask is not resized)."""

    mean: list[float] = field(default_factory=lambda: [0.5, 0.5, 0.5])
    std: list[float] = field(default_factory=lambda: [0.5, 0.5, 0.5], metadata=bounds(gt=0))
    size: list[int] | None = None


@dataclass
class EvalConfig:
    every: int = bounded(1, ge=1)  # evaluate every k rounds (the last round is always evaluated)
    batch_size: int = bounded(500, ge=1)


@dataclass
class CheckpointConfig:
    """When a run saves all its state (``checkpoint.pt``, atomically): every ``every``
    rounds or every ``minutes`` minutes of training, whichever comes first, at the last round,
    and at once on SIGINT / SIGTERM. 0 switches a trigger off. Results never depend on it."""

    every: int = bounded(10, ge=0, why="0: no round trigger")
    minutes: float = bounded(10.0, ge=0, why="0: no time trigger")


@dataclass
class ExecutionConfig:
    """How this machine executes a run (section ``run``); never what the run computes.

    ``workers``: processes that run the clients (:mod:`fedshift.runtime.pool.transport`; 1: every
    client in the run's own process, one after another; ``auto``: one per usable core,
    divided by ``threads``, at most one per client; 1 on a GPU). Results do not depend on it.
    ``threads``: torch intra-op threads of every process computing for the run (the run's own
    process and each worker), so it is the thread count of every client's work. Float
    reductions split over another number of threads differ in the last bits, so it does
    change results: it is recorded in ``summary.json`` (``runtime.threads``) and is part of a
    suite cell's digest when not 1. Default 1: results then do not depend on the machine.

    ``executor``: how the clients of a round are computed in a process. ``sequential``: one
    after another (the default everywhere). ``vmap``: together, as one vectorised step over
    their stacked weights (:mod:`fedshift.runtime.vmap`; many small clients on one GPU);
    equal to ``sequential`` up to float rounding, so it is part of a suite cell's digest.
    On a CPU it is slower than ``sequential`` and only worth it for checking.
    ``data``: where a GPU run keeps the clients' data. ``device``: resident on the GPU,
    copied there once (no per-batch host copies); ``host``: in pinned host memory, each
    batch copied; ``auto``: ``device`` when all of it fits in half the GPU's free memory.
    Ignored on a CPU. ``deterministic``: on a GPU, deterministic kernels
    (``torch.use_deterministic_algorithms``, ``CUBLAS_WORKSPACE_CONFIG=:4096:8``, no cuDNN
    autotuning), so a run repeats bit for bit on the same GPU and software; an operation
    without a deterministic CUDA kernel then stops the run naming it (set
    ``run.deterministic=false`` to allow it). CPU runs are deterministic either way.
    ``tf32``: on a GPU, let cuDNN convolutions and cuBLAS matrix products use TensorFloat-32
    (10-bit mantissa inputs; faster on Ampere and later). Off by default: a GPU run then
    computes in float32 as a CPU run does (equal up to float rounding), which PyTorch's own
    default (TF32 convolutions) does not give. ``true`` changes results, so it is part of a
    suite cell's digest. Ignored on a CPU."""

    workers: int | Literal["auto"] = bounded(1, ge=1)
    threads: int = bounded(1, ge=1)
    executor: Literal["sequential", "vmap"] = "sequential"
    data: Literal["auto", "device", "host"] = "auto"
    deterministic: bool = True
    tf32: bool = False


@dataclass
class RunConfig:
    name: str = "run"  # a folder under ``out``: a plain folder name (see check_ranges)
    seed: int = bounded(0, ge=0)
    # "cpu", "cuda", "cuda:1", or "auto" (the GPU when there is one, else the CPU); the device
    # a run used is recorded in summary.json (runtime.device)
    device: str = "cpu"
    # The component sections: written {name: ..., **params}; typed components
    # (fedshift.core.components) once fedshift.catalog.resolve has checked them. A RunConfig
    # that was never resolved names its default components only.
    dataset: Component = field(default_factory=lambda: Component("digits"))
    model: Component = field(default_factory=lambda: Component("cnn"))
    algorithm: Component = field(default_factory=lambda: Component("fedavg"))
    # How the dataset's pooled examples are re-split across clients (label skew); ``none``
    # keeps the dataset's own clients (domains).
    partition: Component = field(default_factory=lambda: Component("none"))
    # Plug-ins composed with the algorithm, in order: names or {name: ..., **params}.
    augment: list[Component] = field(default_factory=list)
    train: TrainConfig = field(default_factory=TrainConfig)
    federation: FederationConfig = field(default_factory=FederationConfig)
    input: InputConfig = field(default_factory=InputConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    run: ExecutionConfig = field(default_factory=ExecutionConfig)
    privacy: PrivacyConfig = field(default_factory=PrivacyConfig)
    # Trackers besides metrics.csv and run.log (always written); changes no number.
    # "tensorboard": scalars per round in <run_dir>/tensorboard (pip install tensorboard);
    # "wandb": the same in a W&B offline run in <run_dir>/wandb (pip install 'fedshift[wandb]');
    # "mlflow": the same in an MLflow run in <run_dir>/mlflow (pip install 'fedshift[mlflow]').
    track: list[Literal["tensorboard", "wandb", "mlflow"]] = field(default_factory=list)
    out: str = "runs"
    # Parameter grid: dotted key -> list of values; one run per combination.
    sweep: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        """The config as plain data (``config.yaml``'s content): each component section as
        ``{name, **params}`` (:meth:`Component.to_dict`), in field order."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            out[f.name] = _plain(getattr(self, f.name))
        return out


def _plain(value: Any) -> Any:
    if isinstance(value, Component):
        return value.to_dict()
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return copy.deepcopy(value)




# ----------------------------------------------------------------------------- validation
def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in typing.get_args(tp))
    if origin is list:
        (inner,) = typing.get_args(tp) or (Any,)
        return f"list[{_type_name(inner)}]"
    return getattr(tp, "__name__", str(tp))


class _NotFinite(ConfigError):
    """A float key got nan or inf (kept apart so that a union type reports it as is)."""


def _to_float(value: Any, key: str) -> float | None:
    """``value`` as a finite float: numbers, and strings ``float()`` reads (YAML 1.1 reads
    ``1e-3`` as a string); ``None`` when it is neither. Raises :class:`_NotFinite`."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        try:
            out = float(value)
        except ValueError:
            return None
    elif isinstance(value, int | float):
        out = float(value)
    else:
        return None
    if not math.isfinite(out):
        raise _NotFinite(f"config key '{key}' must be a finite number, got {short_repr(value)}")
    if out != 0 and not FLOAT32_TINY <= abs(out) <= FLOAT32_MAX:
        what = "overflows" if abs(out) > FLOAT32_MAX else "underflows"
        raise _NotFinite(
            f"config key '{key}' = {short_repr(value)} {what} float32, the precision models "
            f"and data are computed in (magnitudes from {FLOAT32_TINY:.2g} to "
            f"{FLOAT32_MAX:.2g}): the run would compute with inf or 0 instead; give a value "
            "in that range (and in the key's own range: fedshift list)"
        )
    return out


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Check ``value`` against the annotation ``tp``; ints (and strings ``float()`` reads) are
    accepted for floats. Messages show ``value`` through :func:`short_repr`, built only when
    raised."""
    origin = typing.get_origin(tp)

    def bad() -> ConfigError:
        return ConfigError(
            f"config key '{key}': expected {_type_name(tp)}, got {short_repr(value)}"
        )

    if tp is Any:
        return value
    if origin is Literal:
        choices = typing.get_args(tp)
        if not isinstance(value, list | dict) and value in choices:
            return value
        raise ConfigError(
            f"config key '{key}': {short_repr(value)} is not valid; choose one of "
            + ", ".join(repr(c) for c in choices)
        )
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        for a in args:
            if a is type(None):
                continue
            try:
                return _coerce(value, a, key)
            except _NotFinite:
                raise
            except ConfigError:
                continue
        raise bad()
    if origin is list:
        (inner,) = typing.get_args(tp) or (Any,)
        if not isinstance(value, list | tuple):
            raise bad()
        return [_coerce(v, inner, f"{key}[{i}]") for i, v in enumerate(value)]
    plain = dict if origin is dict else tp
    if plain in (dict, bool, str):  # taken as it is, if of that type
        if not isinstance(value, plain):
            raise bad()
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad()
        return value
    if tp is float:
        out = _to_float(value, key)
        if out is None:
            raise bad()
        return out
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise bad()
        return build_dataclass(tp, value, key)
    return value


def unknown_key_error(key: str, valid: list[str]) -> ConfigError:
    leaf = key.rsplit(".", 1)[-1]
    hint = difflib.get_close_matches(leaf, valid, n=1)
    did = f" (did you mean '{hint[0]}'?)" if hint else ""
    return ConfigError(
        f"unknown config key '{key}'{did}; valid keys here: {', '.join(sorted(valid)) or '(none)'}"
    )


def build_dataclass(cls: type, data: dict, prefix: str = "", skip: tuple = ()) -> Any:
    """Instantiate dataclass ``cls`` from ``data``, rejecting unknown keys and wrong types."""
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls) if f.init]
    kwargs = {}
    for k, v in data.items():
        full = f"{prefix}.{k}" if prefix else str(k)
        if k in skip:
            continue
        if k not in names:
            raise unknown_key_error(full, names)
        kwargs[k] = _coerce(v, hints[k], full)
    try:
        obj = cls(**kwargs)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"config section '{prefix or cls.__name__}': {e}") from e
    check_bounds(obj, prefix)
    check = getattr(obj, "validate", None)
    if callable(check):
        check(prefix)
    return obj


# ----------------------------------------------------------------------------- loading
def load_yaml(path: str | Path) -> dict:
    """A YAML config file as a plain nested dict: no key twice in a mapping, at most
    :data:`~fedshift.core.yamlsafe.MAX_NODES` values with aliases expanded."""
    p = Path(path)
    if p.is_dir():
        raise ConfigError(f"config file {str(p)!r} is a directory; give a YAML file (-c FILE)")
    if not p.is_file():
        raise ConfigError(f"config file {str(p)!r} does not exist{shipped_hint(p)}")
    try:
        data = load_text(p.read_text(encoding="utf-8")) or {}
    except UnicodeDecodeError as e:
        raise ConfigError(f"{p}: not a YAML text file (not UTF-8: {e.reason})") from None
    except DuplicateKeyError as e:
        raise ConfigError(
            f"{p}, line {e.line}: key {short_repr(e.key)} appears twice in one mapping (first "
            f"at line {e.first_line}); the second would replace the first: merge them"
        ) from None
    except ConfigError as e:
        raise ConfigError(f"{p}: {e}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{p}: not valid YAML: {e}") from e
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: the top level must be a mapping of config keys")
    return plain_tree(data, str(p))


def check_name(name: str, key: str = "name") -> None:
    """``name`` must be a plain folder name (it becomes ``<out>/<name>``): not empty, not
    ``.`` or ``..``, no path separator, no NUL, not absolute."""
    seps = {"/", "\\", os.sep, os.altsep or "/", "\0"}
    if (
        not name.strip()
        or name in (".", "..")
        or any(c in name for c in seps)
        or os.path.isabs(name)
    ):
        raise ConfigError(
            f"config key '{key}' must be a plain folder name (the run's folder under --out / "
            f"'out'): no '/' or '\\', not '.', '..' or empty; got {short_repr(name)}"
        )


def check_ranges(cfg: RunConfig) -> None:
    """Checks across keys of the fixed sections (single-key ranges are field bounds)."""
    check_name(cfg.name)
    t = cfg.train
    if len(t.betas) != 2:
        raise ConfigError(
            f"config key 'train.betas' must be two numbers in [0, 1) (Adam's beta1, beta2), "
            f"got {short_repr(t.betas)}"
        )
    if t.optimizer != "adam" and list(t.betas) != [0.9, 0.999]:
        raise ConfigError(
            f"config key 'train.betas' applies to Adam only; set train.optimizer=adam or "
            f"remove train.betas (got optimizer {t.optimizer!r})"
        )
    if len(cfg.input.mean) != len(cfg.input.std):
        raise ConfigError("config keys 'input.mean'/'input.std' need equal lengths")
    check_input_size(cfg.input.size)
    _check_model_normalises(cfg)
    for record, bound in cfg.privacy.clip.items():
        number = isinstance(bound, int | float) and not isinstance(bound, bool)
        if not (number and math.isfinite(bound) and bound > 0):
            raise ConfigError(
                f"config key 'privacy.clip.{record}' must be a number > 0 (the L2 bound of one "
                f"example's contribution), got {short_repr(bound)}"
            )
    _check_privacy(cfg)
    if t.min_rounds and t.patience is None:
        raise ConfigError(
            f"config key 'train.min_rounds' ({t.min_rounds}) acts with early stopping only; "
            "set train.patience=P (scheduled evaluations without improvement) or remove it"
        )
    if t.min_rounds > t.rounds:
        raise ConfigError(
            f"config key 'train.min_rounds' ({t.min_rounds}) exceeds train.rounds "
            f"({t.rounds}): lower it, or raise train.rounds"
        )


def _check_privacy(cfg: RunConfig) -> None:
    """``privacy.updates`` spends ``privacy.epsilon``: it needs one."""
    p = cfg.privacy
    if p.updates != "none" and p.epsilon is None:
        raise ConfigError(
            f"config key 'privacy.updates' ({p.updates}) needs a budget: set privacy.epsilon "
            "(e.g. privacy.epsilon=8), or privacy.updates=none"
        )


#: the largest side ``input.size`` resizes to
MAX_INPUT_SIDE = 4096


def check_input_size(size: Any) -> None:
    """``input.size``: None, or ``[H, W]`` of two whole numbers in 1..:data:`MAX_INPUT_SIDE`
    (a :class:`ConfigError` naming the key otherwise)."""
    if size is None:
        return
    ok = isinstance(size, list | tuple) and len(size) == 2
    ok = ok and all(
        isinstance(s, int) and not isinstance(s, bool) and 1 <= s <= MAX_INPUT_SIDE for s in size
    )
    if not ok:
        raise ConfigError(
            f"config key 'input.size' must be [H, W], two whole numbers from 1 to "
            f"{MAX_INPUT_SIDE} (the height and width every image is resized to before the "
            f"model), or null for no resize; got {short_repr(size)}"
        )


def _check_model_normalises(cfg: RunConfig) -> None:
    """A model that normalises its raw [0, 1] input itself (``FedModel.input_norm``, e.g.
    ``efficientnet_lite0``: its ImageNet checkpoint's normalisation) needs the run's
    ``input.mean/std`` step to be the identity, else its input is normalised twice."""
    model = cfg.model if isinstance(cfg.model, Component) else None
    norm = getattr(model.obj, "input_norm", None) if model is not None else None
    if norm is None:
        return
    if any(float(m) != 0.0 for m in cfg.input.mean) or any(float(s) != 1.0 for s in cfg.input.std):
        mean = ", ".join(f"{v:.4g}" for v in norm[0])
        std = ", ".join(f"{v:.4g}" for v in norm[1])
        raise ConfigError(
            f"config keys 'input.mean'/'input.std': model {model.name!r} normalises its input "
            f"itself (mean [{mean}], std [{std}] on [0, 1] images, as its pretrained weights "
            f"expect), so the run must pass raw images: set input.mean=[0] input.std=[1] (got "
            f"{short_repr(list(cfg.input.mean))} / {short_repr(list(cfg.input.std))})"
        )


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> dict:
    """Read YAML (optional; a bare name such as ``demo`` is a config shipped with fedshift,
    :mod:`fedshift.core.presets`) and apply ``key=value`` overrides; returns the raw dict."""
    raw = load_yaml(config_file(path)) if path else {}
    return apply_overrides(raw, overrides)


def apply_overrides(raw: dict, overrides: list[str] | None = None) -> dict:
    """``raw`` (changed in place and returned) with the ``key=value`` overrides applied, in
    order. ``sweep.<key>=[...]`` sets a sweep grid key. An explicit value on a key the sweep
    grid varies replaces that key's sweep (:func:`replace_swept`): ``-c demo.yaml
    algorithm.name=fedbn`` runs FedBN only, for every command and ``fedshift.run`` alike."""
    for item in overrides or []:
        key, value = parse_override(item)
        if key.startswith("sweep."):  # sweep keys are dotted names themselves
            grid = raw.get("sweep")
            if not isinstance(grid, dict):
                grid = raw["sweep"] = {}
            grid[key.removeprefix("sweep.")] = value
            continue
        replace_swept(raw, key, value)
        head = key.split(".")[0]
        section = raw.get(head)
        renamed = isinstance(section, dict) and section.get("name") != value
        if key == f"{head}.name" and head in COMPONENT_SECTIONS and renamed:
            raw[head] = {"name": value}  # a new component: its old params don't apply
            continue
        set_dotted(raw, key, value)
    return raw


def dump_config(cfg: RunConfig, path: Path) -> None:
    """Write a run's resolved config (atomically: a crash leaves the old file or the new)."""
    write_text_atomic(path, yaml.safe_dump(cfg.to_dict(), sort_keys=False))
