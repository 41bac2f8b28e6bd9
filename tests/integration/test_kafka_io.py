"""The Kafka ingress and egress against the real broker: routing, offsets, delivery semantics."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
import warnings
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from statefun._exceptions import JobFailedError
from statefun._settings import Settings
from statefun.checkpoint import SimulatedCrash
from statefun.egress.base import EgressRecord
from statefun.egress.kafka import KAFKA_PRODUCER_RECORD, KafkaSink
from statefun.ingress.kafka import KafkaSource
from statefun.module import load_module_text
from statefun.module._specs import (
    EmbeddedEndpointSpec,
    FunctionTarget,
    KafkaEgressSpec,
    KafkaIngressSpec,
    KafkaTopicSpec,
    ModuleSpec,
)
from statefun.runtime._plan import build_job
from statefun.sdk import StringType, TypedValue
from statefun.sdk._proto import egress_pb2
from statefun.sdk._serve import start_server
from tests._support import EmitMany
from tests.integration.fns.kafka_fns import EGRESS, functions
from tests.unit.test_kafka_egress_config import JAVA_MURMUR2

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", r"(open|read)_text is deprecated", DeprecationWarning)
    from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
    from kafka.admin import NewTopic
    from kafka.errors import KafkaError

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(90)]

STRING = StringType.typename
Record = tuple[str | None, bytes, dict[str, bytes]]  # key, value, headers


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def string(text: str) -> bytes:
    return bytes(StringType.serializer().serialize(text))


@pytest.fixture
def admin(bootstrap: str) -> Iterator[Any]:
    client = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        yield client
    finally:
        client.close()


def create_topic(admin: Any, prefix: str, partitions: int = 1) -> str:
    name = unique(prefix)
    admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)])
    return name


def produce(
    bootstrap: str,
    topic: str,
    records: Sequence[tuple[str | None, bytes | None]],
    *,
    partition: int | None = None,
    timestamp_ms: int | None = None,
) -> None:
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
    try:
        for key, value in records:
            producer.send(
                topic,
                key=None if key is None else key.encode(),
                value=value,
                partition=partition,
                timestamp_ms=timestamp_ms,
            )
        producer.flush(timeout=30)
    finally:
        producer.close()


def consume(
    bootstrap: str,
    topic: str,
    *,
    count: int | None = None,
    timeout: float = 30.0,
    isolation_level: str = "read_committed",
) -> list[Record]:
    """Every record of every partition: ``count`` of them (waiting), or all up to the end."""
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap, isolation_level=isolation_level, enable_auto_commit=False
    )
    try:
        partitions = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic)]
        consumer.assign(partitions)
        consumer.seek_to_beginning(*partitions)
        ends = consumer.end_offsets(partitions)
        got: list[Record] = []
        deadline = time.monotonic() + timeout
        while True:
            if count is None and all(consumer.position(p) >= ends[p] for p in partitions):
                return got
            if count is not None and len(got) >= count:
                return got
            assert time.monotonic() < deadline, f"got {len(got)} records: {got}"
            for batch in consumer.poll(timeout_ms=200).values():
                got += [(_text(r.key), r.value, dict(r.headers or [])) for r in batch]
    finally:
        consumer.close()


def _text(key: bytes | None) -> str | None:
    return None if key is None else key.decode()


def values(records: list[Record]) -> list[str]:
    return [value.decode() for _, value, _ in records]


# -- end to end: Kafka -> functions -> Kafka ------------------------------------------------------


EMBEDDED_ENDPOINT = (
    "kind: io.pystatefun.endpoints.v1/embedded\nspec:\n  functions: kafka-test/*\n"
    "  module: tests.integration.fns.kafka_fns:functions"
)


def module_yaml(
    bootstrap: str, topic: str, group: str, endpoint: str, semantic: str = "at-least-once"
) -> str:
    return f"""
kind: io.statefun.kafka.v1/ingress
spec:
  id: kafka-test/in
  address: {bootstrap}
  consumerGroupId: {group}
  startupPosition:
    type: earliest
  topics:
    - topic: {topic}
      valueType: {STRING}
      targets:
        - kafka-test/counter
---
kind: io.statefun.kafka.v1/egress
spec:
  id: {EGRESS}
  address: {bootstrap}
  deliverySemantic:
    type: {semantic}
    transactionTimeout: 1min
