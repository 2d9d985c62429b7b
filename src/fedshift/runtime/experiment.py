"""One experiment's working parts, built the same way by every runtime.

:func:`build_experiment` turns a resolved config and a loaded :class:`Federation` into the
model (seeded, wrapped by the algorithm, with its augments attached, on the device with the
clients' data: :mod:`fedshift.runtime.device`), the algorithm composed
with its augments, the input pipeline, the task and the clients that train. The native
simulator builds it once for all clients; on Flower the ServerApp builds it from the clients'
descriptions (no data) and every SuperNode builds it from its own data, so both sides start
from bit-identical initial weights (the same seeded sequence of draws).

:func:`score_client` is the evaluation of one client's validation and test split with the
model as loaded, shared by both runtimes.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from fedshift.algorithms import ALGORITHMS, Algorithm
from fedshift.algorithms.halves import client_class
from fedshift.augment import build_augments
from fedshift.augment.base import Augment
from fedshift.augment.compose import Composition
from fedshift.core.config import RunConfig, TrainConfig
from fedshift.core.context import InputPipeline, Normalize, Resize, model_input_shape
from fedshift.core.contract_errors import ContractError
from fedshift.core.errors import ConfigError
from fedshift.core.federation import ClientData, Federation
from fedshift.core.seeding import seed_global
from fedshift.core.tasks import NonFiniteOutputError, Task, make_task
from fedshift.data.common.sites import name_hint
from fedshift.models import MODELS, build_model
from fedshift.models.base import FedModel
from fedshift.models.peft import add_adapters, add_lora, added_layers_rng
from fedshift.runtime.device import place_data, resolve_device, set_precision
from fedshift.runtime.dpsgd import example_refusal
from fedshift.runtime.privacy import Plan, plan_privacy, updates_refusal
from fedshift.runtime.trunk_cache import TrunkCache, trainable_summary

if TYPE_CHECKING:
    from fedshift.runtime.transport import RunIdentity, Transport

log = logging.getLogger("fedshift")


@dataclass
class Experiment:
    """What a runtime needs to drive one run (see the module docstring)."""

    fed: Federation
    task: Task
    #: clients that never train (leave-one-client-out), evaluated with the global model
    holdout: list[str]
    model: FedModel
    algo: Composition
    augments: list[Augment]
    implied: list[str]
    pipeline: InputPipeline
    #: the clients that train, in federation order (central training: one pooled client)
    train_clients: dict[str, ClientData]
    #: the model kinds evaluated, primary first: ``personal`` and/or ``global``
    kinds: list[str]
    device: torch.device
    #: the run's seed (every random stream derives from it) and local-training settings
    seed: int = 0
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)
    eval_batch_size: int = 256
    #: where the clients' data lives: ``device`` (resident on a GPU) or ``host``
    #: (:func:`fedshift.runtime.device.place_data`), how the images are kept
    #: (``data_storage``, :meth:`Federation.storage`, for uint8 images) and the
    #: deterministic-kernel settings
    placement: dict = dataclasses.field(default_factory=dict)
    #: each client's embeddings when its rounds train the head on a frozen trunk
    #: (``train.trunk_cache``), else None
    trunk_cache: TrunkCache | None = None

    def record_extras(self, server: dict, rounds: int) -> dict[str, dict | None]:
        """The run record's ``trainable`` (``trunk_cache.trainable_summary``) and
        ``privacy`` after ``rounds`` rounds (:meth:`privacy_spent`)."""
        return {"trainable": trainable_summary(self, server), "privacy": self.privacy_spent(rounds)}

    #: the privacy budget (``privacy.epsilon``; :mod:`fedshift.runtime.privacy`), or None
    privacy: Plan | None = None

    def privacy_spent(self, rounds: int) -> dict | None:
        """``summary.json``'s ``privacy`` after ``rounds`` rounds (None: not protected)."""
        return None if self.privacy is None else self.privacy.summary(rounds)


def _place(cfg: RunConfig, fed: Federation, device: torch.device) -> tuple[Federation, dict]:
    """The federation placed for ``device`` (``run.data``) and what ``summary.json``'s
    ``runtime`` says of the placement: precision, where the data lives, its storage."""
    placement = set_precision(device, cfg.run.deterministic, cfg.run.tf32)
    fed, where = place_data(fed, device, cfg.run.data)
    if device.type != "cpu":
        placement["data"] = where
    storage = fed.storage()
    if set(storage) != {"float32"}:  # images kept as their uint8 bytes (core/images.py)
        placement["data_storage"] = storage
    return fed, placement


def _check_holdout(holdout: list[str], fed: Federation) -> None:
    """``federation.holdout`` names some, not all, of the federation's clients."""
    unknown = [h for h in holdout if h not in fed.client_names]
    if unknown or len(set(holdout)) >= len(fed.clients):
        raise ConfigError(
            f"config key 'federation.holdout': {unknown or holdout} must name some "
            f"but not all of the clients {fed.client_names}"
            f"{name_hint(unknown, fed.client_names)}"
        )


