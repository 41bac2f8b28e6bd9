"""A worker's membership in its job's consumer group, and the exchange records it reads.

``Membership`` runs one kafka-python consumer on a thread of its own (kafka-python blocks): it
is the worker's member of the group ``pystatefun.<job>``, subscribed to the exchange topic
and the job's Kafka ingress topics, reading ``read_committed``. The group's assignment of
exchange partitions is the worker's ownership of key groups; of input partitions, the records
it reads (an input partition without committed offsets starts where its ingress says:
earliest or latest). Its rebalance callbacks run inside ``poll`` on that thread; each hands
the change on, so that:

* revoked partitions are checkpointed and committed (with this generation's metadata, which is
  still valid: the eager protocol calls ``on_partitions_revoked`` before it joins again) and
  dropped before the group moves them: the callback waits for the event loop;
* lost partitions (the group dropped this member: its session expired, a pause or a stall
  outlasted it) are dropped without a checkpoint: another member may own them already, and the
  consumer's metadata no longer carries a generation, which is what lets the broker fence a
  transaction's offsets (KIP-447), so nothing of them may be committed; their next owner
  replays them from the last checkpoint;
* assigned partitions are restored from the changelog before any of their records is routed:
  the callback pauses them (kafka-python runs callbacks on its network thread, where its
  blocking calls are refused), and the polling thread, after that poll, finds where each starts,
  has the loop restore the epoch and resumes them; records the poll fetched before the pause
  are sought back to and fetched again. They start from the offsets the previous owner
  committed.

Fetched records go to the loop a poll at a time, and the thread waits while the loop holds two
unrouted polls (bounded: backpressure reaches the broker as fetches not made).
``ExchangeSource`` is the job's source on the loop side: it routes each record's message through
keyBy and keeps, per partition, the offset after the last record routed (the positions a
checkpoint's cut commits).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from statefun._kafka import import_kafka
from statefun.cluster._config import ClusterConfig
from statefun.cluster._exchange import decode_exchange
from statefun.ingress.base import IngressContext, Source
from statefun.runtime._envelope import Envelope

__all__ = ["ExchangeSource", "Membership"]

log = logging.getLogger(__name__)

#: records per poll; polls the loop may hold before the consumer thread waits
MAX_POLL_RECORDS = 2_000
_QUEUED_POLLS = 2

Partitions = list[int]


class ExchangeSource(Source):
    """The exchange topic's records, as messages for the key groups this worker owns."""

    def __init__(self, send: Callable[[Envelope], None]) -> None:
        super().__init__("pystatefun/exchange")
        self._send = send
        self.queue: asyncio.Queue[list[Any]] = asyncio.Queue(_QUEUED_POLLS)
        #: partition -> the offset after the last record routed
        self.positions: dict[int, int] = {}
        self.routed = 0

    async def run(self, context: IngressContext) -> None:
        positions, send, has_room = self.positions, self._send, context.has_room
        while True:
            for record in await self.queue.get():
                messages = decode_exchange(record.value)
                if not has_room():
                    await context.room()
                for message in messages:  # a record whole, in one step: no cut inside it
                    send(message)
                positions[record.partition] = record.offset + 1
                self.routed += len(messages)

    def snapshot_position(self) -> Any:
        return dict(self.positions)