---
{endpoint}
"""


@pytest.mark.parametrize(
    ("where", "semantic"),
    [
        ("embedded", "at-least-once"),
        ("remote", "at-least-once"),
        # without checkpoints: a transaction per flush of the job (every 50 ms)
        ("embedded", "exactly-once"),
    ],
)
async def test_records_through_functions_to_kafka(
    where: str, semantic: str, bootstrap: str, admin: Any, tmp_path: Path
) -> None:
    source_topic = create_topic(admin, "in", partitions=3)
    out = create_topic(admin, "out")
    keys = ["a", "b", "a", "c", "a", "b"]
    await asyncio.to_thread(produce, bootstrap, source_topic, [(k, string(out)) for k in keys])
    server = await start_server(functions) if where == "remote" else None
    if server is None:
        endpoint = EMBEDDED_ENDPOINT
    else:
        endpoint = (
            f"kind: io.statefun.endpoints.v2/http\nspec:\n  functions: kafka-test/*\n"
            f"  urlPathTemplate: {server.url}"
        )
    group = unique("group")
    module = load_module_text(module_yaml(bootstrap, source_topic, group, endpoint, semantic))
    job = build_job(module, Settings(dead_letter_path=str(tmp_path / "dead.jsonl")))
    (source,) = job.sources
    assert isinstance(source, KafkaSource)
    running = asyncio.create_task(job.run())
    try:
        records = await asyncio.to_thread(consume, bootstrap, out, count=len(keys))
    finally:
        job.stop()
        await running
        if server is not None:
            await server.close()

    assert sorted(values(records)) == ["a=1", "a=2", "a=3", "b=1", "b=2", "c=1"]
    assert [v for k, v, _ in records if k == "a"] == [b"a=1", b"a=2", b"a=3"]
    assert all(value.decode().startswith(f"{key}=") for key, value, _ in records)
    # Every record was emitted and the position is the end of every partition.
    ends = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    try:
        partitions = [TopicPartition(source_topic, p) for p in range(3)]
        expected = {
            f"{tp.topic}:{tp.partition}": o for tp, o in ends.end_offsets(partitions).items()
        }
    finally:
        ends.close()
    assert source.snapshot_position() == expected
    assert source.emitted == len(keys) and source.rejected == 0
    assert not (tmp_path / "dead.jsonl").exists()


# -- source positions -----------------------------------------------------------------------------


class Collector(EmitMany):
    """An IngressContext that records messages and stops making room after ``limit``."""

    def __init__(self, limit: int | None = None) -> None:
        self.limit = limit
        self.got: list[tuple[str, str, bytes]] = []
        self.changed = asyncio.Event()

    async def room(self) -> None:
        while self.limit is not None and len(self.got) >= self.limit:
            await asyncio.sleep(3600)  # backpressure: the source must wait here

    def has_room(self) -> bool:
        return self.limit is None or len(self.got) < self.limit

    def emit(self, typename: str, id_: str, value: Any, caller: Any = None) -> None:
        self.got.append((typename, id_, bytes(value.value)))
        self.changed.set()

    async def submit(self, typename: str, id_: str, value: Any, caller: Any = None) -> None:
        await self.room()
        self.emit(typename, id_, value, caller)

    def is_function_type(self, typename: str) -> bool:
        return typename.startswith("kafka-test/")


async def collect(
    source: KafkaSource, context: Collector, count: int, *, settle: float = 0.3, start: bool = True
) -> list[tuple[str, str, bytes]]:
    """Run the source until ``count`` messages arrived (and ``settle`` s more), then stop it."""
    if start:
        await source.start()
    task = asyncio.create_task(source.run(context))
    try:
        deadline = time.monotonic() + 30
        while len(context.got) < count:
            assert time.monotonic() < deadline, f"got {len(context.got)}: {context.got}"
            assert not task.done(), task
            context.changed.clear()
            await asyncio.wait_for(context.changed.wait(), 30)
        await asyncio.sleep(settle)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    return context.got


def kafka_source(bootstrap: str, topic: str, **kwargs: Any) -> KafkaSource:
    return KafkaSource(
        "kafka-test/in",
        bootstrap,
        [KafkaTopicSpec(topic, STRING, ("kafka-test/counter",))],
        **kwargs,
    )


async def test_positions_resume_without_gaps_or_duplicates(bootstrap: str, admin: Any) -> None:
    topic = create_topic(admin, "positions", partitions=2)
    sent = [(f"k{i % 5}", string(f"v{i}")) for i in range(40)]
    await asyncio.to_thread(produce, bootstrap, topic, sent)
    group = unique("group")

    first = kafka_source(bootstrap, topic, group_id=group, startup_position="earliest")
    context = Collector(limit=13)
    try:
        await collect(first, context, 13)
        assert len(context.got) == 13  # backpressure held the rest back
        position = first.snapshot_position()
        # what /metrics shows: each partition's next offset, and how far behind its end
        offsets = first.partition_offsets()
        assert {key: next_offset for key, (next_offset, _) in offsets.items()} == position
        assert sum(next_offset + behind for next_offset, behind in offsets.values()) == 40
        await first.notify_checkpoint_complete(1)
    finally:
        await first.close()
    assert sum(position.values()) == 13
    committed = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group)
    try:
        for key, offset in position.items():
            assert committed.committed(TopicPartition(topic, int(key.rpartition(":")[2]))) == offset
    finally:
        committed.close()

    # A restart from the checkpoint: the startup position no longer matters, and restoring
    # after start() (which already resolved 'latest') seeks back to the checkpoint.
    second = kafka_source(bootstrap, topic, group_id=group, startup_position="latest")
    rest = Collector()
    try:
        await second.start()
        assert sum(second.snapshot_position().values()) == 40
        await second.restore_position(position)
        assert second.snapshot_position() == position
        await collect(second, rest, 27, start=False)
    finally:
        await second.close()

    got = [StringType.serializer().deserialize(v) for _, _, v in context.got + rest.got]
    assert sorted(got) == sorted(f"v{i}" for i in range(40))  # none lost, none twice
    final = second.snapshot_position()
    assert set(final) == {f"{topic}:0", f"{topic}:1"} and sum(final.values()) == 40


async def test_startup_positions(bootstrap: str, admin: Any) -> None:
    topic = create_topic(admin, "startup")
    now_ms = int(time.time() * 1000)
    old = [(f"o{i}", string(f"old{i}")) for i in range(3)]
    new = [(f"n{i}", string(f"new{i}")) for i in range(3)]
    await asyncio.to_thread(produce, bootstrap, topic, old, timestamp_ms=now_ms - 2 * 3600_000)
    await asyncio.to_thread(produce, bootstrap, topic, new, timestamp_ms=now_ms - 3600_000)
    group = unique("group")
    committer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group)
    try:
        from kafka.structs import OffsetAndMetadata

        committer.commit({TopicPartition(topic, 0): OffsetAndMetadata(2, "", -1)})
    finally:
        committer.close()

    def ids(got: list[tuple[str, str, bytes]]) -> list[str]:
        return [id_ for _, id_, _ in got]

    cases: list[tuple[dict[str, Any], list[str]]] = [
        ({"startup_position": "earliest"}, ["o0", "o1", "o2", "n0", "n1", "n2"]),
        (
            {"startup_position": "date", "startup_timestamp_ms": now_ms - 5400_000},
            ["n0", "n1", "n2"],
        ),
        (
            {"startup_position": "specific-offsets", "startup_offsets": {(topic, 0): 4}},
            ["n1", "n2"],
        ),
        ({"startup_position": "group-offsets", "group_id": group}, ["o2", "n0", "n1", "n2"]),
    ]
    for kwargs, expected in cases:
        source = kafka_source(bootstrap, topic, **kwargs)
        try:
            assert ids(await collect(source, Collector(), len(expected))) == expected, kwargs
        finally:
            await source.close()

    # latest: only what arrives after the start
    source = kafka_source(bootstrap, topic, startup_position="latest")
    context = Collector()
    try:
        await source.start()
        task = asyncio.create_task(source.run(context))
        for _ in range(100):
            if source.snapshot_position():
                break
            await asyncio.sleep(0.05)
        assert source.snapshot_position() == {f"{topic}:0": 6}
        await asyncio.to_thread(produce, bootstrap, topic, [("late", string("late"))])
        for _ in range(200):
            if context.got:
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    finally:
        await source.close()
    assert ids(context.got) == ["late"]


# -- bad input ------------------------------------------------------------------------------------


async def test_bad_records_go_to_dead_letters_and_the_job_goes_on(
    bootstrap: str, admin: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    good = create_topic(admin, "good")
    nobody = create_topic(admin, "nobody")
    missing = unique("missing")  # created only later, while the job runs
    out = create_topic(admin, "out")
    ingress_dead = create_topic(admin, "ingress-dead")
    egress_dead = create_topic(admin, "egress-dead")
    await asyncio.to_thread(
        produce,
        bootstrap,
        good,
        [
            (None, string(out)),  # no key
            ("k", out.encode()),  # plain text: not a io.statefun.types/string
            ("k", None),  # no value
            ("bad-egress", string(out)),  # the function sends a non-Kafka record to the egress
            ("k", string(out)),
        ],
    )
    await asyncio.to_thread(produce, bootstrap, nobody, [("z", string(out))])
    dead_letters = {"pystatefun.dead-letter.topic": ingress_dead}
    module = ModuleSpec(
        endpoints=(
            EmbeddedEndpointSpec(
                FunctionTarget("kafka-test", None), "tests.integration.fns.kafka_fns:functions"
            ),
        ),
        ingresses=(
            KafkaIngressSpec(
                id="kafka-test/in",
                address=bootstrap,
                consumer_group_id="",
                topics=(
                    KafkaTopicSpec(good, STRING, ("kafka-test/counter",)),
                    KafkaTopicSpec(nobody, STRING, ("elsewhere/nobody",)),
                    KafkaTopicSpec(missing, STRING, ("kafka-test/counter",)),
                ),
                startup_position="earliest",
                properties={**dead_letters, "pystatefun.partition-discovery.interval.ms": "300"},
            ),
        ),
        egresses=(
            KafkaEgressSpec(
                id=EGRESS,
                address=bootstrap,
                properties={"pystatefun.dead-letter.topic": egress_dead},
            ),
        ),
    )
    job = build_job(module, Settings(dead_letter_path=str(tmp_path / "dead.jsonl")))
    caplog.set_level(logging.INFO, logger="statefun")
    running = asyncio.create_task(job.run())
    try:
        first = await asyncio.to_thread(consume, bootstrap, out, count=1)
        assert values(first) == ["k=1"]
        topic = NewTopic(missing, num_partitions=1, replication_factor=1)
        await asyncio.to_thread(admin.create_topics, [topic])
        await asyncio.to_thread(produce, bootstrap, missing, [("m", string(out))])
        both = await asyncio.to_thread(consume, bootstrap, out, count=2)
        ingress_letters = await asyncio.to_thread(consume, bootstrap, ingress_dead, count=4)
        egress_letters = await asyncio.to_thread(consume, bootstrap, egress_dead, count=1)
        assert not running.done()
    finally:
        job.stop()
        await running

    assert values(both) == ["k=1", "m=1"]
    reasons = sorted(h["pystatefun.reason"].decode() for _, _, h in ingress_letters)
    assert [r.split(" ")[:3] for r in reasons] == [
        ["no", "endpoint", "serves"],
        ["the", "record", "has"],
        ["the", "record", "has"],
        ["the", "value", "is"],
    ]
    assert any("no key" in r for r in reasons) and any("no value" in r for r in reasons)
    assert "elsewhere/nobody" in reasons[0]
    plain = next(r for r in ingress_letters if r[2]["pystatefun.reason"].startswith(b"the value"))
    assert plain[0] == "k" and plain[1] == out.encode()
    assert plain[2]["pystatefun.topic"] == good.encode()
    assert plain[2]["pystatefun.offset"] == b"1"
    ((_, value, headers),) = egress_letters
    assert headers["pystatefun.typename"] == STRING.encode()
    assert StringType.serializer().deserialize(value) == "not a Kafka record"
    log_text = caplog.text
    assert f"topic {missing!r} does not exist" in log_text
    assert f"record {good}/0 at offset 0 skipped: the record has no key" in log_text


# -- the egress: delivery semantics ---------------------------------------------------------------


def by_partition(bootstrap: str, topic: str) -> dict[int, list[tuple[Any, ...]]]:
    """Every committed record (key, value, headers) of each partition that has any."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, isolation_level="read_committed")
    placed: dict[int, list[tuple[Any, ...]]] = {}
    try:
        for p in sorted(consumer.partitions_for_topic(topic)):
            tp = TopicPartition(topic, p)
            consumer.assign([tp])
            consumer.seek_to_beginning(tp)
            end = consumer.end_offsets([tp])[tp]
            while consumer.position(tp) < end:
                for batch in consumer.poll(timeout_ms=200).values():
                    placed.setdefault(p, []).extend(
                        (r.key, r.value, tuple(r.headers or ())) for r in batch
                    )
    finally:
        consumer.close()
    return placed