def _model(cfg: RunConfig, fed: Federation, device: torch.device) -> FedModel:
    """The run's model on ``device``, built for the images it sees (``input.size``), with
    adapters (before the method wraps it) or LoRA (after)."""
    algo_cls, algo_params = cfg.algorithm.factory, cfg.algorithm.params
    # the images the model sees: the dataset's, or resized to input.size by the pipeline
    shape = model_input_shape(fed.input_shape, cfg.input.size)
    seen = fed if shape == tuple(fed.input_shape) else dataclasses.replace(fed, input_shape=shape)
    model = build_model(cfg.model, fed.num_classes, shape, fed.task)
    # algorithms that change the architecture (DisTrans's double-input-channel model)
    train = cfg.train
    if train.trainable == "adapters":  # after the backbone's stages, before a method wraps it
        with added_layers_rng(cfg.seed, "adapters"):
            add_adapters(model, shape, train.adapter_reduction, train.adapter_stages)
    model = algo_cls.wrap_model(algo_params, model, seen)
    if train.trainable == "lora":  # on the layers of the model as the method trains it
        with added_layers_rng(cfg.seed, "lora"):
            add_lora(model, train.lora_rank)
    model.to(device)
    if MODELS.is_plugin(cfg.model.name) or ALGORITHMS.is_plugin(cfg.algorithm.name):
        check_model_output(model, seen, device, cfg.model.name)  # a plug-in's model
    return model


def _check_holdout_answer(
    cfg: RunConfig, composed: Composition, algo: Algorithm, holdout: list[str]
) -> None:
    """A held-out site needs a model: refused for a method with personal tensors and no
    new-site rule; said in the log for one that scores it only after the run."""
    if holdout and composed.has_personal_model and not algo.has_new_site_answer():
        raise ConfigError(
            f"config key 'federation.holdout': algorithm {cfg.algorithm.name!r} keeps "
            "client-local tensors and has no rule for a site that never trained, so a "
            "held-out client has no model to be tested with; leave-one-client-out needs an "
            "algorithm with one global model, or one whose personal part a new site can take "
            "from the sources (FedBN, FRAug, DisTrans: `fedshift protocol new-site`)"
        )
    if holdout and not composed.has_global_model:
        log.info(
            "federation.holdout: algorithm %r keeps client-local tensors; the held-out "
            "client(s) %s train nothing and are not scored during the run: "
            "`fedshift protocol new-site` scores them (the sources' mean local tensors, AdaBN)",
            cfg.algorithm.name, holdout,
        )  # fmt: skip


def _privacy(
    cfg: RunConfig,
    composed: Composition,
    model: FedModel,
    fed: Federation,
    train_clients: dict[str, ClientData],
) -> Plan | None:
    """The budget (``privacy.epsilon``: :mod:`fedshift.runtime.privacy`), planned before any
    client state, with the refusals of ``privacy.updates`` (:mod:`fedshift.runtime.dpsgd`,
    :func:`~fedshift.runtime.privacy.updates_refusal`); the components take their
    mechanisms. None: off."""
    if cfg.privacy.epsilon is None:
        return None
    if cfg.privacy.updates == "example":  # a run DP-SGD cannot protect
        why = example_refusal(cfg, composed, model, fed.task)
        if why is not None:
            raise ConfigError(why)
    sizes = {cid: len(c.train) for cid, c in train_clients.items()}
    privacy = plan_privacy(cfg, composed.disclosures(model), fed.input_shape, sizes)
    assert privacy is not None
    why = None if privacy.updates is None else updates_refusal(composed, model)
    if why is not None:  # privacy.updates=client: a method DP-FedAvg cannot protect
        raise ConfigError(why)
    composed.protect(model, privacy.mechanisms)
    return privacy


