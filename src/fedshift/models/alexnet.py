"""(being written)"""

from dataclasses import dataclass

from fedshift.models.base import FedModel


@dataclass
class AlexNetParams:
    pass


class AlexNetBN(FedModel):
    pass
