"""A dataset plug-in for fedshift's tests: striped images whose stripe angle is the class,
one client per stripe contrast (a feature shift), and classes that break the contract."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fedshift.core.federation import ClientData, Federation, Split


@dataclass
class StripesParams:
    clients: int = 2
    per_class: int = 4  # images per class and split
    seed: int = 0


class Stripes:
    """striped images: the stripe direction is the class, each client its own contrast"""

    name = "stripes"
    Params = StripesParams
    task = "classification"

    @staticmethod
    def load(params: StripesParams) -> Federation:
        g = torch.Generator().manual_seed(params.seed)
        ramp = torch.arange(28.0)
        waves = [ramp.view(1, 28).expand(28, 28), ramp.view(28, 1).expand(28, 28)]
        waves.append((ramp.view(1, 28) + ramp.view(28, 1)) / 2)

        def split(contrast: float) -> Split:
            y = torch.arange(3).repeat_interleave(params.per_class)
            base = torch.stack([torch.sin(waves[int(c)]) for c in y]).unsqueeze(1)
            noise = 0.05 * torch.randn(len(y), 3, 28, 28, generator=g)
            x = (0.5 + contrast * base.expand(-1, 3, -1, -1) / 2 + noise).clamp(0, 1)
            return Split(x, y)

        clients = []
        for k in range(params.clients):
            contrast = 1.0 / (k + 1)
            clients.append(ClientData(f"c{k}", split(contrast), split(contrast), split(contrast)))
        return Federation("stripes", clients, ["h", "v", "d"], (3, 28, 28))


class NoLoad:
    """no load: not a dataset"""

    name = "noload"
    task = "classification"


class BadTask(Stripes):
    task = "detection"


class PlainMethodLoad:
    name = "plain"
    Params = StripesParams
    task = "classification"

    def load(self, params: StripesParams) -> Federation:
        return Stripes.load(params)


class WrongTask(Stripes):
    """declares segmentation but loads a classification federation"""

    task = "segmentation"


class NotAFederation(Stripes):
    @staticmethod
    def load(params: StripesParams) -> Federation:
        return {"x": 1}  # type: ignore[return-value]


@dataclass
class BrokenParams(StripesParams):
    fault: str = "none"  # which rule of the contract load breaks (Broken.load)


class Broken(Stripes):
    """Stripes whose load breaks one rule of the dataset contract, chosen by ``fault``"""

    Params = BrokenParams

    @staticmethod
    def load(params: BrokenParams) -> Federation:
        import sys

        fault = params.fault
        if fault == "exit":
            sys.exit(0)
        if fault == "raise":
            raise ValueError("the plug-in's own bug")
        fed = Stripes.load(params)
        c0 = fed.clients[0]
        y = c0.train.y
        if fault in ("high", "negative", "huge"):
            y[0] = {"high": 3, "negative": -1, "huge": 10**12}[fault]
        elif fault == "float":
            c0.train.y = y.float()
        elif fault == "no_classes":
            fed.classes = []
        elif fault == "same_names":
            fed.clients[1].name = c0.name
        elif fault == "empty_name":
            c0.name = ""
        elif fault == "empty_train":
            c0.train = Split(c0.train.x[:0], y[:0])
        elif fault == "seg_shape":
            c0.test.y = y.view(-1)[: len(c0.test.y)].clone().view(-1, 1)
        return fed
