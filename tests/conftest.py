"""Shared fixtures. Real services (Kafka broker, peer SDK virtualenvs) start once per session."""
