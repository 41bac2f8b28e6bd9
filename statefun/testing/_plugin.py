"""The pytest plugin of statefun.testing (entry point ``pytest11``: ``statefun``).

* ``statefun_harness``: a factory fixture, ``statefun_harness(functions, **options)`` gives a
  ``FunctionHarness``.
* ``statefun_job``: a factory fixture, ``statefun_job("module.yaml", **options)`` gives a
  ``JobHarness``, closed at the end of the test.
* A failed ``assert outcome == expected`` (two Outcomes) lists the parts that differ, one line
  each, instead of two long reprs.

pytest loads it in every run where pystatefun is installed, so it imports the kit only when a
test uses it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from statefun.testing._harness import FunctionHarness
    from statefun.testing._job_harness import JobHarness

__all__ = ["pytest_assertrepr_compare", "statefun_harness", "statefun_job"]


@pytest.fixture
def statefun_harness() -> Callable[..., FunctionHarness]:
    """A factory: ``statefun_harness(functions, types=..., start=...)`` -> FunctionHarness."""
    from statefun.testing._harness import FunctionHarness

    def make(functions: Any = None, **options: Any) -> FunctionHarness:
        return FunctionHarness(functions, **options)

    return make


@pytest.fixture
def statefun_job() -> Iterator[Callable[..., JobHarness]]:
    """A factory: ``statefun_job(module, functions=..., checkpoints=...)`` -> JobHarness; each
    one is closed (its job stopped, its temporary folder deleted) when the test ends."""
    from statefun.testing._job_harness import JobHarness

    made: list[JobHarness] = []

    def make(module: Any, **options: Any) -> JobHarness:
        harness = JobHarness(module, **options)
        made.append(harness)
        return harness

    yield make
    for harness in made:
        harness.close()


def pytest_assertrepr_compare(config: Any, op: str, left: Any, right: Any) -> list[str] | None:
    outcomes = sys.modules.get("statefun.testing._outcome")  # no Outcome exists before it
    if op != "==" or outcomes is None:
        return None
    if not (isinstance(left, outcomes.Outcome) and isinstance(right, outcomes.Outcome)):
        return None
    from statefun.testing._assertions import explain_difference

    return ["the outcomes differ (expected: right side):", *explain_difference(right, left)]
