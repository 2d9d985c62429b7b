"""No test compares against a float recorded on one machine: a number literal with more
significant digits than a person would type (9 or more) is such a recording, and fails on a
CPU whose kernels round differently. Compute the reference in the test instead (see
tests/runtime/test_vmap.py::test_train_stacked_is_sgd_per_client,
tests/algorithms/test_fraug.py)."""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

TESTS = Path(__file__).parent


def _significant_digits(literal: str) -> int:
    mantissa = re.split(r"[eE]", literal.replace("_", ""))[0]
    digits = mantissa.replace(".", "").lstrip("0")
    return len(digits.rstrip("0")) if "." in mantissa else len(digits)


def test_no_float_literal_recorded_from_a_run():
    found = []
    for path in sorted(TESTS.rglob("*.py")):
        tokens = tokenize.generate_tokens(io.StringIO(path.read_text()).readline)
        for tok in tokens:
            is_float = tok.type == tokenize.NUMBER and re.search(r"[.eE]", tok.string)
            if is_float and _significant_digits(tok.string) >= 9:
                found.append(f"{path.relative_to(TESTS)}:{tok.start[0]}: {tok.string}")
    assert not found, "floats recorded on one machine:\n" + "\n".join(found)


def test_the_guard_sees_a_recorded_loss():
    assert _significant_digits("2.2718498706817627") == 17
    assert _significant_digits("0.1") == 1
    assert _significant_digits("1e-05") == 1
    assert _significant_digits("0.16666666666666666") == 17
