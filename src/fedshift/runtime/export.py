"""A trained model out of fedshift: ``fedshift export RUN_DIR --out model.pt``.

fedshift's own files (``checkpoint.pt``, ``selected.pt``) carry an integrity header and the
whole run's state; an export is what another program wants instead:

* ``model.pt``: the evaluated model's ``state_dict`` and nothing else (an ordered dict of CPU
  tensors written by ``torch.save``), loadable with ``torch.load(path, weights_only=True)``
  and ``model.load_state_dict(...)``;
* ``model.json`` next to it: what the weights belong to, enough to build the model again:
  the ``model`` config section, the number of classes, the input shape and the task, the
  class names, the input resize and normalisation the model was trained with (images in
  [0, 1], resized bilinearly to ``input.size`` where set, then ``(x - mean) / std`` per
  channel), the run's algorithm and augments, where the weights come
  from (run directory, ``selected`` or ``last`` round, client, model kind) and the SHA-256 of
  ``model.pt``;
* ``model.pt2``: the self-contained predictor, the run's evaluation of a test image (the
  method's input transform with its state, the normalisation, the model) as a
  ``torch.export`` program that loads without fedshift (:mod:`fedshift.runtime.predictor`;
  ``fedshift predict``, :func:`fedshift.load_predictor`). Where it could not compute what
  the run's evaluation computes, the export refuses and writes none of the three files.

Which model: the one the run's tables evaluate (its first model kind): the global model, or,
for runs that keep client-local tensors (FedBN, local training), a client's personalised
model (``client=``, required then). ``weights="selected"`` (default) is the round model
selection picked on validation, ``"last"`` the final round. A global model whose evaluation
transform is each site's own (FedRDN) takes the site: ``client=`` (a client of the run) or
``site_stats=`` (a new site's images); ``adabn=`` exports a new site's AdaBN model instead
(:mod:`fedshift.runtime.newsite`).

:func:`load_exported` builds the model with fedshift (the base model, and the wrapper or
layers the run's algorithm and augments add) and loads the weights. Where ``plain`` is true
in ``model.json``, the weights load into the base model class alone
(``fedshift.models.build_model(model, num_classes, shape, task)``, ``shape`` the
``input_shape`` with ``input.size``'s height and width where set). Augments that
transform inputs at evaluation (``eval_transforms``: FedRDN's client statistics, HarmoFL's
amplitude) are not part of the weights: the predictor carries them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections import OrderedDict
from pathlib import Path
from typing import Any

import torch

import fedshift
from fedshift.core.context import model_input_shape
from fedshift.core.errors import ConfigError, FedshiftError
from fedshift.core.files import atomic_output, read_json, write_text_atomic
from fedshift.models.peft import add_adapters, add_lora

__all__ = ["EXPORT_FORMAT", "ExportedModel", "build_exported", "export_model", "load_exported"]

#: the ``format`` field of ``model.json``
EXPORT_FORMAT = "fedshift-export/1"
MODEL_KINDS = ("personal", "global")


@dataclasses.dataclass
class ExportedModel:
    """An export: the state-dict file, its JSON description and that description's content."""

    path: Path
    config_path: Path
    config: dict[str, Any]
    #: the self-contained predictor (``.pt2``: :mod:`fedshift.runtime.predictor`)
    predictor_path: Path | None = None