def kafka_record(topic: str, value: str, key: str = "") -> EgressRecord:
    record = egress_pb2.KafkaProducerRecord(topic=topic, key=key, value_bytes=value.encode())
    return EgressRecord(EGRESS, TypedValue(KAFKA_PRODUCER_RECORD, record.SerializeToString()))


@pytest.mark.parametrize("semantic", ["exactly-once", "at-least-once"])
async def test_keyed_records_go_to_the_partition_the_java_client_picks(
    semantic: Any, bootstrap: str, admin: Any
) -> None:
    """murmur2 of the key modulo the partition count (Kafka's default partitioner), as
    StateFun's egress writes them: each key's partition is remembered after its first
    record."""
    topic = create_topic(admin, "keyed", partitions=5)
    sink = KafkaSink(EGRESS, bootstrap, semantic)
    await sink.start()
    try:
        for round_ in range(3):
            for key in JAVA_MURMUR2:
                sink.write(kafka_record(topic, f"{key.decode()}/{round_}", key=key.decode()))
            await sink.flush()
        if semantic == "exactly-once":
            sink.pre_commit(1)
            await sink.commit(1)
    finally:
        await sink.close()
    placed = {p: [r[1].decode() for r in got] for p, got in by_partition(bootstrap, topic).items()}
    expected: dict[int, list[str]] = {}
    for key, java_hash in JAVA_MURMUR2.items():
        expected.setdefault((java_hash & 0x7FFFFFFF) % 5, []).extend(
            f"{key.decode()}/{round_}" for round_ in range(3)
        )
    assert {p: sorted(v) for p, v in placed.items()} == {p: sorted(v) for p, v in expected.items()}


