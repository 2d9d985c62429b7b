"""(being written)"""

from dataclasses import dataclass


@dataclass
class PACSParams:
    pass


@dataclass
class OfficeHomeParams:
    pass


def load_pacs(p):
    raise NotImplementedError("being written")


def load_officehome(p):
    raise NotImplementedError("being written")