def config_path_for(path: str | Path) -> Path:
    """``model.pt`` -> ``model.json`` (the description written next to the weights)."""
    path = Path(path)
    if path.suffix == ".json":
        raise FedshiftError(
            f"--out {path}: name the weights file (e.g. model.pt); its description is written "
            "next to it as a .json"
        )
    return path.with_suffix(".json")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _pick(
    sim: Any, client: str | None, kind: str | None, site: bool = False
) -> tuple[str, str | None]:
    """The model kind and client to export (see the module docstring); ``site``: the run's
    evaluation transforms inputs (per client state), so a global model takes ``client`` as
    the site whose transform the predictor applies."""
    kind = kind or sim.kinds[0]
    if kind not in MODEL_KINDS:
        raise ConfigError(f"kind must be one of {MODEL_KINDS}, got {kind!r}")
    if kind not in sim.kinds:
        raise FedshiftError(f"this run has no {kind} model (it evaluates {', '.join(sim.kinds)})")
    clients = list(sim.train_clients)
    if kind == "global":
        if client is not None and site:
            if client not in sim.fed.client_names:
                raise FedshiftError(
                    f"no client {client!r} in this run; its clients: "
                    f"{', '.join(sim.fed.client_names)}"
                )
            return kind, client
        if client is not None:
            raise FedshiftError(
                f"this run's global model is one model for every client; drop --client "
                f"{client} (or ask for --kind personal where the run keeps one)"
            )
        return kind, None
    if client is None:
        if len(clients) != 1:
            raise FedshiftError(
                "this run keeps a personalised model per client; choose one with --client "
                f"NAME: {', '.join(clients)}"
            )
        client = clients[0]
    if client not in clients:
        raise FedshiftError(f"no client {client!r} in this run; its clients: {', '.join(clients)}")
    return kind, client


def _eval_transforms(sim: Any) -> list[str]:
    """The augments whose ``eval_batch`` changes inputs at evaluation."""
    from fedshift.augment.base import Augment

    return [a.name for a in sim.exp.augments if type(a).eval_batch is not Augment.eval_batch]


def _base_shapes(cfg: Any, fed: Any) -> dict[str, tuple[int, ...]]:
    """Key -> shape of the base model's state dict (no algorithm wrapper, no augment)."""
    from fedshift.models import build_model

    section = dataclasses.replace(cfg.model, extra=())  # the base model, no pretrained weights
    shape = model_input_shape(fed.input_shape, cfg.input.size)
    model = build_model(section, fed.num_classes, shape, fed.task)
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def _needs_site(sim: Any) -> bool:
    """Whether an augment's evaluation state is each site's own (FedRDN's statistics)."""
    from fedshift.core.context import aug_key

    return any(a.site_state(sim.server.get(aug_key(a), {}), None) is None for a in sim.exp.augments)


def _batch_dependent(model: torch.nn.Module) -> bool:
    """Whether a BatchNorm normalises with the batch's statistics at evaluation too
    (``model.bn=harmofl``): an image's scores then depend on the images batched with it."""
    from torch.nn.modules.batchnorm import _BatchNorm

    return any(isinstance(m, _BatchNorm) and not m.track_running_stats for m in model.modules())


def _images(given: Any, shape: tuple[int, ...], read: Any, paths: Any) -> torch.Tensor:
    """A new site's images: a tensor as given (float, (N, C, H, W) in [0, 1]), or a folder's
    image files decoded as the ``folders`` dataset decodes them."""
    if isinstance(given, torch.Tensor):
        if given.ndim != 4 or tuple(given.shape[1:]) != shape or not len(given):
            raise FedshiftError(
                f"a new site's images must be (N, {', '.join(map(str, shape))}), got "
                f"{tuple(given.shape)}"
            )
        return given.detach().float().cpu()
    return read(paths([given]), shape)


def _where(given: Any) -> str | None:
    """How the description names a new site's images: the folder, or that they were given."""
    if given is None:
        return None
    if isinstance(given, torch.Tensor):
        return f"a tensor of {len(given)} images"
    return str(Path(given).resolve())


def predictor_path_for(path: str | Path) -> Path:
    """``model.pt`` -> ``model.pt2`` (the self-contained predictor written next to it)."""
    return Path(path).with_suffix(".pt2")