@pytest.mark.parametrize("semantic", ["at-least-once", "none"])
async def test_non_transactional_egress(semantic: Any, bootstrap: str, admin: Any) -> None:
    topic = create_topic(admin, "plain")
    sink = KafkaSink(EGRESS, bootstrap, semantic)
    await sink.start()
    try:
        sink.write(kafka_record(topic, "one", key="k"))
        sink.write(kafka_record(topic, "two"))  # an empty key is no key, as in StateFun
        sink.write(EgressRecord(EGRESS, TypedValue(STRING, string("not a record"))))
        assert sink.rejected == 1
        if semantic == "at-least-once":
            assert sink.pre_commit(1) == {
                "records": [(topic, "k", b"one", None), (topic, None, b"two", None)]
            }
        await sink.flush()
        if semantic == "at-least-once":
            assert sink.pre_commit(2) is None  # acknowledged: nothing to recover
            delivered = await asyncio.to_thread(consume, bootstrap, topic)
            assert sorted(values(delivered)) == ["one", "two"]
    finally:
        await sink.close()
    records = await asyncio.to_thread(consume, bootstrap, topic, count=2)
    assert sorted(((k, v) for k, v, _ in records), key=lambda r: r[1]) == [
        ("k", b"one"),
        (None, b"two"),
    ]


