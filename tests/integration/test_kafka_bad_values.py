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

from statefun._settings import Settings
from statefun.ingress.kafka import KafkaSource
from statefun.module._specs import (
    EmbeddedEndpointSpec,
    FunctionTarget,
    HttpEndpointSpec,
    KafkaIngressSpec,
    KafkaTopicSpec,
    ModuleSpec,
)
from statefun.runtime import Job
from statefun.sdk._serve import start_server
from tests.integration.fns.json_fns import OUT, functions
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


def job_for(
    bootstrap: str, topic: str, settings: Settings, remote_url: str | None = None, **properties: str
) -> tuple[Job, Any]:
    ingress = KafkaIngressSpec(
        id="kafka-json/in",
        address=bootstrap,
        consumer_group_id="",
        topics=(KafkaTopicSpec(topic, "kafka-json/Order", ("kafka-json/orders",)),),
        startup_position="earliest",
        properties=properties,
    )
    target = FunctionTarget("kafka-json", None)
    endpoint = (
        EmbeddedEndpointSpec(target, "tests.integration.fns.json_fns:functions")
        if remote_url is None
        else HttpEndpointSpec(target, remote_url)
    )
    module = ModuleSpec(endpoints=(endpoint,), ingresses=(ingress,))
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


@pytest.mark.parametrize("where", ["embedded", "remote"])
async def test_by_default_a_function_that_finds_the_value_invalid_dead_letters_it(
    bootstrap: str, admin: Any, tmp_path: Path, where: str
) -> None:
    """Without the property the ingress does not know the type is JSON; the function's
    ``message.as_type(ORDER)`` finds the value invalid for the message's own type
    (InvalidValueError, reported by this SDK's server too): a dead letter at once, no
    stopped job, no restart loop; the good records behind it go on (checkpoints on)."""
    topic = create_topic(admin, "json")
    await asyncio.to_thread(produce, bootstrap, topic, RECORDS)
    dead = tmp_path / "dead.jsonl"
    settings = Settings(dead_letter_path=str(dead), checkpoint_dir=str(tmp_path / "checkpoints"))
    server = await start_server(functions) if where == "remote" else None
    try:
        job, sink = job_for(bootstrap, topic, settings, remote_url=server and server.url)
        await run_until(job, sink, 3)
    finally:
        if server is not None:
            await server.close()
    assert sorted(sink.values) == ["a:1", "a:2", "b:3"]
    (record,) = [json.loads(line) for line in dead.read_text().splitlines()]
    assert (record["target"], record["id"]) == ("kafka-json/orders", "a")
    assert "is not a valid kafka-json/Order: JSONDecodeError" in record["reason"]