class Membership:
    """The worker's consumer in the job's group, on its own thread."""

    def __init__(
        self,
        config: ClusterConfig,
        loop: asyncio.AbstractEventLoop,
        assigned: Callable[[Partitions, list[tuple[str, int]]], Awaitable[None]],
        revoked: Callable[[Partitions, bool], Awaitable[None]],
        deliver: Callable[[list[Any]], Awaitable[None]],
        inputs: Mapping[str, str] | None = None,
        user_data: bytes = b"",
    ) -> None:
        self.config = config
        #: published to the group with this member's subscription (the worker's admin URL)
        self.user_data = user_data
        #: input topic -> where a partition without committed offsets starts: earliest, latest
        self.inputs = dict(inputs or {})
        self._loop = loop
        self._assigned = assigned
        self._revoked = revoked
        self._deliver = deliver
        self._consumer: Any = None
        self._polling = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"cluster-{config.worker_id}", daemon=True
        )
        self.stopped: asyncio.Future[None] = loop.create_future()
        #: the exchange partitions (key groups) and input partitions assigned to this worker
        self.partitions: Partitions = []
        self.input_partitions: list[tuple[str, int]] = []
        #: (topic, partition) -> the offset the consumer starts from, at the last assignment
        self.start_positions: dict[tuple[str, int], int] = {}
        #: an assignment the callback saw and the polling thread has not taken yet
        self._pending: tuple[Partitions, list[Any]] | None = None
        self.generation = -1

    def start(self) -> None:
        kafka = import_kafka()
        config = self.config
        self._consumer = kafka.KafkaConsumer(
            bootstrap_servers=config.bootstrap_servers,
            group_id=config.group_id,
            client_id=f"pystatefun-{config.worker_id}",
            enable_auto_commit=False,
            isolation_level="read_committed",
            auto_offset_reset="earliest",
            session_timeout_ms=config.session_timeout_ms,
            heartbeat_interval_ms=config.heartbeat_interval_ms,
            max_poll_records=MAX_POLL_RECORDS,
            partition_assignment_strategy=[_range_assignor(self.user_data)],
        )
        lean_records(self._consumer, config.worker_id)
        finish_joins(self._consumer, config.worker_id)
        topics = [config.exchange_topic, *sorted(self.inputs)]
        self._consumer.subscribe(topics, listener=_Listener(self))
        self._thread.start()

    def group_metadata(self) -> Any:
        """The group's metadata as this member sees it (for KIP-447 fencing)."""
        return self._consumer.group_metadata()

    def stop_polling(self) -> None:
        """Poll no more (the consumer stays a member until ``close``)."""
        self._stop.set()

    def close(self) -> None:
        """Leave the group (blocking; after ``stopped``)."""
        self._consumer.close(autocommit=False)

    # -- the consumer's thread ----------------------------------------------------------------

    def _on_loop(self, work: Awaitable[None]) -> None:
        asyncio.run_coroutine_threadsafe(_awaited(work), self._loop).result()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                polled = self._consumer.poll(timeout_ms=100)
                pending, self._pending = self._pending, None
                if pending is not None:
                    polled = self._take_assignment(pending, polled)
                records = [record for batch in polled.values() for record in batch]
                if records:
                    self._on_loop(self._deliver(records))
        except BaseException as exc:  # the loop learns of it through ``stopped``
            self._loop.call_soon_threadsafe(_set_exception, self.stopped, exc)
            return
        self._loop.call_soon_threadsafe(_set_result, self.stopped)

    def _take_assignment(self, pending: tuple[Partitions, list[Any]], polled: Any) -> Any:
        """On this thread, after the poll that assigned them (kafka-python's callbacks run on
        its network thread, where its blocking calls are refused): where each partition
        starts, the epoch restored, then the partitions resumed."""
        partitions, inputs = pending
        kafka = import_kafka()
        topic = self.config.exchange_topic
        assigned = [kafka.TopicPartition(topic, p) for p in partitions] + list(inputs)
        fresh = set(assigned)
        for tp, records in polled.items():  # fetched before the pause took: fetched again
            if tp in fresh and records:
                self._consumer.seek(tp, records[0].offset)
        polled = {tp: records for tp, records in polled.items() if tp not in fresh}
        for tp in inputs:  # an input partition no worker read yet starts as its ingress says
            if self.inputs.get(tp.topic) == "latest" and self._consumer.committed(tp) is None:
                self._consumer.seek_to_end(tp)
        # Every checkpoint of the epoch commits an offset for each partition, so that every
        # commit of this member is checked against its generation (fenced).
        self.start_positions = {
            (tp.topic, tp.partition): self._consumer.position(tp) for tp in assigned
        }
        self._on_loop(self._assigned(self.partitions, self.input_partitions))
        self._consumer.resume(*assigned)
        return polled

    def revoked(self, partitions: Partitions, lost: bool = False) -> None:
        """The group takes ``partitions`` back; ``lost``: it dropped this member first (the
        partitions may be another member's already)."""
        if lost:
            log.warning(
                "cluster: the group dropped this member (its session expired, or its "
                "generation was refused); partitions dropped without a checkpoint: %s",
                _ranges(sorted(partitions)),
            )
        else:
            log.info("cluster: partitions revoked: %s", _ranges(sorted(partitions)))
        self.partitions, self.input_partitions = [], []
        self._pending = None
        self._on_loop(self._revoked(partitions, lost))

    def assigned(self, partitions: Partitions, inputs: list[Any]) -> None:
        """(kafka-python's network thread: no blocking call of the consumer here.)"""
        self.generation = self._consumer.group_metadata().generation_id
        self.partitions = sorted(partitions)
        self.input_partitions = sorted((tp.topic, tp.partition) for tp in inputs)
        log.info(
            "cluster: generation %d: partitions assigned: %s; input partitions: %s",
            self.generation,
            _ranges(self.partitions),
            ", ".join(f"{t}:{p}" for t, p in self.input_partitions) or "none",
        )
        kafka = import_kafka()
        topic = self.config.exchange_topic
        self._consumer.pause(*[kafka.TopicPartition(topic, p) for p in partitions], *inputs)
        self._pending = (self.partitions, list(inputs))