async def test_exactly_once_two_phase_commit_and_recovery(bootstrap: str, admin: Any) -> None:
    topic = create_topic(admin, "eo")
    properties = {"transactional.id": unique("tx")}

    def sink() -> KafkaSink:
        return KafkaSink(EGRESS, bootstrap, "exactly-once", properties=properties)

    def seen() -> list[str]:
        return values(consume(bootstrap, topic))

    first = sink()
    assert first.transactional
    await first.start()
    for i in range(3):
        first.write(kafka_record(topic, f"a{i}"))
    await first.flush()
    state1 = first.pre_commit(1)
    assert await asyncio.to_thread(seen) == []  # not before the checkpoint completes
    await first.commit(1)
    assert await asyncio.to_thread(seen) == ["a0", "a1", "a2"]

    for i in range(2):
        first.write(kafka_record(topic, f"b{i}"))
    state2 = first.pre_commit(2)
    first.write(kafka_record(topic, "c0"))  # after the cut of 2: not in its state
    await first.close()  # "crash": checkpoint 2 is durable but its commit never ran
    assert await asyncio.to_thread(seen) == ["a0", "a1", "a2"]

    second = sink()
    await second.recover(state2)
    assert await asyncio.to_thread(seen) == ["a0", "a1", "a2", "b0", "b1"]
    await second.recover(state2)  # recovering twice (a crash during recovery) is harmless
    await second.close()

    third = sink()
    await third.recover(state1)  # an older state whose transaction is long committed
    await third.recover(state2)
    await third.close()
    assert await asyncio.to_thread(seen) == ["a0", "a1", "a2", "b0", "b1"]

    # Checkpoint ids that start again from 1 (a fresh checkpoint folder) lose nothing: the
    # marker of transaction 2 above does not pass for this new transaction 1.
    fresh = sink()
    fresh.write(kafka_record(topic, "d0"))
    state = fresh.pre_commit(1)
    await fresh.close()  # crash before commit(1)
    fourth = sink()
    await fourth.recover(state)
    await fourth.close()
    assert await asyncio.to_thread(seen) == ["a0", "a1", "a2", "b0", "b1", "d0"]


def eo_sink(bootstrap: str, transactional_id: str) -> KafkaSink:
    properties = {"transactional.id": transactional_id}
    return KafkaSink(EGRESS, bootstrap, "exactly-once", properties=properties)


def committed(bootstrap: str, topic: str) -> list[str]:
    """What a read_committed reader sees (up to the last stable offset)."""
    return values(consume(bootstrap, topic))


def in_log(bootstrap: str, topic: str, count: int | None = None) -> list[str]:
    """Every record in the log, committed, aborted or in an open transaction."""
    return values(consume(bootstrap, topic, count=count, isolation_level="read_uncommitted"))


