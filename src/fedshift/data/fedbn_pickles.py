"""(being written)"""

from dataclasses import dataclass


@dataclass
class Digits5Params:
    pass


@dataclass
class OfficeParams:
    pass


@dataclass
class DomainNetParams:
    pass


def load_digits5(p):
    raise NotImplementedError("being written")


def load_office(p):
    raise NotImplementedError("being written")


def load_domainnet(p):
    raise NotImplementedError("being written")
