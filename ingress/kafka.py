"""``io.statefun.kafka.v1/ingress``: records from Kafka topics, routed as StateFun routes them.

Each record of a topic goes to every function type in the topic's ``targets``: the record key
(UTF-8) is the function id and the value bytes are the message's value as they are, named with
the topic's ``valueType`` (StateFun's routable Kafka ingress does the same; no wrapper).

* Partitions are assigned by the runtime - every partition of every topic, the way Flink's
  Kafka source does - not by consumer-group rebalancing. Partitions and topics that appear
  later are found by a periodic discovery and read from their beginning.
* The offsets live in the checkpoint (``snapshot_position``: the next offset of every
  partition, counting only records already emitted). ``notify_checkpoint_complete`` also
  commits them to the consumer group, if one is set, for monitoring tools.
* kafka-python is a blocking client: every consumer call runs on one dedicated thread; the
  event loop only routes the polled batches (one batch is fetched ahead).
* A record that cannot become a message (no key, a key that is not UTF-8, no value, a value
  that is not valid for a built-in ``valueType`` or for a JSON one - those named by
  ``pystatefun.json-value-types`` -, a target no endpoint serves) is logged with its topic,
  partition and offset, written to the runtime's dead letters (``dead_letter_path``, the
  reason naming topic, partition and offset), also to the dead-letter topic if
  ``pystatefun.dead-letter.topic`` is set, and skipped. It never stops the job, and the
  records behind it go on.

See docs/kafka.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from operator import attrgetter
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from google.protobuf.message import DecodeError

from statefun._exceptions import ConfigurationError, UnavailableError
from statefun._kafka import (
    DEAD_LETTER_TOPIC,
    DISCOVERY_INTERVAL,
    JSON_VALUE_TYPES,
    import_kafka,
    interval_ms,
    kafka_client_config,
)
from statefun._kafka._dead_letters import DeadLetterProducer, dead_letter_entries, headers
from statefun._kafka._yaml import parse_ingress
from statefun.connectors import ConnectorContext, ConnectorKind
from statefun.ingress._kafka_runs import Fields, messages
from statefun.ingress._records import BUILTIN_TYPES
from statefun.ingress.base import IngressContext, Source
from statefun.module._specs import KafkaIngressSpec, KafkaTopicSpec
from statefun.sdk._types import TypedValue

if TYPE_CHECKING:
    from statefun.ingress._kafka_librdkafka import Fetcher


__all__ = ["DEFAULT_POLL_RECORDS", "KIND", "KafkaSource"]

log = logging.getLogger(__name__)

_POLL_TIMEOUT_MS = 200
#: how the run reader reads a kafka-python ConsumerRecord
_RECORD_FIELDS = Fields(
    attrgetter("key"), attrgetter("value"), attrgetter("partition"), attrgetter("topic")
)
_T = TypeVar("_T")
Startup = Literal["earliest", "latest", "group-offsets", "specific-offsets", "date"]

#: records per poll unless ``max.poll.records`` says otherwise: each poll is a trip to the
#: consumer's thread, and at kafka-python's 500 those trips cost the benchmark against StateFun
#: 15-25% of its throughput (BENCHMARKS.md)
DEFAULT_POLL_RECORDS = 2000


def _partition_key(text: str) -> tuple[str, int]:
    topic, _, partition = text.rpartition(":")
    if not topic or not partition.isdigit():
        raise ValueError(f"not 'topic:partition': {text!r}")
    return topic, int(partition)


# -- the source ----------------------------------------------------------------------------------


class _Route:
    """Where the records of one topic go."""

    __slots__ = ("single", "targets", "unknown", "validate", "value_type")

    def __init__(
        self,
        spec: KafkaTopicSpec,
        context: IngressContext,
        json_types: frozenset[str] = frozenset(),
    ) -> None:
        self.value_type = spec.value_type
        self.targets = [t for t in spec.targets if context.is_function_type(t)]
        self.unknown = [t for t in spec.targets if not context.is_function_type(t)]
        #: the one target, when there is one and no unknown one: records go out in runs
        self.single = self.targets[0] if len(self.targets) == 1 and not self.unknown else None
        builtin = BUILTIN_TYPES.get(spec.value_type)
        self.validate: Callable[[bytes], Any] | None = (
            builtin.serializer().deserialize if builtin is not None else None
        )
        if builtin is None and (spec.value_type in json_types or "*" in json_types):
            self.validate = json.loads


class KafkaSource(Source):
    """Reads Kafka topics with kafka-python on a dedicated thread (unbounded)."""

    def __init__(
        self,
        ingress_id: str,
        bootstrap_servers: str,
        topics: Sequence[KafkaTopicSpec],
        *,
        group_id: str = "",
        startup_position: Startup = "latest",
        startup_offsets: Mapping[tuple[str, int], int] | None = None,
        startup_timestamp_ms: int | None = None,
        auto_offset_reset: Literal["earliest", "latest"] = "latest",
        properties: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(ingress_id)
        if not topics:
            raise ConfigurationError(f"ingress {ingress_id}: no topics")
        if startup_position == "group-offsets" and not group_id:
            raise ConfigurationError(f"ingress {ingress_id}: 'group-offsets' needs a group id")
        if startup_position == "date" and startup_timestamp_ms is None:
            raise ConfigurationError(f"ingress {ingress_id}: 'date' needs a startup date")
        owner = f"ingress {ingress_id}"
        props = dict(properties or {})
        self.bootstrap_servers = bootstrap_servers
        self.topics = {t.topic: t for t in topics}
        self.group_id = group_id
        self.startup_position: Startup = startup_position
        self.startup_offsets = dict(startup_offsets or {})
        self.startup_timestamp_ms = startup_timestamp_ms
        self.auto_offset_reset = auto_offset_reset
        self.dead_letter_topic = props.get(DEAD_LETTER_TOPIC) or None
        self.json_types = frozenset(
            t.strip() for t in props.get(JSON_VALUE_TYPES, "").split(",") if t.strip()
        )
        self.discovery_interval_s = interval_ms(props, DISCOVERY_INTERVAL, 10_000, owner) / 1000
        kafka = import_kafka()
        self._consumer_config = kafka_client_config(
            props, kafka.KafkaConsumer.DEFAULT_CONFIG, owner=owner
        )
        self._consumer_config.setdefault("allow_auto_create_topics", False)
        self._consumer_config.update(
            bootstrap_servers=bootstrap_servers,
            group_id=group_id or None,
            enable_auto_commit=False,
            auto_offset_reset=auto_offset_reset,
        )
        producer_config = kafka_client_config(
            props, kafka.KafkaProducer.DEFAULT_CONFIG, owner=owner, warn=False
        )
        producer_config.pop("transactional_id", None)
        producer_config["bootstrap_servers"] = bootstrap_servers
        self._dead_letters = (
            None
            if self.dead_letter_topic is None
            else DeadLetterProducer(self.dead_letter_topic, producer_config)
        )
        self.batch_size = int(self._consumer_config.get("max_poll_records", DEFAULT_POLL_RECORDS))
        # (topic, partition) -> offset of the next record to emit: only the loop changes it.
        self._positions: dict[tuple[str, int], int] = {}
        self._restored: dict[tuple[str, int], int] = {}
        self._was_restored = False
        self._started = False  # partitions assigned and start offsets resolved
        self._reseek = False  # restored after start(): run() assigns again
        self._assigned: set[tuple[str, int]] = set()
        self._missing: set[str] = set()
        self._last_snapshot: dict[str, int] | None = None
        self._executor = ThreadPoolExecutor(1, thread_name_prefix=f"kafka-source-{ingress_id}")
        self._consumer: Any = None
        # records fetched by librdkafka where the properties allow it (_kafka_librdkafka.py)
        from statefun.ingress import _kafka_librdkafka as librdkafka

        self._fetch_config = librdkafka.fetch_config(
            bootstrap_servers, group_id, props, ingress_id, auto_offset_reset
        )
        self._fetcher: Fetcher | None = None
        # what routing reads librdkafka's messages with
        self._message_type: type = librdkafka.MESSAGE
        self._to_record = librdkafka.to_record
        self._message_run = librdkafka.message_run
        self.emitted = 0
        self.rejected = 0

    @classmethod
    def from_spec(cls, spec: KafkaIngressSpec) -> KafkaSource:
        return cls(
            spec.id,
            spec.address,
            spec.topics,
            group_id=spec.consumer_group_id,
            startup_position=spec.startup_position,
            startup_offsets=spec.startup_offsets,
            startup_timestamp_ms=spec.startup_timestamp_ms,
            auto_offset_reset=spec.auto_offset_reset,
            properties=spec.properties,
        )

    def describe(self) -> str:
        return f"KafkaSource({self.ingress_id}: {', '.join(self.topics)})"

    # -- the consumer thread ----------------------------------------------------------------------

    def _call(self, fn: Callable[..., _T], *args: Any) -> asyncio.Future[_T]:
        return asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    def _open(self) -> None:
        if self._consumer is not None:
            return
        kafka = import_kafka()
        try:
            self._consumer = kafka.KafkaConsumer(**self._consumer_config)
        except kafka.errors.KafkaError as exc:
            raise UnavailableError(
                f"ingress {self.ingress_id}: cannot reach Kafka at {self.bootstrap_servers}: {exc}"
            ) from exc
        if isinstance(self._fetch_config, dict):
            from statefun.ingress._kafka_librdkafka import Fetcher

            self._fetcher = Fetcher(self.ingress_id, self._fetch_config)
            return
        log.info(
            "ingress %s: records fetched by kafka-python: %s", self.ingress_id, self._fetch_config
        )
        from statefun.ingress._kafka_fetch import install

        unsupported = install(self._consumer)
        if unsupported is not None:
            log.warning(
                "ingress %s: records read by kafka-python's own reader (slower): %s",
                self.ingress_id,
                unsupported,
            )

    def _partitions(self) -> tuple[list[tuple[str, int]], list[str]]:
        """Every partition of the topics that exist, and the topics that do not."""
        found: list[tuple[str, int]] = []
        missing: list[str] = []
        for topic in self.topics:
            partitions = self._consumer.partitions_for_topic(topic)
            if partitions:
                found.extend((topic, p) for p in sorted(partitions))
            else:
                missing.append(topic)
        return found, missing

    def _assign(self, first: bool) -> tuple[dict[tuple[str, int], int], list[str]]:
        """Assign every partition; seek the new ones. Their start offsets, and missing topics."""
        kafka = import_kafka()
        found, missing = self._partitions()
        new = [p for p in found if p not in self._assigned]
        if not new:
            return {}, missing
        starts = self._start_offsets(new, first)
        self._consumer.assign([kafka.TopicPartition(t, p) for t, p in found])
        for (topic, partition), offset in starts.items():
            self._consumer.seek(kafka.TopicPartition(topic, partition), offset)
        if self._fetcher is not None:
            self._fetcher.assign(found, starts, self._positions)
        self._assigned.update(new)
        return starts, missing

    def _start_offsets(
        self, partitions: list[tuple[str, int]], first: bool
    ) -> dict[tuple[str, int], int]:
        kafka = import_kafka()
        consumer = self._consumer
        result: dict[tuple[str, int], int] = {}
        todo: list[Any] = []
        for key in partitions:
            if key in self._restored:
                result[key] = self._restored[key]
            else:
                todo.append(kafka.TopicPartition(*key))
        if not todo:
            return result
        # No checkpointed offset: the startup position at the first start; partitions found
        # later (or missing from a restored checkpoint) start at their beginning, as in Flink.
        mode = self.startup_position if first and not self._was_restored else "earliest"
        fallback: list[Any] = []
        if mode == "earliest":
            fallback = todo
        elif mode == "latest":
            result.update(_keyed(consumer.end_offsets(todo)))
        elif mode == "date":
            stamps = consumer.offsets_for_times({tp: self.startup_timestamp_ms for tp in todo})
            ends = _keyed(consumer.end_offsets(todo))
            for tp in todo:
                found = stamps.get(tp)
                result[(tp.topic, tp.partition)] = (
                    ends[(tp.topic, tp.partition)] if found is None else int(found.offset)
                )
        else:  # group-offsets, specific-offsets (partitions not listed: group offsets, as Flink)
            for tp in todo:
                offset = self.startup_offsets.get((tp.topic, tp.partition))
                if offset is None and self.group_id:
                    offset = consumer.committed(tp)
                if offset is None:
                    fallback.append(tp)
                else:
                    result[(tp.topic, tp.partition)] = int(offset)
        if fallback:
            if mode == "earliest" or self.auto_offset_reset == "earliest":
                result.update(_keyed(consumer.beginning_offsets(fallback)))
            else:
                result.update(_keyed(consumer.end_offsets(fallback)))
        return result

    def _poll(self) -> list[Any]:
        if not self._assigned:
            time.sleep(_POLL_TIMEOUT_MS / 1000)
            return []
        if self._fetcher is not None:
            return self._fetcher.poll(self.batch_size, _POLL_TIMEOUT_MS / 1000)
        polled = self._consumer.poll(timeout_ms=_POLL_TIMEOUT_MS, max_records=self.batch_size)
        return [record for records in polled.values() for record in records]

    def _commit(self, positions: dict[tuple[str, int], int]) -> None:
        kafka = import_kafka()
        offsets = {
            kafka.TopicPartition(t, p): kafka.structs.OffsetAndMetadata(o, "", -1)
            for (t, p), o in positions.items()
        }
        self._consumer.commit(offsets)

    def _close(self) -> None:
        if self._fetcher is not None:
            self._fetcher.close()
            self._fetcher = None
        if self._consumer is not None:
            self._consumer.close(autocommit=False)
            self._consumer = None
        if self._dead_letters is not None:
            self._dead_letters.close()

    # -- the Source interface ---------------------------------------------------------------------

    async def start(self) -> None:
        """Connect, assign every partition and fix the start offsets.

        The offsets are resolved here, before the job runs, so that a checkpoint taken before
        the first record holds real offsets (``latest`` now, not ``latest`` at a restart).
        """
        await self._call(self._open)
        await self._discover(first=True)
        self._started = True

    def _report_missing(self, missing: Iterable[str]) -> None:
        now = set(missing)
        for topic in sorted(now - self._missing):
            log.error(
                "ingress %s: topic %r does not exist (or is not visible); reading the other "
                "topics, and looking for it again every %g s",
                self.ingress_id,
                topic,
                self.discovery_interval_s,
            )
        for topic in sorted(self._missing - now):
            log.info(
                "ingress %s: topic %r found; reading it from its start", self.ingress_id, topic
            )
        self._missing = now

    async def run(self, context: IngressContext) -> None:
        loop = asyncio.get_running_loop()
        if not self._started or self._reseek:  # restored after start(): seek again
            await self._call(self._open)
            self._assigned.clear()
            await self._discover(first=True)
            self._started, self._reseek = True, False
        routes = self._routes(context)
        next_discovery = loop.time() + self.discovery_interval_s
        polling = self._call(self._poll)
        try:
            while True:
                batch = await polling
                if loop.time() >= next_discovery:
                    await self._discover(first=False)
                    next_discovery = loop.time() + self.discovery_interval_s
                polling = self._call(self._poll)  # fetch the next batch while routing this one
                await self._route_all(batch, routes, context)
        finally:
            polling.cancel()

    def _routes(self, context: IngressContext) -> dict[str, _Route]:
        """Where each topic's records go; targets no endpoint serves are logged once."""
        routes = {
            name: _Route(spec, context, self.json_types) for name, spec in self.topics.items()
        }
        for name, route in routes.items():
            if route.unknown:
                log.error(
                    "ingress %s: topic %r targets %s, which no endpoint of the module serves; "
                    "their records are skipped (and sent to the dead-letter topic, if set)",
                    self.ingress_id,
                    name,
                    ", ".join(route.unknown),
                )
        return routes

    async def _route_all(
        self, batch: list[Any], routes: dict[str, _Route], context: IngressContext
    ) -> None:
        """Emit a polled batch in order, waiting whenever the runtime is full.

        A run of valid records of one partition whose topic has one target (the usual case)
        goes out through ``emit_many``, and its position moves before anything is awaited; any
        other record goes out on its own (``_route``).
        """
        positions = self._positions
        # librdkafka's messages (_kafka_librdkafka.py) or kafka-python's ConsumerRecords
        raw = bool(batch) and type(batch[0]) is self._message_type
        index, end = 0, len(batch)
        while index < end:
            record = self._to_record(batch[index]) if raw else batch[index]
            route = routes[record.topic]
            target = route.single
            if target is None:
                run = None
            elif raw:
                run = self._message_run(batch, index, route.value_type, route.validate)
            else:
                run = self._valid_run(batch, index, route)
            if target is None or not run:
                if not context.has_room():
                    await context.room()
                reason = self._route(record, route, context)
                if reason is not None:
                    await self._reject(record, reason, route, context)
                    positions[(record.topic, record.partition)] = record.offset + 1
                index += 1
                continue
            partition = (record.topic, record.partition)
            sent = 0
            while True:
                now = context.emit_many(target, run, sent)
                if now > sent:
                    self.emitted += now - sent
                    last = batch[index + now - 1]
                    positions[partition] = (last.offset() if raw else last.offset) + 1
                    sent = now
                if sent == len(run):
                    break
                await context.room()
            index += sent

    @staticmethod
    def _valid_run(batch: list[Any], start: int, route: _Route) -> list[tuple[str, TypedValue]]:
        """The (id, value) of each record from ``start`` on, up to the first that is not valid
        or is of another partition."""
        return messages(batch, start, _RECORD_FIELDS, route.value_type, route.validate)

    async def _discover(self, first: bool) -> None:
        starts, missing = await self._call(self._assign, first)
        for key, offset in starts.items():
            self._positions[key] = offset
        self._report_missing(missing)

    def _route(self, record: Any, route: _Route, context: IngressContext) -> str | None:
        """Emit one record and move its position (no await: one loop step), or say why not.

        A record for some unknown targets is emitted to the known ones and moves the position;
        the reason returned is then only for the dead letters.
        """
        if record.key is None:
            return "the record has no key (the key is the function id)"
        if record.value is None:
            return "the record has no value"
        try:
            id_ = record.key.decode("utf-8")
        except UnicodeDecodeError:
            return "the record key is not UTF-8 text"
        if route.validate is not None:
            try:
                route.validate(record.value)
            except (DecodeError, ValueError, TypeError) as exc:
                return f"the value is not a valid {route.value_type}: {exc}"
        if not route.targets:
            return f"no endpoint serves {', '.join(route.unknown)}"
        value = TypedValue(route.value_type, record.value)
        for target in route.targets:
            context.emit(target, id_, value)
        self.emitted += 1
        self._positions[(record.topic, record.partition)] = record.offset + 1
        if route.unknown:
            return f"no endpoint serves {', '.join(route.unknown)}"
        return None

    async def _reject(
        self, record: Any, reason: str, route: _Route, context: IngressContext
    ) -> None:
        self.rejected += 1
        # the runtime's dead letters (they log it: one line, rate limited)
        missed = route.unknown if route.targets and reason.startswith("no endpoint") else None
        for entry, value in dead_letter_entries(
            self.ingress_id,
            record,
            reason,
            route.value_type,
            missed or [*route.targets, *route.unknown],
        ):
            context.dead_letter_record(entry, value)
        if self._dead_letters is None:
            return
        extra = headers(
            ingress=self.ingress_id,
            topic=record.topic,
            partition=record.partition,
            offset=record.offset,
            reason=reason,
        )
        try:
            await asyncio.to_thread(
                self._dead_letters.send, record.key, record.value, [*(record.headers or []), *extra]
            )
        except Exception as exc:
            log.error(
                "ingress %s: cannot write record %s/%d at offset %d to dead-letter topic %s: %s",
                self.ingress_id,
                record.topic,
                record.partition,
                record.offset,
                self.dead_letter_topic,
                exc,
            )

    async def close(self) -> None:
        try:
            await self._call(self._close)
        finally:
            self._executor.shutdown(wait=False)

    # -- checkpoints ------------------------------------------------------------------------------

    def partition_offsets(self) -> dict[str, tuple[int, int | None]]:
        """Per partition ("topic:partition"): the next offset to read, and how many records
        lie behind it up to the partition's end as last fetched (None: not known yet).
        Reads what the consumer already knows; asks the broker nothing (metrics)."""
        consumer = self._consumer
        offsets: dict[str, tuple[int, int | None]] = {}
        for (topic, partition), offset in list(self._positions.items()):
            end = None
            fetcher = self._fetcher
            if fetcher is not None:
                with contextlib.suppress(Exception):  # (a consumer being closed)
                    end = fetcher.highwater(topic, partition)
            elif consumer is not None:
                with contextlib.suppress(Exception):
                    end = consumer.highwater(import_kafka().TopicPartition(topic, partition))
            behind = None if end is None else max(0, end - offset)
            offsets[f"{topic}:{partition}"] = (offset, behind)
        return offsets

    def snapshot_position(self) -> dict[str, int]:
        snapshot = {f"{t}:{p}": o for (t, p), o in self._positions.items()}
        self._last_snapshot = snapshot
        return snapshot

    async def restore_position(self, position: Any) -> None:
        if position is None:
            return
        if not isinstance(position, dict):
            raise ConfigurationError(
                f"ingress {self.ingress_id}: a checkpointed position must be a mapping"
            )
        restored: dict[tuple[str, int], int] = {}
        for text, offset in position.items():
            try:
                topic, partition = _partition_key(str(text))
            except ValueError as exc:
                raise ConfigurationError(f"ingress {self.ingress_id}: {exc}") from None
            if topic in self.topics:
                restored[(topic, partition)] = int(offset)
        self._restored = restored
        self._was_restored = True
        self._positions = dict(restored)
        self._reseek = self._started

    async def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        """Commit the offsets of the latest snapshot to the consumer group (for monitoring).

        Checkpoints are taken one at a time, so the latest snapshot is the completed one's.
        """
        snapshot, self._last_snapshot = self._last_snapshot, None
        if not self.group_id or not snapshot or self._consumer is None:
            return
        positions = {_partition_key(k): v for k, v in snapshot.items()}
        try:
            await self._call(self._commit, positions)
        except Exception as exc:
            log.warning(
                "ingress %s: offsets of checkpoint %d not committed to group %s: %s",
                self.ingress_id,
                checkpoint_id,
                self.group_id,
                exc,
            )


def _keyed(offsets: Mapping[Any, int]) -> dict[tuple[str, int], int]:
    return {(tp.topic, tp.partition): int(o) for tp, o in offsets.items()}


# -- the connector kind ---------------------------------------------------------------------------


def _build(spec: KafkaIngressSpec, context: ConnectorContext) -> KafkaSource:
    return KafkaSource.from_spec(spec)


def _label(spec: KafkaIngressSpec) -> str:
    return f"kafka ingress {spec.id}\n{', '.join(t.topic for t in spec.topics)}"


KIND = ConnectorKind(
    "io.statefun.kafka.v1/ingress",
    "ingress",
    KafkaIngressSpec,
    parse_ingress,
    _build,
    _label,
    strict=False,
)
