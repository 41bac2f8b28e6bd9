"""How the Kafka ingress routes a polled batch (``KafkaSource._route_all``), without a broker:
random batches with bad records among the good ones, against a model of routing one record at
a time. Whenever the runtime is full the source must stop right after the last message it had
room for, with each partition's position just past the last record it emitted or rejected (a
checkpoint taken then resumes with nothing lost and nothing twice).
The same batches go through as kafka-python's ConsumerRecords and as librdkafka's messages
(what each fetch client hands over). tests/integration/test_kafka_io.py does the same through
a real broker."""

from __future__ import annotations

import asyncio
import logging
import random
from typing import Any

import confluent_kafka
import pytest

from statefun._kafka import import_kafka
from statefun.ingress.kafka import KafkaSource, _Route
from statefun.module import KafkaTopicSpec
from statefun.sdk import StringType, TypedValue
from tests._support import EmitMany

import_kafka()
from kafka.consumer.fetcher import ConsumerRecord  # noqa: E402

STRING = "io.statefun.types/string"
RAW = "test/raw"  # not a built-in type: any value goes


class Context(EmitMany):
    """An IngressContext with room for ``limit`` messages, raised by the test."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.got: list[tuple[str, str, bytes]] = []
        self.waiting = asyncio.Event()  # the source waits in room()
        self.more = asyncio.Event()
        self.dead: list[dict[str, Any]] = []

    def has_room(self) -> bool:
        return len(self.got) < self.limit

    async def room(self) -> None:
        while not self.has_room():
            self.waiting.set()
            await self.more.wait()
            self.more.clear()

    def emit(self, typename: str, id_: str, value: Any, caller: Any = None) -> None:
        # every slot as TypedValue's __init__ sets it (a run's values are made without it)
        made = TypedValue(value.typename, value.value)
        assert type(value) is TypedValue
        assert (value.typename, value.has_value, value.value) == (
            made.typename,
            made.has_value,
            made.value,
        )
        self.got.append((typename, id_, bytes(value.value)))

    async def submit(self, typename: str, id_: str, value: Any, caller: Any = None) -> None:
        await self.room()
        self.emit(typename, id_, value)

    def is_function_type(self, typename: str) -> bool:
        return typename.startswith("test/")

    def dead_letter_record(self, fields: dict[str, Any], value: Any) -> None:
        self.dead.append(fields)


def record(topic: str, partition: int, offset: int, key: Any, value: Any) -> Any:
    return tuple.__new__(
        ConsumerRecord,
        (topic, partition, 0, offset, 0, 0, key, value, [], None, -1, -1, -1),
    )


def as_messages(batch: list[Any]) -> list[Any]:
    """The records as librdkafka's fetcher hands them over."""
    return [
        confluent_kafka.Message(
            topic=r.topic,
            partition=r.partition,
            offset=r.offset,
            key=r.key,
            value=r.value,
            headers=r.headers or None,
            timestamp=(1, r.timestamp),
        )
        for r in batch
    ]


CLIENTS = ("kafka-python", "librdkafka")


def random_batch(rng: random.Random) -> list[Any]:
    """Records of a few topic-partitions, each partition's in one stretch (as a poll gives)."""
    good = StringType.serializer().serialize("v")
    batch: list[Any] = []
    for topic in rng.sample(["one", "raw", "two-targets", "unknown-too"], rng.randint(1, 4)):
        for partition in rng.sample(range(3), rng.randint(1, 3)):
            for offset in range(rng.randint(0, 30)):
                kind = rng.random()
                key: Any = f"k{rng.randrange(4)}".encode()
                value: Any = good if topic != "raw" else bytes([rng.randrange(256)])
                if kind < 0.05:
                    key = None
                elif kind < 0.10:
                    value = None
                elif kind < 0.15:
                    key = b"\xff\xfe"  # not UTF-8
                elif kind < 0.20 and topic != "raw":
                    value = b"\xff\xff\xff"  # not a StringType value
                batch.append(record(topic, partition, 1000 + offset, key, value))
    return batch


def expected(batch: list[Any]) -> list[tuple[Any, list[tuple[str, str, bytes]]]]:
    """Per record, in order: the record and the messages it becomes (none: rejected)."""
    targets = {
        "one": ["test/a"],
        "raw": ["test/a"],
        "two-targets": ["test/a", "test/b"],
        "unknown-too": ["test/b"],  # and elsewhere/c, which no endpoint serves
    }
    out = []
    for r in batch:
        valid = r.key is not None and r.value is not None
        if valid:
            try:
                id_ = r.key.decode("utf-8")
                if r.topic != "raw":
                    StringType.serializer().deserialize(r.value)
            except Exception:
                valid = False
        out.append((r, [(t, id_, r.value) for t in targets[r.topic]] if valid else []))
    return out


def source() -> tuple[KafkaSource, dict[str, _Route], Context]:
    topics = [
        KafkaTopicSpec("one", STRING, ("test/a",)),
        KafkaTopicSpec("raw", RAW, ("test/a",)),
        KafkaTopicSpec("two-targets", STRING, ("test/a", "test/b")),
        KafkaTopicSpec("unknown-too", STRING, ("test/b", "elsewhere/c")),
    ]
    kafka_source = KafkaSource("test/in", "127.0.0.1:1", topics)
    context = Context(0)
    return kafka_source, {t.topic: _Route(t, context) for t in topics}, context


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("seed", range(40))
async def test_a_polled_batch_stops_where_room_ends_with_exact_positions(
    seed: int, client: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.CRITICAL, logger="statefun")  # the rejections' log lines
    rng = random.Random(seed)
    batch = random_batch(rng)
    model = expected(batch)
    kafka_source, routes, context = source()
    polled = batch if client == "kafka-python" else as_messages(batch)
    routing = asyncio.create_task(kafka_source._route_all(polled, routes, context))
    while True:
        waited = asyncio.create_task(context.waiting.wait())
        await asyncio.wait([routing, waited], return_when=asyncio.FIRST_COMPLETED)
        waited.cancel()
        context.waiting.clear()
        # The records handled so far: each one is looked at only while there is room (a
        # record to two targets may take the last place and one more).
        handled, emitted = 0, 0
        for _, messages in model:
            if emitted >= context.limit:
                break
            handled += 1
            emitted += len(messages)
        assert routing.done() == (handled == len(model))
        assert context.got == [m for _, messages in model[:handled] for m in messages]
        positions: dict[tuple[str, int], int] = {}
        for r, _ in model[:handled]:
            positions[(r.topic, r.partition)] = r.offset + 1
        assert kafka_source._positions == positions
        assert kafka_source.emitted == sum(1 for _, messages in model[:handled] if messages)
        if routing.done():
            await routing
            break
        context.limit += rng.choice([1, 1, 2, 5, 17])
        context.more.set()
    total = sum(len(messages) for _, messages in model)
    assert len(context.got) == total
    assert kafka_source.rejected == sum(
        1 for r, messages in model if not messages or r.topic == "unknown-too"
    )


@pytest.mark.parametrize("seed", range(10))
async def test_both_clients_records_give_the_same_messages_and_dead_letters(
    seed: int, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.CRITICAL, logger="statefun")
    batch = random_batch(random.Random(seed))
    seen = {}
    for client in CLIENTS:
        kafka_source, routes, context = source()
        context.limit = 10**6
        polled = batch if client == "kafka-python" else as_messages(batch)
        await kafka_source._route_all(polled, routes, context)
        seen[client] = (context.got, context.dead, kafka_source._positions)
    assert seen["kafka-python"] == seen["librdkafka"]
    assert seen["kafka-python"][1]  # (there were rejected records to compare)