async def test_exactly_once_records_go_to_an_open_transaction_visible_at_commit(
    bootstrap: str, admin: Any
) -> None:
    """Records are produced into the open transaction before the checkpoint; committing N
    shows exactly N's records, not those written after N's cut (already in Kafka, in the
    other producer's transaction)."""
    topic = create_topic(admin, "eo-open")
    sink = eo_sink(bootstrap, unique("tx"))
    await sink.start()
    try:
        first = [f"a{i}" for i in range(7)]
        for value in first[:5]:
            sink.write(kafka_record(topic, value))
        await sink.flush()  # into the open transaction of checkpoint 1
        assert await asyncio.to_thread(in_log, bootstrap, topic, 5) == first[:5]
        assert await asyncio.to_thread(committed, bootstrap, topic) == []
        for value in first[5:]:
            sink.write(kafka_record(topic, value))  # the tail: produced at the cut
        assert sink.unsealed() == 7  # 5 in the open transaction, 2 buffered
        state = sink.pre_commit(1)
        assert sink.unsealed() == 0
        assert state["format"] == 2
        assert [(cid, [r[2] for r in rows]) for cid, _, rows in state["transactions"]] == [
            (1, [v.encode() for v in first])
        ]
        second = ["b0", "b1", "b2"]
        for value in second:
            sink.write(kafka_record(topic, value))  # after the cut: transaction 2
        await sink.flush()
        assert sorted(await asyncio.to_thread(in_log, bootstrap, topic, 10)) == first + second
        assert await asyncio.to_thread(committed, bootstrap, topic) == []
        assert sink.backlog() == 10 and sink.uncommitted == 7

        await sink.commit(1)
        assert await asyncio.to_thread(committed, bootstrap, topic) == first
        assert sink.produced == 7 and sink.backlog() == 3
        await sink.commit(1)  # nothing left to commit for 1
        assert sink.pre_commit(2) is not None
        await sink.commit(2)
        assert await asyncio.to_thread(committed, bootstrap, topic) == first + second

        sink.write(kafka_record(topic, "c0"))  # a third transaction: the first producer again
        sink.pre_commit(3)
        await sink.commit(3)
        assert await asyncio.to_thread(committed, bootstrap, topic) == [*first, *second, "c0"]
        assert sink.pre_commit(4) is None and sink.produced == 11
    finally:
        await sink.close()
    assert await asyncio.to_thread(in_log, bootstrap, topic) == [*first, *second, "c0"]


async def test_exactly_once_crash_with_an_open_transaction(bootstrap: str, admin: Any) -> None:
    """A crash while records of the next checkpoint are in an open transaction: the next run's
    start aborts it, recover() commits nothing twice, and the replayed records come once."""
    topic = create_topic(admin, "eo-open-crash")
    transactional_id = unique("tx")
    first = eo_sink(bootstrap, transactional_id)
    await first.start()
    second = eo_sink(bootstrap, transactional_id)
    try:
        first.write(kafka_record(topic, "a0"))
        state = first.pre_commit(1)
        await first.commit(1)
        for value in ("b0", "b1"):
            first.write(kafka_record(topic, value))
        await first.flush()
        assert await asyncio.to_thread(in_log, bootstrap, topic, 3) == ["a0", "b0", "b1"]
        # "Crash" before the cut of 2: nothing calls ``first`` any more (its producers and
        # their open transactions stay as they are); the restart is from checkpoint 1.

        await second.start()  # fences the first run's producers: b0, b1 aborted
        await second.recover(state)  # transaction 1 reached Kafka: nothing to do
        assert await asyncio.to_thread(committed, bootstrap, topic) == ["a0"]
        for value in ("b0", "b1", "c0"):  # the replay
            second.write(kafka_record(topic, value))
        second.pre_commit(2)
        await second.commit(2)
        # Visible at once: nothing is left open before them in the log.
        assert await asyncio.to_thread(committed, bootstrap, topic) == ["a0", "b0", "b1", "c0"]
    finally:
        await second.close()
        await first.close()  # its abort is refused: it was fenced
    assert await asyncio.to_thread(committed, bootstrap, topic) == ["a0", "b0", "b1", "c0"]
    assert await asyncio.to_thread(in_log, bootstrap, topic) == [
        *["a0", "b0", "b1"],  # b0, b1: aborted
        *["b0", "b1", "c0"],
    ]


async def test_exactly_once_crash_between_checkpoint_and_commit(bootstrap: str, admin: Any) -> None:
    """Checkpoint 1 is complete but the process dies before commit(1), with 1's records in
    one producer's open transaction and later ones in the other's: recover() aborts both and
    produces 1 again, once."""
    topic = create_topic(admin, "eo-precommit-crash")
    transactional_id = unique("tx")
    first = eo_sink(bootstrap, transactional_id)
    await first.start()
    second = eo_sink(bootstrap, transactional_id)
    try:
        for value in ("a0", "a1"):
            first.write(kafka_record(topic, value))
        await first.flush()
        first.write(kafka_record(topic, "a2"))
        state = first.pre_commit(1)
        first.write(kafka_record(topic, "b0"))
        await first.flush()
        assert await asyncio.to_thread(in_log, bootstrap, topic, 4) == ["a0", "a1", "a2", "b0"]
        # "Crash": nothing calls ``first`` any more; its transactions stay open.

        await second.start()
        await second.recover(state)
        assert await asyncio.to_thread(committed, bootstrap, topic) == ["a0", "a1", "a2"]
        await second.recover(state)  # recovering twice (a crash during recovery) is harmless
        second.write(kafka_record(topic, "b0"))  # the replay
        second.pre_commit(2)
        await second.commit(2)
    finally:
        await second.close()
        await first.close()
    assert await asyncio.to_thread(committed, bootstrap, topic) == ["a0", "a1", "a2", "b0"]
    assert await asyncio.to_thread(in_log, bootstrap, topic) == [
        *["a0", "a1", "a2", "b0"],  # aborted
        *["a0", "a1", "a2", "b0"],
    ]