def lean_records(consumer: Any, worker_id: str) -> None:
    """The ingress's reader of fetched batches for ``consumer`` (2.5x less CPU per record than
    kafka-python's: ``ingress/_kafka_fetch.py``), or kafka-python's own, with a warning."""
    from statefun.ingress._kafka_fetch import install

    unsupported = install(consumer)
    if unsupported is not None:
        log.warning(
            "cluster %s: records read by kafka-python's own reader: %s", worker_id, unsupported
        )


def finish_joins(consumer: Any, worker_id: str) -> None:
    """Have ``consumer`` come back to a join it left in flight until the join is taken.

    A poll that times out during a join leaves the join running, and kafka-python 3.0's poll
    takes its result later only while ``need_rejoin()`` holds. A leader that rejoins because
    its subscribed topics' partitions changed (a topic without metadata at the first
    assignment, partitions added) needs to rejoin only until its own join computes the new
    assignment: from then on its polls never take the join's result, so it never learns its
    partitions, sends no heartbeat (they are off during a join) and is dropped from the group
    while its thread polls on as if it were a member. Here a member that started a rebalance
    (kafka-python's ``rejoining``, cleared when the join's result is taken) needs to rejoin
    until then."""
    coordinator: Any = getattr(consumer, "_coordinator", None)
    asked = getattr(coordinator, "need_rejoin", None)
    if asked is None or not isinstance(getattr(coordinator, "rejoining", None), bool):
        log.warning(
            "cluster %s: kafka-python's coordinator has no need_rejoin/rejoining: a join "
            "that outlasts a poll may leave this worker out of the group",
            worker_id,
        )
        return

    def need_rejoin() -> bool:
        return bool(coordinator.rejoining) or bool(asked())

    coordinator.need_rejoin = need_rejoin


def _range_assignor(user_data: bytes) -> Any:
    """kafka-python's range assignor (the one the group used by default), whose subscription
    carries ``user_data`` (read back by ``statefun status`` and the workers' admin ports)."""
    import_kafka()
    from kafka.coordinator.assignors.abstract import ConsumerProtocolSubscription
    from kafka.coordinator.assignors.range import RangePartitionAssignor

    class _Range(RangePartitionAssignor):  # type: ignore[misc]
        def metadata(self, topics: Any) -> Any:
            return ConsumerProtocolSubscription(self.version, list(topics), user_data)

    return _Range()


def _listener_base() -> Any:
    return import_kafka().ConsumerRebalanceListener


class _Listener(_listener_base()):  # type: ignore[misc]
    """kafka-python's rebalance callbacks, to the membership (on the consumer's thread)."""

    def __init__(self, membership: Membership) -> None:
        self._membership = membership
        self._topic = membership.config.exchange_topic

    def on_partitions_revoked(self, revoked: Any) -> None:
        self._membership.revoked([tp.partition for tp in revoked if tp.topic == self._topic])

    def on_partitions_lost(self, lost: Any) -> None:
        self._membership.revoked([tp.partition for tp in lost if tp.topic == self._topic], True)

    def on_partitions_assigned(self, assigned: Any) -> None:
        self._membership.assigned(
            [tp.partition for tp in assigned if tp.topic == self._topic],
            [tp for tp in assigned if tp.topic != self._topic],
        )


async def _awaited(work: Awaitable[None]) -> None:
    await work


def _set_result(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _set_exception(future: asyncio.Future[None], exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)


def _ranges(partitions: Partitions) -> str:
    """``0-3,7`` for [0, 1, 2, 3, 7]."""
    if not partitions:
        return "none"
    parts: list[str] = []
    start = prev = partitions[0]
    for p in [*partitions[1:], None]:
        if p is not None and p == prev + 1:
            prev = p
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if p is not None:
            start = prev = p
    return ",".join(parts)
