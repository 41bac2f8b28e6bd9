"""A Kafka record whose value fails its type goes to the dead letters; the records behind it
go on, and the job never loops on it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaAdminClient

from statefun._exceptions import JobFailedError
from statefun._settings import Settings
from statefun.ingress.kafka import KafkaSource
from statefun.module._specs import (
    EmbeddedEndpointSpec,
    FunctionTarget,
    KafkaIngressSpec,
    KafkaTopicSpec,
    ModuleSpec,
)
from statefun.runtime import Job
from tests.integration.fns.json_fns import OUT
from tests.integration.test_kafka_io import create_topic, produce
from tests.integration.test_runtime import ListSink

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(120)]


@pytest.fixture
def admin(bootstrap: str) -> Iterator[Any]:
    client = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        yield client
    finally:
        client.close()


RECORDS = [("a", b'{"n": 1}'), ("a", b"{not json"), ("a", b'{"n": 2}'), ("b", b'{"n": 3}')]


def job_for(bootstrap: str, topic: str, settings: Settings, **properties: str) -> tuple[Job, Any]:
    ingress = KafkaIngressSpec(
        id="kafka-json/in",
        address=bootstrap,
        consumer_group_id="",
        topics=(KafkaTopicSpec(topic, "kafka-json/Order", ("kafka-json/orders",)),),
        startup_position="earliest",
        properties=properties,
    )
    module = ModuleSpec(
        endpoints=(
            EmbeddedEndpointSpec(
                FunctionTarget("kafka-json", None), "tests.integration.fns.json_fns:functions"
            ),
        ),
        ingresses=(ingress,),
    )
    sink = ListSink(OUT)
    return Job(module, settings, sources=[KafkaSource.from_spec(ingress)], sinks=[sink]), sink


async def run_until(job: Job, sink: Any, count: int) -> None:
    running = asyncio.create_task(job.run())
    try:
        for _ in range(1500):
            if len(sink.values) >= count or running.done():
                break
            await asyncio.sleep(0.02)
        assert not running.done()
    finally:
        job.stop()
        await running


async def test_a_value_that_is_not_json_for_a_json_type_is_a_dead_letter(
    bootstrap: str, admin: Any, tmp_path: Path
) -> None:
    topic = create_topic(admin, "json")
    await asyncio.to_thread(produce, bootstrap, topic, RECORDS)
    dead = tmp_path / "dead.jsonl"
    job, sink = job_for(
        bootstrap,
        topic,
        Settings(dead_letter_path=str(dead)),
        **{"pystatefun.json-value-types": "kafka-json/Order"},
    )
    await run_until(job, sink, 3)
    assert sink.values == ["a:1", "a:2", "b:3"]
    (record,) = [json.loads(line) for line in dead.read_text().splitlines()]
    assert (record["target"], record["id"], record["offset"]) == ("kafka-json/orders", "a", 1)
    assert f"record {topic}/0 at offset 1 skipped: the value is not a valid" in record["reason"]


async def test_by_default_the_failing_record_is_quarantined_after_a_few_failures(
    bootstrap: str, admin: Any, tmp_path: Path
) -> None:
    """Without the property the function fails on the record (policy fail): the job stops
    and restarts from its checkpoint until the quarantine takes the record out; the good
    records behind it then go on."""
    topic = create_topic(admin, "json")
    await asyncio.to_thread(produce, bootstrap, topic, RECORDS)
    dead = tmp_path / "dead.jsonl"
    settings = Settings(
        dead_letter_path=str(dead),
        checkpoint_dir=str(tmp_path / "checkpoints"),
        quarantine_after_failures=3,
    )
    for _ in range(2):
        job, sink = job_for(bootstrap, topic, settings)
        with pytest.raises(JobFailedError, match="JSONDecodeError"):
            await asyncio.wait_for(job.run(), 60)
        assert not dead.exists()
    job, sink = job_for(bootstrap, topic, settings)
    await run_until(job, sink, 2)
    assert sink.values[-2:] == ["a:2", "b:3"]
    (record,) = [json.loads(line) for line in dead.read_text().splitlines()]
    assert record["target"] == "kafka-json/orders" and "quarantined" in record["reason"]
