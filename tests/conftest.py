"""Shared fixtures. Real services (Kafka broker, peer SDK virtualenvs) start once per session."""

from tests.kafka_fixture import kafka_broker

__all__ = ["kafka_broker"]
