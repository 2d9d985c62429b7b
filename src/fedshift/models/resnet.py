"""(being written)"""

from dataclasses import dataclass

from fedshift.models.base import FedModel


@dataclass
class ResNetParams:
    pass


class ResNet18(FedModel):
    pass