async def test_exactly_once_sealed_transactions_wait_for_a_free_producer(
    bootstrap: str, admin: Any
) -> None:
    """A checkpoint that fails after its cut (say a savepoint to a bad folder) and the job goes
    on: two sealed transactions hold both producers; the records of the next wait in memory
    until a commit frees one, and commit(2) commits 1 and 2 in order."""
    topic = create_topic(admin, "eo-no-slot")
    sink = eo_sink(bootstrap, unique("tx"))
    await sink.start()
    try:
        sink.write(kafka_record(topic, "a0"))
        sink.pre_commit(1)  # its checkpoint fails: commit(1) never comes
        sink.write(kafka_record(topic, "b0"))
        await sink.flush()
        state = sink.pre_commit(2)
        assert [cid for cid, _, _ in state["transactions"]] == [1, 2]
        sink.write(kafka_record(topic, "c0"))
        await sink.flush()  # no free producer: c0 stays in memory
        await asyncio.sleep(0.2)  # the sink's own produce task does not send it either
        assert await asyncio.to_thread(in_log, bootstrap, topic, 2) == ["a0", "b0"]
        assert sink.backlog() == 3

        await sink.commit(2)
        assert await asyncio.to_thread(committed, bootstrap, topic) == ["a0", "b0"]
        await sink.flush()
        assert await asyncio.to_thread(in_log, bootstrap, topic, 3) == ["a0", "b0", "c0"]
        sink.pre_commit(3)
        await sink.commit(3)
        assert await asyncio.to_thread(committed, bootstrap, topic) == ["a0", "b0", "c0"]
    finally:
        await sink.close()


async def test_exactly_once_failed_record_fails_the_commit(bootstrap: str, admin: Any) -> None:
    """A record the broker refuses: the transaction's commit raises (the job stops), nothing
    of it becomes visible, and the sink commits nothing any more."""
    topic = unique("eo-refused")
    config = {"max.message.bytes": "2000"}
    await asyncio.to_thread(admin.create_topics, [NewTopic(topic, 1, 1, topic_configs=config)])
    sink = eo_sink(bootstrap, unique("tx"))
    await sink.start()
    try:
        sink.write(kafka_record(topic, "a0"))
        sink.write(kafka_record(topic, "x" * 5000))  # too large for the topic
        sink.write(kafka_record(topic, "a1"))
        sink.pre_commit(1)
        with pytest.raises((ConnectionError, KafkaError)):
            await sink.commit(1)
        assert sink.uncommitted == 3  # still held: the checkpoint has them
        sink.write(kafka_record(topic, "b0"))
        sink.pre_commit(2)
        with pytest.raises((ConnectionError, KafkaError)):
            await sink.commit(2)
    finally:
        await sink.close()
    assert await asyncio.to_thread(committed, bootstrap, topic) == []


@pytest.mark.parametrize("zombie", ["slot-0", "slot-1", "before-slots"])
async def test_exactly_once_commit_interrupted_by_a_crash(
    zombie: str, bootstrap: str, admin: Any
) -> None:
    """The process died inside commit(): records sent, transaction open. The next process's
    start and recover() abort that transaction and commit the records exactly once. Also
    for a state written when the sink had a single transactional id (no ``format``)."""
    topic = create_topic(admin, "eo-crash")
    transactional_id = unique("tx")
    writer = eo_sink(bootstrap, transactional_id)
    for i in range(3):
        writer.write(kafka_record(topic, f"x{i}"))
    state = writer.pre_commit(7)
    await writer.close()  # aborts what it produced
    zombie_id = f"{transactional_id}-{zombie[-1]}"
    if zombie == "before-slots":
        zombie_id = transactional_id
        del state["format"]

    producer = KafkaProducer(bootstrap_servers=bootstrap, transactional_id=zombie_id, acks="all")
    producer.init_transactions()
    producer.begin_transaction()
    for i in range(3):
        producer.send(topic, f"x{i}".encode())
    producer.flush()
    try:
        recovering = eo_sink(bootstrap, transactional_id)
        await recovering.start()
        await recovering.recover(state)
        await recovering.close()
    finally:
        producer.close(timeout=5)

    assert await asyncio.to_thread(committed, bootstrap, topic) == ["x0", "x1", "x2"]
    everything = await asyncio.to_thread(in_log, bootstrap, topic)
    assert len(everything) == 9  # the writer's and the zombie's records are in the log, aborted