def _check_paths(run_dir: str | Path, out: Path) -> None:
    """``out`` names a weights file (not the .pt2, not a folder); ``run_dir`` is a finished
    run."""
    if out.suffix == ".pt2":
        raise FedshiftError(
            f"--out {out}: name the weights file (e.g. model.pt); the predictor is written "
            "next to it as a .pt2"
        )
    if out.is_dir():
        raise FedshiftError(f"--out {out} is a folder; give a file name such as {out}/model.pt")
    if not (Path(run_dir) / "summary.json").is_file():
        raise FedshiftError(
            f"{run_dir} is not a finished fedshift run (no summary.json): give the folder of "
            "one finished run, or finish it first (fedshift run --resume DIR)"
        )


def _description(sim: Any, out: Path, pt2: Path, tensors: dict, source: dict) -> dict:
    """``model.json``: the files and their SHA-256, the model section, the input rule,
    whether the tensors are the plain model's, the method and where it came from."""
    from fedshift.core.config_tree import lookup

    cfg, fed = sim.cfg, sim.fed
    raw = cfg.to_dict()
    return {
        "format": EXPORT_FORMAT,
        "fedshift": fedshift.__version__,
        "torch": torch.__version__,
        "state_dict": out.name,
        "sha256": _sha256(out),
        "predictor": pt2.name,
        "predictor_sha256": _sha256(pt2),
        # the model section without the pretrained-weights keys (the export replaces them)
        "model": dataclasses.replace(cfg.model, extra=()).to_dict(),
        "num_classes": fed.num_classes,
        "input_shape": list(fed.input_shape),
        "task": fed.task,
        "classes": list(fed.classes),
        "input": {
            "range": [0.0, 1.0],
            "mean": list(lookup(raw, "input.mean")),
            "std": list(lookup(raw, "input.std")),
            # [H, W] the images are resized to (bilinear, before mean/std), or None
            "size": lookup(raw, "input.size"),
            "normalized_by_augment": sim.pipeline.normalize is None,
        },
        "plain": _base_shapes(cfg, fed) == {k: tuple(v.shape) for k, v in tensors.items()},
        "module": f"{type(sim.model).__module__}:{type(sim.model).__qualname__}",
        "algorithm": raw["algorithm"],
        "augment": raw["augment"],
        "eval_transforms": _eval_transforms(sim),
        "source": source,
        "config": raw,
    }


def _adabn_model(sim: Any, adabn: Any) -> tuple[OrderedDict, Any, dict]:
    """``--adabn``: the model a new site takes, its BN statistics re-estimated on the
    ``adabn`` images (their statistics its input transform too), and its predictor."""
    from fedshift.runtime.newsite import adapted_weights
    from fedshift.runtime.predictor import (
        build_predictor,
        choose_site,
        image_paths,
        read_image_files,
    )

    shape = tuple(sim.fed.input_shape)
    site_images = _images(adabn, shape, read_image_files, image_paths)
    states = choose_site(sim, "global", None, site_images).states
    tensors = OrderedDict(adapted_weights(sim, site_images, states))
    program, site = build_predictor(sim, tensors, "global", None, site_images)
    site["site"] = "a new site (AdaBN on the --adabn images)"
    return tensors, program, site


def _run_model(
    sim: Any, client: str | None, kind: str | None, site_stats: Any
) -> tuple[str, str | None, OrderedDict, Any, dict]:
    """The run's own model of ``kind`` (for ``client``), the site transform from
    ``site_stats`` where given, and its predictor; returns the kind and client picked."""
    from fedshift.runtime.predictor import build_predictor, image_paths, read_image_files

    site_ok = bool(_eval_transforms(sim)) and site_stats is None
    kind, client = _pick(sim, client, kind, site=site_ok)
    site_images = None
    if site_stats is not None:
        if not _needs_site(sim):
            raise FedshiftError(
                "--site-stats: no augment of this run normalises with a site's own "
                "statistics (its evaluation is the same for every site); drop --site-stats"
            )
        shape = tuple(sim.fed.input_shape)
        site_images = _images(site_stats, shape, read_image_files, image_paths)
    state = sim.weights_for(client or next(iter(sim.train_clients)), kind)
    tensors = OrderedDict((k, v.detach().to("cpu").clone().contiguous()) for k, v in state.items())
    site_client = client if kind == "personal" or site_images is None else None
    program, site = build_predictor(sim, tensors, kind, site_client, site_images)
    return kind, client, tensors, program, site


