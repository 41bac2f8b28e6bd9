"""The pytest plugin of statefun.testing (entry point ``pytest11``: ``statefun``).

* ``statefun_harness``: a factory fixture, ``statefun_harness(functions, **options)`` gives a
  ``FunctionHarness``.
* A failed ``assert outcome == expected`` (two Outcomes) lists the parts that differ, one line
  each, instead of two long reprs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from statefun.testing._assertions import explain_difference
from statefun.testing._harness import FunctionHarness
from statefun.testing._outcome import Outcome

__all__ = ["pytest_assertrepr_compare", "statefun_harness"]


@pytest.fixture
def statefun_harness() -> Callable[..., FunctionHarness]:
    """A factory: ``statefun_harness(functions, types=..., start=...)`` -> FunctionHarness."""

    def make(functions: Any, **options: Any) -> FunctionHarness:
        return FunctionHarness(functions, **options)

    return make


def pytest_assertrepr_compare(config: Any, op: str, left: Any, right: Any) -> list[str] | None:
    if op != "==" or not (isinstance(left, Outcome) and isinstance(right, Outcome)):
        return None
    lines = explain_difference(right, left)
    return ["the outcomes differ (expected: right side):", *lines]
