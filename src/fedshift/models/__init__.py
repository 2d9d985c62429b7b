"""Model registry: name -> FedModel factory with its parameter dataclass."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass

from fedshift.core.bounds import bounded
from fedshift.core.components import Component
from fedshift.core.errors import ConfigError
from fedshift.core.memory import check_fits, human_bytes
from fedshift.core.registry import Registry
from fedshift.models.alexnet import AlexNetBN, AlexNetParams
from fedshift.models.base import FedModel
from fedshift.models.densenet import DenseNet, DenseNetParams
from fedshift.models.digits import DigitModel, LeNet5, SmallCNN
from fedshift.models.efficientnet import EfficientNetLite0, EfficientNetParams, load_pretrained
from fedshift.models.normfree import NORM_FREE_KEYS, NormFreeParams, make_norm_free
from fedshift.models.resnet import ResNet18, ResNetParams
from fedshift.models.unet import UNet, UNetParams
from fedshift.models.weights import WEIGHT_KEYS, load_weights

log = logging.getLogger("fedshift")


@dataclass
class CNNParams(NormFreeParams):
    width: int = bounded(32, ge=1)


@dataclass
class DigitModelParams(NormFreeParams):
    pass


@dataclass
class LeNet5Params(NormFreeParams):
    bn: bool = True


MODELS: Registry[type[FedModel]] = Registry("model")
MODELS.add("cnn", SmallCNN, CNNParams, "fast default CNN: 2 conv stages with BN, 128-d embedding")
MODELS.add("digitmodel", DigitModel, DigitModelParams, "FedBN's DigitModel (3 conv + 3 FC, BN)")
MODELS.add("lenet5", LeNet5, LeNet5Params, "LeNet-5 (ReLU, max-pool; optional BN)")
MODELS.add(
    "alexnet",
    AlexNetBN,
    AlexNetParams,
    "AlexNet with BN (FedBN: hidden 4096; FedFA: hidden=1024) for 256x256 images",
)
MODELS.add("resnet18", ResNet18, ResNetParams, "ResNet-18 with BN (small_input for 32x32)")
MODELS.add(
    "unet",
    UNet,
    UNetParams,
    "U-Net of FedFA/HarmoFL (base width 32, 4 encoder stages + bottleneck, BN) for segmentation",
)
MODELS.add(
    "densenet121",
    DenseNet,
    DenseNetParams,
    "DenseNet-121 (BC, growth 32) for 96x96 histology patches (HarmoFL's Camelyon17 model)",
)
MODELS.add(
    "efficientnet_lite0",
    EfficientNetLite0,
    EfficientNetParams,
    "EfficientNet-Lite0 (ReLU6, no SE, BN) for 224x224 RGB; model.pretrained=true: ImageNet "
    "weights from the fedshift[pretrained] extra",
)

#: input shapes each model is built for
MODEL_INPUTS = {"cnn": (3, 28, 28), "digitmodel": (3, 28, 28), "lenet5": (3, 28, 28)}


#: what a model that takes any image size is, for the error of a fixed-size one
ANY_SIZE_MODELS = (
    "resnet18, alexnet (at least 63x63), densenet121 (at least 32x32), efficientnet_lite0 "
    "(at least 32x32)"
)


def check_model_input(
    name: str, cls: type, input_shape: tuple[int, ...], task: str, size_key: str = ""
) -> None:
    """Raise :class:`ConfigError` when model ``name`` cannot take images of ``input_shape``
    for ``task``: its own ``check_input``, and the fixed input of :data:`MODEL_INPUTS`.
    ``size_key``: the dataset key that sets the image size, named in the ways out (a
    config resolved before any image is read names it; a built federation does not)."""
    shape = "x".join(map(str, input_shape))
    why = cls.check_input(tuple(input_shape), task)
    if why is not None:
        raise ConfigError(
            f"config key 'model.name': model {name!r} cannot take this dataset's "
            f"{task} task with images of shape {shape}: {why}; "
            "choose another model (fedshift list), change the dataset's image size, or "
            "resize the images for the model with input.size=[H, W]"
        )
    expected = MODEL_INPUTS.get(name)
    if expected is not None and tuple(input_shape) != expected:
        ways = "choose a model for this dataset"
        if size_key:
            prefix = size_key.rsplit(".", 1)[0]
            ways = (
                f"drop {size_key} (it then follows the model), give {size_key}={expected[-1]}"
                f" {prefix}.channels={expected[0]}, or choose a model that takes any size "
                f"(model.name=...: {ANY_SIZE_MODELS})"
            )
        raise ConfigError(
            f"config key 'model.name': model {name!r} takes images of shape "
            f"{'x'.join(map(str, expected))} but the dataset gives {shape}; {ways}"
        )


def build_model(
    section: Component | dict,
    num_classes: int,
    input_shape: tuple[int, ...],
    task: str = "classification",
) -> FedModel:
    """Instantiate the resolved ``model`` component (or a plain ``{name: ..., **params}``
    section, validated first) for this dataset, with the pretrained weights of
    ``model.weights`` if set (:mod:`fedshift.models.weights`)."""
    component = MODELS.component(section, "model", extra_keys=WEIGHT_KEYS)
    name, cls = component.name, component.factory
    check_model_input(name, cls, tuple(input_shape), task)
    params = dataclasses.asdict(component.params) if component.params is not None else {}
    # FedWon's model option (model.norm / model.conv / model.ws_gamma): applied to the built
    # model, not passed to its constructor (fedshift.models.normfree)
    norm_free = {k: params.pop(k) for k in NORM_FREE_KEYS if k in params}
    kwargs = {"num_classes": num_classes, "in_channels": input_shape[0], **params}
    size = _model_bytes(cls, kwargs)
    if size is not None:  # weights, gradients, optimizer state and the server's copy
        keys = ", ".join(f"model.{k}={v}" for k, v in params.items())
        check_fits(
            4 * size,
            f"model {name!r}{f' ({keys})' if keys else ''}, {human_bytes(size)} of weights,",
            "lower its size keys (model.width...) or choose a smaller model (fedshift list)",
        )
    weights = component.extras
    if params.get("pretrained") and (weights.get("weights") or norm_free_changes(norm_free)):
        raise ConfigError(
            f"config key 'model.pretrained': model {name!r} starts from its ImageNet "
            "checkpoint, which model.weights, model.norm or model.conv would replace or "
            "change; drop those keys, or set model.pretrained=false"
        )
    if cls is EfficientNetLite0 and norm_free.get("conv", "plain") != "plain":
        raise ConfigError(
            "config key 'model.conv': efficientnet_lite0's convolutions pad as TensorFlow's "
            "SAME (per input size), which fedshift's weight-standardised convolution does not; "
            "keep model.conv=plain (model.norm=none alone is supported)"
        )
    model = cls(**kwargs)
    if norm_free:
        make_norm_free(model, **norm_free)
    if getattr(model, "pretrained", False):
        log.info("%s", load_pretrained(model, name))
    if weights.get("weights"):
        # pretrained weights replace the seeded initial ones before anything wraps the model
        log.info("%s", load_weights(model, weights, name))
    return model


def norm_free_changes(norm_free: dict) -> bool:
    """Whether FedWon's model option (``model.norm`` / ``model.conv``) changes the model."""
    return norm_free.get("norm", "keep") != "keep" or norm_free.get("conv", "plain") != "plain"


def _model_bytes(cls: type, kwargs: dict) -> int | None:
    """The bytes of a model's parameters and buffers, from building it on PyTorch's "meta"
    device (shapes only: nothing is allocated, no random number drawn); None if the model
    cannot be built there (a plug-in doing arithmetic on its weights while built)."""
    import torch

    try:
        with torch.random.fork_rng(devices=[]), torch.device("meta"):
            model = cls(**kwargs)
        tensors = [*model.parameters(), *model.buffers()]
        return sum(t.numel() * t.element_size() for t in tensors)
    except Exception:  # an estimate only: the real build reports its own errors
        return None


__all__ = ["MODELS", "FedModel", "build_model"]
