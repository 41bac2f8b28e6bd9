"""The runtime's delayed messages and state TTL on the job's clock, run by the test kit's
JobHarness: the real Job (dispatchers, timer service, state backend) on a virtual clock, so
the deadlines are exact to the millisecond and nothing sleeps. Embedded functions and the same
functions behind a remote endpoint (request-reply bytes, in-process). The remote functions over
real HTTP: tests/integration/test_runtime.py."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from statefun.testing import JobHarness
from tests.integration.fns.shop import OUT, functions

EMBEDDED = """
kind: io.pystatefun.endpoints.v1/embedded
spec:
  functions: test/*
  module: tests.integration.fns.shop:functions
"""
REMOTE = """
kind: io.statefun.endpoints.v2/http
spec:
  functions: test/*
  urlPathTemplate: http://127.0.0.1:1/statefun
"""
EGRESS = f"""
---
kind: io.pystatefun.stdout.v1/egress
spec:
  id: {OUT}
"""

MS = timedelta(milliseconds=1)


@pytest.fixture(params=["embedded", "remote"])
def job(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[JobHarness]:
    path = tmp_path / "module.yaml"
    endpoint = EMBEDDED if request.param == "embedded" else REMOTE
    path.write_text(endpoint + EGRESS, encoding="utf-8")
    bound = functions if request.param == "remote" else None
    with JobHarness(path, functions=bound) as harness:
        yield harness


def out(job: JobHarness) -> list[str]:
    records = job.egress(OUT)
    values = list(records.records)
    records.clear()
    return values


def test_a_delayed_message_fires_at_its_deadline_and_a_cancelled_one_never(
    job: JobHarness,
) -> None:
    job.send("test/reminder", "keep", "arm")
    job.send("test/reminder", "drop", "arm")
    job.run_until_idle()
    job.send("test/reminder", "drop", "disarm")
    job.advance(149 * MS)
    assert out(job) == []
    job.advance(MS)  # 150 ms after it was sent
    assert out(job) == ["fired keep"]
    job.advance(timedelta(days=1))
    assert out(job) == []


def test_expire_after_write_on_the_jobs_clock(job: JobHarness) -> None:
    job.send("test/ttl", "k", "set:v1")
    job.send("test/ttl", "k", "get")
    job.advance(299 * MS)
    job.send("test/ttl", "k", "get")
    job.run_until_idle()
    assert out(job) == ["value=v1", "value=v1"]
    assert job.state("test/ttl", "k") == {"value": "v1"}
    job.advance(MS)  # 300 ms after the write: gone, however it is read
    assert job.state("test/ttl", "k") == {}
    job.send("test/ttl", "k", "get")
    job.run_until_idle()
    assert out(job) == ["value=None"]


def test_a_write_gives_the_value_its_full_ttl_again(job: JobHarness) -> None:
    job.send("test/ttl", "k", "set:v1")
    job.advance(200 * MS)
    job.send("test/ttl", "k", "set:v2")
    job.advance(299 * MS)
    assert job.state("test/ttl", "k") == {"value": "v2"}
    job.advance(MS)
    assert job.state("test/ttl", "k") == {}


def test_messages_out_counts_delayed_messages_but_not_their_cancellations(
    job: JobHarness,
) -> None:
    from statefun.runtime._status import status_details

    job.send("test/reminder", "drop", "arm")
    job.run_until_idle()
    job.send("test/reminder", "drop", "disarm")
    job.advance(timedelta(days=1))
    counts = status_details(job._job)["functions"]["test/reminder"]
    assert counts["messages_out"] == 1, counts
