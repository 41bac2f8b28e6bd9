"""The Kafka kinds' ``spec`` in module.yaml: ``io.statefun.kafka.v1/ingress`` and ``/egress``,
read as StateFun reads them (docs/kafka.md, docs/module-yaml.md).
"""

from __future__ import annotations

import logging
import re
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, cast

from statefun.module._fields import TYPENAME, Fields, check_typename, delivery_semantic, show
from statefun.module._specs import KafkaEgressSpec, KafkaIngressSpec, KafkaTopicSpec

__all__ = ["SEMANTICS", "parse_egress", "parse_ingress"]

_log = logging.getLogger("statefun.module._loader")  # (the loader's warnings, one logger)

SEMANTICS = ("at-least-once", "exactly-once", "none")
_DATE = re.compile(
    r"(\d{4})-(\d{2})-(\d{2}) (\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?\s*(Z|[+-]\d{2}:?\d{2})"
)
_DATE_EXAMPLE = "a date such as '2020-02-01 04:15:00.000 +0000'"


def _properties(spec: Fields) -> dict[str, str]:
    """StateFun's ``properties``: a list of single-key mappings, values read as text."""
    expected = "a list of single-key mappings such as '- foo.config: bar'"
    items = spec.sequence("properties", expected, [])
    result: dict[str, str] = {}
    for index, item in enumerate(items):
        path = f"{spec.at('properties')}[{index}]"
        if not isinstance(item, dict) or not item:
            raise spec.doc.error(
                path, f"expected a single-key mapping such as 'foo.config: bar', got {show(item)}"
            )
        key, value = next(iter(item.items()))
        if len(item) > 1:
            _log.warning(
                "%s: %s: only the first key (%s) is used, as StateFun does",
                spec.doc.source,
                path,
                key,
            )
        if value is None or isinstance(value, dict | list):
            raise spec.doc.error(f"{path}.{key}", f"expected a scalar value, got {show(value)}")
        result[str(key)] = str(value).lower() if isinstance(value, bool) else str(value)
    return result


def _topics(spec: Fields) -> tuple[KafkaTopicSpec, ...]:
    items = spec.sequence("topics", "a list of topics with topic, valueType and targets")
    if not items:
        raise spec.fail("topics", "expected at least one topic, got an empty list")
    topics: dict[str, KafkaTopicSpec] = {}
    for index, item in enumerate(items):
        fields = Fields(spec.doc, item, f"{spec.at('topics')}[{index}]", strict=False)
        topic = cast(str, fields.string("topic", "a topic name"))
        value_type = cast(str, fields.string("valueType", TYPENAME))
        namespace, _, name = value_type.rpartition("/")
        if not namespace or not name:
            raise fields.fail("valueType", f"expected {TYPENAME}, got {value_type!r}")
        targets = fields.sequence("targets", "a list of function typenames")
        for target_index, target in enumerate(targets):
            path = f"{fields.at('targets')}[{target_index}]"
            if not isinstance(target, str):
                raise spec.doc.error(path, f"expected {TYPENAME}, got {show(target)}")
            check_typename(spec.doc, path, target)
        fields.done()
        if topic in topics:
            _log.warning(
                "%s: %s: topic %r listed again; the last entry wins, as in StateFun",
                spec.doc.source,
                fields.path,
                topic,
            )
        topics[topic] = KafkaTopicSpec(topic=topic, value_type=value_type, targets=tuple(targets))
    return tuple(topics.values())