def build_experiment(
    cfg: RunConfig,
    fed: Federation,
    num_clients: int | None = None,
    check_holdout: bool = True,
    client_only: bool = False,
) -> Experiment:
    """The parts of one run over ``fed`` (already partitioned and fraction-reduced), built
    from ``cfg``'s resolved components as they are (no registry lookup, no second check).

    ``num_clients`` overrides the number of training clients the algorithm is built for (a
    Flower SuperNode that loaded only its own site); ``check_holdout=False`` skips the check
    that ``federation.holdout`` names clients of ``fed`` (the same SuperNode).
    ``client_only=True`` (a pool worker, a SuperNode) builds the algorithm's client half
    only (:func:`fedshift.algorithms.halves.client_class`: no server machinery such as
    pFedHN's hypernetwork), composed so that the server side refuses to run."""
    device = resolve_device(cfg.device)
    fed, placement = _place(cfg, fed, device)
    fed_cfg = cfg.federation
    task = make_task(fed.task, cfg.train.loss)
    holdout = list(fed_cfg.holdout)
    if check_holdout:
        _check_holdout(holdout, fed)
    seed_global(cfg.seed, "init")
    algo_cls, algo_params = cfg.algorithm.factory, cfg.algorithm.params
    model = _model(cfg, fed, device)
    implied = algo_cls.implied_augments(algo_params)
    augments = build_augments(cfg.augment, cfg.seed, fed.num_classes)
    for a in augments:
        a.attach(model)
    sources = [c for c in fed.clients if c.name not in holdout]
    source_fed = dataclasses.replace(fed, clients=sources)
    train_clients = {c.name: c for c in algo_cls.training_data(source_fed)}
    n = len(train_clients) if num_clients is None else num_clients
    built = client_class(algo_cls) if client_only else algo_cls
    algo: Algorithm = built(algo_params, cfg.train, fed_cfg, model, n)
    composed = Composition(algo, augments, rule=algo_cls if client_only else None)
    _check_holdout_answer(cfg, composed, algo, holdout)
    privacy = _privacy(cfg, composed, model, fed, train_clients)
    normalize = Normalize(cfg.input, fed.input_shape[0], device)
    resize = Resize(cfg.input.size) if cfg.input.size is not None else None
    kinds = [
        k
        for k, ok in (
            ("personal", composed.has_personal_model),
            ("global", composed.has_global_model),
        )
        if ok
    ]
    exp = Experiment(
        fed=fed,
        task=task,
        holdout=holdout,
        model=model,
        algo=composed,
        augments=augments,
        implied=implied,
        pipeline=InputPipeline(augments, normalize, resize),
        train_clients=train_clients,
        kinds=kinds,
        device=device,
        seed=cfg.seed,
        train=cfg.train,
        eval_batch_size=cfg.eval.batch_size,
        placement=placement,
        privacy=privacy,
    )
    exp.trunk_cache = TrunkCache.of(exp)
    return exp


def check_model_output(model: object, fed: Federation, device: torch.device, name: str) -> None:
    """A plug-in's model (or a plug-in algorithm's ``wrap_model``) must be a
    :class:`FedModel` whose output for a batch of the dataset's images is one score per class
    (``(N, classes)``; ``(N, classes, H, W)`` for segmentation): checked on two blank images
    in eval mode, with the random generators and the model's statistics left as they were,
    before anything trains. A :class:`~fedshift.core.contract_errors.ContractError` names both
    shapes (a wrong width was a shape error deep in the loss, or silently wrong scores)."""
    shape = tuple(fed.input_shape)
    k = fed.num_classes
    want = (2, k) if fed.task == "classification" else (2, k, *shape[1:])
    what = f"model {name!r} (built for {fed.task}, {k} classes, images {'x'.join(map(str, shape))})"
    if not isinstance(model, FedModel):
        raise ContractError(f"{what}: got a {type(model).__name__}, not a FedModel")
    was = model.training
    try:
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            model.eval()
            out = model(torch.zeros(2, *shape, device=device))
    except Exception as e:  # its own forward pass failed on the dataset's images
        raise ContractError(f"{what}: its forward pass failed: {type(e).__name__}: {e}") from e
    finally:
        model.train(was)
    got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
    if got != want:
        raise ContractError(
            f"{what}: its output for 2 images has shape {got}, but fedshift needs {want} (one "
            f"score per class{', per pixel' if fed.task != 'classification' else ''}); build "
            "its classifier with num_classes outputs (the constructor's num_classes argument)"
        )


def init_client_state(exp: Experiment, seed: int, cid: str, data: ClientData) -> dict:
    """A client's initial state (``init_client`` on the model at its initial weights), with
    the global RNGs seeded from (seed, client) first: a client's initial state (FRAug's
    RTNet) never depends on which other clients were initialised before it in the process,
    so a SuperNode that builds only its own client gets the native engine's numbers."""
    seed_global(seed, "init_client", cid)
    return exp.algo.init_client(cid, data, exp.model)


def score_client(
    exp: Experiment, client: ClientData, state: dict | None, batch_size: int
) -> dict[str, float]:
    """``{val_<metric>, test_<metric>}`` of the working model as loaded, on ``client``'s
    validation and test splits through its input pipeline (its augments' state)."""
    out: dict[str, float] = {}

    def prepare(x: torch.Tensor) -> torch.Tensor:
        return exp.pipeline.eval(x, state)

    for split in ("val", "test"):
        try:
            m = exp.task.evaluate(exp.model, client.split(split), prepare, batch_size, exp.device)
        except NonFiniteOutputError as e:
            raise NonFiniteOutputError(f"client {client.name!r}, {split} split: {e}") from None
        out.update({f"{split}_{k}": v for k, v in m.items()})
    return out


def start_experiment(
    cfg: RunConfig, transport: Transport, identity: RunIdentity
) -> tuple[Experiment, dict]:
    """The experiment of a run over ``transport`` (built from the federation it connects
    to, which the transport is then attached to) and the server's initial state."""
    exp = build_experiment(cfg, transport.connect(cfg))
    server = exp.algo.init_server(exp.model)
    exp.algo.register_clients(list(exp.train_clients))
    transport.attach(exp, identity)
    return exp, server
