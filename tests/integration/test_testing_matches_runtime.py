"""The test kit gives what the runtime gives: the same script through a real job (embedded
functions, real time) and through FunctionHarness (virtual time) makes the same egress
records, in the same order per address."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from statefun.module._specs import ModuleSpec
from statefun.testing import FunctionHarness
from tests.integration.fns.shop import functions
from tests.integration.test_runtime import embedded, run_job

pytestmark = pytest.mark.timeout(60)

SCRIPT: list[tuple[Any, ...]] = [
    ("test/counter", "a", "x"),
    ("test/reminder", "keep", "arm"),
    ("test/counter", "b", "x"),
    ("test/async-echo", "k", "p"),
    ("test/reminder", "drop", "arm"),
    ("test/ttl", "t", "set:v1"),
    ("test/counter", "a", "x"),
    ("test/async-echo", "k", "q"),
    ("test/reminder", "drop", "disarm"),
    ("test/ttl", "t", "get"),
    ("sleep", 0.5),
    ("test/ttl", "t", "get"),
    ("test/counter", "a", "x"),
]


def harness_run(script: list[tuple[Any, ...]]) -> list[Any]:
    h = FunctionHarness(functions)
    out: list[Any] = []
    for step in script:
        if step[0] == "sleep":
            outcome = h.advance(timedelta(seconds=step[1]))
        else:
            outcome = h.send(*step)
            outcome.extend(h.run_until_idle())
        out.extend(outcome.egress("test/out"))
    out.extend(h.advance(timedelta(minutes=1)).egress("test/out"))
    return out


def per_key(values: list[str]) -> dict[str, list[str]]:
    keys: dict[str, list[str]] = {}
    for value in values:
        key = value.split("=")[0].split("|")[0] if "=" in value else value[:1]
        keys.setdefault(key, []).append(value)
    return keys


async def test_the_harness_and_a_job_make_the_same_records() -> None:
    from_job = await run_job(ModuleSpec(endpoints=(embedded(),)), SCRIPT)
    from_harness = harness_run(SCRIPT)
    assert sorted(from_harness) == sorted(from_job)
    assert per_key(from_harness) == per_key(from_job)
    assert "fired keep" in from_harness and "fired drop" not in from_harness
    assert from_harness.count("value=v1") == 1 and "value=None" in from_harness