def _predictor_meta(sim: Any, site: dict, source: dict) -> dict:
    """The predictor's own description (inside the .pt2): format, versions, task, classes,
    input and decode rule, batch rule, method, the site transform and the source."""
    from fedshift.runtime.predictor import PREDICTOR_FORMAT, decode_rule

    fed, raw = sim.fed, sim.cfg.to_dict()
    return {
        "format": PREDICTOR_FORMAT,
        "fedshift": fedshift.__version__,
        "torch": torch.__version__,
        "task": fed.task,
        "classes": list(fed.classes),
        "input_shape": list(fed.input_shape),
        "decode": decode_rule(tuple(fed.input_shape)),
        "batch_size": sim.exp.eval_batch_size,
        "batch_dependent": _batch_dependent(sim.model),
        "algorithm": raw["algorithm"],
        "augment": raw["augment"],
        **site,
        "source": source,
    }


def export_model(
    run_dir: str | Path,
    out: str | Path,
    weights: str = "selected",
    client: str | None = None,
    kind: str | None = None,
    federation: Any = None,
    site_stats: str | Path | torch.Tensor | None = None,
    adabn: str | Path | torch.Tensor | None = None,
) -> ExportedModel:
    """Write the run's evaluated model as a plain ``state_dict`` to ``out``, its description
    to ``out`` with the suffix ``.json`` and the self-contained predictor (the run's
    evaluation of a test image as a ``torch.export`` program: :mod:`fedshift.runtime.predictor`)
    to ``out`` with the suffix ``.pt2`` (see the module docstring); returns the paths and the
    description. Imports the run's plug-ins and reads its checkpoint: use it on run
    directories you trust (as ``fedshift.load_run(...).rebuild()``). ``federation``: the
    loaded :class:`~fedshift.core.federation.Federation` of a run whose data its config cannot
    load again (a run made with ``fedshift.run(..., federation=...)``). ``client``: also the
    site whose evaluation transform a global model's predictor applies, where that transform
    is each site's own (FedRDN); ``site_stats``: a folder of a new site's images (or those
    images as a tensor) to compute that site's statistics from instead. ``adabn``: a new
    site's images: the model that site takes (the global model, or the sources' mean local
    tensors for FedBN / FRAug / DisTrans) with its BN statistics re-estimated on them
    (AdaBN, as ``fedshift protocol new-site``'s ``adabn`` variant), and the site's input
    transform from the same images.

    Refuses (:class:`FedshiftError`), writing nothing, where the predictor could not compute
    what the run's evaluation computes (the augment, algorithm or capture named)."""
    from fedshift.runtime.predictor import write_predictor
    from fedshift.runtime.simulation import load_finished

    out = Path(out)
    desc_path = config_path_for(out)
    pt2 = predictor_path_for(out)
    _check_paths(run_dir, out)
    sim = load_finished(run_dir, federation=federation, weights=weights)
    if adabn is not None:
        if client is not None or site_stats is not None or kind is not None:
            raise FedshiftError(
                "--adabn DIR exports the model of a new site whose images are DIR (its "
                "statistics too); drop --client, --kind and --site-stats"
            )
        kind = "adabn"
        tensors, program, site = _adabn_model(sim, adabn)
    else:
        kind, client, tensors, program, site = _run_model(sim, client, kind, site_stats)
    cfg, fed = sim.cfg, sim.fed
    summary = read_json(Path(run_dir) / "summary.json")
    rnd = int(summary["best_round"]) if weights == "selected" else sim.round
    source = {
        "run_dir": str(Path(run_dir).resolve()),
        "dataset": fed.name,
        "seed": cfg.seed,
        "weights": weights,
        "round": rnd,
        "kind": kind,
        "client": client if kind == "personal" else None,
        "site": site["site"],
        "site_stats": _where(site_stats),
        "adabn": _where(adabn),
    }
    meta = _predictor_meta(sim, site, source)
    out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_output(out) as tmp:
        torch.save(tensors, tmp)
    write_predictor(pt2, program, meta)
    desc = _description(sim, out, pt2, tensors, source)
    write_text_atomic(desc_path, json.dumps(desc, indent=2) + "\n")
    return ExportedModel(out, desc_path, desc, pt2)


