"""What the Kafka ingress and egress share: kafka-python imported and checked (``_client``),
client settings from Kafka properties, for kafka-python and librdkafka (``_config``), dead
letters of bad records (``_dead_letters``), repeating client errors logged once per interval
(``_throttle``) and the Kafka kinds' YAML (``_yaml``)."""

from __future__ import annotations

from statefun._kafka._client import import_kafka, internals_unsupported
from statefun._kafka._config import (
    DEAD_LETTER_TOPIC,
    DISCOVERY_INTERVAL,
    JSON_VALUE_TYPES,
    interval_ms,
    kafka_client_config,
    librdkafka_config,
)

__all__ = [
    "DEAD_LETTER_TOPIC",
    "DISCOVERY_INTERVAL",
    "JSON_VALUE_TYPES",
    "import_kafka",
    "internals_unsupported",
    "interval_ms",
    "kafka_client_config",
    "librdkafka_config",
]
