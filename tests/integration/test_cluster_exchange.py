"""A worker's transactions on a real broker: exchange messages reach their key group's
partition, stay invisible to ``read_committed`` readers until the worker's checkpoint
commits, commit together with the consumed offsets, and a member of an older group
generation cannot commit (KIP-447 fencing)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from statefun._kafka import import_kafka
from statefun._settings import Settings
from statefun.cluster import ClusterConfig, cluster_config, ensure_topics
from statefun.cluster._exchange import WorkerTransactions, decode_exchange, exchange_row
from statefun.cluster._membership import finish_joins
from statefun.runtime._envelope import Envelope
from statefun.sdk._types import TypedValue

kafka = import_kafka()
TopicPartition, OffsetAndMetadata = kafka.TopicPartition, kafka.structs.OffsetAndMetadata
pytestmark = [pytest.mark.kafka, pytest.mark.timeout(120)]


@pytest.fixture
def config(bootstrap: str) -> ClusterConfig:
    settings = Settings.load(
        {
            "cluster.bootstrap_servers": bootstrap,
            "cluster.job_id": f"exchange-{uuid.uuid4().hex[:8]}",
            "cluster.worker_id": "w0",
            "cluster.partitions": "4",
            "max_parallelism": "8",
            "cluster.session_timeout_ms": "6000",
            "cluster.heartbeat_interval_ms": "500",
        },
        environ={},
    )
    made = cluster_config(settings)
    assert made is not None
    ensure_topics(made)
    return made


def _member(config: ClusterConfig) -> Any:
    """A group member as a worker's: kafka-python's consumer with the worker's fix for a
    leader's join that outlasts its poll (its first assignment, before the topic's metadata
    came, is empty; without the fix it may never take the one after)."""
    member = kafka.KafkaConsumer(
        bootstrap_servers=config.bootstrap_servers,
        group_id=config.group_id,
        enable_auto_commit=False,
        isolation_level="read_committed",
        auto_offset_reset="earliest",
        session_timeout_ms=config.session_timeout_ms,
        heartbeat_interval_ms=config.heartbeat_interval_ms,
    )
    finish_joins(member, config.worker_id)
    member.subscribe([config.exchange_topic])
    return member


@pytest.fixture
def members(config: ClusterConfig) -> Iterator[list[Any]]:
    made: list[Any] = []
    yield made
    for member in made:
        member.close(autocommit=False)


def _read_all(config: ClusterConfig, isolation: str) -> list[tuple[int, bytes]]:
    """(partition, value) of every record of the exchange topic a reader sees."""
    reader = kafka.KafkaConsumer(
        bootstrap_servers=config.bootstrap_servers,
        isolation_level=isolation,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    try:
        partitions = [TopicPartition(config.exchange_topic, p) for p in range(config.partitions)]
        reader.assign(partitions)
        reader.seek_to_beginning()
        ends = reader.end_offsets(partitions)
        found: list[tuple[int, bytes]] = []
        deadline = time.monotonic() + 20
        while any(reader.position(tp) < ends[tp] for tp in partitions):
            assert time.monotonic() < deadline, "the exchange topic was not read to its end"
            for tp, records in reader.poll(timeout_ms=200).items():
                found.extend((tp.partition, r.value) for r in records)
        return sorted(found)
    finally:
        reader.close()


def _message(i: int) -> Envelope:
    value = TypedValue("io.statefun.types/int", b"\x08" + bytes([i]))
    return Envelope("example/counter", f"k{i}", value, None)


def _poll_until_assigned(members: list[Any], count: int) -> None:
    deadline = time.monotonic() + 30
    while sum(len(m.assignment()) for m in members) != count or any(
        not m.assignment() for m in members
    ):
        assert time.monotonic() < deadline, "the group did not assign every partition"
        for member in members:
            member.poll(timeout_ms=100)


def test_messages_commit_with_the_consumed_offsets(
    config: ClusterConfig, members: list[Any]
) -> None:
    members.append(_member(config))
    _poll_until_assigned(members, config.partitions)

    async def scenario() -> None:
        tx = WorkerTransactions(config)
        await tx.start()
        try:
            rows = [exchange_row(config, kg, _message(kg)) for kg in range(config.max_parallelism)]
            tx.write_rows(rows)
            await tx.flush()  # produced into the open transaction
            assert _read_all(config, "read_committed") == []
            assert len(_read_all(config, "read_uncommitted")) == len(rows)
            offsets = {TopicPartition(config.exchange_topic, 1): OffsetAndMetadata(2, "", -1)}
            assert tx.seal(1, offsets, members[0].group_metadata())
            await tx.commit(1)
            assert not tx.seal(2, offsets, members[0].group_metadata())  # nothing new
        finally:
            await tx.close()

    asyncio.run(scenario())
    seen = _read_all(config, "read_committed")
    # each key group's message in its partition, once
    expected = sorted(
        (config.partition_of(kg), exchange_row(config, kg, _message(kg))[2])
        for kg in range(config.max_parallelism)
    )
    assert seen == expected
    assert [repr(m) for m in decode_exchange(seen[0][1])] == [repr(_message(0))]
    committed = members[0].committed(TopicPartition(config.exchange_topic, 1))
    assert committed == 2


def test_a_member_of_an_older_generation_cannot_commit(
    config: ClusterConfig, members: list[Any]
) -> None:
    members.append(_member(config))
    _poll_until_assigned(members, config.partitions)
    stale = members[0].group_metadata()
    members.append(_member(config))  # a rebalance: the first member's generation ends
    _poll_until_assigned(members, config.partitions)
    assert members[0].group_metadata().generation_id > stale.generation_id

    async def scenario() -> None:
        tx = WorkerTransactions(config)
        await tx.start()
        try:
            tx.write_rows([exchange_row(config, 0, _message(0))])
            offsets = {TopicPartition(config.exchange_topic, 0): OffsetAndMetadata(1, "", -1)}
            assert tx.seal(1, offsets, stale)
            with pytest.raises(kafka.errors.KafkaError):
                await tx.commit(1)
        finally:
            await tx.close()  # aborts the transaction

    asyncio.run(scenario())
    assert _read_all(config, "read_committed") == []
    assert members[0].committed(TopicPartition(config.exchange_topic, 0)) is None