def _model_shape(desc: dict) -> tuple[int, int, int]:
    """The shape the exported model takes: ``input_shape`` resized to ``input.size``."""
    return model_input_shape(tuple(desc["input_shape"]), (desc.get("input") or {}).get("size"))


def _stub_federation(desc: dict) -> Any:
    """A federation without data that has the export's classes, the input shape its model
    takes, task and client names: what the algorithms' ``wrap_model`` reads."""
    from fedshift.core.federation import ClientData, Federation, Split

    shape = _model_shape(desc)
    task = desc["task"]

    def empty() -> Split:
        y_shape = (0, *shape[1:]) if task == "segmentation" else (0,)
        return Split(torch.zeros((0, *shape)), torch.zeros(y_shape, dtype=torch.long))

    names = desc["config"].get("federation", {}).get("holdout", []) or []
    client = desc["source"].get("client")
    clients = [ClientData(n, empty(), empty(), empty()) for n in {client, *names} if n]
    clients = clients or [ClientData("client", empty(), empty(), empty())]
    return Federation(desc["source"]["dataset"], clients, list(desc["classes"]), shape, {}, task)


def build_exported(desc: dict) -> torch.nn.Module:
    """The model an export describes, freshly built (random weights): the base model,
    wrapped by the run's algorithm and with its augments' layers attached, as in the run."""
    from fedshift.algorithms import ALGORITHMS
    from fedshift.augment import build_augments
    from fedshift.models import build_model

    if desc.get("format") != EXPORT_FORMAT:
        raise FedshiftError(
            f"not a fedshift export description (format {desc.get('format')!r}, expected "
            f"{EXPORT_FORMAT!r})"
        )
    shape = _model_shape(desc)
    model = build_model(desc["model"], int(desc["num_classes"]), shape, desc["task"])
    if desc.get("plain"):
        return model
    algo = ALGORITHMS.component(desc["algorithm"], "algorithm")
    train = desc["config"].get("train", {})  # the layers train.trainable added, as the run did
    if train.get("trainable") == "adapters":
        add_adapters(model, shape, int(train["adapter_reduction"]), list(train["adapter_stages"]))
    model = algo.factory.wrap_model(algo.params, model, _stub_federation(desc))
    if train.get("trainable") == "lora":
        add_lora(model, int(train["lora_rank"]))
    for a in build_augments(desc["augment"], int(desc["source"]["seed"]), int(desc["num_classes"])):
        a.attach(model)
    return model


def load_exported(path: str | Path, device: str | torch.device = "cpu") -> torch.nn.Module:
    """The exported model, built by :func:`build_exported` from ``path``'s ``.json`` and
    loaded with the weights of ``path`` (read with ``weights_only=True``; the file's SHA-256
    checked against the description), in eval mode on ``device``."""
    path = Path(path)
    desc_path = config_path_for(path)
    if not desc_path.is_file():
        raise FedshiftError(f"{path}: its description {desc_path} is missing")
    desc = read_json(desc_path)
    digest = _sha256(path)
    if digest != desc.get("sha256"):
        raise FedshiftError(
            f"{path} has SHA-256 {digest[:16]}..., its description {desc_path} names "
            f"{str(desc.get('sha256'))[:16]}...: the two files do not belong together"
        )
    model = build_exported(desc)
    state = torch.load(path, map_location="cpu", weights_only=True)
    try:
        model.load_state_dict(state)
    except RuntimeError as e:
        raise FedshiftError(f"{path} does not fit the model {desc_path} describes: {e}") from None
    return model.to(device).eval()
