"""(being written)"""


def add_parser(sub) -> None:
    """Placeholder: the ``protocol`` sub-commands are being written."""
