"""Shared fixtures. Real services (Kafka broker, peer SDK virtualenvs) start once per session."""

import tests._fuzz  # noqa: F401  (registers the Hypothesis profiles)
from tests.kafka_fixture import bootstrap, kafka_broker
from tests.peer_fixture import fork_sdk_python, official_sdk_python

__all__ = ["bootstrap", "fork_sdk_python", "kafka_broker", "official_sdk_python"]