def _startup_date(fields: Fields) -> tuple[str, int]:
    text = cast(str, fields.string("date", _DATE_EXAMPLE))
    match = _DATE.fullmatch(text.strip())
    try:
        if match is None:
            raise ValueError
        year, month, day, hour, minute, second = (int(g) for g in match.groups()[:6])
        micros = int((match.group(7) or "0").ljust(9, "0")[:6])
        zone = match.group(8).replace(":", "")
        stamp = (
            f"{year:04d}-{month:02d}-{day:02d} {hour:02d}:{minute:02d}:{second:02d}.{micros:06d} "
        )
        moment = datetime.strptime(
            stamp + ("+0000" if zone == "Z" else zone), "%Y-%m-%d %H:%M:%S.%f %z"
        )
    except ValueError:
        raise fields.fail("date", f"expected {_DATE_EXAMPLE}, got {text!r}") from None
    return text, (moment - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(milliseconds=1)


def _startup_offsets(fields: Fields) -> dict[tuple[str, int], int]:
    expected = "a list of single-key mappings such as '- my-topic/0: 42'"
    offsets: dict[tuple[str, int], int] = {}
    for index, item in enumerate(fields.sequence("offsets", expected)):
        path = f"{fields.at('offsets')}[{index}]"
        if not isinstance(item, dict) or len(item) != 1:
            raise fields.doc.error(path, f"expected {expected[9:-1]}, got {show(item)}")
        key, offset = next(iter(item.items()))
        topic, _, partition = str(key).rpartition("/")
        if not topic or not partition.isdigit():
            raise fields.doc.error(path, f"expected a partition 'topic/partition', got {key!r}")
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise fields.doc.error(
                f"{path}.{key}", f"expected an offset (an integer >= 0), got {show(offset)}"
            )
        offsets[(topic, int(partition))] = offset
    return offsets


_STARTUP_TYPES = ("group-offsets", "earliest", "latest", "specific-offsets", "date")


def parse_ingress(spec: Fields) -> KafkaIngressSpec:
    ingress_id = spec.typename("id")
    properties = _properties(spec)
    address = spec.string("address", "the Kafka bootstrap servers such as 'kafka:9092'", None)
    address = address or properties.get("bootstrap.servers")
    if not address:
        raise spec.fail(
            "address",
            "missing; expected the Kafka bootstrap servers such as 'kafka:9092'"
            " (or a bootstrap.servers property)",
        )
    group = spec.string("consumerGroupId", "a consumer group id", None) or properties.get(
        "group.id", ""
    )
    reset = str(spec.string("autoOffsetResetPosition", "'earliest' or 'latest'", "latest")).lower()
    if reset not in ("earliest", "latest"):
        raise spec.fail(
            "autoOffsetResetPosition", f"expected 'earliest' or 'latest', got {reset!r}"
        )
    position, date, stamp, offsets = "latest", None, None, {}
    startup = spec.mapping("startupPosition", None)
    if startup is not None:
        position = str(startup.string("type", "one of " + ", ".join(_STARTUP_TYPES)))
        if position not in _STARTUP_TYPES:
            raise startup.fail(
                "type", f"expected one of {', '.join(_STARTUP_TYPES)}; got {position!r}"
            )
        if position == "date":
            date, stamp = _startup_date(startup)
        elif position == "specific-offsets":
            offsets = _startup_offsets(startup)
        elif position == "group-offsets" and not group:
            raise startup.fail(
                "type", "'group-offsets' needs a consumer group: set spec.consumerGroupId"
            )
        startup.done()
    return KafkaIngressSpec(
        id=ingress_id,
        address=address,
        consumer_group_id=group,
        topics=_topics(spec),
        startup_position=cast(Any, position),
        startup_date=date,
        properties=properties,
        source=spec.doc.source,
        auto_offset_reset=cast(Literal["earliest", "latest"], reset),
        startup_offsets=offsets,
        startup_timestamp_ms=stamp,
    )


def parse_egress(spec: Fields) -> KafkaEgressSpec:
    egress_id = spec.typename("id")
    address = spec.string("address", "the Kafka bootstrap servers such as 'kafka:9092'")
    semantic, timeout = delivery_semantic(spec, SEMANTICS, "at-least-once", needs_timeout=True)
    timeout = timeout or timedelta(minutes=15)
    return KafkaEgressSpec(
        id=egress_id,
        address=address,
        delivery_semantic=cast(Literal["at-least-once", "exactly-once", "none"], semantic),
        transaction_timeout=timeout,
        properties=_properties(spec),
        source=spec.doc.source,
    )