@pytest.mark.parametrize("step", ["written", "completed", "sink-committed"])
async def test_exactly_once_job_survives_a_crash_between_checkpoint_steps(
    step: str, bootstrap: str, admin: Any, tmp_path: Path
) -> None:
    """Kafka -> functions -> exactly-once Kafka egress with the checkpoint coordinator: a
    crash after ``step`` of a checkpoint with records, a restart from the checkpoint folder,
    and a read_committed consumer sees every output once."""
    source_topic = create_topic(admin, "eo-in", partitions=2)
    out = create_topic(admin, "eo-out")
    ids, per_id = 10, 200
    sent = [(f"k{i}", string(out)) for _ in range(per_id) for i in range(ids)]
    await asyncio.to_thread(produce, bootstrap, source_topic, sent)
    module = ModuleSpec(
        endpoints=(
            EmbeddedEndpointSpec(
                FunctionTarget("kafka-test", None), "tests.integration.fns.kafka_fns:functions"
            ),
        ),
        ingresses=(
            KafkaIngressSpec(
                id="kafka-test/in",
                address=bootstrap,
                consumer_group_id="",
                topics=(KafkaTopicSpec(source_topic, STRING, ("kafka-test/counter",)),),
                startup_position="earliest",
                properties={"max.poll.records": "10"},
            ),
        ),
        egresses=(
            KafkaEgressSpec(
                id=EGRESS,
                address=bootstrap,
                delivery_semantic="exactly-once",
                properties={"transactional.id": unique("tx")},
            ),
        ),
    )
    settings = Settings(
        checkpoint_dir=str(tmp_path / "checkpoints"),
        checkpoint_interval_ms=20,
        max_in_flight_messages=8,
        max_in_flight_remote_messages=8,
        dead_letter_path=str(tmp_path / "dead.jsonl"),
    )
    first = build_job(module, settings)
    sink = first.sinks[EGRESS]
    assert isinstance(sink, KafkaSink)

    def crash(name: str, checkpoint_id: int) -> None:
        if name == step and (sink.uncommitted or sink.produced):
            raise SimulatedCrash(f"crash after step {name!r} of checkpoint {checkpoint_id}")

    first.checkpoint_hook = crash
    try:
        with pytest.raises(JobFailedError, match="crash after step"):
            await asyncio.wait_for(first.run(), 60)
        before = await asyncio.to_thread(consume, bootstrap, out)
        assert len(before) < ids * per_id  # the crash cut it short

        second = build_job(module, settings)
        running = asyncio.create_task(second.run())
        try:
            await asyncio.to_thread(consume, bootstrap, out, count=ids * per_id)
            await asyncio.sleep(0.3)  # a few more checkpoints: nothing may come twice
        finally:
            second.stop()
            await running
    finally:
        await sink.close()  # the crashed job's producer (fenced by the second job)
    records = await asyncio.to_thread(consume, bootstrap, out)
    expected = Counter(f"k{i}={n}" for i in range(ids) for n in range(1, per_id + 1))
    assert Counter(values(records)) == expected


async def test_exactly_once_output_is_committed_once_the_job_is_idle(
    bootstrap: str, admin: Any, tmp_path: Path
) -> None:
    """With checkpoints far apart, an exactly-once egress's records still become visible
    soon after the job has worked off its input (idle_checkpoint_delay_ms)."""
    source_topic = create_topic(admin, "idle-in")
    out = create_topic(admin, "idle-out")
    sent = [(f"k{i % 5}", string(out)) for i in range(300)]
    await asyncio.to_thread(produce, bootstrap, source_topic, sent)
    module = load_module_text(
        module_yaml(
            bootstrap,
            source_topic,
            unique("group"),
            EMBEDDED_ENDPOINT,
            semantic="exactly-once",
        )
    )
    settings = Settings(
        checkpoint_dir=str(tmp_path / "checkpoints"),
        checkpoint_interval_ms=600_000,  # never within this test
        dead_letter_path=str(tmp_path / "dead.jsonl"),
    )
    job = build_job(module, settings)
    running = asyncio.create_task(job.run())
    try:
        records = await asyncio.to_thread(consume, bootstrap, out, count=300)
        assert job.checkpoints is not None and job.checkpoints.completed >= 1
    finally:
        job.stop()
        await running
    expected = Counter(f"k{i}={n}" for i in range(5) for n in range(1, 61))
    assert Counter(values(records)) == expected
