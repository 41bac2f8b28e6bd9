"""Kafka records that cannot be handled: to the runtime's dead letters and to the
dead-letter topic (the ``pystatefun.dead-letter.topic`` property), with headers that say
where each came from and why (docs/kafka.md)."""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Any

from statefun._kafka._client import import_kafka
from statefun.sdk._types import TypedValue

__all__ = ["DeadLetterProducer", "dead_letter_entries", "headers"]


def headers(**fields: object) -> list[tuple[str, bytes]]:
    """``pystatefun.<name>`` headers, one per field, its text as UTF-8."""
    return [(f"pystatefun.{name}", str(value).encode()) for name, value in fields.items()]


def dead_letter_entries(
    ingress_id: str,
    record: Any,
    reason: str,
    value_type: str,
    missed: Sequence[str],
) -> list[tuple[dict[str, Any], TypedValue]]:
    """A consumed record as the runtime's dead letters: one entry per target in ``missed``
    (with the id, when the key is one, so that it can be replayed), else one without."""
    where = (
        f"ingress {ingress_id}: record {record.topic}/{record.partition} at offset {record.offset}"
    )
    fields: dict[str, Any] = {
        "ingress": ingress_id,
        "topic": record.topic,
        "partition": record.partition,
        "offset": record.offset,
        "reason": f"{where} skipped: {reason}",
    }
    if record.key is not None:
        fields["key_base64"] = base64.b64encode(record.key).decode("ascii")
    value = TypedValue(value_type, record.value)
    try:
        id_ = None if record.key is None else record.key.decode("utf-8")
    except UnicodeDecodeError:
        id_ = None
    targets: list[str | None] = [None] if id_ is None else [*missed] or [None]
    return [
        (dict(fields) if target is None else {"target": target, "id": id_, **fields}, value)
        for target in targets
    ]


class DeadLetterProducer:
    """Writes records to the dead-letter topic; the producer is made on first use. Blocking:
    call it off the event loop (kafka-python's producer is thread-safe)."""

    def __init__(self, topic: str, config: dict[str, Any]) -> None:
        self.topic = topic
        self._config = config
        self._producer: Any = None

    def send(self, key: bytes | None, value: bytes | None, extra: list[tuple[str, bytes]]) -> None:
        if self._producer is None:
            self._producer = import_kafka().KafkaProducer(**self._config)
        self._producer.send(self.topic, key=key, value=value, headers=extra).get(timeout=30)

    def close(self) -> None:
        if self._producer is not None:
            self._producer.close(timeout=10)
            self._producer = None
